"""The e2e harness's TCP fault proxy, on real loopback sockets in front of a real http.server."""

from __future__ import annotations

import http.client
import socket
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from e2e.harness.faultproxy import FaultProxy

#: What a client sees when its connection was reset, depending on when the reset arrives:
#: ECONNRESET on connect, send or receive, or EPIPE on a send after it.
RESET = (ConnectionResetError, BrokenPipeError)


class Upstream(ThreadingHTTPServer):
    """Answers every request with 200 and its path (and body), recording what arrived when."""

    daemon_threads = True

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes, float]] = []  # method, path, body, monotonic arrival
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the Prometheus and Kubernetes clients use it

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append((self.command, self.path, body, time.monotonic()))  # type: ignore[attr-defined]
        payload = f"{self.command} {self.path} {body.decode()}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy(upstream: Upstream) -> Iterator[FaultProxy]:
    with FaultProxy(upstream.address) as p:
        yield p


def _connection(proxy: FaultProxy) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(proxy.host, proxy.port, timeout=30)


def _get(conn: http.client.HTTPConnection, path: str, body: bytes | None = None) -> tuple[int, str]:
    conn.request("POST" if body is not None else "GET", path, body=body)
    response = conn.getresponse()
    return response.status, response.read().decode()


def test_pass_forwards_requests_over_one_kept_alive_connection(proxy, upstream):
    conn = _connection(proxy)
    assert _get(conn, "/first") == (200, "GET /first ")
    assert _get(conn, "/second", body=b"payload") == (200, "POST /second payload")
    conn.close()
    assert [(m, p, b) for m, p, b, _ in upstream.seen] == [("GET", "/first", b""), ("POST", "/second", b"payload")]
    assert proxy.connections == 1 and not proxy.injected
    assert proxy.address == f"127.0.0.1:{proxy.port}" and proxy.port != 0


def test_half_close_is_passed_on(upstream):
    """TCP level, for protocols other than HTTP: the upstream answers only after the client
    closed its sending side, and the answer still comes back through the proxy."""

    class Shout(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            self.wfile.write(self.rfile.read().upper())  # read() returns at the client's EOF

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Shout)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        with FaultProxy(("127.0.0.1", server.server_address[1])) as proxy:
            with socket.create_connection((proxy.host, proxy.port), timeout=30) as sock:
                sock.sendall(b"hello ")
                sock.sendall(b"world")
                sock.shutdown(socket.SHUT_WR)
                received = b""
                while chunk := sock.recv(1024):
                    received += chunk
            assert received == b"HELLO WORLD"
    finally:
        server.shutdown()
        server.server_close()


def test_delay_holds_every_chunk_in_both_directions(proxy, upstream):
    conn = _connection(proxy)
    assert _get(conn, "/warm")[0] == 200  # connected before the fault: delay applies to open connections
    proxy.mode("delay", seconds=0.3)
    sent = time.monotonic()
    assert _get(conn, "/slow") == (200, "GET /slow ")
    answered = time.monotonic()
    arrived = upstream.seen[-1][3]
    # Lower bounds only (a sleep lasts at least its time): the request reached the upstream no
    # sooner than 0.3 s after it was sent, and the answer came back no sooner than 0.3 s later.
    assert arrived - sent >= 0.3, arrived - sent
    assert answered - arrived >= 0.3, answered - arrived
    assert proxy.injected["delay"] >= 2
    proxy.mode("pass")
    delayed = proxy.injected["delay"]
    assert _get(conn, "/again")[0] == 200
    assert proxy.injected["delay"] == delayed


def test_reset_breaks_open_connections_and_new_ones(proxy, upstream):
    conn = _connection(proxy)
    assert _get(conn, "/before")[0] == 200
    assert proxy.open_connections == 1
    proxy.mode("reset")
    assert proxy.injected["reset"] == 1 and proxy.open_connections == 0
    with pytest.raises(RESET):
        _get(conn, "/on-the-reset-connection")
    conn.close()

    with pytest.raises(RESET):  # accepted, then reset: seen by connect(), send() or recv()
        with socket.create_connection((proxy.host, proxy.port), timeout=30) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.recv(1024)
    assert proxy.injected["reset"] == 2
    assert [p for _, p, _, _ in upstream.seen] == ["/before"]

    proxy.mode("pass")
    assert _get(_connection(proxy), "/after") == (200, "GET /after ")


def test_refuse_closes_the_listener_and_pass_reopens_the_same_port(proxy, upstream):
    kept = _connection(proxy)
    assert _get(kept, "/kept")[0] == 200
    address = proxy.address
    proxy.mode("refuse")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((proxy.host, proxy.port), timeout=5).close()
    assert _get(kept, "/still-open")[0] == 200  # open connections carry on...
    assert proxy.reset_open_connections() == 1  # ...until they are dropped on purpose
    with pytest.raises(RESET):
        _get(kept, "/dropped")
    proxy.mode("pass")
    assert proxy.address == address
    assert _get(_connection(proxy), "/back") == (200, "GET /back ")


def test_http_error_answers_every_request_and_the_upstream_sees_none(proxy, upstream):
    kept = _connection(proxy)
    assert _get(kept, "/before")[0] == 200
    proxy.mode("http_error", status=503)
    assert _get(_connection(proxy), "/api/v1/query?query=up") == (503, "fault proxy: injected HTTP 503\n")
    status, _ = _get(_connection(proxy), "/api/v1/query", body=b"query=up" * 2000)  # body read whole first
    assert status == 503
    assert _get(kept, "/next-on-a-kept-alive-connection")[0] == 503
    proxy.mode("http_error", status=500, body="boom")
    assert _get(_connection(proxy), "/x") == (500, "boom")
    assert proxy.injected["http_error"] == 4
    assert [p for _, p, _, _ in upstream.seen] == ["/before"]
    proxy.mode("pass")
    assert _get(_connection(proxy), "/after")[0] == 200


def test_an_unreachable_upstream_resets_the_client():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # bound, never listening: connecting to it is refused
        with FaultProxy(("127.0.0.1", dead)) as proxy:
            with pytest.raises(RESET):
                with socket.create_connection((proxy.host, proxy.port), timeout=30) as sock:
                    sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
                    sock.recv(1024)
            assert proxy.upstream_errors == 1


def test_stop_closes_the_listener_and_open_connections(upstream):
    proxy = FaultProxy(upstream.address).start()
    conn = _connection(proxy)
    assert _get(conn, "/x")[0] == 200
    proxy.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((proxy.host, proxy.port), timeout=5).close()
    with pytest.raises((*RESET, http.client.RemoteDisconnected)):
        _get(conn, "/y")
    assert not [t for t in threading.enumerate() if t.name.startswith("faultproxy-")]
    proxy.stop()  # idempotent


@pytest.mark.parametrize("kwargs, words", [
    ({"upstream": "10.0.0.1:80"}, "upstream '10.0.0.1' is not a loopback address"),
    ({"upstream": "127.0.0.1:80", "host": "0.0.0.0"}, "listen host '0.0.0.0' is not a loopback address"),
    ({"upstream": "nothing"}, "upstream must be host:port"),
])
def test_only_loopback_addresses(kwargs, words):
    with pytest.raises(ValueError, match=words):
        FaultProxy(**kwargs)


def test_bad_modes_are_refused(proxy):
    with pytest.raises(ValueError, match="unknown mode 'slow'"):
        proxy.mode("slow")
    with pytest.raises(ValueError, match="needs seconds"):
        proxy.mode("delay")
    with pytest.raises(ValueError, match="status must be an HTTP status code"):
        proxy.mode("http_error", status=42)
    assert proxy.current_mode == "pass"
