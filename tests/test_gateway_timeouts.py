"""Timeouts, driven in process over real loopback sockets: a client that sends slowly, or a
replica that answers slowly, holds a connection and a request only as long as the settings say.
The upstream is a recording stand-in for Triton (tests/gateway_http.py says why)."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from triton_operator.gateway import guard, holding
from triton_operator.gateway import telemetry as m

from .gateway_http import (KEY_A, LogLines, Rig, closed_within, connect, isvc, never_reading, read_reply, run, settle,
                           slice_for)


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


@pytest.mark.parametrize("target", ["/x", "example.com:443"])
def test_a_connect_request_is_refused_and_nothing_after_it_is_read(target):
    """The guard passed a CONNECT's Content-Length bytes on as its body, but aiohttp reads what
    follows a CONNECT head as tunnel data and parsed it as the next request once the 404 was
    written: a head of 480 KB (the limit is 32 KiB), or one sent four bytes at a time past the
    header timeout, was answered 200. The gateway opens no tunnels: 501, and the connection closes."""
    async def scenario():
        async with Rig(header_timeout_seconds=0.5, idle_timeout_seconds=30) as rig:
            smuggled = (b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                        + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 8000) for i in range(60)) + b"\r\n")
            reader, writer = await connect(rig.port)
            writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(smuggled)}\r\n\r\n".encode()
                         + smuggled)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 5)   # the guard closes after LINGER_SECONDS
            writer.close()
            assert answer == guard.NO_TUNNELS
            assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "not_implemented"
            assert answer.startswith(b"HTTP/1.1 501 ") and answer.count(b"HTTP/1.1") == 1
            await settle(lambda: rig.gw.connections.open == 0)
    run(scenario)


@pytest.mark.parametrize("coding", ["gzip, chunked", "deflate,chunked", "gzip, identity, Chunked"])
def test_a_transfer_coding_other_than_chunked_is_refused(coding):
    """aiohttp framed `Transfer-Encoding: gzip, chunked` as chunked and dropped the gzip: the
    replica got the compressed bytes with nothing saying so (and /v2's
    Inference-Header-Content-Length was checked against them). A coding the gateway does not
    implement, before chunked, is a 501 (RFC 9112), before anything reaches a replica (chunked not
    last, or an unknown coding alone, stays a 400: tests/test_gateway_smuggling.py)."""
    async def scenario():
        async with Rig() as rig:
            reader, writer = await connect(rig.port)
            writer.write(f"POST /v2/models/resnet/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                         f"Transfer-Encoding: {coding}\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n".encode())
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert answer == guard.OTHER_CODING
            assert rig.upstream.seen == []
    run(scenario)


@pytest.mark.parametrize("line, status", [
    ("Transfer-Encoding: , chunked", 200),                        # an empty element counts for nothing
    ("Transfer-Encoding: chunked, chunked", 400),                 # chunked twice
    ("Transfer-Encoding : gzip, chunked", 400),                   # a space before the colon
    ("Transfer-Encoding: gzip, chunked\r\nContent-Length: 5", 400),  # both framings
])
def test_framings_aiohttp_judges_are_left_to_it(line, status):
    async def scenario():
        async with Rig() as rig:
            reader, writer = await connect(rig.port)
            writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                         f"Content-Type: application/json\r\n{line}\r\n\r\n".encode()
                         + b'35\r\n{"model": "ml/llama", "prompt": "x", "max_tokens": 1}\r\n0\r\n\r\n')
            await writer.drain()
            reply = await asyncio.wait_for(read_reply(reader), 5)
            writer.close()
            assert reply.status == status
    run(scenario)


def test_a_chunked_request_pipelined_behind_another_is_answered_too():
    """A chunked head makes the connection end after its request; the guard closed it when the
    first request pipelined before it finished, and the chunked one was never answered."""
    async def scenario():
        async with Rig() as rig:
            reader, writer = await connect(rig.port)
            writer.write(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n\r\n"
                         f"POST /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                         f"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n".encode())
            await writer.drain()
            first = await asyncio.wait_for(read_reply(reader), 5)
            second = await asyncio.wait_for(read_reply(reader), 5)
            assert (first.status, first.json()["object"]) == (200, "list")
            assert (second.status, second.error["code"]) == (405, "method_not_allowed")
            assert await closed_within(reader, 5) == b""   # nothing after the chunked request is read
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


# -- holding only what will be answered -------------------------------------------------------------------

def status(desired: int, ready: int) -> dict:
    return {"replicas": desired, "readyReplicas": ready}


def test_a_service_with_ready_replicas_the_gateway_cannot_use_is_answered_503_within_seconds(monkeypatch):
    """A service Ready 1/1 whose endpoints the gateway cannot use (`make dev`'s simulated llama3-8b)
    used to hold every request for the whole 300 s hold timeout, with no log line."""
    monkeypatch.setattr(holding, "UNUSABLE_GRACE_SECONDS", 0.3)

    async def scenario():
        with LogLines() as logs:
            async with Rig(hold_timeout_seconds=30) as rig:
                rig.gw.router.set_service({**isvc("llama"), "status": status(1, 1)})
                no_port = slice_for("llama", rig.upstream.port)
                no_port["ports"] = [{"name": "grpc", "port": rig.upstream.port}]
                rig.gw.router.set_slice(no_port)
                before = m.REJECTED.labels("no_usable_replica")._value.get()
                started = asyncio.get_running_loop().time()
                reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})
                assert asyncio.get_running_loop().time() - started < 3
                assert (reply.status, reply.error["code"], reply.error["message"]) == (
                    503, "no_usable_replica", "model llama reports 1 ready replica(s) but the gateway can reach "
                                              "none: its EndpointSlices have no port named 'http'")
                assert reply.headers["retry-after"] == "10"
                assert m.REJECTED.labels("no_usable_replica")._value.get() == before + 1
                rig.gw.router.set_slice({**no_port, "metadata": no_port["metadata"]}, None)
                rig.gw.router.replace_slices([])
                reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})
                assert reply.error["message"].endswith("none: no EndpointSlice lists its pods")
                rig.gw.router.set_service({**isvc("llama"), "status": status(0, 0)})
                reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})
                assert reply.error["message"] == ("model llama has no replicas (it is scaled to 0 and does not "
                                                  "scale from zero)")
        said = [line for line in logs.lines if "ml/llama: model llama reports 1 ready" in line]
        assert len(said) == 1 and "WARNING" in said[0]
    run(scenario)


def test_a_request_is_held_while_replicas_start_and_answered_when_one_is_ready(monkeypatch):
    monkeypatch.setattr(holding, "UNUSABLE_GRACE_SECONDS", 0.3)

    async def scenario():
        async with Rig(hold_timeout_seconds=30) as rig:
            rig.gw.router.replace_slices([])
            rig.gw.router.set_service({**isvc("llama"), "status": status(2, 0)})   # starting
            call = asyncio.create_task(rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"}))
            await asyncio.sleep(1.0)   # well past the grace: it is held, not refused
            assert not call.done() and rig.gw.holds.count == 1
            rig.gw.watches._service_event("MODIFIED", {**isvc("llama"), "status": status(2, 1)})
            rig.gw.watches._slice_event("ADDED", slice_for("llama", rig.upstream.port))
            reply = await asyncio.wait_for(call, 5)
            assert reply.status == 200
    run(scenario)


def test_a_held_request_is_answered_503_once_the_service_says_its_replicas_are_up_but_unusable(monkeypatch):
    monkeypatch.setattr(holding, "UNUSABLE_GRACE_SECONDS", 0.3)

    async def scenario():
        async with Rig(hold_timeout_seconds=30) as rig:
            rig.gw.router.replace_slices([])
            rig.gw.router.set_service({**isvc("llama"), "status": status(1, 0)})
            call = asyncio.create_task(rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"}))
            await settle(lambda: rig.gw.holds.count == 1)
            rig.gw.watches._service_event("MODIFIED", {**isvc("llama"), "status": status(1, 1)})
            reply = await asyncio.wait_for(call, 5)
            assert (reply.status, reply.error["code"]) == (503, "no_usable_replica")
    run(scenario)


@pytest.mark.parametrize("policy,prompts", [("leastInFlight", ["x"] * 6),
                                             # routed by the prompt: some of 20 rank the stuck replica first
                                             ("kvEvents", [f"prompt {i}" for i in range(20)])])
def test_a_replica_that_does_not_accept_connections_is_ejected_and_the_next_request_goes_elsewhere(policy, prompts):
    """Outlier ejection: a connect timeout takes a replica out for a while; the request that met it
    is tried on another replica, and later ones do not try it again. With kvEvents the retried
    request carries a cursor written for the replica it is sent to."""
    async def scenario():
        stuck = socket.socket()
        stuck.bind(("127.0.0.2", 0))   # another address of this machine
        stuck.listen(0)
        fillers = []
        for _ in range(4):   # fill its accept queue: the kernel drops further SYNs, a connect hangs
            f = socket.socket()
            f.setblocking(False)
            f.connect_ex(stuck.getsockname())
            fillers.append(f)
        try:
            async with Rig(upstream_connect_timeout_seconds=0.3) as rig:
                good = slice_for("llama", rig.upstream.port)
                bad = slice_for("llama", stuck.getsockname()[1], address="127.0.0.2")
                bad["metadata"] = {**bad["metadata"], "name": "llama-y"}
                rig.gw.router.set_service(isvc("llama", routing={"policy": policy}))
                rig.gw.router.replace_slices([good, bad])
                before = m.UPSTREAM_CONNECT_FAILURES.labels("ml", "llama", "timeout")._value.get()
                replies = [await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": p})
                           for p in prompts]
                assert [r.status for r in replies] == [200] * len(prompts)
                assert m.UPSTREAM_CONNECT_FAILURES.labels("ml", "llama", "timeout")._value.get() == before + 1
                assert stuck.getsockname() in rig.gw.router.ejected   # tried once, then left out
                assert len(rig.upstream.seen) == len(prompts)
                sent = [json.loads(seen.body) for seen in rig.upstream.seen]
                assert all(("kv_events_after" in body) == (policy == "kvEvents") for body in sent)
                assert all(body.get("kv_events_after", "") == "" for body in sent)   # the answers told no events
        finally:
            stuck.close()
            for f in fillers:
                f.close()
    run(scenario)


# -- a client that stops reading ---------------------------------------------------------------------

PIECE = "x" * 16384


def endless(ended: asyncio.Event):
    """A replica that streams far more than any socket buffers (~64 MiB), until the gateway lets go."""
    async def answer(request):
        from aiohttp import web

        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        try:
            for _ in range(4000):
                await out.write(b"data: " + json.dumps({"text_output": PIECE, "finish_reason": ""}).encode() + b"\n\n")
            await out.write(b'data: {"text_output": "", "finish_reason": "stop"}\n\n')
        except ConnectionError:
            pass                     # the gateway closed its connection: the answer was cut
        finally:
            ended.set()
        return out
    return answer


def whole(ended: asyncio.Event):
    """A replica whose whole answer (7 MiB) is more than the sockets between gateway and client buffer."""
    async def answer(request):
        from aiohttp import web

        ended.set()
        return web.json_response({"text_output": "x" * (7 << 20), "finish_reason": "stop", "prompt_tokens": 1,
                                  "completion_tokens": 1})
    return answer


def held(rig: Rig) -> tuple[int, int, int]:
    return sum(rig.gw.in_flight.by_key.values()), sum(rig.gw.router.in_flight.values()), rig.gw.bodies.used


async def released_within(rig: Rig, seconds: float) -> bool:
    for _ in range(int(seconds / 0.05)):
        if held(rig) == (0, 0, 0):
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.parametrize("target, body, headers, settings, replica", [
    # the OpenAI stream: a write that waits upstreamIdleTimeoutSeconds is cut
    ("/v1/chat/completions", {"model": "ml/llama", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
     "", {"upstream_idle_timeout_seconds": 1.0, "upstream_timeout_seconds": 600.0}, endless),
    # the v2 pass-through's stream: the whole exchange is cut upstreamTimeoutSeconds after it began
    ("/v2/models/llama/generate_stream", {"text_input": "hi", "stream": True}, "X-Inference-Namespace: ml\r\n",
     {"upstream_idle_timeout_seconds": 600.0, "upstream_timeout_seconds": 2.0}, endless),
    # a whole answer, written at once
    ("/v1/completions", {"model": "ml/llama", "prompt": "hi"}, "",
     {"upstream_idle_timeout_seconds": 1.0, "upstream_timeout_seconds": 600.0}, whole),
], ids=["openai-stream-idle", "v2-stream-total", "openai-whole-idle"])
def test_a_client_that_stops_reading_is_cut_and_its_request_released(target, body, headers, settings, replica):
    """Writes to the client had no deadline: a streaming client that read nothing held its place
    among the key's requests in flight, the replica's count, its held bytes and the connection to
    the replica (still generating) until it went away, past every timeout."""
    async def scenario():
        ended = asyncio.Event()
        async with Rig(**settings) as rig:
            rig.upstream.answer = replica(ended)
            cut = m.CONNECTIONS_REFUSED.labels("client_stalled")._value.get()
            sock = await never_reading(rig.port, target, body, headers)
            try:
                for _ in range(100):
                    if held(rig)[0]:
                        break
                    await asyncio.sleep(0.05)
                assert held(rig)[:2] == (1, 1), "the request is under way"
                assert await released_within(rig, 15.0), held(rig)
                assert rig.gw.in_flight.by_key == {} and rig.gw.router.in_flight == {} and rig.gw.bodies.used == 0
                assert m.CONNECTIONS_REFUSED.labels("client_stalled")._value.get() == cut + 1
                await asyncio.wait_for(ended.wait(), 10)      # the replica's connection was let go
                assert len(rig.upstream.seen) == 1
                rig.upstream.answer = None            # the gateway serves on
                assert (await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})).status == 200
            finally:
                sock.close()
    run(scenario)
