"""The e2e harness's free_port, on real loopback sockets: below the kernel's ephemeral range (an
outgoing connection takes its local port from that range, and once took a port handed to a server
before it bound it), never the same port twice, and bindable."""

from __future__ import annotations

import socket

from e2e import harness
from e2e.harness import _ephemeral_start, free_port


def test_ports_are_below_the_ephemeral_range_distinct_and_free():
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(1024 <= p < _ephemeral_start() for p in ports)
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))          # raises if it was not free


def test_a_port_in_use_is_skipped(monkeypatch):
    """The first pick is a port another socket listens on (not one free_port handed out): it is
    tried, found taken, and the next pick is returned."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        spare = free_port()
        harness._handed.discard(spare)
        picks = iter([taken, spare])
        monkeypatch.setattr(harness._pick, "randrange", lambda lo, hi: next(picks))
        assert free_port() == spare
