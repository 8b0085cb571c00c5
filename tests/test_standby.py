"""The standby's health server on real sockets: 200 while the election runs, 503 once it stopped,
404 elsewhere; stopping it frees the port for kopf's liveness endpoint."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

from triton_operator.kube import plain_http
from triton_operator.kube.standby import StandbyHealth


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_standby_answers_while_it_campaigns_and_frees_the_port():
    port = free_port()
    running = [True]
    health = StandbyHealth(f"http://127.0.0.1:{port}/healthz", lambda: running[0]).start()
    try:
        assert get(f"http://127.0.0.1:{port}/healthz") == (200, {"leader": False, "election": "waiting for the lease"})
        assert get(f"http://127.0.0.1:{port}/other")[0] == 404
        running[0] = False
        assert get(f"http://127.0.0.1:{port}/healthz") == (503, {"leader": False, "election": "stopped"})
    finally:
        health.stop()
    with socket.socket() as s:   # what kopf's aiohttp does next (asyncio reuses addresses on Unix)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def raw(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_the_operators_small_servers_are_bounded(monkeypatch):
    """The standby's health server and the metrics port were the standard library's threaded
    server as it comes: a thread per connection, held as long as the client liked, reading heads
    of 100 lines of 64 KiB (100 connections that never ended one: 24 -> 587 MB for the standby,
    730 MB for the metrics port). Now: a deadline per connection, a cap on what is read from it,
    a cap on connections (one more is answered 503)."""
    monkeypatch.setattr(plain_http, "DEADLINE_SECONDS", 0.5)
    monkeypatch.setattr(plain_http.CappedHandler, "timeout", 0.5)
    monkeypatch.setattr(plain_http, "MAX_CONNECTIONS", 4)
    port = free_port()
    health = StandbyHealth(f"http://127.0.0.1:{port}/healthz", lambda: True).start()
    metrics = plain_http.serve_metrics("127.0.0.1", 0)
    try:
        for p in (port, metrics.server_address[1]):
            # a head that never ends is cut at the deadline, answered nothing
            with socket.create_connection(("127.0.0.1", p), timeout=5) as s:
                started = time.monotonic()
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                try:
                    got = s.recv(100)
                except ConnectionResetError:   # closed with the head half read: a reset, no answer either
                    got = b""
                assert got == b"" and time.monotonic() - started < 3
            # a head past the cap is read no further: what arrived is answered, the rest is never held
            big = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 8000) for i in range(8))
            started = time.monotonic()
            try:
                answer = raw(p, big + b"\r\n")
            except (ConnectionResetError, BrokenPipeError):
                # closed with the rest of the head unread: the kernel resets the connection, and the
                # answer can be lost with it ("or not at all"); either way it was not held
                answer = b""
            assert time.monotonic() - started < 3
            assert answer == b"" or (answer.startswith(b"HTTP/1.0 ") and int(answer.split()[1]) in (200, 400)), answer[:80]
            # one connection past the cap is answered 503 while the others hold theirs. The
            # connections above ended for the client a moment before their threads let their slots go, so
            # one of four connections opened right after could itself be the one answered 503:
            # four are held again until a fifth meets a full server (a larger cap never would)
            for _attempt in range(5):
                held = [socket.create_connection(("127.0.0.1", p), timeout=5) for _ in range(4)]
                answer = raw(p, b"GET /healthz HTTP/1.0\r\n\r\n")
                for s in held:
                    s.close()
                time.sleep(0.7)   # past the deadline, their slots are free again
                if answer == plain_http.BUSY:
                    break
            assert answer == plain_http.BUSY, answer[:80]
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics.server_address[1]}/metrics", timeout=5) as r:
            assert r.status == 200 and b"# TYPE" in r.read()
    finally:
        health.stop()
        metrics.shutdown()
        metrics.server_close()
