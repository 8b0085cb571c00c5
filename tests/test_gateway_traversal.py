"""Traversal: the KServe v2 pass-through, driven in process over real sockets. Every traversal and
smuggling variant an attacker tried (issue 19) gets its exact answer and reaches nothing at the
upstream; the allowed routes reach exactly the service's model path. The upstream is a recording
stand-in for Triton (tests/gateway_http.py says why)."""

from __future__ import annotations

import json

import pytest

from triton_operator.gateway import passthrough as p
from triton_operator.gateway.auth import cache_scope

from .gateway_http import KEY_A, KEY_B, Rig, isvc, run, slice_for

BAD_PATH = "bad_path"
PERCENT = "percent-encoded characters are not accepted in /v2 paths"
DOTS = "empty or dot segments are not accepted in /v2 paths"
CHARS = "a /v2 path may hold only letters, digits, '/', '.', '_' and '-'"
QUERY = "query strings are not accepted on the /v2 routes"
NOT_ALLOWED = ("the gateway passes through only a model's metadata, ready, config, infer, generate and "
               "generate_stream routes")
NAME = "the model name in a /v2 path must be an InferenceService name (lower-case letters, digits and '-')"
VERSION = "a model version must be a positive integer: /v2/models/NAME/versions/N"
NOT_V2_MODELS = "not a /v2/models route"

HOSTILE = [
    # (method, request target as sent, status, code, message)
    # the traversals of the issue, as a key scoped to ml/llama sent them
    ("POST", "/v2/models/llama/..%2f..%2frepository/index", 400, BAD_PATH, PERCENT),
    ("POST", "/v2/models/llama/%2e%2e/%2e%2e/repository/models/x/unload", 400, BAD_PATH, PERCENT),
    ("POST", "/v2/models/llama/%2e%2e%2f%2e%2e%2fsystemsharedmemory%2fregion%2fr%2fregister", 400, BAD_PATH, PERCENT),
    ("POST", "/v2/models/llama/%2e%2e%2fother%2fversions%2f1%2finfer", 400, BAD_PATH, PERCENT),
    ("GET", "/v2/models/llama/x%3Fy=1", 400, BAD_PATH, PERCENT),
    # other encodings of the same
    ("POST", "/v2/models/llama/%2E%2E/%2E%2E/repository/index", 400, BAD_PATH, PERCENT),
    ("POST", "/v2/models/llama/%252e%252e/repository/index", 400, BAD_PATH, PERCENT),
    ("POST", "/v2/models/llama%2f..%2f..%2frepository/index", 400, BAD_PATH, PERCENT),
    ("POST", "/v2/models/llama/%5c..%5crepository", 400, BAD_PATH, PERCENT),
    ("GET", "/v2/models/llama/%00", 400, BAD_PATH, PERCENT),
    ("POST", "/v2/models/llama/infer%3f", 400, BAD_PATH, PERCENT),
    # literal dot and empty segments
    ("POST", "/v2/models/llama/../../repository/index", 400, BAD_PATH, DOTS),
    ("POST", "/v2/models/llama/../other/infer", 400, BAD_PATH, DOTS),
    ("POST", "/v2/models/llama/./infer", 400, BAD_PATH, DOTS),
    ("POST", "/v2/models/llama//infer", 400, BAD_PATH, DOTS),
    ("POST", "/v2/models/llama/infer/", 400, BAD_PATH, DOTS),
    ("POST", "/v2/models/../repository/index", 400, BAD_PATH, DOTS),
    ("POST", "/v2/models/llama/versions/1/../../other/infer", 400, BAD_PATH, DOTS),
    # characters no route uses
    ("POST", "/v2/models/llama/..\\..\\repository", 400, BAD_PATH, CHARS),
    ("POST", "/v2/models/llama;x=1/infer", 400, BAD_PATH, CHARS),
    ("POST", "/v2/models/llama/infer;jsessionid=1", 400, BAD_PATH, CHARS),
    ("POST", "/v2/models/llama/infer~", 400, BAD_PATH, CHARS),
    # query strings (a smuggled ?x= would have reached Triton)
    ("POST", "/v2/models/llama/infer?x=1", 400, BAD_PATH, QUERY),
    ("GET", "/v2/models/llama?", 400, BAD_PATH, QUERY),
    ("GET", "/v2/models/llama/ready?model=other", 400, BAD_PATH, QUERY),
    # routes outside the allow-list, without any trick
    ("GET", "/v2/models/llama/stats", 404, "route_not_allowed", NOT_ALLOWED),
    ("GET", "/v2/models/llama/versions/1/stats", 404, "route_not_allowed", NOT_ALLOWED),
    ("POST", "/v2/models/llama/trace/setting", 404, "route_not_allowed", NOT_ALLOWED),
    ("POST", "/v2/models/llama/load", 404, "route_not_allowed", NOT_ALLOWED),
    ("POST", "/v2/models/llama/infer/extra", 404, "route_not_allowed", NOT_ALLOWED),
    ("GET", "/v2/logging", 404, "not_found", NOT_V2_MODELS),
    ("POST", "/v2/repository/index", 404, "not_found", NOT_V2_MODELS),
    ("POST", "/v2/repository/models/llama/unload", 404, "not_found", NOT_V2_MODELS),
    ("POST", "/v2/systemsharedmemory/region/r/register", 404, "not_found", NOT_V2_MODELS),
    ("POST", "/v2/cudasharedmemory/region/r/register", 404, "not_found", NOT_V2_MODELS),
    ("GET", "/v2/trace/setting", 404, "not_found", NOT_V2_MODELS),
    ("GET", "/v2", 404, "not_found", NOT_V2_MODELS),
    ("GET", "/v2/health/ready", 404, "not_found", NOT_V2_MODELS),
    # names and versions
    ("POST", "/v2/models/LLAMA/infer", 400, BAD_PATH, NAME),
    ("POST", "/v2/models/-llama/infer", 400, BAD_PATH, NAME),
    ("POST", "/v2/models/" + "a" * 64 + "/infer", 400, BAD_PATH, NAME),
    ("POST", "/v2/models/llama/versions/0/infer", 400, BAD_PATH, VERSION),
    ("POST", "/v2/models/llama/versions/x1/infer", 400, BAD_PATH, VERSION),
    ("GET", "/v2/models/llama/versions", 400, BAD_PATH, VERSION),
    ("POST", "/v2/models/llama/versions/1234567890123456789/infer", 400, BAD_PATH, VERSION),
    # in absolute form, the path as sent: nothing resolved before it is checked
    ("POST", "http://gateway.example/v2/models/x/../llama/infer", 400, BAD_PATH, DOTS),
    ("POST", "http://gateway.example/v2/models/%6clama/infer", 400, BAD_PATH, PERCENT),
    ("GET", "http://gateway.example/v2/logging", 404, "not_found", NOT_V2_MODELS),
]


@pytest.mark.parametrize("method, target, status, code, message", HOSTILE, ids=[h[1] for h in HOSTILE])
def test_hostile_v2_paths_are_refused_before_routing_and_reach_nothing(method, target, status, code, message):
    async def scenario():
        async with Rig() as rig:
            for key in (KEY_B, None):   # scoped to ml/llama, and no key at all: the path is checked first
                reply = await rig.call(method, target, key=key, body=b'{"inputs": []}' if method == "POST" else b"")
                assert (reply.status, reply.error["code"], reply.error["message"]) == (status, code, message), target
                assert reply.error["type"] == "invalid_request_error"
            assert rig.upstream.seen == []
    run(scenario)


def test_stats_under_a_service_named_stats_is_still_not_a_route():
    """/v2/models/stats is Triton's statistics of every model; here it would be the metadata of a
    service called "stats", which the allow-list maps to /v2/models/<its model>, never to Triton's."""
    assert p.check("/v2/models/stats", "GET") == p.V2Call("stats", None, "")
    assert p.V2Call("stats", None, "").upstream_path("stats_model") == "/v2/models/stats_model"


def test_a_model_named_stats_never_reaches_tritons_statistics_of_every_model():
    """GET /v2/models/stats is matched by Triton before its model routes: a service whose Triton
    model is called "stats" (the CRD refuses it now; an older object may hold it) gets a 502 on
    that one route and reaches nothing; its other routes are the model's own."""
    with pytest.raises(p.PathRefused) as e:
        p.V2Call("stats", None, "").upstream_path("stats")
    assert (e.value.status, e.value.code) == (502, "bad_model_name")
    assert p.V2Call("stats", None, "/ready").upstream_path("stats") == "/v2/models/stats/ready"
    assert p.V2Call("stats", "1", "").upstream_path("stats") == "/v2/models/stats/versions/1"

    async def scenario():
        async with Rig() as rig:
            rig.gw.router.set_service(isvc("stats", fmt="onnx"))
            rig.gw.router.set_slice(slice_for("stats", rig.upstream.port))
            reply = await rig.call("GET", "/v2/models/stats", headers={"X-Inference-Namespace": "ml"})
            assert (reply.status, reply.error["code"]) == (502, "bad_model_name")
            assert rig.upstream.seen == []
            reply = await rig.call("GET", "/v2/models/stats/ready", headers={"X-Inference-Namespace": "ml"})
            assert reply.status == 200 and [s.raw_path for s in rig.upstream.seen] == ["/v2/models/stats/ready"]
    run(scenario)


ALLOWED = [
    ("GET", "/v2/models/llama", "/v2/models/llm"),
    ("HEAD", "/v2/models/llama/ready", "/v2/models/llm/ready"),
    ("GET", "/v2/models/llama/ready", "/v2/models/llm/ready"),
    ("GET", "/v2/models/llama/config", "/v2/models/llm/config"),
    ("POST", "/v2/models/llama/generate", "/v2/models/llm/generate"),
    ("POST", "/v2/models/llama/generate_stream", "/v2/models/llm/generate_stream"),
    ("GET", "/v2/models/llama/versions/1", "/v2/models/llm/versions/1"),
    ("GET", "/v2/models/llama/versions/2/ready", "/v2/models/llm/versions/2/ready"),
    ("POST", "/v2/models/llama/versions/3/generate", "/v2/models/llm/versions/3/generate"),
    ("POST", "/v2/models/resnet/infer", "/v2/models/resnet/infer"),
    ("POST", "/v2/models/resnet/versions/3/infer", "/v2/models/resnet/versions/3/infer"),
    ("POST", "/v2/models/resnet/generate", "/v2/models/resnet/generate"),
    # the absolute form a server must accept (RFC 9112 3.2.2): its path (the OpenAI routes took it)
    ("GET", "http://gateway.example/v2/models/llama", "/v2/models/llm"),
    ("POST", "http://gateway.example:8080/v2/models/resnet/infer", "/v2/models/resnet/infer"),
]


@pytest.mark.parametrize("method, target, upstream", ALLOWED, ids=[a[1] for a in ALLOWED])
def test_allowed_routes_reach_exactly_the_services_model(method, target, upstream):
    async def scenario():
        async with Rig() as rig:
            body = b'{"inputs": []}' if method == "POST" else b""
            reply = await rig.call(method, target, key=KEY_A, body=body, headers={"X-Inference-Namespace": "ml"})
            assert reply.status == 200, reply.body
            [seen] = rig.upstream.seen
            assert (seen.method, seen.raw_path) == (method, upstream)
            assert seen.headers["Accept-Encoding"] == "identity"   # nothing the client did not ask for
            assert "Authorization" not in seen.headers             # the tenant's key stays at the gateway
            if method == "POST" and "/llama/" in target:   # an LLM's generate gets its default max_tokens
                assert json.loads(seen.body) == {"inputs": [], "max_tokens": 256, "cache_salt": cache_scope("a")}
            elif method == "POST" and "/generate" in target:   # the document as checked, re-encoded
                assert seen.body == b'{"inputs":[]}'
            elif method == "POST":
                assert seen.body == body
    run(scenario)


def test_an_llm_service_has_no_infer_route():
    """Its model is decoupled (Triton answers it through generate only); /infer would also be a way
    around the key's max_tokens and token budget."""
    async def scenario():
        async with Rig() as rig:
            for target in ("/v2/models/llama/infer", "/v2/models/llama/versions/2/infer"):
                reply = await rig.call("POST", target, body=b"{}", headers={"X-Inference-Namespace": "ml"})
                assert (reply.status, reply.error["code"], reply.error["message"]) == (
                    404, "route_not_allowed", "model llama is an LLM: send its requests to /v2/models/llama/generate "
                                              "or generate_stream, or to the OpenAI routes")
            assert rig.upstream.seen == []
    run(scenario)


def test_methods_outside_a_route_get_405_with_allow():
    async def scenario():
        async with Rig() as rig:
            for method, target, allow in (("GET", "/v2/models/llama/infer", "POST"),
                                          ("DELETE", "/v2/models/llama", "GET"),
                                          ("PUT", "/v2/models/llama/generate", "POST")):
                reply = await rig.call(method, target)
                assert reply.status == 405 and reply.headers["allow"] == allow
                assert reply.error == {"message": f"{method} is not allowed on this route; use {allow}",
                                       "type": "invalid_request_error", "param": None, "code": "method_not_allowed"}
            reply = await rig.call("GET", "/v1/chat/completions")
            assert (reply.status, reply.headers["allow"], reply.error["code"]) == (405, "POST", "method_not_allowed")
            assert rig.upstream.seen == []
    run(scenario)


def test_upstream_error_text_stays_at_the_gateway():
    """Triton's error texts named internal shared-memory regions (the first step of the
    CVE-2025-23319 chain) and may echo other input: the client gets a fixed text."""
    from aiohttp import web

    async def leaky(request):
        return web.json_response({"error": "failed to open shared memory region triton_python_backend_shm_region_7"},
                                 status=400)

    async def scenario():
        async with Rig() as rig:
            rig.upstream.answer = leaky
            reply = await rig.call("POST", "/v2/models/resnet/infer", body=b"{}")
            assert (reply.status, reply.error["message"], reply.error["code"]) == \
                (400, "model resnet refused the request (HTTP 400)", "model_error")
            assert b"shm" not in reply.body
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "hi"})
            assert (reply.status, reply.error["message"]) == (400, "model llama refused the request (HTTP 400)")
            assert b"shm" not in reply.body
    run(scenario)


def test_server_header_names_no_library_version():
    async def scenario():
        async with Rig() as rig:
            for target in ("/healthz", "/v2/models/llama/ready", "/nowhere"):
                reply = await rig.call("GET", target)
                assert reply.headers["server"] == "triton-operator-gateway", target
    run(scenario)


def test_compressed_answers_only_when_the_client_asked():
    async def scenario():
        async with Rig() as rig:
            await rig.call("GET", "/v2/models/llama/config", headers={"X-Inference-Namespace": "ml",
                                                                       "Accept-Encoding": "gzip"})
            await rig.call("GET", "/v2/models/llama/config", headers={"X-Inference-Namespace": "ml"})
            assert [s.headers["Accept-Encoding"] for s in rig.upstream.seen] == ["gzip", "identity"]
    run(scenario)


def test_a_service_whose_model_name_is_not_a_path_segment_is_not_served():
    from triton_operator.gateway import routing as r

    from .gateway_http import isvc

    assert r.service_from(isvc("x", model={"format": "python", "name": "..", "source": "hf://a/b"})) is None
    assert r.service_from(isvc("x", fmt="python", openai={"model": "a/b"})) is None
    with pytest.raises(p.PathRefused) as e:
        p.V2Call("x", None, "/infer").upstream_path("..")
    assert e.value.status == 502
