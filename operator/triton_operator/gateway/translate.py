"""OpenAI requests <-> Triton's generate extension (pure).

Triton's generate endpoints (server docs/protocol/extension_generate.md) take one JSON object
whose top-level fields are the model's input tensors and answer with its outputs by name;
generate_stream sends each response as a server-sent event. The TensorRT-LLM ensemble
(tensorrtllm_backend all_models/inflight_batcher_llm/ensemble, and runtime/triton_runtime/
repository.py here) names its inputs text_input, max_tokens, stream, exclude_input_in_output,
temperature, top_p, ... and its output text_output; those are the names used below, and only
inputs the client set are sent (the model declares the others optional).

Chat messages become one prompt through a chat template: the service's spec.openai.chatTemplate,
else the `chat_template` parameter of the Triton model's config (where the model repository
carries the tokenizer's), else a plain "role: content" layout. Templates are Jinja, rendered in
Jinja's immutable sandbox as Hugging Face's transformers does (apply_chat_template).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}")


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

class _Request(BaseModel):
    # Unknown OpenAI fields (user, seed, logit_bias, ...) are accepted and ignored, as vLLM and
    # TensorRT-LLM's own OpenAI server do: clients send them by default.
    model_config = ConfigDict(extra="ignore")

    model: str = Field(..., min_length=1, max_length=253)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1)
    stream: bool = False
    stop: str | list[str] | None = None

    @field_validator("n")
    @classmethod
    def _one(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and (len(v) > 4 or not all(v)):
            raise ValueError("at most 4 non-empty stop sequences")
        return v

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)


class CompletionRequest(_Request):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("exactly one prompt is supported")
        return v

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def parse_body(raw: bytes | bytearray, kind: type[_Request]) -> _Request:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise OpenAIError(400, "the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    try:
        return kind.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        message = first["msg"].removeprefix("Value error, ")
        raise OpenAIError(400, f"{param}: {message}" if param else message, param=param) from None


# -- chat templates --------------------------------------------------------------------------------

def _raise(message: str) -> None:
    raise TemplateError(message)


_env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
_env.globals["raise_exception"] = _raise
_templates: dict[str, Any] = {}


def render_chat(template: str | None, messages: list[ChatMessage], bos_token: str = "",
                eos_token: str = "") -> str:
    """The prompt for `messages` (add_generation_prompt on, as for any chat completion)."""
    source = template or DEFAULT_CHAT_TEMPLATE
    try:
        compiled = _templates.get(source)
        if compiled is None:
            compiled = _env.from_string(source)
            if len(_templates) < 256:
                _templates[source] = compiled
        msgs = [{"role": m.role, "content": m.text()} for m in messages]
        return compiled.render(messages=msgs, add_generation_prompt=True, bos_token=bos_token,
                               eos_token=eos_token, tools=None)
    except ValueError as e:
        raise OpenAIError(400, f"messages: {e}", param="messages") from None
    except TemplateError as e:
        raise OpenAIError(400, f"the model's chat template refused the messages: {e}", param="messages") from None


# -- generate ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Generate:
    """One call to the model's generate endpoint, and what the answer needs."""

    body: dict[str, Any]
    stream: bool
    max_tokens: int
    stops: tuple[str, ...]
    model: str              # the model id the client asked for (echoed back)
    chat: bool


def max_tokens_asked(req: _Request) -> int | None:
    """The max_tokens the client set (for chat, max_completion_tokens supersedes it)."""
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        return req.max_completion_tokens
    return req.max_tokens


def to_generate(req: _Request, prompt: str, default_max_tokens: int) -> Generate:
    max_tokens = req.max_tokens
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        max_tokens = req.max_completion_tokens
    max_tokens = max_tokens or default_max_tokens
    body: dict[str, Any] = {"text_input": prompt, "max_tokens": max_tokens, "stream": req.stream,
                            "exclude_input_in_output": True}
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    return Generate(body, req.stream, max_tokens, tuple(req.stops()), req.model, isinstance(req, ChatRequest))


def output_text(response: dict[str, Any]) -> str:
    """text_output of one generate response (a string, or a list of strings for a [-1] tensor)."""
    if "error" in response:
        # A fixed text: what the model said stays with the operator (see server._upstream_error).
        raise OpenAIError(502, "the model answered with an error", "upstream_error", code="upstream_failed")
    out = response.get("text_output")
    if isinstance(out, list):
        return "".join(str(x) for x in out)
    if out is None:
        raise OpenAIError(502, "the model's response has no text_output: is it a generate-capable LLM model?",
                          "upstream_error")
    return str(out)


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """`text` up to the first stop sequence, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


def _ids(gen: Generate) -> tuple[str, str, int]:
    prefix, obj = ("chatcmpl", "chat.completion") if gen.chat else ("cmpl", "text_completion")
    return f"{prefix}-{uuid.uuid4().hex}", obj, int(time.time())


def completion(gen: Generate, text: str, finish_reason: str) -> dict[str, Any]:
    """A whole (non-streamed) answer."""
    ident, obj, created = _ids(gen)
    if gen.chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": finish_reason, "logprobs": None}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
    return {"id": ident, "object": obj, "created": created, "model": gen.model, "choices": [choice]}


class Stream:
    """Turns generate_stream events into OpenAI chunks: `delta(text)` per event, then `end()`."""

    def __init__(self, gen: Generate):
        self.gen = gen
        self.id, obj, self.created = _ids(gen)
        self.object = obj + ".chunk" if gen.chat else obj
        self.tokens = 0
        self.text = ""
        self.stopped = False
        self._sent = 0      # characters of self.text already sent
        self._started = False

    def _chunk(self, content: str | None, finish: str | None, role: bool = False) -> bytes:
        if self.gen.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if content is not None:
                delta["content"] = content
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": content or "", "finish_reason": finish, "logprobs": None}
        payload = {"id": self.id, "object": self.object, "created": self.created, "model": self.gen.model,
                   "choices": [choice]}
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    def delta(self, piece: str) -> bytes:
        """The chunk(s) for one streamed response ("" when nothing is due yet). A stop sequence
        may span responses, so text that could begin one is held back until it cannot."""
        out = b""
        if not self._started:
            self._started = True
            if self.gen.chat:
                out += self._chunk("", None, role=True)
        if self.stopped or not piece:
            return out
        self.tokens += 1
        self.text += piece
        text, hit = cut_at_stop(self.text, self.gen.stops)
        if hit:
            self.stopped = True
            self.text = text
            ready = len(text)
        else:
            hold = max((len(s) - 1 for s in self.gen.stops), default=0)
            ready = max(self._sent, len(text) - hold)
        if ready > self._sent:
            out += self._chunk(self.text[self._sent:ready], None)
            self._sent = ready
        return out

    def end(self) -> bytes:
        """The rest of the text, the finish reason and the terminating [DONE]."""
        out = b""
        if not self._started:
            out += self.delta("")
        if len(self.text) > self._sent:
            out += self._chunk(self.text[self._sent:], None)
            self._sent = len(self.text)
        out += self._chunk(None if self.gen.chat else "", self.finish_reason())
        return out + b"data: [DONE]\n\n"

    def finish_reason(self) -> str:
        return "length" if not self.stopped and self.tokens >= self.gen.max_tokens else "stop"

    def error(self, err: OpenAIError) -> bytes:
        """An error after the 200 and the first chunks: OpenAI's clients raise on an event
        carrying an `error` object."""
        return b"data: " + json.dumps(err.body()).encode() + b"\n\n"


def sse_events(buffer: bytearray) -> list[dict[str, Any]]:
    """Complete `data:` events parsed out of `buffer` (consumed from it); the rest stays."""
    events: list[dict[str, Any]] = []
    while True:
        end = buffer.find(b"\n\n")
        if end < 0:
            return events
        block = bytes(buffer[:end])
        del buffer[:end + 2]
        data = b"\n".join(line[5:].lstrip(b" ") for line in block.replace(b"\r", b"").split(b"\n")
                          if line.startswith(b"data:"))
        if not data:
            continue
        try:
            event = json.loads(data)
        except ValueError:
            raise OpenAIError(502, "the model's stream held an event that is not JSON", "upstream_error") from None
        if isinstance(event, dict):
            events.append(event)
