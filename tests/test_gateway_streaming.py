"""Streaming, driven in process over real loopback sockets: answers that arrive in pieces, from
replicas that stall, break or send what is not an event, and clients that leave mid-answer. A
stalled replica ends the answer after the idle timeout (not the 900 s total); a client that leaves
cancels the call to the replica. The upstream is a recording stand-in for Triton
(tests/gateway_http.py says why)."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from triton_operator.gateway import telemetry as m

from .gateway_http import KEY_A, Rig, connect, run, settle

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
            assert reply.status == 200 and got[-1]["error"]["message"] == "the model's stream held an event that is not JSON"
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
