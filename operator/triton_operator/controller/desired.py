"""What one reconcile must write (pure): the spec, the GPU classes and the children in the cache
-> the desired state: the manifests that differ from what runs, the objects to delete, and the
model's preparation states; with gpu.spill, also where the replicas go (planning.placement, fed
from the cached pods and the free GPUs per class).

The comparison is the one server-side apply makes meaningful: every field the operator renders
must hold the rendered value in the live object; fields others set (defaults, status, other
managers) are theirs. Only manifests that fail it are applied, so a fleet at rest writes nothing.
Each manifest carries a digest of itself (`stamped`), so that a field the operator no longer
renders counts as a change too: applied, the apply removes it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping

from ..api import ClassPlacement, GPUClass, InferenceService
from ..conditions import parse_timestamp
from ..kube.kinds import INFERENCE_POOL
from ..labels import LABEL_GPU_CLASS, RENDERED_ANNOTATION
from ..planning import capacity, choice, preparation
from ..planning.assign import assign
from ..planning.assignment import Candidates, Option
from ..planning import placement as placing
from ..quantity import QuantityError, parse_quantity
from ..render import RenderError, preparation_jobs, render
from ..settings import Settings
from .trim import with_full_spec


WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")


@dataclass(frozen=True)
class Children:
    """The cached objects of one InferenceService."""

    deployment: dict[str, Any] | None = None          # the preferred class's (named as the service, or its group set)
    service: dict[str, Any] | None = None
    pdb: dict[str, Any] | None = None
    network_policy: dict[str, Any] | None = None
    inference_pool: dict[str, Any] | None = None
    jobs: tuple[dict[str, Any], ...] = ()
    pods: tuple[dict[str, Any], ...] = ()          # serving pods
    preparation_pods: tuple[dict[str, Any], ...] = ()  # pods of preparation Jobs
    deployments: tuple[dict[str, Any], ...] = ()   # every workload of the service (Deployments, LeaderWorkerSets)
    worker_pods: tuple[dict[str, Any], ...] = ()   # the workers of groups across nodes (leaders are `pods`)

    def all_deployments(self) -> list[dict[str, Any]]:
        out = list(self.deployments)
        if self.deployment is not None and all(d["metadata"]["name"] != self.deployment["metadata"]["name"] for d in out):
            out.insert(0, self.deployment)
        return out

    def deployment_named(self, name: str) -> dict[str, Any] | None:
        return next((d for d in self.all_deployments() if d["metadata"]["name"] == name), None)

    def live(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        kind = manifest["kind"]
        if kind in WORKLOAD_KINDS:
            found = self.deployment_named(manifest["metadata"]["name"])
            return found if found is not None and found.get("kind", kind) == kind else None
        if kind == "Service":
            return self.service
        if kind == "PodDisruptionBudget":
            return self.pdb
        if kind == "NetworkPolicy":
            return self.network_policy
        if kind == INFERENCE_POOL.kind:
            return self.inference_pool
        name = manifest["metadata"]["name"]
        return next((j for j in self.jobs if j["metadata"]["name"] == name), None)


@dataclass(frozen=True)
class DesiredState:
    replicas: int
    gpu_class: str | None = None
    notes: tuple[str, ...] = ()
    error: tuple[str, str] | None = None           # (reason, message): the spec cannot be rendered
    apply: tuple[dict[str, Any], ...] = ()         # manifests that differ from the live objects
    delete: tuple[tuple[str, str, str], ...] = ()  # (apiVersion, kind, name) of children to remove
    preparation: tuple[dict[str, Any], ...] | None = None  # TensorRT-LLM: the model's preparation
    rendered: int = 0                              # manifests rendered (applied or found in place)
    deployments: tuple[tuple[str, str], ...] = ()  # (GPU class, Deployment name), the preferred first
    placement: placing.Placement | None = None     # gpu.spill: replicas per class and why
    options: tuple[Option, ...] = ()        # the classes in use and those skipped, with GPUs per replica


def desired_state(isvc: InferenceService, classes: Mapping[str, GPUClass], settings: Settings, children: Children,
         replicas: int, free: Mapping[str, list[int]] | None = None, now: datetime | None = None) -> DesiredState:
    """`free` is the free GPUs per node of each class (None: not watched); `now` the clock, for
    spill-over's timers."""
    now = now or datetime.now(timezone.utc)
    prep_states: list[dict[str, Any]] | None = None
    delete: list[tuple[str, str, str]] = []
    placement: placing.Placement | None = None
    ready: set[str] | None = None
    # The class choice, made once for the pass: preparation and placement depend on it, and the
    # Assignment (planning.assign) hands it to rendering with their outcome.
    cands = choice.candidates(isvc.spec, classes)
    try:
        jobs = None
        if isvc.spec.model.format == "tensorrt-llm":
            jobs = preparation_jobs(isvc, classes, settings, cands)
            known = [e.wire() for e in isvc.status.preparation or []] if isvc.status else []
            prep_states = preparation.states(jobs, list(children.jobs), known, isvc.spec.model.precision,
                                             list(children.preparation_pods))
            ready = preparation.ready_classes(prep_states, cands.usable_names())
            wanted = {j["metadata"]["name"] for j in jobs}
            delete = [("batch/v1", "Job", j["metadata"]["name"]) for j in children.jobs
                      if j["metadata"]["name"] not in wanted and not j["metadata"].get("deletionTimestamp")]
        if cands.preferred is not None and isvc.spec.gpu.spill is not None and cands.spill:
            placement = place(isvc, cands, children, replicas, free, ready, now)
        in_use = None if placement is None else {
            c: n for c, n in placement.replicas().items() if n > 0 or c == cands.preferred.gpu_class}
        rendered = render(isvc, classes, settings,
                          assign(isvc, classes, replicas, placement=in_use, prepared=ready, candidates=cands), jobs=jobs)
        manifests = rendered.manifests
        if ready is not None:
            # The model of a new spec is being prepared: running Deployments keep serving the old
            # one until the new one is in the cache, instead of being scaled to zero.
            held = {name for c, name in rendered.deployments.items() if c not in ready}
            manifests = [m for m in manifests if not (m["kind"] in WORKLOAD_KINDS and m["metadata"]["name"] in held
                                                      and children.live(m) is not None)]
    except RenderError as e:
        return DesiredState(replicas, error=(e.reason, e.message),
                    preparation=None if prep_states is None else tuple(prep_states))
    # Deployments of classes no longer in use (a spill class whose replicas came back, spill
    # switched off): placement only empties a class once its replicas serve elsewhere.
    # A one-node service that became a multi-node one (or back) replaces its workload too.
    # While the new spec's model is being prepared, what runs keeps serving the old one: a service
    # that moves from groups across nodes to one node (or back) keeps its old workload until then.
    names = set(rendered.deployments.values())
    preparing = ready is not None and any(c not in ready for c in rendered.deployments)
    delete += [(d.get("apiVersion", "apps/v1"), d.get("kind", "Deployment"), d["metadata"]["name"])
               for d in children.all_deployments()
               if d["metadata"]["name"] not in names and not d["metadata"].get("deletionTimestamp") and not preparing]
    pool = children.inference_pool
    if pool is not None and not pool["metadata"].get("deletionTimestamp") and not any(
            m["kind"] == INFERENCE_POOL.kind for m in manifests):
        delete.append((pool.get("apiVersion", INFERENCE_POOL.api_version), INFERENCE_POOL.kind,
                       pool["metadata"]["name"]))
    # Not a Job: its pod template cannot change in place (a new preparation is a new Job, by name).
    manifests = [m if m["kind"] == "Job" else stamped(m) for m in manifests]
    return DesiredState(
        replicas=replicas, gpu_class=rendered.gpu_class, notes=tuple(rendered.notes),
        apply=tuple(m for m in manifests if not matches(m, with_full_spec(children.live(m)))),
        delete=tuple(delete), preparation=None if prep_states is None else tuple(prep_states),
        rendered=len(manifests), deployments=tuple(rendered.deployments.items()), placement=placement,
        options=tuple(cands.usable()) + tuple(cands.skipped))


def stamped(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with a digest of its content in an annotation (on the object, not its pod
    template: a new digest rolls no pods). The subset comparison (`matches`) finds every rendered
    field in place when a field was dropped from the rendering; the digest differs then, and the
    apply that follows removes the field, which the operator's field manager owns."""
    digest = hashlib.blake2b(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode(),
                             digest_size=8).hexdigest()
    meta = manifest["metadata"]
    return {**manifest, "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}),
                                                              RENDERED_ANNOTATION: digest}}}


# -- spill-over ------------------------------------------------------------------------------------

def place(isvc: InferenceService, cands: Candidates, children: Children, replicas: int,
          free: Mapping[str, list[int]] | None, prepared: set[str] | None, now: datetime) -> placing.Placement:
    spill = isvc.spec.gpu.spill
    assert spill is not None and cands.preferred is not None
    order = cands.usable_names()
    gpus = {o.gpu_class: o.count for o in cands.usable()}
    nodes = {o.gpu_class: o.layout.nodes if o.layout is not None else 1 for o in cands.usable()}
    room = None if free is None else {c: capacity.room(free.get(c, []), gpus[c], nodes[c]) for c in order}
    return placing.place(
        replicas, order, gpus, class_states(children), room, prepared,
        placing.Spill(spill.after_seconds, spill.return_after_seconds), remembered(isvc), now,
        skipped=[(o.gpu_class, o.reason) for o in cands.skipped])


def deployment_class(dep: dict[str, Any]) -> str | None:
    """The GPU class a Deployment's pods run on (its pod template's label)."""
    template = ((dep.get("spec") or {}).get("template") or {}).get("metadata") or {}
    return (template.get("labels") or {}).get(LABEL_GPU_CLASS)


def class_states(children: Children) -> dict[str, placing.ClassState]:
    """Per GPU class: the Deployment's replicas, and of its pods how many are on a node, ready,
    and since when each one the scheduler cannot place for lack of room is so."""
    replicas: dict[str, int] = {}
    for dep in children.all_deployments():
        c = deployment_class(dep)
        if c is not None and not dep["metadata"].get("deletionTimestamp"):
            replicas[c] = replicas.get(c, 0) + int((dep.get("spec") or {}).get("replicas") or 0)
    bound: dict[str, int] = {}
    ready: dict[str, int] = {}
    stuck: dict[str, list[datetime]] = {}
    message: dict[str, str] = {}
    for pod in children.pods:
        meta = pod.get("metadata") or {}
        c = (meta.get("labels") or {}).get(LABEL_GPU_CLASS)
        if c is None or meta.get("deletionTimestamp"):
            continue
        if (pod.get("spec") or {}).get("nodeName"):
            bound[c] = bound.get(c, 0) + 1
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                ready[c] = ready.get(c, 0) + 1
            if (cond.get("type") == "PodScheduled" and cond.get("status") == "False"
                    and cond.get("reason") == "Unschedulable" and placing.capacity_shortage(cond.get("message") or "")):
                stuck.setdefault(c, []).append(parse_timestamp(cond.get("lastTransitionTime")) or datetime.now(timezone.utc))
                message.setdefault(c, cond.get("message") or "")
    return {c: placing.ClassState(replicas.get(c, 0), bound.get(c, 0), ready.get(c, 0), tuple(stuck.get(c, ())),
                                  message.get(c, ""))
            for c in set(replicas) | set(bound) | set(stuck) | set(ready)}


def remembered(isvc: InferenceService) -> dict[str, placing.Remembered]:
    entries: list[ClassPlacement] = (isvc.status.placement or []) if isvc.status else []
    return {e.gpu_class: placing.Remembered(e.reason, parse_timestamp(e.since)) for e in entries}


def serving_total(isvc: InferenceService, children: Children) -> int | None:
    """The replicas the operator last asked for over every class, not counting the one being
    started on the preferred class to move a spilled replica back (None: no Deployment yet)."""
    deps = [d for d in children.all_deployments() if not d["metadata"].get("deletionTimestamp")]
    if not deps:
        return None
    total = sum(int((d.get("spec") or {}).get("replicas") or 0) for d in deps)
    entries = (isvc.status.placement or []) if isvc.status else []
    if entries and entries[0].reason == placing.RETURNING and len(deps) > 1:
        total -= 1
    return total


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


def _same_quantity(a: str, b: str) -> bool:
    """Equal as Kubernetes compares quantities ("1000m" == "1"; see `quantity`)."""
    try:
        return parse_quantity(a, stored=True) == parse_quantity(b, stored=True)
    except QuantityError:
        return False
