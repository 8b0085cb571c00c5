"""Kubernetes' syntax rules, each as a pattern or pydantic type for the models and a CEL rule for
the CRD, so that both refuse the same values with the same message: names, label and annotation
keys, label values, quantities, int32 bounds, image references, durations, and metadata.name."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from ..quantity import QUANTITY, QUANTITY_MAX_LENGTH

# Integer fields of Pods, Deployments and Jobs are int32 (k8s.io/api). (tolerationSeconds is an
# int64, but a CRD's minimum and maximum must stay within 2^53, where the API server, which reads
# them as float64, still takes them for integers: int32 bounds it too.)
INT32_MAX = 2**31 - 1

# Kubernetes' name syntax (k8s.io/apimachinery/pkg/api/validate/content, v0.36: dns.go, kube.go),
# written with explicit character classes only ([.] for a dot, no \s or \w) so that Go's RE2 (the
# API server), Rust's regex (pydantic) and CEL read every pattern alike. Python's re needs
# fullmatch: its $ also matches before a final newline.
_DNS_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL_ANY_CASE = "[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?"
_NAME_PART = "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"  # 1-63 characters
DNS_LABEL = f"^{_DNS_LABEL}$"
# Service names: a DNS-1035 label, which starts with a letter (Kubernetes before 1.36 requires it).
DNS_1035_LABEL = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
# Label keys and other "qualified names": an optional DNS subdomain prefix and '/', then a name.
QUALIFIED_NAME = f"^({_DNS_LABEL}([.]{_DNS_LABEL})*/)?{_NAME_PART}$"
# Annotation keys: the same, but Kubernetes lowercases them before checking, so any case.
ANNOTATION_KEY = f"^({_DNS_LABEL_ANY_CASE}([.]{_DNS_LABEL_ANY_CASE})*/)?{_NAME_PART}$"
LABEL_VALUE = f"^({_NAME_PART})?$"
# A prefix longer than a DNS subdomain may be (253); the patterns above cannot count it.
LONG_PREFIX = "^[^/]{254,}/"
QUALIFIED_NAME_MAX_LENGTH = 253 + 1 + 63
# An extended resource name (nvidia.com/gpu): a DNS subdomain prefix is required.
EXTENDED_RESOURCE_NAME = f"^{_DNS_LABEL}([.]{_DNS_LABEL})*/{_NAME_PART}$"
LABEL_KEY_RULES = ("an optional DNS subdomain prefix of at most 253 characters and '/', then a name of at "
                   "most 63 letters, digits, '-', '_' or '.' that starts and ends with a letter or digit "
                   "(e.g. example.com/team)")

# An image reference as the container runtime parses it (distribution/reference's grammar):
# [registry[:port]/]path[:tag][@algorithm:digest], path components in lowercase letters and digits
# joined by '.', '_', '__' or dashes, a tag of at most 128 word characters, '.' or '-', a digest of
# at least 32 hex digits. Anything else the API server admits (it only refuses white space) and the
# kubelet then refuses (InvalidImageName) once the pod is scheduled.
_IMAGE_HOST = r"[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?([.][a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*(:[0-9]+)?"
_IMAGE_PATH = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*"
IMAGE_PATTERN = (rf"^({_IMAGE_HOST}/)?{_IMAGE_PATH}(/{_IMAGE_PATH})*(:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                 r"(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")
# Text that reaches a container's args or environment: anything but NUL, which exec cannot pass.
NO_NUL_PATTERN = "^[^\\x00]*$"

# A Go duration (what CEL's duration() parses: time.ParseDuration) in the units people write: 90s,
# 2m, 1h30m, 1.5h, 500ms. At most 5 digits before and 3 after a decimal point per number, so that
# the longest (32 characters) stays far below Go's limit (int64 nanoseconds, about 2.5 million
# hours) and every value is a whole number of microseconds, which Go, cel-python and
# duration_ns() below all read exactly. No backslashes: CEL string literals take the pattern too.
DURATION_PATTERN = "^([0-9]{1,5}([.][0-9]{1,3})?(ms|s|m|h))+$"
DURATION_MAX_LENGTH = 32
_DURATION_PART = re.compile(r"([0-9]+)(?:[.]([0-9]+))?(ms|s|m|h)")
_DURATION_UNIT_NS = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """A CEL validation rule for the CRD (x-kubernetes-validations)."""
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = "." + field_path.lstrip(".")
    return out


def duration_ns(duration: str) -> int:
    """Nanoseconds in a duration matching DURATION_PATTERN ("1h30m" -> 5400 * 10**9), exactly as
    Go's time.ParseDuration reads it (3 decimals at most: every product is a whole number)."""
    return sum(int(whole) * _DURATION_UNIT_NS[unit] + int(frac or 0) * _DURATION_UNIT_NS[unit] // 10 ** len(frac or "")
               for whole, frac, unit in _DURATION_PART.findall(duration))


def seconds(duration: str) -> float:
    """Seconds in a duration matching DURATION_PATTERN ("1h30m" -> 5400.0)."""
    return duration_ns(duration) / 1e9


def duration_within(name: str, value: str, low: str, high: str) -> str:
    if not duration_ns(low) <= duration_ns(value) <= duration_ns(high):
        raise ValueError(f"{name} must be between {low} and {high}")
    return value


def duration_rule(name: str, low: str, high: str) -> dict[str, str]:
    """CEL on a duration field itself: within [low, high] (the pattern is checked before CEL runs)."""
    return cel(f"duration(self) >= duration('{low}') && duration(self) <= duration('{high}')",
               f"{name} must be between {low} and {high}")


def _prefix_fits(key: str) -> bool:
    return not re.match(LONG_PREFIX, key)


def _label_key(key: str) -> str:
    if not re.fullmatch(QUALIFIED_NAME, key) or not _prefix_fits(key):
        raise ValueError(f"label key {key!r} is not valid: use {LABEL_KEY_RULES}")
    return key


def _annotation_key(key: str) -> str:
    if not re.fullmatch(ANNOTATION_KEY, key) or not _prefix_fits(key):
        raise ValueError(f"annotation key {key!r} is not valid: use {LABEL_KEY_RULES}")
    return key


def _qualified_name(value: str) -> str:
    if not _prefix_fits(value):
        raise ValueError("the prefix before '/' must be at most 253 characters")
    return value


def keys_rule(pattern: str, what: str) -> dict[str, str]:
    """CEL on a map: every key matches pattern, its prefix at most 253 characters."""
    return cel(f"self.all(k, k.matches('{pattern}') && !k.matches('{LONG_PREFIX}'))",
               f"every {what} key must be {LABEL_KEY_RULES}")


LabelKey = Annotated[str, AfterValidator(_label_key)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]
AnnotationKey = Annotated[str, AfterValidator(_annotation_key)]
QualifiedName = Annotated[str, Field(
    min_length=1, max_length=QUALIFIED_NAME_MAX_LENGTH, pattern=QUALIFIED_NAME,
    json_schema_extra={"x-kubernetes-validations": [
        cel(f"!self.matches('{LONG_PREFIX}')", "the prefix before '/' must be at most 253 characters")]}),
    AfterValidator(_qualified_name)]
Quantity = Annotated[str, Field(max_length=QUANTITY_MAX_LENGTH, pattern=QUANTITY)]


def labels_field(description: str, max_items: int) -> Any:
    """A map of Kubernetes labels: keys and values checked as Kubernetes checks them."""
    return Field(default_factory=dict, max_length=max_items, description=description,
                 json_schema_extra={"x-kubernetes-validations": [keys_rule(QUALIFIED_NAME, "label")]})


def checked_metadata(metadata: dict[str, Any], pattern: str, max_length: int, what: str) -> dict[str, Any]:
    """metadata.name (and namespace) as the API server requires them of this kind."""
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("metadata.name is required")
    if not re.fullmatch(pattern, name) or len(name) > max_length:
        raise ValueError(f"metadata.name must be {what}")
    namespace = metadata.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not re.fullmatch(DNS_LABEL, namespace)
                                  or len(namespace) > 63):
        raise ValueError("metadata.namespace must be a DNS label (lowercase letters, digits, '-') of at most 63 characters")
    return metadata
