"""A small TCP fault proxy for tests: loopback only, standard library only.

Put it between a client and a server (the operator and the API server, the autoscaler and
Prometheus) and switch faults on and off while the client runs::

    with FaultProxy("127.0.0.1:9090") as proxy:   # the upstream, e.g. Prometheus
        client_url = f"http://{proxy.address}"     # give the client the proxy's address
        proxy.mode("http_error", status=503)       # each request is answered 503 by the proxy
        proxy.mode("delay", seconds=2.0)           # each chunk is held 2 s, both directions
        proxy.mode("reset")                        # open connections are reset, and new ones
        proxy.mode("refuse")                       # nothing listens: connect() is refused
        proxy.mode("pass")                         # forward untouched again
        assert proxy.injected["http_error"] == 1   # faults really injected, by kind

Modes (``mode()`` returns once the new mode is in force):

``pass``
    Bytes are forwarded both ways untouched; half-closes are passed on.
``delay`` (``seconds``)
    Every chunk read from either side is written to the other ``seconds`` later, in order.
    Applies to open connections too. Works for any protocol, TLS included.
``reset``
    Every open connection is reset (TCP RST on both sides) when the mode is set, and every new
    connection is accepted and reset before a byte is exchanged.
``refuse``
    The listening socket is closed, so ``connect()`` fails with ECONNREFUSED. Open connections
    carry on (``reset_open_connections()`` drops them too). Leaving ``refuse`` listens again on
    the same port.
``http_error`` (``status``, ``body``)
    For plain-HTTP upstreams only. Each request (on a new connection, or the next request on
    an open keep-alive connection) is read whole and answered with ``status`` and
    ``Connection: close`` by the proxy; it never reaches the upstream. For TLS upstreams use
    the TCP-level faults above.

When the upstream itself cannot be reached, the client's connection is reset and counted in
``upstream_errors``, as a load balancer in front of a dead backend would do.

Counters (read them from the test): ``connections`` accepted, ``injected`` (a Counter of faults
by mode: connections reset, chunks delayed, requests answered with an error) and
``upstream_errors``. The proxy runs an asyncio loop in a daemon thread; ``stop()`` (or leaving
the ``with`` block) closes the listener and every connection and ends the thread.
"""

from __future__ import annotations

import asyncio
import collections
import http
import ipaddress
import socket
import struct
import threading
from typing import Any, Coroutine

MODES = ("pass", "delay", "reset", "refuse", "http_error")
_CHUNK = 64 * 1024
_MAX_REQUEST_HEAD = 64 * 1024


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _split(address: str | tuple[str, int]) -> tuple[str, int]:
    if isinstance(address, tuple):
        host, port = address
    else:
        host, _, port_text = address.rpartition(":")
        if not host or not port_text.isdigit():
            raise ValueError(f"upstream must be host:port, got {address!r}")
        port = int(port_text)
    return host.strip("[]"), int(port)


class _Connection:
    """One client connection and its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter):
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.done = False

    def reset(self) -> None:
        """Both sides get a TCP RST, not a FIN: SO_LINGER with a zero timeout, then close."""
        self.done = True
        for writer in (self.client, self.upstream):
            if writer is not None:
                _reset(writer)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


class FaultProxy:
    """A TCP proxy on ``host`` (a loopback address) forwarding to ``upstream`` (``host:port``
    or a tuple, loopback too), with faults switchable at runtime by :meth:`mode`."""

    def __init__(self, upstream: str | tuple[str, int], *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.upstream_host, self.upstream_port = _split(upstream)
        for what, h in (("listen host", host), ("upstream", self.upstream_host)):
            if not _is_loopback(h):
                raise ValueError(f"FaultProxy is for loopback only: {what} {h!r} is not a loopback address")
        self.host = host
        self.port = port
        self.connections = 0
        self.upstream_errors = 0
        self.injected: collections.Counter[str] = collections.Counter()
        self._fault: tuple[str, dict[str, Any]] = ("pass", {})
        self._open: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------------------- public API
    @property
    def address(self) -> str:
        """``host:port`` the clients should connect to."""
        return f"{self.host}:{self.port}"

    @property
    def upstream(self) -> str:
        return f"{self.upstream_host}:{self.upstream_port}"

    @property
    def current_mode(self) -> str:
        return self._fault[0]

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def start(self) -> "FaultProxy":
        """Listens (on a free port unless one was given) and forwards in ``pass`` mode."""
        if self._thread is not None:
            return self
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"faultproxy-{self.upstream}",
                                        daemon=True)
        self._thread.start()
        try:
            self._call(self._listen())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Closes the listener and every connection, and ends the proxy's thread."""
        if self._thread is None or self._loop is None:
            return
        try:
            self._call(self._shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
            self._thread = self._loop = None

    def mode(self, name: str, *, seconds: float | None = None, status: int = 503,
             body: str | None = None) -> None:
        """Switches to mode ``name`` (see the module docstring); returns once it is in force."""
        if name not in MODES:
            raise ValueError(f"unknown mode {name!r}; one of {', '.join(MODES)}")
        options: dict[str, Any] = {}
        if name == "delay":
            if seconds is None or seconds < 0:
                raise ValueError("mode('delay') needs seconds >= 0")
            options["seconds"] = float(seconds)
        elif seconds is not None:
            raise ValueError(f"seconds only applies to mode('delay'), not {name!r}")
        if name == "http_error":
            if not 100 <= status <= 599:
                raise ValueError(f"status must be an HTTP status code, got {status}")
            options["status"] = status
            options["body"] = body if body is not None else f"fault proxy: injected HTTP {status}\n"
        self._call(self._switch(name, options))

    def reset_open_connections(self) -> int:
        """Resets every open connection now (whatever the mode); returns how many."""
        return self._call(self._reset_open())

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"FaultProxy({self.address} -> {self.upstream}, mode={self.current_mode})"

    # ----------------------------------------------------------------------------- loop side
    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        if self._loop is None:
            coro.close()
            raise RuntimeError("FaultProxy is not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    async def _listen(self) -> None:
        # reuse_address: listening again after `refuse` on the port open connections still use.
        self._server = await asyncio.start_server(self._on_client, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    def _close_listener(self) -> None:
        if self._server is not None:
            # close() stops accepting at once; connections already accepted stay open. (No
            # wait_closed(): since 3.12 it waits for those connections too.)
            self._server.close()
            self._server = None

    async def _switch(self, name: str, options: dict[str, Any]) -> None:
        self._fault = (name, options)
        if name == "refuse":
            self._close_listener()
        elif self._server is None:
            await self._listen()
        if name == "reset":
            await self._reset_open()

    async def _reset_open(self) -> int:
        conns = list(self._open)
        for conn in conns:
            self.injected["reset"] += 1
            self._open.discard(conn)
            conn.reset()
        return len(conns)

    async def _shutdown(self) -> None:
        self._close_listener()
        for conn in list(self._open):
            conn.done = True
            for writer in (conn.client, conn.upstream):
                if writer is not None:
                    writer.transport.abort()
        self._open.clear()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        kind, options = self._fault
        if kind in ("reset", "refuse"):  # refuse: accepted just before the listener closed
            self.injected["reset"] += 1  # counted first: the test may look as soon as it sees the fault
            _reset(writer)
            return
        if kind == "http_error":
            await self._answer_http_error(reader, writer, b"", options)
            return
        conn = _Connection(writer)
        try:
            up_reader, conn.upstream = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            self.upstream_errors += 1
            _reset(writer)
            return
        self._open.add(conn)
        try:
            await asyncio.gather(self._pump(reader, conn.upstream, conn, from_client=True),
                                 self._pump(up_reader, writer, conn, from_client=False))
        finally:
            self._open.discard(conn)
            for w in (writer, conn.upstream):
                if not w.transport.is_closing():
                    w.close()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, conn: _Connection,
                    from_client: bool) -> None:
        while not conn.done:
            try:
                data = await src.read(_CHUNK)
            except (ConnectionError, OSError):
                data = None
            if conn.done:
                return
            if data is None:  # the other side was reset: pass the reset on
                conn.reset()
                return
            if not data:  # a half-close: pass it on, keep the other direction running
                if dst.can_write_eof() and not dst.transport.is_closing():
                    try:
                        dst.write_eof()
                    except OSError:
                        pass
                return
            kind, options = self._fault
            if kind == "delay":
                self.injected["delay"] += 1
                await asyncio.sleep(options["seconds"])
            elif kind == "reset":
                self.injected["reset"] += 1
                conn.reset()
                return
            elif kind == "http_error" and from_client:
                conn.done = True
                if conn.upstream is not None:
                    conn.upstream.transport.abort()
                await self._answer_http_error(src, conn.client, data, options)
                return
            if conn.done:
                return
            try:
                dst.write(data)
                await dst.drain()
            except (ConnectionError, OSError):
                conn.reset()
                return

    async def _answer_http_error(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                 head: bytes, options: dict[str, Any]) -> None:
        """Reads one request (head and Content-Length body) and answers it with the error.
        Reading it first matters: closing a socket with unread data sends a reset, not the
        answer."""
        try:
            while b"\r\n\r\n" not in head and len(head) < _MAX_REQUEST_HEAD:
                more = await asyncio.wait_for(reader.read(_CHUNK), timeout=30)
                if not more:
                    break
                head += more
            header_block, _, body = head.partition(b"\r\n\r\n")
            length = 0
            for line in header_block.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length" and value.strip().isdigit():
                    length = int(value.strip())
            while len(body) < length:
                more = await asyncio.wait_for(reader.read(min(_CHUNK, length - len(body))), timeout=30)
                if not more:
                    break
                body += more
            status = options["status"]
            try:
                phrase = http.HTTPStatus(status).phrase
            except ValueError:
                phrase = "Error"
            payload = options["body"].encode()
            self.injected["http_error"] += 1
            writer.write(f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                         f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
            await writer.drain()
        except (ConnectionError, OSError, asyncio.TimeoutError):
            pass
        finally:
            writer.close()
