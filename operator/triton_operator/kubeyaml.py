"""Read YAML as kubectl does (pure), so that `render` judges a file by what `kubectl apply -f`
would send to the API server, not by PyYAML's own reading of it.

kubectl reads YAML with go-yaml v2 (through sigs.k8s.io/yaml), turns it into JSON and sends that:
- y, Y, yes, n, N, no, on, off (any case variant go-yaml lists) are booleans; PyYAML agrees
  except on y/Y/n/N;
- a timestamp stays a string (go-yaml keeps timestamp-like values as strings for interface{});
- a float with an integral value is written by Go's JSON encoder without a decimal point, so
  `replicas: 1.0` arrives as the integer 1 (beyond 64 bits it is read back as a float);
- map keys that are numbers or booleans become strings ("1", "true");
- an integer beyond 64 bits is read as a float;
- a lone UTF-16 surrogate in a JSON string becomes U+FFFD.
Limits keep a hostile file from exhausting memory: nesting depth and the number of values after
aliases are expanded (go-yaml refuses "excessive aliasing" too).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import yaml

MAX_DEPTH = 100
MAX_VALUES = 1_000_000
INT64 = 2**63


class KubeYAMLError(ValueError):
    pass


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml parses, when built in
    """SafeLoader with go-yaml v2's implicit types (its booleans and numbers; no timestamps)."""


# go-yaml v2 resolve.go: which plain scalars are booleans, and how a scalar starting with a digit,
# a sign or a dot becomes an integer or a float (else it is a string, as timestamps are).
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag in ("tag:yaml.org,2002:null",
                                                                   "tag:yaml.org,2002:merge")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_BOOL = re.compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$")
_NUMBER_TAG = "tag:kubernetes.io,2025:go-yaml-number"
_SPECIAL_FLOATS = {
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
_GO_INT = re.compile(r"^[-+]?(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)$")
_GO_UINT = re.compile(r"^(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)$")
_YAML_STYLE_FLOAT = re.compile(r"^[-+]?([.][0-9]+|[0-9]+([.][0-9]*)?)([eE][-+]?[0-9]+)?$")
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL, list("yYnNtTfFoO"))
_Loader.add_implicit_resolver(_NUMBER_TAG, re.compile(r"^[-+.0-9]"), list("-+.0123456789"))


def _go_int(text: str) -> int:
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    if digits[:2] in ("0x", "0X", "0o", "0O", "0b", "0B"):
        return sign * int(digits, 0)
    return sign * (int(digits, 8) if digits.startswith("0") and len(digits) > 1 else int(digits))


def _construct_number(loader: yaml.SafeLoader, node: yaml.Node) -> int | float | str:
    text = loader.construct_scalar(node)
    if text in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[text]
    if text.startswith("."):
        return float(text) if re.fullmatch(r"^[.][0-9]+([eE][-+]?[0-9]+)?$", text) else text
    plain = text.replace("_", "")
    if _GO_INT.fullmatch(plain):
        value = _go_int(plain)
        if -INT64 <= value < INT64 or (value >= 0 and value < 2 * INT64 and _GO_UINT.fullmatch(plain)):
            return value
    if _YAML_STYLE_FLOAT.fullmatch(plain):
        return float(plain)
    return text


def _construct_bool(loader: yaml.SafeLoader, node: yaml.Node) -> bool:
    return loader.construct_scalar(node).lower() in ("y", "yes", "true", "on")


_Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
_Loader.add_constructor(_NUMBER_TAG, _construct_number)
# An explicit !!timestamp tag: go-yaml still hands a string to interface{}.
_Loader.add_constructor("tag:yaml.org,2002:timestamp", lambda loader, node: loader.construct_scalar(node))


_SURROGATE = re.compile("[\ud800-\udfff]")


def _go_string(text: str) -> str:
    """A lone UTF-16 surrogate (JSON "\\ud83d" alone) becomes U+FFFD, as Go's decoder makes it."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _key(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, (int, float)) and not isinstance(key, bool):
        return str(_number(key))
    if isinstance(key, str):
        return _go_string(key) if _SURROGATE.search(key) else key
    raise KubeYAMLError(f"a map key must be a string, not {type(key).__name__}")


def _number(value: int | float) -> int | float:
    if isinstance(value, int):
        return value if -INT64 <= value < INT64 else float(value)
    if math.isfinite(value) and value.is_integer() and -INT64 <= value < INT64:
        return int(value)  # Go's encoding/json prints it as an integer; the API server reads an int64
    return value


class _Counter:
    def __init__(self) -> None:
        self.values = 0


def _as_json(value: Any, depth: int, counter: _Counter) -> Any:
    counter.values += 1
    if counter.values > MAX_VALUES:
        raise KubeYAMLError(f"expands to more than {MAX_VALUES} values (aliases?)")
    if depth > MAX_DEPTH:
        raise KubeYAMLError(f"nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        return {_key(k): _as_json(v, depth + 1, counter) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_json(v, depth + 1, counter) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number(value)
    if isinstance(value, str) and _SURROGATE.search(value):
        return _go_string(value)
    if isinstance(value, bytes):  # !!binary: the JSON that kubectl sends has no bytes
        raise KubeYAMLError("binary values (!!binary) cannot be sent to the API server")
    return value


def _no_constant(name: str) -> Any:
    raise KubeYAMLError(f"{name} is not a JSON value")


def _json_values(text: str) -> list[Any]:
    decoder, values, at = json.JSONDecoder(parse_constant=_no_constant), [], 0
    while (at := len(text) - len(text[at:].lstrip())) < len(text):
        value, at = decoder.raw_decode(text, at)
        values.append(value)
    return values


def load_all(text: str) -> list[Any]:
    """Every non-empty document of a YAML (or JSON) stream, as kubectl would send it. Like kubectl,
    a stream that starts with '{' is read as JSON values, which may hold what YAML forbids (such
    as control characters); `kind: List` stands for its items."""
    counter = _Counter()
    try:
        if text.lstrip().startswith("{"):
            try:
                docs = _json_values(text)
            except json.JSONDecodeError as e:
                raise KubeYAMLError(f"line {e.lineno} is not valid JSON: {e.msg}") from None
        else:
            docs = list(yaml.load_all(text, Loader=_Loader))
        out = [_as_json(d, 0, counter) for d in docs if d is not None]
    except RecursionError:
        raise KubeYAMLError(f"nests deeper than {MAX_DEPTH} levels") from None
    return [item for d in out for item in _items(d)]


def _items(doc: Any) -> list[Any]:
    if isinstance(doc, dict) and doc.get("kind") == "List" and doc.get("apiVersion") == "v1" \
            and isinstance(doc.get("items"), list):
        return [i for i in doc["items"] if i is not None]
    return [doc]
