"""Streaming, driven in process over real loopback sockets: answers that arrive in pieces, from
replicas that stall, break or send what is not an event, and clients that leave mid-answer. A
stalled replica ends the answer after the idle timeout (not the 900 s total); a client that leaves
cancels the call to the replica. The upstream is a recording stand-in for Triton
(tests/gateway_http.py says why)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from aiohttp import web

from triton_operator.gateway import telemetry as m

from .gateway_http import KEY_A, LogLines, Rig, connect, isvc, run, settle, slice_for

NS = {"X-Inference-Namespace": "ml"}


def events(body: bytes) -> list:
    out = []
    for block in body.split(b"\n\n"):
        if block.startswith(b"data: "):
            data = block[len(b"data: "):]
            out.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return out


def stalls_after(first: bytes, stream: bool = True):
    forever = asyncio.Event()

    async def answer(request):
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream" if stream else "application/json"})
        await out.prepare(request)
        await out.write(first)
        await forever.wait()
        return out
    return answer


def test_a_replica_that_stalls_mid_stream_ends_the_answer_at_the_idle_timeout():
    """It used to hold the client for the whole 900 s total timeout."""
    async def scenario():
        async with Rig(upstream_idle_timeout_seconds=0.3) as rig:
            rig.upstream.answer = stalls_after(b'data: {"text_output": "he"}\n\n')
            before = m.UPSTREAM_STALLED.labels("ml", "llama")._value.get()
            started = asyncio.get_running_loop().time()
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x", "stream": True})
            assert asyncio.get_running_loop().time() - started < 3
            got = events(reply.body)
            assert got[0]["choices"][0]["text"] == "he"
            assert got[-1]["error"] == {"message": "model llama: the replica sent nothing for 0.3s mid-answer",
                                        "type": "upstream_error", "param": None, "code": "upstream_stalled"}
            reply = await rig.call("POST", "/v2/models/llama/generate_stream", body={"text_input": "x"}, headers=NS)
            got = events(reply.body)
            assert got[0] == {"text_output": "he"}
            assert got[-1] == {"error": {"message": "the replica's stream broke", "code": "upstream_stalled"}}
            assert m.UPSTREAM_STALLED.labels("ml", "llama")._value.get() == before + 2
            # stalled inside an event: the error comes after a blank line, not glued to the open line
            rig.upstream.answer = stalls_after(b'data: {"text_output": "he"}\n\ndata: {"text_out')
            reply = await rig.call("POST", "/v2/models/llama/generate_stream", body={"text_input": "x"}, headers=NS)
            assert reply.body.endswith(b'data: {"text_out\n\ndata: {"error":{"message":"the replica\'s stream broke",'
                                       b'"code":"upstream_stalled"}}\n\n')
            assert rig.gw.bodies.used == 0 and rig.gw.in_flight.by_key == {}
    run(scenario)


def test_a_replica_that_stalls_mid_answer_is_a_502():
    async def scenario():
        async with Rig(upstream_idle_timeout_seconds=0.3) as rig:
            rig.upstream.answer = stalls_after(b'{"text_output": "he', stream=False)
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})
            assert (reply.status, reply.error["code"]) == (502, "upstream_stalled")
            reply = await rig.call("POST", "/v2/models/llama/generate", body={"text_input": "x"}, headers=NS)
            assert (reply.status, reply.error["code"]) == (502, "upstream_stalled")
    run(scenario)


def test_a_stream_event_that_is_not_json_ends_the_answer_with_an_error():
    async def scenario():
        async def garbage(request):
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            await out.write(b'data: {"text_output": "ok"}\n\ndata: <html>oops</html>\n\n')
            return out

        async with Rig() as rig:
            rig.upstream.answer = garbage
            reply = await rig.call("POST", "/v1/chat/completions", body={
                "model": "ml/llama", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
            got = events(reply.body)
            assert reply.status == 200 and got[-1]["error"] == {
                "message": "the model's stream held an event that is not JSON", "type": "upstream_error",
                "param": None, "code": "upstream_failed"}
    run(scenario)


def test_a_client_that_leaves_mid_stream_cancels_the_call_to_the_replica():
    async def scenario():
        gone = asyncio.Event()

        async def endless(request):
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            try:
                while True:
                    await out.write(b'data: {"text_output": "x"}\n\n')
                    await asyncio.sleep(0.02)
            except (ConnectionError, asyncio.CancelledError):
                gone.set()
                raise
            return out

        async with Rig() as rig:
            rig.upstream.answer = endless
            reader, writer = await connect(rig.port)
            body = json.dumps({"model": "ml/llama", "prompt": "x", "stream": True}).encode()
            writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
            got = b""
            while b"data: " not in got:
                got += await asyncio.wait_for(reader.read(4096), 5)
            writer.close()
            await asyncio.wait_for(gone.wait(), 5)
            await settle(lambda: rig.gw.in_flight.by_key == {} and rig.gw.bodies.used == 0)
    run(scenario)


@pytest.mark.parametrize("target,body", [
    ("/v1/completions", {"model": "ml/slo", "prompt": "x", "stream": True}),
    ("/v1/chat/completions", {"model": "ml/slo", "messages": [{"role": "user", "content": "x"}], "stream": True}),
    ("/v1/completions", {"model": "ml/slo", "prompt": "x"}),
])
def test_a_client_that_hangs_up_is_counted_as_499_and_not_against_the_latency_target(target, body):
    """Each hang-up counted as a 500 and as a miss of the service's latency target (the status a
    request got defaulted to 500, and a cancel never changed it); some, once the write to the gone
    client failed, as a replica failing mid-stream: a 502 and a WARNING. A tenant that hung up
    lowered the attainment the autoscaler keeps replicas warm for. They are now 499s, outside the
    attainment, with no line above DEBUG."""
    async def endless(request):
        if not json.loads(await request.read()).get("stream"):   # a whole answer, after the client left
            await asyncio.sleep(0.4)
            return web.json_response({"text_output": "x", "prompt_tokens": 2, "completion_tokens": 1})
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        try:
            while True:
                await out.write(b'data: {"text_output": "x", "prompt_tokens": 2}\n\n')
                await asyncio.sleep(0.01)
        except ConnectionError:   # the gateway hung up on the replica, as it should
            return out

    def counts():
        return ({code: m.REQUESTS.labels("ml", "slo", route, code)._value.get() for code in ("200", "499", "500", "502")},
                {met: m.SLO_REQUESTS.labels("ml", "slo", met)._value.get() for met in ("true", "false")})

    route = "chat" if "chat" in target else "completions"

    async def scenario():
        with LogLines() as logs:
            async with Rig() as rig:
                rig.gw.router.set_service(isvc("slo", autoscaling={"maxReplicas": 2, "slo": {"latencyMs": 60000}}))
                rig.gw.router.set_slice(slice_for("slo", rig.upstream.port))
                rig.upstream.answer = endless
                before = counts()
                for _ in range(10):
                    reader, writer = await connect(rig.port)
                    data = json.dumps(body).encode()
                    writer.write(f"POST {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                                 f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                                 + data)
                    await writer.drain()
                    if body.get("stream"):
                        got = b""
                        while got.count(b"data: ") < 3:
                            got += await asyncio.wait_for(reader.read(4096), 5)
                    else:
                        await settle(lambda: rig.gw.in_flight.by_key != {})
                    writer.transport.abort()
                    await settle(lambda: rig.gw.in_flight.by_key == {} and rig.gw.bodies.used == 0)
                after = counts()
        requests = {code: after[0][code] - before[0][code] for code in after[0]}
        assert requests == {"200": 0, "499": 10, "500": 0, "502": 0}
        assert after[1] == before[1]
        assert [r.getMessage() for r in logs.records if r.levelno >= logging.WARNING] == []
    run(scenario)


def test_a_responses_stream_counts_the_text_it_repeats_at_its_end():
    """A /v1/responses stream ends by repeating its whole text (output_text.done, content_part.done,
    output_item.done, response.completed), so it keeps the text as it comes. That was counted
    nowhere (a replica's 100 MB answer took the gateway to 1.4 GB with 64 KB counted) and grown by
    copying (150 MB took 96 s). The text kept now counts against the key's share of the gateway's
    memory: past it the answer ends with an error event, and the gateway lets go of the text."""
    piece = "y" * (64 << 10)
    event = b"data: " + json.dumps({"text_output": piece, "prompt_tokens": 1, "completion_tokens": 1}).encode() + b"\n\n"
    most = []

    async def answer(request):
        await request.read()
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        try:
            for _ in range(48):                                   # 3 MiB of text
                await out.write(event)
                most.append(sum(rig.gw.bodies.by_key.values()))
            await out.write_eof()
        except ConnectionError:
            pass
        return out

    async def scenario():
        nonlocal rig
        async with Rig(body_budget_bytes=8 << 20, key_share=0.25) as rig:   # the key's share: 2 MiB
            rig.upstream.answer = answer
            reply = await rig.call("POST", "/v1/responses", body={"model": "ml/llama", "input": "hi", "stream": True})
            assert reply.status == 200
            sent = [json.loads(block.split(b"\ndata: ", 1)[1]) for block in reply.body.split(b"\n\n")
                    if b"\ndata: " in block]
            deltas = [e for e in sent if e["type"] == "response.output_text.delta"]
            assert 16 < len(deltas) < 32                         # 1 to 2 MiB of it went out
            assert [e["type"] for e in sent[-2:]] == ["error", "response.failed"]
            assert sent[-2]["code"] == "too_many_bytes_in_flight"
            assert max(most) <= 2 << 20
            await settle(lambda: sum(rig.gw.bodies.by_key.values()) == 0)
    rig = None
    run(scenario)


def test_an_llm_answer_that_ends_without_its_finish_reason_is_a_failure_not_a_stop():
    """The llm model's last event of an answer always carries its finish reason and counts (the
    runtime's serving contract). A stream that ended without it was reported complete: finish
    reason "stop" and [DONE], `response.completed`, or (n = 2, not streamed) a 200 with fewer
    choices or none. Each is now the replica's failure, and an answer for an index not asked for
    is dropped rather than charged."""
    def ev(d):
        return b"data: " + json.dumps(d).encode() + b"\n\n"

    def streaming(chunks):
        async def answer(request):
            await request.read()
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            for c in chunks:
                await out.write(c)
            await out.write_eof()
            return out
        return answer

    chat = {"model": "ml/llama", "messages": [{"role": "user", "content": "hi"}]}
    cut = [ev({"text_output": "The answer is"}), b'data: {"text_output": " 4']
    failed = {"message": "the replica's stream ended before answer 0 finished", "type": "upstream_error",
              "param": None, "code": "upstream_failed"}
    inside = {**failed, "message": "the replica's stream ended inside an event"}

    async def scenario():
        async with Rig() as rig:
            rig.upstream.answer = streaming(cut)
            reply = await rig.call("POST", "/v1/chat/completions", body={**chat, "stream": True})
            sent = events(reply.body)
            assert sent[-1] == {"error": inside} and "[DONE]" not in sent
            assert all(c["choices"][0]["finish_reason"] is None for c in sent[:-1])
            reply = await rig.call("POST", "/v1/responses", body={"model": "ml/llama", "input": "hi", "stream": True})
            kinds = [block.split(b"\n", 1)[0] for block in reply.body.split(b"\n\n") if block]
            assert kinds[-2:] == [b"event: error", b"event: response.failed"]
            assert b"event: response.completed" not in kinds
            for chunks, why in ((cut, inside), (cut[:1], failed), ([], failed)):
                rig.upstream.answer = streaming(chunks)
                reply = await rig.call("POST", "/v1/chat/completions", body={**chat, "n": 2})
                assert (reply.status, reply.error) == (502, why)
            done = {"finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 1}
            rig.upstream.answer = streaming([ev({"text_output": "a", "index": 0, **done}),
                                             ev({"text_output": "b", "index": 1, **done}),
                                             ev({"text_output": "c", "index": 5, **done})])
            reply = await rig.call("POST", "/v1/chat/completions", body={**chat, "n": 2})
            assert reply.status == 200
            assert [c["message"]["content"] for c in reply.json()["choices"]] == ["a", "b"]
            assert reply.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    run(scenario)
