"""Health and metrics of a replica that does not lead yet.

kopf serves the liveness endpoint, but only once it runs, and a replica runs kopf only once it
leads. Without this, a standby answers nothing on the chart's probe port and the kubelet restarts
it about every minute (then backs off for up to five), which delays the failover the standby is
there for. So until the replica leads, a small server answers on the same address: 200 while the
election runs (the campaign thread is alive and has not given up), 503 once it has stopped. It is
closed just before kopf binds the port. Readiness is the same answer: a healthy standby is Ready,
so a rolling update of the Deployment, whose new pods start as standbys, can proceed; who leads
is the metric `triton_operator_leader` and the Lease's holder.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Callable
from urllib.parse import urlparse

from .plain_http import BoundedHTTPServer, CappedHandler

log = logging.getLogger(__name__)


class StandbyHealth:
    def __init__(self, url: str, campaigning: Callable[[], bool]):
        parsed = urlparse(url)
        self.path = parsed.path or "/healthz"
        self.campaigning = campaigning
        health = self

        class Handler(CappedHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path.split("?", 1)[0] != health.path:
                    self._answer(404, {"error": "not found"})
                elif health.campaigning():
                    self._answer(200, {"leader": False, "election": "waiting for the lease"})
                else:
                    self._answer(503, {"leader": False, "election": "stopped"})

            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        # bounded: connections, their deadline and what is read from each (plain_http)
        self.server = BoundedHTTPServer((parsed.hostname or "0.0.0.0", parsed.port or 80), Handler)
        self._thread = threading.Thread(target=self.server.serve_forever, name="standby-health", daemon=True)

    def start(self) -> "StandbyHealth":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering and free the port (for kopf's liveness endpoint)."""
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
