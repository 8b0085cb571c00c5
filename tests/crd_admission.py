"""What the API server does when a custom resource is created, for our generated CRDs, in Python:
the oracle the property suite checks the models against. tests/test_admission_cases.py checks it
against answers the real API server gave (tests/admission_recorded.json), and e2e/ runs the real one.

The steps follow apiextensions-apiserver (v1.36) for a create with fieldValidation=Strict, which is
kubectl's default:
1. decoding: an unknown field is refused; an integer beyond int64 becomes a float64 (sigs.k8s.io/json);
   NaN and infinities cannot be sent as JSON at all;
2. null properties and map values are dropped, or defaulted where the schema has a default
   (schema/defaulting/prunenulls.go, algorithm.go);
3. defaults are filled in;
4. the OpenAPI schema is checked (kube-openapi: a float with an integral value passes as an integer,
   patterns are RE2), and list-type map/set items must be unique;
5. only then the CEL rules (x-kubernetes-validations) run, each on its own node, with cel-python
   (the functions Kubernetes adds that it lacks, sum() and quantity(), are supplied here).
metadata is checked only as far as these tests need: a name that is a DNS subdomain.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import celpy
import celpy.celtypes as ct
import jsonschema
import re2
from celpy.evaluation import CELEvalError

from triton_operator.crdgen import INTEGER_RULE
from triton_operator.quantity import parse_quantity

INT64 = 2**63
JSON_INTEGER_LIMIT = 2**53  # swag.IsFloat64AJSONInteger
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class Refusal:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


# --- 1. decoding ---------------------------------------------------------------------------

def _decode(value: Any, schema: dict[str, Any] | None, path: str, out: list[Refusal]) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value if -INT64 <= value < INT64 else float(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            out.append(Refusal(path, "NaN and infinities are not JSON"))
        return value
    if isinstance(value, list):
        items = (schema or {}).get("items")
        return [_decode(v, items, f"{path}[{i}]", out) for i, v in enumerate(value)]
    if isinstance(value, dict):
        props = (schema or {}).get("properties")
        extra = (schema or {}).get("additionalProperties")
        decoded = {}
        for key, v in value.items():
            child = f"{path}.{key}" if path else key
            if schema is not None and props is not None and key not in props:
                out.append(Refusal(child, f'unknown field "{child}"'))
                continue
            decoded[key] = _decode(v, props.get(key) if props is not None else extra, child, out)
        return decoded
    out.append(Refusal(path, f"{type(value).__name__} is not JSON"))
    return value


# --- 2, 3. nulls and defaults --------------------------------------------------------------

def _child_schema(schema: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    if schema is None:
        return None
    props = schema.get("properties") or {}
    if key in props:
        return props[key]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _prune_nulls(value: Any, schema: dict[str, Any] | None) -> None:
    if isinstance(value, dict):
        for key in list(value):
            child = _child_schema(schema, key)
            if value[key] is None and child is not None and not child.get("nullable") and "default" not in child:
                del value[key]
            else:
                _prune_nulls(value[key], child)
    elif isinstance(value, list):
        for item in value:
            _prune_nulls(item, (schema or {}).get("items"))


def _default(value: Any, schema: dict[str, Any] | None) -> None:
    if schema is None:
        return
    if isinstance(value, dict):
        for key, prop in (schema.get("properties") or {}).items():
            if "default" in prop and value.get(key) is None:
                value[key] = copy.deepcopy(prop["default"])
        for key, v in value.items():
            _default(v, _child_schema(schema, key))
    elif isinstance(value, list):
        for item in value:
            _default(item, schema.get("items"))


# --- 4. the OpenAPI schema -----------------------------------------------------------------

def _is_integer(checker: Any, value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and value.is_integer() and abs(value) <= JSON_INTEGER_LIMIT


def _is_number(checker: Any, value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _re2_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    if isinstance(instance, str) and not re2.search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} should match {pattern!r}")


_TYPES = jsonschema.Draft4Validator.TYPE_CHECKER.redefine_many({"integer": _is_integer, "number": _is_number})
_Validator = jsonschema.validators.extend(jsonschema.Draft4Validator, {"pattern": _re2_pattern},
                                          type_checker=_TYPES)


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _refusal(e: jsonschema.ValidationError) -> Refusal:
    parts = list(e.absolute_path)
    if e.validator == "required":  # named by the missing field, as the API server does
        missing = next(p for p in e.validator_value if p not in e.instance)
        return Refusal(_path([*parts, missing]), "Required value")
    return Refusal(_path(parts), e.message)


def _list_types(value: Any, schema: dict[str, Any] | None, path: str, out: list[Refusal]) -> None:
    if schema is None:
        return
    if isinstance(value, list):
        kind = schema.get("x-kubernetes-list-type")
        seen: set[Any] = set()
        for i, item in enumerate(value):
            if kind == "map" and isinstance(item, dict):
                key = tuple(repr(item.get(k)) for k in schema["x-kubernetes-list-map-keys"])
            elif kind == "set":
                key = repr(item)
            else:
                key = None
            if key is not None:
                if key in seen:
                    out.append(Refusal(f"{path}[{i}]", "Duplicate value"))
                seen.add(key)
            _list_types(item, schema.get("items"), f"{path}[{i}]", out)
    elif isinstance(value, dict):
        for key, v in value.items():
            _list_types(v, _child_schema(schema, key), f"{path}.{key}" if path else key, out)


# --- 5. CEL ------------------------------------------------------------------------------

class _Quantity:
    def __init__(self, text: str):
        self.value = parse_quantity(str(text))


def _compare_to(a: _Quantity, b: _Quantity) -> ct.IntType:
    return ct.IntType((a.value > b.value) - (a.value < b.value))


CEL_FUNCTIONS = {
    "sum": lambda items: ct.IntType(sum(int(i) for i in items)),
    "quantity": _Quantity,
    "compareTo": _compare_to,
}
_ENV = celpy.Environment()


@lru_cache(maxsize=None)
def _program(rule: str) -> Any:
    return _ENV.program(_ENV.compile(rule), functions=CEL_FUNCTIONS)


def _to_cel(value: Any, schema: dict[str, Any] | None) -> Any:
    """A value as the API server hands it to CEL: typed by the schema, so that a float held by
    an integer field stays a double and fails `type(self) == int` as it does there."""
    kind = (schema or {}).get("type")
    if isinstance(value, dict):
        return ct.MapType({ct.StringType(k): _to_cel(v, _child_schema(schema, k)) for k, v in value.items()})
    if isinstance(value, list):
        return ct.ListType([_to_cel(v, (schema or {}).get("items")) for v in value])
    if isinstance(value, bool):
        return ct.BoolType(value)
    if isinstance(value, str):
        return ct.StringType(value)
    if kind == "number" or isinstance(value, float):
        return ct.DoubleType(value)
    return ct.IntType(value)


def _evaluate(rule: str, value: Any, schema: dict[str, Any]) -> Any:
    if rule == INTEGER_RULE["rule"]:
        # The guard on every integer field, answered directly: it is most of the rules evaluated,
        # and cel-python takes milliseconds each. test_admission_cases checks both answers agree.
        return isinstance(value, int) and not isinstance(value, bool)
    # Generated documents share many small objects ({"class": "h100"}, ...): answer each once.
    return _memo_evaluate(rule, json.dumps([value, schema.get("type")], sort_keys=True), value, schema)


_MEMO: dict[tuple[str, str], Any] = {}


def _memo_evaluate(rule: str, key: str, value: Any, schema: dict[str, Any]) -> Any:
    if (rule, key) not in _MEMO:
        if len(_MEMO) > 100_000:
            _MEMO.clear()
        try:
            _MEMO[rule, key] = _program(rule).evaluate({"self": _to_cel(value, schema)})
        except CELEvalError as e:
            _MEMO[rule, key] = e
    answer = _MEMO[rule, key]
    if isinstance(answer, CELEvalError):
        raise answer
    return answer


def _cel(value: Any, schema: dict[str, Any] | None, path: str, out: list[Refusal]) -> None:
    if schema is None or value is None:
        return
    for rule in schema.get("x-kubernetes-validations", []):
        where = path + rule.get("fieldPath", "") if rule.get("fieldPath") else path
        try:
            ok = _evaluate(rule["rule"], value, schema)
        except CELEvalError as e:
            out.append(Refusal(path, f"{e.args[0]} evaluating rule: {rule['message']}"))
            continue
        if ok is not True and ok != ct.BoolType(True):
            out.append(Refusal(where, rule["message"]))
    if isinstance(value, dict):
        for key, v in value.items():
            _cel(v, _child_schema(schema, key), f"{path}.{key}" if path else key, out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _cel(item, schema.get("items"), f"{path}[{i}]", out)


# --- together -----------------------------------------------------------------------------

class Admission:
    """Admission of one kind, from its generated CRD."""

    def __init__(self, crd: dict[str, Any]):
        self.schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        self.validator = _Validator(self.schema)

    def refusals(self, obj: dict[str, Any]) -> list[Refusal]:
        out: list[Refusal] = []
        obj = _decode(obj, self.schema, "", out)
        if out:
            return out
        name = (obj.get("metadata") or {}).get("name") if isinstance(obj.get("metadata"), dict) else None
        if not isinstance(name, str) or len(name) > 253 or not DNS_SUBDOMAIN.fullmatch(name):
            return [Refusal("metadata.name", "a lowercase RFC 1123 subdomain is required")]
        _prune_nulls(obj, self.schema)
        _default(obj, self.schema)
        out += [_refusal(e) for e in self.validator.iter_errors(obj)]
        _list_types(obj, self.schema, "", out)
        if out:  # "some validation rules were not checked because the object was invalid"
            return out
        _cel(obj, self.schema, "", out)
        return out
