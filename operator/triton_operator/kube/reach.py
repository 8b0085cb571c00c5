"""Whether the API server answers, asked once for every watch while it does not.

A watch that fails because the API server cannot be reached (no answer, a reset, a 502/503/504:
an API server restarting answers 503 "before all known HTTP paths have been installed") does not
sleep a doubling pause: it waits here until one cheap probe (`GET /readyz`, which every
authenticated client may read) sees the server answer, probed every PROBE_SECONDS with jitter,
and every waiting watch reopens at once. A pause that doubled to 30 s left changes made just
after an outage waiting up to 30 s; with the probe they wait a second or two. Other failures
(403, 429 with Retry-After, a 5xx from a server that answers its probe) keep the doubling pause
(`watching.Retry`): they are not cured by waiting for the server to come back.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Callable

PROBE_SECONDS = 0.5     # between two probes while the API server does not answer
PROBE_JITTER = 0.25     # up to this much more, so that many operators do not probe in step
UNREACHABLE = (0, 502, 503, 504)   # no answer, or a gateway or a server not ready to serve


def unreachable(status: int) -> bool:
    """A failure that waiting for the API server to answer cures."""
    return status in UNREACHABLE


class Reachability:
    """One probe loop for all the watches that wait for the API server; each waiter returns as soon
    as a probe succeeds after it began to wait."""

    def __init__(self, probe: Callable[[], bool], interval: float = PROBE_SECONDS, jitter: float = PROBE_JITTER):
        self.probe, self.interval, self.jitter = probe, interval, jitter
        self._cond = threading.Condition()
        self._answered = 0        # probes that saw the server answer
        self._probing = False
        self._waiting = 0
        self.probes = 0           # probes made, for tests and metrics

    def wait(self, stopped: threading.Event, cap: float) -> bool:
        """Block until a probe sees the API server answer (True), `stopped` is set or `cap` seconds
        pass (False)."""
        deadline = time.monotonic() + cap
        with self._cond:
            seen = self._answered
            if not self._probing:
                self._probing = True
                threading.Thread(target=self._probe_until_up, name="api server probe", daemon=True).start()
            self._waiting += 1
            try:
                while self._answered == seen and not stopped.is_set():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(min(remaining, self.interval))
                return self._answered != seen
            finally:
                self._waiting -= 1

    def _probe_until_up(self) -> None:
        while True:
            time.sleep(self.interval + random.uniform(0, self.jitter))
            self.probes += 1
            try:
                up = self.probe()
            except Exception:  # noqa: BLE001 - a probe that raises is a server that does not answer
                up = False
            if up:
                with self._cond:
                    self._answered += 1
                    self._probing = False
                    self._cond.notify_all()
                return
            with self._cond:
                if not self._waiting:   # nobody waits any more
                    self._probing = False
                    return
