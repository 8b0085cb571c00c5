"""The one place a service's assignment is decided before it is rendered (pure): the class choice
(`choice.candidates`), the replicas (`replicas.desired_replicas`, or the caller's count), and
their spread over GPU classes. Rendering takes the Assignment and writes it out; the reconcile
pass, `triton-operator render` and `plan`, and the benches call `assign` first."""

from __future__ import annotations

from typing import Collection, Mapping

from ..api import GPUClass, InferenceService
from . import choice
from .assignment import Assignment, Candidates
from .replicas import desired_replicas


def assign(isvc: InferenceService, classes: Mapping[str, GPUClass], replicas: int | None = None,
           placement: Mapping[str, int] | None = None, prepared: Collection[str] | None = None,
           candidates: Candidates | None = None) -> Assignment:
    """`replicas` overrides the count from desired_replicas. `placement` maps GPU classes to
    replicas (spill-over: planning.placement); None puts every replica on the preferred class.
    `prepared` names the classes whose model is prepared (None: all of them). `candidates` is the
    class choice when the caller has made it already (a reconcile pass makes it first: the
    model's preparation and the placement depend on it)."""
    cands = candidates if candidates is not None else choice.candidates(isvc.spec, classes)
    ready = None if prepared is None else frozenset(prepared)
    if cands.error is not None or cands.preferred is None:
        return Assignment(cands, prepared=ready)
    preferred = cands.preferred.gpu_class
    count = desired_replicas(isvc) if replicas is None else replicas
    wanted = dict(placement) if placement is not None else {preferred: count}
    wanted.setdefault(preferred, 0)
    return Assignment(cands, wanted, ready)
