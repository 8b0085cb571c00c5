"""OpenAI's Responses API (POST /v1/responses) on the chat translation (pure).

A Responses request is turned into the chat request it means (`to_chat`): `instructions` become
the first system message; `input` is a string (one user message) or a list of items: messages
(their content a string or input_text / output_text parts), the model's earlier `function_call`s
and the `function_call_output`s that answer them; `tools` are function tools (flat: type, name,
description, parameters); `tool_choice`, `max_output_tokens`, `temperature`, `top_p`, and
`text.format` (text, json_object, json_schema) map to their chat fields. The answer comes back as
a Response object (`response_object`): a `message` item with an `output_text` part, and a
`function_call` item per call; streamed, as the Responses event sequence (`ResponseStream`:
response.created, response.in_progress, output_item.added, content_part.added, output_text.delta
..., output_text.done, content_part.done, output_item.done, function_call_arguments.delta/.done,
response.completed).

Nothing is stored: `previous_response_id` and `background` are refused with a 400 that says so,
and so are the built-in tools (web search, file search, computer use, ...), which only OpenAI runs.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from . import openai_schema as oai
from . import translate as t

STATELESS = "this gateway stores no responses"


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class InputText(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["input_text", "output_text"]
    text: str


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: str = Field(..., max_length=256)
    name: oai.FunctionName
    arguments: str = Field(..., max_length=1 << 20)


class FunctionOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: str = Field(..., max_length=256)
    output: str


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: oai.FunctionName
    description: str | None = Field(None, max_length=8192)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: oai.FunctionName


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema(self) -> TextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("a json_schema format needs its schema, a JSON schema object")
        return self


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: TextFormat | None = None


MAX_INPUT_ITEMS = 4096


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., min_length=1, max_length=253)
    # At most MAX_INPUT_ITEMS items (checked before they are parsed, in _before); a string is as
    # long as the body allows (a max_length on the field held a string to 4,096 characters too).
    input: str | list[MessageItem | FunctionCallItem | FunctionOutputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = Field(None, max_length=oai.MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=1_000_000)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    text: TextOptions | None = None
    store: bool | None = None
    metadata: dict[Annotated[str, StringConstraints(max_length=64)], oai.Label] | None = Field(None, max_length=16)
    user: str | None = Field(None, max_length=512)
    service_tier: str | None = Field(None, max_length=32)
    truncation: Literal["disabled"] | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _before(cls, data: Any) -> Any:
        items = data.get("input") if isinstance(data, dict) else None
        if isinstance(items, list) and len(items) > MAX_INPUT_ITEMS:
            raise ValueError(f"input: at most {MAX_INPUT_ITEMS} items, not {len(items)}")
        tools = data.get("tools") if isinstance(data, dict) else None
        if isinstance(tools, list):   # anything else is refused by the field's own type
            for i, tool in enumerate(tools):
                if isinstance(tool, dict) and tool.get("type") != "function":
                    raise ValueError(f"tools.{i}: only function tools are served here, not {tool.get('type')!r}")
        if isinstance(data, dict) and "stream" in data and data["stream"] is None:
            data = {k: v for k, v in data.items() if k != "stream"}   # OpenAI's API takes null as false
        return data

    @model_validator(mode="after")
    def _served(self) -> ResponsesRequest:
        if self.previous_response_id is not None:
            raise ValueError(f"previous_response_id: {STATELESS}; send the conversation in input")
        if self.background:
            raise ValueError(f"background: {STATELESS}; ask without background")
        if self.reasoning:
            raise ValueError("reasoning: reasoning options are not supported")
        if self.include:
            raise ValueError("include: no extra outputs are available")
        return self


def parse(raw: bytes | bytearray, checked: bool = False) -> ResponsesRequest:
    """The request, refused (400) when what its answer repeats (metadata, the format's name and
    schema) holds text that cannot be UTF-8: found once the model has answered, it was a 502 blamed
    on the replica, after the tokens were spent."""
    req = oai.parse_body(raw, ResponsesRequest, checked)
    t.encode(echo(req))
    return req


def to_chat(req: ResponsesRequest) -> oai.ChatRequest:
    """The chat request a Responses request means (the gateway's checks then apply to it)."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    items = [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    for item in items:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                if len(last["tool_calls"]) >= oai.MAX_TOOLS:
                    # said here: the chat request's own error counted the merged calls as a list of input
                    raise oai.OpenAIError(400, f"input: at most {oai.MAX_TOOLS} function_call items in a row "
                                             "(the calls of one assistant turn)", param="input")
                last["tool_calls"].append(call)     # parallel calls of one turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    body: dict[str, Any] = {"model": req.model, "messages": messages, "stream": req.stream}
    if req.tools:
        body["tools"] = [{"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
                         for tool in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = (req.tool_choice if isinstance(req.tool_choice, str) else
                               {"type": "function", "function": {"name": req.tool_choice.name}})
    for name, value in (("max_tokens", req.max_output_tokens), ("temperature", req.temperature), ("top_p", req.top_p)):
        if value is not None:
            body[name] = value
    fmt = req.text.format if req.text else None
    if fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.name or "answer",
                                                                          "schema": fmt.schema_}}
    try:
        return oai.ChatRequest.model_validate(body)
    except ValidationError as e:
        raise in_responses_terms(oai.validation_error(e)) from None


# Chat's fields as /v1/responses names them (an error about the chat request made from a Responses
# request names the field the client sent).
RESPONSES_NAMES = {"messages": "input", "max_tokens": "max_output_tokens"}


def in_responses_terms(err: oai.OpenAIError) -> oai.OpenAIError:
    """`err`, about the chat request made from a Responses request, naming the Responses fields (an
    item of `input` by the field alone: the chat's messages are numbered from the instructions)."""
    param = err.param or ""
    name = RESPONSES_NAMES.get(param.split(".", 1)[0])
    if name is None:
        return err
    err.param = name
    if err.message.startswith(param + ": "):
        err.message = name + err.message[len(param):]
    return err


def echo(req: ResponsesRequest) -> dict[str, Any]:
    """The request's settings a Response object repeats: all of the request an answer needs (the
    parsed request itself, its input items above all, is dropped before the replica is asked)."""
    fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else {"type": "text"}
    return {"instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": req.model, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "tool_choice": (req.tool_choice if isinstance(req.tool_choice, str) else
                            req.tool_choice.model_dump() if req.tool_choice else "auto"),
            "tools": [tool.model_dump(exclude_none=True) for tool in req.tools or []],
            "text": {"format": fmt}, "truncation": "disabled", "metadata": req.metadata or {},
            "user": req.user, "store": False, "previous_response_id": None, "reasoning": None,
            "error": None, "incomplete_details": None, "object": "response"}


def _usage(prompt: int | None, done: int | None) -> dict[str, Any] | None:
    if prompt is None or done is None:
        return None
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0}, "output_tokens": done,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + done}


def _message(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []}


def _function_call(item_id: str, call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"] if status == "completed" else "", "status": status}


def _status(reason: str | None) -> tuple[str, dict[str, Any] | None]:
    if reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def response_object(echoed: dict[str, Any], answer: t.Answer, response_id: str | None = None,
                    created: int | None = None) -> dict[str, Any]:
    """A whole Response for one answer of the llm model (`echoed`: the request's `echo`)."""
    output: list[dict[str, Any]] = []
    if answer.text or not answer.tool_calls:
        output.append(_message(_id("msg"), answer.text))
    output += [_function_call(_id("fc"), call) for call in t.tool_calls(answer.tool_calls)]
    status, incomplete = _status(answer.finish_reason)
    return {**echoed, "id": response_id or _id("resp"), "created_at": created or int(time.time()),
            "status": status, "incomplete_details": incomplete, "output": output,
            "usage": _usage(answer.prompt_tokens, answer.completion_tokens)}


def _held(text: str) -> int:
    """The memory a kept string takes, with its place in a list: a piece of one character takes
    some 60 bytes, not one (a million one-character deltas were counted 1 MB and took 84 MB)."""
    return sys.getsizeof(text) + 8


@dataclass
class ResponseStream:
    """generate_stream events -> the Responses event sequence; the same interface as
    translate.Stream (delta per event, end, error, stopped, tokens, prompt_tokens). `echoed` is the
    request's `echo`. `retained`: the memory the answer it keeps for its last events takes (they
    repeat it whole: the text, and function calls' arguments), for the bytes the request holds."""

    echoed: dict[str, Any]
    llm: bool = False
    id: str = field(default_factory=lambda: _id("resp"))
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_tokens: int | None = None
    tokens: int = 0
    stopped: bool = False
    finish_reason: str | None = None
    retained: int = 0
    _generated: int = 0
    _seq: int = 0
    _started: bool = False
    # the open message's text, in the pieces it came in (a str grown by += on an attribute is copied
    # each time: a 50 MB answer took 11 s, 150 MB 96 s)
    _pieces: list[str] = field(default_factory=list)
    _message_id: str | None = None
    _calls: list[dict[str, Any]] = field(default_factory=list)
    _output: list[dict[str, Any]] = field(default_factory=list)

    @property
    def generated_bytes(self) -> int:
        """Bytes (UTF-8) of the answer, its text and calls' arguments: what a text model is charged."""
        return self._generated

    def _event(self, kind: str, **payload: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **payload}
        self._seq += 1
        return f"event: {kind}\ndata: ".encode() + t.utf8(json.dumps(data, separators=(",", ":"),
                                                                   ensure_ascii=False)) + b"\n\n"

    def _snapshot(self, status: str, output: list[dict[str, Any]], incomplete: dict[str, Any] | None = None,
                  usage: dict[str, Any] | None = None) -> dict[str, Any]:
        return {**self.echoed, "id": self.id, "created_at": self.created, "status": status,
                "incomplete_details": incomplete, "output": output, "usage": usage}

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        snapshot = self._snapshot("in_progress", [])
        return self._event("response.created", response=snapshot) + self._event("response.in_progress",
                                                                                  response=snapshot)

    def _open_message(self) -> bytes:
        if self._message_id is not None:
            return b""
        self._message_id = _id("msg")
        index = len(self._output)
        return (self._event("response.output_item.added", output_index=index,
                            item=_message(self._message_id, "", "in_progress"))
                + self._event("response.content_part.added", item_id=self._message_id, output_index=index,
                              content_index=0, part={"type": "output_text", "text": "", "annotations": []}))

    def _close_message(self) -> bytes:
        if self._message_id is None:
            return b""
        index = len(self._output)
        text = "".join(self._pieces)
        self.retained += _held(text) - sum(_held(p) for p in self._pieces)   # one string now, not many
        self._pieces = []
        part = {"type": "output_text", "text": text, "annotations": []}
        item = _message(self._message_id, text)
        self._output.append(item)
        out = (self._event("response.output_text.done", item_id=self._message_id, output_index=index,
                           content_index=0, text=text, logprobs=[])
               + self._event("response.content_part.done", item_id=self._message_id, output_index=index,
                             content_index=0, part=part)
               + self._event("response.output_item.done", output_index=index, item=item))
        self._message_id = None
        return out

    def delta(self, answer: t.Answer) -> bytes:
        out = self._start()
        if self.stopped:
            return out
        self.tokens = answer.completion_tokens if answer.completion_tokens is not None else self.tokens
        self.prompt_tokens = answer.prompt_tokens if answer.prompt_tokens is not None else self.prompt_tokens
        if answer.text:
            out += self._open_message()
            # as its delta shows it: half a character (a pair split over two events) is U+FFFD in
            # the text the done events repeat too, never the character there and two U+FFFD here
            text = t.scrub(answer.text)
            self._pieces.append(text)
            self.retained += _held(text)
            self._generated += t.utf8_len(text)
            out += self._event("response.output_text.delta", item_id=self._message_id,
                               output_index=len(self._output), content_index=0, delta=text, logprobs=[])
        if answer.tool_calls:
            out += self._close_message()
            for call in t.tool_calls(answer.tool_calls):
                item_id, index = _id("fc"), len(self._output)
                out += self._event("response.output_item.added", output_index=index,
                                   item=_function_call(item_id, call, "in_progress"))
                arguments = call["function"]["arguments"]
                self.retained += _held(arguments)
                self._generated += t.utf8_len(arguments)
                out += self._event("response.function_call_arguments.delta", item_id=item_id, output_index=index,
                                   delta=arguments)
                out += self._event("response.function_call_arguments.done", item_id=item_id, output_index=index,
                                   arguments=arguments)
                item = _function_call(item_id, call)
                self._output.append(item)
                out += self._event("response.output_item.done", output_index=index, item=item)
        if answer.finish_reason:
            self.finish_reason = answer.finish_reason
            self.stopped = True
        return out

    def end(self) -> bytes:
        if self.llm and not self.stopped:
            # the llm model's last event carries its finish reason (runtime serving contract)
            raise oai.OpenAIError(502, "the replica's stream ended before the answer finished", "upstream_error",
                                  code="upstream_failed")
        out = self._start()
        if not self._output and self._message_id is None:
            out += self._open_message()        # an empty answer is still one (empty) message
        out += self._close_message()
        status, incomplete = _status(self.finish_reason)
        snapshot = self._snapshot(status, self._output, incomplete, _usage(self.prompt_tokens, self.tokens))
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + self._event(kind, response=snapshot)

    def error(self, err: oai.OpenAIError) -> bytes:
        snapshot = self._snapshot("failed", self._output)
        # the Response's error codes are OpenAI's own list; a replica's failure is a server_error there
        snapshot["error"] = {"code": "server_error", "message": err.message}
        return self._event("error", code=err.code, message=err.message, param=err.param) + self._event(
            "response.failed", response=snapshot)
