"""Status (pure): what the cluster shows -> the InferenceService status and the Events to post.

Ready means the current spec is rolled out and at least one replica serves it. Progressing means
the operator is still moving towards the spec (creating, rolling out, scaling). Degraded means
something needs a human: a missing GPUClass, pods the scheduler cannot place, crash loops,
rejected pods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from .. import conditions
from ..api import GPUClassSpec, InferenceService
from ..kube.events import Event
from ..planning import placement as placing
from ..planning.assignment import Option

# Container waiting reasons that mean "this will not fix itself".
BAD_WAITING = {"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
               "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}


@dataclass(frozen=True)
class Observed:
    """What the shell read from the cluster for one InferenceService."""

    desired_replicas: int
    gpu_class: str | None = None
    gpu_class_spec: GPUClassSpec | None = None
    gpu_count: int = 1
    error: tuple[str, str] | None = None          # (reason, message) from rendering
    notes: list[str] = field(default_factory=list)
    deployment: dict[str, Any] | None = None
    pods: list[dict[str, Any]] = field(default_factory=list)
    endpoints: dict[str, str] | None = None
    selector: str | None = None
    preparation: list[dict[str, Any]] | None = None  # TensorRT-LLM only: the model's preparation
    class_nodes: int | None = None                # nodes of gpu_class in the cluster (None: not watched)
    deployments: list[dict[str, Any]] | None = None  # every class's Deployment (None: just `deployment`)
    deployment_names: dict[str, str] = field(default_factory=dict)  # GPU class -> Deployment name
    placement: placing.Placement | None = None    # gpu.spill: replicas per class and why
    options: list[Option] = field(default_factory=list)  # classes in use and skipped, GPUs per replica

    def all_deployments(self) -> list[dict[str, Any]]:
        if self.deployments is not None:
            return self.deployments
        return [self.deployment] if self.deployment is not None else []

    def prepared(self) -> dict[str, Any] | None:
        """The model's preparation (tensorrt-llm), if any."""
        return (self.preparation or [None])[0]


@dataclass(frozen=True)
class PodTrouble:
    unschedulable: list[tuple[str, str]]          # (pod, scheduler message)
    failing: list[tuple[str, str, str]]           # (pod, reason, message)


def pod_trouble(pods: list[dict[str, Any]]) -> PodTrouble:
    unschedulable, failing = [], []
    for pod in pods:
        meta, st = pod.get("metadata", {}), pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            continue
        name = meta.get("name", "?")
        for cond in st.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                    and cond.get("reason") == "Unschedulable":
                unschedulable.append((name, cond.get("message") or ""))
        for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in BAD_WAITING:
                # A crash loop's own message only says it backs off; what the container said as it
                # exited (runtime/'s doctor writes its findings there) tells the user what to fix.
                said = ((cs.get("lastState") or {}).get("terminated") or {}).get("message") or ""
                message = f"{cs.get('name')}: {said.strip()}" if said.strip() else waiting.get("message") or ""
                failing.append((name, waiting["reason"], message))
    return PodTrouble(unschedulable, failing)


def _dep_condition(dep: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return conditions.find((dep.get("status") or {}).get("conditions") or [], type_)


def _degraded(obs: Observed, trouble: PodTrouble) -> tuple[bool, str, str]:
    if obs.error:
        return True, obs.error[0], obs.error[1]
    prep = obs.prepared()
    if prep and prep["phase"] == "Failed":
        return True, "PreparationFailed", prep["message"]
    if obs.placement is not None and obs.placement.shortfall:
        return True, "GPUClassesFull", obs.placement.shortfall
    if trouble.unschedulable:
        n = len(trouble.unschedulable)
        spec = obs.gpu_class_spec
        resource = spec.resource_name if spec else "nvidia.com/gpu"
        scheduler = trouble.unschedulable[0][1]
        if obs.class_nodes == 0 and spec is not None:
            # Nothing the scheduler can do: no node has the class's labels at all (no GPU Feature
            # Discovery, a cloud's own labels, MIG's single strategy renaming the product).
            looked = (f"label {spec.product_label} in [{', '.join(spec.product_names)}]" if spec.product_names
                      else "")
            selector = ", ".join(f"{k}={v}" for k, v in spec.node_selector.items())
            wanted = " and ".join(x for x in (looked, f"labels {selector}" if selector else "") if x)
            return True, "NoNodeMatchesGPUClass", (
                f"no ready node matches GPU class {obs.gpu_class}: it asks for {wanted}. Check "
                f"`kubectl get nodes -L {spec.product_label}`; on GKE set the class's productLabel to "
                f"cloud.google.com/gke-accelerator, on EKS to node.kubernetes.io/instance-type (the chart's "
                f"gpuClassLabels preset), and list the values your nodes carry")
        if f"Insufficient {resource}" in scheduler:
            why = (f"{n * obs.gpu_count} more {resource} needed ({obs.gpu_count} per pod) on nodes of that "
                   f"class")
        else:  # not a GPU shortage: a missing claim, a taint, a selector no node matches, ...
            why = "see the scheduler's reason"
        return True, "Unschedulable", (
            f"{n} pod(s) cannot be scheduled on GPU class {obs.gpu_class}: {why}. Scheduler: {scheduler}")
    if trouble.failing:
        pod, reason, message = trouble.failing[0]
        return True, reason, f"pod {pod}: {reason}: {message}".rstrip(": ")
    for dep in obs.all_deployments():
        failure = _dep_condition(dep, "ReplicaFailure")
        if failure and failure.get("status") == "True":
            return True, failure.get("reason") or "ReplicaFailure", failure.get("message") or ""
        progressing = _dep_condition(dep, "Progressing")
        if progressing and progressing.get("reason") == "ProgressDeadlineExceeded":
            return True, "ProgressDeadlineExceeded", progressing.get("message") or ""
    return False, "AsExpected", ""


class _Condition(NamedTuple):
    """A condition's status, reason and message, before conditions.set_condition stamps it."""

    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class _Rollout:
    """The replicas asked for, and the Deployments' figures summed over every class's Deployment."""

    desired: int
    ready: int
    available: int
    updated: int
    total: int
    rolled_out: bool       # every Deployment has seen its spec, and all the replicas run it


def compute(isvc: InferenceService, obs: Observed, now: datetime) -> tuple[dict[str, Any], list[Event]]:
    """The status to write and the Events that its transitions deserve."""
    old_status = isvc.status.wire() if isvc.status else {}
    old = old_status.get("conditions", [])
    gen = isvc.metadata.get("generation")
    degraded = _Condition(*_degraded(obs, _trouble_to_report(obs)))
    rollout = _rollout(obs)
    ready = _ready(isvc, obs, rollout, degraded, old)
    progressing = _progressing(obs, rollout, ready)

    conds = conditions.set_condition(old, conditions.READY, *ready, gen, now)
    conds = conditions.set_condition(conds, conditions.PROGRESSING, *progressing, gen, now)
    conds = conditions.set_condition(conds, conditions.DEGRADED, *degraded, gen, now)
    if _scales_to_zero(isvc):
        conds = conditions.set_condition(conds, conditions.SCALED_TO_ZERO, *_scaled_to_zero(rollout, ready),
                                         gen, now)
    else:
        conds = [x for x in conds if x["type"] != conditions.SCALED_TO_ZERO]
    if obs.preparation is not None:
        conds = conditions.set_condition(conds, conditions.MODEL_READY, *_model_ready(obs), gen, now)

    status = _status_fields(obs, rollout, conds, gen, old_status.get("placement") or [], now)
    events = _events(old, conds, obs.notes, old_status.get("gpuClass"), obs.gpu_class)
    if obs.placement is not None:
        events += _move_events(obs.placement)
    return status, events


def _trouble_to_report(obs: Observed) -> PodTrouble:
    """The pods' trouble that Degraded reports."""
    trouble = pod_trouble(obs.pods)
    if obs.placement is None:
        return trouble
    # Pods short of room are the placement's to move (or to name in GPUClassesFull).
    return PodTrouble([(p, m) for p, m in trouble.unschedulable if not placing.capacity_shortage(m)],
                      trouble.failing)


def _rollout(obs: Observed) -> _Rollout:
    deps = obs.all_deployments()

    def summed(field_: str) -> int:
        return sum(int(((d.get("status") or {}).get(field_)) or 0) for d in deps)

    ready, available, updated, total = (summed("readyReplicas"), summed("availableReplicas"),
                                        summed("updatedReplicas"), summed("replicas"))
    desired = obs.desired_replicas
    dep_current = obs.deployment is not None and all(
        ((d.get("status") or {}).get("observedGeneration") or 0) >= d["metadata"].get("generation", 0) for d in deps)
    rolled_out = dep_current and updated >= desired and total <= updated
    return _Rollout(desired, ready, available, updated, total, rolled_out)


def _scales_to_zero(isvc: InferenceService) -> bool:
    auto = isvc.spec.autoscaling
    return auto is not None and auto.min_replicas == 0


def _preparation_pending(obs: Observed) -> bool:
    """The model's preparation (tensorrt-llm) is not done: serving pods wait for it."""
    prep = obs.prepared()
    return prep is not None and prep["phase"] != "Ready"


def _ready(isvc: InferenceService, obs: Observed, rollout: _Rollout, degraded: _Condition,
           old: list[dict[str, Any]]) -> _Condition:
    """Ready, from the replicas; a spec that cannot be applied, and a model not prepared yet
    while nothing serves, say why instead."""
    ready = _ready_from_replicas(isvc, obs, rollout, degraded, old)
    if obs.error and obs.deployment is not None:
        # Whatever still runs serves an earlier spec: Ready (for this generation) is False.
        still = f"; {rollout.ready} replica(s) of an earlier spec still serve" if rollout.ready else ""
        ready = _Condition(False, obs.error[0], f"the latest spec cannot be applied: {obs.error[1]}{still}")
    prep = obs.prepared()
    if _preparation_pending(obs) and not (ready.status and rollout.desired > 0):
        reason = "PreparationFailed" if prep["phase"] == "Failed" else "Preparing"
        ready = _Condition(False, reason, f"serving pods wait for the model's preparation ({prep['precision']}): "
                                          f"{prep['message']}")
    return ready


def _ready_from_replicas(isvc: InferenceService, obs: Observed, rollout: _Rollout, degraded: _Condition,
                         old: list[dict[str, Any]]) -> _Condition:
    """Ready as the Deployments show it: the first of these that holds."""
    dep, desired, ready = obs.deployment, rollout.desired, rollout.ready
    auto = isvc.spec.autoscaling
    to_zero = _scales_to_zero(isvc)
    where = _where(obs)
    if obs.error and dep is None:
        return _Condition(False, obs.error[0], obs.error[1])
    if dep is None:
        return _Condition(False, "Creating", "creating the Deployment")
    if desired == 0:
        return _Condition(False, "ScaledToZero", f"no requests for {auto.scale_to_zero_after_seconds}s: scaled to "
                                                 "zero; the next request through the gateway wakes it" if to_zero
                          else "replicas is 0")
    if _waking(isvc, rollout, old) and not degraded.status:
        return _Condition(False, "Waking", f"waking from zero: 0/{desired} replicas ready; the gateway holds "
                                           "requests until one is")
    if rollout.rolled_out and rollout.available >= 1 and not obs.error:
        return _Condition(True, "Serving", f"{ready}/{desired} replicas ready on {where}")
    if degraded.status:
        return _Condition(False, degraded.reason, degraded.message)
    if rollout.available >= 1:
        return _Condition(False, "RollingOut", f"rolling out the new spec: {rollout.updated}/{desired} replicas "
                                               f"updated, {ready} ready")
    return _Condition(False, "Loading", f"0/{desired} replicas ready: waiting for Triton to load the model")


def _waking(isvc: InferenceService, rollout: _Rollout, old: list[dict[str, Any]]) -> bool:
    """Waking: the autoscaler asked for a replica after zero, and none is ready yet (the gateway
    holds the requests that woke it)."""
    old_ready = conditions.find(old, conditions.READY)
    return _scales_to_zero(isvc) and rollout.desired > 0 and rollout.ready == 0 and old_ready is not None and \
        old_ready.get("reason") in ("ScaledToZero", "Waking")


def _progressing(obs: Observed, rollout: _Rollout, ready: _Condition) -> _Condition:
    """Progressing: what the operator is still doing towards the spec, the first of these that holds."""
    placement, prep = obs.placement, obs.prepared()
    desired, updated, n_ready = rollout.desired, rollout.updated, rollout.ready
    if obs.error:
        return _Condition(False, obs.error[0], "waiting for the spec or the cluster to change")
    if _preparation_pending(obs):
        return _Condition(prep["phase"] == "Preparing", ready.reason if not ready.status else "Preparing",
                          prep["message"])
    if placement is not None and placement.waiting and not placement.shortfall:
        return _Condition(True, "WaitingToSpill", placement.waiting)
    if placement is not None and placement.returning:
        return _Condition(True, "MovingBack", f"a replica is starting on {obs.gpu_class} to replace a spilled one; "
                                              f"{n_ready} ready")
    if obs.deployment is None or not rollout.rolled_out:
        return _Condition(True, "RollingOut", f"{updated}/{desired} replicas updated, {n_ready} ready")
    if n_ready != desired or rollout.total != desired:
        return _Condition(True, "Scaling", f"{n_ready}/{desired} replicas ready")
    return _Condition(False, "Complete", f"{n_ready}/{desired} replicas ready")


def _scaled_to_zero(rollout: _Rollout, ready: _Condition) -> _Condition:
    """ScaledToZero (minReplicas 0 only): at zero after the idle window, waking, or serving."""
    if rollout.desired == 0:
        return _Condition(True, "IdleWindowElapsed", ready.message)
    if ready.reason == "Waking":
        return _Condition(False, "Waking", ready.message)
    return _Condition(False, "Serving", f"{rollout.ready}/{rollout.desired} replicas ready")


def _model_ready(obs: Observed) -> _Condition:
    """ModelReady (tensorrt-llm only): the model's preparation."""
    prep = obs.prepared()
    if prep is None:
        return _Condition(False, "NoGPUClass", "no GPU class can serve the model, so it is not prepared")
    return _Condition(prep["phase"] == "Ready", {"Ready": "Prepared", "Failed": "PreparationFailed"}.get(
        prep["phase"], "Preparing"), prep["message"])


def _status_fields(obs: Observed, rollout: _Rollout, conds: list[dict[str, Any]], gen: int | None,
                   old_placement: list[dict[str, Any]], now: datetime) -> dict[str, Any]:
    status: dict[str, Any] = {
        "observedGeneration": gen,
        "conditions": conds,
        "replicas": rollout.desired,
        "readyReplicas": rollout.ready,
        "gpuClass": obs.gpu_class,
        "selector": obs.selector,
        "endpoints": obs.endpoints,
    }
    if obs.preparation is not None:
        status["preparation"] = obs.preparation
    if obs.gpu_class is not None:
        layout = next((o.layout for o in obs.options if o.gpu_class == obs.gpu_class and o.layout is not None), None)
        status["nodesPerReplica"] = layout.nodes if layout is not None else 1
        entries = _placement_status(obs, old_placement, now)
        status["placement"] = entries
        status["replicasByClass"] = ",".join(f"{e['gpuClass']}:{e['ready']}/{e['desired']}" for e in entries
                                             if e["desired"] or e["ready"]) or f"{obs.gpu_class}:0/{rollout.desired}"
    return status


def _move_events(placement: placing.Placement) -> list[Event]:
    """An Event per replica moved between classes; a return given up is a Warning."""
    return [Event("Warning" if m.kind == placing.RETURN_ABANDONED else "Normal", m.kind, m.why)
            for m in placement.moves]


def _ready_by_class(obs: Observed) -> dict[str, int]:
    if not obs.deployment_names:
        st = (obs.deployment or {}).get("status") or {}
        return {obs.gpu_class: int(st.get("readyReplicas") or 0)} if obs.gpu_class else {}
    by_name = {d["metadata"].get("name"): d for d in obs.all_deployments()}
    return {gpu_class: int(((by_name.get(name) or {}).get("status") or {}).get("readyReplicas") or 0)
            for gpu_class, name in obs.deployment_names.items()}


def _where(obs: Observed) -> str:
    """'GPU class h100', or with replicas spilled 'GPU classes h100 (1), h200 (2)' (ready)."""
    ready = {gpu_class: n for gpu_class, n in _ready_by_class(obs).items() if n}
    if len(ready) <= 1:
        return f"GPU class {next(iter(ready), obs.gpu_class)}"
    return "GPU classes " + ", ".join(f"{gpu_class} ({n})" for gpu_class, n in ready.items())


def _placement_status(obs: Observed, old: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """status.placement: each class in use (the preferred first) with desired/ready and why, then
    the classes left out and why."""
    before = {e.get("gpuClass"): e for e in old}
    ready = _ready_by_class(obs)
    gpus = {o.gpu_class: o.count for o in obs.options}

    def since(gpu_class: str, reason: str) -> str:
        prev = before.get(gpu_class) or {}
        return prev["since"] if prev.get("reason") == reason and prev.get("since") else conditions.timestamp(now)

    entries: list[dict[str, Any]] = []
    if obs.placement is None:
        reason = "Preferred"
        entries.append({"gpuClass": obs.gpu_class, "deployment": obs.deployment_names.get(obs.gpu_class),
                        "gpusPerReplica": gpus.get(obs.gpu_class, obs.gpu_count), "desired": obs.desired_replicas,
                        "ready": ready.get(obs.gpu_class, 0), "reason": reason,
                        "message": f"{obs.desired_replicas} replica(s)", "since": since(obs.gpu_class, reason)})
    else:
        for d in obs.placement.classes:
            entries.append({"gpuClass": d.gpu_class, "deployment": obs.deployment_names.get(d.gpu_class),
                            "gpusPerReplica": gpus.get(d.gpu_class, obs.gpu_count), "desired": d.replicas,
                            "ready": ready.get(d.gpu_class, 0), "reason": d.reason, "message": d.message,
                            "since": conditions.timestamp(d.since)})
    listed = {e["gpuClass"] for e in entries}
    for o in obs.options:
        if not o.usable and o.gpu_class not in listed:
            entries.append({"gpuClass": o.gpu_class, "gpusPerReplica": o.count, "desired": 0, "ready": 0,
                            "reason": o.reason, "message": o.message, "since": since(o.gpu_class, o.reason)})
    # Skipped classes' messages can list every GPUClass (class auto): bounded as conditions are.
    return [{k: conditions.bounded(v) if k == "message" else v for k, v in e.items() if v is not None} for e in entries]


def _events(old: list[dict[str, Any]], new: list[dict[str, Any]], notes: list[str],
            old_class: str | None, new_class: str | None) -> list[Event]:
    events: list[Event] = []
    before_ready, after_ready = conditions.find(old, conditions.READY), conditions.find(new, conditions.READY)
    if after_ready and (before_ready is None or before_ready["status"] != after_ready["status"]):
        if after_ready["status"] == "True":
            events.append(Event("Normal", "Ready", after_ready["message"]))
        elif before_ready is not None:
            events.append(Event("Warning", "NotReady", f"{after_ready['reason']}: {after_ready['message']}"))
    before_deg, after_deg = conditions.find(old, conditions.DEGRADED), conditions.find(new, conditions.DEGRADED)
    if after_deg and after_deg["status"] == "True" and (
            before_deg is None or before_deg["status"] != "True" or before_deg["reason"] != after_deg["reason"]):
        events.append(Event("Warning", after_deg["reason"], after_deg["message"]))
    if new_class and old_class and new_class != old_class:
        events.append(Event("Normal", "GPUClassChanged", f"now running on GPU class {new_class} (was {old_class})"))
    if new_class != old_class:
        events.extend(Event("Normal", "FallbackGPUClass", n) for n in notes)
    before_eng, after_eng = conditions.find(old, conditions.MODEL_READY), conditions.find(new, conditions.MODEL_READY)
    if after_eng and (before_eng is None or before_eng["reason"] != after_eng["reason"]):
        kind = "Warning" if after_eng["reason"] == "PreparationFailed" else "Normal"
        events.append(Event(kind, after_eng["reason"], after_eng["message"]))
    return events


GROUP_SET_LABEL = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
GROUP_REVISION_LABEL = "leaderworkerset.sigs.k8s.io/template-revision-hash"
Leaders = dict[tuple[str, str], tuple[str, str]]   # (set, group index) -> (leader pod uid, template revision)


def group_leaders(pods: list[dict[str, Any]]) -> Leaders:
    """The leader pod of every group of a service's LeaderWorkerSets, from the serving pods."""
    out: Leaders = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if meta.get("deletionTimestamp") or labels.get("app.kubernetes.io/component") != "server":
            continue
        name, index = labels.get(GROUP_SET_LABEL), labels.get(GROUP_INDEX_LABEL)
        if name is not None and index is not None:
            out[(name, index)] = (meta.get("uid") or "", labels.get(GROUP_REVISION_LABEL) or "")
    return out


def group_restarts(before: Leaders | None, now: Leaders) -> list[Event]:
    """A group whose leader is a new pod of the same template: LeaderWorkerSet recreated it because
    one of its pods stopped (a new template is a rollout, not a restart)."""
    if not before:
        return []
    return [Event("Warning", "GroupRestarted",
                  f"group {index} of {name} was recreated whole: one of its pods stopped (a worker or the leader), "
                  f"and LeaderWorkerSet restarts a group together; see kubectl describe leaderworkerset {name}")
            for (name, index), (uid, revision) in sorted(now.items())
            if (old := before.get((name, index))) is not None and old[0] != uid and old[1] == revision]


def remembered_leaders(before: Leaders | None, now: Leaders, replicas: dict[str, int]) -> Leaders:
    """The leaders to compare the next pass with: those seen now, and a group's earlier leader while
    its set still has that group (between a leader's deletion and its successor's creation)."""
    kept = {k: v for k, v in (before or {}).items() if k[1].isdigit() and int(k[1]) < replicas.get(k[0], 0)}
    return {**kept, **now}
