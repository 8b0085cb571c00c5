"""A real LLM answering the real `openai` client through the gateway, and autoscaled on the LLM's
own signals: an InferenceService of format tensorrt-llm on the local cluster (the operator renders
its preparation Job and serving pods on NVIDIA's stock image; kwok completes the Job and runs the
pods), routed by the gateway (a local process with the chart's ServiceAccount token) to the
`llm` model on the real CPU Triton (e2e/harness/llm.py: SmolLM2-135M-Instruct through llama.cpp),
scraped by a real Prometheus whose figures the real operator reads.

Stand-ins, as in e2e/test_gateway.py: the kwok pods cannot serve, so an EndpointSlice points the
service at the local Triton (which speaks for every simulated replica), and Prometheus attaches to
its series the labels the chart's PodMonitor would.
"""

from __future__ import annotations

import json
import math
import secrets
import threading
import time
import uuid
from typing import Any, Iterator

import openai
import pytest

from .cluster import Cluster, Operator, model_cache, wait_for
from .conftest import tenant_gateway
from .harness.embedder import DIMENSION, EmbedderTriton
from .harness.gateway import GatewayProcess, SliceMirror
from .harness.llm import LLMTriton, tokenize
from .harness.prometheus import Prometheus, Target

NS = f"llm-e2e-{uuid.uuid4().hex[:5]}"
GROUP = "serving.triton-operator.io"
NAME = "smol"
KEY = "sk-e2e-llm-" + secrets.token_urlsafe(32)
METERED = "sk-e2e-metered-" + secrets.token_urlsafe(32)   # 600 tokens a minute: 10 a second
TICK = 1.0
QUESTION = "What is the capital of France? Answer with one word."


@pytest.fixture(scope="module")
def llm() -> Iterator[LLMTriton]:
    with LLMTriton() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(installed: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("llm-gateway")
    with tenant_gateway(installed, work, [{"name": "llm-team", "key": KEY, "namespaces": [NS]},
                                         {"name": "metered", "key": METERED, "namespaces": [NS],
                                          "tokensPerMinute": 600}], NS) as gw:
        yield gw


@pytest.fixture(scope="module")
def service(operator: Operator, gateway: GatewayProcess, llm: LLMTriton) -> Iterator[Cluster]:
    """The operator restarted with Prometheus (scraping the LLM's Triton and the gateway) and a
    1 s tick; the service `smol` (tensorrt-llm, 1-3 replicas on the queue); the slice mirror."""
    prom = Prometheus([Target(llm.metrics_address, {"namespace": NS, "inferenceservice": NAME, "pod": f"{NAME}-0"}),
                       Target(f"127.0.0.1:{gateway.metrics_port}", {})], scrape_interval="1s")
    prom.start()
    saved = dict(operator.extra_env)
    operator.extra_env.update({"TRITON_OPERATOR_PROMETHEUS_URL": prom.url,
                               "TRITON_OPERATOR_AUTOSCALE_INTERVAL_SECONDS": str(TICK),
                               "TRITON_OPERATOR_GATEWAY_URL": gateway.url,
                               # one Triton speaks for every simulated replica (see the module)
                               "TRITON_OPERATOR_REPORTING_QUERY":
                                   'count by ($namespace, $service) (triton_llm_active_requests{$service!=""}) * 1000'})
    operator.stop()
    operator.start()
    c = operator.cluster
    mirror = SliceMirror(c, {NAME: llm.http_port}, NS)
    try:
        c.apply([
            *model_cache(NS, "10Gi"),
            # No model.parameters: the planner cannot size a replica, so the queue rule scales it
            # (queue / targetQueueDepth replicas): this CPU model is far slower than an L4's plan.
            {"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService", "metadata": {"name": NAME, "namespace": NS},
             "spec": {"model": {"source": "hf://HuggingFaceTB/SmolLM2-135M-Instruct", "format": "tensorrt-llm",
                                "precision": "bf16"}, "gpu": {"class": "l4"},
                      "autoscaling": {"minReplicas": 1, "maxReplicas": 3, "targetQueueDepth": 1,
                                      "scaleDownStabilizationSeconds": 5}}}])
        c.wait_ready(NAME, NS, timeout=120)
        mirror.thread.start()
        wait_for("smol routed", lambda: mirror.applied.get(NAME) == 1, timeout=30)
        yield c
    finally:
        mirror.stop()
        c.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        c.kubectl("delete", "pv", f"models-{NS}", "--wait=false", check=False)
        operator.extra_env.clear()
        operator.extra_env.update(saved)
        operator.stop()
        operator.start()
        prom.close()


def client(gw: GatewayProcess, **kw: Any) -> openai.OpenAI:
    kw.setdefault("timeout", 120)
    kw.setdefault("api_key", KEY)
    return openai.OpenAI(base_url=f"{gw.url}/v1", max_retries=0, **kw)


def test_chat_answers_a_simple_question_with_exact_usage(service: Cluster, gateway: GatewayProcess):
    answer = client(gateway).chat.completions.create(model=NAME, messages=[{"role": "user", "content": QUESTION}],
                                                     temperature=0, max_tokens=32)
    (choice,) = answer.choices
    assert "Paris" in choice.message.content and choice.finish_reason == "stop"
    assert answer.usage.completion_tokens == len(tokenize(choice.message.content, special=False))
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens > 20
    again = client(gateway).chat.completions.create(model=NAME, messages=[{"role": "user", "content": QUESTION}],
                                                    temperature=0, max_tokens=32)
    assert again.choices[0].message.content == choice.message.content, "temperature 0 repeats"


def test_chat_streams_the_same_answer_and_its_usage_when_asked(service: Cluster, gateway: GatewayProcess):
    whole = client(gateway).chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Name three colours."}], temperature=0, max_tokens=40)
    chunks = list(client(gateway).chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Name three colours."}], temperature=0, max_tokens=40,
        stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and (usage.prompt_tokens, usage.completion_tokens) == (
        whole.usage.prompt_tokens, whole.usage.completion_tokens)
    plain = list(client(gateway).chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, stream=True))
    assert all(c.usage is None for c in plain), "usage only with stream_options.include_usage"


def test_completions_end_with_length_and_at_stop_sequences(service: Cluster, gateway: GatewayProcess):
    c = client(gateway)
    cut = c.completions.create(model=NAME, prompt="Count: 1, 2, 3,", max_tokens=4, temperature=0)
    assert (cut.choices[0].finish_reason, cut.usage.completion_tokens) == ("length", 4)
    free = c.completions.create(model=NAME, prompt="Count: 1, 2, 3,", max_tokens=24, temperature=0).choices[0].text
    stopped = c.completions.create(model=NAME, prompt="Count: 1, 2, 3,", max_tokens=24, temperature=0, stop=[" 6"])
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].text == free[:free.index(" 6")]
    streamed = list(c.completions.create(model=NAME, prompt="Count: 1, 2, 3,", max_tokens=24, temperature=0,
                                         stop=[" 6"], stream=True))
    assert "".join(x.choices[0].text for x in streamed) == stopped.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_json_output_and_what_cannot_be_honoured(service: Cluster, gateway: GatewayProcess):
    c = client(gateway)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    out = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": QUESTION + " Reply in JSON."}],
                                    temperature=0, max_tokens=60, response_format={
                                        "type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
    assert out.choices[0].finish_reason == "stop" and isinstance(json.loads(out.choices[0].message.content)["city"], str)
    out = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": QUESTION + " Reply in JSON."}],
                                    temperature=0, max_tokens=300, response_format={"type": "json_object"})
    if out.choices[0].finish_reason == "stop":   # a whole object (cut by max_tokens it could not be)
        assert isinstance(json.loads(out.choices[0].message.content), dict)
    else:
        assert out.choices[0].finish_reason == "length" and out.choices[0].message.content.lstrip().startswith("{")
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}], logit_bias={"50": -100})
    assert e.value.body["param"] == "logit_bias" and "logit_bias is not supported" in e.value.body["message"]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city's name"}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time now in a time zone",
                                          "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                                                         "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def test_the_sdk_gets_a_valid_tool_call_when_one_is_required(service: Cluster, gateway: GatewayProcess):
    c = client(gateway)
    out = c.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER, CLOCK], tool_choice="required",
                                    temperature=0, max_tokens=80)
    (choice,) = out.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in ("get_weather", "get_time")
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city"} if call.function.name == "get_weather" else {"zone"}
    named = c.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER, CLOCK], temperature=0, max_tokens=80,
                                      tool_choice={"type": "function", "function": {"name": "get_time"}})
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "get_time" and isinstance(json.loads(call.function.arguments)["zone"], str)
    assert named.usage.completion_tokens > 3


def test_a_streamed_tool_call_arrives_as_tool_calls_deltas(service: Cluster, gateway: GatewayProcess):
    chunks = list(client(gateway).chat.completions.create(
        model=NAME, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=80, stream=True))
    deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    assert deltas and deltas[0].index == 0 and deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert isinstance(json.loads(arguments)["city"], str)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["tool_calls"]
    assert not any(ch.choices[0].delta.content for ch in chunks if ch.choices), "a forced call sends no text"


def test_a_tool_result_goes_back_into_the_chat(service: Cluster, gateway: GatewayProcess):
    c = client(gateway)
    first = c.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER], tool_choice="required",
                                      temperature=0, max_tokens=80)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny", "celsius": 21})}]
    second = c.chat.completions.create(model=NAME, messages=history, tools=[WEATHER], temperature=0, max_tokens=40)
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 10, "the call and its result are in the prompt"


def test_logprobs_give_the_top_alternatives_of_each_token(service: Cluster, gateway: GatewayProcess):
    out = client(gateway).chat.completions.create(model=NAME, messages=[{"role": "user", "content": QUESTION}],
                                                  temperature=0, max_tokens=8, logprobs=True, top_logprobs=5)
    (choice,) = out.choices
    content = choice.logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert "".join(x.token for x in content) == choice.message.content
    for x in content:
        assert len(x.top_logprobs) == 5 and x.bytes == list(x.token.encode())
        assert sum(math.exp(a.logprob) for a in x.top_logprobs) <= 1.0 + 1e-6
        assert [a.logprob for a in x.top_logprobs] == sorted((a.logprob for a in x.top_logprobs), reverse=True)
        assert x.logprob == pytest.approx(x.top_logprobs[0].logprob), "greedy: the most likely token"
    legacy = client(gateway).completions.create(model=NAME, prompt="The capital of France is", max_tokens=4,
                                                temperature=0, logprobs=2)
    lp = legacy.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert lp.text_offset[0] == 0 and all(len(top) <= 2 for top in lp.top_logprobs)


def test_n_answers_are_three_choices_with_usage_over_all(service: Cluster, gateway: GatewayProcess):
    """Answer i of a seeded request is sampled with seed + i: each is the answer one request with
    that seed gets, and the usage counts the prompt once and every answer's tokens."""
    c = client(gateway)
    ask = {"model": NAME, "messages": [{"role": "user", "content": "Write a word."}], "temperature": 1.0,
           "max_tokens": 12}
    out = c.chat.completions.create(n=3, seed=7, **ask)
    assert [ch.index for ch in out.choices] == [0, 1, 2]
    singles = [c.chat.completions.create(seed=7 + i, **ask) for i in range(3)]
    assert [ch.message.content for ch in out.choices] == [s.choices[0].message.content for s in singles]
    assert len({ch.message.content for ch in out.choices}) > 1, "three samples, not one answer thrice"
    assert out.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert out.usage.prompt_tokens == singles[0].usage.prompt_tokens
    streamed = list(c.chat.completions.create(n=3, seed=7, stream=True, **ask))
    texts = {i: "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices and ch.choices[0].index == i)
             for i in range(3)}
    assert texts == {i: ch.message.content for i, ch in enumerate(out.choices)}


def test_the_responses_api_answers_plain_and_with_tools(service: Cluster, gateway: GatewayProcess):
    c = client(gateway)
    plain = c.responses.create(model=NAME, input=QUESTION, temperature=0, max_output_tokens=32)
    assert plain.status == "completed" and "Paris" in plain.output_text
    assert plain.usage.output_tokens == len(tokenize(plain.output_text, special=False))
    tools = [{"type": "function", "name": "get_weather", "description": "The current weather in a city",
              "parameters": WEATHER["function"]["parameters"]}]
    called = c.responses.create(model=NAME, input=ASK[0]["content"], tools=tools, tool_choice="required",
                                temperature=0, max_output_tokens=80)
    (call,) = [o for o in called.output if o.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    follow = c.responses.create(model=NAME, temperature=0, max_output_tokens=40, tools=tools, input=[
        {"role": "user", "content": ASK[0]["content"]},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    assert follow.status in ("completed", "incomplete") and follow.usage.input_tokens > called.usage.input_tokens
    events = list(c.responses.create(model=NAME, input=QUESTION, temperature=0, max_output_tokens=32, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == plain.output_text


def test_an_agent_framework_completes_a_tool_using_task(service: Cluster, gateway: GatewayProcess):
    """OpenAI's Agents SDK (openai-agents), pointed at the gateway as any OpenAI-compatible base
    URL: its agent loop asks for a call (tool_choice required), runs the tool, sends the result
    back and gets the model's answer, over several requests through the gateway."""
    import asyncio

    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"It is sunny and 21 degrees Celsius in {city}."

    async def run() -> Any:
        api = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0, timeout=120)
        agent = Agent(name="weather", instructions="Answer questions about the weather using the tools.",
                      tools=[get_weather], model=OpenAIChatCompletionsModel(model=NAME, openai_client=api),
                      model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=80))
        try:
            return await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
        finally:
            await api.close()

    result = asyncio.run(run())
    assert asked and all(isinstance(city, str) and city for city in asked), "the model called the tool"
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"] and kinds[-1] == "message_output_item"
    assert isinstance(result.final_output, str) and result.final_output.strip()


EMBED = "embed"


@pytest.fixture(scope="module")
def embedder(service: Cluster) -> Iterator[str]:
    """An embedding service (format python, spec.openai.task embeddings) answered by a real
    all-MiniLM-L6-v2 on a second local Triton (e2e/harness/embedder.py), routed as `smol` is."""
    with EmbedderTriton() as triton:
        mirror = SliceMirror(service, {EMBED: triton.http_port}, NS)
        try:
            service.apply([{"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService",
                            "metadata": {"name": EMBED, "namespace": NS},
                            "spec": {"model": {"source": "hf://sentence-transformers/all-MiniLM-L6-v2",
                                               "format": "python", "name": EMBED},
                                     "gpu": {"class": "l4"}, "replicas": 1, "openai": {"task": "embeddings"}}}])
            service.wait_ready(EMBED, NS, timeout=120)
            mirror.thread.start()
            wait_for("embed routed", lambda: mirror.applied.get(EMBED) == 1, timeout=30)
            yield EMBED
        finally:
            mirror.stop()
            service.kubectl("delete", "inferenceservice", EMBED, "-n", NS, "--wait=false", check=False)


def test_embeddings_rank_a_paraphrase_above_an_unrelated_sentence(service: Cluster, gateway: GatewayProcess,
                                                                  embedder: str):
    c = client(gateway)
    assert embedder in [m.id for m in c.models.list()]
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market fell sharply today."]
    out = c.embeddings.create(model=embedder, input=texts)          # the SDK asks for base64 and decodes it
    assert [d.index for d in out.data] == [0, 1, 2] and all(len(d.embedding) == DIMENSION for d in out.data)

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

    a, b, other = (d.embedding for d in out.data)
    assert cosine(a, b) > 0.6 > 0.2 > cosine(a, other), (cosine(a, b), cosine(a, other))
    assert out.usage.prompt_tokens == out.usage.total_tokens > 3 * 5
    floats = c.embeddings.create(model=embedder, input=texts[0], encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(a, abs=1e-6)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=embedder, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["code"] == "wrong_model_task" and "/v1/embeddings" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.embeddings.create(model=NAME, input="hi")
    assert e.value.body["code"] == "wrong_model_task"


def test_a_keys_tokens_per_minute_are_the_models_own_counts(service: Cluster, gateway: GatewayProcess):
    """A metered key spends what the model counted (prompt and completion); once its minute's
    tokens are spent it gets 429 with Retry-After for as long as the refill takes, and the
    gateway's usage counter for the key holds the same figures."""
    def used(kind: str) -> float:
        return gateway.metric("triton_gateway_key_tokens_total", key="metered", kind=kind)

    c = client(gateway, api_key=METERED)
    spent, start, largest = 0, time.monotonic(), 0
    while True:   # 600 tokens: a few answers of about 60 + 150
        # the bucket refills 10 tokens a second: a replica slower than that never drains it
        assert time.monotonic() - start < 300, f"{spent} tokens in 300 s: the model answers slower than the refill"
        try:
            out = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Tell me about the sea."}],
                                            temperature=0, max_tokens=150)
        except openai.RateLimitError as e:
            retry_after = float(e.response.headers["retry-after"])
            break
        used_now = out.usage.prompt_tokens + out.usage.completion_tokens
        spent, largest = spent + used_now, max(largest, used_now)
        # the bucket refills 10 tokens a second; the last request may overdraw it by its own use
        assert spent <= 600 + 10 * (time.monotonic() - start) + largest, "the key kept going past its tokens"
    assert spent >= 600, f"refused after {spent} tokens, before the key's 600 were spent"
    # Retry-After is when the bucket is above zero again: the overdraft at 10 tokens a second.
    assert 0 < retry_after <= (spent - 600) / 10 + 1
    assert used("prompt") + used("completion") == spent
    # the unmetered key is not held back by the metered one
    assert client(gateway).chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}],
                                                   max_tokens=4).usage.completion_tokens <= 4


def test_a_client_that_goes_away_stops_the_generation(service: Cluster, gateway: GatewayProcess, llm: LLMTriton):
    def cancelled() -> float:
        return sum(v for lab, v in llm.metric_samples("triton_llm_requests_total")
                   if lab.get("finish_reason") == "cancelled")

    before = cancelled()
    stream = client(gateway).chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Write a very long story about the sea."}],
        max_tokens=1500, temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()   # the client goes: the gateway drops its upstream request, Triton cancels it
    wait_for("the generation cancelled at the model", lambda: cancelled() == before + 1, timeout=60)


def test_the_autoscaler_scales_on_the_engines_queue(service: Cluster, gateway: GatewayProcess, llm: LLMTriton):
    """Six long answers at once: llama.cpp generates one at a time, so five wait in the engine's
    queue (Triton's own pending count stays 0); the operator reads triton_llm_queued_requests
    through its one query and asks for queue / targetQueueDepth replicas, up to maxReplicas 3."""
    c = service
    results: list[str] = []

    def ask(i: int) -> None:
        out = client(gateway).chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": f"Write a story about dragon number {i}."}],
            max_tokens=150, temperature=0)
        results.append(out.choices[0].finish_reason)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    try:
        status = wait_for("scaled up on the queue", lambda: (s := c.get("infsvc", NAME, NS).get("status") or {})
                          and (s.get("autoscaling") or {}).get("desiredReplicas", 1) >= 2 and s, timeout=90, interval=0.5)
        assert "queue" in status["autoscaling"]["lastDecision"], status["autoscaling"]
        wait_for("the Deployment follows", lambda: (c.get("deployment", NAME, NS) or {}).get("spec", {}).get(
            "replicas", 1) >= 2, timeout=30)
    finally:
        for t in threads:
            t.join(420)
    assert len(results) == 6 and set(results) <= {"length", "stop"}, "every held and queued answer came"
