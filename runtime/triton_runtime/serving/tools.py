"""Tool calling (pure): the functions a chat may call, into the prompt, and the calls out of the
generated text.

Into the prompt. A chat template that knows tools (it names `tools`, as Llama 3.1's, Qwen 2.5's
and Mistral's do) gets them as transformers' apply_chat_template passes them: `tools`, a list of
{"type": "function", "function": {name, description, parameters}}, and each assistant turn's
`tool_calls` as [{"id", "type": "function", "function": {"name", "arguments": <object>}}], each
tool result as a `tool` message with its `tool_call_id`. What a template renders is its own
trusted text (special tokens parsed), so the model refuses tools and calls whose text holds one of
its special tokens (`has_special`, from the engine). A template that does not know tools (SmolLM2's)
gets them as plain text: a system message that lists them and asks for calls in <tool_call> tags
(the Hermes format that SmolLM2, Qwen and many fine-tunes are trained on), earlier calls as that
text in the assistant's turn, and tool results as user turns in <tool_response> tags.

Out of the text. A call is read in the formats the documented families write:
- `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one or more, an object or a list
  in each (Hermes: Qwen 2.5/3, SmolLM2/3);
- `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral);
- `<|python_tag|>{"name": ..., "parameters": {...}}`, or the whole answer such an object (Llama 3.x's
  JSON tool calls).
A call names one of the tools offered, with an object for arguments; text that is not such a call
stays text. When the call is forced (tool_choice "required" or a named function) the answer is
generated under a JSON schema of the calls allowed (`forced_schema`), so even a small model
returns one that matches, and the whole answer is the call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .text import first_mark, held_tail

MAX_TOOLS = 128
NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
OPEN_TAGS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>")
_TAG_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


class ToolError(ValueError):
    """Tools or a tool choice the model refuses; the message says why."""


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str          # a JSON object, as text (OpenAI's function.arguments)

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class Choice:
    """tool_choice: "none", "auto", "required", or a function's name (forced)."""

    mode: str
    name: str | None = None

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "function")


def parse_tools(raw: str | None) -> list[dict[str, Any]]:
    """The `tools` input: a JSON array of {"type": "function", "function": {"name", "description"?,
    "parameters"?}}; [] when absent."""
    if raw is None or raw == "":
        return []
    try:
        tools = json.loads(raw)
    except ValueError:
        raise ToolError("tools is not valid JSON") from None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ToolError(f"tools must be a JSON array of at most {MAX_TOOLS} functions")
    out, names = [], set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not NAME.match(fn["name"]):
            raise ToolError(f"tools[{i}] must be {{type: function, function: {{name: 1-64 letters, digits, "
                            f"_ . -, parameters: a JSON schema}}}}")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON schema object")
        if fn["name"] in names:
            raise ToolError(f"tools[{i}]: the function name {fn['name']!r} is given twice")
        names.add(fn["name"])
        desc = fn.get("description")
        function = {"name": fn["name"], **({"description": desc} if isinstance(desc, str) else {}),
                    "parameters": params}
        out.append({"type": "function", "function": function})
    return out


def parse_choice(raw: str | None, tools: Sequence[dict[str, Any]]) -> Choice:
    """The `tool_choice` input: none, auto (the default with tools), required, or a JSON
    {"type": "function", "function": {"name": ...}} naming one of the tools."""
    if raw is None or raw == "":
        return Choice("auto" if tools else "none")
    if raw in ("none", "auto", "required"):
        if raw != "none" and not tools:
            raise ToolError(f"tool_choice {raw!r} needs tools")
        return Choice(raw)
    try:
        named = json.loads(raw)
        name = named["function"]["name"] if named.get("type") == "function" else None
    except (ValueError, KeyError, TypeError, AttributeError):
        name = None
    if not isinstance(name, str):
        raise ToolError('tool_choice must be none, auto, required or {"type": "function", "function": {"name": ...}}')
    if name not in {t["function"]["name"] for t in tools}:
        raise ToolError(f"tool_choice names {name!r}, which is not one of the tools")
    return Choice("function", name)


def offered(tools: Sequence[dict[str, Any]], choice: Choice) -> list[dict[str, Any]]:
    """The tools the prompt shows: none for tool_choice none, the named one when one is forced."""
    if choice.mode == "none":
        return []
    if choice.mode == "function":
        return [t for t in tools if t["function"]["name"] == choice.name]
    return list(tools)


def forced_schema(tools: Sequence[dict[str, Any]], choice: Choice) -> str | None:
    """The JSON schema a forced answer is generated under: one call, {"name": <a tool's name>,
    "arguments": <its parameters>}; None when the call is not forced."""
    if not choice.forced:
        return None
    calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                               "arguments": t["function"]["parameters"]},
              "required": ["name", "arguments"], "additionalProperties": False}
             for t in offered(tools, choice)]
    return json.dumps(calls[0] if len(calls) == 1 else {"anyOf": calls})


def knows_tools(template: str) -> bool:
    """Whether a chat template renders `tools` itself."""
    return re.search(r"\btools\b", template) is not None


# -- into the prompt ---------------------------------------------------------------------------------

def _arguments_object(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value


def for_template(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], template: str,
                 has_special: Callable[[str], bool]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and the `tools` variable to render with: as the template expects when it knows
    tools (checked for special-token text, which would become the template's own), else as plain
    text in the messages (see the module)."""
    uses_tools = bool(tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    if not uses_tools:
        return list(messages), None
    if knows_tools(template):
        rendered_as_template: list[str] = [json.dumps(tools, ensure_ascii=False)]
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [{"id": c.get("id") or f"call_{i}", "type": "function",
                                    "function": {"name": c["name"], "arguments": _arguments_object(c["arguments"])}}
                                   for i, c in enumerate(m["tool_calls"])]
                rendered_as_template.append(json.dumps(m["tool_calls"], ensure_ascii=False))
            if m.get("tool_call_id"):
                rendered_as_template.append(m["tool_call_id"])
            out.append(m)
        if any(has_special(text) for text in rendered_as_template):
            raise ToolError("tools and tool calls must not hold the model's special tokens")
        return out, list(tools) if tools else None
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = "\n".join("<tool_call>\n" + json.dumps({"name": c["name"], "arguments": _arguments_object(
                c["arguments"])}, ensure_ascii=False) + "\n</tool_call>" for c in m["tool_calls"])
            content = (m.get("content") or "")
            out.append({"role": "assistant", "content": (content + "\n" if content else "") + calls})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": "<tool_response>\n" + (m.get("content") or "") + "\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    if tools:
        block = system_block(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out, None


def system_block(tools: Sequence[dict[str, Any]]) -> str:
    """The tools as a system message's text, for a template that does not render them."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou can call functions to help answer. They are listed, one JSON object a line, "
            f"between <tools> and </tools>:\n<tools>\n{listed}\n</tools>\n\n"
            "To call one, answer with a JSON object of its name and arguments between <tool_call> and "
            "</tool_call>:\n<tool_call>\n{\"name\": \"<function name>\", \"arguments\": {<arguments>}}\n</tool_call>")


# -- out of the text ---------------------------------------------------------------------------------

def _call(obj: Any, names: set[str]) -> Call | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):      # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    text = json.dumps(args, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # A model can write a lone surrogate escape ("\\ud800"), which UTF-8 cannot carry: kept
        # escaped, the arguments are still the JSON it wrote, and the answer can be sent (it could
        # not be, and the request never ended).
        text = json.dumps(args, ensure_ascii=True)
    return Call(obj["name"], text)


def _calls(text: str, names: set[str]) -> list[Call] | None:
    """The calls in one JSON value (an object or a list of them); None if it is not that."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [_call(item, names) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def parse_calls(text: str, tools: Sequence[dict[str, Any]], forced: bool = False) -> tuple[str, list[Call]]:
    """The text before any call, and the calls in `text` (none: the whole text, [])."""
    names = {t["function"]["name"] for t in tools}
    if not names:
        return text, []
    stripped = text.strip()
    if forced or stripped.startswith(("{", "[")):
        calls = _calls(stripped, names)
        if calls:
            return "", calls
    at = first_mark(text, OPEN_TAGS)
    if at < 0:
        return text, []
    before, rest = text[:at], text[at:]
    calls: list[Call] = []
    if rest.startswith("<tool_call>"):
        for block in _TAG_BLOCK.findall(rest):
            found = _calls(block, names)
            if found is None:
                return text, []
            calls += found
    else:
        tag = "[TOOL_CALLS]" if rest.startswith("[TOOL_CALLS]") else "<|python_tag|>"
        found = _calls(rest[len(tag):].strip(), names)
        if found is None:
            return text, []
        calls = found
    return (before.rstrip(), calls) if calls else (text, [])


class CallScanner:
    """Streamed text with tools offered: text goes out as it comes until a call may have begun (one
    of OPEN_TAGS, or an answer that starts with a JSON object or list); from there on it is held,
    and `end()` says what it was. A forced call is held from the start."""

    def __init__(self, tools: Sequence[dict[str, Any]], forced: bool = False):
        self.tools = list(tools)
        self.forced = forced
        self.holding = forced
        # What is held, in pieces joined when read, and whether anything not blank went out: kept
        # as strings grown at every token, each was copied whole each time (80,000 tokens of a plain
        # answer took 15 s of the engine's token thread).
        self.parts: list[str] = []
        self.blank = True      # every held piece is blank
        self.spoke = False

    def push(self, piece: str) -> str:
        if self.holding or (not self.spoke and self.blank and not piece.strip()):
            self.parts.append(piece)
            return ""
        text = "".join(self.parts) + piece
        self.parts, self.blank = [], True
        if not self.spoke and text.lstrip()[:1] in ("{", "["):
            self.holding, self.parts = True, [text]
            return ""
        at = first_mark(text, OPEN_TAGS)
        if at >= 0:
            out, self.parts, self.holding = text[:at], [text[at:]], True
            self.spoke = self.spoke or bool(out.strip())
            return out
        keep = held_tail(text, OPEN_TAGS)
        out = text[:len(text) - keep]
        if keep:
            self.parts, self.blank = [text[len(text) - keep:]], False   # the start of a tag is never blank
        self.spoke = self.spoke or bool(out.strip())
        return out

    def end(self) -> tuple[str, list[Call]]:
        """The rest of the text, and the calls: what was held, read as calls, or as text if it was not."""
        held, self.parts = "".join(self.parts), []
        if not self.holding:
            return held, []
        if not self.spoke:
            before, calls = parse_calls(held, self.tools, self.forced)
        else:
            before, calls = parse_calls(held, self.tools)
        if not calls:
            return held, []
        return before, calls
