"""The gateway's pure parts (keys, translation, routing) and its decisions (who may use what,
holding and waking), without network. The real Triton, the real openai client and the real
cluster are in e2e/test_gateway.py."""

from __future__ import annotations

import asyncio
import json
import secrets

import pytest

from triton_operator.gateway import keys as k
from triton_operator.gateway import openai_schema as oai
from triton_operator.gateway import routing as r
from triton_operator.gateway import translate as t
from triton_operator.gateway.config import GatewaySettings, GatewaySettingsError, from_env
from triton_operator.gateway.server import Gateway

from .gateway_http import KEY_A, KEY_B

KEY_C = "sk-" + secrets.token_urlsafe(32)

ZEROS = "0" * 64


# -- keys -------------------------------------------------------------------------------------------

def test_key_list_keeps_digests_only():
    grants = k.parse(f"""
keys:
  - {{name: a, key: {KEY_A}, namespaces: [ml]}}
  - {{name: b, sha256: {k.digest(KEY_B)}, services: [vision/resnet]}}
""", "keys.yaml")
    assert set(grants) == {k.digest(KEY_A), k.digest(KEY_B)}
    assert KEY_A not in repr(grants) and KEY_A not in k.to_json(grants)
    a, b = grants[k.digest(KEY_A)], grants[k.digest(KEY_B)]
    assert a.allows(("ml", "x")) and not a.allows(("other", "x"))
    assert b.allows(("vision", "resnet")) and not b.allows(("vision", "other"))
    assert a.may_hold_name("anything") and b.may_hold_name("resnet") and not b.may_hold_name("llama")
    assert k.parse(k.to_json(grants), "round-trip") == grants


@pytest.mark.parametrize("text, words", [
    ("keys: [{name: a, key: short, namespaces: [ml]}]", "too weak (5 characters, at least 32 needed)"),
    ("keys: [{name: a, key: sk-team-a-0123456789abcdef0123456789, namespaces: [ml]}]",
     "too weak (it holds a run of repeated or consecutive characters)"),
    ("keys: [{name: a, key: Passw0rd!Passw0rd!Passw0rd!Passw0rd!, namespaces: [ml]}]",
     "too weak (too few distinct characters)"),
    (f"keys: [{{name: a, key: {KEY_A}, namespaces: [ml], maxInFlight: 1.5}}]", "maxInFlight must be a positive integer"),
    (f"keys: [{{name: a, key: {KEY_A}, namespaces: [ml], tokensPerMinute: -1}}]",
     "tokensPerMinute must be a positive finite number"),
    (f"keys: [{{name: a, key: {KEY_A}}}]", "grants nothing"),
    (f"keys: [{{name: a, key: {KEY_A}, sha256: '{ZEROS}', namespaces: [ml]}}]", "exactly one of key or sha256"),
    ("keys: [{name: a, sha256: xyz, namespaces: [ml]}]", "64 hexadecimal digits"),
    (f"keys: [{{name: a, key: {KEY_A}, services: [llama]}}]", "NAMESPACE/NAME"),
    (f"keys: [{{name: a, key: {KEY_A}, namespaces: [ml], requestsPerMinute: 0}}]", "positive finite number"),
    # NaN compares false with every bound: read as a limit, it let every request through.
    (f"keys: [{{name: a, key: {KEY_A}, namespaces: [ml], requestsPerMinute: .nan}}]",
     "requestsPerMinute must be a positive finite number"),
    (f"keys: [{{name: a, key: {KEY_A}, namespaces: [ml], tokensPerMinute: .inf}}]",
     "tokensPerMinute must be a positive finite number"),
    (f"keys: [{{name: a, key: {KEY_A}, namespaces: [ml], requestsPerMinute: {'9' * 401}}}]",
     "requestsPerMinute must be a positive finite number"),   # every request overflowed the limiter
    (f"keys: [{{name: a, key: {KEY_A}, namespaces: [ml], typo: 1}}]", "unknown field(s) typo"),
    (f"keys: [{{name: a, key: {KEY_A}, namespaces: [ml]}}, {{name: b, key: {KEY_A}, namespaces: [x]}}]",
     "listed twice"),
    ("keys: {a: 1}", "expected a list"),
    ("keys: [\n", "not valid YAML"),
])
def test_bad_key_lists_are_refused_naming_the_entry_never_the_key(text, words):
    with pytest.raises(k.KeyFileError) as e:
        k.parse(text, "keys.yaml")
    assert words in str(e.value) and str(e.value).startswith("keys.yaml")
    assert KEY_A not in str(e.value)


def test_a_key_in_two_files_is_refused():
    one = k.parse(f"keys: [{{name: a, key: {KEY_A}, namespaces: [ml]}}]", "one")
    with pytest.raises(k.KeyFileError, match="also listed as a"):
        k.merge([("one", one), ("two", k.parse(f"keys: [{{name: z, key: {KEY_A}, namespaces: [x]}}]", "two"))])


def test_unnamed_keys_are_each_a_tenant_of_their_own():
    """The name is the tenant (its usage, its prompt-cache scope). Unnamed keys were numbered per
    file: the first of every file was "key-0", so the tenants of two files shared a prompt-cache
    scope (each could see the other's cached prefixes) and a line of usage, and an unnamed second
    key shared both with a key named "key-1"."""
    from triton_operator.gateway.auth import cache_scope
    a = k.parse(f"keys: [{{key: {KEY_A}, namespaces: [ml]}}]", "tenant-a.yaml")
    b = k.parse(f"keys: [{{key: {KEY_B}, namespaces: [ml]}}]", "tenant-b.yaml")
    grants = k.merge([("tenant-a.yaml", a), ("tenant-b.yaml", b)])
    name_a, name_b = grants[k.digest(KEY_A)].name, grants[k.digest(KEY_B)].name
    assert (name_a, name_b) == (f"key-{k.digest(KEY_A)[:12]}", f"key-{k.digest(KEY_B)[:12]}")
    assert cache_scope(name_a) != cache_scope(name_b)
    assert KEY_A not in name_a and KEY_B not in name_b
    # the same key listed by its digest is the same tenant
    assert k.parse(f"keys: [{{sha256: {k.digest(KEY_A)}, namespaces: [ml]}}]", "x")[k.digest(KEY_A)].name == name_a
    # named keys keep their names, and keys of one name still share (a key being rotated)
    named = k.parse(f"keys: [{{name: team, key: {KEY_A}, namespaces: [ml]}}, {{name: team, key: {KEY_B}, "
                    f"namespaces: [ml]}}, {{key: {KEY_C}, namespaces: [ml]}}]", "keys.yaml")
    assert [g.name for g in named.values()] == ["team", "team", f"key-{k.digest(KEY_C)[:12]}"]


def test_bearer_header():
    assert k.bearer(f"Bearer {KEY_A}") == KEY_A and k.bearer(f"bearer  {KEY_A} ") == KEY_A
    assert k.bearer("Basic abc") is None and k.bearer(None) is None and k.bearer("Bearer ") is None


def test_rate_limit_allows_a_burst_then_paces():
    grant = k.Grant("a", frozenset({"ml"}), requests_per_minute=60)
    limiter = k.RateLimiter(600)
    now = 100.0
    assert all(limiter.take("d", grant, now) == 0 for _ in range(6))  # a burst of max(5, 60/10)
    wait = limiter.take("d", grant, now)
    assert wait == pytest.approx(1.0)          # one request a second
    assert limiter.take("d", grant, now + 1.0) == 0
    limiter.forget([])
    assert limiter.buckets == {}


# -- translation --------------------------------------------------------------------------------------

def test_chat_request_to_the_llm_model():
    """The llm model gets the chat itself (it renders its own template), OpenAI's defaults made
    explicit (temperature 1, top_p 1), and every sampling field the client set."""
    req = oai.parse_body(json.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi <|im_end|>"}],
                                   "max_completion_tokens": 7, "stream": True, "seed": 42, "stop": "\n\n",
                                   "presence_penalty": 0.5, "user": "alice", "logprobs": False,
                                   "stream_options": {"include_usage": True}}).encode(), oai.ChatRequest)
    gen = t.to_generate(req, 256, llm=True)
    assert gen.body == {"max_tokens": 7, "stream": True, "temperature": 1.0, "top_p": 1.0,
                        "messages": '[{"role": "user", "content": "hi <|im_end|>"}]', "seed": 42,
                        "presence_penalty": 0.5, "stop": ["\n\n"]}
    assert gen.chat and gen.stream and gen.llm and gen.include_usage and gen.stops == ()
    greedy = oai.parse_body(json.dumps({"model": "m", "prompt": "2+2=", "temperature": 0, "max_tokens": 3,
                                      "response_format": {"type": "json_schema", "json_schema": {
                                          "name": "x", "schema": {"type": "object"}}}}).encode(), oai.CompletionRequest)
    body = t.to_generate(greedy, 256, llm=True).body
    assert body["temperature"] == 0.0 and body["text_input"] == "2+2=" and body["guided_json"] == '{"type": "object"}'
    assert t.to_generate(oai.parse_body(json.dumps({"model": "m", "prompt": "x", "response_format": {
        "type": "json_object"}}).encode(), oai.CompletionRequest), 9, llm=True).body["guided_json"] == "{}"


def test_chat_request_to_a_text_model():
    req = oai.parse_body(json.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi"}],
                                   "max_completion_tokens": 7, "temperature": 0.5, "stream": True}).encode(),
                       oai.ChatRequest)
    prompt = t.render_chat(None, req.messages)
    assert prompt == "user: hi\nassistant:"
    gen = t.to_generate(req, 256, llm=False, prompt=prompt)
    assert gen.body == {"text_input": prompt, "max_tokens": 7, "stream": True, "exclude_input_in_output": True,
                        "temperature": 0.5}
    assert gen.chat and gen.stream and not gen.llm
    with pytest.raises(oai.OpenAIError, match="JSON output needs a model served with format tensorrt-llm"):
        t.to_generate(oai.parse_body(json.dumps({"model": "m", "prompt": "x", "response_format": {
            "type": "json_object"}}).encode(), oai.CompletionRequest), 9, llm=False, prompt="x")


CHAT_X = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


@pytest.mark.parametrize("extra, param, words", [
    ({"functions": [{"name": "f"}]}, "functions", "the deprecated functions field is not supported: send tools"),
    ({"function_call": "auto"}, "function_call",
     "the deprecated function_call field is not supported: send tool_choice"),
    ({"logit_bias": {"50256": -100}}, "logit_bias", "logit_bias is not supported"),
    ({"modalities": ["text", "audio"]}, "modalities", "only text output is supported"),
    ({"frobnicate": 1}, "frobnicate", "unrecognized request argument"),
])
def test_what_cannot_be_honoured_is_refused_naming_the_field(extra, param, words):
    with pytest.raises(oai.OpenAIError) as e:
        oai.parse_body(json.dumps({**CHAT_X, **extra}).encode(), oai.ChatRequest)
    assert (e.value.status, e.value.param) == (400, param) and e.value.message == f"{param}: {words}" + (
        "" if words.endswith("argument") else " by this gateway")
    assert e.value.code == "unsupported_parameter"


def test_off_values_clients_send_by_default_are_accepted():
    req = oai.parse_body(json.dumps({**CHAT_X, "tools": [], "logprobs": False, "logit_bias": {}, "n": 1,
                                   "user": "u", "metadata": {"a": "b"}, "store": False,
                                   "modalities": ["text"], "response_format": {"type": "text"}}).encode(), oai.ChatRequest)
    assert "guided_json" not in t.to_generate(req, 9, llm=True).body


def test_hugging_face_chat_templates_render_in_the_sandbox():
    template = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}"
                "{% endif %}[{{ m['role'] }}]{{ m['content'] | trim }}{% endfor %}"
                "{% if add_generation_prompt %}[assistant]{% endif %}")
    msgs = [oai.ChatMessage(role="user", content=[{"type": "text", "text": " a "}, {"type": "text", "text": "b"}])]
    assert t.render_chat(template, msgs) == "[user]a b[assistant]"
    with pytest.raises(oai.OpenAIError, match="no system") as e:
        t.render_chat(template, [oai.ChatMessage(role="system", content="x")])
    assert e.value.status == 400
    with pytest.raises(oai.OpenAIError, match="only text content parts") as e:
        oai.parse_body(json.dumps({"model": "m", "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}).encode(), oai.ChatRequest)
    assert e.value.param == "messages.0.content"
    with pytest.raises(oai.OpenAIError) as e:  # the sandbox refuses attribute games
        t.render_chat("{{ messages.__class__.__mro__ }}", msgs)
    assert e.value.status == 400


@pytest.mark.parametrize("body, words", [
    (b"{not json", "not valid JSON"),
    (b"[1]", "must be a JSON object"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), "model: Field required"),
    (json.dumps({"model": "m", "messages": []}).encode(), "messages"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 17}).encode(),
     "n: Input should be less than or equal to 16"),
    (json.dumps({"model": "m", "messages": [{"role": "robot", "content": "x"}]}).encode(), "messages.0.role"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3}).encode(),
     "temperature"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["a"] * 5}).encode(),
     "at most 4"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": "x" * 257}).encode(),
     "of at most 256 characters"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": -1}).encode(), "seed"),
    (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                 "response_format": {"type": "json_schema"}}).encode(), "json_schema.schema must be"),
])
def test_bad_bodies_get_openai_errors(body, words):
    with pytest.raises(oai.OpenAIError) as e:
        oai.parse_body(body, oai.ChatRequest)
    assert e.value.status == 400 and words in e.value.message
    assert set(e.value.body()["error"]) == {"message", "type", "param", "code"}


def test_completion_prompt_must_be_one():
    with pytest.raises(oai.OpenAIError, match="exactly one prompt"):
        oai.parse_body(json.dumps({"model": "m", "prompt": ["a", "b"]}).encode(), oai.CompletionRequest)
    req = oai.parse_body(json.dumps({"model": "m", "prompt": ["a"]}).encode(), oai.CompletionRequest)
    assert req.text() == "a"


def _events(data: bytes) -> list:
    return [json.loads(line[6:]) for line in data.split(b"\n\n") if line.startswith(b"data: {")]


def A(text: str, **kw) -> t.Answer:  # noqa: N802
    return t.Answer(text, **kw)


def test_a_text_models_stream_is_cut_at_a_stop_sequence_spanning_responses():
    gen = t.Generate({}, True, 100, ("END",), "m", chat=True, llm=False)
    s = t.Stream(gen)
    out = s.delta(A(" a")) + s.delta(A(" E")) + s.delta(A("N")) + s.delta(A("D b")) + s.delta(A(" c")) + s.end()
    events = _events(out)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert text == " a "
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert out.endswith(b"data: [DONE]\n\n")
    assert all(e["object"] == "chat.completion.chunk" for e in events)


def test_a_text_models_stream_reports_length_when_max_tokens_is_reached():
    s = t.Stream(t.Generate({}, True, 2, (), "m", chat=False, llm=False))
    events = _events(s.delta(A(" a")) + s.delta(A(" b")) + s.end())
    assert "".join(e["choices"][0]["text"] for e in events) == " a b"
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert events[0]["object"] == "text_completion"


def test_a_long_stop_string_holds_back_only_what_could_begin_it():
    s = t.Stream(t.Generate({}, True, 100, ("x" * 200,), "m", chat=False, llm=False))
    assert _events(s.delta(A("hello world")))[0]["choices"][0]["text"] == "hello world"


def test_an_llm_stream_takes_finish_reason_and_usage_from_the_model():
    gen = t.Generate({}, True, 100, (), "m", chat=True, llm=True, include_usage=True)
    s = t.Stream(gen)
    out = (s.delta(A("The", completion_tokens=1, prompt_tokens=42)) + s.delta(A(" end", completion_tokens=2,
                                                                                 prompt_tokens=42))
           + s.delta(A("", finish_reason="stop", completion_tokens=3, prompt_tokens=42)) + s.end())
    events = _events(out)
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == "The end"
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1] == {**events[-1], "choices": [], "usage": {"prompt_tokens": 42, "completion_tokens": 3,
                                                                 "total_tokens": 45}}
    assert all(e["usage"] is None for e in events[:-1])   # as OpenAI: the others' usage is null
    s = t.Stream(t.Generate({}, True, 2, (), "m", chat=False, llm=True))   # usage only when asked
    events = _events(s.delta(A("a b", finish_reason="length", completion_tokens=2, prompt_tokens=1)) + s.end())
    assert events[-1]["choices"][0]["finish_reason"] == "length" and "usage" not in events[-1]


def test_a_whole_answer_carries_the_models_finish_reason_and_usage():
    gen = t.Generate({}, False, 5, (), "m", chat=True, llm=True)
    out = t.completion(gen, t.answer_of({"text_output": "Paris", "finish_reason": "length", "prompt_tokens": 9,
                                         "completion_tokens": 5}))
    assert out["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": "Paris"},
                                 "finish_reason": "length", "logprobs": None}
    assert out["usage"] == {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}
    text = t.completion(t.Generate({}, False, 5, ("!",), "m", chat=False, llm=False), t.Answer("hi! there"))
    assert text["choices"][0]["text"] == "hi" and "usage" not in text


def test_model_errors_pass_on_only_the_llm_models_own_words():
    with pytest.raises(oai.OpenAIError) as e:
        t.answer_of({"error": "[llm] the prompt is 5000 tokens; this model's context holds 4096"})
    assert (e.value.status, e.value.message) == (400, "the prompt is 5000 tokens; this model's context holds 4096")
    with pytest.raises(oai.OpenAIError) as e:
        t.answer_of({"error": "failed to open shm region triton_python_backend_shm_region_7"})
    assert (e.value.status, e.value.message) == (502, "the model answered with an error")


def test_sse_parsing_keeps_partial_events():
    buf = bytearray(b'data: {"text_output": " a"}\n\ndata: {"text_')
    assert t.sse_events(buf) == ([{"text_output": " a"}], False)
    buf += b'output": " b"}\n\n'
    assert t.sse_events(buf) == ([{"text_output": " b"}], False) and not buf
    with pytest.raises(oai.OpenAIError) as e:
        t.answer_of({"error": "boom"})
    assert e.value.status == 502
    assert t.answer_of({"text_output": [" a", " b"]}).text == " a b"


# -- routing ---------------------------------------------------------------------------------------------

def isvc(name: str, ns: str = "ml", fmt: str = "tensorrt-llm", **spec) -> dict:
    return {"metadata": {"name": name, "namespace": ns},
            "spec": {"model": {"format": fmt, "source": "hf://x/y"}, **spec}}


def eps(service: str, name: str, port: int, *endpoints: tuple[str, bool | None], ns: str = "ml") -> dict:
    return {"metadata": {"name": name, "namespace": ns, "labels": {r.SERVICE_NAME_LABEL: service}},
            "ports": [{"name": "grpc", "port": 8001}, {"name": "http", "port": port}],
            "endpoints": [{"addresses": [a], **({"conditions": {"ready": ready}} if ready is not None else {})}
                          for a, ready in endpoints]}


def test_service_views():
    llm = r.service_from(isvc("llama"))
    assert (llm.generate_model, llm.v2_model, llm.openai, llm.scales_to_zero, llm.llm) == ("llm", "llm", True, False, True)
    onnx = r.service_from(isvc("resnet", fmt="onnx", autoscaling={"minReplicas": 0, "maxReplicas": 2}))
    assert (onnx.generate_model, onnx.v2_model, onnx.openai, onnx.scales_to_zero) == ("resnet", "resnet", False, True)
    custom = r.service_from(isvc("tg", fmt="python", model={"format": "python", "name": "textgen", "source": "hf://a/b"},
                                 openai={"chatTemplate": "T", "defaultMaxTokens": 9}))
    assert (custom.generate_model, custom.openai, custom.chat_template, custom.default_max_tokens) == \
        ("textgen", True, "T", 9)
    degraded = isvc("bad")
    degraded["status"] = {"conditions": [{"type": "Degraded", "status": "True", "reason": "Unschedulable",
                                          "message": "no GPUs"}]}
    assert r.service_from(degraded).degraded == "Unschedulable: no GPUs"
    assert r.service_from({"metadata": {"name": "x", "deletionTimestamp": "now"}, "spec": {}}) is None


def test_endpoints_come_from_ready_slices_and_the_least_loaded_wins():
    router = r.Router()
    router.set_service(isvc("llama"))
    changed = router.set_slice(eps("llama", "llama-a", 8000, ("10.0.0.1", True), ("10.0.0.2", None),
                                   ("10.0.0.3", False)))
    assert changed == {("ml", "llama")}
    assert router.endpoints(("ml", "llama")) == (("10.0.0.1", 8000), ("10.0.0.2", 8000))
    assert router.set_slice(eps("llama", "llama-b", 8000, ("10.0.0.4", True))) == {("ml", "llama")}
    key = ("ml", "llama")
    picks = [router.pick(key) for _ in range(3)]
    assert len(set(picks)) == 3, "idle endpoints take turns"
    for a in picks[:2]:
        router.acquire(a)
    assert router.pick(key) == picks[2], "the endpoint with nothing in flight"
    router.acquire(picks[2])
    router.acquire(picks[2])
    router.release(picks[0])
    assert router.pick(key) == picks[0]
    assert router.set_slice(None, eps("llama", "llama-b", 8000)) == {key}
    assert router.set_slice(None, eps("llama", "llama-a", 8000)) == {key}
    assert router.pick(key) is None
    assert r.url(("fd00::1", 8000)) == "http://[fd00::1]:8000"


def test_a_relist_drops_vanished_slices():
    router = r.Router()
    router.set_slice(eps("a", "a-1", 8000, ("10.0.0.1", True)))
    assert router.replace_slices([eps("b", "b-1", 8000, ("10.0.0.2", True))]) == {("ml", "a"), ("ml", "b")}
    assert router.endpoints(("ml", "a")) == ()


# -- the gateway's decisions ------------------------------------------------------------------------------

def gateway(**settings) -> Gateway:
    gw = Gateway(GatewaySettings(**settings), api=None)
    gw.auth.grants = k.parse(f"""keys:
  - {{name: a, key: {KEY_A}, namespaces: [ml, lab]}}
  - {{name: b, key: {KEY_B}, services: [ml/llama]}}
""", "keys")
    gw.auth.keys_loaded = True
    for obj in (isvc("llama"), isvc("llama", ns="lab"), isvc("secret", ns="vault"), isvc("resnet", fmt="onnx")):
        gw.router.set_service(obj)
    return gw


class FakeRequest:
    def __init__(self, key: str | None, remote: str = "10.1.2.3", forwarded_for: str | None = None):
        from multidict import CIMultiDict   # aiohttp's headers: a field may come as several lines

        self.headers: CIMultiDict[str] = CIMultiDict({"Authorization": f"Bearer {key}"} if key else {})
        if forwarded_for:
            self.headers["X-Forwarded-For"] = forwarded_for
        self.remote = remote


def caller(gw: Gateway, key: str = KEY_A):
    from triton_operator.gateway.auth import Caller

    return Caller(k.digest(key), gw.auth.grants[k.digest(key)])


def test_401_without_a_valid_key_and_429_past_the_rate():
    gw = gateway(requests_per_minute=60)
    for presented in (None, "sk-wrong-000000000000000", KEY_A[:-1] + "x"):
        with pytest.raises(oai.OpenAIError) as e:
            gw.auth.authorize(FakeRequest(presented))
        assert e.value.status == 401
    for _ in range(6):
        gw.auth.authorize(FakeRequest(KEY_A))
    with pytest.raises(oai.OpenAIError) as e:
        for _ in range(6):
            gw.auth.authorize(FakeRequest(KEY_A))
    assert e.value.status == 429 and e.value.retry_after and e.value.retry_after > 0


def test_403_for_what_a_key_may_not_use_whether_or_not_it_exists():
    gw = gateway()
    a, b = gw.auth.grants[k.digest(KEY_A)], gw.auth.grants[k.digest(KEY_B)]
    assert gw.resolver.resolve("llama", b).key == ("ml", "llama")
    assert gw.resolver.resolve("ml/llama", a).key == ("ml", "llama")
    for model, grant in (("vault/secret", a), ("vault/nothing", a), ("secret", b), ("nothing", b), ("lab/llama", b)):
        with pytest.raises(oai.OpenAIError) as e:
            gw.resolver.resolve(model, grant)
        assert e.value.status == 403, model
        assert "exist" not in e.value.message
    with pytest.raises(oai.OpenAIError) as e:   # a's namespaces could hold it: a 404 says only that
        gw.resolver.resolve("nothing", a)
    assert e.value.status == 404
    with pytest.raises(oai.OpenAIError) as e:
        gw.resolver.resolve("llama", a)
    assert e.value.status == 400 and "NAMESPACE/llama" in e.value.message
    with pytest.raises(oai.OpenAIError) as e:   # exists, may be used, but does not speak OpenAI
        gw.resolver.resolve("resnet", a)
    assert e.value.status == 404 and "spec.openai" in e.value.message
    assert gw.resolver.resolve("resnet", a, openai=False).v2_model == "resnet"
    assert gw.resolver.model_id(gw.router.services[("ml", "llama")], a) == "ml/llama"
    assert gw.resolver.model_id(gw.router.services[("ml", "llama")], b) == "llama"


def test_held_requests_are_answered_when_a_replica_is_ready():
    async def scenario():
        gw = gateway()
        svc = gw.router.services[("ml", "llama")]
        waiters = [asyncio.create_task(gw.holding.endpoint(svc, caller(gw))) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert gw.holds.by_service == {("ml", "llama"): 3}
        gw.watches._slice_event("ADDED", eps("llama", "llama-a", 8000, ("10.0.0.1", True)))
        got = await asyncio.wait_for(asyncio.gather(*waiters), 2)
        assert got == [("10.0.0.1", 8000)] * 3 and gw.holds.by_service == {} and gw.holds.count == 0
    asyncio.run(scenario())


def test_holding_is_bounded_and_times_out_with_retry_after():
    async def scenario():
        gw = gateway(max_held_per_service=2, key_share=1, hold_timeout_seconds=0.2, retry_after_seconds=7)
        svc = gw.router.services[("ml", "llama")]
        waiters = [asyncio.create_task(gw.holding.endpoint(svc, caller(gw))) for _ in range(2)]
        await asyncio.sleep(0.02)
        with pytest.raises(oai.OpenAIError) as full:
            await gw.holding.endpoint(svc, caller(gw, KEY_B))   # another key: the service's queue is full
        assert full.value.status == 503 and full.value.retry_after == 7
        for result in await asyncio.gather(*waiters, return_exceptions=True):
            assert isinstance(result, oai.OpenAIError) and result.status == 503 and result.code == "model_starting"
        assert gw.holds.count == 0 and gw.holds.by_service_and_key == {}
    asyncio.run(scenario())


def test_one_key_holds_only_its_share_of_all_held_requests():
    """The key's share applied to each service's queue only: one key spread over many waking
    services filled the gateway's whole total, and another key's request for a waking service got
    a 503 that named that service's (empty) queue."""
    async def scenario():
        gw = gateway(max_held_per_service=8, max_held_total=8, key_share=0.5, hold_timeout_seconds=5)
        for name in ("one", "two", "three"):
            gw.router.set_service(isvc(name, autoscaling={"minReplicas": 0, "maxReplicas": 1}))
        one, two, three = (gw.router.services[("ml", n)] for n in ("one", "two", "three"))
        mine = [asyncio.create_task(gw.holding.endpoint(svc, caller(gw))) for svc in (one, one, two, two)]
        await asyncio.sleep(0.02)
        with pytest.raises(oai.OpenAIError) as e:
            await gw.holding.endpoint(three, caller(gw))
        assert (e.value.status, e.value.code, e.value.message) == (
            429, "hold_share_full", "model three is starting and API key a has 4 requests waiting for models that are "
                                    "starting already (its share); retry later")
        gw.auth.grants.update(k.parse(f"keys: [{{name: c, key: {KEY_B}x, namespaces: [ml]}}]", "keys"))
        theirs = [asyncio.create_task(gw.holding.endpoint(three, caller(gw, KEY_B + "x"))) for _ in range(4)]
        await asyncio.sleep(0.02)
        assert gw.holds.count == 8
        with pytest.raises(oai.OpenAIError) as e:
            await gw.holding.endpoint(three, caller(gw, KEY_B))
        assert (e.value.status, e.value.message) == (
            503, "model three is starting and the gateway holds as many requests for starting models as it takes (8); "
                 "retry later")
        for task in mine + theirs:
            task.cancel()
        await asyncio.gather(*mine, *theirs, return_exceptions=True)
        assert gw.holds.count == 0 and gw.holds.by_key == {}
    asyncio.run(scenario())


def test_one_key_holds_only_its_share_of_a_services_queue():
    async def scenario():
        gw = gateway(max_held_per_service=8, key_share=0.25, hold_timeout_seconds=5)
        svc = gw.router.services[("ml", "llama")]
        mine = [asyncio.create_task(gw.holding.endpoint(svc, caller(gw))) for _ in range(2)]
        await asyncio.sleep(0.02)
        with pytest.raises(oai.OpenAIError) as e:
            await gw.holding.endpoint(svc, caller(gw))
        assert (e.value.status, e.value.code) == (429, "hold_share_full")
        assert "API key a has 2 requests waiting" in e.value.message
        theirs = [asyncio.create_task(gw.holding.endpoint(svc, caller(gw, KEY_B))) for _ in range(2)]
        await asyncio.sleep(0.02)
        assert gw.holds.by_service == {("ml", "llama"): 4}
        gw.watches._slice_event("ADDED", eps("llama", "llama-a", 8000, ("10.0.0.1", True)))
        assert len(await asyncio.wait_for(asyncio.gather(*mine, *theirs), 2)) == 4
        assert gw.holds.count == 0
    asyncio.run(scenario())


def test_held_requests_fail_fast_when_the_service_degrades_or_the_gateway_stops():
    async def scenario():
        gw = gateway()
        svc = gw.router.services[("ml", "llama")]
        waiter = asyncio.create_task(gw.holding.endpoint(svc, caller(gw)))
        await asyncio.sleep(0.02)
        bad = isvc("llama")
        bad["status"] = {"conditions": [{"type": "Degraded", "status": "True", "reason": "Unschedulable",
                                         "message": "2 more nvidia.com/gpu needed"}]}
        gw.watches._service_event("MODIFIED", bad)
        with pytest.raises(oai.OpenAIError) as e:
            await asyncio.wait_for(waiter, 2)
        assert e.value.status == 503 and "Unschedulable" in e.value.message

        other = gw.router.services[("lab", "llama")]
        waiter = asyncio.create_task(gw.holding.endpoint(other, caller(gw)))
        await asyncio.sleep(0.02)
        await gw.on_shutdown(None)
        with pytest.raises(oai.OpenAIError) as e:
            await asyncio.wait_for(waiter, 2)
        assert e.value.status == 503 and e.value.code == "gateway_stopping"
    asyncio.run(scenario())


def test_settings_from_env_and_flags():
    s = from_env({"TRITON_GATEWAY_NAMESPACES": "ml, lab", "TRITON_GATEWAY_PORT": "8081"}, hold_timeout_seconds=5)
    assert s.namespaces == ["ml", "lab"] and s.port == 8081 and s.hold_timeout_seconds == 5
    with pytest.raises(GatewaySettingsError, match="TRITON_GATEWAY_PORT"):
        from_env({"TRITON_GATEWAY_PORT": "0"})
    # Errors name the flag as the command line spells it.
    with pytest.raises(GatewaySettingsError, match=r"^TRITON_GATEWAY_HOLD_TIMEOUT_SECONDS \(--hold-timeout\): "):
        from_env({}, hold_timeout_seconds=-1)
    with pytest.raises(GatewaySettingsError, match=r"^TRITON_GATEWAY_SHUTDOWN_TIMEOUT_SECONDS \(--shutdown-timeout\): "):
        from_env({}, shutdown_timeout_seconds=-1)


# -- the API and the operator's side ------------------------------------------------------------------------

def test_api_allows_scale_to_zero_and_says_which_services_speak_openai():
    from triton_operator.api import InferenceService
    from triton_operator.controller.endpoints import endpoints
    from triton_operator.settings import Settings

    from .conftest import isvc_doc

    doc = isvc_doc(autoscaling={"minReplicas": 0, "maxReplicas": 2})
    svc = InferenceService.model_validate(doc)
    assert svc.spec.autoscaling.min_replicas == 0 and svc.spec.autoscaling.scale_to_zero_after_seconds == 900
    with pytest.raises(ValueError, match="scaleToZeroAfterSeconds"):
        InferenceService.model_validate(isvc_doc(autoscaling={"minReplicas": 0, "maxReplicas": 2,
                                                              "scaleToZeroAfterSeconds": 5}))
    llm = svc.spec.model.format == "tensorrt-llm"
    assert svc.spec.serves_openai() == llm
    assert InferenceService.model_validate(isvc_doc(openai={"enabled": False})).spec.serves_openai() is False
    assert "openai" not in endpoints("llama", "ml", Settings(), openai=True)
    assert endpoints("llama", "ml", Settings(gateway_url="https://llm.example.com/"), openai=True)["openai"] == \
        "https://llm.example.com/v1"
    assert "openai" not in endpoints("llama", "ml", Settings(gateway_url="https://llm.example.com"), openai=False)
