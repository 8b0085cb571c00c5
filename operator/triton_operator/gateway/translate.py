"""OpenAI requests <-> Triton's generate extension (pure).

Triton's generate endpoints (server docs/protocol/extension_generate.md) take one JSON object
whose top-level fields are the model's input tensors and answer with its outputs by name;
generate_stream sends each response as a server-sent event. Two model interfaces are spoken:

- `llm`: the model LLM services run (runtime/triton_runtime/serving/contract.py). The gateway
  sends the chat as `messages` (the model renders its own chat template, so user text never
  becomes special tokens) or the prompt as `text_input`, every sampling field the client set with
  OpenAI's defaults made explicit (temperature 1, top_p 1; temperature 0 is greedy), `stop`,
  `seed`, the penalties, `guided_json` for response_format, and reads back `text_output` (new text
  per streamed response), `finish_reason` and the token counts that become `usage`.
- `text`: any other generate-capable model (spec.openai on a python or triton format): inputs
  text_input, max_tokens, stream, exclude_input_in_output, temperature, top_p, output
  text_output. The gateway renders the chat template (spec.openai.chatTemplate, else the model
  config's chat_template parameter, else a plain "role: content" layout) and cuts at stop
  sequences itself; such a model reports no token counts, so no usage is given for it.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .openai_schema import MAX_N, NEEDS_LLM, ChatMessage, ChatRequest, GenerationRequest, NamedChoice, OpenAIError

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}")
# The tag the llm model puts before errors a request caused (its own words, safe to pass on:
# runtime/triton_runtime/serving/contract.py ERROR_TAG).
MODEL_ERROR_TAG = "[llm] "
MAX_COUNT = 2 ** 53   # the largest token count read from a replica (exact as a float)
NO_LOGPROB = -9999.0  # a log probability of a token sampling ruled out, as OpenAI gives it


# -- chat templates (text models; llm models render their own) --------------------------------------

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


def chat_message_dicts(req: ChatRequest) -> list[dict[str, Any]]:
    """The chat as the llm model reads it (a message's `name` reaches no model): role, content as
    plain text, an assistant turn's tool calls as [{id, name, arguments}] and a tool result's
    tool_call_id."""
    def message(m: ChatMessage) -> dict[str, Any]:
        out: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            out["tool_calls"] = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                                 for c in m.tool_calls]
        if m.tool_call_id is not None:
            out["tool_call_id"] = m.tool_call_id
        return out

    return [message(m) for m in req.messages]


def chat_messages(req: ChatRequest) -> str:
    """The `messages` input of the llm model: chat_message_dicts as JSON."""
    try:
        return json.dumps(chat_message_dicts(req), ensure_ascii=False)
    except ValueError as e:
        raise OpenAIError(400, f"messages: {e}", param="messages") from None


# -- generate ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Generate:
    """One call to the model's generate endpoint, and what the answer needs."""

    body: dict[str, Any]
    stream: bool                    # the client's answer streams
    max_tokens: int
    stops: tuple[str, ...]          # cut here by the gateway (text models; the llm model cuts itself)
    model: str                      # the model id the client asked for (echoed back)
    chat: bool
    llm: bool                       # the llm model interface (token counts, finish reasons)
    include_usage: bool = False
    n: int = 1                      # answers asked for
    logprobs: int | None = None     # alternatives per token to report (None: no log probabilities)

    @property
    def upstream_stream(self) -> bool:
        """Whether the model is asked on generate_stream: a streamed answer, or n answers (the
        model's generate endpoint takes one response; n come as a stream, gathered here)."""
        return self.stream or self.n > 1

    def without_body(self) -> Generate:
        """What the answer needs, once the body has been encoded and sent."""
        return replace(self, body={})


def max_tokens_asked(req: GenerationRequest) -> int | None:
    """The max_tokens the client set (for chat, max_completion_tokens supersedes it)."""
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        return req.max_completion_tokens
    return req.max_tokens


def to_generate(req: GenerationRequest, default_max_tokens: int, llm: bool, prompt: str | None = None) -> Generate:
    """The generate call for `req`: for the llm model from the request itself; for a text model
    from `prompt` (the rendered chat or the completion prompt)."""
    max_tokens = max_tokens_asked(req) or default_max_tokens
    chat = isinstance(req, ChatRequest)
    top = req.top_logprobs_asked()
    if not llm:
        # A text model takes a prompt, max_tokens, temperature and top_p: anything else asked for
        # is refused, never dropped on the way (the model would answer as if it had not been asked).
        for name, what, asked in (
                ("response_format", "JSON output", req.response_format is not None and req.response_format.type != "text"),
                ("tools", "tool calling", chat and bool(req.tools) and req.tool_choice != "none"),  # type: ignore[attr-defined]
                ("logprobs", "log probabilities", top is not None), ("n", "more than one answer", req.n > 1),
                ("top_k", "top-k sampling", req.top_k is not None), ("seed", "a sampling seed", req.seed is not None),
                ("presence_penalty", "a presence penalty", req.presence_penalty is not None),
                ("frequency_penalty", "a frequency penalty", req.frequency_penalty is not None),
                ("repetition_penalty", "a repetition penalty", req.repetition_penalty is not None),
                ("stream_options", "token usage", req.include_usage)):
            if asked:
                raise OpenAIError(400, f"{name}: {what} {NEEDS_LLM}", param=name, code="unsupported_parameter")
        body: dict[str, Any] = {"text_input": prompt, "max_tokens": max_tokens, "stream": req.stream,
                                "exclude_input_in_output": True}
        if req.temperature is not None:
            body["temperature"] = req.temperature
        if req.top_p is not None:
            body["top_p"] = req.top_p
        return Generate(body, req.stream, max_tokens, tuple(req.stops()), req.model, chat, False)
    body = {"max_tokens": max_tokens, "stream": req.stream or req.n > 1,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p}
    if chat:
        body["messages"] = chat_messages(req)  # type: ignore[arg-type]
        tools = req.tools_json()  # type: ignore[attr-defined]
        if tools is not None:
            body["tools"] = tools
            choice = req.tool_choice_text()  # type: ignore[attr-defined]
            if choice is not None:
                body["tool_choice"] = choice
            if req.response_format is not None and req.response_format.type != "text" and (
                    choice == "required" or isinstance(req.tool_choice, NamedChoice)):  # type: ignore[attr-defined]
                raise OpenAIError(400, "response_format: a JSON response format and a required tool call cannot "
                                       "both be asked for", param="response_format")
    else:
        body["text_input"] = req.text()  # type: ignore[attr-defined]
    if req.n > 1:
        body["n"] = req.n
    if top is not None:
        body["logprobs"] = top
    for name in ("top_k", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        value = getattr(req, name)
        if value is not None:
            body[name] = value
    if req.stops():
        body["stop"] = req.stops()
    if req.response_format is not None and (schema := req.response_format.guided_json()) is not None:
        body["guided_json"] = schema
    return Generate(body, req.stream, max_tokens, (), req.model, chat, True, req.include_usage, req.n, top)


def encode(payload: Any, request: bool = True) -> bytes:
    """JSON as sent to a replica (`request`) or a client: compact, UTF-8. Text with a lone UTF-16
    surrogate (JSON can escape one, UTF-8 cannot carry it) is a 400 in a request; in an answer it
    is U+FFFD, as in a stream (and a pair a replica split over two events, gathered, is its
    character: it was a 502)."""
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    if not request:
        return utf8(text)
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise OpenAIError(400, "the request holds text that is not valid Unicode (a lone surrogate escape)",
                          code="invalid_text") from None


@dataclass
class Answer:
    """What one generate (or generate_stream event) response holds."""

    text: str
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    index: int = 0
    tool_calls: list[dict[str, str]] = field(default_factory=list)   # [{name, arguments}] (llm model)
    logprobs: list[dict[str, Any]] = field(default_factory=list)     # [{token, logprob, top}] (llm model)
    cached_tokens: int | None = None   # prompt tokens the engine's prefix cache held (llm model)
    kv_events: str = ""                # what the engine's prefix cache did (llm model, kvEvents routing)


def answer_of(response: Any) -> Answer:
    """The parts of one generate (or generate_stream event) response. A replica is not trusted to be
    well-formed: what cannot be read is a 502 (upstream_failed), never a 500."""
    if not isinstance(response, dict):
        raise _unreadable("is not a JSON object")
    if "error" in response:
        raise model_error(response["error"])
    # What reaches the client is text the model wrote, checked as text: a value of another type was
    # written as its Python repr (a dict's keys and all) into the answer.
    out = response.get("text_output")
    if isinstance(out, list) and all(isinstance(x, str) for x in out):
        out = "".join(out)
    if out is None:
        raise OpenAIError(502, "the model's response has no text_output: is it a generate-capable LLM model?",
                          "upstream_error", code="upstream_failed")
    if not isinstance(out, str):
        raise _unreadable("holds a text_output that is not text")
    reason = _first(response.get("finish_reason"))
    if reason is not None and not isinstance(reason, str):
        raise _unreadable("holds a finish_reason that is not text")
    return Answer(out, reason or None, token_count(response.get("prompt_tokens")),
                  token_count(response.get("completion_tokens")), answer_index(response),
                  _calls(_json_list(response.get("tool_calls"), "tool_calls")),
                  _logprobs(_json_list(response.get("logprobs"), "logprobs")),
                  token_count(response.get("cached_tokens")), _str(response.get("kv_events")))


def _unreadable(why: str) -> OpenAIError:
    return OpenAIError(502, f"the model's answer {why}", "upstream_error", code="upstream_failed")


def _calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The llm model's tool calls, checked: a name and arguments, each text."""
    for c in calls:
        if not isinstance(c.get("name", ""), str) or not isinstance(c.get("arguments", "{}"), str):
            raise _unreadable("holds a tool call whose name or arguments are not text")
    return calls


def _logprobs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The llm model's log probabilities, checked: each a token (text that UTF-8 can encode), a
    number, and its top alternatives as [token, number] pairs (what chat_logprobs and
    completion_logprobs write). A log probability of minus infinity (a token sampling ruled out)
    is given as OpenAI gives one, -9999.0: JSON has no infinities."""
    out = []
    for e in entries:
        top = e.get("top") or []
        if not isinstance(top, list) or not all(isinstance(p, list) and len(p) == 2 for p in top):
            raise _unreadable("holds log probabilities that are not numbers")
        for token in (e.get("token", ""), *(t for t, _ in top)):
            if not isinstance(token, str):
                raise _unreadable("holds a log probability's token that is not text")
            try:
                token.encode("utf-8")
            except UnicodeEncodeError:
                raise _unreadable("holds text that is not valid Unicode") from None
        out.append({**e, "logprob": _logprob(e.get("logprob", NO_LOGPROB)), "top": [[t, _logprob(v)] for t, v in top]})
    return out


def _logprob(value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or value == math.inf:
        raise _unreadable("holds log probabilities that are not numbers")   # NaN and +inf too
    try:
        return min(0.0, max(float(value), NO_LOGPROB))   # a rounding's 1e-8 over 0 is 0
    except OverflowError:   # an integer of hundreds of digits (JSON has no bound): no float holds it
        raise _unreadable("holds log probabilities that are not numbers") from None


def answer_index(response: dict[str, Any]) -> int:
    """Which of a request's n answers a response belongs to (0 when it does not say). One that says
    nonsense (not 0 to MAX_N - 1) is unreadable: read as 0, its text was mixed into the first answer."""
    if response.get("index") is None:
        return 0
    index = _int(response.get("index"))
    if index is None or not 0 <= index < MAX_N:
        raise _unreadable("holds an answer index that is not one of the answers asked for")
    return index


def _str(value: Any) -> str:
    value = _first(value)
    return value if isinstance(value, str) else ""


def _first(value: Any) -> Any:
    if isinstance(value, list):
        return value[0] if value else None
    return value


def _json_list(value: Any, name: str) -> list[dict[str, Any]]:
    """An llm model output that holds a JSON array of objects as text ("" or absent: [])."""
    value = _first(value)
    if not value or not isinstance(value, str):
        return []
    try:
        items = json.loads(value)
    except (ValueError, RecursionError):   # nesting deeper than the parser goes is no array of objects
        items = None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise OpenAIError(502, f"the model's {name} output is not a JSON array of objects", "upstream_error",
                          code="upstream_failed")
    return items


def _int(value: Any) -> int | None:
    value = _first(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def token_count(value: Any) -> int | None:
    """A token count as a replica reports it (None: absent, or no count: negative or past any model's)."""
    value = _int(value)
    return value if value is not None and 0 <= value <= MAX_COUNT else None


def model_error(error: Any) -> OpenAIError:
    """A model's error: the llm model's own words (tagged) as a 400, anything else as a fixed text
    (what Triton or another model says stays with the operator: server._upstream_error)."""
    text = _str(error)   # an object's repr reached clients, fields and all
    at = text.find(MODEL_ERROR_TAG)
    if at >= 0:
        return OpenAIError(400, text[at + len(MODEL_ERROR_TAG):][:500], code="model_refused")
    return OpenAIError(502, "the model answered with an error", "upstream_error", code="upstream_failed")


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """`text` up to the first stop sequence, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


def _ids(gen: Generate) -> tuple[str, str, int]:
    prefix, obj = ("chatcmpl", "chat.completion") if gen.chat else ("cmpl", "text_completion")
    return f"{prefix}-{uuid.uuid4().hex}", obj, int(time.time())


def usage(answer: Answer) -> dict[str, int] | None:
    if answer.prompt_tokens is None or answer.completion_tokens is None:
        return None
    return {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens,
            "total_tokens": answer.prompt_tokens + answer.completion_tokens}


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The llm model's calls as OpenAI's message.tool_calls, each with an id of its own."""
    return [{"id": call_id(), "type": "function",
             "function": {"name": str(c.get("name", "")), "arguments": str(c.get("arguments", "{}"))}}
            for c in calls]


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def chat_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat choice's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    return {"content": [{"token": str(e.get("token", "")), "logprob": float(e.get("logprob", NO_LOGPROB)),
                         "bytes": _bytes(str(e.get("token", ""))),
                         "top_logprobs": [{"token": str(t), "logprob": float(lp), "bytes": _bytes(str(t))}
                                          for t, lp in e.get("top") or []]} for e in entries],
            "refusal": None}


def completion_logprobs(entries: list[dict[str, Any]], offset: int = 0) -> dict[str, Any]:
    """A completion choice's legacy `logprobs`: tokens, token_logprobs, top_logprobs (token ->
    logprob per place) and text_offset (characters into the answer, from `offset`)."""
    offsets, at = [], offset
    for e in entries:
        offsets.append(at)
        at += len(str(e.get("token", "")))
    return {"tokens": [str(e.get("token", "")) for e in entries],
            "token_logprobs": [float(e.get("logprob", NO_LOGPROB)) for e in entries],
            "top_logprobs": [{str(t): float(lp) for t, lp in e.get("top") or []} for e in entries],
            "text_offset": offsets}


def gather(answers: list[Answer]) -> list[Answer]:
    """Streamed responses of one request gathered into one answer per index (n > 1 on the
    generate_stream endpoint): texts and log probabilities joined, the last counts and reason."""
    whole: dict[int, Answer] = {}
    for a in answers:
        w = whole.get(a.index)
        if w is None:
            whole[a.index] = Answer(a.text, a.finish_reason, a.prompt_tokens, a.completion_tokens, a.index,
                                    list(a.tool_calls), list(a.logprobs))
            continue
        w.text += a.text
        w.logprobs += a.logprobs
        w.tool_calls += a.tool_calls
        w.finish_reason = a.finish_reason or w.finish_reason
        w.prompt_tokens = a.prompt_tokens if a.prompt_tokens is not None else w.prompt_tokens
        w.completion_tokens = a.completion_tokens if a.completion_tokens is not None else w.completion_tokens
    return [whole[i] for i in sorted(whole)]


def finished(answers: list[Answer], n: int) -> list[Answer]:
    """The llm model's n gathered answers, each ended by its finish reason (its last event always
    carries one: runtime serving contract); a 502 when one is missing or unfinished (the stream
    was cut), and an answer for an index not asked for is dropped."""
    by_index = {a.index: a for a in answers if a.index < n}
    for i in range(n):
        if i not in by_index or not by_index[i].finish_reason:
            raise OpenAIError(502, f"the replica's stream ended before answer {i} finished", "upstream_error",
                              code="upstream_failed")
    return [by_index[i] for i in range(n)]


def total_usage(answers: list[Answer]) -> dict[str, Any] | None:
    """Usage of n answers to one prompt: the prompt once, every answer's tokens."""
    if not answers or any(a.prompt_tokens is None or a.completion_tokens is None for a in answers):
        return None
    prompt = answers[0].prompt_tokens or 0
    done = sum(a.completion_tokens or 0 for a in answers)
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}
    cached = answers[0].cached_tokens
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def completion(gen: Generate, answer: Answer | list[Answer]) -> dict[str, Any]:
    """A whole (non-streamed) answer, one choice per answer. A text model's answer has no finish
    reason of its own: cut at a stop sequence it is "stop", else "stop" too (it cannot be told
    apart from max_tokens)."""
    # Answers the request did not ask for (an index of n or more) are not choices, as in a stream.
    answers = [a for a in (answer if isinstance(answer, list) else [answer]) if a.index < gen.n]
    ident, obj, created = _ids(gen)
    choices = []
    for a in answers:
        text, reason = a.text, a.finish_reason
        if not gen.llm:
            text, _ = cut_at_stop(text, gen.stops)
            reason = reason or "stop"
        logprobs = None
        if gen.logprobs is not None:
            logprobs = chat_logprobs(a.logprobs) if gen.chat else completion_logprobs(a.logprobs)
        if gen.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if a.tool_calls:
                message["content"] = text or None
                message["tool_calls"] = tool_calls(a.tool_calls)
            choices.append({"index": a.index, "message": message, "finish_reason": reason, "logprobs": logprobs})
        else:
            choices.append({"index": a.index, "text": text, "finish_reason": reason, "logprobs": logprobs})
    out: dict[str, Any] = {"id": ident, "object": obj, "created": created, "model": gen.model, "choices": choices}
    counts = total_usage(answers)
    if counts is not None:
        out["usage"] = counts
    return out


@dataclass
class _Choice:
    """One answer's progress in a stream."""

    tokens: int = 0                  # text model: events with text; llm: the model's count
    finish_reason: str | None = None
    done: bool = False
    offset: int = 0                  # characters sent (completions' text_offset; what a text model is charged)


@dataclass
class Stream:
    """Turns generate_stream events into OpenAI chunks: `delta(answer)` per event, then `end()`.
    For a text model each event is one token's text, and stop sequences are cut here (only the
    tail that could still begin one is held back, and only it is searched). With n answers each
    chunk names its choice's index; the stream ends when every answer has."""

    gen: Generate
    id: str = ""
    object: str = ""
    created: int = 0
    prompt_tokens: int | None = None
    stopped: bool = False
    retained: int = 0                # what it keeps for its last chunk, counted: nothing (a stop's tail is short)
    _pending: str = ""
    _started: bool = False
    _choices: dict[int, _Choice] = field(default_factory=dict)
    _generated: int = 0              # text model: bytes of text the replica sent, a stop's cut included

    def __post_init__(self) -> None:
        self.id, obj, self.created = _ids(self.gen)
        self.object = obj + ".chunk" if self.gen.chat else obj
        self._choices = {i: _Choice() for i in range(self.gen.n)}

    @property
    def generated_bytes(self) -> int:
        """Bytes (UTF-8) of text a text model generated, over every answer: what it is charged.
        What the replica sent, with what a stop sequence cut from it (the replica generated it, and
        a whole answer is charged so too)."""
        return self._generated

    @property
    def tokens(self) -> int:
        """Tokens generated, over every answer."""
        return sum(c.tokens for c in self._choices.values())

    def _chunk(self, content: str | None, finish: str | None, role: bool = False, index: int = 0,
               calls: list[dict[str, Any]] | None = None, logprobs: list[dict[str, Any]] | None = None) -> bytes:
        marks: Any = None
        if self.gen.logprobs is not None and logprobs is not None:
            c = self._choices[index]
            marks = chat_logprobs(logprobs) if self.gen.chat else completion_logprobs(logprobs, c.offset)
        if self.gen.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if content is not None:
                delta["content"] = content
            if calls:
                delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(tool_calls(calls))]
            choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": marks}
        else:
            choice = {"index": index, "text": content or "", "finish_reason": finish, "logprobs": marks}
        self._choices[index].offset += len(content or "")
        payload = {"id": self.id, "object": self.object, "created": self.created, "model": self.gen.model,
                   "choices": [choice]}
        if self.gen.include_usage:
            payload["usage"] = None   # as OpenAI sends it: every chunk but the last has a usage of null
        return _event(payload)

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        if not self.gen.chat:
            return b""
        return b"".join(self._chunk("", None, role=True, index=i) for i in range(self.gen.n))

    def delta(self, answer: Answer) -> bytes:
        """The chunk(s) for one streamed response ("" when nothing is due yet)."""
        out = self._start()
        c = self._choices.get(answer.index)
        if self.stopped or c is None or c.done:
            return out
        if self.gen.llm:
            c.tokens = answer.completion_tokens if answer.completion_tokens is not None else c.tokens
            self.prompt_tokens = answer.prompt_tokens if answer.prompt_tokens is not None else self.prompt_tokens
            if answer.text or answer.logprobs:
                out += self._chunk(answer.text, None, index=answer.index, logprobs=answer.logprobs)
            if answer.tool_calls:
                out += self._chunk(None, None, index=answer.index, calls=answer.tool_calls)
            if answer.finish_reason:
                c.finish_reason, c.done = answer.finish_reason, True
                out += self._chunk(None if self.gen.chat else "", c.finish_reason, index=answer.index)
                self.stopped = all(x.done for x in self._choices.values())
            return out
        if not answer.text:
            return out
        c.tokens += 1
        self._generated += utf8_len(answer.text)
        text = self._pending + answer.text
        cut, hit = cut_at_stop(text, self.gen.stops)
        if hit:
            self.stopped, c.finish_reason, self._pending = True, "stop", ""
            return out + (self._chunk(cut, None) if cut else b"")
        hold = _held(text, self.gen.stops)
        self._pending = text[len(text) - hold:] if hold else ""
        ready = text[:len(text) - hold]
        return out + (self._chunk(ready, None) if ready else b"")

    def end(self) -> bytes:
        """The rest of the text, the finish reason of each answer not ended yet, the usage when
        asked for, and [DONE]."""
        out = self._start()
        if self._pending:
            out += self._chunk(self._pending, None)
            self._pending = ""
        for i, c in self._choices.items():
            if not c.done and self.gen.llm:
                # the llm model's last event of an answer always carries its finish reason and
                # counts (runtime serving contract): a stream that ended without it was cut
                raise OpenAIError(502, f"the replica's stream ended before answer {i} finished", "upstream_error",
                                  code="upstream_failed")
            if not c.done:
                c.done = True
                reason = c.finish_reason or ("length" if c.tokens >= self.gen.max_tokens else "stop")
                c.finish_reason = reason
                out += self._chunk(None if self.gen.chat else "", reason, index=i)
        if self.gen.include_usage and self.prompt_tokens is not None:
            out += _event({"id": self.id, "object": self.object, "created": self.created, "model": self.gen.model,
                           "choices": [], "usage": {"prompt_tokens": self.prompt_tokens,
                                                    "completion_tokens": self.tokens,
                                                    "total_tokens": self.prompt_tokens + self.tokens}})
        return out + b"data: [DONE]\n\n"

    def error(self, err: OpenAIError) -> bytes:
        """An error after the 200 and the first chunks: OpenAI's clients raise on an event
        carrying an `error` object."""
        return _event(err.body())


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + utf8(json.dumps(payload, separators=(",", ":"), ensure_ascii=False)) + b"\n\n"


def utf8(text: str) -> bytes:
    """`text` in UTF-8, a lone surrogate (half of a character a replica split over two events)
    becoming U+FFFD, never a broken stream (encode's "replace" wrote "?")."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


def scrub(text: str) -> str:
    """`text` with each lone surrogate (half a character) as U+FFFD: what utf8() writes of it."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def utf8_len(text: str) -> int:
    """Bytes of `text` in UTF-8: what a text model's answer is charged by (four to a token)."""
    return len(text) if text.isascii() else len(utf8(text))


def _held(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a stop sequence."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class EventBuffer:
    """A replica's server-sent events as they arrive: whole events out, at most `cap` bytes of a
    partial one held (a larger event ends the answer with a 502). Lines may end in CRLF, LF or CR
    (the event stream format allows all three: events framed by CRLF were never split, and a text
    model's answer came out empty)."""

    def __init__(self, cap: int):
        self.cap = cap
        self.buffer = bytearray()
        self._after_cr = False   # the last chunk ended in CR: a LF beginning the next ends no line
        self._bad = False        # an unreadable event waits at the buffer's start, for the next call to refuse

    @property
    def size(self) -> int:
        return len(self.buffer)

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        if not chunk:
            return []
        if self._after_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        if b"\r" in chunk:
            # a CR ends its line at once (a CR-framed event waited for the next chunk), and only
            # the new chunk is rewritten, never what the buffer holds
            self._after_cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        else:
            self._after_cr = False
        # a blank line may begin at the buffer's last byte; an unreadable event left whole is first
        start = 0 if self._bad else max(0, len(self.buffer) - 1)
        self.buffer += chunk
        events, self._bad = sse_events(self.buffer, start)
        if len(self.buffer) > self.cap:
            raise OpenAIError(502, f"the model's stream held an event larger than the gateway takes ({self.cap} "
                                   f"bytes)", "upstream_error", code="upstream_answer_too_large")
        return events

    def end(self, cut_ok: bool = False) -> list[dict[str, Any]]:
        """The events left when the stream has ended: a last event whose closing blank line never
        came is read as one (dropped, a text model's answer lost its last words with no error),
        and one that cannot be read is a 502, as any other; one cut short, unreadable, is dropped
        when `cut_ok` (what passes to the client as sent needs no more than its counts)."""
        whole = self._bad
        self._after_cr = self._bad = False
        if not self.buffer.strip():
            return []
        self.buffer += b"\n\n"
        try:
            return sse_events(self.buffer)[0]
        except OpenAIError:
            if whole:
                raise
            if cut_ok:
                return []
            raise OpenAIError(502, "the replica's stream ended inside an event", "upstream_error",
                              code="upstream_failed") from None
        finally:
            self.buffer.clear()


def sse_events(buffer: bytearray, start: int = 0) -> tuple[list[dict[str, Any]], bool]:
    """Complete `data:` events parsed out of `buffer` (consumed from it; no blank line ends before
    `start`); the rest stays. An event that is not JSON is a 502, once the events before it are out
    (they were answered): then it is left first in the buffer, and True says so."""
    events: list[dict[str, Any]] = []
    while True:
        end = buffer.find(b"\n\n", start)
        start = 0
        if end < 0:
            return events, False
        block = bytes(buffer[:end])
        data = b"\n".join(line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:"))
        if not data:
            del buffer[:end + 2]
            continue
        try:
            # a character a replica split over two events is two halves that are not UTF-8: each
            # becomes U+FFFD, where the whole stream was a 502
            event = json.loads(data.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            if events:
                return events, True   # the bad event stays, for the next call to refuse
            raise OpenAIError(502, "the model's stream held an event that is not JSON", "upstream_error",
                              code="upstream_failed") from None
        del buffer[:end + 2]
        if isinstance(event, dict):
            events.append(event)
