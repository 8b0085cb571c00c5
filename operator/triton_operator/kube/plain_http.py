"""The operator's small HTTP servers (its metrics port, and a standby's health answers), bounded.

They are the standard library's threaded server, which by itself starts a thread for every
connection and holds it as long as the client likes, reading heads of up to 100 lines of 64 KiB:
100 connections that never ended such a head took the operator from 24 MB to 587 MB, over its
memory limit, and the metrics port (prometheus_client's server, the same kind) to 730 MB. Here:
- at most MAX_CONNECTIONS at once; one more is answered 503 and closed;
- a connection is cut DEADLINE_SECONDS after it opened, whatever it is doing (these answers take
  milliseconds: the kubelet's probe, a Prometheus scrape);
- at most MAX_HEAD_BYTES are read from a connection (their requests are GETs of a few hundred
  bytes); what is cut short is answered as what arrived, or not at all.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.exposition import MetricsHandler

MAX_CONNECTIONS = 16
DEADLINE_SECONDS = 10.0
MAX_HEAD_BYTES = 16384
BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _Capped:
    """A connection's reader that gives at most `left` bytes, then end of file."""

    def __init__(self, raw: Any, left: int):
        self.raw, self.left = raw, left

    def readline(self, limit: int = -1) -> bytes:
        n = self.left if limit is None or limit < 0 else min(limit, self.left)
        line = self.raw.readline(n) if n > 0 else b""
        self.left -= len(line)
        return line

    def read(self, size: int = -1) -> bytes:
        n = self.left if size is None or size < 0 else min(size, self.left)
        data = self.raw.read(n) if n > 0 else b""
        self.left -= len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class CappedHandler(BaseHTTPRequestHandler):
    """A handler whose connection reads at most MAX_HEAD_BYTES, each read waiting at most the
    deadline. Subclasses answer (do_GET)."""

    timeout = DEADLINE_SECONDS

    def setup(self) -> None:
        super().setup()
        self.rfile = _Capped(self.rfile, MAX_HEAD_BYTES)  # type: ignore[assignment]

    def log_message(self, *args: Any) -> None:   # probes and scrapes every few seconds would drown the log
        pass


class BoundedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]):
        # IPv6 where the address is one (prometheus_client's server chooses the same way)
        self.address_family = socket.getaddrinfo(address[0] or None, address[1], type=socket.SOCK_STREAM,
                                                 flags=socket.AI_PASSIVE)[0][0]
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.sendall(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()   # no thread took the connection: its slot is free again
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        timer = threading.Timer(DEADLINE_SECONDS, _cut, (request,))
        timer.daemon = True
        timer.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            timer.cancel()
            self._slots.release()


def _cut(request: socket.socket) -> None:
    """End a connection past its deadline: the thread reading it sees end of file and finishes."""
    try:
        request.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Metrics(CappedHandler, MetricsHandler):
    """prometheus_client's metrics answer, on a capped connection."""


def serve_metrics(address: str, port: int) -> BoundedHTTPServer:
    """The default registry's metrics on address:port, in a thread (prometheus_client's own
    start_http_server, bounded)."""
    server = BoundedHTTPServer((address, port), _Metrics)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
