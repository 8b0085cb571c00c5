"""What one reconcile must write (pure): the spec, the GPU classes and the children in the cache
-> the manifests that differ from what runs, the objects to delete, and the engine states.

The comparison is the one server-side apply makes meaningful: every field the operator renders
must hold the rendered value in the live object; fields others set (defaults, status, other
managers) are theirs. Only manifests that fail it are applied, so a fleet at rest writes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping

from ..api import GPUClass, InferenceService
from ..planning import engines
from ..render import RenderError, engine_jobs, render
from ..settings import Settings


@dataclass(frozen=True)
class Children:
    """The cached objects of one InferenceService."""

    deployment: dict[str, Any] | None = None
    service: dict[str, Any] | None = None
    pdb: dict[str, Any] | None = None
    jobs: tuple[dict[str, Any], ...] = ()
    pods: tuple[dict[str, Any], ...] = ()          # serving pods
    build_pods: tuple[dict[str, Any], ...] = ()    # pods of engine-build Jobs

    def live(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        kind = manifest["kind"]
        if kind == "Deployment":
            return self.deployment
        if kind == "Service":
            return self.service
        if kind == "PodDisruptionBudget":
            return self.pdb
        name = manifest["metadata"]["name"]
        return next((j for j in self.jobs if j["metadata"]["name"] == name), None)


@dataclass(frozen=True)
class Plan:
    replicas: int
    gpu_class: str | None = None
    notes: tuple[str, ...] = ()
    error: tuple[str, str] | None = None           # (reason, message): the spec cannot be rendered
    apply: tuple[dict[str, Any], ...] = ()         # manifests that differ from the live objects
    delete: tuple[tuple[str, str, str], ...] = ()  # (apiVersion, kind, name) of children to remove
    engines: tuple[dict[str, Any], ...] | None = None  # TensorRT-LLM: engine state per GPU class
    rendered: int = 0                              # manifests rendered (applied or found in place)


def plan(isvc: InferenceService, classes: Mapping[str, GPUClass], settings: Settings, children: Children,
         replicas: int) -> Plan:
    engine_states: list[dict[str, Any]] | None = None
    delete: list[tuple[str, str, str]] = []
    try:
        if isvc.spec.model.format == "tensorrt-llm":
            jobs = engine_jobs(isvc, classes, settings)
            known = [e.wire() for e in isvc.status.engines or []] if isvc.status else []
            engine_states = engines.states(jobs, list(children.jobs), known, list(children.build_pods))
            ready = engines.ready_classes(engine_states)
            rendered = render(isvc, classes, settings, replicas=replicas, engines_ready=ready, jobs=jobs)
            manifests = rendered.manifests
            if children.deployment is not None and rendered.gpu_class not in ready:
                # A new engine is building: the running Deployment keeps serving the old one until
                # the new one is in the cache, instead of being scaled to zero.
                manifests = [m for m in manifests if m["kind"] != "Deployment"]
            wanted = {m["metadata"]["name"] for m in manifests if m["kind"] == "Job"}
            delete = [("batch/v1", "Job", j["metadata"]["name"]) for j in children.jobs
                      if j["metadata"]["name"] not in wanted and not j["metadata"].get("deletionTimestamp")]
        else:
            rendered = render(isvc, classes, settings, replicas=replicas)
            manifests = rendered.manifests
    except RenderError as e:
        return Plan(replicas, error=(e.reason, e.message),
                    engines=None if engine_states is None else tuple(engine_states))
    return Plan(
        replicas=replicas, gpu_class=rendered.gpu_class, notes=tuple(rendered.notes),
        apply=tuple(m for m in manifests if not matches(m, children.live(m))),
        delete=tuple(delete), engines=None if engine_states is None else tuple(engine_states),
        rendered=len(manifests))


# -- comparison -----------------------------------------------------------------------------------

def matches(desired: Any, live: Any, path: tuple[str, ...] = ()) -> bool:
    """Whether `live` holds every value of `desired` (a subset comparison, as
    equality.Semantic.DeepDerivative): maps may have more keys, lists must have the same length
    and matching items, quantities compare by value ("1000m" == "1"), and empty or null desired
    values match an absent field (the API server omits empty values when it stores them)."""
    if desired is None:
        return True
    if isinstance(desired, dict):
        if live is None and not desired:
            return True
        return isinstance(live, dict) and all(matches(v, live.get(k), (*path, k)) for k, v in desired.items())
    if isinstance(desired, list):
        if live is None and not desired:
            return True
        return isinstance(live, list) and len(live) == len(desired) and all(
            matches(d, x, path) for d, x in zip(desired, live))
    if type(desired) is not type(live):
        if isinstance(desired, str) and isinstance(live, str):
            pass
        elif isinstance(desired, bool) or isinstance(live, bool):
            return False
        elif isinstance(desired, (int, float)) and isinstance(live, (int, float)):
            return desired == live
        else:
            return False
    if desired == live:
        return True
    return isinstance(desired, str) and _is_quantity_path(path) and _same_quantity(desired, live)


def _is_quantity_path(path: tuple[str, ...]) -> bool:
    return bool(path) and (path[-1] == "sizeLimit" or (len(path) >= 2 and path[-2] in ("requests", "limits")))


_SUFFIX = {"": 1, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": 10**3, "M": 10**6,
           "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
           "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


def quantity(text: str) -> Decimal | None:
    """The value of a Kubernetes resource quantity ("500m", "8Gi", "1e3"), None if it is not one."""
    m = _QUANTITY.match(text.strip())
    if not m or m.group(2) not in _SUFFIX:
        return None
    try:
        return Decimal(m.group(1)) * _SUFFIX[m.group(2)]
    except InvalidOperation:
        return None


def _same_quantity(a: str, b: str) -> bool:
    qa, qb = quantity(a), quantity(b)
    return qa is not None and qa == qb
