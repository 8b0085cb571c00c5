"""Untrusted input from both sides of the gateway, driven in process over loopback sockets
(tests/gateway_http.py): request fields of the wrong JSON type are refused, not coerced; NaN and
Infinity, which JSON does not have, are refused; a replica's answer the gateway cannot read is a
502, never a 500; and an error after an answer began cuts the connection rather than writing a
second answer into the first. The replica is a recording stand-in for Triton (no GPU here); the
real Triton is in e2e/test_gateway.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from multidict import CIMultiDict

from .gateway_http import KEY_A, Rig, isvc, raw_request, run, slice_for

CHAT = {"model": "ml/llama", "messages": [{"role": "user", "content": "hi"}]}


def refused(message: str, param: str | None) -> tuple[int, dict]:
    return 400, {"message": message, "type": "invalid_request_error", "param": param, "code": None}


def unreadable(message: str) -> tuple[int, dict]:
    return 502, {"message": message, "type": "upstream_error", "param": None, "code": "upstream_failed"}


def test_fields_of_the_wrong_json_type_are_refused_not_coerced():
    async def scenario():
        async with Rig() as rig:
            cases = [
                ({"max_tokens": "7"}, refused("max_tokens: Input should be a valid integer", "max_tokens")),
                ({"max_tokens": True}, refused("max_tokens: Input should be a valid integer", "max_tokens")),
                ({"n": "2"}, refused("n: Input should be a valid integer", "n")),
                ({"seed": 1.0}, refused("seed: Input should be a valid integer", "seed")),
                ({"temperature": True}, refused("temperature: Input should be a valid number", "temperature")),
                ({"stream": "yes"}, refused("stream: Input should be a valid boolean", "stream")),
                ({"logprobs": "on"}, refused("logprobs: Input should be a valid boolean", "logprobs")),
            ]
            for extra, expected in cases:
                reply = await rig.call("POST", "/v1/chat/completions", body={**CHAT, **extra})
                assert (reply.status, reply.error) == expected, extra
            assert rig.upstream.seen == []   # none reached a replica
            # An integer is still a number.
            assert (await rig.call("POST", "/v1/chat/completions", body={**CHAT, "temperature": 1})).status == 200
            # null is the default where OpenAI's API takes it so (its SDKs send it): it was a 400
            for route, body in (("/v1/chat/completions", {**CHAT, "n": None, "stream": None}),
                                ("/v1/completions", {"model": "ml/llama", "prompt": "x", "n": None, "stream": None}),
                                ("/v1/responses", {"model": "ml/llama", "input": "hi", "stream": None})):
                reply = await rig.call("POST", route, body=body)
                assert reply.status == 200 and reply.headers["content-type"].startswith("application/json"), route
            for tools in (5, True, {"a": 1}):
                reply = await rig.call("POST", "/v1/responses", body={"model": "ml/llama", "input": "hi", "tools": tools})
                assert (reply.status, reply.error) == refused("tools: Input should be a valid list", "tools")
            reply = await rig.call("POST", "/v1/responses", body={"model": "ml/llama", "input": "hi",
                                                                  "text": {"format": {"type": "json_schema"}}})
            assert (reply.status, reply.error) == refused(
                "text.format: a json_schema format needs its schema, a JSON schema object", "text.format")
    run(scenario)


def test_responses_errors_name_the_fields_the_client_sent():
    async def scenario():
        async with Rig() as rig:
            cases = [
                ({"max_output_tokens": 40000}, (400, {"message": "max_output_tokens: at most 32768 for this API key",
                                                      "type": "invalid_request_error", "param": "max_output_tokens",
                                                      "code": "max_tokens_too_large"})),
                ({"input": []}, refused("input: List should have at least 1 item after validation, not 0", "input")),
            ]
            for extra, expected in cases:
                reply = await rig.call("POST", "/v1/responses", body={"model": "ml/llama", "input": "hi", **extra})
                assert (reply.status, reply.error) == expected, extra
            # chat's own field keeps its name there
            reply = await rig.call("POST", "/v1/chat/completions", body={**CHAT, "max_tokens": 40000})
            assert reply.error["param"] == "max_tokens"
    run(scenario)


def test_nan_and_infinity_are_refused():
    """Also a number past a double's range, which Python reads as infinity: it was sent on to the
    model and echoed back in a Response as `Infinity`, which no strict JSON parser reads; and an
    integer past it in a generate request's settings, which was passed on to a replica that reads
    doubles."""
    async def scenario():
        async with Rig() as rig:
            expected = refused("the request body is not valid JSON: NaN, Infinity and numbers past a double's "
                               "range are not JSON numbers", None)
            for route, raw in [
                ("/v1/chat/completions", b'{"model":"ml/llama","messages":[{"role":"user","content":"hi"}],'
                                         b'"temperature":NaN}'),
                ("/v1/responses", b'{"model":"ml/llama","input":"hi","tools":[{"type":"function","name":"f",'
                                  b'"parameters":{"a":Infinity}}]}'),
                ("/v1/completions", b'{"model":"ml/llama","prompt":"x","top_p":-Infinity}'),
                ("/v1/responses", b'{"model":"ml/llama","input":"hi","tools":[{"type":"function","name":"f",'
                                  b'"parameters":{"type":"object","properties":{"x":{"maximum":1e400}}}}]}'),
                ("/v1/chat/completions", b'{"model":"ml/llama","messages":[{"role":"user","content":"hi"}],'
                                         b'"temperature":-1.5e309}'),
                ("/v2/models/llama/generate", b'{"text_input":"x","parameters":{"max_tokens":5,"a":1e999}}'),
            ]:
                reply = await rig.call("POST", route, body=raw, headers={"X-Inference-Namespace": "ml"})
                assert (reply.status, reply.error) == expected, route
            # an integer past a double's range in a generate request's settings too (4,000 digits were passed on)
            for route, raw, name in (
                    ("/v2/models/llama/generate", b'{"text_input":"x","temperature":' + b"9" * 4000 + b"}", "temperature"),
                    ("/v2/models/llama/generate_stream", b'{"text_input":"x","parameters":{"seed":-' + b"1" * 400
                     + b"}}", "parameters.seed")):
                reply = await rig.call("POST", route, body=raw, headers={"X-Inference-Namespace": "ml"})
                assert (reply.status, reply.error) == refused(f"{name}: a number past a double's range", name), route
            assert rig.upstream.seen == []
            # within range, large and small numbers are read as they are
            reply = await rig.call("POST", "/v1/chat/completions",
                                   body=b'{"model":"ml/llama","messages":[{"role":"user","content":"hi"}],'
                                        b'"temperature":1e-400,"top_p":1.7976931348623157e308}')
            assert reply.status == 400 and reply.error["param"] == "top_p"
    run(scenario)


def test_a_body_that_is_not_utf8_is_refused_before_it_is_parsed():
    """RFC 8259 JSON is UTF-8, but Python's json also reads UTF-16 and UTF-32. The size and nesting
    check reads the body's bytes as UTF-8: in UTF-16 a character's byte (U+2200's 0x22, a quote)
    hid the brackets after it, so a tool schema nested 900 deep passed the check and reached the
    model (and on a streamed Response, a RecursionError in the middle of the answer)."""
    async def scenario():
        async with Rig() as rig:
            # a quote byte in U+2200's UTF-16 hides the brackets after it from a scan of the bytes
            text = ('{"model": "ml/llama", "input": "\u2200", "stream": true, "text": {"format": {"type": "json_schema", '
                    '"name": "s", "schema": {"x": ' + "[" * 900 + "]" * 900 + '}}}}')
            for encoding in ("utf-16-le", "utf-16", "utf-32"):
                reply = await rig.call("POST", "/v1/responses", body=text.encode(encoding))
                assert (reply.status, reply.error) == refused("the request body is not valid JSON: it must be UTF-8",
                                                              None), encoding
            reply = await rig.call("POST", "/v1/responses", body=text.encode())
            assert (reply.status, reply.error["code"]) == (400, "request_too_complex")
            chat = json.dumps({"model": "ml/llama", "messages": [{"role": "user", "content": "\u00e9t\u00e9"}]},
                              ensure_ascii=False)
            reply = await rig.call("POST", "/v1/chat/completions", body=chat.encode("latin-1"))
            assert (reply.status, reply.error) == refused("the request body is not valid JSON: it must be UTF-8", None)
            assert rig.upstream.seen == []
            # UTF-8, with or without a byte order mark, is read
            for raw in (chat.encode(), b"\xef\xbb\xbf" + chat.encode()):
                reply = await rig.call("POST", "/v1/chat/completions", body=raw)
                assert reply.status == 200
            assert len(rig.upstream.seen) == 2
    run(scenario)


def _probe(body: bytes) -> bool:
    """A kvEvents probe: the cursor alone (tests/test_gateway_kv_events.py)."""
    return set(json.loads(body)) == {"kv_events_after"}


def _answering(payload: bytes, status: int = 200):
    """A replica that answers every generate with `payload` (and a kvEvents probe with nothing)."""
    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        if _probe(await request.read()):
            return web.json_response({"kv_events": ""})
        return web.Response(body=payload, status=status, content_type="application/json")
    return answer


def _streaming(events: list):
    """A replica that streams `events` to every generate_stream."""
    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        await request.read()
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for event in events:
            await out.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        return out
    return answer


def test_a_replica_answer_that_cannot_be_read_is_a_502():
    async def scenario():
        async with Rig() as rig:
            rig.gw.router.set_service(isvc("emb", fmt="python", openai={"task": "embeddings"}))
            rig.gw.router.set_slice(slice_for("emb", rig.upstream.port))
            logprob = {"text_output": "x", "logprobs": json.dumps([{"token": "a", "logprob": "zz"}])}
            top = {"text_output": "x", "logprobs": json.dumps([{"token": "a", "logprob": -1.0, "top": [1]}])}
            not_an_object = unreadable("the model's answer is not a JSON object")
            not_numbers = unreadable("the model's answer holds log probabilities that are not numbers")
            cases = [
                (b"[]", "/v1/chat/completions", CHAT, not_an_object),
                (b"null", "/v1/chat/completions", CHAT, not_an_object),
                (b'"s"', "/v1/completions", {"model": "ml/llama", "prompt": "x"}, not_an_object),
                (json.dumps(logprob).encode(), "/v1/chat/completions", {**CHAT, "logprobs": True}, not_numbers),
                (json.dumps(top).encode(), "/v1/chat/completions", {**CHAT, "logprobs": True}, not_numbers),
                (json.dumps(logprob).encode(), "/v1/completions", {"model": "ml/llama", "prompt": "x", "logprobs": 1},
                 not_numbers),
                (b"[]", "/v1/embeddings", {"model": "ml/emb", "input": "x"},
                 unreadable("the embedding model's answer is not a JSON object")),
                (json.dumps({"embedding": [1e39]}).encode(), "/v1/embeddings",
                 {"model": "ml/emb", "input": "x", "encoding_format": "base64"},
                 unreadable("the embedding model's answer holds a value past float32's range, which base64 "
                            "embeddings carry")),
            ]
            for payload, route, body, expected in cases:
                rig.upstream.answer = _answering(payload)
                reply = await rig.call("POST", route, body=body)
                assert (reply.status, reply.error) == expected, payload
            # A count no model reports is no count: answered, and the key is charged nothing for it.
            rig.upstream.answer = _answering(b'{"text_output":"x","prompt_tokens":1,"completion_tokens":1'
                                             + b"0" * 400 + b"}")
            reply = await rig.call("POST", "/v1/chat/completions", body=CHAT)
            assert reply.status == 200 and reply.json()["choices"][0]["message"]["content"] == "x"
            assert "usage" not in reply.json() or reply.json()["usage"]["completion_tokens"] == 0
            # Minus infinity (a token sampling ruled out; Python's json writes it) is given as OpenAI
            # gives it, -9999.0, in JSON a client can read.
            entries = '[{"token": "x", "logprob": -0.5, "top": [["x", -0.5], ["y", -Infinity]]}]'
            rig.upstream.answer = _answering(json.dumps({"text_output": "x", "logprobs": entries}).encode())
            reply = await rig.call("POST", "/v1/chat/completions", body={**CHAT, "logprobs": True, "top_logprobs": 2})
            assert reply.status == 200 and b"Infinity" not in reply.body
            content = reply.json()["choices"][0]["logprobs"]["content"]
            assert [(t["token"], t["logprob"]) for t in content[0]["top_logprobs"]] == [("x", -0.5), ("y", -9999.0)]
    run(scenario)


def test_numbers_no_float_holds_and_nesting_past_the_parser_are_unreadable_not_500s():
    """JSON bounds neither a number's digits nor its nesting: an integer of 400 digits as a log
    probability or an embedding value overflowed float() and math.isfinite, and tool calls nested
    200,000 deep overflowed the parser's recursion; each was a 500 (a stream cut with no error
    event, a v2 answer cut after its data). Each is now what any answer the gateway cannot read is."""
    async def scenario():
        async with Rig() as rig:
            rig.gw.router.set_service(isvc("emb", fmt="python", openai={"task": "embeddings"}))
            rig.gw.router.set_slice(slice_for("emb", rig.upstream.port))
            huge = "-1" + "0" * 400
            logprob = ('{"text_output": "x", "logprobs": "[{\\"token\\": \\"a\\", \\"logprob\\": %s, '
                       '\\"top\\": []}]"}' % huge).encode()
            deep = json.dumps({"text_output": "", "tool_calls": "[" * 200_000 + "]" * 200_000}).encode()
            tools = {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}
            cases = [
                (logprob, "/v1/chat/completions", {**CHAT, "logprobs": True},
                 unreadable("the model's answer holds log probabilities that are not numbers")),
                (deep, "/v1/chat/completions", tools,
                 unreadable("the model's tool_calls output is not a JSON array of objects")),
                (b'{"embedding": [%s, 1.0]}' % huge.encode(), "/v1/embeddings", {"model": "ml/emb", "input": "x"},
                 unreadable("the embedding model's answer holds an embedding value that is not a finite number")),
            ]
            for payload, route, body, expected in cases:
                rig.upstream.answer = _answering(payload)
                reply = await rig.call("POST", route, body=body)
                assert (reply.status, reply.error) == expected, payload[:80]
            rig.upstream.answer = _answering(logprob)   # the v2 pass-through reads the counts too
            reply = await rig.call("POST", "/v2/models/llama/generate", body={"text_input": "x"},
                                   headers={"X-Inference-Namespace": "ml"})
            assert (reply.status, reply.error["code"]) == (502, "upstream_failed")
            event = json.loads(logprob)
            rig.upstream.answer = _streaming([event])
            reply = await rig.call("POST", "/v1/chat/completions", body={**CHAT, "logprobs": True, "stream": True})
            assert reply.status == 200 and b'"upstream_failed"' in reply.body, reply.body[-300:]
    run(scenario)


def test_what_a_replica_writes_reaches_clients_only_as_text_of_the_right_shape():
    """Values a replica sent of another type than text were written as their Python repr: a dict's
    keys and all, in an answer's content, a tool call's arguments (not JSON), a log probability's
    token, or an error message (an internal address reached the client); a finish_reason object
    broke OpenAI's schema; a lone surrogate in a log probability's token was a 500 (a stream cut
    with no error event); an answer index out of range was mixed into the first answer. Each is now
    a 502 (an error event in a stream) naming what could not be read, or, for an error, the fixed text."""
    async def scenario():
        async with Rig() as rig:
            chat, logprobs = CHAT, {**CHAT, "logprobs": True, "top_logprobs": 2}
            cases = [
                ({"text_output": {"secret": "x"}}, chat, "holds a text_output that is not text"),
                ({"text_output": [{"a": 1}, "2"]}, chat, "holds a text_output that is not text"),
                ({"text_output": "x", "finish_reason": {"x": 1}}, chat, "holds a finish_reason that is not text"),
                ({"text_output": "", "tool_calls": json.dumps([{"name": {"n": 1}, "arguments": "{}"}])}, chat,
                 "holds a tool call whose name or arguments are not text"),
                ({"text_output": "", "tool_calls": json.dumps([{"name": "f", "arguments": {"a": 1}}])}, chat,
                 "holds a tool call whose name or arguments are not text"),
                ({"text_output": "x", "logprobs": json.dumps([{"token": {"x": 1}, "logprob": -1.0}])}, logprobs,
                 "holds a log probability's token that is not text"),
                ({"text_output": "x", "logprobs": json.dumps([{"token": "x", "logprob": -1.0, "top": [[["t"], -1]]}])},
                 logprobs, "holds a log probability's token that is not text"),
                ({"text_output": "x", "logprobs": '[{"token": "\\ud800", "logprob": -1.0}]'}, logprobs,
                 "holds text that is not valid Unicode"),
                ({"text_output": "x", "index": 99}, chat, "holds an answer index that is not one of the answers asked for"),
                ({"text_output": "x", "index": -1}, chat, "holds an answer index that is not one of the answers asked for"),
            ]
            for answer, body, why in cases:
                rig.upstream.answer = _answering(json.dumps(answer).encode())
                reply = await rig.call("POST", "/v1/chat/completions", body=body)
                assert (reply.status, reply.error) == unreadable("the model's answer " + why), answer
                assert b"{'" not in reply.body
            # the same in a stream: an error event, no repr
            rig.upstream.answer = _streaming([{"text_output": "a"}, {"text_output": {"secret": "x"}}])
            reply = await rig.call("POST", "/v1/chat/completions", body={**CHAT, "stream": True})
            events = [json.loads(line[6:]) for line in reply.body.decode().split("\n") if line.startswith("data: {")]
            assert reply.status == 200 and events[-1]["error"]["message"] == (
                "the model's answer holds a text_output that is not text") and b"secret" not in reply.body
            # a model's error as an object: the fixed text, none of its fields
            rig.upstream.answer = _answering(json.dumps(
                {"error": {"m": "[llm] bad", "where": "10.9.9.9"}}).encode(), status=400)
            reply = await rig.call("POST", "/v1/chat/completions", body=CHAT)
            assert reply.status == 502 and b"10.9.9.9" not in reply.body
            assert reply.error["message"] == "the model answered with an error"
    run(scenario)


async def _exchange(port: int, head: str, body: bytes) -> bytes:
    """Everything the gateway sends for one request, until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode("latin-1") + body)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def test_an_error_after_the_answer_began_cuts_the_connection_instead_of_a_second_answer():
    async def stalls_after_100_bytes(request: web.BaseRequest) -> web.StreamResponse:
        await request.read()
        out = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await out.prepare(request)
        await out.write(b"x" * 100)
        await asyncio.sleep(3)   # past the gateway's upstream idle timeout
        return out

    async def bad_second_event(request: web.BaseRequest) -> web.StreamResponse:
        if _probe(await request.read()):
            return web.json_response({"kv_events": ""})
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b'data: {"text_output":"ok"}\n\n')
        await out.write(b"data: " + json.dumps({"text_output": "x", "logprobs": json.dumps(
            [{"token": "a", "logprob": "zz"}])}).encode() + b"\n\n")
        await out.write_eof()
        return out

    async def scenario():
        async with Rig(upstream_idle_timeout_seconds=1.0) as rig:
            rig.upstream.answer = stalls_after_100_bytes
            raw = await _exchange(rig.port, f"POST /v2/models/resnet/infer HTTP/1.1\r\nHost: g\r\n"
                                            f"Authorization: Bearer {KEY_A}\r\nContent-Length: 2\r\n\r\n", b"{}")
            assert raw.startswith(b"HTTP/1.1 200 OK\r\n") and raw.count(b"HTTP/1.1 ") == 1
            assert raw.endswith(b"x" * 100 + b"\r\n")   # the chunk sent, no last chunk: an answer cut short

            rig.upstream.answer = bad_second_event
            body = json.dumps({**CHAT, "stream": True, "logprobs": True}).encode()
            raw = await _exchange(rig.port, f"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nConnection: close\r\n"
                                            f"Authorization: Bearer {KEY_A}\r\nContent-Type: application/json\r\n"
                                            f"Content-Length: {len(body)}\r\n\r\n", body)
            assert raw.startswith(b"HTTP/1.1 200 OK\r\n") and raw.count(b"HTTP/1.1 ") == 1
            events = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
            assert events[-1] == {"error": {"message": "the model's answer holds log probabilities that are not "
                                                       "numbers", "type": "upstream_error", "param": None,
                                            "code": "upstream_failed"}}
            assert events[1]["choices"][0]["delta"] == {"content": "ok"}
    run(scenario)


def test_two_authorization_headers_are_refused():
    """The header may appear once. The gateway read the first of two, so which key a request was
    served under depended on the order in which the hops before it had added theirs."""
    async def scenario():
        async with Rig() as rig:
            for keys in ([KEY_A, "nope"], ["nope", KEY_A], [KEY_A, KEY_A]):
                headers = CIMultiDict(("Authorization", f"Bearer {key}") for key in keys)
                reply = await raw_request(rig.port, "GET", "/v1/models", headers)
                assert (reply.status, reply.error) == (400, {"message": "send one Authorization header",
                                                             "type": "invalid_request_error", "param": None,
                                                             "code": "bad_header"}), keys
            reply = await raw_request(rig.port, "GET", "/v1/models", CIMultiDict(Authorization=f"Bearer {KEY_A}"))
            assert reply.status == 200
    run(scenario)


@pytest.mark.parametrize("pad, rendered", [(1000, "MARK:hi"), (2 << 20, None)])
def test_a_replicas_model_config_is_read_within_its_cap(pad, rendered):
    """The text model's chat template is read from a replica's model config, which was read whole:
    a config of 200 MB took the gateway 400 MB. One past CONFIG_MAX_BYTES is not read on (the
    chat is rendered with the default template, and the config asked for again next time)."""
    async def scenario():
        config = json.dumps({"parameters": {"chat_template": {"string_value": "MARK:{{ messages[0].content }}"}},
                             "pad": "x" * pad}).encode()

        async def answer(request: web.BaseRequest) -> web.StreamResponse:
            if request.path.endswith("/config"):
                return web.Response(body=config, content_type="application/json")
            return web.json_response({"text_output": "ok"})

        async with Rig() as rig:
            rig.gw.router.set_service(isvc("chat", fmt="python", openai={"enabled": True}))
            rig.gw.router.set_slice(slice_for("chat", rig.upstream.port))
            rig.upstream.answer = answer
            reply = await rig.call("POST", "/v1/chat/completions",
                                   body={"model": "ml/chat", "messages": [{"role": "user", "content": "hi"}]})
            assert reply.status == 200
            prompt = json.loads(rig.upstream.seen[-1].body)["text_input"]
            assert (prompt == rendered) if rendered else not prompt.startswith("MARK"), prompt
    run(scenario)


def test_an_error_repeats_at_most_a_few_hundred_characters_of_what_the_client_sent():
    """An unknown field named with 3,000 characters was echoed whole in the error's message and
    its `param`, and so was a Responses tool type of 2,000."""
    async def scenario():
        async with Rig() as rig:
            reply = await rig.call("POST", "/v1/chat/completions", body={**CHAT, "x" * 3000: 1})
            error = reply.error
            assert reply.status == 400 and error["code"] == "unsupported_parameter"
            assert error["param"] == "x" * 200 + "..."
            assert error["message"] == "x" * 400 + "..."
            reply = await rig.call("POST", "/v1/responses", body={"model": "ml/llama", "input": "hi",
                                                                   "tools": [{"type": "y" * 2000}]})
            assert reply.status == 400 and len(reply.error["message"]) <= 403
            assert reply.error["message"].startswith("tools.0: only function tools are served here")
    run(scenario)


@pytest.mark.parametrize("message, param, text", [
    ({"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
     "messages.1.function_call", "the deprecated function_call of a message is not supported: send tool_calls"),
    ({"role": "assistant", "content": "x", "audio": {"id": "audio_1"}}, "messages.1.audio",
     "audio in messages is not supported"),
])
def test_a_message_field_the_model_would_never_see_is_refused_not_dropped(message, param, text):
    """An assistant turn's old-style function_call, or the audio it answered with, was dropped from
    the history the model read, silently. Refused now, naming it; what an earlier answer carries
    and means nothing here (refusal, annotations, audio null) is still taken."""
    async def scenario():
        async with Rig() as rig:
            first = {"role": "user", "content": "hi"}
            reply = await rig.call("POST", "/v1/chat/completions", body={**CHAT, "messages": [first, message]})
            assert (reply.status, reply.error) == refused(f"{param}: {text}", param)
            echoed = {"role": "assistant", "content": "x", "audio": None, "refusal": None, "annotations": []}
            reply = await rig.call("POST", "/v1/chat/completions", body={**CHAT, "messages": [first, echoed]})
            assert reply.status == 200
    run(scenario)


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[1, 2], [3]]])
def test_a_completion_prompt_of_token_ids_is_refused_as_such(prompt):
    """A prompt of token ids was refused as "prompt.0: Input should be a valid string"."""
    async def scenario():
        async with Rig() as rig:
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": prompt})
            assert (reply.status, reply.error) == refused(
                "prompt: token arrays are not supported: send text (the gateway does not tokenize)", "prompt")
    run(scenario)


def test_a_replicas_redirect_is_never_followed():
    """aiohttp follows redirects unless told not to: a replica answering 307 had the tenant's
    request, prompt and key-scoped cache salt included, sent to the host its Location named, and a
    302 had that host's answer (here an internal service's) passed back as the model's, on the
    /v2 routes and the OpenAI ones. A redirect, like an interim 101, is now a 502 and goes nowhere."""
    async def scenario():
        seen: list[str] = []

        async def internal(request: web.Request) -> web.Response:
            seen.append(request.path)
            return web.json_response({"text_output": "internal-only", "secret": "internal-only"})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", internal)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        there = f"http://127.0.0.1:{runner.addresses[0][1]}/v2/repository/index"
        try:
            async with Rig() as rig:
                for status in (302, 307, 308):
                    async def redirect(request: web.Request, status: int = status) -> web.Response:
                        await request.read()
                        return web.Response(status=status, headers={"Location": there})

                    rig.upstream.answer = redirect
                    for route, body in (("/v2/models/resnet/infer", {"inputs": []}),
                                        ("/v1/completions", {"model": "ml/llama", "prompt": "tenant prompt"})):
                        reply = await rig.call("POST", route, body=body)
                        assert (reply.status, reply.error["code"]) == (502, "upstream_failed"), (status, route)
                        assert b"internal-only" not in reply.body
                assert seen == []
        finally:
            await runner.cleanup()
    run(scenario)
