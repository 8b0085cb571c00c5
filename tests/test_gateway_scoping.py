"""Scoping, driven in process over real loopback sockets: what a key may reach and what it may
spend, on every route. A key reaches only the services its grant names (403 for the rest, existing
or not), and its max_tokens cap, tokens per minute, requests in flight and usage apply on the KServe
v2 generate routes exactly as on the OpenAI ones. The upstream is a recording stand-in for Triton
(tests/gateway_http.py says why)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from aiohttp import web

from triton_operator.gateway import keys as k
from triton_operator.gateway import telemetry as m
from triton_operator.gateway.auth import cache_scope
from triton_operator.gateway.passthrough_proxy import HEADER_LENGTH
from triton_runtime.serving.prefix_cache import BOUNDARY, END, PrefixCache

from .gateway_http import KEY_A, KEY_B, Rig, connect, isvc, read_reply, run, settle, slice_for

NS = {"X-Inference-Namespace": "ml"}


def value(metric, *labels) -> float:
    return metric.labels(*labels)._value.get()


async def counted(request: web.BaseRequest) -> web.StreamResponse:
    """An llm model's answers, with the token counts the gateway reads for usage."""
    if request.raw_path.endswith("/generate_stream"):
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b'data: {"text_output": "he", "finish_reason": "", "prompt_tokens": 7, "completion_tokens": 1}\n\n')
        await out.write(b'data: {"text_output": "llo", "finish_reason": "stop", "prompt_tokens": 7, '
                        b'"completion_tokens": 3}\n\n')
        await out.write_eof()
        return out
    return web.json_response({"text_output": "hello", "finish_reason": "stop", "prompt_tokens": 7,
                              "completion_tokens": 3})


def test_max_tokens_caps_the_v2_generate_routes_as_the_openai_ones():
    """The same key asking for 1,000,000 tokens on /v2/models/*/generate used to get 200s."""
    async def scenario():
        async with Rig() as rig:
            for route in ("generate", "generate_stream"):
                for asked in (1_000_000, [1_000_000], 32769):
                    reply = await rig.call("POST", f"/v2/models/llama/{route}", body={"text_input": "x",
                                                                                      "max_tokens": asked}, headers=NS)
                    assert (reply.status, reply.error["code"], reply.error["message"]) == (
                        400, "max_tokens_too_large", "max_tokens: at most 32768 for this API key")
                for asked in ("many", -1, 0, True, [1, 2]):
                    reply = await rig.call("POST", f"/v2/models/llama/{route}", body={"text_input": "x",
                                                                                      "max_tokens": asked}, headers=NS)
                    assert (reply.status, reply.error["message"]) == (400, "max_tokens must be a positive integer")
            assert rig.upstream.seen == []
            reply = await rig.call("POST", "/v2/models/llama/generate", body=b"[1]", headers=NS)
            assert (reply.status, reply.error["message"]) == (400, "the request body must be a JSON object")
            reply = await rig.call("POST", "/v2/models/llama/generate", body=b"{", headers=NS)
            assert (reply.status, reply.error["message"]) == (400, "the request body is not valid JSON")
    run(scenario)


def test_a_keys_own_max_tokens_applies_on_v2_and_is_the_default_when_none_is_asked():
    async def scenario():
        async with Rig() as rig:
            rig.gw.auth.grants = k.parse(f"keys: [{{name: small, key: {KEY_A}, namespaces: [ml], maxTokens: 100}}]", "k")
            reply = await rig.call("POST", "/v2/models/llama/generate", body={"text_input": "x", "max_tokens": 101},
                                   headers=NS)
            assert (reply.status, reply.error["message"]) == (400, "max_tokens: at most 100 for this API key")
            reply = await rig.call("POST", "/v2/models/llama/generate", body={"text_input": "x"}, headers=NS)
            assert reply.status == 200
            salt = cache_scope("small")      # the key's cache scope, on every request to an LLM
            assert json.loads(rig.upstream.seen[-1].body) == {"text_input": "x", "max_tokens": 100, "cache_salt": salt}
            reply = await rig.call("POST", "/v2/models/llama/generate", body={"text_input": "x", "max_tokens": 50},
                                   headers=NS)
            assert reply.status == 200 and rig.upstream.seen[-1].body == (
                b'{"text_input":"x","max_tokens":50,"cache_salt":"%s"}' % salt.encode())
            # a model that is not an LLM keeps its own default when none is asked
            reply = await rig.call("POST", "/v2/models/resnet/generate", body={"text_input": "x"})
            assert reply.status == 200 and rig.upstream.seen[-1].body == b'{"text_input":"x"}'
    run(scenario)


def test_max_tokens_inside_parameters_is_capped_and_the_checked_document_is_what_the_replica_reads():
    """Triton maps "parameters"' keys to the model's inputs too (server src/http_server.cc
    ConvertGenerateRequest), and reads the first of a key given twice where the gateway's parser
    reads the last: {"max_tokens": 1000000} inside parameters, or before a second max_tokens of 1,
    used to reach the model past the key's cap of 100. A text model's /infer took any max_tokens."""
    async def scenario():
        async with Rig() as rig:
            rig.gw.auth.grants = k.parse(f"keys: [{{name: small, key: {KEY_A}, namespaces: [ml], maxTokens: 100}}]", "k")
            rig.gw.router.set_service(isvc("chat", fmt="python", openai={"enabled": True}))
            rig.gw.router.set_slice(slice_for("chat", rig.upstream.port))
            for target in ("/v2/models/llama/generate", "/v2/models/llama/generate_stream", "/v2/models/chat/generate"):
                reply = await rig.call("POST", target, headers=NS,
                                       body={"text_input": "x", "parameters": {"max_tokens": 1_000_000}})
                assert (reply.status, reply.error) == (400, {
                    "message": "parameters.max_tokens: at most 100 for this API key", "type": "invalid_request_error",
                    "param": "parameters.max_tokens", "code": "max_tokens_too_large"})
                reply = await rig.call("POST", target, headers=NS, body={"text_input": "x", "parameters": {"max_tokens": 0}})
                assert (reply.status, reply.error["message"]) == (400, "parameters.max_tokens must be a positive integer")
                reply = await rig.call("POST", target, headers=NS,
                                       body=b'{"text_input": "x", "max_tokens": 1, "max_tokens": 1000000}')
                assert (reply.status, reply.error["message"]) == (400, "max_tokens: at most 100 for this API key")
            reply = await rig.call("POST", "/v2/models/chat/infer", body={"inputs": [
                {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["x"]},
                {"name": "max_tokens", "datatype": "INT32", "shape": [1], "data": [1_000_000]}]})
            assert (reply.status, reply.error["code"], reply.error["message"]) == (
                404, "route_not_allowed", "model chat generates text: send its requests to /v2/models/chat/generate "
                                          "or generate_stream, or to the OpenAI routes")
            assert rig.upstream.seen == []
            # within the cap: the replica reads the document as checked, one key once, and an LLM's
            # request capped inside parameters gets no second max_tokens (Triton refuses an input twice)
            reply = await rig.call("POST", "/v2/models/llama/generate", headers={**NS, HEADER_LENGTH: "10"},
                                   body=b'{"text_input": "x", "max_tokens": 1000000, "max_tokens": 50}')
            assert reply.status == 200
            salt = cache_scope("small").encode()
            assert rig.upstream.seen[-1].body == b'{"text_input":"x","max_tokens":50,"cache_salt":"%s"}' % salt
            assert HEADER_LENGTH not in rig.upstream.seen[-1].headers      # no binary part to a generate body
            reply = await rig.call("POST", "/v2/models/llama/generate", headers=NS,
                                   body={"text_input": "x", "parameters": {"max_tokens": 50}})
            assert reply.status == 200
            assert rig.upstream.seen[-1].body == b'{"text_input":"x","parameters":{"max_tokens":50},"cache_salt":"%s"}' % salt
            assert len(rig.upstream.seen) == 2
    run(scenario)


SECRET = "You are Globex's negotiation bot. Walk-away price for Project Falcon: 41 million."


def llm_replica(bodies: list[dict]) -> Any:
    """The llm model's prefix cache as the runtime keeps it (prefix_cache.py; a character stands for
    a token): states saved where the last message begins and at the end, in the request's
    cache_salt scope; a prompt restarts from the longest prefix saved in its scope, and the answer
    says how many prompt tokens that was (cached_tokens, usage.prompt_tokens_details)."""
    cache = PrefixCache(10 ** 9)

    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        body = json.loads(await request.read())
        if "messages" not in body:   # a kvEvents probe
            return web.json_response({"text_output": "", "kv_events": '{"epoch":"e","seq":0,"snapshot":[]}'})
        bodies.append(body)
        rendered = [f"{m['role']}: {m['content']}\n" for m in json.loads(body["messages"])]
        ids, scope = [ord(c) for c in "".join(rendered)], body.get("cache_salt", "")
        cached, _ = cache.longest(ids, scope)
        for prefix, kind in ((ids[:len("".join(rendered[:-1]))], BOUNDARY), (ids, END)):
            if cache.wants(prefix, scope):
                cache.store(prefix, "state", 100, kind, scope=scope)
        return web.json_response({"text_output": "ok", "finish_reason": "stop", "prompt_tokens": len(ids),
                                  "completion_tokens": 1, "cached_tokens": cached})
    return answer


def test_a_key_reuses_only_the_prompts_its_own_requests_left():
    """Key a sending key b's system prompt used to be told, in usage.prompt_tokens_details
    .cached_tokens, that b had sent it (the replica's prefix cache served every key of a service):
    a way to confirm another tenant's confidential prompt. Each request now carries its key's
    cache scope (the llm model's cache_salt), and the prefix names the gateway computes are the
    key's."""
    async def scenario():
        bodies: list[dict] = []
        async with Rig() as rig:
            rig.upstream.answer = llm_replica(bodies)

            async def usage(key: str, question: str) -> dict:
                reply = await rig.call("POST", "/v1/chat/completions", key=key, body={
                    "model": "ml/llama", "max_tokens": 1, "messages": [
                        {"role": "system", "content": SECRET}, {"role": "user", "content": question}]})
                assert reply.status == 200
                return reply.json()["usage"]

            system = len(f"system: {SECRET}\n")
            assert (await usage(KEY_B, "Open at 30 million?"))["prompt_tokens_details"] == {"cached_tokens": 0}
            assert await usage(KEY_A, "hello") == {"prompt_tokens": system + len("user: hello\n"),
                                                   "completion_tokens": 1, "total_tokens": system + 13,
                                                   "prompt_tokens_details": {"cached_tokens": 0}}
            assert (await usage(KEY_B, "And at 35?"))["prompt_tokens_details"] == {"cached_tokens": system}
            b1, a1, b2 = bodies
            assert [x["cache_salt"] for x in bodies] == [cache_scope("b"), cache_scope("a"), cache_scope("b")]
            assert cache_scope("a") != cache_scope("b")
            assert set(a1["prefix_keys"]).isdisjoint(b1["prefix_keys"]), "the names of a's prompt are a's own"
            assert b1["prefix_keys"][:b1["prefix_boundary"]] == b2["prefix_keys"][:b2["prefix_boundary"]]
            # the scope is the gateway's to set, at the top level or inside parameters
            for body, named in (({"text_input": "x", "cache_salt": cache_scope("b")}, "cache_salt"),
                                ({"text_input": "x", "parameters": {"cache_salt": cache_scope("b")}},
                                 "parameters.cache_salt")):
                reply = await rig.call("POST", "/v2/models/llama/generate", headers=NS, body=body)
                assert (reply.status, reply.error["code"], reply.error["message"]) == (
                    400, "reserved_parameter", f"{named}: set by the gateway, not by clients")
            assert len(bodies) == 3
    run(scenario)


def test_v2_generate_answers_count_the_keys_tokens_and_spend_its_budget():
    """The token counter used to stay at 0 on the v2 routes, and tokensPerMinute never applied."""
    async def scenario():
        async with Rig() as rig:
            rig.gw.auth.grants = k.parse(f"keys: [{{name: tpm, key: {KEY_A}, namespaces: [ml], tokensPerMinute: 15}}]",
                                         "k")
            rig.upstream.answer = counted
            before = value(m.KEY_TOKENS, "tpm", "ml", "llama", "prompt"), value(m.KEY_TOKENS, "tpm", "ml", "llama",
                                                                                "completion")
            reply = await rig.call("POST", "/v2/models/llama/generate", body={"text_input": "x"}, headers=NS)
            assert reply.status == 200 and reply.json()["text_output"] == "hello"   # passed through as it came
            reply = await rig.call("POST", "/v2/models/llama/generate_stream", body={"text_input": "x"}, headers=NS)
            assert reply.status == 200 and reply.body.count(b"data: ") == 2
            assert value(m.KEY_TOKENS, "tpm", "ml", "llama", "prompt") == before[0] + 14
            assert value(m.KEY_TOKENS, "tpm", "ml", "llama", "completion") == before[1] + 6
            # 20 tokens of a 15-a-minute budget: the next request waits
            reply = await rig.call("POST", "/v2/models/llama/generate", body={"text_input": "x"}, headers=NS)
            assert (reply.status, reply.error["code"]) == (429, "rate_limit_exceeded")
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})
            assert (reply.status, reply.error["code"]) == (429, "rate_limit_exceeded")
    run(scenario)


async def n_answers(request: web.BaseRequest) -> web.StreamResponse:
    """The llm model's stream of n = 4 answers, interleaved: each event names its answer's index and
    carries that answer's counts so far; answer i ends with 10 * (i + 1) tokens."""
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    for last in (False, True):
        for index in range(4):
            done = 10 * (index + 1) if last else index + 1
            await out.write(b"data: " + json.dumps({
                "text_output": "tok", "index": index, "finish_reason": "length" if last else "",
                "prompt_tokens": 5, "completion_tokens": done}).encode() + b"\n\n")
    await out.write_eof()
    return out


def test_v2_generate_stream_spends_every_answers_tokens():
    """With n answers the pass-through spent only the last event's counts, one answer's (10 + 20 +
    30 + 40 = 100 tokens counted as 40); the OpenAI route counts every answer."""
    async def scenario():
        async with Rig() as rig:
            rig.upstream.answer = n_answers
            before = value(m.KEY_TOKENS, "a", "ml", "llama", "prompt"), value(m.KEY_TOKENS, "a", "ml", "llama",
                                                                              "completion")
            reply = await rig.call("POST", "/v2/models/llama/generate_stream", headers=NS,
                                   body={"text_input": "x", "stream": True, "n": 4, "max_tokens": 40})
            assert reply.status == 200 and reply.body.count(b"data: ") == 8      # passed through as it came
            assert value(m.KEY_TOKENS, "a", "ml", "llama", "prompt") == before[0] + 5
            assert value(m.KEY_TOKENS, "a", "ml", "llama", "completion") == before[1] + 100
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x", "n": 4,
                                                                     "max_tokens": 40})
            assert reply.json()["usage"] == {"prompt_tokens": 5, "completion_tokens": 100, "total_tokens": 105}
            assert value(m.KEY_TOKENS, "a", "ml", "llama", "completion") == before[1] + 200
    run(scenario)


def test_requests_in_flight_are_capped_per_key_on_every_route():
    async def scenario():
        release = asyncio.Event()

        async def slow(request):
            await release.wait()
            return web.json_response({"text_output": "late"})

        async with Rig() as rig:
            rig.gw.auth.grants = k.parse(f"keys: [{{name: one, key: {KEY_A}, namespaces: [ml], maxInFlight: 1}}, "
                                         f"{{name: b, key: {KEY_B}, namespaces: [ml]}}]", "k")
            rig.upstream.answer = slow
            first = asyncio.create_task(rig.call("POST", "/v2/models/llama/generate", body={"text_input": "x"},
                                                 headers=NS))
            await asyncio.sleep(0.2)
            for method, target, body in (("POST", "/v1/completions", {"model": "ml/llama", "prompt": "x"}),
                                         ("POST", "/v2/models/llama/generate", {"text_input": "x"}),
                                         ("POST", "/v2/models/resnet/infer", {"inputs": []})):
                reply = await rig.call(method, target, body=body, headers=NS)
                assert (reply.status, reply.error["code"]) == (429, "too_many_requests_in_flight")
            other = asyncio.create_task(rig.call("POST", "/v1/completions", key=KEY_B,
                                                 body={"model": "ml/llama", "prompt": "x"}))
            await asyncio.sleep(0.1)
            release.set()
            assert [r.status for r in await asyncio.gather(first, other)] == [200, 200]
    run(scenario)


def test_usage_is_counted_per_key_and_service():
    async def scenario():
        async with Rig() as rig:
            before = value(m.KEY_REQUESTS, "b", "ml", "llama"), value(m.KEY_REQUEST_SECONDS, "b", "ml", "llama")
            other = value(m.KEY_REQUESTS, "a", "ml", "llama")
            for _ in range(3):
                assert (await rig.call("POST", "/v1/completions", key=KEY_B,
                                       body={"model": "llama", "prompt": "x"})).status == 200
            assert (await rig.call("POST", "/v2/models/llama/generate", key=KEY_B, body=b"{}")).status == 200
            assert value(m.KEY_REQUESTS, "b", "ml", "llama") == before[0] + 4
            assert value(m.KEY_REQUEST_SECONDS, "b", "ml", "llama") > before[1]
            assert value(m.KEY_REQUESTS, "a", "ml", "llama") == other
            refused = await rig.call("POST", "/v1/completions", key=KEY_B, body={"model": "lab/llama", "prompt": "x"})
            assert refused.status == 403 and value(m.KEY_REQUESTS, "b", "ml", "llama") == before[0] + 4
    run(scenario)


def test_a_key_reaches_only_its_services_on_every_route():
    async def scenario():
        async with Rig() as rig:
            for method, target, body, headers in (
                    ("POST", "/v1/completions", {"model": "vault/secret", "prompt": "x"}, {}),
                    ("POST", "/v1/completions", {"model": "lab/llama", "prompt": "x"}, {}),
                    ("GET", "/v1/models/vault/secret", b"", {}),
                    ("GET", "/v2/models/secret", b"", {"X-Inference-Namespace": "vault"}),
                    ("POST", "/v2/models/llama/generate", {"text_input": "x"}, {"X-Inference-Namespace": "lab"}),
                    ("POST", "/v2/models/resnet/infer", {"inputs": []}, {"X-Inference-Namespace": "vault"})):
                reply = await rig.call(method, target, key=KEY_B, body=body, headers=headers)
                assert (reply.status, reply.error["type"]) == (403, "permission_error"), target
            assert rig.upstream.seen == []
    run(scenario)


def test_what_an_llm_is_told_to_generate_on_v2_is_what_its_key_is_charged_for():
    """`stream` on /generate made a streaming model run the whole generation, answered 200 with
    an error and no counts, so the key was charged nothing (`n` 16 made it 16 times the cap);
    `n` as `[[16]]` was reserved as 1 where Triton flattens it to 16. Both are refused."""
    async def scenario():
        async with Rig() as rig:
            for body, param, message in (
                    ({"text_input": "x", "stream": True}, "stream", "stream: send streamed requests to generate_stream"),
                    ({"text_input": "x", "stream": [True]}, "stream", "stream: send streamed requests to generate_stream"),
                    ({"text_input": "x", "stream": 1}, "stream", "stream: send streamed requests to generate_stream"),
                    ({"text_input": "x", "parameters": {"stream": True}}, "parameters.stream",
                     "parameters.stream: send streamed requests to generate_stream"),
                    ({"text_input": "x", "n": [[16]]}, "n", "n must be a whole number from 1 to 16"),
                    ({"text_input": "x", "parameters": {"n": 4294967312}}, "parameters.n",
                     "parameters.n must be a whole number from 1 to 16"),
                    ({"text_input": "x", "n": True}, "n", "n must be a whole number from 1 to 16"),
                    ({"text_input": "x", "n": 17}, "n", "n must be a whole number from 1 to 16")):
                reply = await rig.call("POST", "/v2/models/llama/generate", headers=NS, body=body)
                assert (reply.status, reply.error["param"], reply.error["message"]) == (400, param, message), body
            assert rig.upstream.seen == []
            for target, body in (("/v2/models/llama/generate_stream", {"text_input": "x", "stream": True, "n": [2]}),
                                 ("/v2/models/llama/generate", {"text_input": "x", "parameters": {"n": 3}}),
                                 ("/v2/models/llama/generate", {"text_input": "x", "stream": False})):
                reply = await rig.call("POST", target, headers=NS, body=body)
                assert reply.status == 200, (target, reply.body[:200])
            assert len(rig.upstream.seen) == 3
    run(scenario)


def test_a_request_held_while_its_service_wakes_costs_nothing_when_its_client_leaves():
    """On the v2 routes the tokens were reserved before the request was held, and a client that
    left while the service woke (no replica ever saw the request) was charged them all: an honest
    client whose timeout is shorter than a cold start paid max_tokens x n for each retry."""
    async def scenario():
        async with Rig() as rig:
            rig.gw.auth.grants = k.parse(
                f"keys: [{{name: t, key: {KEY_A}, namespaces: [ml], tokensPerMinute: 100000}}]", "k")
            rig.gw.watches._service_event("ADDED", isvc("cold", autoscaling={"minReplicas": 0, "maxReplicas": 1}))
            for target, body in (("/v2/models/cold/generate", {"text_input": "x", "max_tokens": 30000}),
                                 ("/v2/models/cold/generate_stream", {"text_input": "x", "max_tokens": 2000, "n": 16}),
                                 ("/v1/completions", {"model": "ml/cold", "prompt": "x", "max_tokens": 30000})):
                task = asyncio.create_task(rig.call("POST", target, body=body, headers=NS))
                await settle(lambda: rig.gw.holds.count == 1)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await settle(lambda: rig.gw.holds.count == 0 and not rig.gw.in_flight.by_key)
                levels = [level for level, _ in rig.gw.auth.token_limiter.buckets.values()]
                assert levels == [] or levels[0] > 100000 - 10, (target, levels)   # a refill's worth at most
            assert rig.upstream.seen == []
    run(scenario)


@pytest.mark.parametrize("change, status", [("revoked", 401), ("narrowed", 403)])
def test_a_request_held_while_its_key_is_revoked_or_narrowed_never_reaches_the_model(change, status):
    """A held request kept the authorization it came with: revoked, or moved to another namespace,
    while its service woke, its key's request still went to the model once a replica was up (up to
    the hold timeout after the key file changed). It is answered as a new request would be."""
    async def scenario():
        async with Rig() as rig:
            rig.gw.watches._service_event("ADDED", isvc("cold", autoscaling={"minReplicas": 0, "maxReplicas": 1}))
            task = asyncio.create_task(rig.call("POST", "/v2/models/cold/generate", body={"text_input": "x"},
                                                headers=NS))
            await settle(lambda: rig.gw.holds.count == 1)
            rig.gw.auth.grants = k.parse(f"keys: [{{name: b, key: {KEY_B}, namespaces: [ml]}}]" if change == "revoked"
                                         else f"keys: [{{name: a, key: {KEY_A}, namespaces: [lab]}}]", "k")
            assert (await rig.call("GET", "/v2/models/cold/ready", headers=NS)).status == status   # a new one
            rig.gw.watches._slice_event("ADDED", slice_for("cold", rig.upstream.port))
            reply = await asyncio.wait_for(task, 5)
            assert reply.status == status and reply.error["code"] == (
                "invalid_api_key" if status == 401 else "model_not_allowed")
            assert rig.upstream.seen == []
    run(scenario)


def test_a_client_that_leaves_while_the_gateway_connects_to_a_replica_costs_nothing():
    """A request counted as sent to a replica before its connection was made: a client that left
    while the gateway was still connecting (a node that is down drops connection attempts for the
    connect timeout) was charged its whole reservation for a request no replica saw. Sent is when
    its head goes out."""
    import socket

    stuck = socket.socket()
    stuck.bind(("127.0.0.2", 0))
    stuck.listen(0)
    fillers = []
    for _ in range(4):   # its accept queue full: the kernel drops further connection attempts
        f = socket.socket()
        f.setblocking(False)
        f.connect_ex(stuck.getsockname())
        fillers.append(f)

    async def scenario():
        async with Rig(upstream_connect_timeout_seconds=3) as rig:
            rig.gw.auth.grants = k.parse(f"keys: [{{name: t, key: {KEY_A}, namespaces: [ml], "
                                         f"tokensPerMinute: 100000}}]", "k")
            rig.gw.auth.clock = lambda: 1000.0   # nothing refills
            rig.gw.router.replace_slices([slice_for("llama", stuck.getsockname()[1], address="127.0.0.2")])
            task = asyncio.create_task(rig.call("POST", "/v1/completions", headers=NS, body={
                "model": "ml/llama", "prompt": "x", "max_tokens": 1000}))
            await asyncio.sleep(0.5)   # connecting
            assert rig.gw.in_flight.by_key
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await settle(lambda: not rig.gw.in_flight.by_key)
            levels = [level for level, _ in rig.gw.auth.token_limiter.buckets.values()]
            assert levels == [] or levels[0] == 100000
    try:
        run(scenario)
    finally:
        stuck.close()
        for f in fillers:
            f.close()


COLD = {"autoscaling": {"minReplicas": 0, "maxReplicas": 1}}


@pytest.mark.parametrize("route, body", [("/v1/completions", {"model": "ml/cold", "prompt": "x", "max_tokens": 5000}),
                                         ("/v2/models/cold/generate", {"text_input": "x", "max_tokens": 5000})])
@pytest.mark.parametrize("change, answer", [
    ("openai off", (404, "model_not_found")), ("embeddings", (400, "wrong_model_task")),
    ("maxTokens 100", (400, "max_tokens_too_large")), ("tokensPerMinute 100", (200, None))])
def test_a_request_held_while_its_service_or_key_changes_is_judged_as_a_new_one(route, body, change, answer):
    """A held request went to the model under its service's and key's settings from before the
    hold: the OpenAI routes turned off, its model made an embedding model, the key's maxTokens
    lowered to 100 (5,000 went out) or its tokensPerMinute set (the request was never charged). It
    is judged again when a replica comes, as a new request would be (on /v2 as /v2 judges: the
    OpenAI switch is the OpenAI routes' own, and an embedding model's generate route is not served)."""
    v2 = route.startswith("/v2")
    if v2 and change == "openai off":
        answer = (200, None)
    if v2 and change == "embeddings":
        answer = (404, "route_not_allowed")

    async def scenario():
        async with Rig() as rig:
            rig.gw.auth.clock = lambda: 1000.0   # nothing refills

            async def counted(request):   # the llm model's answer, with its counts
                await request.read()
                return web.json_response({"text_output": "hello", "finish_reason": "length", "prompt_tokens": 1,
                                          "completion_tokens": 50})

            rig.upstream.answer = counted
            grant = "keys: [{name: a, key: %s, namespaces: [ml]%s}]"
            rig.gw.auth.grants = k.parse(grant % (KEY_A, ""), "k")
            rig.gw.watches._service_event("ADDED", isvc("cold", **COLD))
            task = asyncio.create_task(rig.call("POST", route, body=body, headers=NS))
            await settle(lambda: rig.gw.holds.count == 1)
            if change == "openai off":
                rig.gw.watches._service_event("MODIFIED", isvc("cold", openai={"enabled": False}, **COLD))
            elif change == "embeddings":
                rig.gw.watches._service_event("MODIFIED", isvc("cold", fmt="python", openai={"task": "embeddings"},
                                                               **COLD))
            else:
                rig.gw.auth.grants = k.parse(grant % (KEY_A, ", " + change.replace(" ", ": ")), "k")
                rig.gw.auth.keys_changed()
            rig.gw.watches._slice_event("ADDED", slice_for("cold", rig.upstream.port))
            reply = await asyncio.wait_for(task, 5)
            assert (reply.status, reply.error["code"] if reply.status != 200 else None) == answer
            assert len(rig.upstream.seen) == (answer[0] == 200)
            if change == "tokensPerMinute 100":   # charged under the limit it has now
                (level, _), = rig.gw.auth.token_limiter.buckets.values()
                assert level == 100 - 51
    run(scenario)


@pytest.mark.parametrize("body", [{"text_input": "x", "max_tokens": 10 ** 6}, {"text_input": "x", "cache_salt": "a"},
                                  {"text_input": "x", "n": 99}, b"[1]"])
def test_a_v2_request_that_will_be_refused_is_refused_before_it_wakes_its_service(body):
    """A /v2 generate request over its key's cap (or otherwise refused) was held while its service
    woke (a held request counts as queued: the autoscaler starts a replica for it), then answered
    503 model_starting with a Retry-After, so a well-behaved client retried what could never pass."""
    async def scenario():
        async with Rig(hold_timeout_seconds=5) as rig:
            rig.gw.watches._service_event("ADDED", isvc("cold", **COLD))
            reply = await asyncio.wait_for(rig.call("POST", "/v2/models/cold/generate", body=body, headers=NS), 2)
            assert reply.status == 400 and rig.gw.holds.count == 0
    run(scenario)


def test_embeddings_held_while_the_service_changes_are_judged_as_a_new_request():
    """/v1/embeddings waited and then went to the service resolved before the wait: its OpenAI
    routes turned off, or the model made a text model, the held request still reached it."""
    async def scenario():
        for change, answer in (({"task": "embeddings", "enabled": False}, (404, "model_not_found")),
                               ({"enabled": True}, (400, "wrong_model_task"))):
            async with Rig() as rig:
                rig.gw.watches._service_event("ADDED", isvc("emb", fmt="python", openai={"task": "embeddings"},
                                                            **COLD))
                task = asyncio.create_task(rig.call("POST", "/v1/embeddings", headers=NS,
                                                    body={"model": "ml/emb", "input": "x"}))
                await settle(lambda: rig.gw.holds.count == 1)
                rig.gw.watches._service_event("MODIFIED", isvc("emb", fmt="python", openai=change, **COLD))
                rig.gw.watches._slice_event("ADDED", slice_for("emb", rig.upstream.port))
                reply = await asyncio.wait_for(task, 5)
                assert (reply.status, reply.error["code"]) == answer and rig.upstream.seen == []
    run(scenario)


def test_a_later_wait_has_its_own_grace_and_a_reservation_settles_under_its_grant(monkeypatch):
    """The hold timeout is the request's, across its waits; the grace a service with ready replicas
    the gateway cannot reach gets (its EndpointSlice lagging) is each wait's own: shared, a request
    that had waited for its replica was answered 503 at once when the slice blinked while its
    model's chat template was read. And a reservation taken before a wait to send settles under the
    grant it was taken under: a key given a tokensPerMinute meanwhile was charged nothing."""
    from triton_operator.gateway import holding

    monkeypatch.setattr(holding, "UNUSABLE_GRACE_SECONDS", 0.5)

    def warm(ready: int) -> dict:
        obj = isvc("warm", fmt="python", openai={"enabled": True})
        obj["status"] = {"replicas": 1, "readyReplicas": ready}
        return obj

    async def scenario():
        async with Rig(hold_timeout_seconds=30) as rig:
            rig.gw.watches._service_event("ADDED", warm(0))

            async def answer(request):   # the config read: the slice blinks for 0.2 s
                if request.raw_path.endswith("/config"):
                    rig.gw.watches._slice_event("DELETED", slice_for("warm", rig.upstream.port))

                    async def back():
                        await asyncio.sleep(0.2)
                        rig.gw.watches._slice_event("ADDED", slice_for("warm", rig.upstream.port))
                    asyncio.get_running_loop().create_task(back())
                    return web.json_response({"parameters": {}})
                await request.read()
                return web.json_response({"text_output": "hello"})

            rig.upstream.answer = answer
            task = asyncio.create_task(rig.call("POST", "/v1/chat/completions", headers=NS, body={
                "model": "ml/warm", "messages": [{"role": "user", "content": "x"}]}))
            await asyncio.sleep(0.7)   # past the grace, waiting for the first replica
            rig.gw.watches._service_event("MODIFIED", warm(1))
            rig.gw.watches._slice_event("ADDED", slice_for("warm", rig.upstream.port))
            reply = await asyncio.wait_for(task, 5)
            assert reply.status == 200

        async with Rig(hold_timeout_seconds=30) as rig:
            rig.gw.auth.clock = lambda: 1000.0   # nothing refills
            grant = "keys: [{name: a, key: %s, namespaces: [ml]%s}]"
            rig.gw.auth.grants = k.parse(grant % (KEY_A, ""), "k")
            rig.gw.watches._service_event("ADDED", warm(1))
            rig.gw.router.set_slice(slice_for("warm", rig.upstream.port))
            waiting = asyncio.Event()

            async def limited(request):   # the config read: the slice goes, the key gets a limit
                if request.raw_path.endswith("/config"):
                    rig.gw.watches._slice_event("DELETED", slice_for("warm", rig.upstream.port))

                    async def later():
                        await settle(lambda: rig.gw.holds.count == 1)   # waiting to send, tokens reserved
                        rig.gw.auth.grants = k.parse(grant % (KEY_A, ", tokensPerMinute: 1000"), "k")
                        rig.gw.auth.keys_changed()
                        rig.gw.watches._slice_event("ADDED", slice_for("warm", rig.upstream.port))
                        waiting.set()
                    asyncio.get_running_loop().create_task(later())
                    return web.json_response({"parameters": {}})
                await request.read()
                return web.json_response({"text_output": "hello " * 200})

            rig.upstream.answer = limited
            reply = await rig.call("POST", "/v1/chat/completions", headers=NS, body={
                "model": "ml/warm", "messages": [{"role": "user", "content": "x" * 4000}], "max_tokens": 2000})
            assert reply.status == 200 and waiting.is_set()
            # reserved and settled with no limit (the grant that took it): nothing left in a bucket
            assert rig.gw.auth.token_limiter.buckets == {}
    run(scenario)


def test_what_a_text_model_cannot_be_asked_is_refused_before_the_request_waits():
    """A chat asking a text model for a seed (or n, tools, log probabilities) was held while its
    service woke, and refused only once a replica was up: a cold start's wait for a 400."""
    async def scenario():
        async with Rig(hold_timeout_seconds=5) as rig:
            rig.gw.watches._service_event("ADDED", isvc("cold", fmt="python", openai={"enabled": True}, **COLD))
            reply = await asyncio.wait_for(rig.call("POST", "/v1/chat/completions", headers=NS, body={
                "model": "ml/cold", "seed": 1, "messages": [{"role": "user", "content": "x"}]}), 2)
            assert (reply.status, reply.error["code"]) == (400, "unsupported_parameter")
            assert rig.gw.holds.count == 0
    run(scenario)


def test_the_grace_for_a_lagging_slice_counts_from_when_the_service_is_ready(monkeypatch):
    """A service's status and its EndpointSlice come by two watches: a request held while it
    started (not from zero) past the grace was answered 503 no_usable_replica the moment the status
    said ready, a little before the slice came. And a hold that runs out while a slice lags is
    model_starting, not a replica out of reach (with its warning and metric)."""
    from triton_operator.gateway import holding

    monkeypatch.setattr(holding, "UNUSABLE_GRACE_SECONDS", 0.5)

    def new(ready: int) -> dict:
        obj = isvc("new")
        obj["status"] = {"replicas": 1, "readyReplicas": ready}
        return obj

    async def scenario():
        async with Rig(hold_timeout_seconds=30) as rig:
            rig.gw.watches._service_event("ADDED", new(0))
            task = asyncio.create_task(rig.call("POST", "/v1/completions", headers=NS,
                                                body={"model": "ml/new", "prompt": "x"}))
            await settle(lambda: rig.gw.holds.count == 1)
            await asyncio.sleep(0.7)   # starting, past the grace
            rig.gw.watches._service_event("MODIFIED", new(1))
            await asyncio.sleep(0.1)
            rig.gw.watches._slice_event("ADDED", slice_for("new", rig.upstream.port))
            assert (await asyncio.wait_for(task, 5)).status == 200
        async with Rig(hold_timeout_seconds=1.0) as rig:
            rig.gw.watches._service_event("ADDED", new(0))
            task = asyncio.create_task(rig.call("POST", "/v1/completions", headers=NS,
                                                body={"model": "ml/new", "prompt": "x"}))
            await asyncio.sleep(0.8)
            rig.gw.watches._service_event("MODIFIED", new(1))   # ready, and its slice not there by the deadline
            reply = await asyncio.wait_for(task, 5)
            assert (reply.status, reply.error["code"]) == (503, "model_starting")
    run(scenario)


def test_a_request_waits_one_hold_timeout_whatever_its_waits():
    """A request waits for a replica, then for its model's chat template, then again to be sent:
    each wait began its own hold timeout, and a hold of 1 s answered its 503 after 1.8 s."""
    async def scenario():
        async with Rig(hold_timeout_seconds=1.0) as rig:
            rig.gw.watches._service_event("ADDED", isvc("cold", fmt="python", openai={"enabled": True}, **COLD))

            async def gone(request):   # the replica's config is asked for, and the replica goes
                rig.gw.watches._slice_event("DELETED", slice_for("cold", rig.upstream.port))
                await asyncio.sleep(0.05)
                return web.json_response({"parameters": {}})

            rig.upstream.answer = gone
            started = asyncio.get_running_loop().time()
            task = asyncio.create_task(rig.call("POST", "/v1/chat/completions", headers=NS, body={
                "model": "ml/cold", "messages": [{"role": "user", "content": "x"}]}))
            await asyncio.sleep(0.8)
            rig.gw.watches._slice_event("ADDED", slice_for("cold", rig.upstream.port))
            reply = await asyncio.wait_for(task, 5)
            took = asyncio.get_running_loop().time() - started
            assert (reply.status, reply.error["code"]) == (503, "model_starting") and took < 1.4, took
    run(scenario)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v2/models/llama/generate"])
@pytest.mark.parametrize("change, status", [("revoked", 401), ("narrowed", 403)])
def test_a_request_whose_key_is_revoked_or_narrowed_while_its_body_arrives_never_reaches_the_model(
        route, change, status):
    """The key was checked when the head came, and the body may take body_timeout_seconds: a key
    revoked (or moved to another namespace) meanwhile still had that request answered by the
    model. It is answered as a new request would be."""
    async def scenario():
        async with Rig() as rig:
            body = json.dumps({"model": "ml/llama", "messages": [{"role": "user", "content": "hi"}]}
                              if route.startswith("/v1") else {"text_input": "x"}).encode()
            reader, writer = await connect(rig.port)
            writer.write(f"POST {route} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                         f"X-Inference-Namespace: ml\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:5])
            await writer.drain()
            await settle(lambda: rig.gw.in_flight.by_key)
            rig.gw.auth.grants = k.parse(f"keys: [{{name: b, key: {KEY_B}, namespaces: [ml]}}]" if change == "revoked"
                                         else f"keys: [{{name: a, key: {KEY_A}, namespaces: [lab]}}]", "k")
            writer.write(body[5:])
            await writer.drain()
            reply = await asyncio.wait_for(read_reply(reader), 5)
            writer.close()
            assert reply.status == status and reply.error["code"] == (
                "invalid_api_key" if status == 401 else "model_not_allowed")
            assert rig.upstream.seen == []
    run(scenario)


def test_a_held_request_looks_again_when_a_relist_drops_its_service_or_its_key_file_changes(tmp_path):
    """Held requests looked again only on a service's or a slice's watch event. A service gone while
    the watch reconnected (learned from the relist), or a key revoked by the key file, left them
    held, their places in the hold queue and their bytes taken, until the hold timeout (300 s),
    then a 503 that said the model may still be starting. They are answered at once now, as a
    new request would be."""
    async def scenario():
        keys = tmp_path / "keys.yaml"
        keys.write_text(f"keys: [{{name: a, key: {KEY_A}, namespaces: [ml]}}]")
        async with Rig(hold_timeout_seconds=30, key_files=[str(keys)]) as rig:
            rig.gw.auth.refresh_keys()
            cold = isvc("cold", autoscaling={"minReplicas": 0, "maxReplicas": 1})
            rig.gw.watches._service_event("ADDED", cold)
            task = asyncio.create_task(rig.call("POST", "/v1/completions", body={"model": "ml/cold", "prompt": "x"}))
            await settle(lambda: rig.gw.holds.count == 1)
            rig.gw.watches._services_listed(None)([isvc("llama")])          # ml/cold is gone
            reply = await asyncio.wait_for(task, 5)
            assert (reply.status, reply.error["code"]) == (404, "model_not_found")

            rig.gw.watches._service_event("ADDED", cold)
            task = asyncio.create_task(rig.call("POST", "/v1/completions", body={"model": "ml/cold", "prompt": "x"}))
            await settle(lambda: rig.gw.holds.count == 1)
            keys.write_text(f"keys: [{{name: b, key: {KEY_B}, namespaces: [ml]}}]")
            rig.gw.auth.refresh_keys()                                      # what the reload loop does
            reply = await asyncio.wait_for(task, 5)
            assert (reply.status, reply.error["code"]) == (401, "invalid_api_key")
            assert rig.gw.holds.count == 0 and rig.upstream.seen == []
    run(scenario)
