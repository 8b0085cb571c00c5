"""/v1/embeddings (gateway/embeddings.py, and the route in process): the request, the call to the
embedding model's generate endpoint, its flattened answer back into vectors (float or base64, as
the official client decodes them), and every bad request or answer refused with the reason."""

from __future__ import annotations

import base64
import json
import struct

import pytest
from aiohttp import web
from openai.types import CreateEmbeddingResponse

from triton_operator.api import InferenceService
from triton_operator.gateway import embeddings as e
from triton_operator.gateway import keys as k
from triton_operator.gateway import openai_schema as oai
from triton_operator.gateway.routing import service_from

from .gateway_http import KEY_A, Rig, isvc, run, slice_for


def req(**body) -> e.EmbeddingsRequest:
    return e.parse(json.dumps({"model": "m", **body}).encode())


def test_a_string_or_a_list_of_strings_is_one_batch_for_the_model():
    assert e.generate_body(req(input="hi")) == {"text_input": ["hi"]}
    assert req(input="hi", encoding_format=None).encoding_format == "float"   # OpenAI's null: its default
    assert e.generate_body(req(input=["a", "b"])) == {"text_input": ["a", "b"]}


@pytest.mark.parametrize("body, param, words", [
    ({"input": [1, 2, 3]}, "input", "token arrays are not supported: send text"),
    ({"input": [[1, 2]]}, "input", "token arrays are not supported: send text"),
    ({"input": []}, "input", "give 1 to 256 strings"),
    ({"input": ["x"] * 257}, "input", "give 1 to 256 strings"),
    ({"input": ""}, "input", "an empty string has no embedding"),
    ({"input": ["a", ""]}, "input", "an empty string has no embedding"),   # named "input.constrained-str"
    ({"input": [True]}, "input", "give strings"),                           # read as a token array
    ({"input": ["a", None]}, "input", "give strings"),
    ({"input": "x", "dimensions": 64}, "dimensions", "shortened embeddings are not supported by this gateway"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", None),
    ({"input": "x", "frobnicate": 1}, "frobnicate", None),
])
def test_bad_requests_are_400s_naming_the_field(body, param, words):
    with pytest.raises(oai.OpenAIError) as err:
        req(**body)
    assert (err.value.status, err.value.param.split(".")[0]) == (400, param)
    if body.get("input") in ("", ["a", ""], [True], ["a", None]):
        assert err.value.param == "input"
    if words:
        assert words in err.value.message


def test_the_flattened_answer_is_one_vector_per_input_in_either_encoding():
    rows, tokens = e.vectors({"embedding": [0.5, -0.25, 1.0, 0.0], "prompt_tokens": 7}, 2)
    assert (rows, tokens) == ([[0.5, -0.25], [1.0, 0.0]], 7)
    out = e.response(req(input=["a", "b"], encoding_format="base64"), "ml/embed", rows, tokens)
    assert struct.unpack("<2f", base64.b64decode(out["data"][1]["embedding"])) == (1.0, 0.0)
    parsed = CreateEmbeddingResponse.model_validate(e.response(req(input=["a", "b"]), "ml/embed", rows, tokens))
    assert parsed.data[0].embedding == [0.5, -0.25] and parsed.usage.prompt_tokens == 7


@pytest.mark.parametrize("answer, message", [
    ({"embedding": [0.1, 0.2, 0.3]}, "the embedding model's answer has no embedding output of 2 vectors"),
    ({"text_output": "x"}, "the embedding model's answer has no embedding output of 2 vectors"),
    ({"embedding": [0.1, "x"]}, "the embedding model's answer holds an embedding value that is not a finite number"),
])
def test_an_answer_that_is_not_the_vectors_asked_for_is_a_502(answer, message):
    with pytest.raises(oai.OpenAIError) as err:
        e.vectors(answer, 2)
    assert (err.value.status, err.value.message) == (502, message)


def test_only_a_model_of_another_format_can_be_an_embedding_model():
    spec = {"model": {"source": "hf://a/b", "format": "tensorrt-llm"}, "gpu": {"class": "h100"},
            "openai": {"task": "embeddings"}}
    with pytest.raises(ValueError, match="openai.task embeddings needs a model of another format"):
        InferenceService.model_validate({"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
                                         "metadata": {"name": "x", "namespace": "ml"}, "spec": spec})
    svc = service_from(isvc("embed", fmt="python", model={"source": "hf://a/b", "format": "python", "name": "embed"},
                            openai={"task": "embeddings"}))
    assert svc is not None and svc.embeddings and svc.generate_model == "embed"


def test_the_route_in_process():
    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        body = json.loads(await request.read())
        n = len(body["text_input"])
        return web.json_response({"embedding": [float(i) for i in range(3 * n)], "prompt_tokens": 4 * n})

    async def scenario():
        async with Rig() as rig:
            rig.gw.router.set_service(isvc("embed", model={"source": "hf://a/b", "format": "python", "name": "embed"},
                                           openai={"task": "embeddings"}))
            rig.gw.router.set_slice(slice_for("embed", rig.upstream.port, "ml"))
            rig.upstream.answer = answer
            reply = await rig.call("POST", "/v1/embeddings", body={"model": "ml/embed", "input": ["a", "b"]})
            assert reply.status == 200
            assert [d["embedding"] for d in reply.json()["data"]] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
            assert reply.json()["usage"] == {"prompt_tokens": 8, "total_tokens": 8}
            assert rig.upstream.seen[-1].raw_path == "/v2/models/embed/generate"
            reply = await rig.call("POST", "/v1/embeddings", body={"model": "ml/llama", "input": "a"})
            assert (reply.status, reply.error["code"]) == (400, "wrong_model_task")
            reply = await rig.call("POST", "/v1/chat/completions", body={
                "model": "ml/embed", "messages": [{"role": "user", "content": "x"}]})
            assert (reply.status, reply.error["message"]) == (
                400, "model 'ml/embed' is an embedding model: send it to /v1/embeddings")
    run(scenario)


def test_the_embedding_model_is_reached_through_v1_embeddings_only():
    """Its v2 inference routes spent none of the key's tokensPerMinute and took any number of
    inputs: a key with 1,000 tokens a minute sent 20 generate requests of 600 KB each, and one
    infer of 1,000 inputs. They are refused; its metadata and readiness stay reachable."""
    async def scenario():
        async with Rig() as rig:
            rig.gw.auth.grants = k.parse(f"keys: [{{name: t, key: {KEY_A}, namespaces: [ml], tokensPerMinute: 1000}}]",
                                         "k")
            rig.gw.router.set_service(isvc("embed", model={"source": "hf://a/b", "format": "python", "name": "embed"},
                                           openai={"task": "embeddings"}))
            rig.gw.router.set_slice(slice_for("embed", rig.upstream.port, "ml"))
            ns = {"X-Inference-Namespace": "ml"}
            expected = (404, {"message": "model embed serves embeddings: send its requests to /v1/embeddings",
                              "type": "invalid_request_error", "param": None, "code": "route_not_allowed"})
            for path, body in [
                ("/v2/models/embed/generate", {"text_input": ["x" * 60000] * 10}),
                ("/v2/models/embed/generate_stream", {"text_input": ["x"]}),
                ("/v2/models/embed/versions/1/generate", {"text_input": ["x"]}),
                ("/v2/models/embed/infer", {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1000],
                                                        "data": ["y"] * 1000}]}),
            ]:
                reply = await rig.call("POST", path, body=body, headers=ns)
                assert (reply.status, reply.error) == expected, path
            assert rig.upstream.seen == []
            reply = await rig.call("GET", "/v2/models/embed/ready", headers=ns)
            assert reply.status == 200
            assert [s.raw_path for s in rig.upstream.seen] == ["/v2/models/embed/ready"]
    run(scenario)
