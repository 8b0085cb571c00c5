"""The controller's in-memory parts: the work queue, the watch-fed cache, the comparison that
decides what to write, and the plan of one reconcile (all without a cluster; the e2e suite runs
them against a real API server)."""

from __future__ import annotations

import copy
import logging
import threading

import pytest
from triton_operator.controller.desired import Children, desired_state, matches, stamped
from triton_operator.controller.trim import content_token as token
from triton_operator.controller.trim import owner_of, trim_pod
from triton_operator.kube.failures import FailureLog
from triton_operator.kube.queue import WorkQueue
from triton_operator.kube.store import Store, newer, trim
from triton_operator.labels import LABEL_SERVICE
from triton_operator.planning.assign import assign
from triton_operator.render import render
from triton_operator.settings import Settings

from .conftest import isvc, isvc_doc


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# -- work queue -------------------------------------------------------------------------------------

def test_queue_coalesces_a_key_added_many_times():
    q = WorkQueue()
    for _ in range(10):
        q.add(("ns", "a"))
    q.add(("ns", "b"))
    assert len(q) == 2
    assert q.get(timeout=0) == ("ns", "a") and q.get(timeout=0) == ("ns", "b")
    assert q.get(timeout=0) is None
    assert q.adds == 11 and q.processed == 2


def test_a_key_added_while_processing_comes_back_once_after_done():
    q = WorkQueue()
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add("a")
    q.add("a")
    assert q.get(timeout=0) is None, "never handed to a second worker while the first holds it"
    q.done("a")
    assert q.get(timeout=0) == "a"
    q.done("a")
    assert q.get(timeout=0) is None and q.idle()


def test_failures_back_off_exponentially_and_forget_resets():
    clock = Clock()
    q = WorkQueue(base_delay=0.5, max_delay=4, clock=clock)
    delays = [q.add_rate_limited("a") for _ in range(6)]
    assert delays == [0.5, 1, 2, 4, 4, 4]
    assert q.get(timeout=0) is None
    clock.t += 0.5
    assert q.get(timeout=0) == "a"
    q.done("a")
    q.forget("a")
    assert q.add_rate_limited("a") == 0.5


def test_get_blocks_until_a_key_arrives_and_shutdown_releases_waiters():
    q = WorkQueue()
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(q.get()))
    worker.start()
    q.add("x")
    worker.join(timeout=5)
    assert got == ["x"]
    waiter = threading.Thread(target=lambda: got.append(q.get()))
    waiter.start()
    q.shutdown()
    waiter.join(timeout=5)
    assert got == ["x", None] and not waiter.is_alive()


# -- cache ------------------------------------------------------------------------------------------

def obj(name: str, rv: str, owner: str | None = None, ns: str = "ml", **extra):
    meta = {"name": name, "namespace": ns, "resourceVersion": rv, "uid": f"uid-{name}",
            "managedFields": [{"manager": "x"}]}
    if owner:
        meta["labels"] = {LABEL_SERVICE: owner}
    return {"metadata": meta, **extra}


def test_store_keeps_the_newest_version_and_indexes_children_by_owner():
    s = Store(owner=owner_of)
    assert s.upsert("Deployment", trim(obj("a", "10", owner="svc")))[1]
    old, stored = s.upsert("Deployment", trim(obj("a", "9", owner="svc")))
    assert not stored and old["metadata"]["resourceVersion"] == "10", "an older event never replaces a newer write"
    assert s.upsert("Deployment", trim(obj("a", "11", owner="svc2")))[1]
    assert s.owned("Deployment", ("ml", "svc")) == [] and len(s.owned("Deployment", ("ml", "svc2"))) == 1
    assert "managedFields" not in s.get("Deployment", ("ml", "a"))["metadata"]
    v = s.version("Deployment")
    s.remove("Deployment", obj("a", "12"))
    assert s.get("Deployment", ("ml", "a")) is None and s.owned("Deployment", ("ml", "svc2")) == []
    assert s.version("Deployment") > v


def test_a_newer_version_with_the_same_stored_content_is_kept_but_is_no_change():
    """A node's heartbeat or a pod status the GPU view trims away: the newer resourceVersion is
    stored (an older event still never wins), nobody is told, derived views keep their memo."""
    s = Store(owner=owner_of)
    assert s.upsert("Node", obj("n", "10", status={"allocatable": {"nvidia.com/gpu": "8"}}))[1]
    v = s.version("Node")
    old, changed = s.upsert("Node", obj("n", "11", status={"allocatable": {"nvidia.com/gpu": "8"}}))
    assert not changed and s.version("Node") == v
    assert s.get("Node", ("ml", "n"))["metadata"]["resourceVersion"] == "11"
    assert not s.upsert("Node", obj("n", "10", status={"allocatable": {"nvidia.com/gpu": "4"}}))[1]
    assert s.upsert("Node", obj("n", "12", status={"allocatable": {"nvidia.com/gpu": "4"}}))[1]
    assert s.version("Node") > v
    assert s.upsert("Node", obj("n", "13", owner="svc", status={"allocatable": {"nvidia.com/gpu": "4"}}))[1], \
        "a metadata change (labels) is a change"
    assert len(s.owned("Node", ("ml", "svc"))) == 1
    assert not s.upsert("Node", obj("n", "14", owner="svc", status={"allocatable": {"nvidia.com/gpu": "4"}}))[1]
    assert s.owned("Node", ("ml", "svc"))[0]["metadata"]["resourceVersion"] == "14", "the index holds the newest"


def test_replace_reports_additions_changes_and_deletions_in_its_namespace_only():
    s = Store(owner=owner_of)
    s.replace("Pod", None, [trim(obj("a", "1")), trim(obj("b", "1")), trim(obj("c", "1", ns="other"))])
    changes = s.replace("Pod", "ml", [trim(obj("a", "1")), trim(obj("b", "2")), trim(obj("d", "1"))])
    summary = sorted(((o or n)["metadata"]["name"], o is None, n is None) for o, n in changes)
    assert summary == [("b", False, False), ("d", True, False)]
    changes = s.replace("Pod", "ml", [trim(obj("a", "1"))])
    assert sorted(o["metadata"]["name"] for o, n in changes if n is None) == ["b", "d"]
    assert s.get("Pod", ("other", "c")) is not None, "another namespace's listing is left alone"


def test_resource_versions_compare_as_integers_when_they_are():
    assert newer("10", "9") and not newer("9", "10") and newer("abc", "abd") and newer("1", None)


def test_a_trimmed_pod_keeps_what_status_reads():
    pod = {"metadata": {"name": "p", "namespace": "ml", "labels": {LABEL_SERVICE: "s", "other": "x"}, "uid": "u",
                        "resourceVersion": "3", "managedFields": []},
           "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "big"}]},
           "status": {"phase": "Pending", "conditions": [
               {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no"},
               {"type": "Initialized", "status": "True"}],
               "containerStatuses": [{"name": "c", "ready": False, "restartCount": 3, "image": "big",
                                      "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}
    t = trim_pod(pod)
    assert t["metadata"]["labels"] == {LABEL_SERVICE: "s"}
    assert [c["type"] for c in t["status"]["conditions"]] == ["PodScheduled"]
    assert t["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert "containers" not in t["spec"]


def test_token_ignores_status_but_not_spec_or_labels():
    dep = {"metadata": {"uid": "u", "generation": 2, "resourceVersion": "5", "labels": {"a": "b"}},
           "spec": {}, "status": {"readyReplicas": 1}}
    moved = copy.deepcopy(dep)
    moved["metadata"]["resourceVersion"] = "6"
    moved["status"]["readyReplicas"] = 2
    assert token(dep) == token(moved)
    relabelled = copy.deepcopy(dep)
    relabelled["metadata"]["labels"] = {}
    assert token(dep) != token(relabelled)
    rescaled = copy.deepcopy(dep)
    rescaled["metadata"]["generation"] = 3
    assert token(dep) != token(rescaled) and token(None) is None


# -- comparison -------------------------------------------------------------------------------------

@pytest.mark.parametrize("desired, live, same", [
    ({"a": 1}, {"a": 1, "b": 2}, True),
    ({"a": 1}, {"a": 2}, False),
    ({"a": {"b": [1, 2]}}, {"a": {"b": [1, 2]}}, True),
    ({"a": [1, 2]}, {"a": [1, 2, 3]}, False),
    ({"a": [{"x": 1}]}, {"a": [{"x": 1, "defaulted": True}]}, True),
    ({"a": []}, {}, True),
    ({"a": {}}, {}, True),
    ({"a": None}, {}, True),
    ({"a": {"x": 1}}, {}, False),
    ({"n": 1}, {"n": 1.0}, True),
    ({"flag": True}, {"flag": 1}, False),
    ({"s": "1"}, {"s": 1}, False),
    ({"resources": {"requests": {"cpu": "1"}}}, {"resources": {"requests": {"cpu": "1000m"}}}, True),
    ({"resources": {"limits": {"memory": "1Gi"}}}, {"resources": {"limits": {"memory": "1073741824"}}}, True),
    ({"resources": {"limits": {"memory": "1Gi"}}}, {"resources": {"limits": {"memory": "1G"}}}, False),
    ({"emptyDir": {"sizeLimit": "2Gi"}}, {"emptyDir": {"sizeLimit": "2048Mi"}}, True),
    ({"env": [{"value": "1000"}]}, {"env": [{"value": "1e3"}]}, False),  # not a quantity field
])
def test_matches_is_a_subset_comparison(desired, live, same):
    assert matches(desired, live) is same


def test_quantity_fields_compare_with_the_one_quantity_parser():
    """`matches` compares requests, limits and sizeLimit as `quantity.parse_quantity` does (the
    rules Kubernetes uses): exact decimals, nano rounding, binary values capped at 2^63-1."""
    def same(a: str, b: str) -> bool:
        return matches({"requests": {"x": a}}, {"requests": {"x": b}})
    assert same("500m", "0.5") and same("1Ki", "1024") and same("1E", "1000P") and same("1e3", "1k")
    assert same("0.1n", "1n"), "rounded up to a whole nano, as the API server stores it"
    assert same("16Ei", "10Ei"), "both capped at 2^63-1"
    assert not same("1Xi", "1") and not same("abc", "abd") and same("abc", "abc")
    # What the API server stores for a value written with a two-digit exponent can have three:
    # read as no quantity, the Deployment never matched and was applied again on every pass.
    assert same("1000e99", "1e102") and same("12e99", "1.2e100") and not same("1000e99", "1e101")


# -- plan -------------------------------------------------------------------------------------------

def live_children(manifests):
    """What the API server would hold after the operator applied `manifests` (with their digest,
    as a pass applies them): the same fields plus defaults."""
    out = {}
    for m in manifests:
        live = copy.deepcopy(stamped(m))
        live["metadata"].update(uid="u-" + m["kind"], generation=1, resourceVersion="7")
        live.setdefault("status", {})
        if m["kind"] == "Deployment":
            live["spec"]["template"]["spec"]["dnsPolicy"] = "ClusterFirst"
            live["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
        if m["kind"] == "Service":
            live["spec"]["clusterIP"] = "10.0.0.7"
        out[m["kind"]] = live
    return Children(deployment=out.get("Deployment"), service=out.get("Service"), pdb=out.get("PodDisruptionBudget"))


def test_nothing_to_write_when_the_children_hold_the_rendered_fields(classes):
    obj = isvc()
    rendered = render(obj, classes, Settings(), assign(obj, classes, replicas=2)).manifests
    p = desired_state(obj, classes, Settings(), live_children(rendered), replicas=2)
    assert p.error is None and p.gpu_class == "h100" and p.apply == () and p.rendered == 3


def test_only_what_drifted_is_written(classes):
    obj = isvc()
    children = live_children(render(obj, classes, Settings(), assign(obj, classes, replicas=2)).manifests)
    children.deployment["spec"]["replicas"] = 5
    p = desired_state(obj, classes, Settings(), children, replicas=2)
    assert [m["kind"] for m in p.apply] == ["Deployment"] and p.apply[0]["spec"]["replicas"] == 2
    p = desired_state(obj, classes, Settings(), Children(service=children.service, pdb=children.pdb), replicas=2)
    assert [m["kind"] for m in p.apply] == ["Deployment"], "a deleted child is created again"


def test_a_field_the_operator_stopped_rendering_is_written_away(classes):
    """Every field rendered now is in place in the live object, but the live one also holds a
    field an earlier rendering had (a label, a node selector): the digest differs, so the child
    is applied, and the apply (one field manager) removes the field. Edits by others to fields
    the operator never renders still write nothing."""
    obj = isvc()
    rendered = render(obj, classes, Settings(), assign(obj, classes, replicas=2)).manifests
    dep = next(m for m in rendered if m["kind"] == "Deployment")
    older = copy.deepcopy(dep)
    older["spec"]["template"]["metadata"]["labels"]["inference.networking.k8s.io/engine-type"] = "triton-tensorrt-llm"
    older["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "old"}
    children = live_children([older, *[m for m in rendered if m["kind"] != "Deployment"]])
    assert matches(stamped(dep)["spec"], children.deployment["spec"]), "the subset comparison alone finds it in place"
    p = desired_state(obj, classes, Settings(), children, replicas=2)
    (written,) = p.apply
    assert written["kind"] == "Deployment" and "nodeSelector" not in written["spec"]["template"]["spec"]
    assert "inference.networking.k8s.io/engine-type" not in written["spec"]["template"]["metadata"]["labels"]
    assert written["metadata"]["annotations"]["serving.triton-operator.io/rendered"] == stamped(dep)["metadata"][
        "annotations"]["serving.triton-operator.io/rendered"]
    assert "serving.triton-operator.io/rendered" not in written["spec"]["template"]["metadata"].get("annotations", {}), \
        "on the object only: a new digest rolls no pods"
    others = live_children(rendered)
    others.deployment["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "3"
    others.deployment["metadata"]["labels"]["team"] = "search"
    assert desired_state(obj, classes, Settings(), others, replicas=2).apply == ()


def test_a_spec_that_cannot_render_is_an_error_not_an_exception(classes):
    p = desired_state(isvc(gpu={"class": "x100"}), classes, Settings(), Children(), replicas=1)
    assert p.error[0] == "GPUClassNotFound" and p.apply == ()


def test_llm_serving_waits_for_its_preparation_and_stale_jobs_are_deleted(classes):
    obj = isvc(model={"source": "hf://meta/llama", "format": "tensorrt-llm", "parameters": "8B", "precision": "fp16"})
    old_job = {"metadata": {"name": "demo-oldhash", "labels": {LABEL_SERVICE: "demo"}}, "status": {}}
    p = desired_state(obj, classes, Settings(), Children(jobs=(old_job,)), replicas=2)
    kinds = sorted(m["kind"] for m in p.apply)
    assert kinds == ["Deployment", "Job", "PodDisruptionBudget", "Service"]
    assert next(m for m in p.apply if m["kind"] == "Deployment")["spec"]["replicas"] == 0, "held until prepared"
    assert p.delete == (("batch/v1", "Job", "demo-oldhash"),)
    assert [e["phase"] for e in p.preparation] == ["Preparing"]
    job = next(m for m in p.apply if m["kind"] == "Job")
    assert "serving.triton-operator.io/rendered" not in (job["metadata"].get("annotations") or {}), \
        "a Job's template cannot change in place: no digest asks for it"

    running = live_children([m for m in p.apply if m["kind"] == "Deployment"]).deployment
    p2 = desired_state(obj, classes, Settings(), Children(deployment=running, jobs=()), replicas=2)
    assert "Deployment" not in [m["kind"] for m in p2.apply], "a running Deployment keeps serving while a model is prepared"


# -- bounded logging ----------------------------------------------------------------------------------

def test_repeated_failures_log_one_line_per_interval(caplog):
    clock = Clock()
    flog = FailureLog(logging.getLogger("test.failures"), interval=30, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.failures"):
        for i in range(1000):
            clock.t += 0.1
            flog.failure("reconcile", f"ml/s{i}: 503")
        flog.success("reconcile")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 + 3 + 1, lines  # the first, one per 30 s over 100 s, the recovery
    assert lines[0] == "reconcile: ml/s0: 503"
    assert "failures in the last 30s" in lines[1] and lines[-1].startswith("reconcile: recovered")


# -- what containers said as they failed --------------------------------------------------------------

def test_a_crash_loop_reports_what_the_doctor_said():
    from triton_operator.controller.status import pod_trouble
    pod = trim_pod({"metadata": {"name": "p", "namespace": "ml", "labels": {LABEL_SERVICE: "s"}},
                    "status": {"initContainerStatuses": [{
                        "name": "doctor", "ready": False, "restartCount": 4,
                        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}},
                        "lastState": {"terminated": {"exitCode": 3, "reason": "Error",
                                                     "message": "no GPU visible (NVML: driver not loaded); 1 expected\n"}}}]}})
    (failing,) = pod_trouble([pod]).failing
    assert failing == ("p", "CrashLoopBackOff", "doctor: no GPU visible (NVML: driver not loaded); 1 expected")


def test_a_failed_preparation_names_what_its_pod_said():
    from triton_operator.planning.preparation import states
    job = {"metadata": {"name": "svc-abc", "labels": {"serving.triton-operator.io/gpu-class": "h100"}}}
    failed = {"metadata": {"name": "svc-abc"}, "status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": "exit code 3"}]}}
    pod = trim_pod({"metadata": {"name": "svc-abc-x", "namespace": "ml", "labels": {
        LABEL_SERVICE: "svc", "batch.kubernetes.io/job-name": "svc-abc", "app.kubernetes.io/component": "model-prepare"}},
        "status": {"initContainerStatuses": [{"name": "doctor", "state": {"terminated": {
            "exitCode": 3, "message": "model cache /models/cache is not writable"}}}]}})
    (state,) = states([job], [failed], [], "fp8", [pod])
    assert state["phase"] == "Failed"
    assert state["message"] == ("preparation Job svc-abc failed: PodFailurePolicy: doctor: model cache /models/cache "
                                "is not writable")
    (plain,) = states([job], [failed], [], "fp8", [])
    assert plain["message"] == "preparation Job svc-abc failed: PodFailurePolicy: exit code 3"


def test_condition_messages_are_bounded():
    from datetime import datetime, timezone

    from triton_operator import conditions as c
    (cond,) = c.set_condition([], "Degraded", True, "DeploymentRejected", "x" * 10_000, 1, datetime.now(timezone.utc))
    assert len(cond["message"]) == c.MAX_MESSAGE and cond["message"].endswith("…")


def test_a_cached_child_keeps_its_spec_compact_and_whole_on_demand(classes):
    from triton_operator.controller.trim import SPEC_JSON, trim_child
    from triton_operator.controller.trim import with_full_spec as whole
    obj = isvc()
    dep = stamped(render(obj, classes, Settings(), assign(obj, classes, replicas=2)).by_kind("Deployment"))
    live = {**dep, "metadata": {**dep["metadata"], "uid": "u", "generation": 1, "managedFields": [{"x": 1}]},
            "status": {"readyReplicas": 2}}
    cached = trim_child(live)
    assert isinstance(cached[SPEC_JSON], str) and "managedFields" not in cached["metadata"]
    assert cached["spec"] == {"replicas": 2, "template": {"metadata": {"labels": dep["spec"]["template"]["metadata"]["labels"]}}}
    assert cached["status"] == {"readyReplicas": 2} and token(cached) == token(live)
    assert whole(cached)["spec"] == dep["spec"] and whole(None) is None and whole(dep) is dep
    p = desired_state(obj, classes, Settings(), Children(deployment=cached, service=trim_child(live_children(
        render(obj, classes, Settings(), assign(obj, classes, replicas=2)).manifests).service)), replicas=2)
    assert [m["kind"] for m in p.apply] == ["PodDisruptionBudget"], "compared with the whole spec"


def test_a_child_that_changed_between_a_write_and_the_memo_is_planned_again():
    """A preparation Job that completes within a second of its creation can reach the cache
    between the pass's write and its memo. The memo keeps each child as the pass planned from it
    or wrote it, so the pass its completion queues sees a change and plans again (it skipped, and
    the service said "waiting for a node" until the operator restarted); a child unchanged since
    the write still lets the next pass skip. The same for a Deployment edited or deleted in that
    gap, and for a child the pass deleted or never saw."""
    from triton_operator.controller.desired import Children
    from triton_operator.controller.reconcile import _memo_tokens, _tokens, _versions

    def tokens(children: Children) -> frozenset:
        return _tokens(_versions(children))

    def job(rv: str) -> dict:
        return {"kind": "Job", "metadata": {"name": "svc-abc", "uid": "u1", "resourceVersion": rv}}

    def deployment(generation: int, name: str = "svc") -> dict:
        return {"kind": "Deployment", "metadata": {"name": name, "uid": "d-" + name, "generation": generation,
                                                   "resourceVersion": str(100 + generation)}}

    before = Children()
    written = [("Job", job("10"))]
    completed = Children(jobs=(job("11"),))
    assert _memo_tokens(before, written, []) != tokens(completed)
    assert _memo_tokens(before, written, []) == tokens(Children(jobs=(job("10"),)))
    # planned from version 10, not written: a version 11 in the cache afterwards is new to it too
    assert _memo_tokens(Children(jobs=(job("10"),)), [], []) != tokens(completed)
    # a Job the pass neither read nor wrote is unseen
    assert _memo_tokens(before, [], []) != tokens(completed)
    # a Deployment written at generation 2 and edited by someone to 3 before the memo
    ours = Children(deployment=deployment(1))
    assert _memo_tokens(ours, [("Deployment", deployment(2))], []) == tokens(Children(deployment=deployment(2)))
    assert _memo_tokens(ours, [("Deployment", deployment(2))], []) != tokens(Children(deployment=deployment(3)))
    # ... or deleted in that gap; a Deployment the pass deleted is not expected back
    spill = Children(deployment=deployment(1), deployments=(deployment(1), deployment(1, "svc-l4")))
    assert _memo_tokens(spill, [], []) != tokens(Children())
    assert _memo_tokens(spill, [], [("apps/v1", "Deployment", "svc-l4")]) == tokens(Children(deployment=deployment(1)))
    # the order the cache lists children in does not matter
    other = Children(deployment=deployment(1, "svc-l4"), deployments=(deployment(1, "svc-l4"), deployment(1)))
    assert tokens(spill) == tokens(other)
    # a running Job re-applied (a label changed) whose write returned it finished: the plan read
    # "running", so the finished Job the cache holds next is new to the memo; re-applied with
    # its state unchanged, it is remembered as written
    def state(j: dict, status: dict) -> dict:
        return {**j, "status": status}
    running = Children(jobs=(state(job("10"), {"active": 1}),))
    finished = state(job("12"), {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
    assert _memo_tokens(running, [("Job", finished)], []) != tokens(Children(jobs=(finished,)))
    assert _memo_tokens(running, [("Job", finished)], []) == tokens(running)
    relabelled = state(job("12"), {"active": 1})
    assert _memo_tokens(running, [("Job", relabelled)], []) == tokens(Children(jobs=(relabelled,)))
    # a kind that is not a child is not remembered
    assert _memo_tokens(ours, [("ConfigMap", {"metadata": {"name": "x"}})], []) == tokens(ours)


class _ApiServer:
    """Stands in for the API server's apply (no cluster in the unit suite; the e2e suite runs
    the Reconciler against a real one): the response carries a uid, a generation that moves when
    the spec does, and a new resourceVersion. `after` runs after each apply, as a watch event
    arriving in the gap between a pass's write and its memo."""

    def __init__(self, after=None) -> None:
        from triton_operator.api.kinds import OWN_KINDS
        from triton_operator.kube.kinds import BUILTIN_KINDS, INFERENCE_POOL, LEADER_WORKER_SET, Kinds
        self.kinds = Kinds(BUILTIN_KINDS + OWN_KINDS + (LEADER_WORKER_SET, INFERENCE_POOL))
        self.created: list[dict] = []
        self.events: list = []
        self.objects: dict[tuple[str, str], dict] = {}
        self.applied: list[tuple[str, str]] = []
        self.rv, self.after = 100, after
        self.owners: dict[tuple[str, str], dict] = {}   # InferenceServices as a fresh read returns them
        self.reads = 0

    def get(self, kind, name, namespace=None):
        self.reads += 1
        return copy.deepcopy(self.owners.get((namespace, name)))

    def apply(self, manifest: dict) -> dict:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        old = self.objects.get((kind, name))
        out = copy.deepcopy(manifest)
        self.rv += 1
        generation = 1 if old is None else old["metadata"]["generation"] + (old.get("spec") != out.get("spec"))
        out["metadata"].update(uid=f"uid-{name}", generation=generation, resourceVersion=str(self.rv))
        self.objects[(kind, name)] = out
        self.applied.append((kind, name))
        if self.after is not None:
            self.after(kind, out)
        return copy.deepcopy(out)

    def patch_status(self, kind, namespace, name, status):
        self.status = status
        return None

    def create(self, manifest: dict) -> bool:
        if any(m["metadata"]["name"] == manifest["metadata"]["name"] for m in self.created):
            return False
        self.created.append(copy.deepcopy(manifest))
        return True

    def post_event(self, obj, event) -> None:
        self.events.append(event)

    def delete(self, kind, name, namespace=None, propagation=None) -> None:
        raise AssertionError(f"nothing is deleted here: {kind.kind} {name}")


def test_a_deployment_edited_between_a_write_and_the_memo_is_repaired_by_the_next_pass(classes):
    """Someone scales the Deployment the pass has just written, and the watch delivers it before
    the pass ends (here: while the pass writes the Service). Remembered as the cache held it after
    the writes, the edit was seen: the pass its event queued skipped, and the drift stayed. The
    memo keeps the Deployment as the pass wrote it, so the next pass plans and writes it back; the
    pass after that, with nothing changed, skips."""
    from triton_operator.api.kinds import GPU_CLASS, INFERENCE_SERVICE
    from triton_operator.controller.reconcile import Reconciler
    from triton_operator.controller.views import Views
    from triton_operator.kube.store import Store

    store = Store(owner=owner_of)
    for cls in classes.values():
        store.upsert(GPU_CLASS.kind, {**cls.model_dump(by_alias=True, exclude_none=True),
                                      "metadata": {"name": cls.name, "resourceVersion": "1"}})
    doc = {**isvc_doc(), "metadata": {**isvc_doc()["metadata"], "resourceVersion": "5"}}
    store.upsert(INFERENCE_SERVICE.kind, doc)
    edited = []

    def scale_it(kind: str, written: dict) -> None:
        if kind == "Service" and not edited:
            d = copy.deepcopy(api.objects[("Deployment", "demo")])
            d["spec"]["replicas"] = 7
            api.rv += 1
            d["metadata"].update(generation=d["metadata"]["generation"] + 1, resourceVersion=str(api.rv))
            api.objects[("Deployment", "demo")] = d
            store.upsert("Deployment", trim(d))
            edited.append(d)

    api = _ApiServer(scale_it)
    api.owners[("ml", "demo")] = doc
    r = Reconciler(api, store, Views(store), Settings())
    r.reconcile(("ml", "demo"))
    assert ("Deployment", "demo") in api.applied and edited, "the Deployment was written, then edited"
    assert store.get("Deployment", ("ml", "demo"))["spec"]["replicas"] == 7
    api.applied.clear()
    r.reconcile(("ml", "demo"))     # the pass the edit's event queued
    assert api.applied == [("Deployment", "demo")] and r.skipped == 0
    store.upsert("Deployment", trim(api.objects[("Deployment", "demo")]))   # the watch event of that write
    api.applied.clear()
    r.reconcile(("ml", "demo"))
    assert api.applied == [] and r.skipped == 1


def test_the_deployment_controllers_revision_annotation_is_not_a_change():
    """The Deployment controller annotates each Deployment with its rollout revision right after
    a write. A pass remembers the Deployment as it wrote it, so were that annotation a change,
    every write would cost one more planning pass (N=200 bench-scale: 7.6 s -> 10.5 s to write
    every child and status); an annotation the operator or a user sets still is one."""
    d = {"metadata": {"name": "svc", "uid": "u", "generation": 1, "annotations": {"a": "1"}}}
    revised = copy.deepcopy(d)
    revised["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "2"
    assert token(revised) == token(d)
    edited = copy.deepcopy(d)
    edited["metadata"]["annotations"]["a"] = "2"
    assert token(edited) != token(d)


def _reconciler_with_one_service(classes):
    from triton_operator.api.kinds import GPU_CLASS, INFERENCE_SERVICE
    from triton_operator.controller.reconcile import Reconciler
    from triton_operator.controller.views import Views
    from triton_operator.kube.store import Store

    store = Store(owner=owner_of)
    for cls in classes.values():
        store.upsert(GPU_CLASS.kind, {**cls.model_dump(by_alias=True, exclude_none=True),
                                      "metadata": {"name": cls.name, "resourceVersion": "1"}})
    doc = {**isvc_doc(), "metadata": {**isvc_doc()["metadata"], "resourceVersion": "5", "uid": "uid-isvc"}}
    store.upsert(INFERENCE_SERVICE.kind, doc)
    api = _ApiServer()
    later: list = []
    return store, api, Reconciler(api, store, Views(store), Settings(), enqueue_after=lambda k, d: later.append((k, d))), \
        doc, later


def test_nothing_is_written_while_the_inference_services_cache_has_a_gap(classes):
    """After a watch gap on InferenceServices (an API outage), a service in the cache may have been
    deleted meanwhile: no child, status or Event is written for it until the kind is listed again;
    the pass comes back a second later."""
    from triton_operator.api.kinds import INFERENCE_SERVICE

    store, api, r, doc, later = _reconciler_with_one_service(classes)
    api.owners[("ml", "demo")] = doc
    store.mark_stale(INFERENCE_SERVICE.kind)
    assert r.reconcile(("ml", "demo")) is None
    assert api.applied == [] and api.reads == 0 and later == [(("ml", "demo"), 1.0)]
    store.mark_fresh(INFERENCE_SERVICE.kind)
    assert r.reconcile(("ml", "demo")) is not None and ("Deployment", "demo") in api.applied


def test_no_child_is_created_for_an_owner_a_fresh_read_finds_gone(classes):
    """The cache still holds a service the API server has deleted (its deletion not yet seen): the
    pass that would create its children reads the owner first and creates nothing; a service with
    the same name but another uid (deleted and made again) is not the owner either."""
    store, api, r, doc, _ = _reconciler_with_one_service(classes)
    r.reconcile(("ml", "demo"))
    assert api.applied == [] and api.reads == 1
    api.owners[("ml", "demo")] = {**doc, "metadata": {**doc["metadata"], "uid": "another"}}
    r.reconcile(("ml", "demo"))
    assert api.applied == [] and api.reads == 2
    api.owners[("ml", "demo")] = doc
    r.reconcile(("ml", "demo"))
    assert ("Deployment", "demo") in api.applied and api.reads == 3
    api.applied.clear()
    r.reconcile(("ml", "demo"))   # nothing left to create: no read
    assert api.reads == 3


def test_a_status_only_change_of_a_pdb_or_network_policy_does_not_requeue_its_service():
    """The disruption controller rewrites a PDB's status as pods come up; no pass reads it, so
    it is not a reason for a pass. A spec change (generation), a label, a deletion, and any
    change of a Deployment (whose status the service's status is made of) are."""
    from triton_operator.controller.trim import concerns_owner

    def pdb(generation=1, healthy=0, labels=None, deleting=None):
        return {"metadata": {"name": "m", "namespace": "ml", "uid": "u1", "generation": generation,
                             "resourceVersion": str(100 + healthy + generation), "labels": labels or {"a": "b"},
                             "deletionTimestamp": deleting},
                "spec": {"minAvailable": 1}, "status": {"currentHealthy": healthy}}

    assert not concerns_owner("PodDisruptionBudget", pdb(), pdb(healthy=2))
    assert not concerns_owner("NetworkPolicy", pdb(), pdb(healthy=2))
    assert concerns_owner("PodDisruptionBudget", pdb(), pdb(generation=2))
    assert concerns_owner("PodDisruptionBudget", pdb(), pdb(labels={"a": "c"}))
    assert concerns_owner("PodDisruptionBudget", pdb(), pdb(deleting="2026-11-27T00:00:00Z"))
    assert concerns_owner("PodDisruptionBudget", None, pdb()) and concerns_owner("PodDisruptionBudget", pdb(), None)
    assert concerns_owner("Deployment", pdb(), pdb(healthy=2))
    no_generation = pdb()
    no_generation["metadata"]["generation"] = None
    assert concerns_owner("PodDisruptionBudget", no_generation, pdb(healthy=2))


# -- replicas across nodes ----------------------------------------------------------------------------

def _big(**gpu):
    return isvc(model={"source": "hf://a/b", "format": "tensorrt-llm", "parameters": "671B", "precision": "fp8"},
                gpu={"class": "h100", "count": 16, **gpu})


def _group_set(obj, classes):
    """The manifests rendered for `obj` at 2 replicas, and its LeaderWorkerSet as the API server
    returns it: 2 groups, 1 of them ready."""
    rendered = render(obj, classes, Settings(), assign(obj, classes, replicas=2)).manifests
    lws = copy.deepcopy(stamped(next(m for m in rendered if m["kind"] == "LeaderWorkerSet")))
    lws["metadata"].update(uid="u-lws", generation=1, resourceVersion="7")
    lws["status"] = {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2}
    return rendered, lws


def test_a_group_set_in_place_is_not_written_and_reads_as_a_deployment_of_groups(classes):
    from triton_operator.controller.trim import trim_child
    from triton_operator.controller.trim import with_full_spec
    obj = _big()
    rendered, lws = _group_set(obj, classes)
    cached = trim_child(lws)
    # what status and placement read: ready groups as available ones, the leaders' labels as the template's
    assert cached["status"]["availableReplicas"] == 1 and cached["spec"]["replicas"] == 2
    assert cached["spec"]["template"]["metadata"]["labels"]["serving.triton-operator.io/gpu-class"] == "h100"
    assert with_full_spec(cached)["spec"]["leaderWorkerTemplate"]["size"] == 2
    rest = live_children([m for m in rendered if m["kind"] not in ("LeaderWorkerSet", "Job")])
    job = copy.deepcopy(next(m for m in rendered if m["kind"] == "Job"))
    job["metadata"].update(uid="u-job", resourceVersion="9")
    job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    children = Children(deployment=cached, service=rest.service, pdb=rest.pdb, deployments=(cached,), jobs=(job,))
    p = desired_state(obj, classes, Settings(), children, replicas=2)
    assert p.error is None and p.apply == () and p.deployments == (("h100", "demo-group"),)
    p = desired_state(obj, classes, Settings(), children, replicas=3)
    assert [(m["kind"], m["spec"]["replicas"]) for m in p.apply] == [("LeaderWorkerSet", 3)]


def test_a_service_that_leaves_groups_for_one_node_replaces_its_group_set_once_prepared(classes):
    from triton_operator.controller.trim import trim_child
    service = _big()
    rendered = render(service, classes, Settings(), assign(service, classes, replicas=1))
    lws = next(m for m in rendered.manifests if m["kind"] == "LeaderWorkerSet")
    live = trim_child({**copy.deepcopy(lws), "status": {"replicas": 1, "readyReplicas": 1}})
    small = isvc(model={"source": "hf://a/b", "format": "tensorrt-llm", "parameters": "671B", "precision": "int4-awq"},
                 gpu={"class": "h100", "count": 8})
    p = desired_state(small, classes, Settings(), Children(deployments=(live,)), replicas=1)
    assert p.delete == (), "the groups keep serving while the one-node model is prepared"
    dep = next(m for m in p.apply if m["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 0, "held until prepared"
    job = copy.deepcopy(next(m for m in p.apply if m["kind"] == "Job"))
    job["metadata"].update(uid="u-job", resourceVersion="9")
    job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    p = desired_state(small, classes, Settings(), Children(deployments=(live,), jobs=(job,)), replicas=1)
    assert p.delete == (("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "demo-group"),)
    assert next(m for m in p.apply if m["kind"] == "Deployment")["spec"]["replicas"] == 1


def test_a_group_needs_as_many_nodes_with_room_as_it_has_pods():
    from triton_operator.planning import capacity
    assert capacity.room([8, 8, 8], 16, nodes_per_replica=2) == 1
    assert capacity.room([8, 8, 8, 8], 16, nodes_per_replica=2) == 2
    assert capacity.room([8, 4, 8], 16, nodes_per_replica=2) == 1, "a node with half its GPUs free holds no pod"
    assert capacity.room([16], 16, nodes_per_replica=2) == 1, "a 16-GPU node holds both 8-GPU pods of a group"


def _reconciler_for(classes, doc, **ready):
    """A Reconciler over a cache holding the GPU classes and `doc` (as the API server returns it to
    a fresh read too), the _ApiServer it writes to, and the delays it asked to be called back
    after; `ready`: groups_ready / pools_ready callables."""
    from triton_operator.api.kinds import GPU_CLASS, INFERENCE_SERVICE
    from triton_operator.controller.reconcile import Reconciler
    from triton_operator.controller.views import Views
    from triton_operator.kube.store import Store

    store = Store(owner=owner_of)
    for cls in classes.values():
        store.upsert(GPU_CLASS.kind, {**cls.model_dump(by_alias=True, exclude_none=True),
                                      "metadata": {"name": cls.name, "resourceVersion": "1"}})
    doc["metadata"] = {**doc["metadata"], "resourceVersion": "5", "uid": "uid-isvc"}
    store.upsert(INFERENCE_SERVICE.kind, doc)
    api = _ApiServer()
    api.owners[(doc["metadata"]["namespace"], doc["metadata"]["name"])] = doc
    later: list = []
    r = Reconciler(api, store, Views(store), Settings(), enqueue_after=lambda k, d: later.append((k, d)), **ready)
    return api, r, later


def test_a_restart_after_a_lost_status_write_keeps_the_deployment_at_its_scaled_count(classes):
    """The API server fails mid-scale: a pass writes the Deployment at the autoscaler's 8, and the
    status patch that would say so fails; the process restarts (its lease lost) before a retry.
    The new process has no report until its autoscaler's first tick, and status still says 4; the
    Deployment was written after that status, so its count stands. Rendered from status, the first
    pass scaled the Deployment back to 4, and the tick after it (seeded from the running count)
    up again: the four replicas started for the load were stopped and started over."""
    from triton_operator.api.kinds import GPU_CLASS, INFERENCE_SERVICE
    from triton_operator.autoscaling.report import Report
    from triton_operator.controller.reconcile import Reconciler
    from triton_operator.controller.trim import trim_child
    from triton_operator.controller.views import Views
    from triton_operator.kube.client import ApiError
    from triton_operator.kube.store import Store

    class FailingStatus(_ApiServer):
        failing = True

        def patch_status(self, kind, namespace, name, status):
            if self.failing:
                raise ApiError(503, "ServiceUnavailable", "etcd is unavailable")
            return super().patch_status(kind, namespace, name, status)

    doc = isvc_doc()
    del doc["spec"]["replicas"]
    doc["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 10}
    doc["status"] = {"autoscaling": {"desiredReplicas": 4}}
    doc["metadata"] = {**doc["metadata"], "resourceVersion": "5", "uid": "uid-isvc"}

    def cache(objects):
        store = Store(owner=owner_of)
        for cls in classes.values():
            store.upsert(GPU_CLASS.kind, {**cls.model_dump(by_alias=True, exclude_none=True),
                                          "metadata": {"name": cls.name, "resourceVersion": "1"}})
        store.upsert(INFERENCE_SERVICE.kind, copy.deepcopy(doc))
        for (kind, _), child in objects.items():
            store.upsert(kind, trim_child(copy.deepcopy(child)))
        return store

    api = FailingStatus()
    api.owners[("ml", "demo")] = doc
    store = cache({})
    scaled = Report(desired=8, metrics_available=True, reason="scale up 4->8")
    with pytest.raises(ApiError):
        Reconciler(api, store, Views(store), Settings(), reports=lambda key: scaled).reconcile(("ml", "demo"))
    assert api.objects[("Deployment", "demo")]["spec"]["replicas"] == 8

    restarted = cache(api.objects)   # the new process lists what the API server holds
    api.applied.clear()
    api.failing = False
    Reconciler(api, restarted, Views(restarted), Settings()).reconcile(("ml", "demo"))
    assert ("Deployment", "demo") not in api.applied
    assert api.objects[("Deployment", "demo")]["spec"]["replicas"] == 8


def _multi_node_service(classes, groups_ready):
    doc = isvc_doc(model={"source": "hf://a/b", "format": "onnx", "parameters": "1B"})
    doc["spec"]["model"] = {"source": "hf://a/b", "format": "tensorrt-llm", "parameters": "671B", "precision": "fp8"}
    doc["spec"]["gpu"] = {"class": "h100", "count": 16}
    return _reconciler_for(classes, doc, groups_ready=lambda: groups_ready)


def test_without_leader_worker_set_a_multi_node_service_says_so_and_writes_nothing(classes):
    api, r, later = _multi_node_service(classes, groups_ready=False)
    status = r.reconcile(("ml", "demo"))
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Degraded"]["status"] == "True" and conds["Degraded"]["reason"] == "LeaderWorkerSetNotInstalled"
    assert "install LeaderWorkerSet (https://lws.sigs.k8s.io, v0.9 or later)" in conds["Degraded"]["message"]
    assert api.applied == [] and api.created == [] and later == [(("ml", "demo"), 60.0)]


def test_a_group_set_is_applied_with_its_key_pair_made_once(classes):
    api, r, _ = _multi_node_service(classes, groups_ready=True)
    r.reconcile(("ml", "demo"))
    assert ("LeaderWorkerSet", "demo-group") in api.applied
    (secret,) = api.created
    assert secret["metadata"]["name"] == "demo-mpi-ssh" and secret["metadata"]["ownerReferences"][0]["uid"] == "uid-isvc"
    private, public = secret["stringData"]["id_ed25519"], secret["stringData"]["id_ed25519.pub"]
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----") and public.startswith("ssh-ed25519 ")
    assert private not in repr(api.status)    # no key material in the status


def test_a_group_recreated_by_its_set_is_reported_and_a_rollout_or_a_scale_up_is_not():
    from triton_operator.controller.status import group_leaders, group_restarts, remembered_leaders

    def leader(uid, index="0", revision="r1", deleting=None):
        return {"metadata": {"uid": uid, "deletionTimestamp": deleting, "labels": {
            "app.kubernetes.io/component": "server", "leaderworkerset.sigs.k8s.io/name": "big-group",
            "leaderworkerset.sigs.k8s.io/group-index": index,
            "leaderworkerset.sigs.k8s.io/template-revision-hash": revision}}}

    worker = {"metadata": {"uid": "w", "labels": {"app.kubernetes.io/component": "worker"}}}
    first = group_leaders([leader("a"), worker])
    assert first == {("big-group", "0"): ("a", "r1")} and group_restarts(None, first) == []
    # the old leader is deleted, then its successor appears: remembered across the gap
    gone = group_leaders([leader("a", deleting="now")])
    kept = remembered_leaders(first, gone, {"big-group": 1})
    (event,) = group_restarts(kept, group_leaders([leader("b")]))
    assert (event.type, event.reason) == ("Warning", "GroupRestarted")
    assert event.message.startswith("group 0 of big-group was recreated whole: one of its pods stopped")
    assert group_restarts(first, group_leaders([leader("b", revision="r2")])) == [], "a rollout is no restart"
    # a group scaled away and made again later is a new group, not a restart
    assert remembered_leaders(first, {}, {"big-group": 0}) == {}


def test_the_autoscaler_reads_a_group_set_as_replicas_of_groups_and_the_leaders_as_its_pods(classes):
    """What the autoscaling loop reads of a service whose replicas span nodes (Views.scaling): the
    LeaderWorkerSet's groups as its replicas, its ready groups as ready replicas, and the leaders
    (who run Triton and report the engine's metrics) as its serving pods; the workers are not."""
    from triton_operator.controller.trim import trim_child
    from triton_operator.controller.views import Views
    from triton_operator.kube.kinds import LEADER_WORKER_SET, POD

    _, lws = _group_set(_big(), classes)
    store = Store(owner=owner_of)
    store.upsert(LEADER_WORKER_SET.kind, trim_child(lws))
    leader_labels = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"]
    worker_labels = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
    for i, (name, labels) in enumerate([("demo-group-0", leader_labels), ("demo-group-1", leader_labels),
                                        ("demo-group-0-1", worker_labels), ("demo-group-1-1", worker_labels)]):
        store.upsert(POD.kind, trim_pod({"metadata": {"name": name, "namespace": "ml", "uid": f"p{i}",
                                                       "resourceVersion": str(20 + i), "labels": dict(labels)},
                                         "status": {"phase": "Running"}}))
    workload, pods = Views(store).scaling(("ml", "demo"))
    assert workload["spec"]["replicas"] == 2 and workload["status"]["readyReplicas"] == 1
    assert sorted(p["metadata"]["name"] for p in pods) == ["demo-group-0", "demo-group-1"]


def test_a_child_name_held_by_another_service_is_not_taken_over(classes):
    """Names a service derives can be another service's (foo's spill Deployment foo-spill-h200 is
    the Deployment of a service named foo-spill-h200; foo's group Service foo-group that of a
    service named foo-group). A forced apply took the other's object over (a Service's selector
    moved to this service's pods); now the pass stops at that child with NameTaken, naming who
    holds it, and writes nothing over it."""
    store, api, r, doc, _ = _reconciler_with_one_service(classes)
    api.owners[("ml", "demo")] = doc
    store.upsert("Service", {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "demo", "namespace": "ml", "resourceVersion": "9", "uid": "uid-svc-other",
        "ownerReferences": [{"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
                             "name": "other", "uid": "uid-other", "controller": True}]},
        "spec": {"selector": {"app": "other"}}})
    r.reconcile(("ml", "demo"))
    assert ("Service", "demo") not in api.applied
    degraded = next(c for c in api.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "NameTaken")
    assert degraded["message"] == ("Service demo, a name this service derives, belongs to InferenceService other: "
                                   "rename one of the two (a forced apply would have taken it over)")
    # Its own Service (this uid), or one left by a deleted service of its name, is applied as before.
    store.upsert("Service", {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "demo", "namespace": "ml", "resourceVersion": "10", "uid": "uid-svc-old",
        "ownerReferences": [{"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
                             "name": "demo", "uid": "uid-deleted", "controller": True}]},
        "spec": {"selector": {"app": "demo"}}})
    doc2 = {**doc, "metadata": {**doc["metadata"], "generation": 4, "resourceVersion": "6"},
            "spec": {**doc["spec"], "replicas": 3}}
    store.upsert("InferenceService", doc2)
    api.owners[("ml", "demo")] = doc2
    r.reconcile(("ml", "demo"))
    assert ("Service", "demo") in api.applied
