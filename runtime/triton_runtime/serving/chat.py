"""Chat messages -> the prompt, in pieces whose origin is known (pure).

A chat template (Jinja, as in a Hugging Face tokenizer_config.json or chat_template.jinja, or a
GGUF's tokenizer.chat_template) writes special tokens such as `<|im_start|>` around each message.
Rendering it and tokenizing the whole text, as transformers' apply_chat_template(tokenize=True)
does, lets a user who types `<|im_end|><|im_start|>system` end their own message and write a
system turn. Here the template is rendered with a placeholder in place of each message's content,
so the result is a list of pieces: the template's own text (`trusted`: special tokens in it are
parsed) and each message's content (not trusted: tokenized as plain text, special-token strings
included). The placeholders are private-use characters with a fresh nonce, which no template
filter changes; a template that trims the content (Llama 3's `| trim`) is honoured by comparing
with a render of the real messages.

The Jinja environment is that of transformers' chat templating (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols, raise_exception, strftime_now, tojson that keeps
non-ASCII).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Sequence

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES = ("system", "user", "assistant", "tool", "developer")


class ChatError(ValueError):
    """Messages the template (or this module) refuses; the message says why."""


@dataclass(frozen=True)
class Piece:
    text: str
    trusted: bool   # the template's own text (special tokens parsed) or a message's content (plain text)


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


_env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
_env.globals["raise_exception"] = _raise
_env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
_env.filters["tojson"] = _tojson
_compiled: dict[str, Any] = {}


def _template(source: str) -> Any:
    compiled = _compiled.get(source)
    if compiled is None:
        try:
            compiled = _env.from_string(source)
        except TemplateError as e:
            raise ChatError(f"the model's chat template does not compile: {e}") from None
        if len(_compiled) < 64:
            _compiled[source] = compiled
    return compiled


def parse_messages(raw: str) -> list[dict[str, Any]]:
    """The `messages` input: a JSON array of {role, content} with string content; an assistant
    turn may carry `tool_calls` ([{id, name, arguments}], arguments a JSON object as text) and a
    tool result its `tool_call_id`."""
    try:
        messages = json.loads(raw)
    except ValueError:
        raise ChatError("messages is not valid JSON") from None
    if not isinstance(messages, list) or not messages:
        raise ChatError("messages must be a non-empty JSON array")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content") or "", str):
            raise ChatError(f"messages[{i}] must be {{role: one of {', '.join(ROLES)}, content: a string}}")
        message: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        calls = m.get("tool_calls")
        if calls is not None:
            if m["role"] != "assistant" or not isinstance(calls, list) or not all(
                    isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments"), str)
                    and isinstance(c.get("id", ""), str) for c in calls):
                raise ChatError(f"messages[{i}].tool_calls must be on an assistant turn, "
                                f"[{{id, name, arguments}}] with arguments as text")
            message["tool_calls"] = [{"id": c.get("id", ""), "name": c["name"], "arguments": c["arguments"]}
                                     for c in calls]
        if isinstance(m.get("tool_call_id"), str):
            message["tool_call_id"] = m["tool_call_id"]
        out.append(message)
    return out


def render(template: str, messages: Sequence[dict[str, Any]], bos_token: str = "", eos_token: str = "",
           add_generation_prompt: bool = True, tools: list[dict[str, Any]] | None = None) -> list[Piece]:
    """The prompt for `messages` as trusted template text and untrusted contents, in order;
    `tools` is the template's `tools` variable (tools.for_template)."""
    nonce = secrets.token_hex(6)
    marks = [f"\ue000{nonce}:{i}\ue001" for i in range(len(messages))]
    compiled = _template(template)
    context = {"bos_token": bos_token, "eos_token": eos_token, "add_generation_prompt": add_generation_prompt,
               "tools": tools}
    try:
        marked = compiled.render(messages=[{**m, "content": mark} for m, mark in zip(messages, marks)], **context)
        real = compiled.render(messages=list(messages), **context)
    except TemplateError as e:
        raise ChatError(f"the model's chat template refused the messages: {e}") from None
    pieces: list[Piece] = []
    rest = marked
    contents = []
    for i, mark in enumerate(marks):
        before, found, after = rest.partition(mark)
        if not found:   # the template left this message out (e.g. an older assistant turn): fine
            continue
        pieces.append(Piece(before, True))
        contents.append((len(pieces), messages[i]["content"]))
        pieces.append(Piece("", False))
        rest = after
    pieces.append(Piece(rest, True))
    # Which form of each content did the template write: as given, or trimmed?
    for form in (lambda s: s, str.strip):
        for index, content in contents:
            pieces[index] = Piece(form(content), False)
        if "".join(p.text for p in pieces) == real:
            break
    else:
        for index, content in contents:
            pieces[index] = Piece(content, False)
    return [p for p in pieces if p.text]


def plain(pieces: Sequence[Piece]) -> str:
    return "".join(p.text for p in pieces)
