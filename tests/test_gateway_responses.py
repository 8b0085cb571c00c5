"""The Responses API (gateway/responses.py, pure): a Responses request into the chat request it
means, and the llm model's answers back into a Response object and the Responses event stream,
each validated against the official `openai` package's own types (Response, ResponseStreamEvent)."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from triton_operator.gateway import openai_schema as oai
from triton_operator.gateway import responses as r
from triton_operator.gateway import translate as t

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
EVENTS = TypeAdapter(ResponseStreamEvent)


def parse(**body) -> r.ResponsesRequest:
    return r.parse(json.dumps({"model": "m", **body}).encode())


def test_a_string_input_is_one_user_message_after_the_instructions():
    chat = r.to_chat(parse(input="Hi", instructions="Be brief.", max_output_tokens=9, temperature=0))
    assert [(m.role, m.text()) for m in chat.messages] == [("system", "Be brief."), ("user", "Hi")]
    assert (chat.max_tokens, chat.temperature, chat.stream) == (9, 0, False)


def test_items_with_calls_and_their_outputs_become_the_chats_tool_turns():
    chat = r.to_chat(parse(input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris and Rome?"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": "rain"},
    ], tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}))
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool", "tool"]
    assert [c.id for c in chat.messages[1].tool_calls] == ["c1", "c2"]    # one turn, two parallel calls
    assert (chat.messages[3].tool_call_id, chat.messages[3].text()) == ("c2", "rain")
    gen = t.to_generate(chat, 64, llm=True)
    assert json.loads(gen.body["tools"])[0]["function"]["name"] == "get_weather"
    assert json.loads(gen.body["tool_choice"]) == {"type": "function", "function": {"name": "get_weather"}}


def test_text_format_maps_to_the_chats_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = r.to_chat(parse(input="x", text={"format": {"type": "json_schema", "name": "a", "schema": schema}}))
    assert json.loads(t.to_generate(chat, 64, llm=True).body["guided_json"]) == schema


@pytest.mark.parametrize("extra, message", [
    ({"previous_response_id": "resp_1"}, "previous_response_id: this gateway stores no responses; send the "
                                         "conversation in input"),
    ({"background": True}, "background: this gateway stores no responses; ask without background"),
    ({"tools": [{"type": "web_search"}]}, "tools.0: only function tools are served here, not 'web_search'"),
    ({"reasoning": {"effort": "high"}}, "reasoning: reasoning options are not supported"),
])
def test_what_needs_openais_own_servers_is_refused_with_why(extra, message):
    with pytest.raises(oai.OpenAIError) as e:
        parse(input="x", **extra)
    assert (e.value.status, e.value.message) == (400, message)


def test_an_unknown_field_is_a_400_naming_it():
    with pytest.raises(oai.OpenAIError) as e:
        parse(input="x", frobnicate=1)
    assert (e.value.status, e.value.param) == (400, "frobnicate")


def test_a_whole_answer_is_a_response_the_sdk_accepts():
    req = parse(input="Capital of France?")
    out = r.response_object(r.echo(req), t.Answer("Paris", "stop", 12, 2))
    response = Response.model_validate(out)
    assert response.output_text == "Paris" and response.status == "completed"
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (12, 2, 14)
    cut = Response.model_validate(r.response_object(r.echo(req), t.Answer("Par", "length", 12, 1)))
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    called = Response.model_validate(r.response_object(r.echo(parse(input="x", tools=[WEATHER])), t.Answer(
        "", "tool_calls", 30, 9, 0, [{"name": "get_weather", "arguments": '{"city": "Paris"}'}])))
    (call,) = called.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"}


def events(data: bytes) -> list:
    out = []
    for block in data.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if lines:
            event = EVENTS.validate_python(json.loads(lines["data"]))
            assert event.type == lines["event"]
            out.append(event)
    return out


def test_a_streamed_answer_is_the_responses_event_sequence():
    s = r.ResponseStream(r.echo(parse(input="Capital?", stream=True)))
    data = s.delta(t.Answer("Par", None, 12, 1)) + s.delta(t.Answer("is", None, 12, 2))
    data += s.delta(t.Answer("", "stop", 12, 2))
    assert s.stopped
    data += s.end()
    seen = events(data)
    assert [e.type for e in seen] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    assert "".join(e.delta for e in seen if e.type == "response.output_text.delta") == "Paris"
    done = seen[-1].response
    assert done.output_text == "Paris" and done.usage.output_tokens == 2 and done.id == seen[0].response.id


def test_a_streamed_call_is_a_function_call_item_with_its_arguments():
    s = r.ResponseStream(r.echo(parse(input="x", tools=[WEATHER], stream=True)))
    data = s.delta(t.Answer("", "tool_calls", 30, 9, 0, [{"name": "get_weather", "arguments": '{"city": "Rome"}'}]))
    data += s.end()
    seen = events(data)
    assert [e.type for e in seen] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert seen[-2].item.name == "get_weather" and json.loads(seen[4].arguments) == {"city": "Rome"}
    assert [o.type for o in seen[-1].response.output] == ["function_call"]


def test_an_error_mid_stream_is_an_error_event_then_a_failed_response():
    s = r.ResponseStream(r.echo(parse(input="x", stream=True)))
    data = s.delta(t.Answer("a", None, 1, 1)) + s.error(oai.OpenAIError(502, "the replica failed mid-stream: X",
                                                                      "upstream_error", code="upstream_failed"))
    seen = events(data)
    assert [e.type for e in seen][-2:] == ["error", "response.failed"]
    assert seen[-1].response.error.message == "the replica failed mid-stream: X"


@pytest.mark.parametrize("body, status, message", [
    (b'{"model": "m", "input": [{"type": "bogus"}]}', 400, None),
    (json.dumps({"model": "m", "input": [{"role": "user", "content": "x"}] * 4097}).encode(), 400,
     "input: at most 4096 items, not 4097"),
    (json.dumps({"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f",
                                          "arguments": "x" * ((1 << 20) + 1)}]}).encode(), 400, None),
    (json.dumps({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})
     .encode(), 400, None),
    (b'{"model": "m", "input": ' + b"[" * 100 + b"]" * 100 + b"}", 400,
     "the request body nests JSON deeper than 64 levels"),
    (b'["not an object"]', 400, "the request body must be a JSON object"),
    (b'{"model": "m", "input": "\\ud800"}', 400, None),
])
def test_hostile_bodies_are_400s_before_anything_is_sent(body, status, message):
    with pytest.raises(oai.OpenAIError) as e:
        req = r.parse(body)
        t.encode(t.to_generate(r.to_chat(req), 64, llm=True).body)   # what would be sent upstream
    assert e.value.status == status
    if message:
        assert e.value.message == message


def test_a_string_input_is_as_long_as_the_body_allows():
    """The 4,096-item limit on input held a string input to 4,096 characters as well: a prompt of
    5,000 characters was a 400 ("at most 4096 items")."""
    req = r.parse(json.dumps({"model": "m", "input": "x" * 100_000}).encode())
    assert req.input == "x" * 100_000
    assert len(r.parse(json.dumps({"model": "m", "input": [{"role": "user", "content": "x"}] * 4096}).encode()).input) == 4096


def test_text_the_answer_repeats_that_cannot_be_utf8_is_a_400_at_parse():
    """Metadata, the format's name and its schema are repeated in the Response object: a lone
    surrogate there is refused when the request is read, before the model is asked (it was a 502
    blamed on the replica, after its tokens were spent)."""
    for key in ('"k": "\\ud800"', '"\\ud800": "v"'):   # metadata is typed as chat's: refused by its schema
        with pytest.raises(oai.OpenAIError) as e:
            r.parse(b'{"model": "m", "input": "hi", "metadata": {%s}}' % key.encode())
        assert e.value.status == 400 and e.value.param.startswith("metadata.")
        assert "unable to parse raw data as a unicode string" in e.value.message
    for body in (b'{"model": "m", "input": "hi", "text": {"format": {"type": "json_object", "name": "\\udfff"}}}',
                 b'{"model": "m", "input": "hi", "text": {"format": {"type": "json_schema", "schema": {"\\ud800": 1}}}}'):
        with pytest.raises(oai.OpenAIError) as e:
            r.parse(body)
        assert (e.value.status, e.value.code) == (400, "invalid_text"), body
        assert e.value.message == "the request holds text that is not valid Unicode (a lone surrogate escape)"
    assert r.parse(b'{"model": "m", "input": "hi", "metadata": {"k": "\\u00e9"}}').metadata == {"k": "\u00e9"}


def test_metadata_is_held_to_openais_limits_as_chats_is():
    """16 pairs, keys of at most 64 characters, values of at most 512 (OpenAI's limits, and chat's
    here): unbounded, a 1 MB value was repeated in each of a stream's three snapshots."""
    assert r.parse(b'{"model": "m", "input": "hi", "metadata": {"%s": "%s"}}' % (b"k" * 64, b"v" * 512)).metadata
    for metadata, param in ((b'{"%s": "v"}' % (b"k" * 65), "metadata.%s.[key]" % ("k" * 65)),
                            (b'{"k": "%s"}' % (b"v" * 513), "metadata.k"),
                            (b"{%s}" % b", ".join(b'"k%d": "v"' % i for i in range(17)), "metadata")):
        with pytest.raises(oai.OpenAIError) as e:
            r.parse(b'{"model": "m", "input": "hi", "metadata": %s}' % metadata)
        assert (e.value.status, e.value.param) == (400, param), metadata[:40]


def test_more_function_calls_in_a_row_than_one_turn_takes_are_refused_in_their_own_terms():
    calls = [{"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"} for i in range(129)]
    assert len(r.to_chat(parse(input=calls[:128])).messages[0].tool_calls) == 128
    with pytest.raises(oai.OpenAIError) as e:
        r.to_chat(parse(input=calls))
    assert (e.value.status, e.value.param, e.value.message) == (
        400, "input", "input: at most 128 function_call items in a row (the calls of one assistant turn)")


def test_a_streamed_responses_kept_text_is_counted_as_the_memory_it_takes():
    """A Responses stream keeps its text (its end repeats it) as the pieces it came in; counted by
    characters, a million one-character deltas were 1 MB counted and 84 MB held. What is counted
    now is what the kept strings take, measured."""
    import tracemalloc

    stream = r.ResponseStream(r.echo(r.parse(json.dumps({"model": "m", "input": "hi", "stream": True}).encode())),
                              llm=True)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20_000):
            stream.delta(t.answer_of({"text_output": chr(0x4E00 + i % 1000)}))
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert stream.generated_bytes == 60_000   # three bytes each in UTF-8
    assert 0.8 * taken <= stream.retained <= 1.25 * taken
