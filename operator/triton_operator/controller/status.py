"""Status (pure): what the cluster shows -> the InferenceService status and the Events to post.

Ready means the current spec is rolled out and at least one replica serves it. Progressing means
the operator is still moving towards the spec (creating, rolling out, scaling). Degraded means
something needs a human: a missing GPUClass, pods the scheduler cannot place, crash loops,
rejected pods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .. import conditions as c
from ..api import GPUClassSpec, InferenceService

# Container waiting reasons that mean "this will not fix itself".
BAD_WAITING = {"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
               "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


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
    engines: list[dict[str, Any]] | None = None   # TensorRT-LLM only: per GPU class

    def engine(self) -> dict[str, Any] | None:
        """The engine of the class in use."""
        return next((e for e in self.engines or [] if e["gpuClass"] == self.gpu_class), None)


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
    return c.find((dep.get("status") or {}).get("conditions") or [], type_)


def _degraded(obs: Observed, trouble: PodTrouble) -> tuple[bool, str, str]:
    if obs.error:
        return True, obs.error[0], obs.error[1]
    engine = obs.engine()
    if engine and engine["phase"] == "Failed":
        return True, "EngineFailed", engine["message"]
    if trouble.unschedulable:
        n = len(trouble.unschedulable)
        spec = obs.gpu_class_spec
        resource = spec.resource_name if spec else "nvidia.com/gpu"
        scheduler = trouble.unschedulable[0][1]
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
    dep = obs.deployment
    if dep is not None:
        failure = _dep_condition(dep, "ReplicaFailure")
        if failure and failure.get("status") == "True":
            return True, failure.get("reason") or "ReplicaFailure", failure.get("message") or ""
        progressing = _dep_condition(dep, "Progressing")
        if progressing and progressing.get("reason") == "ProgressDeadlineExceeded":
            return True, "ProgressDeadlineExceeded", progressing.get("message") or ""
    return False, "AsExpected", ""


def compute(isvc: InferenceService, obs: Observed, now: datetime) -> tuple[dict[str, Any], list[Event]]:
    """The status to write and the Events that its transitions deserve."""
    old_status = isvc.status.wire() if isvc.status else {}
    old = old_status.get("conditions", [])
    gen = isvc.metadata.get("generation")
    trouble = pod_trouble(obs.pods)
    degraded, d_reason, d_message = _degraded(obs, trouble)

    dep = obs.deployment
    dst = (dep or {}).get("status") or {}
    ready = int(dst.get("readyReplicas") or 0)
    available = int(dst.get("availableReplicas") or 0)
    updated = int(dst.get("updatedReplicas") or 0)
    total = int(dst.get("replicas") or 0)
    desired = obs.desired_replicas
    dep_current = dep is not None and (dst.get("observedGeneration") or 0) >= dep["metadata"].get("generation", 0)
    rolled_out = dep_current and updated >= desired and total <= updated

    auto = isvc.spec.autoscaling
    to_zero = auto is not None and auto.min_replicas == 0
    old_ready = c.find(old, c.READY)
    # Waking: the autoscaler asked for a replica after zero, and none is ready yet (the gateway
    # holds the requests that woke it).
    waking = to_zero and desired > 0 and ready == 0 and old_ready is not None and \
        old_ready.get("reason") in ("ScaledToZero", "Waking")
    if obs.error and dep is None:
        r = (False, obs.error[0], obs.error[1])
    elif dep is None:
        r = (False, "Creating", "creating the Deployment")
    elif desired == 0:
        r = (False, "ScaledToZero", f"no requests for {auto.scale_to_zero_after_seconds}s: scaled to zero; the next "
                                    "request through the gateway wakes it" if to_zero else "replicas is 0")
    elif waking and not degraded:
        r = (False, "Waking", f"waking from zero: 0/{desired} replicas ready; the gateway holds requests until one is")
    elif rolled_out and available >= 1 and not obs.error:
        r = (True, "Serving", f"{ready}/{desired} replicas ready on GPU class {obs.gpu_class}")
    elif degraded:
        r = (False, d_reason, d_message)
    elif available >= 1:
        r = (False, "RollingOut", f"rolling out the new spec: {updated}/{desired} replicas updated, {ready} ready")
    else:
        r = (False, "Loading", f"0/{desired} replicas ready: waiting for Triton to load the model")
    if obs.error and dep is not None:
        # Whatever still runs serves an earlier spec: Ready (for this generation) is False.
        still = f"; {ready} replica(s) of an earlier spec still serve" if ready else ""
        r = (False, obs.error[0], f"the latest spec cannot be applied: {obs.error[1]}{still}")
    engine = obs.engine()
    held = engine is not None and engine["phase"] != "Ready"
    if held and not (r[0] and desired > 0):
        reason = "EngineFailed" if engine["phase"] == "Failed" else "EngineBuilding"
        r = (False, reason, f"serving pods wait for the TensorRT-LLM engine for GPU class {obs.gpu_class}: "
                            f"{engine['message']}")

    if obs.error:
        p = (False, obs.error[0], "waiting for the spec or the cluster to change")
    elif held:
        p = (engine["phase"] == "Building", r[1] if not r[0] else "EngineBuilding", engine["message"])
    elif dep is None or not rolled_out:
        p = (True, "RollingOut", f"{updated}/{desired} replicas updated, {ready} ready")
    elif ready != desired or total != desired:
        p = (True, "Scaling", f"{ready}/{desired} replicas ready")
    else:
        p = (False, "Complete", f"{ready}/{desired} replicas ready")

    conds = c.set_condition(old, c.READY, r[0], r[1], r[2], gen, now)
    conds = c.set_condition(conds, c.PROGRESSING, p[0], p[1], p[2], gen, now)
    conds = c.set_condition(conds, c.DEGRADED, degraded, d_reason, d_message, gen, now)
    if to_zero:
        if desired == 0:
            z = (True, "IdleWindowElapsed", r[2])
        elif r[1] == "Waking":
            z = (False, "Waking", r[2])
        else:
            z = (False, "Serving", f"{ready}/{desired} replicas ready")
        conds = c.set_condition(conds, c.SCALED_TO_ZERO, z[0], z[1], z[2], gen, now)
    else:
        conds = [x for x in conds if x["type"] != c.SCALED_TO_ZERO]
    if obs.engines is not None:
        if engine is None:
            e = (False, "NoEngine", "no GPU class to build an engine for")
        else:
            e = (engine["phase"] == "Ready", {"Ready": "EngineReady", "Failed": "EngineFailed"}.get(
                engine["phase"], "EngineBuilding"), engine["message"])
        conds = c.set_condition(conds, c.ENGINE_READY, e[0], e[1], e[2], gen, now)

    status: dict[str, Any] = {
        "observedGeneration": gen,
        "conditions": conds,
        "replicas": desired,
        "readyReplicas": ready,
        "gpuClass": obs.gpu_class,
        "selector": obs.selector,
        "endpoints": obs.endpoints,
    }
    if obs.engines is not None:
        status["engines"] = obs.engines
    return status, _events(old, conds, obs.notes, old_status.get("gpuClass"), obs.gpu_class)


def _events(old: list[dict[str, Any]], new: list[dict[str, Any]], notes: list[str],
            old_class: str | None, new_class: str | None) -> list[Event]:
    events: list[Event] = []
    before_ready, after_ready = c.find(old, c.READY), c.find(new, c.READY)
    if after_ready and (before_ready is None or before_ready["status"] != after_ready["status"]):
        if after_ready["status"] == "True":
            events.append(Event("Normal", "Ready", after_ready["message"]))
        elif before_ready is not None:
            events.append(Event("Warning", "NotReady", f"{after_ready['reason']}: {after_ready['message']}"))
    before_deg, after_deg = c.find(old, c.DEGRADED), c.find(new, c.DEGRADED)
    if after_deg and after_deg["status"] == "True" and (
            before_deg is None or before_deg["status"] != "True" or before_deg["reason"] != after_deg["reason"]):
        events.append(Event("Warning", after_deg["reason"], after_deg["message"]))
    if new_class and old_class and new_class != old_class:
        events.append(Event("Normal", "GPUClassChanged", f"now running on GPU class {new_class} (was {old_class})"))
    if new_class != old_class:
        events.extend(Event("Normal", "FallbackGPUClass", n) for n in notes)
    before_eng, after_eng = c.find(old, c.ENGINE_READY), c.find(new, c.ENGINE_READY)
    if after_eng and (before_eng is None or before_eng["reason"] != after_eng["reason"]):
        kind = "Warning" if after_eng["reason"] == "EngineFailed" else "Normal"
        events.append(Event(kind, after_eng["reason"], after_eng["message"]))
    return events
