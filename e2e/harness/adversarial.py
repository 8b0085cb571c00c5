"""Hostile InferenceServices against a real API server with the operator running: the scenario
behind e2e/test_adversarial.py and `make bench-robustness`.

Specs come from the property suite's strategies (tests/hostile.py: wrong types, negative and
huge numbers, unknown fields, long strings, unicode, nulls, deep nesting, bad names), generated
with a fixed seed. Each is created as a user would (JSON, strict field validation) in batches;
what admission refuses is counted, with whether the message names the field; every accepted
object must get a status with a reason for its generation within `status_timeout`, and must be
gone within `delete_timeout` of its deletion.
"""

from __future__ import annotations

import json
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from hypothesis import HealthCheck, given, seed, settings
from triton_operator.api.kinds import INFERENCE_SERVICE
from triton_operator.kube.client import ApiError, Kube

from tests.hostile import inference_services

# A refusal names the field when the message points into the object ("spec.gpu.count: ...",
# "metadata.name: ...", `unknown field "spec.x"`).
NAMES_A_FIELD = re.compile(r"(spec|metadata)\.[A-Za-z]|unknown field")


DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def json_numbers(value: Any) -> Any:
    """`value` with every NaN and infinity made the largest JSON number of its sign: JSON has no
    NaN or infinity, so no user can send one (kubectl refuses it before the API server sees it),
    and json.dumps would write `NaN`, which the API server refuses as unparsable JSON without
    naming a field."""
    if isinstance(value, float) and not math.isfinite(value):
        return -1e308 if value < 0 else 1e308
    if isinstance(value, dict):
        return {k: json_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_numbers(v) for v in value]
    return value


def generate(n: int, seed_value: int = 20261122) -> list[dict[str, Any]]:
    """`n` InferenceService documents, the same for the same seed in the same process. Not
    across processes that imported different modules: Hypothesis also draws on constants it
    finds in the loaded code, so `make test` (every unit test module loaded first) gets other
    documents than a lone run, among them NaN and infinities (see json_numbers). The
    strategies draw names from a small set of good and bad ones: a good name gets a numbered
    suffix (still good) so that each document is created on its own; a bad one is kept as it
    is, to be refused."""
    out: list[dict[str, Any]] = []

    @seed(seed_value)
    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(inference_services())
    def collect(doc: dict[str, Any]) -> None:
        name = doc["metadata"].get("name")
        if isinstance(name, str) and DNS_LABEL.fullmatch(name):
            doc = {**doc, "metadata": {**doc["metadata"], "name": f"{name[:40].rstrip('-')}-{len(out)}"}}
        out.append(json_numbers(doc))

    collect()
    return out


@dataclass
class Counts:
    generated: int = 0
    refused: int = 0
    refused_naming_the_field: int = 0
    accepted: int = 0
    accepted_with_status: int = 0
    deleted_in_time: int = 0
    tracebacks: int = 0
    operator_alive: bool = True
    without_status: list[str] = field(default_factory=list)
    not_deleted: list[str] = field(default_factory=list)
    refusals_naming_nothing: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not isinstance(v, list)}


def _status_for_generation(obj: dict[str, Any] | None) -> bool:
    if obj is None:
        return False
    st = obj.get("status") or {}
    ready = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), None)
    return (st.get("observedGeneration") == obj["metadata"].get("generation") and ready is not None
            and bool(ready.get("reason")))


def run(kube: Kube, namespace: str, docs: list[dict[str, Any]], operator_log: Callable[[], str],
        operator_alive: Callable[[], bool], batch: int = 25, status_timeout: float = 60,
        delete_timeout: float = 30) -> Counts:
    counts = Counts(generated=len(docs))
    accepted: list[str] = []

    def create(doc: dict[str, Any]) -> tuple[str, str | None]:
        body = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
        try:
            kube.request("POST", INFERENCE_SERVICE.path(namespace), {"fieldValidation": "Strict"}, body)
            return body["metadata"]["name"], None
        except ApiError as e:
            if e.transient:
                raise
            return str(body["metadata"].get("name")), e.message or e.reason

    with ThreadPoolExecutor(8) as pool:
        for start in range(0, len(docs), batch):
            for name, refusal in pool.map(create, docs[start:start + batch]):
                if refusal is None:
                    accepted.append(name)
                else:
                    counts.refused += 1
                    if NAMES_A_FIELD.search(refusal):
                        counts.refused_naming_the_field += 1
                    else:
                        counts.refusals_naming_nothing.append(refusal[:200])
    counts.accepted = len(accepted)

    deadline = time.monotonic() + status_timeout
    pending = set(accepted)
    while pending and time.monotonic() < deadline:
        pending = {n for n in pending if not _status_for_generation(kube.get(INFERENCE_SERVICE, n, namespace))}
        if pending:
            time.sleep(1)
    counts.accepted_with_status = len(accepted) - len(pending)
    counts.without_status = sorted(pending)

    def delete(name: str) -> None:
        kube.delete(INFERENCE_SERVICE, name, namespace)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(delete, accepted))
    deadline = time.monotonic() + delete_timeout
    remaining = set(accepted)
    while remaining and time.monotonic() < deadline:
        remaining = {n for n in remaining if kube.get(INFERENCE_SERVICE, n, namespace) is not None}
        if remaining:
            time.sleep(1)
    counts.deleted_in_time = len(accepted) - len(remaining)
    counts.not_deleted = sorted(remaining)
    counts.tracebacks = operator_log().count("Traceback")
    counts.operator_alive = operator_alive()
    return counts


def report(counts: Counts) -> str:
    return json.dumps(counts.summary())
