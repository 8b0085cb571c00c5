"""The OpenAI fields the llm model serves (gateway/translate.py, pure): tools and tool_choice, tool
calls in the history, `n` answers, and log probabilities, into the model's inputs and back into
OpenAI's answers and stream chunks; refused with a 400 naming them where the model cannot serve
them (a text model)."""

from __future__ import annotations

import json

import pytest

from triton_operator.gateway import embeddings as e
from triton_operator.gateway import openai_schema as oai
from triton_operator.gateway import responses as r
from triton_operator.gateway import translate as t

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}]}


def chat(**extra) -> oai.ChatRequest:
    return oai.parse_body(json.dumps({**CHAT, **extra}).encode(), oai.ChatRequest)  # type: ignore[return-value]


def events(data: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in data.decode().split("\n") if line.startswith("data: {")]


def test_tools_and_the_choice_go_to_the_model_as_its_inputs():
    gen = t.to_generate(chat(tools=[WEATHER], tool_choice="required"), 64, llm=True)
    assert json.loads(gen.body["tools"]) == [WEATHER]
    assert gen.body["tool_choice"] == "required"
    named = t.to_generate(chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}),
                          64, llm=True)
    assert json.loads(named.body["tool_choice"]) == {"type": "function", "function": {"name": "get_weather"}}
    none = t.to_generate(chat(tools=[WEATHER], tool_choice="none"), 64, llm=True)
    assert "tools" not in none.body and "tool_choice" not in none.body
    bare = t.to_generate(chat(tools=[{"type": "function", "function": {"name": "now"}}]), 64, llm=True)
    assert json.loads(bare.body["tools"])[0]["function"]["parameters"] == {"type": "object", "properties": {}}


def test_the_history_carries_calls_and_their_results():
    req = chat(messages=[CHAT["messages"][0],
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "call_1", "type": "function",
                              "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], tools=[WEATHER])
    sent = json.loads(t.to_generate(req, 64, llm=True).body["messages"])
    assert sent[1] == {"role": "assistant", "content": "",
                       "tool_calls": [{"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}]}
    assert sent[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


@pytest.mark.parametrize("extra, param, message", [
    ({"tool_choice": "required"}, None, "tool_choice: required needs tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}}, None,
     "tool_choice: 'other' is not one of the tools"),
    ({"tools": [WEATHER, WEATHER]}, None, "tools: a function name is given twice"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools.0.function.name", None),
    ({"top_logprobs": 2}, None, "top_logprobs: needs logprobs true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", None),
    ({"n": 17}, "n", None),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, "messages.0",
     "messages.0: tool_calls belong to assistant messages"),
])
def test_bad_tool_and_sampling_fields_are_400s(extra, param, message):
    with pytest.raises(oai.OpenAIError) as e:
        chat(**extra)
    assert e.value.status == 400
    if param:
        assert e.value.param == param
    if message:
        assert e.value.message == message


@pytest.mark.parametrize("extra, field", [
    ({"tools": [WEATHER]}, "tools"), ({"logprobs": True}, "logprobs"), ({"n": 2}, "n"),
    # these were dropped on the way to a text model, which answered as if they had not been asked
    ({"seed": 7}, "seed"), ({"top_k": 5}, "top_k"), ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"), ({"repetition_penalty": 1.1}, "repetition_penalty"),
    ({"stream": True, "stream_options": {"include_usage": True}}, "stream_options"),
])
def test_a_text_model_refuses_what_only_the_llm_model_serves(extra, field):
    with pytest.raises(oai.OpenAIError) as e:
        t.to_generate(chat(**extra), 64, llm=False, prompt="x")
    assert (e.value.status, e.value.param, e.value.code) == (400, field, "unsupported_parameter")
    assert e.value.message.endswith("needs a model served with format tensorrt-llm")


def test_a_call_comes_back_as_openai_tool_calls():
    gen = t.to_generate(chat(tools=[WEATHER]), 64, llm=True)
    answer = t.answer_of({"text_output": "", "finish_reason": "tool_calls", "prompt_tokens": 90, "completion_tokens": 12,
                          "index": 0, "logprobs": "",
                          "tool_calls": json.dumps([{"name": "get_weather", "arguments": '{"city": "Paris"}'}])})
    out = t.completion(gen, answer)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_") and len(call["id"]) == 29
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert out["usage"] == {"prompt_tokens": 90, "completion_tokens": 12, "total_tokens": 102}


def test_a_streamed_call_is_a_tool_calls_delta_then_its_finish_reason():
    gen = t.to_generate(chat(tools=[WEATHER], stream=True), 64, llm=True)
    s = t.Stream(gen)
    out = s.delta(t.Answer("", None, 90, 5))
    out += s.delta(t.Answer("", "tool_calls", 90, 12, 0, [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]))
    assert s.stopped
    out += s.end()
    chunks = events(out)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    delta = chunks[1]["choices"][0]["delta"]["tool_calls"]
    assert delta[0]["index"] == 0 and delta[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert chunks[2]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "tool_calls", "logprobs": None}
    assert out.endswith(b"data: [DONE]\n\n")


def test_n_answers_are_n_choices_with_usage_over_all_of_them():
    gen = t.to_generate(chat(n=3, temperature=0.8), 64, llm=True)
    assert gen.body["n"] == 3 and gen.body["stream"] is True and gen.upstream_stream and not gen.stream
    pieces = [t.Answer("Par", None, 10, 1, 1), t.Answer("Lyon", None, 10, 1, 0), t.Answer("is", "stop", 10, 2, 1),
              t.Answer("", "length", 10, 4, 0), t.Answer("Nice", "stop", 10, 1, 2)]
    out = t.completion(gen, t.gather(pieces))
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in out["choices"]] == [
        (0, "Lyon", "length"), (1, "Paris", "stop"), (2, "Nice", "stop")]
    assert out["usage"] == {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}


def test_n_streamed_answers_name_their_index_and_the_stream_ends_with_the_last():
    gen = t.to_generate(chat(n=2, stream=True, stream_options={"include_usage": True}), 64, llm=True)
    s = t.Stream(gen)
    out = s.delta(t.Answer("A", None, 10, 1, 0)) + s.delta(t.Answer("B", None, 10, 1, 1))
    out += s.delta(t.Answer("", "stop", 10, 1, 0))
    assert not s.stopped
    out += s.delta(t.Answer("", "length", 10, 3, 1))
    assert s.stopped
    out += s.end()
    chunks = events(out)
    assert [c["choices"][0]["index"] for c in chunks[:2]] == [0, 1]          # a role chunk per choice
    finishes = [(c["choices"][0]["index"], c["choices"][0]["finish_reason"]) for c in chunks
                if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == [(0, "stop"), (1, "length")]
    assert chunks[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}


MARKS = json.dumps([{"token": "Par", "logprob": -0.5, "top": [["Par", -0.5], ["Ly", -1.5]]},
                    {"token": "is", "logprob": -0.1, "top": [["is", -0.1], ["ish", -3.0]]}])


def test_chat_logprobs_are_openais_content_list_with_bytes():
    gen = t.to_generate(chat(logprobs=True, top_logprobs=2), 64, llm=True)
    assert gen.body["logprobs"] == 2
    answer = t.answer_of({"text_output": "Paris", "finish_reason": "stop", "prompt_tokens": 5, "completion_tokens": 2,
                          "index": 0, "tool_calls": "", "logprobs": MARKS})
    lp = t.completion(gen, answer)["choices"][0]["logprobs"]
    assert lp["content"][0] == {"token": "Par", "logprob": -0.5, "bytes": [80, 97, 114],
                                "top_logprobs": [{"token": "Par", "logprob": -0.5, "bytes": [80, 97, 114]},
                                                 {"token": "Ly", "logprob": -1.5, "bytes": [76, 121]}]}
    assert t.to_generate(chat(logprobs=True), 64, llm=True).body["logprobs"] == 0
    assert "logprobs" not in t.to_generate(chat(logprobs=False), 64, llm=True).body


def test_completion_logprobs_are_the_legacy_shape_with_text_offsets():
    req = oai.parse_body(json.dumps({"model": "m", "prompt": "The capital of France is", "logprobs": 2}).encode(),
                       oai.CompletionRequest)
    gen = t.to_generate(req, 64, llm=True)
    answer = t.answer_of({"text_output": "Paris", "finish_reason": "stop", "prompt_tokens": 5, "completion_tokens": 2,
                          "logprobs": MARKS})
    lp = t.completion(gen, answer)["choices"][0]["logprobs"]
    assert lp == {"tokens": ["Par", "is"], "token_logprobs": [-0.5, -0.1],
                  "top_logprobs": [{"Par": -0.5, "Ly": -1.5}, {"is": -0.1, "ish": -3.0}], "text_offset": [0, 3]}
    with pytest.raises(oai.OpenAIError, match="best_of: only best_of equal to n"):
        oai.parse_body(json.dumps({"model": "m", "prompt": "x", "best_of": 3}).encode(), oai.CompletionRequest)
    assert oai.parse_body(json.dumps({"model": "m", "prompt": "x", "best_of": 2, "n": 2}).encode(),
                        oai.CompletionRequest).n == 2


def test_a_model_output_that_is_not_json_is_a_502():
    with pytest.raises(oai.OpenAIError) as e:
        t.answer_of({"text_output": "", "tool_calls": "[{broken"})
    assert (e.value.status, e.value.message) == (502, "the model's tool_calls output is not a JSON array of objects")


def test_stream_options_without_a_stream_are_refused_as_openai_refuses_them():
    with pytest.raises(oai.OpenAIError) as e:
        chat(stream_options={"include_usage": True})
    assert (e.value.status, e.value.param, e.value.message) == (
        400, "stream_options", "stream_options: only allowed when stream is true")
    assert chat(stream=True, stream_options={"include_usage": True}).include_usage
    assert not t.to_generate(chat(stream=True, stream_options={"include_usage": False}), 64, llm=False,
                             prompt="x").include_usage


@pytest.mark.parametrize("parse, body, param", [
    (e.parse, {"model": "m", "input": 5}, "input"),
    (e.parse, {"model": "m", "input": None}, "input"),
    (lambda raw: oai.parse_body(raw, oai.ChatRequest),
     {"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": 5}, "stop"),
    (lambda raw: oai.parse_body(raw, oai.CompletionRequest), {"model": "m", "prompt": 5}, "prompt"),
    (lambda raw: oai.parse_body(raw, oai.CompletionRequest), {"model": "m", "prompt": ["a", 5]}, "prompt.1"),
    (r.parse, {"model": "m", "input": [{"role": "user", "content": 5}]}, "input.0.content"),
])
def test_an_error_names_the_request_field_never_a_type_the_gateway_tried(parse, body, param):
    """A value that matched no member of a field's union was named by pydantic's name for the
    member tried first ("input.constrained-str", "stop.str"), and a list with one bad item was
    told it was "not a valid string"."""
    with pytest.raises(oai.OpenAIError) as err:
        parse(json.dumps(body).encode())
    assert (err.value.status, err.value.param) == (400, param)
    assert err.value.message.startswith(f"{param}: ")
