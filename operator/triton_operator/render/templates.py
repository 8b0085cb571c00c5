"""The manifest templates (jinja2, shipped with the package) and the YAML they render to: every
value goes in as JSON, so no value can break a document's structure."""

from __future__ import annotations

import json
import re
from typing import Any

import jinja2
import yaml

_env = jinja2.Environment(
    loader=jinja2.PackageLoader("triton_operator.render", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
    # The templates ship with the package and never change while it runs: no stat of the file on
    # every get_template (a sixth of a reconcile's CPU in a bulk, profiled with py-spy).
    auto_reload=False,
)
# libyaml's loader parses a rendered manifest ~20x faster than the pure-Python one; rendering runs
# on every reconcile that cannot be skipped, so this is most of its cost.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> dict[str, Any]:
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 (a safe loader)


# JSON is YAML: every value goes through tojson, so no value can break the document's structure.
_env.policies["json.dumps_kwargs"] = {"sort_keys": False}
# ...nearly: JSON writes a character beyond U+FFFF (an emoji) as a UTF-16 surrogate pair, which a
# YAML parser reads as two lone surrogates (libyaml refuses them), and the API would get a mangled
# string. YAML's own 8-digit escape says the character in one piece; a lone surrogate becomes
# U+FFFD, as Go's JSON decoder makes it. (An escaped backslash before \u is left alone.)
_SURROGATES = re.compile(r"(?<!\\)((?:\\\\)*)\\u(d[89ab][0-9a-f]{2})(?:\\u(d[c-f][0-9a-f]{2}))?|"
                         r"(?<!\\)((?:\\\\)*)\\u(d[c-f][0-9a-f]{2})")


def _json_for_yaml(value: Any, **kwargs: Any) -> str:
    def whole(m: re.Match[str]) -> str:
        if m.group(2) and m.group(3):
            high, low = int(m.group(2), 16), int(m.group(3), 16)
            return f"{m.group(1)}\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08x}"
        return f"{m.group(1) or m.group(4) or ''}\\ufffd"
    return _SURROGATES.sub(whole, json.dumps(value, **kwargs))


_env.policies["json.dumps_function"] = _json_for_yaml


def render_template(template: str, /, **context: Any) -> dict[str, Any]:
    """One template rendered with `context`, as the manifest it describes."""
    return load_yaml(_env.get_template(template).render(**context))


def dump(manifests: list[dict[str, Any]]) -> str:
    """Manifests as one YAML stream, keys in the order rendered."""
    return "".join("---\n" + yaml.safe_dump(m, sort_keys=False) for m in manifests)
