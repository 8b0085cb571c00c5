"""The standby's health server on real sockets: 200 while the election runs, 503 once it stopped,
404 elsewhere; stopping it frees the port for kopf's liveness endpoint."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

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
