"""Spill-over in the controller, without a cluster: the trimmed cache objects of the free-GPU
view, the plan of one reconcile over cached pods and free GPUs, the status it yields, and what
the autoscaler reads (the e2e suite runs the same against a real API server and scheduler)."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

from triton_operator.api import InferenceService
from triton_operator.conditions import find
from triton_operator.controller import status as status_core
from triton_operator.controller.desired import Children, class_states, desired_state, serving_total
from triton_operator.controller.trim import owner_of, trim_gpu_pod, trim_node
from triton_operator.controller.views import Views
from triton_operator.kube.informer import Informer
from triton_operator.kube.store import Store, trim
from triton_operator.labels import LABEL_GPU_CLASS, LABEL_SERVICE
from triton_operator.planning import placement as pl
from triton_operator.settings import Settings

from .conftest import isvc_doc

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=timezone.utc)
SPILL = {"class": "h100", "fallbackClasses": ["h200", "a100-80gb"], "spill": {"after": "60s", "returnAfter": "120s"}}


def stamp(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def service(status=None, **spec):
    doc = isvc_doc(gpu=SPILL, replicas=3, **spec)
    if status:
        doc["status"] = status
    return InferenceService.model_validate(doc)


def pod(name, gpu_class, node=None, ready=False, unschedulable_for=None, message="0/9 nodes are available: "
        "2 Insufficient nvidia.com/gpu, 7 node(s) didn't match Pod's node affinity/selector."):
    conditions = []
    if unschedulable_for is not None:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                           "lastTransitionTime": stamp(unschedulable_for)})
    if ready:
        conditions.append({"type": "Ready", "status": "True"})
    return {"metadata": {"name": name, "namespace": "ml", "labels": {LABEL_SERVICE: "demo", LABEL_GPU_CLASS: gpu_class}},
            "spec": {"nodeName": node}, "status": {"phase": "Running" if node else "Pending", "conditions": conditions}}


def deployment(name, gpu_class, replicas, ready=0):
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}", "generation": 1,
                         "labels": {LABEL_SERVICE: "demo"}},
            "spec": {"replicas": replicas, "template": {"metadata": {"labels": {LABEL_GPU_CLASS: gpu_class}}}},
            "status": {"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas,
                       "readyReplicas": ready, "availableReplicas": ready}}


def test_the_free_gpu_view_keeps_gpu_nodes_and_bound_gpu_pods_only():
    node = {"metadata": {"name": "n", "resourceVersion": "1", "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"},
                         "managedFields": [{}], "annotations": {"big": "x" * 1000}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                                {"key": "soft", "effect": "PreferNoSchedule"}]},
            "status": {"allocatable": {"cpu": "96", "nvidia.com/gpu": "8", "hugepages-2Mi": "0"},
                       "conditions": [{"type": "Ready", "status": "True"}], "images": [{"names": ["x"] * 50}]}}
    t = trim_node(node)
    assert t["status"] == {"allocatable": {"nvidia.com/gpu": "8"}, "ready": True}
    assert t["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert "annotations" not in t["metadata"]
    cpu_node = copy.deepcopy(node)
    cpu_node["status"]["allocatable"] = {"cpu": "32"}
    assert trim_node(cpu_node) is None
    gpu_pod = {"metadata": {"name": "p", "namespace": "other-team", "resourceVersion": "4"},
               "spec": {"nodeName": "n", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
               "status": {"phase": "Running"}}
    assert trim_gpu_pod(gpu_pod) == {"metadata": {"name": "p", "namespace": "other-team", "resourceVersion": "4"},
                                     "spec": {"nodeName": "n"}, "requests": {"nvidia.com/gpu": 2}}
    for change in ({"spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}], "nodeName": "n"}},
                   {"spec": {**gpu_pod["spec"], "nodeName": None}}, {"status": {"phase": "Succeeded"}}):
        assert trim_gpu_pod({**gpu_pod, **change}) is None


def test_an_informer_drops_what_its_projection_refuses_and_forgets_it_when_it_turns():
    store, seen = Store(owner=owner_of), []
    inf = Informer(None, store, type("K", (), {"kind": "Pod", "plural": "pods"})(), None,
                   lambda kind, old, new: seen.append((kind, old is None, new is None)), None,
                   project=trim_gpu_pod, store_kind="GPUPod")
    bound = {"metadata": {"name": "p", "namespace": "a", "resourceVersion": "2"},
             "spec": {"nodeName": "n", "containers": [{"resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
             "status": {"phase": "Running"}}
    inf._apply({"type": "ADDED", "object": {**bound, "spec": {**bound["spec"], "nodeName": None}}}, "1")
    assert store.count("GPUPod") == 0 and seen == []
    inf._apply({"type": "MODIFIED", "object": bound}, "2")
    assert store.count("GPUPod") == 1 and store.count("Pod") == 0
    inf._apply({"type": "MODIFIED", "object": {**bound, "metadata": {**bound["metadata"], "resourceVersion": "3"},
                                               "status": {"phase": "Succeeded"}}}, "3")
    assert store.count("GPUPod") == 0 and seen == [("GPUPod", True, False), ("GPUPod", False, True)]


def test_class_states_count_per_class_and_ignore_volume_trouble():
    children = Children(
        deployment=deployment("demo", "h100", 3, 1),
        deployments=(deployment("demo", "h100", 3, 1), deployment("demo-spill-h200", "h200", 1)),
        pods=(pod("a", "h100", "n1", ready=True), pod("b", "h100", unschedulable_for=90),
              pod("c", "h100", unschedulable_for=10, message="pod has unbound immediate PersistentVolumeClaims"),
              pod("d", "h200")))
    st = class_states(children)
    assert (st["h100"].replicas, st["h100"].bound, st["h100"].ready, len(st["h100"].unschedulable)) == (3, 1, 1, 1)
    assert (st["h200"].replicas, st["h200"].bound) == (1, 0)


def test_a_reconcile_plan_moves_stuck_replicas_to_the_class_with_room(classes):
    obj = service()
    children = Children(deployment=deployment("demo", "h100", 3, 1), deployments=(deployment("demo", "h100", 3, 1),),
                        pods=(pod("a", "h100", "n1", ready=True), pod("b", "h100", unschedulable_for=90),
                              pod("c", "h100", unschedulable_for=70)))
    free = {"h100": [0, 0], "h200": [5], "a100-80gb": [8, 8]}
    p = desired_state(obj, classes, Settings(), children, 3, free, NOW)
    assert p.placement.replicas() == {"h100": 1, "h200": 2, "a100-80gb": 0}
    deps = {m["metadata"]["name"]: m["spec"]["replicas"] for m in p.apply if m["kind"] == "Deployment"}
    assert deps == {"demo": 1, "demo-spill-h200": 2}
    assert dict(p.deployments) == {"h100": "demo", "h200": "demo-spill-h200"}, "no Deployment for an unused class"
    assert [m.kind for m in p.placement.moves] == [pl.SPILL_MOVE]

    # Status: the move is an Event, the placement is listed per class, nothing is Degraded.
    observed = status_core.Observed(
        desired_replicas=3, gpu_class="h100", deployment=children.deployment,
        deployments=[deployment("demo", "h100", 1, 1), deployment("demo-spill-h200", "h200", 2, 0)],
        deployment_names=dict(p.deployments), placement=p.placement, options=list(p.options), pods=list(children.pods))
    st, events = status_core.compute(obj, observed, NOW)
    assert [(e.reason, e.type) for e in events if e.reason == pl.SPILL_MOVE] == [(pl.SPILL_MOVE, "Normal")]
    assert [(e["gpuClass"], e["desired"], e["ready"], e["reason"]) for e in st["placement"]] == [
        ("h100", 1, 1, pl.FULL), ("h200", 2, 0, pl.SPILLED), ("a100-80gb", 0, 0, pl.STANDBY)]
    assert st["replicasByClass"] == "h100:1/1,h200:0/2"
    assert find(st["conditions"], "Degraded")["status"] == "False"


def test_a_class_that_empties_is_deleted_and_its_room_clock_is_remembered(classes):
    returning = {"placement": [{"gpuClass": "h100", "reason": pl.RETURNING, "since": stamp(200), "desired": 3},
                               {"gpuClass": "h200", "reason": pl.SPILLED, "since": stamp(900), "desired": 1}]}
    obj = service(status=returning)
    deps = (deployment("demo", "h100", 3, 3), deployment("demo-spill-h200", "h200", 1, 1))
    children = Children(deployment=deps[0], deployments=deps,
                        pods=tuple(pod(f"a{i}", "h100", "n1", ready=True) for i in range(3)) + (pod("b", "h200", "n2", ready=True),))
    assert serving_total(obj, children) == 3, "the surge of a return is not the autoscaler's"
    p = desired_state(obj, classes, Settings(), children, 3, {"h100": [5], "h200": [7], "a100-80gb": []}, NOW)
    assert [m.kind for m in p.placement.moves] == [pl.MOVED_BACK]
    assert p.delete == (("apps/v1", "Deployment", "demo-spill-h200"),)


def test_every_class_full_is_degraded_naming_the_shortfall(classes):
    obj = service()
    children = Children(deployment=deployment("demo", "h100", 3, 1), deployments=(deployment("demo", "h100", 3, 1),),
                        pods=(pod("a", "h100", "n1", ready=True), pod("b", "h100", unschedulable_for=90),
                              pod("c", "h100", unschedulable_for=90)))
    p = desired_state(obj, classes, Settings(), children, 3, {"h100": [0], "h200": [0], "a100-80gb": [0]}, NOW)
    observed = status_core.Observed(desired_replicas=3, gpu_class="h100", deployment=children.deployment,
                                    deployment_names=dict(p.deployments), placement=p.placement,
                                    options=list(p.options), pods=list(children.pods))
    st, events = status_core.compute(obj, observed, NOW)
    degraded = find(st["conditions"], "Degraded")
    assert degraded["reason"] == "GPUClassesFull"
    assert degraded["message"].startswith("2 replica(s) cannot be placed on any GPU class: h100: 2 replica(s) x 1 GPU(s)")
    assert "h200: no room" in degraded["message"] and any(e.reason == "GPUClassesFull" for e in events)


def test_waiting_for_after_is_progress_not_degradation(classes):
    obj = service()
    children = Children(deployment=deployment("demo", "h100", 3, 1), deployments=(deployment("demo", "h100", 3, 1),),
                        pods=(pod("a", "h100", "n1", ready=True), pod("b", "h100", unschedulable_for=20)))
    p = desired_state(obj, classes, Settings(), children, 3, {"h100": [0], "h200": [8], "a100-80gb": [8]}, NOW)
    assert p.placement.wake_after == 40
    observed = status_core.Observed(desired_replicas=3, gpu_class="h100", deployment=children.deployment,
                                    deployment_names=dict(p.deployments), placement=p.placement,
                                    options=list(p.options), pods=list(children.pods))
    st, _ = status_core.compute(obj, observed, NOW)
    assert find(st["conditions"], "Progressing")["reason"] == "WaitingToSpill"
    assert find(st["conditions"], "Degraded")["status"] == "False"


def test_the_autoscaler_reads_totals_over_classes():
    store = Store(owner=owner_of)
    doc = isvc_doc(gpu=SPILL, autoscaling={"minReplicas": 1, "maxReplicas": 8})
    doc["metadata"]["resourceVersion"] = "1"
    doc["status"] = {"placement": [{"gpuClass": "h100", "reason": pl.RETURNING, "desired": 2}]}
    store.upsert("InferenceService", doc)
    for d in (deployment("demo", "h100", 2, 2), deployment("demo-spill-h200", "h200", 2, 2)):
        d["metadata"]["resourceVersion"] = "1"
        store.upsert("Deployment", trim(d))
    dep = Views(store).deployment(("ml", "demo"))
    assert (dep["spec"]["replicas"], dep["status"]["readyReplicas"]) == (3, 4)


def test_placement_messages_are_bounded_as_condition_messages():
    """A skipped class's message may list every GPUClass (class auto): status.placement cuts it
    as conditions are cut, so status stays small however many classes the cluster has."""
    from triton_operator.conditions import MAX_MESSAGE
    from triton_operator.planning.assignment import Option
    obj = service()
    long = Option("l4", 4, "TooSlow", "decode too slow; " * 500)
    observed = status_core.Observed(desired_replicas=1, gpu_class="h100", options=[long])
    st, _ = status_core.compute(obj, observed, NOW)
    skipped = next(e for e in st["placement"] if e["gpuClass"] == "l4")
    assert len(long.message) > MAX_MESSAGE and len(skipped["message"]) == MAX_MESSAGE
    assert skipped["message"].endswith("…") and skipped["reason"] == "TooSlow"
    InferenceService.model_validate({**isvc_doc(gpu=SPILL), "status": st})  # the status the models read back
