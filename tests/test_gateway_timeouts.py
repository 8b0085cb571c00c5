"""Timeouts, driven in process over real loopback sockets: a client that sends slowly, or a
replica that answers slowly, holds a connection and a request only as long as the settings say.
The upstream is a recording stand-in for Triton (tests/gateway_http.py says why)."""

from __future__ import annotations

import asyncio

from triton_operator.gateway import guard

from .gateway_http import KEY_A, Rig, closed_within, connect, read_reply, run, settle


def test_headers_that_trickle_are_cut_with_408_at_the_header_timeout():
    async def scenario():
        async with Rig(header_timeout_seconds=0.3) as rig:
            reader, writer = await connect(rig.port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            await writer.drain()
            for _ in range(3):   # a byte now and then is not enough
                await asyncio.sleep(0.1)
                writer.write(b"X")
                await writer.drain()
            reply = await asyncio.wait_for(read_reply(reader), 5)
            assert (reply.status, reply.headers["connection"], reply.error["code"]) == (408, "close", "request_timeout")
            assert await closed_within(reader, 5) == b""
            writer.close()
            # a request whose headers arrive in time is not affected, on the next connection
            assert (await rig.call("GET", "/v1/models")).status == 200
    run(scenario)


def test_partial_headers_pipelined_after_a_finished_request_get_the_header_timeout():
    """They used to hold the connection for the idle timeout (60 s) instead of 10 s."""
    async def scenario():
        async with Rig(header_timeout_seconds=0.3, idle_timeout_seconds=30) as rig:
            reader, writer = await connect(rig.port)
            started = asyncio.get_running_loop().time()
            writer.write(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n\r\n"
                         f"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode())
            await writer.drain()
            first = await asyncio.wait_for(read_reply(reader), 5)
            assert first.status == 200
            second = await asyncio.wait_for(read_reply(reader), 5)
            assert (second.status, second.error["code"]) == (408, "request_timeout")
            assert asyncio.get_running_loop().time() - started < 3
            assert await closed_within(reader, 5) == b""
            writer.close()
    run(scenario)


def test_partial_headers_after_a_body_get_the_header_timeout():
    async def scenario():
        async with Rig(header_timeout_seconds=0.3, idle_timeout_seconds=30) as rig:
            reader, writer = await connect(rig.port)
            body = b'{"model": "ml/llama", "prompt": "x"}'
            writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                         + body + b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            await writer.drain()
            first = await asyncio.wait_for(read_reply(reader), 5)
            assert first.status == 200 and first.json()["choices"][0]["text"] == "hello"
            second = await asyncio.wait_for(read_reply(reader), 5)
            assert second.status == 408
            writer.close()
    run(scenario)


def test_pipelined_whole_requests_are_all_answered_in_order():
    async def scenario():
        async with Rig() as rig:
            reader, writer = await connect(rig.port)
            body = b'{"model": "ml/llama", "prompt": "x"}'
            one = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
            models = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n\r\n".encode()
            stream = one + models + one
            for i in range(0, len(stream), 7):   # in small pieces, cut anywhere
                writer.write(stream[i:i + 7])
                await writer.drain()
            replies = [await asyncio.wait_for(read_reply(reader), 5) for _ in range(3)]
            assert [r.status for r in replies] == [200, 200, 200]
            assert "choices" in replies[0].json() and replies[1].json()["object"] == "list"
            assert "choices" in replies[2].json()
            writer.close()
    run(scenario)


def test_many_half_open_connections_are_all_closed():
    async def scenario():
        async with Rig(header_timeout_seconds=0.3, idle_timeout_seconds=0.5) as rig:
            conns = [await connect(rig.port) for _ in range(50)]
            for i, (_, writer) in enumerate(conns):
                if i % 2:
                    writer.write(b"GET /v1/models HTTP/1.1\r\nHost")   # half a header
            closed = await asyncio.wait_for(asyncio.gather(*(r.read() for r, _ in conns)), 10)
            assert len(closed) == 50
            for data in closed:   # silent ones closed at the idle timeout, half-sent ones answered 408
                assert data in (b"", guard.TIMED_OUT)
            for _, w in conns:
                w.close()
            await settle(lambda: rig.gw.connections.open == 0)
    run(scenario)


def test_a_trickled_body_gets_408_at_the_body_timeout():
    async def scenario():
        async with Rig(body_timeout_seconds=0.3) as rig:
            reader, writer = await connect(rig.port)
            head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
            writer.write(head.encode() + b'{"model": ')
            await writer.drain()
            reply = await asyncio.wait_for(read_reply(reader), 5)
            assert (reply.status, reply.error["message"], reply.error["code"]) == (
                408, "the request body did not arrive within 0.3s", "request_timeout")
            writer.close()
            assert rig.gw.bodies.used == 0 and rig.gw.in_flight.by_key == {}
    run(scenario)
