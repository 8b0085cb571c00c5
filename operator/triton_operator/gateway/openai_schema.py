"""The OpenAI request bodies the gateway accepts (pure): their models, the fields it refuses and
why, and the checks a body passes before it is parsed; OpenAIError, the error shape every route
answers in. translate.py turns a parsed request into a call to Triton's generate extension.

Requests are checked against what can be honoured: a field this gateway cannot serve for real
(tools, logprobs, logit_bias, n > 1, audio, ...) is refused with a 400 that names it, never
silently ignored; fields that only label a request (user, metadata, store, service_tier) are
accepted; unknown fields are refused as OpenAI's API refuses them.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (BaseModel, ConfigDict, Field, StringConstraints, ValidationError, ValidationInfo,
                      field_validator, model_validator)

MAX_STOP_LENGTH = 256


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None, retry_after: float | None = None,
                 allow: tuple[str, ...] = ()):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.retry_after = retry_after
        self.allow = allow  # the methods a 405 names in its Allow header

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# -- requests -------------------------------------------------------------------------------------

# Fields this gateway cannot honour for real, with why (refused with a 400 naming them unless they
# hold their "off" value, which clients often send by default).
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "functions": ([], "the deprecated functions field is not supported: send tools"),
    "function_call": ("none", "the deprecated function_call field is not supported: send tool_choice"),
    "logit_bias": ({}, "logit_bias is not supported"),
    "audio": (None, "audio output is not supported"),
    "modalities": (["text"], "only text output is supported"),
    "prediction": (None, "predicted outputs are not supported"),
    "reasoning_effort": (None, "reasoning_effort is not supported"),
    "web_search_options": (None, "web search is not supported"),
    "echo": (False, "echo is not supported"),
    "suffix": (None, "suffix (insertion) is not supported"),
}
MAX_N = 16                 # answers per request (the llm model's bound too)
MAX_TOOLS = 128
MAX_TOP_LOGPROBS = 20      # chat's top_logprobs; completions' logprobs goes to 5, as OpenAI's
NEEDS_LLM = "needs a model served with format tensorrt-llm"
GATEWAY_REFUSES = " by this gateway"
UNRECOGNIZED = "unrecognized request argument"
# A request body is JSON of a known shape: a chat of at most 4096 messages, a few small objects
# around it. More containers than this, or deeper nesting, is no request the API has; refused
# before it is parsed into Python objects (about 20-30 times its size for `[{},{},...]`).
MAX_JSON_CONTAINERS = 20_000
MAX_JSON_DEPTH = 64
# A string, or an unterminated one to the end of the body (refused by the parse that follows): the
# closing quote is optional so a match never fails after a scan, and each byte is read once. With
# the quote required, a string of escaped quotes that never ends was rescanned from each of them.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b"[]{}")


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _schema(self) -> ResponseFormat:
        if self.type == "json_schema":
            schema = (self.json_schema or {}).get("schema")
            if not isinstance(schema, dict):
                raise ValueError("json_schema.schema must be a JSON schema object")
        return self

    def guided_json(self) -> str | None:
        if self.type == "json_object":
            return "{}"
        if self.type == "json_schema":
            return json.dumps((self.json_schema or {})["schema"])
        return None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


Label = Annotated[str, StringConstraints(max_length=512)]
FunctionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: FunctionName
    description: str | None = Field(None, max_length=8192)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _OfFunction(BaseModel):
    """{"type": "function", "function": ...}, the shape of a tool and of a tool choice."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]


class Tool(_OfFunction):
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: FunctionName


class NamedChoice(_OfFunction):
    function: NamedFunction


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: FunctionName
    arguments: str = Field(..., max_length=1 << 20)


class ToolCall(BaseModel):
    """A call an assistant turn made, as the client sends it back in the history."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field("", max_length=256)
    type: Literal["function"] = "function"
    function: CalledFunction


class GenerationRequest(BaseModel):
    """What chat and completion requests share (each asks the model to generate)."""

    model_config = ConfigDict(extra="allow")

    # Fields that label or route a request and change nothing in the answer, typed as OpenAI's API
    # types them (metadata: at most 16 pairs of strings): a label cannot carry a structure.
    user: str | None = Field(None, max_length=512)
    metadata: dict[Annotated[str, StringConstraints(max_length=64)], Label] | None = Field(None, max_length=16)
    store: bool | None = None
    service_tier: str | None = Field(None, max_length=32)
    parallel_tool_calls: bool | None = None

    model: str = Field(..., min_length=1, max_length=253)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=1_000_000)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=2)
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _honourable(self) -> GenerationRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")   # as OpenAI answers
        for name, value in (self.model_extra or {}).items():
            if name in UNSUPPORTED:
                off, why = UNSUPPORTED[name]
                if value is None or value == off:
                    continue
                raise ValueError(f"{name}: {why}{GATEWAY_REFUSES}")
            raise ValueError(f"{name}: {UNRECOGNIZED}")
        return self

    def top_logprobs_asked(self) -> int | None:
        """How many alternatives to report per token (None: no log probabilities)."""
        return None

    @field_validator("n", "stream", mode="before")
    @classmethod
    def _null_is_default(cls, v: Any, info: ValidationInfo) -> Any:
        # OpenAI's API takes null for these as their default (its SDKs send it)
        return cls.model_fields[info.field_name].default if v is None else v  # type: ignore[index]

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > 4 or not all(stops) or any(len(s) > MAX_STOP_LENGTH for s in stops):
            raise ValueError(f"at most 4 non-empty stop sequences of at most {MAX_STOP_LENGTH} characters")
        return v

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(None, max_length=256)
    tool_calls: list[ToolCall] | None = Field(None, max_length=MAX_TOOLS)
    tool_call_id: str | None = Field(None, max_length=256)

    @model_validator(mode="before")
    @classmethod
    def _nothing_dropped(cls, value: Any) -> Any:
        # Fields an earlier answer carries (refusal, annotations) are ignored; these would be lost:
        # an old-style function call the model made, or audio it answered with.
        if isinstance(value, dict):
            if value.get("function_call") is not None:
                raise ValueError("function_call: the deprecated function_call of a message is not supported: "
                                 "send tool_calls")
            if value.get("audio") is not None:
                raise ValueError("audio: audio in messages is not supported")
        return value

    @model_validator(mode="after")
    def _calls_on_assistant_turns(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls belong to assistant messages")
        return self

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        if isinstance(value, list) and not all(isinstance(p, dict) and p.get("type") == "text"
                                               and isinstance(p.get("text"), str) for p in value):
            raise ValueError("only text content parts are supported")
        return value

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @model_validator(mode="after")
    def _tools(self) -> ChatRequest:
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tools: a function name is given twice")
        choice = self.tool_choice
        if isinstance(choice, NamedChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice: {choice.function.name!r} is not one of the tools")
        if choice in ("required",) and not names:
            raise ValueError("tool_choice: required needs tools")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs true")
        return self

    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def tools_json(self) -> str | None:
        """The tools the model is offered, as the llm model takes them (None: none)."""
        if not self.tools or self.tool_choice == "none":
            return None
        return json.dumps([{"type": "function", "function": {
            "name": t.function.name, **({"description": t.function.description} if t.function.description else {}),
            "parameters": t.function.parameters if t.function.parameters is not None else
            {"type": "object", "properties": {}}}} for t in self.tools], ensure_ascii=False)

    def tool_choice_text(self) -> str | None:
        if self.tool_choice is None or self.tools_json() is None:
            return None
        if isinstance(self.tool_choice, NamedChoice):
            return json.dumps({"type": "function", "function": {"name": self.tool_choice.function.name}})
        return self.tool_choice


class CompletionRequest(GenerationRequest):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=5)
    best_of: int | None = Field(None, ge=1, le=MAX_N)

    @model_validator(mode="after")
    def _best_of(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of: only best_of equal to n is supported{GATEWAY_REFUSES}")
        return self

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs

    @field_validator("prompt", mode="before")
    @classmethod
    def _text_not_tokens(cls, value: Any) -> Any:
        if isinstance(value, list) and value and (
                all(isinstance(v, int) and not isinstance(v, bool) for v in value)
                or any(isinstance(v, list) for v in value)):
            raise ValueError("token arrays are not supported: send text (the gateway does not tokenize)")
        return value

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("exactly one prompt is supported")
        return v

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def check_structure(raw: bytes | bytearray) -> int:
    """Refuse, before parsing, JSON with more than MAX_JSON_CONTAINERS objects and arrays or nested
    deeper than MAX_JSON_DEPTH; else how many it holds (at most MAX_JSON_DEPTH: an upper bound).
    Brackets inside strings are not counted: the strings are cut out first, which only runs when
    the plain count of brackets is already high (a prompt of code)."""
    plain = raw.count(b"{") + raw.count(b"[")
    if plain <= MAX_JSON_DEPTH:
        return plain
    structure = _JSON_STRING.sub(b"", raw).translate(None, _NOT_STRUCTURE)
    if len(structure) > 2 * MAX_JSON_CONTAINERS:
        raise OpenAIError(400, f"the request body has more than {MAX_JSON_CONTAINERS} JSON objects and arrays",
                          code="request_too_complex")
    depth = 0
    for byte in structure:
        depth += 1 if byte in (0x5B, 0x7B) else -1
        if depth > MAX_JSON_DEPTH:
            raise OpenAIError(400, f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels",
                              code="request_too_complex")
    return len(structure) // 2


class _NotANumber(ValueError):
    pass


def _not_a_number(name: str) -> Any:
    """Python's json reads NaN, Infinity and -Infinity; RFC 8259 has no such numbers, and echoed
    back (a tool's schema, a response's settings) they would make the answer unreadable to strict
    clients."""
    raise _NotANumber(name)


def _finite(text: str) -> float:
    """A JSON number with a fraction or an exponent, as a float: one past a double's range (1e400)
    would be read as infinity, and echoed back as `Infinity`, which is not JSON."""
    value = float(text)
    if not math.isfinite(value):
        raise _NotANumber(text)
    return value


def parse_json(raw: bytes | bytearray, checked: bool = False) -> Any:
    """A request body's JSON, within check_structure's bounds (`checked`: already looked at); a 400
    for anything else. The body must be UTF-8 (RFC 8259; a UTF-8 byte order mark is ignored):
    Python's json also reads UTF-16 and UTF-32, whose bytes check_structure would read as other
    brackets and quotes (a UTF-16 body nested 900 deep passed it)."""
    if not checked:
        check_structure(raw)
    try:
        return json.loads(raw.decode("utf-8-sig"), parse_constant=_not_a_number, parse_float=_finite)
    except _NotANumber:
        raise OpenAIError(400, "the request body is not valid JSON: NaN, Infinity and numbers past a double's "
                               "range are not JSON numbers") from None
    except UnicodeDecodeError:
        raise OpenAIError(400, "the request body is not valid JSON: it must be UTF-8") from None
    except ValueError:
        # No JSON holds a NUL byte (not even inside a string): UTF-16 and UTF-32 text does.
        raise OpenAIError(400, "the request body is not valid JSON" + (": it must be UTF-8" if b"\0" in raw else "")
                          ) from None
    except RecursionError:
        raise OpenAIError(400, f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels",
                          code="request_too_complex") from None


_M = TypeVar("_M", bound=BaseModel)


def parse_body(raw: bytes | bytearray, kind: type[_M], checked: bool = False) -> _M:
    """A request body as `kind` (a request model of this gateway): a 400 naming the field for
    anything it is not. Strictly typed, as OpenAI's API is: `"max_tokens": "7"` or `true`, or
    `"stream": "yes"`, is refused, not read as 7, 1 or true (an integer is still a number)."""
    data = parse_json(raw, checked)
    if not isinstance(data, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    try:
        return kind.model_validate(data, strict=True)
    except RecursionError:
        raise OpenAIError(400, f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels",
                          code="request_too_complex") from None
    except ValidationError as e:
        raise validation_error(e) from None


# The parts of a validation error's location that name which member of a union was tried, not a
# field of the request ("input.constrained-str", "stop.str", "input.list[...].0.MessageItem"):
# pydantic's names for types, kept out of what a client is told.
_UNION_MEMBER = re.compile(r"^(?:str|int|float|bool|none|constrained-\w+|[a-z-]+\[.*\]|[A-Z][A-Za-z]*)$")


_FIELD_NAMED = re.compile(r"^[a-z_]+: ")


def validation_error(e: ValidationError) -> OpenAIError:
    """A request model's first validation error as OpenAI's 400, naming the field. Of a union's
    errors on that field (one per member tried), the one that went deepest: the member the value's
    shape matched, where it failed (a list of items with a bad item is not "not a valid string")."""
    errors = e.errors()
    field = errors[0]["loc"][:1]
    first = max((x for x in errors if x["loc"][:1] == field), key=lambda x: len(x["loc"]))
    param = ".".join(str(p) for p in first["loc"] if not (isinstance(p, str) and _UNION_MEMBER.match(p))) or None
    message = first["msg"].removeprefix("Value error, ")
    if not param and ": " in message:     # a field named by a model validator (_honourable, ...)
        param, text = message.split(": ", 1)[0], message
    elif param and _FIELD_NAMED.match(message):   # ... of a nested object (ChatMessage._nothing_dropped)
        name, rest = message.split(": ", 1)
        param = f"{param}.{name}"
        text = f"{param}: {rest}"
    else:
        text = f"{param}: {message}" if param else message
    return OpenAIError(400, clipped(text, 2 * ECHO_CHARS), param=None if param is None else clipped(param),
                       code="unsupported_parameter" if message.endswith((GATEWAY_REFUSES, UNRECOGNIZED)) else None)


ECHO_CHARS = 200   # of a client's own text (a field's name, a value) an error repeats at most this much


def clipped(text: str, most: int = ECHO_CHARS) -> str:
    """`text`, cut to `most` characters (an unknown field named with 3,000 characters was echoed
    whole, in the message and in `param`)."""
    return text if len(text) <= most else text[:most] + "..."
