"""Connection limits aiohttp's server does not have: a cap on open connections and a deadline for
a request's headers.

aiohttp closes a connection that has not delivered a whole request `keepalive_timeout` after it
opened or after its last answer (web_protocol.RequestHandler._process_keepalive), so that setting
is the idle timeout. A client that trickles its header one byte at a time still holds the
connection for all of it, and nothing limits how many connections are open at once. Here each
connection's protocol is wrapped:

- past `max_connections` open ones, a new connection is answered `503` with `Retry-After: 1` and
  closed before aiohttp sees it;
- from the first byte of a request until its handler starts (the gateway's middleware says so),
  `header_timeout` runs; when it fires the client gets `408` and the connection is closed.

The body's own deadline is the handler's (admission.read_body), where the request is known.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from aiohttp import web

from . import telemetry as m

REFUSED = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class Limits:
    """The shared state of one listening socket's connections."""

    def __init__(self, max_connections: int, header_timeout: float):
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.open = 0
        self.guards: dict[Any, "Guard"] = {}   # aiohttp's protocol -> its guard (it has __slots__)

    def protocol_factory(self, inner_factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: Guard(self, inner_factory)

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        guard = self.guards.get(request.protocol)
        if guard is not None:
            guard.request_started()
        try:
            return await handler(request)
        finally:
            if guard is not None:
                guard.request_finished()


class Guard(asyncio.Protocol):
    """One connection: aiohttp's request handler inside, the limits around it."""

    def __init__(self, limits: Limits, inner_factory: Callable[[], asyncio.Protocol]):
        self.limits = limits
        self.inner_factory = inner_factory
        self.inner: Any = None
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.in_request = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.limits.open >= self.limits.max_connections:
            m.CONNECTIONS_REFUSED.labels("too_many").inc()
            transport.write(REFUSED)  # type: ignore[attr-defined]
            transport.close()
            return
        self.limits.open += 1
        m.CONNECTIONS.set(self.limits.open)
        self.inner = self.inner_factory()
        self.limits.guards[self.inner] = self
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if not self.in_request and self.timer is None and data:
            self.timer = asyncio.get_running_loop().call_later(self.limits.header_timeout, self._headers_too_slow)
        self.inner.data_received(data)

    def request_started(self) -> None:
        self.in_request = True
        self._disarm()

    def request_finished(self) -> None:
        self.in_request = False

    def _headers_too_slow(self) -> None:
        self.timer = None
        if self.in_request or self.transport is None or self.transport.is_closing():
            return
        m.CONNECTIONS_REFUSED.labels("header_timeout").inc()
        self.transport.write(TIMED_OUT)
        self.transport.close()

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.inner is None:
            return
        self.limits.open -= 1
        m.CONNECTIONS.set(self.limits.open)
        self.limits.guards.pop(self.inner, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


class GuardedSite(web.TCPSite):
    """A TCPSite whose connections go through `limits`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limits: Limits, **kwargs: Any):
        super().__init__(runner, host, port, **kwargs)
        self.limits = limits

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self.limits.protocol_factory(server), self._host, self._port, ssl=self._ssl_context,
            backlog=self._backlog, reuse_address=self._reuse_address, reuse_port=self._reuse_port)
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port
