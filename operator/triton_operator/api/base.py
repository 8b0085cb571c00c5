"""What every resource model of the API shares: the group and version, the base `Model` (strict,
camelCase on the wire, nulls read as the API server stores them), and validation errors written
as Kubernetes writes them ("spec.server.env[0].value: ...")."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.alias_generators import to_camel

GROUP = "serving.triton-operator.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


def error_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as Kubernetes writes field paths: spec.server.env[0].value, and
    spec.podLabels[a b] for a map key that is not a plain name (escaped and cut, to stay one line)."""
    out = ""
    for part in loc:
        if part == "[key]":  # the error is about a map key, which the path already ends with
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z0-9_-]+", str(part)) and len(str(part)) <= 63:
            out += f".{part}" if out else str(part)
        else:
            key = str(part).encode("unicode_escape").decode("ascii")
            out += f"[{key[:60]}...]" if len(key) > 60 else f"[{key}]"
    return out


def describe_validation_error(error: Any) -> str:
    """One item of a pydantic ValidationError's errors() as "field.path: message" (the wire names,
    as users write them)."""
    where = error_path(error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def first_error(e: ValidationError) -> str:
    """The first validation error as "field.path: message"."""
    return describe_validation_error(e.errors()[0])


def _without_nulls(value: Any) -> Any:
    """What the API server keeps of an object: it drops null object properties and map values
    (apiextensions-apiserver PruneNonNullableNullsWithoutDefaults; no field here is nullable) and
    defaults them if they have a default; null list items stay, and are refused."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


class Model(BaseModel):
    """Base: camelCase on the wire, unknown fields refused, values validated on assignment.

    Strict like the API server: no bool for a number, no string for an integer, no float for an
    integer (the CRD refuses 1.0 in an integer field too, see crdgen), no infinity or NaN. Explicit
    nulls mean "unset", as the API server stores them."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_assignment=True,
        strict=True, allow_inf_nan=False,
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        # A null where the field's own default is None stays: it means the same, and on assignment
        # (validate_assignment hands over every field, unset ones as None) dropping it would drop
        # the attribute.
        unset = {k for name, f in cls.model_fields.items() if f.default is None for k in (name, f.alias)}
        data = {k: None if v is None else _without_nulls(v) for k, v in data.items() if v is not None or k in unset}
        # A default a later field is checked against (validate_default) is filled in first, as the
        # API server fills in defaults before it validates: an error then names the field by its
        # wire name (pydantic names a validated default by its Python name).
        for name, f in cls.model_fields.items():
            if f.validate_default and f.alias not in data and name not in data:
                data[f.alias or name] = f.get_default(call_default_factory=True)
        return data

    def wire(self) -> dict[str, Any]:
        """The object as the API server holds it: camelCase, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
