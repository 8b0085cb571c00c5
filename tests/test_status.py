"""Status: observed children -> conditions, table-driven; and the Events transitions deserve."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from triton_operator import conditions as c
from triton_operator.controller.status import Observed, compute

from .conftest import isvc

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)


def deployment(replicas=2, ready=2, updated=2, available=None, generation=1, observed=1, conds=()):
    return {
        "metadata": {"name": "demo", "generation": generation},
        "spec": {"replicas": replicas},
        "status": {"observedGeneration": observed, "replicas": replicas, "readyReplicas": ready,
                   "updatedReplicas": updated, "availableReplicas": ready if available is None else available,
                   "conditions": list(conds)},
    }


def pending_pod(name="demo-1", message="0/9 nodes are available: 4 Insufficient nvidia.com/gpu."):
    return {"metadata": {"name": name}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}


def crashing_pod(reason="CrashLoopBackOff"):
    return {"metadata": {"name": "demo-2"}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "triton", "state": {"waiting": {"reason": reason, "message": "back-off 5m0s"}}}]}}


def obs(**kw):
    base = dict(desired_replicas=2, gpu_class="h100", gpu_count=1, deployment=deployment())
    base.update(kw)
    return Observed(**base)


def conds(status):
    return {x["type"]: (x["status"], x["reason"]) for x in status["conditions"]}


@pytest.mark.parametrize("observed, ready, progressing, degraded", [
    (obs(), ("True", "Serving"), ("False", "Complete"), ("False", "AsExpected")),
    (obs(deployment=None), ("False", "Creating"), ("True", "RollingOut"), ("False", "AsExpected")),
    (obs(deployment=deployment(ready=0, available=0)), ("False", "Loading"), ("True", "Scaling"), ("False", "AsExpected")),
    (obs(desired_replicas=3, deployment=deployment(replicas=3, ready=2, updated=3)),
     ("True", "Serving"), ("True", "Scaling"), ("False", "AsExpected")),
    (obs(deployment=deployment(updated=1)), ("False", "RollingOut"), ("True", "RollingOut"), ("False", "AsExpected")),
    (obs(deployment=deployment(generation=2, observed=1)), ("False", "RollingOut"), ("True", "RollingOut"), ("False", "AsExpected")),
    (obs(desired_replicas=0, deployment=deployment(replicas=0, ready=0, updated=0)),
     ("False", "ScaledToZero"), ("False", "Complete"), ("False", "AsExpected")),
    (obs(deployment=deployment(ready=0, available=0), pods=[pending_pod()]),
     ("False", "Unschedulable"), ("True", "Scaling"), ("True", "Unschedulable")),
    (obs(deployment=deployment(ready=1, available=1), pods=[crashing_pod()]),
     ("True", "Serving"), ("True", "Scaling"), ("True", "CrashLoopBackOff")),
    (obs(deployment=None, gpu_class=None, error=("GPUClassNotFound", "GPUClass b200 does not exist")),
     ("False", "GPUClassNotFound"), ("False", "GPUClassNotFound"), ("True", "GPUClassNotFound")),
    (obs(deployment=deployment(ready=0, available=0, conds=[
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "violates PodSecurity"}])),
     ("False", "FailedCreate"), ("True", "Scaling"), ("True", "FailedCreate")),
    (obs(deployment=deployment(ready=1, available=1, updated=1, conds=[
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "timed out"}])),
     ("False", "ProgressDeadlineExceeded"), ("True", "RollingOut"), ("True", "ProgressDeadlineExceeded")),
])
def test_condition_table(observed, ready, progressing, degraded):
    status, _ = compute(isvc(), observed, NOW)
    assert conds(status) == {"Ready": ready, "Progressing": progressing, "Degraded": degraded}
    assert all(x["observedGeneration"] == 3 for x in status["conditions"])
    assert status["observedGeneration"] == 3


def test_unschedulable_names_the_class_and_the_shortfall():
    status, events = compute(isvc(gpu={"class": "h100", "count": 8}), obs(
        gpu_count=8, deployment=deployment(ready=0, available=0),
        pods=[pending_pod("a"), pending_pod("b")]), NOW)
    msg = c.find(status["conditions"], "Degraded")["message"]
    assert "2 pod(s) cannot be scheduled on GPU class h100" in msg
    assert "16 more nvidia.com/gpu needed (8 per pod)" in msg
    assert "Insufficient nvidia.com/gpu" in msg
    assert any(e.type == "Warning" and e.reason == "Unschedulable" for e in events)


def test_unschedulable_for_another_reason_claims_no_gpu_shortfall():
    status, _ = compute(isvc(), obs(deployment=deployment(ready=0, available=0), pods=[pending_pod(
        message='0/10 nodes are available: persistentvolumeclaim "trtllm-engines" not found.')]), NOW)
    msg = c.find(status["conditions"], "Degraded")["message"]
    assert "more nvidia.com/gpu" not in msg and 'persistentvolumeclaim "trtllm-engines" not found' in msg


def test_a_class_no_node_matches_names_the_label_it_looked_for():
    """No GPU Feature Discovery, a cloud's own labels, or MIG's single strategy renaming the
    product: the scheduler says only that no node matched; the operator, which watches the nodes,
    says which label and values it looked for and where to fix it."""
    from triton_operator.api import GPUClassSpec
    spec = GPUClassSpec.model_validate({"productNames": ["NVIDIA-H100-80GB-HBM3"], "memoryGiB": 80,
                                        "memoryBandwidthTBps": 3.35, "computeCapability": "9.0"})
    pending = pending_pod(message="0/9 nodes are available: 9 node(s) didn't match Pod's node affinity/selector.")
    status, events = compute(isvc(), obs(deployment=deployment(ready=0, available=0), pods=[pending],
                                         gpu_class_spec=spec, class_nodes=0), NOW)
    degraded = c.find(status["conditions"], "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "NoNodeMatchesGPUClass")
    assert degraded["message"].startswith("no ready node matches GPU class h100: it asks for label "
                                          "nvidia.com/gpu.product in [NVIDIA-H100-80GB-HBM3]. Check "
                                          "`kubectl get nodes -L nvidia.com/gpu.product`")
    assert "cloud.google.com/gke-accelerator" in degraded["message"]
    assert any(e.reason == "NoNodeMatchesGPUClass" for e in events)
    # nodes of the class exist (or are not watched): the scheduler's own reason, as before
    for known in (3, None):
        status, _ = compute(isvc(), obs(deployment=deployment(ready=0, available=0), pods=[pending],
                                        gpu_class_spec=spec, class_nodes=known), NOW)
        assert c.find(status["conditions"], "Degraded")["reason"] == "Unschedulable"


def test_spec_error_keeps_reporting_the_running_deployment():
    status, _ = compute(isvc(), obs(error=("PrecisionUnsupported", "fp8 needs 8.9")), NOW)
    ready = c.find(status["conditions"], "Ready")
    assert ready["status"] == "False" and "the latest spec cannot be applied: fp8 needs 8.9" in ready["message"]


def test_last_transition_time_moves_only_on_status_change():
    first, _ = compute(isvc(), obs(deployment=deployment(ready=0, available=0)), NOW)
    obj = isvc()
    obj.status = obj.status.model_validate(first) if obj.status else None
    from triton_operator.api import InferenceServiceStatus
    obj.status = InferenceServiceStatus.model_validate(first)
    later = NOW + timedelta(minutes=5)
    second, events = compute(obj, obs(deployment=deployment(ready=0, available=0)), later)
    assert c.find(second["conditions"], "Ready")["lastTransitionTime"] == "2026-11-21T12:00:00Z"
    assert events == []
    obj.status = InferenceServiceStatus.model_validate(second)
    third, events = compute(obj, obs(), later)
    assert c.find(third["conditions"], "Ready")["lastTransitionTime"] == "2026-11-21T12:05:00Z"
    assert [(e.type, e.reason) for e in events] == [("Normal", "Ready")]


def test_set_condition_keeps_other_conditions_and_order():
    out = c.set_condition([], "Degraded", False, "AsExpected", "", 1, NOW)
    out = c.set_condition(out, "Ready", True, "Serving", "ok", 1, NOW)
    assert [x["type"] for x in out] == ["Ready", "Degraded"]
    assert c.is_true(out, "Ready") and not c.is_true(out, "Degraded")


def test_status_reports_class_urls_and_selector():
    status, _ = compute(isvc(), obs(endpoints={"http": "http://demo.ml.svc.cluster.local:8000"},
                                    selector="a=b"), NOW)
    assert status["gpuClass"] == "h100" and status["replicas"] == 2 and status["readyReplicas"] == 2
    assert status["endpoints"]["http"].startswith("http://demo.ml.svc") and status["selector"] == "a=b"


def test_scale_to_zero_and_waking_show_in_conditions():
    """minReplicas 0: ScaledToZero=True after the idle window; the next replica asked for is
    Waking until it is ready, then Serving. Services that cannot reach zero carry no such condition."""
    from triton_operator.api import InferenceService

    raw = isvc(autoscaling={"minReplicas": 0, "maxReplicas": 2, "scaleToZeroAfterSeconds": 300}).wire()
    zero, _ = compute(InferenceService.model_validate(raw), obs(
        desired_replicas=0, deployment=deployment(replicas=0, ready=0, updated=0)), NOW)
    got = conds(zero)
    assert got["Ready"] == ("False", "ScaledToZero") and got["ScaledToZero"] == ("True", "IdleWindowElapsed")
    assert "300s" in next(x for x in zero["conditions"] if x["type"] == "Ready")["message"]

    waking_obj = InferenceService.model_validate({**raw, "status": zero})
    waking, _ = compute(waking_obj, obs(desired_replicas=1, deployment=deployment(replicas=1, ready=0, available=0)),
                        NOW + timedelta(seconds=5))
    assert conds(waking)["Ready"] == ("False", "Waking") and conds(waking)["ScaledToZero"] == ("False", "Waking")

    served, _ = compute(InferenceService.model_validate({**raw, "status": waking}),
                        obs(desired_replicas=1, deployment=deployment(replicas=1, ready=1)), NOW + timedelta(seconds=30))
    assert conds(served)["Ready"] == ("True", "Serving") and conds(served)["ScaledToZero"] == ("False", "Serving")

    plain, _ = compute(isvc(), obs(), NOW)
    assert "ScaledToZero" not in conds(plain)
