"""Connection limits aiohttp's server does not have: how many connections are open (in all and
per client address), how large and how slow a request's head may be, and what a malformed
request may cost.

Each connection's protocol is wrapped (`Guard`); aiohttp's request handler sits inside:

- **Heads are buffered here, bounded.** Bytes of a request's head (request line and headers) are
  kept by the guard until the blank line that ends them, and only a whole head is handed to
  aiohttp. A head over `max_head_bytes` is answered `431` and the connection closed, so what a
  connection can make the gateway hold before it is authenticated is that many bytes, whatever
  aiohttp's own per-line limits would allow (128 lines of 8 KiB). The guard then passes the body on
  as it comes: `Content-Length` bytes (from the head it just read), after which the next bytes are
  the next request's head again, so a head pipelined behind a finished request is bounded and timed
  like any other. A head with `Transfer-Encoding` (or a `Content-Length` the guard cannot read
  alone) is passed on whole and the connection closes after that request: aiohttp frames it, and
  nothing after it is read.
- **No tunnels, no unknown expectations.** A `CONNECT` head is answered `501` and the connection
  closed: aiohttp reads everything after it as tunnel data, then parses that as the next request,
  past the head-size limit and the header deadline. An `Expect` header other than `100-continue`
  is dropped from the head (RFC 9110 lets a server ignore it): aiohttp answers it before any
  middleware runs, in plain text quoting the header, on every path without a route of the
  gateway's own (an unknown path, a wrong method), and the guard never saw that request end.
- **Header deadline**: from the first byte of a head until its blank line, `header_timeout`; when it
  fires the client gets `408` and the connection is closed.
- **Connections**: past `max_connections` open ones, or `per_address` from one client address
  (the peer; a trusted proxy is not capped, its clients are many), a new connection is answered
  `503` with `Retry-After: 1` and closed before aiohttp sees it. When the pool is nearly full
  (`REAP_AT` of it), connections idle for `REAP_IDLE_SECONDS` or more, or whose head has been
  arriving that long, are closed, oldest first, to make room: idle keep-alive connections and slow
  heads cannot lock others out.
- **Pipelining and clients that do not read**: at most PIPELINED heads are with aiohttp unanswered;
  bytes after them wait here with reading paused (aiohttp queues every head it is handed). A
  connection whose client stops reading what it is sent (writing paused) is reapable like an idle
  one once it has not read for REAP_STALLED_SECONDS, and is cut once a write has waited
  `write_timeout`: aiohttp writes some answers after their handler returned, with no deadline. A
  connection closed with bytes its client never read is aborted, not closed (a close waits for them).
- **Malformed requests** (`GatewayRequestHandler`) are answered `400` with a fixed body; they cost
  one log line per `MALFORMED_LOG_SECONDS` at most, naming the client and the kind of error, never
  the request's bytes (aiohttp's own line quotes the head, Authorization header included).

aiohttp closes a connection that has not delivered a whole request `keepalive_timeout` after it
opened or after its last answer (web_protocol.RequestHandler._process_keepalive), so that setting
is the idle timeout. The body's own deadline is the handler's (admission.read_body), where the
request is known.
"""

from __future__ import annotations

import asyncio
import fcntl
import ipaddress
import json
import logging
import re
import struct
import termios
import time
from typing import Any, Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.web_protocol import RequestHandler, _ErrInfo

from . import telemetry as m

log = logging.getLogger(__name__)

SERVER_HEADER = "triton-operator-gateway"  # not aiohttp's default, which names its version


def _error(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


def _refusal(status: str, message: str, code: str, extra: str = "") -> bytes:
    body = json.dumps(_error(message, code)).encode()
    return (f"HTTP/1.1 {status}\r\nServer: {SERVER_HEADER}\r\n{extra}Connection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


REFUSED = _refusal("503 Service Unavailable", "the gateway has as many connections open as it takes; retry",
                   "too_many_connections", "Retry-After: 1\r\n")
REFUSED_ADDRESS = _refusal("503 Service Unavailable", "this client address has its share of the gateway's "
                           "connections open already; retry when one closes", "too_many_connections_from_address",
                           "Retry-After: 1\r\n")
TIMED_OUT = _refusal("408 Request Timeout", "the request's headers did not arrive in time", "request_timeout")
HEADERS_TOO_LARGE = ("the request's headers are too large", "headers_too_large")
HEAD_TOO_LARGE = _refusal("431 Request Header Fields Too Large", *HEADERS_TOO_LARGE)
OTHER_VERSION = _refusal("505 HTTP Version Not Supported", "the gateway speaks HTTP/1.1 and HTTP/1.0",
                         "http_version_not_supported")
NO_VERSION = _refusal("400 Bad Request", "malformed HTTP request: the request line names no HTTP version",
                      "bad_request")
NO_TUNNELS = _refusal("501 Not Implemented", "the gateway does not open tunnels (CONNECT)", "not_implemented")
OTHER_CODING = _refusal("501 Not Implemented", "the gateway takes no transfer coding but chunked",
                        "unsupported_transfer_encoding")
MALFORMED = _error("malformed HTTP request", "bad_request")

TOO_LARGE = {   # a request line or header that aiohttp's parser refused for its size (RFC 6585, RFC 9110)
    414: _error("the request's target is too long", "uri_too_long"),
    431: _error(*HEADERS_TOO_LARGE),
}


class MalformedBody(web.HTTPBadRequest):
    """A request body whose framing broke after its head was read (answered 400 by the errors
    middleware, as any HTTPException)."""

    def __init__(self) -> None:
        super().__init__(reason="malformed HTTP request body")


def too_large(exc: BaseException | None) -> int | None:
    """414 for a request line over aiohttp's line limit (its target: a path starts with /, an
    absolute target with http), 431 for a header line over it or too many header lines; None for
    any other parse error."""
    if isinstance(exc, LineTooLong):
        line = exc.args[0] if exc.args else b""
        head = bytes(line[:4]) if isinstance(line, (bytes, bytearray)) else str(line)[:4].encode("latin-1", "replace")
        return 414 if head[:1] == b"/" or head.lower() == b"http" else 431
    if isinstance(exc, BadHttpMessage) and "too many headers" in str(exc).lower():
        return 431
    return None

PIPELINED = 4              # heads a connection may have with aiohttp, unanswered; past it reading pauses
REAP_AT = 0.9               # reap idle connections once this share of max_connections is open
REAP_IDLE_SECONDS = 1.0     # a connection idle this long may be reaped to make room
REAP_STALLED_SECONDS = 10.0  # ... and one whose client has not read what it was sent for this long
PROGRESS_BYTES = 16 * 1024  # a client that took less than this since it was last looked at has not read
MALFORMED_LOG_SECONDS = 10.0
LINGER_SECONDS = 1.0        # a refused connection drops what it still receives this long, then closes
HEAD_END = re.compile(rb"\r?\n\r?\n")   # the blank line that ends a head (bare LF too: aiohttp refuses it)
_FRAMING = re.compile(rb"^(content-length|transfer-encoding)[ \t]*:[ \t]*(.*?)[ \t]*$", re.I | re.M)
_CODINGS = re.compile(rb"^transfer-encoding:[ \t]*(.*?)[ \t]*$", re.I | re.M)


_REQUEST_LINE = re.compile(rb"^[^ \r\n]+ [^ \r\n]+ (HTTP/\d\.\d)$")


def version_refusal(head: bytes) -> tuple[bytes, str] | None:
    """The refusal of a request line that names no HTTP version (HTTP/0.9's form) or one other than
    1.0 and 1.1; None for any other (aiohttp judges the rest). aiohttp answered `HTTP/2.0` and a
    bare `GET /path` in HTTP/1 text, their status lines echoing the version asked for."""
    line = head.split(b"\n", 1)[0].rstrip(b"\r")
    match = _REQUEST_LINE.match(line)
    if match is None:
        # two parts (a method and a target, whatever the target holds: "GET /HTTP/1.1") is HTTP/0.9's
        return (NO_VERSION, "no_version") if len(line.split(b" ")) == 2 else None
    return None if match[1] in (b"HTTP/1.1", b"HTTP/1.0") else (OTHER_VERSION, "http_version")


_EXPECT = re.compile(rb"^expect:[ \t]*(.*?)[ \t]*\r?\n", re.I | re.M)


def without_unknown_expectations(head: bytes) -> bytes:
    """The head without its `Expect` lines whose value is not `100-continue` (see the module)."""
    return _EXPECT.sub(lambda line: line[0] if line[1].lower() == b"100-continue" else b"", head)


def other_coding(head: bytes) -> bool:
    """Whether the Transfer-Encoding names a coding before chunked (RFC 9112 6.1: 501, a coding the
    gateway does not implement). aiohttp framed `gzip, chunked` as chunked and dropped the gzip:
    the replica was sent the compressed bytes with nothing saying so. Chunked not last, several
    lines, or an unknown coding alone: aiohttp's 400 (the body's length cannot be known)."""
    lines = head.replace(b"\r\n", b"\n")
    codings = _CODINGS.findall(lines)
    if len(codings) != 1 or any(name.lower() != b"transfer-encoding" for name, _ in _FRAMING.findall(lines)):
        return False   # several lines, a Content-Length beside it, a space before the colon: aiohttp's 400
    listed = [c for c in (c.strip().lower() for c in codings[0].split(b",")) if c]   # empty elements count for nothing
    return len(listed) > 1 and listed[-1] == b"chunked" and b"chunked" not in listed[:-1]


def body_length(head: bytes) -> int | None:
    """The body length a head announces: its Content-Length, 0 without one; None when the guard
    should not frame what follows (Transfer-Encoding, several or unreadable Content-Lengths: aiohttp
    refuses or frames those itself)."""
    lengths = set()
    for name, value in _FRAMING.findall(head.replace(b"\r\n", b"\n")):
        if name.lower() == b"transfer-encoding" or not value.isdigit() or len(value) > 18:
            return None
        lengths.add(int(value))
    if len(lengths) > 1:
        return None
    return lengths.pop() if lengths else 0


class Limits:
    """The shared state of one listening socket's connections."""

    def __init__(self, max_connections: int, header_timeout: float, max_head_bytes: int = 32768,
                 per_address: int | None = None, trusted_proxies: tuple[Any, ...] = (),
                 clock: Callable[[], float] = time.monotonic, write_timeout: float | None = None,
                 reap_idle_seconds: float | None = None, evict: bool = False):
        self.max_connections = max_connections
        self.reap_idle_seconds = reap_idle_seconds   # None: REAP_IDLE_SECONDS
        self.evict = evict   # full: a new connection closes the oldest of the address holding the most
        self.header_timeout = header_timeout
        self.write_timeout = write_timeout
        self.max_head_bytes = max_head_bytes
        self.per_address = per_address or max_connections
        self.trusted_proxies = trusted_proxies
        self.clock = clock
        self.open = 0
        self.by_address: dict[str, int] = {}
        self.guards: dict[Any, "Guard"] = {}   # aiohttp's protocol -> its guard (it has __slots__)
        self.idle: dict["Guard", float] = {}   # reapable connections (idle, or in a head) -> since when, oldest first
        self.reaped: set["Guard"] = set()      # closed by reap(), not yet gone
        self.stalled: set["Guard"] = set()     # in `idle` because their clients stopped reading
        self.malformed = MalformedLog(clock)

    def protocol_factory(self, inner_factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: Guard(self, inner_factory)

    def capped(self, address: str) -> bool:
        """Whether `address` is held to per_address connections (a trusted proxy is not)."""
        if not self.trusted_proxies:
            return True
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return True
        return not any(ip in n for n in self.trusted_proxies)

    def admit(self, address: str) -> bytes | None:
        """None when a new connection from `address` may open; else the answer that refuses it."""
        if self.staying() >= int(self.max_connections * REAP_AT):
            self.reap(self.staying() - int(self.max_connections * REAP_AT) + 1)
        if self.capped(address) and self.by_address.get(address, 0) >= self.per_address:
            m.CONNECTIONS_REFUSED.labels("per_address").inc()
            return REFUSED_ADDRESS
        if self.staying() >= self.max_connections and self.evict:
            self._evict_for(address)
        if self.staying() >= self.max_connections:
            m.CONNECTIONS_REFUSED.labels("too_many").inc()
            return REFUSED
        return None

    def _evict_for(self, address: str) -> None:
        """Close the oldest connection of the address holding the most, when it holds more than
        one and more than `address` would: connections kept busy (pipelined requests, a body
        announced and never sent) are never idle, and four addresses of eight each kept the
        kubelet's probes out of the health port. Its connections are few (a scan is cheap)."""
        counts: dict[str, int] = {}
        for g in self.guards.values():
            if g not in self.reaped:
                counts[g.address] = counts.get(g.address, 0) + 1
        if not counts:
            return
        most = max(counts, key=counts.__getitem__)
        if counts[most] < 2 or counts[most] <= counts.get(address, 0) + 1:
            return
        oldest = next(g for g in self.guards.values() if g.address == most and g not in self.reaped)
        self._reaped(oldest)
        if oldest.transport is not None:
            oldest.transport.abort()

    def staying(self) -> int:
        """Open connections, less those reaped and closing."""
        return self.open - len(self.reaped)

    def reap(self, wanted: int) -> None:
        """Close up to `wanted` connections idle (or in a head) for REAP_IDLE_SECONDS (or the
        Limits' own reap_idle_seconds) or more, or whose client has not read for
        REAP_STALLED_SECONDS (a client reading a large answer in bursts is not cut for a pause of a
        second), oldest first."""
        now = self.clock()
        idle_s = REAP_IDLE_SECONDS if self.reap_idle_seconds is None else self.reap_idle_seconds
        for guard, since in list(self.idle.items()):
            if wanted <= 0:
                break
            if guard in self.stalled and guard.progressed():
                self.reapable(guard, stalled=True)   # its client reads: stalled from now, if at all
                continue
            if now - since < (REAP_STALLED_SECONDS if guard in self.stalled else idle_s):
                continue
            if guard not in self.stalled and guard._buffered() > 0:
                continue   # its answer is still going out: not idle (a scrape was cut mid-answer)
            wanted -= 1
            self._reaped(guard)
            guard.close()

    def _reaped(self, guard: "Guard") -> None:
        """Count `guard` as reaped (closed to make room, not yet gone)."""
        m.CONNECTIONS_REFUSED.labels("reaped").inc()
        self.idle.pop(guard, None)
        self.reaped.add(guard)

    def reapable(self, guard: "Guard", stalled: bool = False) -> None:
        """`guard` may be reaped from now on: idle or in a head, or (`stalled`) its client not reading."""
        self.idle.pop(guard, None)      # to the end: `idle` stays oldest first
        self.idle[guard] = self.clock()
        if stalled:
            self.stalled.add(guard)
        else:
            self.stalled.discard(guard)

    def opened(self, guard: "Guard") -> None:
        self.open += 1
        self.by_address[guard.address] = self.by_address.get(guard.address, 0) + 1
        m.CONNECTIONS.set(self.open)

    def closed(self, guard: "Guard") -> None:
        self.open -= 1
        left = self.by_address.get(guard.address, 0) - 1
        if left > 0:
            self.by_address[guard.address] = left
        else:
            self.by_address.pop(guard.address, None)
        self.idle.pop(guard, None)
        self.reaped.discard(guard)
        self.stalled.discard(guard)
        m.CONNECTIONS.set(self.open)

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        guard = self.guards.get(request.protocol)
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
        self.address = ""
        self.timer: asyncio.TimerHandle | None = None
        self.head = bytearray()     # the head being received, until its blank line
        self.body_left = 0          # bytes of the current body still to pass on
        self.framed = True          # False: everything is passed on, and the connection ends after the request
        self.requests = 0           # heads handed to aiohttp whose handler has not finished
        self.handed = 0             # heads handed to aiohttp, in all
        self.finished = 0           # ... and those whose handler has finished
        self.unframed = 0           # the number of the head after which nothing is read (0: none yet)
        self.refused = False        # answered by the guard itself: what still comes is dropped
        self.stash = b""            # bytes after PIPELINED unanswered heads, kept (reading paused) until one is
        self.stall_timer: asyncio.TimerHandle | None = None   # the write-stall deadline, while writing is paused
        self.unsent = [0, 0]        # bytes waiting to be sent when last looked at (by the stall timer, by reap)

    # -- the connection ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        refusal = self.limits.admit(self.address)
        if refusal is not None:
            transport.write(refusal)  # type: ignore[attr-defined]
            transport.close()
            return
        self.limits.opened(self)
        self.inner = self.inner_factory()
        self.limits.guards[self.inner] = self
        self._idle()
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._unstall()
        self.stash = b""
        if self.inner is None:
            return
        self.limits.closed(self)
        self.limits.guards.pop(self.inner, None)
        self.inner.connection_lost(exc)
        self.inner = None
        self.head = bytearray()

    def close(self) -> None:
        """Close; at once when the client has not read what was written to it (a close would wait
        for it to, and a client that never reads kept its connection, and its place, for good)."""
        if self.transport is None:
            return
        if self.transport.get_write_buffer_size() > 0:
            self.transport.abort()
        elif not self.transport.is_closing():
            self.transport.close()

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        """The client is not reading what it is sent: it has write_timeout to start again, or the
        connection is cut. Answers aiohttp writes after a handler returned (errors, /v1/models,
        the probes) have no deadline of their own; a client that pipelined requests and read none
        of their answers held its connection for good."""
        if self.limits.write_timeout is not None and self.stall_timer is None:
            self.unsent = [self._buffered()] * 2
            self.stall_timer = asyncio.get_running_loop().call_later(self.limits.write_timeout, self._write_stalled)
            # ... and is reapable, after REAP_STALLED_SECONDS, as an idle one is (a pool full of them
            # makes room)
            self.limits.reapable(self, stalled=True)
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.stall_timer is not None:
            self._unstall()
            self.limits.stalled.discard(self)
            if not self.head:
                self.limits.idle.pop(self, None)
                self._idle()
        if self.inner is not None:
            self.inner.resume_writing()

    def _buffered(self) -> int:
        """Bytes written to the client and not yet taken by it: the transport's buffer, and the
        kernel's send queue (a large answer's tail sits there, and the kernel takes more only once a
        third of its buffer is free: the transport's buffer alone stood still for most of a second
        while a client read at 1.6 MB/s)."""
        if self.transport is None:
            return 0
        queued = 0
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:
                queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
            except (OSError, ValueError):
                queued = 0
        return self.transport.get_write_buffer_size() + queued

    def progressed(self, by: int = 1) -> bool:
        """Whether the client has read at least PROGRESS_BYTES of what waits to be sent since `by`
        (0: the stall timer, 1: reap) last asked: writing stays paused while a large answer drains
        to a client that reads it slowly. Less is no reading: a client that takes a few bytes now
        and then would otherwise keep its connection, and its place, as long as it liked."""
        now = self._buffered()
        moved, self.unsent[by] = now <= self.unsent[by] - PROGRESS_BYTES, now
        return moved

    def _write_stalled(self) -> None:
        self.stall_timer = None
        if self.transport is None or self.transport.is_closing():
            return
        if self.progressed(0):
            assert self.limits.write_timeout is not None   # the timer is armed only with one
            self.stall_timer = asyncio.get_running_loop().call_later(self.limits.write_timeout, self._write_stalled)
            return
        m.CONNECTIONS_REFUSED.labels("client_stalled").inc()
        self.transport.abort()

    def _unstall(self) -> None:
        if self.stall_timer is not None:
            self.stall_timer.cancel()
            self.stall_timer = None

    # -- what the client sends -----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.stash:
            self.stash += data
            self._pause()
            return
        while data and self.inner is not None and not self.refused:
            if not self.framed:
                self.inner.data_received(data)
                return
            if not self.body_left and not self.head and self.requests >= PIPELINED:
                # Heads pipelined past PIPELINED unanswered ones wait here, reading paused: aiohttp
                # queued every head it was handed (6,800 parsed requests, 4 MiB, on one connection
                # that never read its answers).
                self.stash = data
                self._pause()
                return
            if self.body_left:
                if len(data) <= self.body_left:
                    self.body_left -= len(data)
                    self.inner.data_received(data)
                    return
                body, data = data[:self.body_left], data[self.body_left:]
                self.body_left = 0
                self.inner.data_received(body)
                continue
            data = self._head_bytes(data)

    def _head_bytes(self, data: bytes) -> bytes:
        """Take head bytes from `data`; hand a whole head to aiohttp. Returns what follows the head.
        Empty lines before a head are dropped (RFC 9112 section 2.2): they are no request, and aiohttp
        ignores them, so no handler would ever run to mark one finished. Counted as a head, a
        connection that sent only CRLFs was never idle again: never reaped, and a few of them held
        the pool until the idle timeout closed them."""
        if not self.head:
            data = data.lstrip(b"\r\n")
            if not data:
                return b""
            # Reapable from when its head began: a head that takes a second is no client's
            # (heads come in one packet), so a pool full of slow heads makes room like an idle one.
            self.limits.reapable(self)
            self._disarm()
            self.timer = asyncio.get_running_loop().call_later(self.limits.header_timeout, self._headers_too_slow)
        start = max(0, len(self.head) - 3)   # the blank line may straddle two reads
        room = self.limits.max_head_bytes - len(self.head)
        self.head += data[:room]              # never more than max_head_bytes held
        end = HEAD_END.search(self.head, start)
        if end is None:
            if len(data) > room:
                self._refuse(HEAD_TOO_LARGE, "header_too_large")
            return b""
        head, rest = bytes(self.head[:end.end()]), bytes(self.head[end.end():]) + data[room:]
        self.head = bytearray()
        self.limits.idle.pop(self, None)
        self._disarm()
        if head.startswith(b"CONNECT "):
            self._refuse(NO_TUNNELS, "connect")
            return b""
        refusal = version_refusal(head)
        if refusal is not None:
            self.limits.malformed.seen(self.address, refusal[1], 505 if refusal[0] is OTHER_VERSION else 400)
            self._refuse(*refusal)
            return b""
        if other_coding(head):
            self.limits.malformed.seen(self.address, "transfer_coding", 501)
            self._refuse(OTHER_CODING, "transfer_coding")
            return b""
        head = without_unknown_expectations(head)
        length = body_length(head)
        self.requests += 1
        self.handed += 1
        if length is None:
            self.framed = False
            self.unframed = self.handed
        else:
            self.body_left = length
        self.inner.data_received(head)
        return rest

    def _pause(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def request_finished(self) -> None:
        self.requests = max(0, self.requests - 1)
        self.finished += 1
        if self.stash and self.requests < PIPELINED and self.inner is not None:
            data, self.stash = self.stash, b""
            self.data_received(data)
            if not self.stash and self.transport is not None and not self.transport.is_closing() and not getattr(
                    self.inner, "_reading_paused", False):
                self.transport.resume_reading()
        if not self.framed and self.finished >= self.unframed and self.inner is not None:
            # The unframed request has been answered: nothing after it is read. (Requests are
            # answered in order; one pipelined before it is answered first, the connection kept.)
            self.inner.close()
        self._idle()

    def _idle(self) -> None:
        if self.requests == 0 and not self.head and not self.body_left and self.inner is not None:
            self.limits.idle[self] = self.limits.clock()

    def _headers_too_slow(self) -> None:
        self.timer = None
        self._refuse(TIMED_OUT, "header_timeout")

    def _refuse(self, answer: bytes, reason: str) -> None:
        """Answer, then close after LINGER_SECONDS, reading and dropping what the client still sends:
        closing at once with unread bytes would reset the connection, and the client would lose the
        answer. A head pipelined behind a request still being answered is not answered: that answer
        owns the connection (a refusal written into it reached the client as the first request's
        answer, or inside its stream, and aiohttp's own write then failed), so what follows is
        dropped and the connection closes once that answer is written."""
        self.head = bytearray()
        if self.transport is None or self.transport.is_closing() or self.refused:
            return
        m.CONNECTIONS_REFUSED.labels(reason).inc()
        self.refused = True
        self.limits.idle.pop(self, None)
        self._disarm()
        if self._answering():
            self.inner.close()
            return
        self.transport.write(answer)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_SECONDS, self.close)

    def _answering(self) -> bool:
        """A request handed to aiohttp on this connection is queued, handled, or its answer still
        being written."""
        inner = self.inner
        return self.requests > 0 or (inner is not None and (
            bool(getattr(inner, "_messages", ())) or bool(getattr(inner, "_request_in_progress", False))))

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class MalformedLog:
    """At most one log line per MALFORMED_LOG_SECONDS about malformed requests, with how many there
    were: a flood of them cannot flood the log."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.last = -MALFORMED_LOG_SECONDS
        self.unlogged = 0

    def seen(self, address: str, kind: str, status: int = 400) -> None:
        m.REJECTED.labels("malformed").inc()
        self.unlogged += 1
        now = self.clock()
        if now - self.last < MALFORMED_LOG_SECONDS:
            return
        log.warning("malformed HTTP request from %s (%s), answered %d; %d malformed request(s) since the last "
                    "such line", address, kind, status, self.unlogged)
        self.last, self.unlogged = now, 0


class GatewayRequestHandler(RequestHandler):
    """aiohttp's request handler, with its error path made quiet and fixed: a request it cannot
    parse is answered 400 with a fixed body (aiohttp's quotes the request back; 414 or 431 when a
    line, or the count of header lines, is over aiohttp's limits) and counted in one rate-limited
    line (aiohttp's logs the head with a traceback at ERROR)."""

    malformed: MalformedLog | None = None

    def data_received(self, data: bytes) -> None:
        """aiohttp's, and when these bytes break the framing of the body of the request being
        answered (a bad chunk size after a valid head), that body fails at once, answered 400, and
        the connection closes after it. aiohttp queues its 400 behind that request instead, whose
        handler then waits for the rest of a body that cannot come (body_timeout_seconds, holding
        the key's place in flight and its body's bytes, then a 408)."""
        messages = self._messages
        queued = len(messages)
        super().data_received(data)
        if len(messages) == queued or not isinstance(messages[-1][0], _ErrInfo):
            return
        # The body the bytes belonged to: the last request queued before the error (its handler
        # has not started yet), else the one being answered.
        body = messages[-2][1] if len(messages) >= 2 else (
            self._current_request.content if self._current_request is not None else None)
        if body is not None and not body.is_eof():
            messages.pop()
            body.set_exception(MalformedBody())
            body.feed_eof()    # nothing more is read into it (aiohttp's lingering read would raise)
            self.close()

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        address = request.remote or "unknown"
        if status < 500:
            size = too_large(exc)
            status, body = (size, TOO_LARGE[size]) if size else (status, MALFORMED)
            if self.malformed is not None:
                self.malformed.seen(address, type(exc).__name__ if exc is not None else str(status), status)
        elif isinstance(exc, ConnectionResetError):
            # The client hung up before its body was whole (aiohttp's "Connection lost"): nobody
            # is left to answer, and a line per hang-up would let any client fill the log.
            log.debug("%s hung up before its request was whole", address)
            status, body = 400, MALFORMED    # written nowhere: the connection is gone
        else:
            log.error("unexpected %s while answering %s", type(exc).__name__ if exc else "error", address)
            body = {"error": {"message": "internal error in the gateway", "type": "server_error", "param": None,
                              "code": "internal_error"}}
        if request.writer.output_size > 0:
            raise ConnectionError("the answer had begun; the connection is closed")
        resp = web.json_response(body, status=status, headers={"Server": SERVER_HEADER, "Connection": "close"})
        resp.force_close()
        return resp

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        log.error("%s (%s)", args[0] if args else "error",
                  type(exc).__name__ if isinstance(exc, BaseException) else "no details")


class GuardedSite(web.TCPSite):
    """A TCPSite whose connections go through `limits`, each answered by a GatewayRequestHandler."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limits: Limits, **kwargs: Any):
        super().__init__(runner, host, port, **kwargs)
        self.limits = limits

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        options = dict(server._kwargs)   # the runner's handler settings (timeouts, limits, logging)

        def handler() -> GatewayRequestHandler:
            h = GatewayRequestHandler(server, loop=loop, **options)
            h.malformed = self.limits.malformed
            return h

        self._server = await loop.create_server(
            self.limits.protocol_factory(handler), self._host, self._port, ssl=self._ssl_context,
            backlog=self._backlog, reuse_address=self._reuse_address, reuse_port=self._reuse_port)
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port
