"""Floods, driven in process over real loopback sockets: many connections from one client, idle
connections filling the pool, guessed keys, request rates. Each client must keep its share and
no client may lock out another. Second clients connect from other 127.0.0.0/8 addresses. The
upstream is a recording stand-in for Triton (tests/gateway_http.py says why)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from triton_operator.gateway import guard

from .gateway_http import (KEY_A, KEY_B, LogLines, Reply, Rig, closed_within, connect, isvc, raw_request, read_reply,
                           run, settle, slice_for)


async def fill_share(rig: Rig, share: int) -> asyncio.StreamWriter:
    """KEY_A's own upload, announced to fill the rest of its `share` of the gateway's memory and
    never sent; the caller closes the writer."""
    used = sum(rig.gw.bodies.by_key.values())
    _, writer = await connect(rig.port)
    writer.write((f"POST /v1/completions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {KEY_A}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {share - used - 10}\r\n\r\n").encode())
    await writer.drain()
    return writer


def metered_with_text_model(rig: Rig, tokens_per_minute: int = 100, frozen: bool = False) -> None:
    """KEY_A alone, at `tokens_per_minute`, and `ml/chat`: a text model (python) serving the OpenAI
    routes, whose answers carry no token counts; `frozen`: the key's clock stands still (nothing
    refills while a test runs)."""
    from triton_operator.gateway import keys as k

    rig.gw.auth.grants = k.parse(f"keys: [{{name: t, key: {KEY_A}, namespaces: [ml], "
                                 f"tokensPerMinute: {tokens_per_minute}}}]", "k")
    if frozen:
        rig.gw.auth.clock = lambda: 1000.0
    rig.gw.router.set_service(isvc("chat", fmt="python", openai={
        "enabled": True, "chatTemplate": "{{ messages[0]['content'] }}"}))
    rig.gw.router.set_slice(slice_for("chat", rig.upstream.port))


def test_one_address_gets_its_share_of_connections_and_no_more():
    """532 idle connections from one address used to take all 512 places for 60 s."""
    async def scenario():
        async with Rig(max_connections=40, max_connections_per_address=8) as rig:
            mine = [await connect(rig.port) for _ in range(8)]
            await settle(lambda: rig.gw.connections.open == 8)
            reader, writer = await connect(rig.port)
            assert await closed_within(reader, 5) == guard.REFUSED_ADDRESS
            writer.close()
            # another client is served while the first one holds its share
            other = await raw_request_from(rig.port, "127.0.0.2")
            assert other.status == 200
            for _, w in mine:
                w.close()
    run(scenario)


async def raw_request_from(port: int, source: str):
    reader, writer = await connect(port, source)
    writer.write(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_B}\r\n"
                 f"Connection: close\r\n\r\n".encode())
    await writer.drain()
    try:
        return await asyncio.wait_for(read_reply(reader), 5)
    finally:
        writer.close()


def test_a_trusted_proxy_is_not_held_to_one_address_share():
    async def scenario():
        async with Rig(max_connections=40, max_connections_per_address=2, trusted_proxies=["127.0.0.1/32"]) as rig:
            held = [await connect(rig.port) for _ in range(5)]
            assert (await raw_request(rig.port, "GET", "/v1/models", {"Authorization": f"Bearer {KEY_A}"})).status == 200
            assert rig.gw.connections.by_address["127.0.0.1"] >= 5
            for _, w in held:
                w.close()
    run(scenario)


def test_idle_connections_are_reaped_when_the_pool_is_nearly_full(monkeypatch):
    monkeypatch.setattr(guard, "REAP_IDLE_SECONDS", 0.2)

    async def scenario():
        async with Rig(max_connections=10, max_connections_per_address=10) as rig:
            # nine clients open a connection each and send nothing
            idle = [await connect(rig.port, f"127.0.0.{10 + i}") for i in range(9)]
            await settle(lambda: rig.gw.connections.open == 9)
            await asyncio.sleep(0.3)
            # a newcomer is served: the oldest idle connection made room for it
            served = await raw_request_from(rig.port, "127.0.0.99")
            assert served.status == 200
            assert await closed_within(idle[0][0], 5) == b""
            assert not idle[-1][0].at_eof()
            for _, w in idle:
                w.close()
    run(scenario)


def test_a_connection_in_a_request_is_never_reaped(monkeypatch):
    monkeypatch.setattr(guard, "REAP_IDLE_SECONDS", 0.0)

    async def scenario():
        async with Rig(max_connections=4, max_connections_per_address=4) as rig:
            release = asyncio.Event()

            async def slow(request):
                await release.wait()
                from aiohttp import web
                return web.json_response({"text_output": "late"})
            rig.upstream.answer = slow
            busy = asyncio.create_task(rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"}))
            await settle(lambda: len(rig.upstream.seen) == 1)
            others = [await connect(rig.port, f"127.0.0.{20 + i}") for i in range(3)]   # the pool is full now
            await asyncio.sleep(0.05)
            newcomer = await raw_request_from(rig.port, "127.0.0.30")   # reaps idle ones, not the busy one
            assert newcomer.status == 200
            release.set()
            reply = await asyncio.wait_for(busy, 5)
            assert reply.status == 200 and reply.json()["choices"][0]["text"] == "late"
            for _, w in others:
                w.close()
    run(scenario)


def test_guessed_keys_never_lock_out_a_valid_key_from_the_same_address():
    """Eleven wrong keys from an address used to make the next valid key from it get 429."""
    async def scenario():
        async with Rig(failed_auth_per_minute=6) as rig:
            statuses = [(await rig.call("GET", "/v1/models", key="sk-guess")).status for _ in range(11)]
            assert statuses == [401] * 3 + [429] * 8   # a burst of 3, then throttled
            assert (await rig.call("GET", "/v1/models", key=KEY_A)).status == 200
            assert (await rig.call("GET", "/v1/models", key=KEY_B)).status == 200
            throttled = await rig.call("GET", "/v1/models", key="sk-guess")
            assert (throttled.status, throttled.error["code"]) == (429, "too_many_failed_attempts")
            missing = await rig.call("GET", "/v1/models", key=None)
            assert (missing.status, missing.error["code"]) == (429, "too_many_failed_attempts")
    run(scenario)


def test_a_key_that_is_not_utf8_is_a_wrong_key_and_throttled_as_one():
    """An Authorization header of bytes that are not UTF-8 used to be a 500 with an ERROR log line
    every time, before the failed-attempt throttle was consulted."""
    async def send(port: int, auth: bytes) -> Reply:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + auth
                     + b"\r\nConnection: close\r\n\r\n")
        await writer.drain()
        reply = await asyncio.wait_for(read_reply(reader), 10)
        writer.close()
        return reply

    async def scenario():
        async with Rig(failed_auth_per_minute=6) as rig:
            with LogLines() as logs:
                replies = [await send(rig.port, raw) for raw in (b"\xff\xfe", b"sk-\xc3\x28" + b"a" * 40,
                                                                 b"\xed\xa0\x80", b"\xff", b"sk-guess")]
            assert [r.status for r in replies] == [401, 401, 401, 429, 429]   # a burst of 3, then throttled
            assert replies[0].error == {"message": "invalid API key", "type": "invalid_request_error", "param": None,
                                        "code": "invalid_api_key"}
            assert replies[3].error["code"] == "too_many_failed_attempts"
            assert [r for r in logs.records if r.levelno >= logging.WARNING] == []
            assert (await rig.call("GET", "/v1/models", key=KEY_A)).status == 200
    run(scenario)


def test_an_address_past_its_failed_attempts_has_its_connection_closed_after_each_answer():
    """An address past its failed key attempts was answered 429 on a connection kept open: one
    address without a key drew 8,700 answers a second over 32 connections, pipelining, the
    gateway's whole CPU, and a keyed client's median went from 2 to 30 ms. The connection now
    closes after such an answer, and the requests pipelined behind it are not answered; a valid
    key from the same address, on a connection of its own, is served."""
    async def scenario():
        async with Rig(failed_auth_per_minute=6) as rig:
            for _ in range(3):   # the burst
                assert (await rig.call("GET", "/v1/models", key="sk-guess")).status == 401
            reader, writer = await connect(rig.port)
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-guess\r\n\r\n" * 3)
            await writer.drain()
            reply = await asyncio.wait_for(read_reply(reader), 10)
            assert (reply.status, reply.error["code"]) == (429, "too_many_failed_attempts")
            assert reply.headers["connection"] == "close"
            assert await closed_within(reader, 5) == b""   # the two pipelined behind it are not answered
            writer.close()
            assert (await rig.call("GET", "/v1/models", key=KEY_A)).status == 200
            await settle(lambda: rig.gw.connections.open == 0)
    run(scenario)


def test_guessing_keys_is_throttled_per_client_address_behind_a_proxy():
    async def scenario():
        async with Rig(failed_auth_per_minute=6, trusted_proxies=["127.0.0.0/8"]) as rig:
            def from_(client):
                return {"X-Forwarded-For": f"198.51.100.7, {client}"}
            for _ in range(3):   # the burst: a third of the minute's budget, at least 3
                assert (await rig.call("GET", "/v1/models", key="sk-guess", headers=from_("203.0.113.9"))).status == 401
            reply = await rig.call("GET", "/v1/models", key="sk-guess", headers=from_("203.0.113.9"))
            assert (reply.status, reply.error["code"]) == (429, "too_many_failed_attempts")
            assert int(reply.headers["retry-after"]) >= 1
            # the same address with a valid key, and another client behind the same proxy, are served;
            # the spoofable first entry is ignored
            assert (await rig.call("GET", "/v1/models", key=KEY_A, headers=from_("203.0.113.9"))).status == 200
            assert (await rig.call("GET", "/v1/models", key="sk-guess", headers=from_("203.0.113.10"))).status == 401
    run(scenario)


def test_connections_past_the_cap_get_503_and_are_closed():
    async def scenario():
        async with Rig(max_connections=3) as rig:
            held = [await connect(rig.port, f"127.0.0.{40 + i}") for i in range(3)]
            await settle(lambda: rig.gw.connections.open == 3)
            reader, writer = await connect(rig.port, "127.0.0.50")   # the others are not idle long enough to reap
            reply = await asyncio.wait_for(read_reply(reader), 5)
            assert (reply.status, reply.headers["retry-after"], reply.error["code"]) == (503, "1", "too_many_connections")
            writer.close()
            for _, w in held:
                w.close()
            await settle(lambda: rig.gw.connections.open == 0)
            assert (await rig.call("GET", "/v1/models")).status == 200
    run(scenario)


def test_rate_limits_are_split_over_the_gateway_replicas():
    async def scenario():
        async with Rig(requests_per_minute=300, replicas=3) as rig:
            # 300 a minute over 3 replicas: 100 a minute here, bursts of max(5, 10) = 10
            statuses = [(await rig.call("GET", "/v1/models")).status for _ in range(11)]
            assert statuses == [200] * 10 + [429]
    run(scenario)


def test_slow_heads_filling_the_pool_make_room_for_a_newcomer(monkeypatch):
    """Connections that trickle their head are bounded by the header timeout; when they fill the
    pool, the oldest are reaped like idle ones, so other clients are still served."""
    monkeypatch.setattr(guard, "REAP_IDLE_SECONDS", 0.2)

    async def scenario():
        async with Rig(max_connections=10, max_connections_per_address=10, header_timeout_seconds=30) as rig:
            slow = []
            for i in range(10):
                reader, writer = await connect(rig.port, f"127.0.1.{i + 1}")
                writer.write(b"GET /v1/models HTTP/1.1\r\nX-Slow: ")
                slow.append((reader, writer))
            await settle(lambda: rig.gw.connections.open == 10)
            await asyncio.sleep(0.3)
            served = await raw_request_from(rig.port, "127.0.0.99")
            assert served.status == 200
            assert await closed_within(slow[0][0], 5) == b""
            for _, w in slow:
                w.close()
    run(scenario)


async def all_idle_then_a_newcomer_served(rig: Rig, held: list) -> None:
    """The ten `held` connections (a pool of ten) count as idle, none with a request in progress,
    and a newcomer is served once they have been idle long enough to be reaped."""
    await settle(lambda: len(rig.gw.connections.idle) == 10)
    assert [g.requests for g in rig.gw.connections.guards.values()] == [0] * 10
    await asyncio.sleep(0.3)
    newcomer = await raw_request_from(rig.port, "127.0.0.99")
    assert newcomer.status == 200
    for _, w in held:
        w.close()


def test_connections_that_sent_an_unknown_expectation_are_reaped_like_any_other(monkeypatch):
    """`Expect` is read before the middlewares: aiohttp's own handler answered anything but
    100-continue with a plain-text 417 that the connection guard never saw end, so ten keep-alive
    connections that had each sent one held every slot (the newcomer got 503). The expectation is
    now ignored, and the guard sees each request end."""
    monkeypatch.setattr(guard, "REAP_IDLE_SECONDS", 0.2)

    async def scenario():
        async with Rig(max_connections=10, max_connections_per_address=10) as rig:
            held = []
            for i in range(10):
                reader, writer = await connect(rig.port, f"127.0.0.{40 + i}")
                writer.write(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                             f"Expect: bogus\r\n\r\n".encode())
                await writer.drain()
                reply = await asyncio.wait_for(read_reply(reader), 5)
                assert reply.status == 200 and reply.json()["object"] == "list"
                held.append((reader, writer))
            await all_idle_then_a_newcomer_served(rig, held)
    run(scenario)


@pytest.mark.parametrize("blank", [b"\r\n\r\n", b"\n\n", b"\r\n"])
def test_connections_that_sent_only_empty_lines_are_reaped_like_idle_ones(monkeypatch, blank):
    """Empty lines before a head are no request (RFC 9112 section 2.2; aiohttp ignores them). The
    guard counted `\\r\\n\\r\\n` as a whole head in progress that no handler ever finished, so such a
    connection was never idle again: ten of them held every slot (the newcomer got 503 until the
    idle timeout closed them). A served request followed by extra empty lines did the same."""
    monkeypatch.setattr(guard, "REAP_IDLE_SECONDS", 0.2)

    async def scenario():
        async with Rig(max_connections=10, max_connections_per_address=10, idle_timeout_seconds=30) as rig:
            held = []
            for i in range(9):
                reader, writer = await connect(rig.port, f"127.0.0.{60 + i}")
                writer.write(blank)
                held.append((reader, writer))
            reader, writer = await connect(rig.port, "127.0.0.69")
            writer.write(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n\r\n".encode()
                         + blank)
            reply = await asyncio.wait_for(read_reply(reader), 5)
            assert reply.status == 200 and reply.json()["object"] == "list"
            held.append((reader, writer))
            await all_idle_then_a_newcomer_served(rig, held)
    run(scenario)


def test_a_head_after_empty_lines_is_served():
    async def scenario():
        async with Rig() as rig:
            reader, writer = await connect(rig.port)
            writer.write(b"\r\n\r\n\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(f"\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n\r\n".encode())
            reply = await asyncio.wait_for(read_reply(reader), 5)
            assert reply.status == 200 and reply.json()["object"] == "list"
            writer.close()
    run(scenario)


def test_x_forwarded_for_sent_as_several_lines_is_read_as_one_list():
    """Behind a trusted proxy that adds its own X-Forwarded-For line, the client's line came
    first, and only that first line was read: a client chose its address for the failed-key
    limiter, never hit it, and could lock out another address. The lines are one list (RFC 9110),
    whose last entry outside the trusted proxies is the client."""
    async def scenario():
        async with Rig(failed_auth_per_minute=6, trusted_proxies=["127.0.0.1/32"]) as rig:
            async def wrong_key(*lines: str) -> int:
                reader, writer = await connect(rig.port)
                writer.write(("GET /v1/models HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer sk-wrong-" + "x" * 40
                              + "\r\n" + "".join(f"X-Forwarded-For: {v}\r\n" for v in lines)
                              + "Connection: close\r\n\r\n").encode())
                await writer.drain()
                status = (await asyncio.wait_for(read_reply(reader), 5)).status
                writer.close()
                return status
            codes = [await wrong_key(f"10.8.8.{i}", "203.0.113.8") for i in range(5)]
            assert codes == [401, 401, 401, 429, 429]           # the burst of 3, then throttled
            assert list(rig.gw.auth.failures.buckets) == ["203.0.113.8"]
            assert await wrong_key("198.51.100.9") == 401       # the address the attacker wrote is not locked out
    run(scenario)


def test_a_client_that_leaves_before_its_answer_is_charged_what_it_could_have_made():
    """tokensPerMinute counted only answers read whole: a key whose clients hung up before each
    non-streamed answer took the replicas' time past its budget, charged nothing. Now such a
    request is charged its max_tokens, n times (the model's own count never comes)."""
    from aiohttp import web

    from triton_operator.gateway import keys as k

    async def slow(request):
        await request.read()
        await asyncio.sleep(0.6)
        return web.json_response({"text_output": "x", "finish_reason": "length", "prompt_tokens": 7,
                                  "completion_tokens": 1000})

    async def scenario():
        # Streams left before their first event (the replica reads the prompt first) and
        # embeddings were charged nothing too. Each is charged what it could make (nothing more for
        # an embedding) and its prompt: what was sent to the replica at auth.BYTES_PER_TOKEN.
        chat = {"model": "llama", "messages": [{"role": "user", "content": "x"}], "max_tokens": 30, "stream": True}
        for target, body, charged in (("/v1/completions", {"model": "llama", "prompt": "x", "max_tokens": 50}, 50),
                                      ("/v1/completions", {"model": "llama", "prompt": "x", "max_tokens": 50, "n": 3},
                                       150),
                                      ("/v2/models/llama/generate", {"text_input": "x", "max_tokens": 40}, 40),
                                      ("/v1/chat/completions", chat, 30),
                                      ("/v1/chat/completions", {**chat, "n": 2}, 60),
                                      ("/v1/responses", {"model": "llama", "input": "x", "max_output_tokens": 20,
                                                         "stream": True}, 20),
                                      ("/v2/models/llama/generate_stream", {"text_input": "x", "max_tokens": 45}, 45),
                                      ("/v1/embeddings", {"model": "embed", "input": ["abcdefghi"]}, 0)):
            async with Rig() as rig:
                rig.gw.auth.grants = k.parse(
                    f"keys: [{{name: t, key: {KEY_A}, namespaces: [ml], tokensPerMinute: 600}}]", "k")
                rig.gw.router.set_service(isvc("embed", model={"source": "hf://a/b", "format": "python",
                                                               "name": "embed"}, openai={"task": "embeddings"}))
                rig.gw.router.set_slice(slice_for("embed", rig.upstream.port, "ml"))
                rig.upstream.answer = slow
                data = json.dumps(body).encode()
                reader, writer = await connect(rig.port)
                writer.write((f"POST {target} HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {KEY_A}\r\n"
                              f"X-Inference-Namespace: ml\r\nContent-Type: application/json\r\n"
                              f"Content-Length: {len(data)}\r\n\r\n").encode() + data)
                await writer.drain()
                await settle(lambda: len(rig.upstream.seen) == 1)
                writer.transport.abort()                          # gone before the answer
                await settle(lambda: bool(rig.gw.auth.token_limiter.buckets))
                (level, _), = rig.gw.auth.token_limiter.buckets.values()
                prompt = -(-len(rig.upstream.seen[0].body) // 4)   # its prompt, at four bytes a token
                assert level == pytest.approx(600 - charged - prompt, abs=1), (target, body)
    run(scenario)


def test_an_answer_too_large_to_take_is_charged_what_it_could_have_made():
    """An answer over max_answer_bytes is a 502 before the model's count is read: the replica did
    the work (a client can ask for it: logprobs, n, a large max_tokens), and it was charged nothing."""
    from aiohttp import web

    from triton_operator.gateway import keys as k

    async def large(request):
        await request.read()
        return web.json_response({"text_output": "x" * 100_000, "finish_reason": "length", "prompt_tokens": 7,
                                  "completion_tokens": 1000})

    async def scenario():
        for target, body, charged in (("/v1/completions", {"model": "llama", "prompt": "x", "max_tokens": 50, "n": 2},
                                       100),
                                      ("/v2/models/llama/generate", {"text_input": "x", "max_tokens": 40}, 40)):
            async with Rig(max_answer_bytes=65536) as rig:
                rig.gw.auth.grants = k.parse(
                    f"keys: [{{name: t, key: {KEY_A}, namespaces: [ml], tokensPerMinute: 600}}]", "k")
                rig.upstream.answer = large
                reply = await rig.call("POST", target, body=body, headers={"X-Inference-Namespace": "ml"})
                assert (reply.status, reply.error["code"]) == (502, "upstream_answer_too_large"), target
                (level, _), = rig.gw.auth.token_limiter.buckets.values()
                prompt = -(-len(rig.upstream.seen[0].body) // 4)
                assert level == pytest.approx(600 - charged - prompt, abs=1), target
    run(scenario)


def test_an_answer_that_comes_while_the_keys_memory_share_is_full_is_charged():
    """The answer came while the key's own upload (announced, never sent) held the rest of its
    share of the gateway's memory: a 429 after the replica did the work, and it was charged
    nothing, every time. It is charged what the request could have made, as a client that left is."""
    from aiohttp import web

    from triton_operator.gateway import keys as k

    arrived = asyncio.Event()

    async def answer(request):
        await request.read()
        arrived.set()
        await asyncio.sleep(0.3)
        return web.json_response({"text_output": "y" * 100_000, "finish_reason": "length", "prompt_tokens": 7,
                                  "completion_tokens": 2000})

    async def scenario():
        async with Rig(body_budget_bytes=4 << 20, key_share=0.25) as rig:   # the key's share: 1 MiB
            rig.gw.auth.grants = k.parse(
                f"keys: [{{name: t, key: {KEY_A}, namespaces: [ml], tokensPerMinute: 10000}}]", "k")
            rig.upstream.answer = answer
            task = asyncio.create_task(rig.call("POST", "/v1/completions",
                                                body={"model": "llama", "prompt": "x", "max_tokens": 2000}))
            await asyncio.wait_for(arrived.wait(), 5)
            writer = await fill_share(rig, 1 << 20)
            reply = await asyncio.wait_for(task, 5)
            writer.close()
            assert (reply.status, reply.error["code"]) == (429, "too_many_bytes_in_flight")
            (level, _), = rig.gw.auth.token_limiter.buckets.values()
            taken = 2000 + -(-len(rig.upstream.seen[0].body) // 4)    # max_tokens and the prompt
            assert 10000 - taken <= level < 10000 - taken + 200   # less what a second refills
    run(scenario)


def test_a_replicas_token_counts_are_charged_up_to_what_the_request_could_use():
    """A replica that reports more tokens than the request could have used (2**53 completion tokens
    for a max_tokens of 5; an embedding count of 10**30 or of 401 digits) locked the key out for
    ages, or was a 500 (an integer no float holds, in the usage counter). Charged now: at most the
    request's max_tokens, n times, and a prompt of one token a byte of what was sent plus what a
    chat template adds; a count past any model's is no count (an embedding request then pays the
    estimate its reservation took)."""
    from aiohttp import web

    from triton_operator.gateway import keys as k

    def answering(payload: bytes):
        async def answer(request):
            await request.read()
            return web.Response(body=payload, content_type="application/json")
        return answer

    async def scenario():
        async with Rig() as rig:
            rig.gw.auth.grants = k.parse(
                f"keys: [{{name: t, key: {KEY_A}, namespaces: [ml], tokensPerMinute: 6000}}]", "k")
            rig.upstream.answer = answering(json.dumps({"text_output": "x", "finish_reason": "stop",
                                                        "prompt_tokens": 1, "completion_tokens": 2 ** 53}).encode())
            reply = await rig.call("POST", "/v1/chat/completions",
                                   body={"model": "llama", "messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": 5})
            assert reply.status == 200
            (level, _), = rig.gw.auth.token_limiter.buckets.values()
            assert level == pytest.approx(6000 - 6, abs=1)
            rig.upstream.answer = answering(json.dumps({"text_output": "x", "finish_reason": "stop",
                                                        "prompt_tokens": 2 ** 50, "completion_tokens": 1}).encode())
            sent = len(json.dumps({"model": "llama", "prompt": "x", "max_tokens": 5}))
            reply = await rig.call("POST", "/v1/completions", body={"model": "llama", "prompt": "x", "max_tokens": 5})
            assert reply.status == 200
            (after, _), = rig.gw.auth.token_limiter.buckets.values()
            # the prompt bound: the body the replica was sent (re-encoded, about this size) plus 8,192
            assert 8192 < level - after < 8192 + 4 * sent + 200

        async with Rig() as rig:
            rig.gw.auth.grants = k.parse(
                f"keys: [{{name: t, key: {KEY_A}, namespaces: [ml], tokensPerMinute: 1000}}]", "k")
            rig.gw.router.set_service(isvc("embed", model={"source": "hf://a/b", "format": "python", "name": "embed"},
                                           openai={"task": "embeddings"}))
            rig.gw.router.set_slice(slice_for("embed", rig.upstream.port, "ml"))
            for count in (b"1" + b"0" * 30, b"1" + b"0" * 400, b"[1" + b"0" * 400 + b"]"):
                rig.gw.auth.token_limiter.buckets.clear()
                rig.upstream.answer = answering(b'{"embedding":[0.5,0.5],"prompt_tokens":' + count + b"}")
                reply = await rig.call("POST", "/v1/embeddings", body={"model": "embed", "input": "abcdefghi"},
                                       headers={"X-Inference-Namespace": "ml"})
                assert (reply.status, reply.json()["usage"]) == (200, {"prompt_tokens": 0, "total_tokens": 0}), count
                (level, _), = rig.gw.auth.token_limiter.buckets.values()
                assert level == pytest.approx(1000 - 3, abs=1), count    # 9 bytes at 4 a token
    run(scenario)


def test_tokens_per_minute_are_reserved_when_requests_start_and_settled_when_they_end():
    """tokensPerMinute was taken only when requests ended, so every request that started while the
    bucket was above zero went through: 50 at once with max_tokens 32768 on a key of 1,000 a
    minute were all answered, and the key was then locked out for a day. Now a request's
    max_tokens, n times, is taken when it starts (a burst gets one in, the rest a 429), and what
    the model did not use goes back when it ends; a request the replica failed costs nothing."""
    from aiohttp import web

    from triton_operator.gateway import keys as k

    gate = asyncio.Event()

    async def answer(request):
        body = json.loads(await request.read())
        await gate.wait()
        if body["text_input"] == "fail":
            return web.json_response({"error": "engine failed"}, status=500)
        return web.json_response({"text_output": "x", "finish_reason": "stop", "prompt_tokens": 7,
                                  "completion_tokens": 3})

    async def scenario():
        async with Rig() as rig:
            rig.gw.auth.grants = k.parse(
                f"keys: [{{name: t, key: {KEY_A}, namespaces: [ml], tokensPerMinute: 1000}}]", "k")
            rig.upstream.answer = answer
            burst = [asyncio.create_task(rig.call("POST", "/v1/completions",
                                                  body={"model": "llama", "prompt": "x", "max_tokens": 2000}))
                     for _ in range(20)]
            await settle(lambda: len(rig.upstream.seen) == 1 and sum(t.done() for t in burst) == 19)
            gate.set()
            replies = [await asyncio.wait_for(t, 5) for t in burst]
            assert sorted(r.status for r in replies) == [200] + [429] * 19
            assert {r.error["code"] for r in replies if r.status == 429} == {"rate_limit_exceeded"}
            (level, _), = rig.gw.auth.token_limiter.buckets.values()
            assert level == pytest.approx(1000 - 10, abs=1)          # the 1,990 not used went back
            failed = await rig.call("POST", "/v2/models/llama/generate", body={"text_input": "fail", "max_tokens": 500},
                                    headers={"X-Inference-Namespace": "ml"})
            assert failed.status == 502
            (level, _), = rig.gw.auth.token_limiter.buckets.values()
            assert level == pytest.approx(1000 - 10, abs=1)          # reserved, then returned
    run(scenario)


def test_a_client_that_pipelines_and_never_reads_holds_a_few_heads_and_its_place_a_while(monkeypatch):
    """Pipelined requests (each answered at once) from a client that reads none of the answers:
    every head was handed to aiohttp, which queued them all (6,800 parsed requests, 4 MiB, per
    connection), and once the socket buffers were full aiohttp's write waited for good: the
    connection was never idle (requests queued), so neither reaped nor timed out, and 20 such
    clients held a pool of 20 (its health port's 32 too: the kubelet's probes got 503). Now at most
    guard.PIPELINED heads are with aiohttp (reading pauses), a client that has not read for
    guard.REAP_STALLED_SECONDS is reapable once the pool is nearly full, and it is cut when a write
    has waited upstream_idle_timeout_seconds."""
    import socket

    from triton_operator.gateway import guard

    async def stuck(port: int) -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(s, ("127.0.0.1", port))
        piece = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_B}\r\n\r\n".encode() * 2000
        while True:
            try:
                await asyncio.wait_for(loop.sock_sendall(s, piece), 1.0)
            except asyncio.TimeoutError:
                return s                                         # the gateway stopped reading

    monkeypatch.setattr(guard, "REAP_STALLED_SECONDS", 1.0)   # ten by default: not the point here

    async def scenario():
        async with Rig(max_connections=10, max_connections_per_address=10, upstream_idle_timeout_seconds=6,
                       idle_timeout_seconds=60) as rig:
            clients = await asyncio.gather(*(stuck(rig.port) for _ in range(9)))
            guards = list(rig.gw.connections.guards.values())
            assert len(guards) == 9
            for g in guards:
                assert g.requests <= guard.PIPELINED + 1 and len(g.inner._messages) <= guard.PIPELINED
            # the pool is nearly full of them: a client with a key gets in (one is reaped)
            reply = await rig.call("GET", "/v1/models")
            assert reply.status == 200
            # the rest are cut once a write has waited upstream_idle_timeout_seconds, counted from
            # when the gateway's writes paused: before that it answers the backlog of pipelined
            # requests the kernel took for them (its receive buffer grows to megabytes), which is
            # CPU work: 20-26 s on an idle 2-core machine here, and more than 40 s once, in a full
            # test run with a cluster busy beside it
            await settle(lambda: rig.gw.connections.open == 0, seconds=120)
            for s in clients:
                s.close()
    run(scenario)


async def text_events(request, pause: float = 0.0):
    """A text model's replica streaming four events of 1,000 characters ("y"), `pause` apart."""
    from aiohttp import web

    await request.read()
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    for _ in range(4):
        await out.write(b"data: " + json.dumps({"text_output": "y" * 1000}).encode() + b"\n\n")
        await asyncio.sleep(pause)
    return out


def test_a_text_model_which_counts_no_tokens_is_charged_an_estimate():
    """A text model's answers carry no token counts, so its requests' reservations were returned
    and its keys never charged: 30 of 30 requests with 20 KB prompts and 4 KB answers went
    through on a key of 100 tokens a minute. It is now charged what it was sent and sent back at
    four bytes a token, on the OpenAI routes (whole and streamed) and on its KServe v2
    generate routes."""
    from aiohttp import web

    async def whole(request):
        await request.read()
        return web.json_response({"text_output": "y" * 4000})

    streamed = text_events
    chat = {"model": "ml/chat", "max_tokens": 4000, "messages": [{"role": "user", "content": "x" * 20000}]}

    async def scenario():
        for target, answer, body, generated in (
                ("/v1/chat/completions", whole, chat, 4000),
                ("/v1/chat/completions", streamed, {**chat, "stream": True}, 4000),
                ("/v1/completions", streamed, {"model": "ml/chat", "prompt": "x" * 20000, "max_tokens": 4000,
                                               "stream": True}, 4000),
                ("/v2/models/chat/generate", whole, {"text_input": "x" * 20000}, 4000),
                ("/v2/models/chat/generate_stream", streamed, {"text_input": "x" * 20000}, 4000)):
            async with Rig() as rig:
                metered_with_text_model(rig)
                rig.upstream.answer = answer
                first = await rig.call("POST", target, body=body, headers={"X-Inference-Namespace": "ml"})
                assert first.status == 200, target
                (level, _), = rig.gw.auth.token_limiter.buckets.values()
                sent = len(rig.upstream.seen[0].body)
                # the text it sent back, not the events' framing around it
                assert level == pytest.approx(100 - -(-sent // 4) - -(-generated // 4), abs=1), target
                second = await rig.call("POST", target, body=body, headers={"X-Inference-Namespace": "ml"})
                assert (second.status, second.error["code"]) == (429, "rate_limit_exceeded"), target
    run(scenario)


def test_a_text_model_stream_cut_at_the_clients_stop_is_charged_what_the_replica_generated():
    """A streamed answer of a text model cut at a stop sequence the client chose was charged the
    characters sent to the client, none when the stop matched its first character: a key paid its
    prompt alone for a 1,000-character event (and whatever the replica went on generating), where
    the same request answered whole is charged all the text the replica sent. The event that held
    the stop is charged whole."""
    async def streamed(request):
        return await text_events(request, pause=0.05)

    async def scenario():
        async with Rig() as rig:
            metered_with_text_model(rig, 100000, frozen=True)
            rig.upstream.answer = streamed
            body = {"model": "ml/chat", "max_tokens": 4000, "stop": ["y"], "stream": True,
                    "messages": [{"role": "user", "content": "x" * 400}]}
            rep = await rig.call("POST", "/v1/chat/completions", body=body, headers={"X-Inference-Namespace": "ml"})
            assert rep.status == 200
            events = [json.loads(line[6:]) for line in rep.body.split(b"\n") if line.startswith(b"data: {")]
            choices = [e["choices"][0] for e in events]
            assert "".join(c["delta"].get("content") or "" for c in choices) == ""
            assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["stop"]
            (level, _), = rig.gw.auth.token_limiter.buckets.values()
            sent = len(rig.upstream.seen[0].body)
            assert 100000 - level == pytest.approx(-(-sent // 4) + 1000 // 4, abs=1)
    run(scenario)


def replica_writing(*chunks: bytes):
    """A replica's stream of these raw chunks, as they are, 20 ms apart (so that the gateway reads
    them as they were cut)."""
    from aiohttp import web

    async def answer(request):
        await request.read()
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for i, chunk in enumerate(chunks):
            if i:
                await asyncio.sleep(0.02)
            await out.write(chunk)
        return out
    return answer


def test_a_text_models_stream_is_read_whatever_its_framing_and_split_characters():
    """What a text model's replica streams reaches the client whole: events framed by CRLF (the
    event stream format allows CRLF, LF or CR) came out as an empty answer with finish reason
    "stop", and a last event whose blank line never came lost its words, both with no error; a
    character split over two events (its UTF-8 bytes, or the two halves of a surrogate pair) is
    U+FFFD where it was a 502 for the whole stream, or "?"; an unreadable event is a 502 after the
    events before it, which were dropped with it. A streamed /v1/responses request to a text
    model was always refused, for a stream_options the client never sent."""
    chat = {"model": "ml/chat", "stream": True, "messages": [{"role": "user", "content": "x"}]}

    def text_of(body: bytes) -> tuple[str, list]:
        events = [json.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: {")]
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
        return text, [e["error"]["message"] for e in events if "error" in e]

    async def scenario():
        async with Rig() as rig:
            metered_with_text_model(rig)
            rig.gw.auth.grants = k.parse(f"keys: [{{name: t, key: {KEY_A}, namespaces: [ml]}}]", "k")
            for chunks, text, errors in (
                    ((b'data: {"text_output": "Hello"}\r\n\r\ndata: {"text_output": " world"}\r\n\r\n',),
                     "Hello world", []),
                    ((b'data: {"text_output": "Hello"}\r', b'\n\r\ndata: {"text_output": " world"}\r\r'),
                     "Hello world", []),
                    # a CR ending a chunk, and the last event's blank line never sent
                    ((b'data: {"text_output": "Hello"}\r\r', b'data: {"text_output": " world"}'), "Hello world", []),
                    ((b'data: {"text_output": "Hello"}\r\n\r', b'\ndata: {"text_output": " world"}'),
                     "Hello world", []),
                    ((b'data: {"text_output": "Hello"}\n\ndata: {"text_output": " world"}',), "Hello world", []),
                    ((b'data: {"text_output": "ok \xe4\xb8"}\n\n', b'data: {"text_output": "\xad!"}\n\n'),
                     "ok \ufffd\ufffd!", []),
                    ((b'data: {"text_output": "x\\ud83d"}\n\ndata: {"text_output": "\\ude00y"}\n\n',),
                     "x\ufffd\ufffdy", []),
                    ((b'data: {"text_output": "ok"}\n\ndata: <html>\n\n',), "ok",
                     ["the model's stream held an event that is not JSON"]),
                    ((b'data: {"text_output": "ok"}\n\ndata: {"text_out',), "ok",
                     ["the replica's stream ended inside an event"])):
                rig.upstream.answer = replica_writing(*chunks)
                reply = await rig.call("POST", "/v1/chat/completions", body=chat)
                assert reply.status == 200, chunks
                assert text_of(reply.body) == (text, errors), chunks
            rig.upstream.answer = replica_writing(b'data: {"text_output": "Hel"}\n\ndata: {"text_output": "lo"}\n\n')
            reply = await rig.call("POST", "/v1/responses", body={"model": "ml/chat", "input": "x", "stream": True})
            assert reply.status == 200
            kinds = [block.split(b"\n", 1)[0] for block in reply.body.split(b"\n\n") if block]
            assert kinds[-1] == b"event: response.completed"
            done = json.loads(reply.body.rsplit(b"data: ", 1)[1])
            assert done["response"]["output"][0]["content"][0]["text"] == "Hello"
    from triton_operator.gateway import keys as k
    run(scenario)


def test_events_framed_by_cr_are_read_as_they_arrive():
    """A CR ends a line at once: each CR-framed event waited for the next chunk (a second late,
    with a second between events), and a LF after a CR that ended the last chunk ends nothing."""
    from triton_operator.gateway import translate as t

    events = t.EventBuffer(1 << 20)
    assert events.feed(b'data: {"a": 1}\r\r') == [{"a": 1}]
    assert events.feed(b'\ndata: {"a": 2}\r') == []
    assert events.feed(b'\n\r\n') == [{"a": 2}]
    assert events.feed(b'data: {"a": 3}\n') == [] and events.end() == [{"a": 3}] and events.size == 0
    # an empty read between a CR and its LF changes nothing
    events = t.EventBuffer(1 << 20)
    assert events.feed(b'data: {"a":\r') == [] and events.feed(b"") == []
    assert events.feed(b'\ndata: 1}\r\n\r\n') == [{"a": 1}]


def test_an_unreadable_event_after_good_ones_is_refused_at_the_next_read():
    """The events before an unreadable one are answered, and the next read refuses it, whatever
    comes after it (the search for the next blank line began past it: the next chunk's partial
    event waited, and `data: {"x":` then `data: 1}` was read as one event)."""
    from triton_operator.gateway import openai_schema as oai
    from triton_operator.gateway import translate as t

    for after in (b'data: {"x":', b'data: 1}\n\n', b""):
        events = t.EventBuffer(1 << 20)
        assert events.feed(b'data: {"a": 1}\n\ndata: {"x":\n\n') == [{"a": 1}]
        with pytest.raises(oai.OpenAIError) as e:
            events.feed(after) if after else events.end(cut_ok=True)
        assert e.value.message == "the model's stream held an event that is not JSON"


def test_a_character_split_over_two_events_is_whole_in_gathered_answers_and_responses():
    """n answers are gathered from the llm model's stream: a character it split over two events
    (the two halves of a surrogate pair) was joined and then refused, a 502; it is the character.
    A lone half in a Responses stream is U+FFFD (it was "?")."""
    done = {"finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 1}
    gathered = replica_writing(b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in (
        {"text_output": "a\ud83d", "index": 0, "prompt_tokens": 1, "completion_tokens": 1},
        {"text_output": "\ude00", "index": 0, **done}, {"text_output": "b", "index": 1, **done})))
    lone = replica_writing(b'data: {"text_output": "x\\ud83d", "prompt_tokens": 1, "completion_tokens": 1, '
                           b'"finish_reason": "stop"}\n\n')

    async def scenario():
        async with Rig() as rig:
            rig.upstream.answer = gathered
            reply = await rig.call("POST", "/v1/chat/completions", body={
                "model": "ml/llama", "n": 2, "messages": [{"role": "user", "content": "x"}]})
            assert reply.status == 200
            assert [c["message"]["content"] for c in reply.json()["choices"]] == ["a\U0001F600", "b"]
            rig.upstream.answer = lone
            reply = await rig.call("POST", "/v1/responses", body={"model": "ml/llama", "input": "x", "stream": True})
            assert reply.status == 200 and "x\ufffd".encode() in reply.body and b"x?" not in reply.body
            # a pair split over two events: the deltas and the done events tell the same text
            rig.upstream.answer = replica_writing(b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in (
                {"text_output": "a\ud83d", "prompt_tokens": 1, "completion_tokens": 1},
                {"text_output": "\ude00b", **done})))
            reply = await rig.call("POST", "/v1/responses", body={"model": "ml/llama", "input": "x", "stream": True})
            sent = [json.loads(line[6:]) for line in reply.body.split(b"\n") if line.startswith(b"data: ")]
            deltas = "".join(e["delta"] for e in sent if e["type"] == "response.output_text.delta")
            (done_text,) = [e["text"] for e in sent if e["type"] == "response.output_text.done"]
            assert deltas == done_text == "a\ufffd\ufffdb"
    run(scenario)


def test_the_generate_stream_of_a_model_that_counts_nothing_passes_as_sent():
    """/v2's generate_stream reads the events of an llm or text model, for their counts; another
    model's stream passes untouched (a version that read them all cut a large event with an error
    and put error events into streams that were not JSON)."""
    async def scenario():
        async with Rig() as rig:
            sent = b"data: ping\n\n" + b"data: " + b"x" * 200_000 + b"\n\n" + b"data: {\"cut"
            rig.upstream.answer = replica_writing(sent)
            reply = await rig.call("POST", "/v2/models/resnet/generate_stream", body={"inputs": []},
                                   headers={"X-Inference-Namespace": "ml"})
            assert (reply.status, reply.body) == (200, sent)
            # an llm model's stream is read for its counts: an unreadable last event ends it with an
            # error event, as one in the middle does; one cut short passes as it was sent
            for last, error in ((b'data: <html>\n\n', True), (b'data: {"text_out', False)):
                rig.upstream.answer = replica_writing(b'data: {"text_output": "a"}\n\n' + last)
                reply = await rig.call("POST", "/v2/models/llama/generate_stream", body={"text_input": "x"},
                                       headers={"X-Inference-Namespace": "ml"})
                assert reply.status == 200 and (b'"error"' in reply.body) == error, last
    run(scenario)


def test_a_text_model_is_charged_the_bytes_of_its_answer_not_its_characters():
    """A text model's answer is charged at four bytes a token (docs/gateway.md), but it was counted
    in characters: 1,200 CJK characters (3,600 bytes) cost what 1,200 ASCII ones do, emoji a
    quarter of their bytes; whole, streamed and on the generate route alike."""
    from aiohttp import web

    text = "\u4e00" * 1200   # three bytes each

    async def whole(request):
        await request.read()
        return web.json_response({"text_output": text})

    streamed = replica_writing(*(b"data: " + json.dumps({"text_output": text[i:i + 100]}).encode() + b"\n\n"
                                 for i in range(0, 1200, 100)))
    body = {"model": "ml/chat", "max_tokens": 4000, "messages": [{"role": "user", "content": "x"}]}

    async def scenario():
        for target, answer, sent in (("/v1/chat/completions", whole, body),
                                     ("/v1/chat/completions", streamed, {**body, "stream": True}),
                                     ("/v2/models/chat/generate", whole, {"text_input": "x"}),
                                     ("/v2/models/chat/generate_stream", streamed, {"text_input": "x"})):
            async with Rig() as rig:
                metered_with_text_model(rig, 100000, frozen=True)
                rig.upstream.answer = answer
                reply = await rig.call("POST", target, body=sent, headers={"X-Inference-Namespace": "ml"})
                assert reply.status == 200, target
                (level, _), = rig.gw.auth.token_limiter.buckets.values()
                prompt = -(-len(rig.upstream.seen[0].body) // 4)
                assert 100000 - level == pytest.approx(prompt + 3600 // 4, abs=1), target
    run(scenario)


def test_a_body_the_gateway_parses_counts_against_requests_per_minute_by_its_size():
    """Parsing a body of hundreds of kilobytes or thousands of JSON objects takes tens of
    milliseconds of the event loop: one key sending 278 KB Responses bodies of 4,096 input items at
    its 600 requests a minute held every other key's light requests behind them (their median went
    from 2 ms to 250 ms). A parsed body now counts as one request per 64 KiB or per 1,024 objects
    and arrays begun, whichever is more, taken before it is parsed (at most a full bucket's worth,
    so that any body can pass); refused, it counts as one request and its Retry-After is when it
    passes (a first version said when the rest would, and a client that waited it arrived one short
    every time); a small body counts as one, as before."""
    from triton_operator.gateway import auth
    from triton_operator.gateway import keys as k

    clock = [1000.0]

    def rig() -> Rig:
        rig = Rig()
        rig.gw.auth.grants = k.parse(f"keys: [{{name: t, key: {KEY_A}, namespaces: [ml], requestsPerMinute: 60}}]",
                                     "k")   # 60 a minute: one a second, bursts of 6
        rig.gw.auth.clock = lambda: clock[0]
        return rig

    big = {"model": "ml/llama", "max_tokens": 1,
           "messages": [{"role": "user", "content": "x" * (3 * auth.REQUEST_BYTES + 1000)}]}
    many = {"model": "ml/llama", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}] * 4096}
    small = {"model": "ml/llama", "max_tokens": 1, "messages": [{"role": "user", "content": "x" * 60000}]}
    assert [auth.request_units(json.dumps(b).encode()) for b in (big, many, small)] == [4, 5, 1]

    async def send(r: Rig, body: dict) -> tuple[int, str | None, str | None]:
        reply = await r.call("POST", "/v1/chat/completions", body=body)
        if reply.status == 200:
            return 200, None, None
        return reply.status, reply.error["code"], reply.headers.get("retry-after")

    async def scenario():
        async with rig() as r:
            assert await send(r, big) == (200, None, None)                          # 6 - 1 - 3 = 2
            assert await send(r, big) == (429, "rate_limit_exceeded", "3")          # 2 - 1 < 3: 1 + 3 more
            clock[0] += 3
            assert await send(r, big) == (200, None, None)                          # 4 - 1 - 3 = 0
            assert len(r.upstream.seen) == 2   # the refused one never reached the replica
        async with rig() as r:
            assert await send(r, many) == (200, None, None)                         # 6 - 1 - 4 = 1
            assert await send(r, many) == (429, "rate_limit_exceeded", "5")         # 1 - 1 < 4: 1 + 4 more
            assert (await r.call("POST", "/v1/chat/completions", body=small)).status == 429   # at once: by take
        async with rig() as r:
            assert [await send(r, small) for _ in range(7)] == [(200, None, None)] * 6 + [
                (429, "rate_limit_exceeded", "1")]
    run(scenario)


def test_a_client_reading_a_large_answer_slowly_is_not_cut_when_the_pool_fills(monkeypatch):
    """Writing stays paused the whole time a large answer drains to a client that reads it slowly;
    counted as a client that does not read, such a download was reaped mid-answer (4.87 of 6 MB,
    under its Content-Length) as soon as the pool neared full. A client counts as not reading
    only while what waits for it does not shrink."""
    import socket

    from aiohttp import web

    from triton_operator.gateway import guard

    monkeypatch.setattr(guard, "REAP_STALLED_SECONDS", 0.5)
    size = 7_000_000   # under max_answer_bytes (8 MiB)

    async def answer(request):
        body = await request.read()
        if b"slowly" in body:
            await asyncio.sleep(4)
            return web.json_response({"text_output": "ok"})
        return web.json_response({"text_output": "y" * size, "finish_reason": "length", "prompt_tokens": 1,
                                  "completion_tokens": 5})

    async def slow_download(port: int) -> int:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        s.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(s, ("127.0.0.1", port))
        data = json.dumps({"model": "ml/llama", "prompt": "x", "max_tokens": 5}).encode()
        await loop.sock_sendall(s, (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                                    f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                                    f"Connection: close\r\n\r\n").encode() + data)
        got = 0
        try:
            while chunk := await asyncio.wait_for(loop.sock_recv(s, 16384), 10):
                got += len(chunk)
                await asyncio.sleep(0.01)                     # about 1.6 MB/s, reading all along
        finally:
            s.close()
        return got

    async def scenario():
        async with Rig(max_connections=10, upstream_idle_timeout_seconds=30, idle_timeout_seconds=30) as rig:
            rig.upstream.answer = answer
            download = asyncio.create_task(slow_download(rig.port))
            await asyncio.sleep(0.5)
            busy = [asyncio.create_task(rig.call("POST", "/v1/completions",
                                                 body={"model": "ml/llama", "prompt": "slowly", "max_tokens": 5}))
                    for _ in range(8)]
            await settle(lambda: rig.gw.connections.open == 9)
            assert rig.gw.connections.stalled                # the download's writes are paused
            for _ in range(3):                               # the pool is full: each new one tries to reap
                await asyncio.sleep(0.6)
                await raw_request(rig.port, "GET", "/v1/models", {"Authorization": f"Bearer {KEY_A}"})
            got = await asyncio.wait_for(download, 20)
            assert got > size                                # the whole answer, its head included
            await asyncio.wait_for(asyncio.gather(*busy), 10)
    run(scenario)


@pytest.mark.parametrize("target, body", [
    ("/v1/completions", {"model": "llama", "prompt": "x", "max_tokens": 2000, "stream": True}),
    ("/v1/responses", {"model": "ml/llama", "input": "x", "max_output_tokens": 2000, "stream": True}),
    ("/v2/models/llama/generate_stream", {"text_input": "x", "max_tokens": 2000}),
])
def test_a_stream_ended_by_its_keys_full_memory_share_is_charged(target, body):
    """A stream whose key's memory share filled (its own upload, announced and never sent) ended
    with an error event before the model's counts came, and cost nothing: the stream caught the
    error itself, so the charge for an abandoned request never ran. It keeps what it took."""
    from aiohttp import web

    from triton_operator.gateway import keys as k

    go = asyncio.Event()

    async def answer(request):
        await request.read()
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b'data: {"text_output": "a"}\n\n')
        await go.wait()
        await out.write(b"data: " + json.dumps({"text_output": "y" * 200_000}).encode() + b"\n\n")
        await out.write(b'data: {"text_output": "", "finish_reason": "length", "prompt_tokens": 7, '
                        b'"completion_tokens": 2000}\n\n')
        return out

    async def scenario():
        async with Rig(body_budget_bytes=4 << 20, key_share=0.25) as rig:   # the key's share: 1 MiB
            rig.gw.auth.grants = k.parse(
                f"keys: [{{name: t, key: {KEY_A}, namespaces: [ml], tokensPerMinute: 10000}}]", "k")
            rig.upstream.answer = answer
            task = asyncio.create_task(rig.call("POST", target, body=body, headers={"X-Inference-Namespace": "ml"}))
            await settle(lambda: len(rig.upstream.seen) == 1)
            await asyncio.sleep(0.1)
            writer = await fill_share(rig, 1 << 20)
            await settle(lambda: sum(rig.gw.bodies.by_key.values()) > (1 << 20) - 100)
            go.set()
            reply = await asyncio.wait_for(task, 5)
            writer.close()
            assert reply.status == 200 and b"too_many_bytes_in_flight" in reply.body
            (level, _), = rig.gw.auth.token_limiter.buckets.values()
            taken = 2000 + -(-len(rig.upstream.seen[0].body) // 4)    # max_tokens and the prompt
            assert 10000 - taken <= level < 10000 - taken + 200   # less what a second refills
    run(scenario)


@pytest.mark.parametrize("model, target, body", [
    ("llama", "/v1/completions", {"model": "ml/llama", "prompt": "x" * 20000, "max_tokens": 1}),
    ("chat", "/v1/chat/completions", {"model": "ml/chat", "max_tokens": 1,
                                      "messages": [{"role": "user", "content": "x" * 20000}]}),
    ("chat", "/v2/models/chat/generate", {"text_input": "x" * 20000}),
])
def test_a_burst_of_long_prompts_gets_in_only_as_far_as_the_budget_covers_them(model, target, body):
    """Only the tokens a request may generate were taken when it started, its prompt after the
    fact: 30 prompts of 20 KB sent at once with max_tokens 1 on a key of 100 tokens a minute were
    all answered (an LLM's and a text model's), and the key was left 150,000 tokens short. The
    prompt, at four bytes a token, is taken when a request starts too."""
    from aiohttp import web

    gate = asyncio.Event()

    async def answer(request):
        await request.read()
        await gate.wait()
        return web.json_response({"text_output": "y", "finish_reason": "length", "prompt_tokens": 5000,
                                  "completion_tokens": 1})

    async def scenario():
        async with Rig() as rig:
            metered_with_text_model(rig)
            rig.upstream.answer = answer
            burst = [asyncio.create_task(rig.call("POST", target, body=body, headers={"X-Inference-Namespace": "ml"}))
                     for _ in range(30)]
            await settle(lambda: len(rig.upstream.seen) == 1 and sum(t.done() for t in burst) == 29)
            gate.set()
            replies = [await asyncio.wait_for(t, 5) for t in burst]
            assert sorted(r.status for r in replies) == [200] + [429] * 29
    run(scenario)
