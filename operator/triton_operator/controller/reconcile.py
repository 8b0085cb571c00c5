"""One reconcile pass for one InferenceService, from the cache: the desired state (pure), write what differs,
compute status (pure), write it if it changed.

Nothing here reads the API. The work queue guarantees one pass per object at a time, so the
pass owns the object's children and status. A pass whose inputs (the spec's generation, the
replica count, the GPU classes, the children's tokens) are those of the last converged pass skips
rendering altogether: at rest, a pass is a few dictionary lookups and no request.

Errors: an API server that refuses a child (invalid, too large, forbidden) is the spec's fault,
and becomes Degraded with the server's words, without retrying until something changes. A
failing or unreachable API server raises `ApiError` (transient) and the queue retries with backoff.
"""

from __future__ import annotations

import hashlib
import json
import math
import logging
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Sequence

from .. import conditions
from .. import telemetry
from ..api import GROUP, GPUClass, InferenceService
from ..api.kinds import INFERENCE_SERVICE
from ..autoscaling.report import METRICS_AVAILABLE, Report
from ..kube.client import ApiError, Kube
from ..kube.events import Event
from ..kube.kinds import DEPLOYMENT, INFERENCE_POOL, JOB, LEADER_WORKER_SET, NETWORK_POLICY, PDB, SERVICE
from ..kube.store import Key, Store, trim
from ..labels import selector_labels
from ..planning.replicas import desired_replicas
from ..render import group
from ..settings import Settings
from . import desired as desired_core
from . import series as series_core
from . import status as status_core
from .endpoints import endpoints
from .keys import ssh_key_pair
from .trim import content_token, trim_child, trim_pod
from .views import Views

log = logging.getLogger(__name__)

# What earlier versions of the operator (on kopf's per-object handlers) left on every object:
# a finalizer nobody removes any more, and the whole last-handled spec in an annotation.
LEGACY_FINALIZER = f"{GROUP}/finalizer"
LEGACY_ANNOTATION_PREFIX = f"{GROUP}/"
# A child the API server refused is tried again after these pauses (doubling), whatever happens.
REFUSAL_RETRY_BASE, REFUSAL_RETRY_MAX = 30.0, 600.0
STALE_RETRY_SECONDS = 1.0   # a pass that met a gap in the InferenceServices' cache comes back after this
# A service waiting for an add-on's API (LeaderWorkerSet, InferencePool) looks again after this.
ADDON_RECHECK_SECONDS = 60.0


@dataclass(frozen=True)
class Converged:
    """What the last converged pass of one object saw and concluded. A pass the API server
    refused is remembered only until `retry_at` (monotonic), so a refusal caused by the cluster
    (a quota, an admission policy) is tried again, with growing pauses, without a retry storm."""

    inputs: tuple[Any, ...]
    tokens: frozenset[Any]
    desired: desired_core.DesiredState
    retry_at: float | None = None
    refusals: int = 0


def _settings_digest(settings: Settings) -> str:
    return hashlib.blake2b(settings.model_dump_json().encode(), digest_size=8).hexdigest()


class Reconciler:
    def __init__(self, kube: Kube, store: Store, views: Views, settings: Settings,
                 reports: Callable[[Key], Report | None] = lambda key: None,
                 enqueue_after: Callable[[Key, float], None] = lambda key, delay: None,
                 now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 groups_ready: Callable[[], bool] = lambda: True, pools_ready: Callable[[], bool] = lambda: True):
        """`groups_ready`: whether the cluster serves LeaderWorkerSets and their cache is filled
        (replicas across nodes are groups of one); `pools_ready`: the same for InferencePools."""
        self.kube, self.store, self.views, self.settings = kube, store, views, settings
        self.groups_ready, self.pools_ready = groups_ready, pools_ready
        self._pools_missing: set[Key] = set()   # services whose InferencePool waits for its CRD
        self.reports, self.enqueue_after, self.now = reports, enqueue_after, now
        self._converged: dict[Key, Converged] = {}
        self._gpu_gauges: dict[Key, set[str]] = {}  # GPU classes with a triton_operator_service_gpus series
        self._spill_active: set[Key] = set()
        self._series = telemetry.ServiceSeries()  # the per-service gauges dashboards and alerts read
        self._wakes: dict[Key, float] = {}
        self._leaders: dict[Key, status_core.Leaders] = {}   # the leader pods of a service's groups, last pass
        self._active_lock = threading.Lock()
        self._settings_digest = _settings_digest(settings)
        self.skipped = 0  # passes that found their children in place without rendering

    def forget(self, key: Key) -> None:
        self._converged.pop(key, None)
        self._pools_missing.discard(key)
        self._leaders.pop(key, None)
        self._series.forget(key)
        for gpu_class in self._gpu_gauges.pop(key, ()):
            telemetry.SERVICE_GPUS.remove(key[0], key[1], gpu_class)
        with self._active_lock:
            self._spill_active.discard(key)

    def spill_active(self) -> list[Key]:
        """Services whose placement a change of free GPUs may change: replicas spilled, waiting to
        spill, or moving back."""
        with self._active_lock:
            return list(self._spill_active)

    def _follow_placement(self, key: Key, placement: Any) -> None:
        active = placement is not None and (
            placement.waiting is not None or placement.returning or placement.shortfall is not None
            or any(d.replicas > 0 for d in placement.classes[1:]))
        with self._active_lock:
            (self._spill_active.add if active else self._spill_active.discard)(key)
        if placement is not None and placement.wake_after is not None:
            # A timer of the placement (after, returnAfter) runs out: look again then (once: a
            # wake-up already due earlier covers it).
            due = time.monotonic() + placement.wake_after + 0.5
            with self._active_lock:
                pending = self._wakes.get(key)
                if pending is not None and time.monotonic() < pending <= due + 0.5:
                    return
                self._wakes[key] = due
            self.enqueue_after(key, placement.wake_after + 0.5)

    # -- the pass -------------------------------------------------------------------------------

    def reconcile(self, key: Key) -> dict[str, Any] | None:
        """Bring one InferenceService's children to its spec and write its status. Returns the status.
        Nothing is written, and no Event posted, while the InferenceServices' cache has a gap (its
        watch broke and the kind has not been listed again): the service may have been deleted
        meanwhile, and its children with it (the pass comes back when the listing is done)."""
        if not self.store.fresh(INFERENCE_SERVICE.kind):
            self.enqueue_after(key, STALE_RETRY_SECONDS)
            return None
        raw, isvc, invalid = self.views.inference_service(key)
        if raw is None:
            self.forget(key)
            return None
        raw = self._drop_legacy_bookkeeping(raw)
        if raw["metadata"].get("deletionTimestamp"):
            self.forget(key)
            return None
        if isvc is None:
            # The CRD admits nothing the models refuse; this guards objects stored by an older CRD.
            return self._write_status(raw, *_invalid_status(raw, f"spec is invalid: {invalid}", self.now()))

        report = self.reports(key) if isvc.spec.autoscaling is not None else None
        children = self.views.children(key)
        current = desired_core.serving_total(isvc, children)
        replicas = desired_replicas(isvc, current) if report is None else max(
            isvc.spec.autoscaling.min_replicas, min(isvc.spec.autoscaling.max_replicas, report.desired))
        classes = self.views.gpu_classes()
        now = self.now()
        spill = isvc.spec.gpu.spill is not None
        inputs = (raw["metadata"].get("uid"), raw["metadata"].get("generation"), replicas,
                  self.store.version("GPUClass"), self._settings_digest,
                  _preparation_digest(isvc) if isvc.spec.model.format == "tensorrt-llm" else None)
        free_known = self.views.free_gpus(classes)
        free = free_known if spill else None
        pool_was_missing = key in self._pools_missing
        desired = self._converge(key, isvc, classes, children, replicas, inputs, free, now, always=spill)
        self._follow_placement(key, desired.placement)

        children = self.views.children(key)  # after our writes (written through to the cache)
        cls = classes.get(desired.gpu_class) if desired.gpu_class else None
        names = dict(desired.deployments)
        deployments = [d for _, name in desired.deployments if (d := children.deployment_named(name)) is not None]
        observed = status_core.Observed(
            desired_replicas=desired.replicas, gpu_class=desired.gpu_class, gpu_class_spec=cls.spec if cls else None,
            gpu_count=next((o.count for o in desired.options if o.gpu_class == desired.gpu_class), isvc.spec.gpu.count),
            error=desired.error, notes=list(desired.notes), deployment=children.deployment,
            # A group's workers too: one that cannot be scheduled or crashes holds its group back.
            pods=list(children.pods) + list(children.worker_pods) if children.deployment else [],
            endpoints=endpoints(key[1], key[0], self.settings, isvc.spec.serves_openai()),
            selector=",".join(f"{k}={v}" for k, v in selector_labels(key[1]).items()),
            preparation=None if desired.preparation is None else list(desired.preparation),
            deployments=deployments, deployment_names=names, placement=desired.placement, options=list(desired.options),
            class_nodes=None if free_known is None or desired.gpu_class is None else len(free_known.get(desired.gpu_class) or []))
        self._count_gpus(key, desired, children, isvc.spec.gpu.count)
        new_status, events = status_core.compute(isvc, observed, now)
        before = self._leaders.get(key)
        leaders = status_core.group_leaders(list(children.pods))
        events += status_core.group_restarts(before, leaders)
        events += self._pool_events(key, pool_was_missing)
        groups = {d["metadata"]["name"]: int((d.get("spec") or {}).get("replicas") or 0)
                  for d in children.all_deployments() if d.get("kind") == LEADER_WORKER_SET.kind}
        remembered = status_core.remembered_leaders(before, leaders, groups)
        if remembered:
            self._leaders[key] = remembered
        else:
            self._leaders.pop(key, None)
        new_status = _with_autoscaling(new_status, raw.get("status") or {}, report, isvc, self.now())
        return self._write_status(raw, new_status, events)

    def _pool_events(self, key: Key, was_missing: bool) -> list[Event]:
        """A Warning from the pass that first finds the service's InferencePool waiting for its CRD."""
        if key not in self._pools_missing or was_missing:
            return []
        return [Event("Warning", "InferencePoolNotInstalled", (
            f"spec.routing.inferencePool: the cluster does not serve {INFERENCE_POOL.api_version} InferencePools: "
            f"install the Gateway API Inference Extension's CRDs (v1.0 or later); the pool is created within a "
            f"minute after, and the service serves through the operator's gateway meanwhile"))]

    def _count_gpus(self, key: Key, desired: desired_core.DesiredState, children: desired_core.Children,
                    default: int) -> None:
        """triton_operator_service_gpus for this service: ready replicas x GPUs per replica, per class."""
        per_replica = {o.gpu_class: o.count for o in desired.options}
        now: dict[str, int] = {}
        for gpu_class, name in desired.deployments:
            d = children.deployment_named(name)
            ready = int(((d or {}).get("status") or {}).get("readyReplicas") or 0)
            now[gpu_class] = ready * per_replica.get(gpu_class, default)
        for gpu_class in self._gpu_gauges.get(key, set()) - set(now):
            telemetry.SERVICE_GPUS.remove(key[0], key[1], gpu_class)
        for gpu_class, gpus in now.items():
            telemetry.SERVICE_GPUS.labels(key[0], key[1], gpu_class).set(gpus)
        if now:
            self._gpu_gauges[key] = set(now)
        else:
            self._gpu_gauges.pop(key, None)

    def _converge(self, key: Key, isvc: InferenceService, classes: Mapping[str, GPUClass],
                  children: desired_core.Children, replicas: int, inputs: tuple[Any, ...],
                  free: Mapping[str, list[int]] | None = None, now: datetime | None = None,
                  always: bool = False) -> desired_core.DesiredState:
        """`always`: compute the desired state even when nothing the skip compares changed (a spill-over placement
        depends on pods, free GPUs and the clock; planning it is pure and takes a millisecond)."""
        tokens = _tokens(_versions(children))
        last = self._converged.get(key)
        if not always and last is not None and last.inputs == inputs and last.tokens == tokens and (
                last.retry_at is None or time.monotonic() < last.retry_at):
            self.skipped += 1
            return last.desired
        desired = desired_core.desired_state(isvc, classes, self.settings, children, replicas, free, now)
        if any(m["kind"] == LEADER_WORKER_SET.kind for m in desired.apply) and not self.groups_ready():
            desired = desired_core.DesiredState(desired.replicas, desired.gpu_class, desired.notes, (
                "LeaderWorkerSetNotInstalled",
                f"a replica of {isvc.spec.gpu.count} GPUs spans nodes and runs as a LeaderWorkerSet group, but "
                f"the cluster does not serve {LEADER_WORKER_SET.api_version} LeaderWorkerSets: install "
                f"LeaderWorkerSet (https://lws.sigs.k8s.io, v0.9 or later); the operator starts using it "
                f"within a minute"), preparation=desired.preparation, deployments=desired.deployments,
                options=desired.options)
            self.enqueue_after(key, ADDON_RECHECK_SECONDS)
            return desired
        pool_wait = None
        if any(m["kind"] == INFERENCE_POOL.kind for m in desired.apply) and not self.pools_ready():
            # The pool is an addition: the service is rendered and serves without it meanwhile.
            desired = replace(desired, apply=tuple(m for m in desired.apply if m["kind"] != INFERENCE_POOL.kind))
            self._pools_missing.add(key)
            pool_wait = ADDON_RECHECK_SECONDS
            self.enqueue_after(key, pool_wait)
        else:
            self._pools_missing.discard(key)
        existing = _versions(children)
        if any((m["kind"], m["metadata"]["name"]) not in existing for m in desired.apply) and not self._owner_exists(
                key, inputs[0]):
            # A child is about to be created: its owner is read afresh first (the cache may not have
            # seen it deleted yet), and nothing is created for an owner that is gone.
            self.forget(key)
            return replace(desired, apply=(), delete=())
        rejected: tuple[str, str] | None = None
        written: list[tuple[str, dict[str, Any]]] = []
        for manifest in desired.apply:
            other = self._taken(manifest, isvc)
            if other is not None:
                kind, name = manifest["kind"], manifest["metadata"]["name"]
                rejected = ("NameTaken", f"{kind} {name}, a name this service derives, belongs to {other}: rename "
                                         f"one of the two (a forced apply would have taken it over)")
                break
            try:
                if manifest["kind"] == LEADER_WORKER_SET.kind:
                    self._ensure_group_key(isvc, manifest)
                written.append((manifest["kind"], self._write(manifest)))
            except ApiError as e:
                if not e.rejected:
                    raise
                kind, name = manifest["kind"], manifest["metadata"]["name"]
                rejected = (f"{kind}Rejected", f"the API server refused {kind} {name}: {e.message or e.reason}")
                break
        for api_version, kind, name in desired.delete:
            self.kube.delete(self.kube.kinds[(api_version, kind)], name, key[0], propagation="Background")
            telemetry.WRITES.labels(kind, "delete").inc()
        retry_at, refusals = None, 0
        if rejected is not None:
            desired = desired_core.DesiredState(desired.replicas, desired.gpu_class, desired.notes, rejected,
                                                preparation=desired.preparation, deployments=desired.deployments,
                                                options=desired.options)
            refusals = (last.refusals if last is not None and last.inputs == inputs else 0) + 1
            pause = min(REFUSAL_RETRY_MAX, REFUSAL_RETRY_BASE * 2 ** (refusals - 1))
            retry_at = time.monotonic() + pause
            self.enqueue_after(key, pause)
        if pool_wait is not None:
            retry_at = min(retry_at or math.inf, time.monotonic() + pool_wait)
        # The memo keeps the children at the version this pass read or wrote (_memo_tokens).
        self._converged[key] = Converged(inputs, _memo_tokens(children, written, desired.delete),
                                         replace(desired, apply=()), retry_at, refusals)
        return desired

    def _ensure_group_key(self, isvc: InferenceService, group_set: dict[str, Any]) -> None:
        """The SSH key pair a multi-node service's groups start MPI with, made once (created, never
        read back: the operator needs no right to read Secrets; deleted with the service)."""
        created = self.kube.create(group.ssh_key_secret(isvc.name, isvc.namespace,
                                                        group_set["metadata"].get("ownerReferences"), *ssh_key_pair()))
        if created:
            telemetry.WRITES.labels("Secret", "create").inc()

    def _taken(self, manifest: dict[str, Any], isvc: InferenceService) -> str | None:
        """Who else holds a child's name, from the cache ("InferenceService foo-spill-h200"): another
        service whose own child has the name this one derives (foo's spill Deployment is
        foo-spill-h200, and so is the Deployment of a service named foo-spill-h200). None when the
        name is free or this service's (its uid, or a service of its name that was deleted)."""
        meta = manifest["metadata"]
        live = self.store.get(manifest["kind"], (meta.get("namespace") or isvc.namespace, meta["name"]))
        if live is None:
            return None
        owner = next((o for o in live["metadata"].get("ownerReferences") or [] if o.get("controller")), None)
        if owner is None or owner.get("uid") == isvc.metadata.get("uid") or (
                owner.get("kind") == INFERENCE_SERVICE.kind and owner.get("name") == isvc.name):
            return None
        return f"{owner.get('kind')} {owner.get('name')}"

    def _owner_exists(self, key: Key, uid: str | None) -> bool:
        """The InferenceService, read from the API server now, is the one the pass computed for (same
        uid) and is not being deleted."""
        fresh = self.kube.get(INFERENCE_SERVICE, key[1], key[0])
        telemetry.OWNER_READS.inc()
        meta = (fresh or {}).get("metadata") or {}
        return fresh is not None and meta.get("uid") == uid and not meta.get("deletionTimestamp")

    def _write(self, manifest: dict[str, Any]) -> dict[str, Any]:
        kind = self.kube.kinds.of(manifest)
        out = self.kube.apply(manifest)
        telemetry.WRITES.labels(kind.kind, "apply").inc()
        self.store.upsert(kind.kind, _trimmed(kind.kind, out))
        return out

    def _write_status(self, raw: dict[str, Any], new_status: dict[str, Any],
                      events: list[Event]) -> dict[str, Any]:
        old = raw.get("status") or {}
        patch = {k: v for k, v in new_status.items() if old.get(k) != v and not (v is None and k not in old)}
        if patch:
            meta = raw["metadata"]
            out = self.kube.patch_status(INFERENCE_SERVICE, meta.get("namespace") or "", meta["name"], patch)
            telemetry.WRITES.labels("InferenceService", "status").inc()
            if out is not None:
                self.store.upsert(INFERENCE_SERVICE.kind, _trimmed(INFERENCE_SERVICE.kind, out))
        for event in events:
            self.kube.post_event(raw, event)
        meta = raw["metadata"]
        self._series.set((meta.get("namespace") or "", meta["name"]),
                         series_core.service_series(raw.get("spec"), new_status))
        return new_status

    def _drop_legacy_bookkeeping(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Remove the finalizer and annotations earlier versions kept on the object (once)."""
        meta = raw["metadata"]
        finalizers = meta.get("finalizers") or []
        stale = [k for k in meta.get("annotations") or {} if k.startswith(LEGACY_ANNOTATION_PREFIX)]
        if LEGACY_FINALIZER not in finalizers and not stale:
            return raw
        body: dict[str, Any] = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
        if LEGACY_FINALIZER in finalizers:
            body["metadata"]["finalizers"] = [f for f in finalizers if f != LEGACY_FINALIZER] or None
        if stale:
            body["metadata"]["annotations"] = {k: None for k in stale}
        try:
            out = self.kube.patch(INFERENCE_SERVICE, meta["name"], meta.get("namespace"), body)
        except ApiError as e:
            if e.status == 404:
                return raw
            raise  # 409: changed meanwhile; the queue retries with the newer object
        telemetry.WRITES.labels("InferenceService", "metadata").inc()
        trimmed = _trimmed(INFERENCE_SERVICE.kind, out)
        self.store.upsert(INFERENCE_SERVICE.kind, trimmed)
        return trimmed


def _trimmed(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    if kind == "Pod":
        return trim_pod(obj)
    return trim_child(obj) if kind in CHILD_KINDS else trim(obj)


CHILD_KINDS = {DEPLOYMENT.kind, LEADER_WORKER_SET.kind, SERVICE.kind, PDB.kind, JOB.kind, NETWORK_POLICY.kind,
               INFERENCE_POOL.kind}


def _versions(children: desired_core.Children) -> dict[tuple[str, str], dict[str, Any]]:
    """The children whose version decides whether a pass must compute the desired state, by (kind, name)."""
    out = {(d.get("kind", DEPLOYMENT.kind), d["metadata"]["name"]): d for d in children.all_deployments()}
    for kind, obj in ((SERVICE.kind, children.service), (PDB.kind, children.pdb),
                      (NETWORK_POLICY.kind, children.network_policy), (INFERENCE_POOL.kind, children.inference_pool)):
        if obj is not None:
            out[(kind, obj["metadata"]["name"])] = obj
    out.update(((JOB.kind, j["metadata"]["name"]), j) for j in children.jobs)
    return out


def _tokens(versions: dict[tuple[str, str], dict[str, Any]]) -> frozenset[Any]:
    """The tokens of children by (kind, name) (from `_versions`). A Job's state (Complete, Failed)
    moves its resourceVersion, not its generation, and decides whether serving is held back: Jobs
    count by resourceVersion."""
    return frozenset((key, (obj["metadata"].get("uid"), obj["metadata"].get("resourceVersion"))
                      if key[0] == JOB.kind else content_token(obj)) for key, obj in versions.items())


def _memo_tokens(before: desired_core.Children, written: list[tuple[str, dict[str, Any]]],
                 deleted: Sequence[tuple[str, str, str]]) -> frozenset[Any]:
    """The tokens a converged pass keeps: its children at the version it read, or wrote
    itself (less what it deleted); never as the cache holds them after its writes. A change that
    reached the cache between a write and the memo would be kept as seen, and the pass its event
    queued would skip as if nothing had changed: a preparation Job that completed within a second
    of its creation left the service saying "waiting for a node" until the operator restarted; a
    Deployment edited or deleted in that gap would have stayed so. A child the pass neither read
    nor wrote is not in the memo, so the next pass that sees it computes again. A Job the pass
    re-applied whose write returned another state than the one it read (it finished in between) is
    kept as read: the desired state read the Job's state, and the pass its completion queued must
    read it again."""
    read = _versions(before)
    versions = dict(read)
    for kind, obj in written:
        key = (kind, obj["metadata"]["name"])
        if kind not in CHILD_KINDS or (kind == JOB.kind and key in read
                                       and read[key].get("status") != obj.get("status")):
            continue
        versions[key] = obj
    for _, kind, name in deleted:
        versions.pop((kind, name), None)
    return _tokens(versions)


def _preparation_digest(isvc: InferenceService) -> str:
    """The preparation remembered in status takes part in the desired of a TensorRT-LLM service."""
    known = [e.wire() for e in isvc.status.preparation or []] if isvc.status else []
    return json.dumps(known, sort_keys=True)


def _with_autoscaling(new_status: dict[str, Any], old_status: dict[str, Any], report: Report | None,
                      isvc: InferenceService, now: datetime) -> dict[str, Any]:
    """Merge the autoscaler's report into the status reconcile computed; clear it when the spec
    no longer autoscales."""
    conds = new_status["conditions"]
    old_cond = conditions.find(old_status.get("conditions") or [], METRICS_AVAILABLE)
    if isvc.spec.autoscaling is None:
        new_status["conditions"] = [x for x in conds if x["type"] != METRICS_AVAILABLE]
        new_status["autoscaling"] = None
        new_status["metrics"] = None
        return new_status
    if report is None:
        # No tick yet since this process started: keep what an earlier run showed.
        if old_cond is not None:
            new_status["conditions"] = conditions.set_condition(
                conds, METRICS_AVAILABLE, old_cond["status"], old_cond["reason"], old_cond.get("message", ""),
                old_cond.get("observedGeneration"), now)
        for k in ("autoscaling", "metrics"):
            if old_status.get(k) is not None:
                new_status[k] = old_status[k]
        return new_status
    ok, reason, message = report.condition()
    new_status["conditions"] = conditions.set_condition(conds, METRICS_AVAILABLE, ok, reason, message,
                                                        isvc.metadata.get("generation"), now)
    new_status.update(report.status())
    return new_status


def _invalid_status(raw: dict[str, Any], message: str, now: datetime
                    ) -> tuple[dict[str, Any], list[Event]]:
    """Status (and an Event, once) for an object the models refuse: stored under an older CRD."""
    gen = raw["metadata"].get("generation")
    old = (raw.get("status") or {}).get("conditions") or []
    conds = old
    for type_, value in ((conditions.READY, False), (conditions.PROGRESSING, False), (conditions.DEGRADED, True)):
        conds = conditions.set_condition(conds, type_, value, "InvalidSpec", message, gen, now)
    before = conditions.find(old, conditions.DEGRADED)
    events = [] if before and before.get("reason") == "InvalidSpec" and before.get("message") == message else [
        Event("Warning", "InvalidSpec", message)]
    return {"observedGeneration": gen, "conditions": conds}, events
