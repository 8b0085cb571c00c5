"""Exhaustion, driven in process over real loopback sockets: what one connection, one request or
one key can make the gateway hold. Each is bounded by construction (the head by the connection
guard, bodies, parsed requests and answers by the byte budget and caps), and counted as what is
actually held, not as bytes on the wire. `make bench-gateway` measures the RSS these bounds give;
here the bounds themselves are checked. The upstream is a recording stand-in for Triton
(tests/gateway_http.py says why)."""

from __future__ import annotations

import asyncio

from triton_operator.gateway import guard

from .gateway_http import KEY_A, Rig, closed_within, connect, run, settle

LINE = "X-Filler-{i}: " + "a" * 8000 + "\r\n"


def test_a_head_that_never_ends_is_cut_at_the_head_limit_with_431():
    """125 header lines of 8 KB that never end used to be held whole (about 2 MiB a connection)."""
    async def scenario():
        async with Rig(max_header_bytes=32768, header_timeout_seconds=30) as rig:
            reader, writer = await connect(rig.port)
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
            sent = 0
            try:
                for i in range(125):
                    writer.write(LINE.format(i=i).encode())
                    sent += 1
                    await writer.drain()
                    held = [len(g.head) for g in rig.gw.connections.guards.values()]
                    assert max(held, default=0) <= 32768
            except ConnectionError:
                pass   # the gateway closed the connection while the client still sent
            assert await closed_within(reader, 5) == guard.HEAD_TOO_LARGE
            assert sent >= 5   # the head passed the limit (the rest was dropped while the answer lingered)
            writer.close()
            await settle(lambda: rig.gw.connections.open == 0)
    run(scenario)


def test_a_whole_head_over_the_limit_is_refused_and_one_under_it_served():
    async def scenario():
        async with Rig(max_header_bytes=16384) as rig:
            filler = "".join(f"X-F{i}: {'b' * 1000}\r\n" for i in range(20))   # about 20 KB
            reader, writer = await connect(rig.port)
            writer.write(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n{filler}\r\n".encode())
            await writer.drain()
            assert await closed_within(reader, 5) == guard.HEAD_TOO_LARGE
            writer.close()
            small = "".join(f"X-F{i}: {'b' * 1000}\r\n" for i in range(12))    # about 12 KB
            reply = await rig.call("GET", "/v1/models", headers={f"X-F{i}": "b" * 1000 for i in range(12)})
            assert reply.status == 200 and len(small) < 16384
    run(scenario)


def test_more_header_lines_than_clients_send_are_refused():
    async def scenario():
        async with Rig() as rig:
            reply = await rig.call("GET", "/v1/models", headers={f"X-{i}": "1" for i in range(70)})
            assert reply.status == 400 and reply.error["code"] == "bad_request"
    run(scenario)
