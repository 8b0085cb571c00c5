"""Exhaustion, driven in process over real loopback sockets: what one connection, one request or
one key can make the gateway hold. Each is bounded by construction (the head by the connection
guard, bodies, parsed requests and answers by the byte budget and caps), and counted as what is
actually held, not as bytes on the wire. `make bench-gateway` measures the RSS these bounds give;
here the bounds themselves are checked. The upstream is a recording stand-in for Triton
(tests/gateway_http.py says why)."""

from __future__ import annotations

import asyncio
import sys
import contextlib
import gc
import signal
from typing import Iterator

import pytest
from aiohttp import web

from triton_operator.gateway import guard
from triton_operator.gateway import openai_schema as oai
from triton_operator.gateway import upstream

from .gateway_http import KEY_A, Rig, closed_within, connect, never_reading, run, settle

CHAT = {"model": "ml/llama", "messages": [{"role": "user", "content": "hi"}]}

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
            assert (reply.status, reply.error) == (431, guard.TOO_LARGE[431]["error"])
    run(scenario)


def test_a_line_over_the_parsers_limit_is_a_431_or_for_the_target_a_414():
    async def scenario():
        async with Rig() as rig:
            reply = await rig.call("GET", "/v1/models", headers={"X-" + "n" * 9000: "1"})   # a header line
            assert (reply.status, reply.error) == (431, guard.TOO_LARGE[431]["error"])
            reply = await rig.call("GET", "/v1/models?" + "a" * 9000)                      # the request line
            assert (reply.status, reply.error) == (414, guard.TOO_LARGE[414]["error"])
            assert reply.headers["connection"] == "close"
            reply = await rig.call("GET", "/v1/models", headers={"X-Ok": "b" * 1000})     # under the limits
            assert reply.status == 200
    run(scenario)


# -- what one request holds ----------------------------------------------------------------------------

MIB = 1 << 20


def metadata_flood(size: int = MIB - 64) -> bytes:
    """The shape that cost 25 MiB a request: `"metadata":[{},{},...]` filling a 1 MiB body."""
    head = b'{"model": "ml/llama", "stream": true, "messages": [{"role": "user", "content": "hi"}], "metadata": ['
    count = (size - len(head) - 2) // 3
    return head + b",".join([b"{}"] * count) + b"]}"


def test_a_body_of_many_json_containers_is_refused_before_it_is_parsed():
    async def scenario():
        async with Rig() as rig:
            body = metadata_flood()
            reply = await rig.call("POST", "/v1/chat/completions", body=body)
            assert (reply.status, reply.error["code"], reply.error["message"]) == (
                400, "request_too_complex", "the request body has more than 20000 JSON objects and arrays")
            assert rig.upstream.seen == [] and rig.gw.bodies.used == 0
    run(scenario)


@pytest.mark.parametrize("label, value, param", [
    ("metadata", {"a": {"b": {"c": "d"}}}, "metadata.a"),
    ("metadata", [{}] * 3, "metadata"),
    ("metadata", {f"k{i}": "v" for i in range(17)}, "metadata"),
    ("metadata", {"k": "v" * 513}, "metadata.k"),
    ("user", ["a"] * 100, "user"),
    ("store", {"x": 1}, "store"),
])
def test_labels_carry_strings_only_as_openai_types_them(label, value, param):
    async def scenario():
        async with Rig() as rig:
            reply = await rig.call("POST", "/v1/chat/completions", body={**CHAT, label: value})
            assert reply.status == 400 and reply.error["param"] == param
            assert rig.upstream.seen == []
    run(scenario)


def test_nesting_deeper_than_any_request_is_a_400_not_a_500():
    async def scenario():
        async with Rig() as rig:
            for depth in (65, 2_000, 100_000):
                body = b'{"model": "ml/llama", "prompt": "x", "response_format": ' + b"[" * depth + b"]" * depth + b"}"
                reply = await rig.call("POST", "/v1/completions", body=body)
                assert (reply.status, reply.error["code"]) == (400, "request_too_complex"), depth
            body = b'{"model": "ml/llama", "prompt": "x", "stop": ' + b"[" * 60 + b"]" * 60 + b"}"
            assert (await rig.call("POST", "/v1/completions", body=body)).status == 400   # shallow: the field's own error
    run(scenario)


def test_brackets_inside_strings_are_not_structure():
    async def scenario():
        async with Rig() as rig:
            code = "def f(x): return [x[i] for i in {a: [b]}]  # \\\"[[[{{{\n" * 20_000   # about 1 MiB of code
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": code[:MIB // 2]})
            assert reply.status == 200
    run(scenario)


# An unterminated string of escaped quotes behind more brackets than the plain count lets through:
# the string-cutting scan once restarted at every quote (a 32 KiB body held the event loop ~3 s).
UNENDING_STRING = b"[" * 65 + b'"' + b'\\"' * ((MIB - 66) // 2)
DEEPER_THAN_64 = "the request body nests JSON deeper than 64 levels"


@contextlib.contextmanager
def at_most(seconds: float) -> Iterator[None]:
    """Interrupts what runs in the main thread after `seconds` (a regex scan included: the re
    module checks for signals as it matches), so a scan that would run for an hour fails the test."""
    def expired(*_: object) -> None:
        raise TimeoutError(f"still running after {seconds:g}s")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_an_unterminated_string_of_escapes_is_scanned_once():
    assert len(UNENDING_STRING) == MIB
    with at_most(10.0), pytest.raises(oai.OpenAIError) as refused:
        oai.check_structure(UNENDING_STRING)
    assert (refused.value.status, refused.value.code, refused.value.message) == (
        400, "request_too_complex", DEEPER_THAN_64)
    with at_most(10.0), pytest.raises(oai.OpenAIError) as refused:
        oai.parse_json(b'{"stop": [' + b"[]," * 100 + b'"' + b'\\"' * 1000)   # shallow: cut to its end, then not JSON
    assert (refused.value.status, refused.value.message) == (400, "the request body is not valid JSON")


def test_a_body_of_one_unending_string_is_refused_and_health_answered_meanwhile():
    async def scenario():
        async with Rig() as rig:
            hostile, health = await asyncio.gather(
                rig.call("POST", "/v1/chat/completions", body=UNENDING_STRING),
                rig.call("GET", "/healthz", key=None))
            assert (hostile.status, hostile.error["code"], hostile.error["message"]) == (
                400, "request_too_complex", DEEPER_THAN_64)
            assert health.status == 200
            assert rig.upstream.seen == [] and rig.gw.bodies.used == 0
    with at_most(10.0):
        run(scenario)


def stream_held_by(gate: asyncio.Event, n: int = 1):
    """A replica that streams one event, then holds its stream open until `gate` is set, and ends
    its `n` answers."""
    async def answer(request):
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b'data: {"text_output": "a"}\n\n')
        await gate.wait()
        for i in range(n):
            await out.write(b'data: {"text_output": "b", "finish_reason": "stop", "prompt_tokens": 1, '
                            b'"completion_tokens": 2, "index": %d}\n\n' % i)
        return out
    return answer


def test_a_streaming_request_holds_only_what_it_sent_while_it_is_answered():
    """The parsed request used to stay alive for the whole answer (25 MiB for a 1 MiB body of
    small objects); now only the encoded request is held, and counted."""
    async def scenario():
        gate = asyncio.Event()
        async with Rig() as rig:
            rig.upstream.answer = stream_held_by(gate)
            marker = "probe-" + "q" * 14
            parts = [{"type": "text", "text": marker}] * 15_000
            body = {**CHAT, "stream": True, "user": marker, "messages": [{"role": "user", "content": parts}]}
            call = asyncio.create_task(rig.call("POST", "/v1/chat/completions", body=body))
            await settle(lambda: len(rig.upstream.seen) == 1)
            await asyncio.sleep(0.05)
            gc.collect()
            alive = [o for o in gc.get_objects()
                     if (isinstance(o, oai.ChatRequest) and o.user == marker)
                     or (isinstance(o, oai.TextPart) and o.text == marker)]
            assert alive == []
            sent = len(rig.upstream.seen[0].body)
            assert rig.gw.bodies.used == sent     # the request sent, nothing else
            gate.set()
            reply = await asyncio.wait_for(call, 10)
            assert reply.status == 200 and rig.gw.bodies.used == 0
    run(scenario)


def test_n_answers_gathered_for_one_reply_count_the_request_they_were_sent_for():
    """n > 1 without streaming reads the model's stream whole and gathers it; each chunk's count
    replaced what the request held, so its prompt (still held, for the replica) was no longer
    counted: one key held 128 such requests of 1 MiB, 135 MB, with 5 KB counted."""
    async def scenario():
        gate = asyncio.Event()
        async with Rig() as rig:
            rig.upstream.answer = stream_held_by(gate, n=2)
            body = {"model": "ml/llama", "prompt": "x" * 500_000, "n": 2, "max_tokens": 5}
            call = asyncio.create_task(rig.call("POST", "/v1/completions", body=body))
            await settle(lambda: len(rig.upstream.seen) == 1)
            event = len(b'data: {"text_output": "a"}\n\n')
            await settle(lambda: rig.gw.bodies.used == len(rig.upstream.seen[0].body) + event)
            gate.set()
            reply = await asyncio.wait_for(call, 10)
            assert reply.status == 200 and reply.json()["choices"][0]["text"] == "ab" and rig.gw.bodies.used == 0
    run(scenario)


def test_a_responses_request_holds_only_what_it_sent_and_what_its_answer_repeats():
    """/v1/responses kept its parsed request (every input item) for the whole exchange, to repeat
    its settings in the answer: 8.4 MB alive for a 605 kB body, of which the key was counted 129 kB
    (100 such requests grew the gateway by 895 MB). Now only the encoded request and what the
    answer repeats (instructions, tools, metadata) are held, both counted."""
    from triton_operator.gateway import responses as r
    from triton_operator.gateway import translate as t

    async def scenario():
        gate = asyncio.Event()
        async with Rig() as rig:
            rig.upstream.answer = stream_held_by(gate)
            marker = "probe-" + "r" * 14
            items = [{"role": "user", "content": [{"type": "input_text", "text": marker}] * 5}] * 2800
            body = {"model": "ml/llama", "stream": True, "user": marker, "instructions": "be brief", "input": items}
            call = asyncio.create_task(rig.call("POST", "/v1/responses", body=body))
            await settle(lambda: len(rig.upstream.seen) == 1)
            await asyncio.sleep(0.05)
            gc.collect()
            alive = [o for o in gc.get_objects()
                     if (isinstance(o, r.ResponsesRequest) and o.user == marker)
                     or (isinstance(o, (r.InputText, oai.TextPart)) and o.text == marker)]
            assert alive == []
            sent = len(rig.upstream.seen[0].body)
            echoed = len(t.encode(r.echo(r.parse(t.encode(body)))))
            # the request sent, what its answer repeats, and the text so far ("a", as the string it is
            # kept in), which its end repeats
            await settle(lambda: rig.gw.bodies.used == sent + echoed + sys.getsizeof("a") + 8)
            gate.set()
            reply = await asyncio.wait_for(call, 10)
            assert reply.status == 200 and rig.gw.bodies.used == 0
            assert b'"instructions":"be brief"' in reply.body and marker.encode() in reply.body   # repeated
    run(scenario)


def test_a_whole_answer_larger_than_the_cap_is_a_502_and_counted_while_read():
    async def scenario():
        async def huge(request):
            return web.json_response({"text_output": "y" * (2 * MIB)})

        async with Rig(max_answer_bytes=MIB) as rig:
            rig.upstream.answer = huge
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})
            assert (reply.status, reply.error["code"]) == (502, "upstream_answer_too_large")
            reply = await rig.call("POST", "/v2/models/llama/generate", body={"text_input": "x"},
                                   headers={"X-Inference-Namespace": "ml"})
            assert (reply.status, reply.error["code"]) == (502, "upstream_answer_too_large")
            assert rig.gw.bodies.used == 0
    run(scenario)


def test_a_streamed_event_larger_than_the_cap_ends_the_stream_with_an_error():
    async def scenario():
        async def huge_event(request):
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            await out.write(b'data: {"text_output": "a"}\n\n')
            await out.write(b'data: {"text_output": "' + b"z" * (2 * MIB))
            return out

        async with Rig(max_answer_bytes=MIB) as rig:
            rig.upstream.answer = huge_event
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x", "stream": True})
            events = [line for line in reply.body.split(b"\n\n") if line]
            assert reply.status == 200 and b'"upstream_answer_too_large"' in events[-1]
            assert rig.gw.bodies.used == 0
    run(scenario)


def test_answers_count_in_the_keys_share():
    """A key's answers being read take from its share like its bodies do."""
    async def scenario():
        async def big(request):
            return web.json_response({"text_output": "y" * (MIB // 2)})

        async with Rig(body_budget_bytes=4 * MIB, key_share=0.25, max_answer_bytes=2 * MIB) as rig:
            rig.upstream.answer = big
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})
            assert reply.status == 200
            rig.gw.bodies.reserve(rig.gw.auth.grants and next(d for d, g in rig.gw.auth.grants.items() if g.name == "a"),
                                  MIB - 1024)   # the key's share nearly used elsewhere
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})
            assert (reply.status, reply.error["code"]) == (429, "too_many_bytes_in_flight")
    run(scenario)


def _flooding(sent: list[int]):
    """A replica that streams 4 KiB events for as long as it is read, counting what it sent."""
    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        await request.read()
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        event = b'data: {"text_output": "' + b"z" * 4000 + b'"}\n\n'
        with contextlib.suppress(ConnectionError):
            while True:
                await out.write(event)
                sent[0] += len(event)
        return out
    return answer


@pytest.mark.parametrize("target, body, headers", [
    ("/v1/chat/completions", b'{"model": "ml/llama", "stream": true, "messages": [{"role": "user", "content": "hi"}]}', ""),
    ("/v2/models/llama/generate_stream", b'{"text_input": "hi"}', "X-Inference-Namespace: ml\r\n"),
])
def test_a_stream_whose_client_stops_reading_holds_a_counted_chunk(target, body, headers):
    """The replica's answer was read in whatever it had sent meanwhile (half a megabyte at once),
    and only the event being assembled was counted while the write to the client waited (68 to
    291 bytes here): 250 such streams of one key took the gateway from 88 to 525 MiB. A read is
    now at most READ_CHUNK, counted until it is sent, with what the client's connection has not
    sent yet; once the write has waited the idle timeout, the client is cut and nothing is held."""
    async def scenario():
        sent = [0]
        async with Rig(upstream_idle_timeout_seconds=2.0) as rig:
            rig.upstream.answer = _flooding(sent)
            sock = await never_reading(rig.port, target, body, headers)
            try:
                # the replica is held back once the client's and the gateway's buffers are full
                await settle(lambda: sent[0] > 256 * 1024)
                before, waited = -1, 0
                while sent[0] != before and waited < 25:   # at most 5 s (the idle cut comes after 2)
                    before, waited = sent[0], waited + 1
                    await asyncio.sleep(0.2)
                used = rig.gw.bodies.used
                # the chunk, the events made of it and what the client's connection has not sent
                # (aiohttp writes up to 64 KiB before it waits on the transport, whose high-water
                # mark is 64 KiB)
                assert 8 * 1024 < used <= len(body) + 2 * upstream.READ_CHUNK + 128 * 1024, used
                await settle(lambda: rig.gw.bodies.used == 0 and not rig.gw.in_flight.by_key, 6)
            finally:
                sock.close()
    run(scenario)
