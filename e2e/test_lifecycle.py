"""The operator against a real API server, controller-manager and scheduler with kwok GPU nodes.

Pods are simulated by kwok (no containers run): it marks scheduled pods Running and Ready. All
else, admission, CEL, server-side apply, garbage collection and scheduling, is the real thing.
"""

from __future__ import annotations

import copy
import json
import signal
from typing import Any

import pytest

from .cluster import Cluster, Operator, wait_for

GROUP = "serving.triton-operator.io"


def service(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"source": "hf://org/model", "format": "onnx", "parameters": "1B"},
        "gpu": {"class": "l4", "count": 1},
        "replicas": 1,
    }
    body.update(copy.deepcopy(spec))
    return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": namespace}, "spec": body}


def pods_of(cluster: Cluster, name: str, ns: str) -> list[dict[str, Any]]:
    return [p for p in cluster.get("pods", namespace=ns, selector=f"{GROUP}/inferenceservice={name}")
            if not p["metadata"].get("deletionTimestamp")]


def node_product(cluster: Cluster, node: str) -> str:
    return cluster.get("node", node)["metadata"]["labels"].get("nvidia.com/gpu.product", "")


def test_apply_creates_children_and_lands_on_the_class(operator: Operator, ns: str):
    c = operator.cluster
    c.apply(service("chat", ns, gpu={"class": "a100-80gb", "count": 2}, replicas=2))
    c.wait_ready("chat", ns, timeout=90)
    for kind in ("deployment", "service", "poddisruptionbudget"):
        obj = c.get(kind, "chat", ns)
        assert obj is not None, kind
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("InferenceService", "chat", True)
    pods = wait_for("2 running pods", lambda: [p for p in pods_of(c, "chat", ns)
                                               if p["status"].get("phase") == "Running"][1:] and pods_of(c, "chat", ns))
    assert len(pods) == 2
    for pod in pods:
        assert node_product(c, pod["spec"]["nodeName"]) == "NVIDIA-A100-SXM4-80GB"
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    status = c.get("infsvc", "chat", ns)["status"]
    assert status["gpuClass"] == "a100-80gb" and status["readyReplicas"] == 2
    assert status["endpoints"]["http"] == f"http://chat.{ns}.svc.cluster.local:8000"
    raw = c.kubectl("get", "deployment", "chat", "-n", ns, "-o", "json", "--show-managed-fields").stdout
    fields = {f["manager"] for f in json.loads(raw)["metadata"]["managedFields"] if f["operation"] == "Apply"}
    assert fields == {"triton-operator"}
    columns = c.kubectl("get", "infsvc", "chat", "-n", ns).stdout.split("\n")[0].split()
    assert columns[:7] == ["NAME", "GPU", "DESIRED", "READY", "NODES", "CLASSES", "QUEUE"]


def test_spec_change_rolls_out_and_scale_subresource_works(operator: Operator, ns: str):
    c = operator.cluster
    c.apply(service("roll", ns))
    c.wait_ready("roll", ns, timeout=90)
    first = c.get("deployment", "roll", ns)["metadata"]["generation"]
    c.kubectl("patch", "infsvc", "roll", "-n", ns, "--type=merge",
              "-p", '{"spec": {"server": {"args": ["--log-verbose=1"]}}}')
    dep = wait_for("a new Deployment generation", lambda: (d := c.get("deployment", "roll", ns))
                   and d["metadata"]["generation"] > first and d)
    assert "--log-verbose=1" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    wait_for("Ready for generation 2", lambda: (r := c.condition("infsvc", "roll", ns, "Ready"))
             and r["status"] == "True" and r["observedGeneration"] == 2, timeout=90)

    c.kubectl("scale", "infsvc", "roll", "-n", ns, "--replicas=3")
    wait_for("3 replicas", lambda: (c.get("deployment", "roll", ns) or {}).get("spec", {}).get("replicas") == 3)
    wait_for("status.replicas 3 and ready", lambda: (s := c.get("infsvc", "roll", ns).get("status", {}))
             and s.get("replicas") == 3 and s.get("readyReplicas") == 3, timeout=90)
    scale = c.kubectl("get", "--raw", f"/apis/{GROUP}/v1alpha1/namespaces/{ns}/inferenceservices/roll/scale").stdout
    assert '"replicas":3' in scale and f"{GROUP}/inferenceservice=roll" in scale


def test_children_are_restored_and_collected(operator: Operator, ns: str):
    c = operator.cluster
    c.apply(service("heal", ns, replicas=2))
    c.wait_ready("heal", ns, timeout=90)
    uid = c.get("deployment", "heal", ns)["metadata"]["uid"]
    c.kubectl("delete", "deployment", "heal", "-n", ns)
    wait_for("Deployment recreated", lambda: (d := c.get("deployment", "heal", ns)) and d["metadata"]["uid"] != uid)
    c.kubectl("delete", "service", "heal", "-n", ns)
    wait_for("Service recreated", lambda: c.get("service", "heal", ns))

    c.kubectl("scale", "deployment", "heal", "-n", ns, "--replicas=5")
    wait_for("replicas restored to 2", lambda: c.get("deployment", "heal", ns)["spec"]["replicas"] == 2)
    c.kubectl("patch", "pdb", "heal", "-n", ns, "--type=merge", "-p", '{"spec": {"maxUnavailable": 0}}')
    wait_for("PDB restored", lambda: c.get("pdb", "heal", ns)["spec"]["maxUnavailable"] == 1)

    # The chart's networkPolicy (on by default): only the gateway reaches Triton's inference ports,
    # only Prometheus its metrics; a policy opened by hand is closed again.
    policy = c.get("networkpolicy", "heal", ns)
    assert policy["spec"]["podSelector"] == {"matchLabels": c.get("service", "heal", ns)["spec"]["selector"]}
    clients, metrics = policy["spec"]["ingress"]
    assert clients["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "triton-operator-gateway"
    assert [p["port"] for p in metrics["ports"]] == ["metrics"]
    c.kubectl("patch", "networkpolicy", "heal", "-n", ns, "--type=merge", "-p", '{"spec": {"ingress": [{}]}}')
    wait_for("NetworkPolicy restored", lambda: len(c.get("networkpolicy", "heal", ns)["spec"]["ingress"]) == 2)

    c.kubectl("delete", "infsvc", "heal", "-n", ns)
    for kind in ("deployment", "service", "pdb", "networkpolicy"):
        wait_for(f"{kind} garbage-collected", lambda k=kind: c.get(k, "heal", ns) is None, timeout=60)
    wait_for("pods gone", lambda: not pods_of(c, "heal", ns), timeout=60)


def test_not_enough_gpus_names_the_class_and_shortfall(operator: Operator, ns: str):
    """One h200 node has 8 GPUs: the second 8-GPU replica cannot be placed."""
    c = operator.cluster
    c.apply(service("big", ns, gpu={"class": "h200", "count": 8}, replicas=2,
                    model={"source": "hf://org/m", "format": "onnx", "parameters": "70B"}))
    degraded = wait_for("Degraded=Unschedulable", lambda: (d := c.condition("infsvc", "big", ns, "Degraded"))
                        and d["status"] == "True" and d["reason"] == "Unschedulable" and d, timeout=60)
    assert "GPU class h200" in degraded["message"]
    assert "8 more nvidia.com/gpu needed (8 per pod)" in degraded["message"]
    assert "Insufficient nvidia.com/gpu" in degraded["message"]
    pods = pods_of(c, "big", ns)
    assert sorted(p["status"].get("phase") for p in pods) == ["Pending", "Running"]
    events = c.kubectl("get", "events", "-n", ns, "--field-selector", "involvedObject.name=big,reason=Unschedulable",
                       "-o", "name").stdout
    assert events.strip(), "an Unschedulable event on the InferenceService"

    c.kubectl("scale", "infsvc", "big", "-n", ns, "--replicas=1")
    wait_for("Degraded clears", lambda: (d := c.condition("infsvc", "big", ns, "Degraded")) and d["status"] == "False",
             timeout=60)
    c.kubectl("delete", "infsvc", "big", "-n", ns, "--wait=true")  # give the GPUs back


def test_missing_gpu_class_is_reported_then_picked_up(operator: Operator, ns: str):
    c = operator.cluster
    c.apply(service("lost", ns, gpu={"class": "x100"}))
    ready = wait_for("Ready=False GPUClassNotFound", lambda: (r := c.condition("infsvc", "lost", ns, "Ready"))
                     and r["reason"] == "GPUClassNotFound" and r)
    assert "GPUClass x100 does not exist" in ready["message"] and "h100" in ready["message"]
    assert c.get("deployment", "lost", ns) is None
    x100 = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "GPUClass", "metadata": {"name": "x100"},
            "spec": {"productNames": ["NVIDIA-H100-80GB-HBM3"], "memoryGiB": 180, "memoryBandwidthTBps": 8,
                     "computeCapability": "10.0"}}
    c.apply(x100)
    try:
        c.wait_ready("lost", ns, timeout=60)
        assert c.get("infsvc", "lost", ns)["status"]["gpuClass"] == "x100"
    finally:
        c.kubectl("delete", "gpuclass", "x100", check=False)


INVALID = [
    ({"gpu": {"class": "l4", "count": 0}}, "gpu.count 0 (let the planner choose) needs gpu.class auto"),
    ({"gpu": {"class": "l4", "fallbackClasses": ["h100"], "spill": {"after": "10m", "returnAfter": "1m"}}},
     "returnAfter must be at least after"),
    ({"gpu": {"class": "l4", "spill": {}}}, "gpu.spill needs fallbackClasses"),
    ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, "minReplicas must be less than or equal to maxReplicas"),
    ({"gpu": {"class": "l4", "fallbackClasses": ["l4"]}}, "fallbackClasses must not repeat class"),
    ({"model": {"source": "ftp://x/y", "format": "onnx"}}, "spec.model.source"),
    ({"model": {"source": "hf://a/b", "format": "gguf"}}, 'supported values: "tensorrt-llm"'),
    ({"server": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}}, "GPUs are set by spec.gpu"),
    ({"rollout": {"maxSurge": 0, "maxUnavailable": 0}}, "cannot both be 0"),
]


@pytest.mark.parametrize("spec, words", INVALID, ids=[w[:30] for _, w in INVALID])
def test_invalid_specs_are_rejected_at_admission(installed: Cluster, ns: str, spec, words):
    out = installed.apply(service("bad", ns, **spec), check=False)
    assert out.returncode != 0 and words in out.stderr, out.stderr


def test_too_long_name_and_unknown_field_are_rejected(installed: Cluster, ns: str):
    out = installed.apply(service("x" * 53, ns), check=False)
    assert out.returncode != 0 and "at most 52 characters" in out.stderr
    doc = service("typo", ns)
    doc["spec"]["replicaz"] = 2
    out = installed.apply(doc, check=False)
    assert out.returncode != 0 and 'unknown field "spec.replicaz"' in out.stderr


def test_pod_security_restricted_admits_serving_pods(operator: Operator, ns: str):
    c = operator.cluster
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged", "namespace": ns},
           "spec": {"containers": [{"name": "x", "image": "busybox", "securityContext": {"privileged": True}}]}}
    refused = c.apply(bad, check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr  # enforcement is on
    c.apply(service("secure", ns))
    c.wait_ready("secure", ns, timeout=90)
    assert len(pods_of(c, "secure", ns)) == 1


def test_sigkill_during_a_burst_converges_without_duplicates(operator: Operator, ns: str):
    """The operator is killed while it is creating the children of a burst of services (the kill
    lands after some but not all of them exist: it is slowed to 5 API requests a second for this
    test), and a new one converges them all without duplicates."""
    c = operator.cluster
    names = [f"burst-{i}" for i in range(12)]
    classes = ["l4", "a100-80gb"]  # 6 GPUs of each: room beside what other tests still hold
    saved = dict(operator.extra_env)
    operator.stop()
    operator.extra_env.update({"TRITON_OPERATOR_API_QPS": "5", "TRITON_OPERATOR_API_BURST": "3"})
    operator.start()
    try:
        created = DeploymentCounter(c, ns)
        c.apply([service(n, ns, gpu={"class": classes[i % 2]}) for i, n in enumerate(names)])
        wait_for("a few Deployments of the burst", lambda: created.count() >= 3, timeout=60)
        operator.kill(signal.SIGKILL)
        at_kill = created.count()
        assert 3 <= at_kill < len(names), f"the kill landed mid-burst ({at_kill} of {len(names)} created)"
    finally:
        operator.extra_env.clear()
        operator.extra_env.update(saved)
        operator.start()
    for n in names:
        c.wait_ready(n, ns, timeout=120)
    created.stop()
    for kind in ("deployments", "services", "pdb"):
        items = c.get(kind, namespace=ns)
        owned = sorted(i["metadata"]["ownerReferences"][0]["name"] for i in items)
        assert owned == sorted(names), kind
    replicasets = c.get("replicasets", namespace=ns)
    assert len(replicasets) == len(names)
    assert len(pods_of_all(c, ns)) == len(names)


class DeploymentCounter:
    """Deployments created in a namespace, counted from a watch (no polling)."""

    def __init__(self, cluster: Cluster, namespace: str):
        import threading

        from kubernetes import client, config, watch
        api = client.AppsV1Api(config.new_client_from_config(config_file=cluster.kubeconfig))
        self._names: set[str] = set()
        self._watch = watch.Watch()
        self._ready = threading.Event()

        def run() -> None:
            try:
                for event in self._watch.stream(api.list_namespaced_deployment, namespace, timeout_seconds=600):
                    self._ready.set()
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._names.add(event["object"].metadata.name)
            except Exception:  # noqa: BLE001 - the stream ends when the test stops it
                pass

        threading.Thread(target=run, daemon=True).start()

    def count(self) -> int:
        return len(self._names)

    def stop(self) -> None:
        self._watch.stop()


def pods_of_all(c: Cluster, ns: str) -> list[dict[str, Any]]:
    return [p for p in c.get("pods", namespace=ns) if not p["metadata"].get("deletionTimestamp")]


def test_objects_left_by_the_kopf_based_operator_are_cleaned_and_delete(operator: Operator, ns: str):
    """Operator 0.1 kept a finalizer and the whole last-handled spec in an annotation on every
    object (a spec over 256 KiB could then never be deleted). The watch-fed controller keeps
    nothing on the object: it removes both once, and the object deletes at once."""
    c = operator.cluster
    doc = service("legacy", ns)
    doc["metadata"]["finalizers"] = [f"{GROUP}/finalizer"]
    doc["metadata"]["annotations"] = {f"{GROUP}/last-handled-configuration": json.dumps(doc["spec"]),
                                      "team.example.com/owner": "ml"}
    c.apply(doc)
    cleaned = wait_for("legacy bookkeeping removed", lambda: (o := c.get("infsvc", "legacy", ns))
                       and not o["metadata"].get("finalizers")
                       and f"{GROUP}/last-handled-configuration" not in (o["metadata"].get("annotations") or {}) and o)
    left = {k for k in cleaned["metadata"]["annotations"] if k != "kubectl.kubernetes.io/last-applied-configuration"}
    assert left == {"team.example.com/owner"}, "only the operator's own keys go"
    c.wait_ready("legacy", ns, timeout=90)
    c.kubectl("delete", "infsvc", "legacy", "-n", ns, "--timeout=30s")
    assert c.get("infsvc", "legacy", ns) is None


def test_a_child_the_api_server_refuses_is_reported_and_retried_when_the_spec_changes(operator: Operator, ns: str):
    """A ResourceQuota refuses the Deployment (403): the service says so in Degraded and Ready
    with the API server's words, for the current generation, and converges once it can."""
    c = operator.cluster
    c.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-deployments", "namespace": ns},
             "spec": {"hard": {"count/deployments.apps": "0"}}})
    wait_for("the quota's usage is known", lambda: ((c.get("resourcequota", "no-deployments", ns) or {})
                                                   .get("status") or {}).get("used"), timeout=60)
    c.apply(service("quota", ns))
    degraded = wait_for("Degraded=DeploymentRejected", lambda: (d := c.condition("infsvc", "quota", ns, "Degraded"))
                        and d["status"] == "True" and d["reason"] == "DeploymentRejected" and d, timeout=60)
    assert "exceeded quota" in degraded["message"] and degraded["observedGeneration"] == 1
    ready = c.condition("infsvc", "quota", ns, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "DeploymentRejected"
    assert c.get("infsvc", "quota", ns)["status"]["observedGeneration"] == 1
    events = c.kubectl("get", "events", "-n", ns, "--field-selector",
                       "involvedObject.name=quota,reason=DeploymentRejected", "-o", "name").stdout
    assert events.strip(), "a DeploymentRejected event"
    assert "Traceback" not in operator.log_path.read_text()

    c.kubectl("delete", "resourcequota", "no-deployments", "-n", ns)
    c.kubectl("patch", "infsvc", "quota", "-n", ns, "--type=merge", "-p", '{"spec": {"replicas": 2}}')
    wait_for("Ready for generation 2", lambda: (r := c.condition("infsvc", "quota", ns, "Ready"))
             and r["status"] == "True" and r["observedGeneration"] == 2, timeout=90)


def test_an_object_stored_under_an_older_schema_says_why_and_deletes(operator: Operator, ns: str):
    """The CRD is relaxed for a moment (as an older version of it would have been), an object that
    today's schema refuses is stored, and the CRD is restored: the operator parses it through the
    models, reports InvalidSpec naming the field, once, creates nothing, and the object deletes."""
    c = operator.cluster
    crd_name = f"inferenceservices.{GROUP}"
    crd = c.get("crd", crd_name)
    root = "/spec/versions/0/schema/openAPIV3Schema"
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    original = [{"op": "replace", "path": f"{root}/properties/spec", "value": schema["properties"]["spec"]},
                {"op": "replace", "path": f"{root}/x-kubernetes-validations", "value": schema["x-kubernetes-validations"]}]
    # an older CRD had no schema for spec, nor the object-level rules that read spec's fields
    relaxed = [{"op": "replace", "path": f"{root}/properties/spec",
                "value": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
               {"op": "replace", "path": f"{root}/x-kubernetes-validations",
                "value": [r for r in schema["x-kubernetes-validations"] if "self.spec" not in r["rule"]]}]
    assert len(relaxed[1]["value"]) < len(original[1]["value"])
    c.kubectl("patch", "crd", crd_name, "--type=json", "-p", json.dumps(relaxed))
    try:
        doc = service("older", ns)
        doc["spec"]["gpu"]["count"] = 0
        wait_for("the relaxed schema to admit it", lambda: c.apply(doc, check=False).returncode == 0, timeout=30)
    finally:
        c.kubectl("patch", "crd", crd_name, "--type=json", "-p", json.dumps(original))
    degraded = wait_for("Degraded=InvalidSpec", lambda: (d := c.condition("infsvc", "older", ns, "Degraded"))
                        and d["reason"] == "InvalidSpec" and d, timeout=60)
    assert degraded["status"] == "True" and "spec.gpu.count" in degraded["message"], degraded
    ready = c.condition("infsvc", "older", ns, "Ready")
    assert ready["status"] == "False" and ready["observedGeneration"] == 1
    assert c.get("deployment", "older", ns) is None
    events = c.kubectl("get", "events", "-n", ns, "--field-selector", "involvedObject.name=older,reason=InvalidSpec",
                       "-o", "name").stdout.split()
    assert len(events) == 1, events
    c.kubectl("delete", "infsvc", "older", "-n", ns, "--timeout=30s")
    assert "Traceback" not in operator.log_path.read_text()


def test_a_model_on_a_missing_claim_names_the_claim(operator: Operator, ns: str):
    """pvc:// sources of formats Triton does not read directly are staged by an init container that
    mounts the claim read-only; without the claim the scheduler's reason reaches status."""
    c = operator.cluster
    c.apply(service("from-pvc", ns, model={"source": "pvc://models/resnet50", "format": "onnx", "parameters": "25M"}))
    dep = wait_for("the Deployment", lambda: c.get("deployment", "from-pvc", ns))
    pod = dep["spec"]["template"]["spec"]
    claims = {v["name"]: v["persistentVolumeClaim"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"model-source": {"claimName": "models", "readOnly": True}}
    (init,) = [i for i in pod["initContainers"] if i["name"] == "stage-model"]
    assert {"name": "model-source", "mountPath": "/mnt/pvc/models", "readOnly": True} in init["volumeMounts"]
    assert [*init.get("command", []), *init["args"]][:4] == ["triton-runtime", "stage", "--source",
                                                             "pvc://models/resnet50"]
    degraded = wait_for("Degraded naming the claim", lambda: (d := c.condition("infsvc", "from-pvc", ns, "Degraded"))
                        and d["status"] == "True" and d, timeout=60)
    assert degraded["reason"] == "Unschedulable" and '"models" not found' in degraded["message"], degraded


def test_ours_is_told_apart_from_kserves_inferenceservice(operator: Operator, ns: str):
    """Where KServe is installed too, two kinds are called InferenceService. KServe's CRD is
    reduced here to its names (group serving.kserve.io, plural inferenceservices, short name isvc,
    no category; its controller does not run): what docs/first-service.md ("Next to KServe") tells users
    to type is checked (tests/test_docs.py checks the page still says it)."""
    c = operator.cluster
    kserve = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
              "metadata": {"name": "inferenceservices.serving.kserve.io"},
              "spec": {"group": "serving.kserve.io", "scope": "Namespaced",
                       "names": {"kind": "InferenceService", "listKind": "InferenceServiceList",
                                 "plural": "inferenceservices", "singular": "inferenceservice",
                                 "shortNames": ["isvc"]},
                       "versions": [{"name": "v1beta1", "served": True, "storage": True,
                                     "schema": {"openAPIV3Schema": {
                                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
    c.apply(kserve)
    try:
        c.established("crd/inferenceservices.serving.kserve.io", seconds=30)
        c.apply(service("ours", ns))
        c.apply({"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
                 "metadata": {"name": "theirs", "namespace": ns}, "spec": {"predictor": {}}})

        def names(*resource: str) -> list[str]:
            out = c.kubectl("get", *resource, "-n", ns, "-o", "name", check=False)
            return sorted(out.stdout.split()) if out.returncode == 0 else [f"error: {out.stderr.strip()}"]

        theirs = ["inferenceservice.serving.kserve.io/theirs"]
        ours = ["inferenceservice.serving.triton-operator.io/ours"]
        assert wait_for("ours by short name", lambda: names("infsvc") == ours, timeout=30)
        assert names("inferenceservices.serving.triton-operator.io") == ours
        assert names("isvc") == theirs
        assert names("inferenceservices.serving.kserve.io") == theirs
        category = names("inference")  # ours and the (cluster-scoped) GPUClasses, never KServe's
        assert [n for n in category if n.startswith("inferenceservice")] == ours, category
        assert "gpuclass.serving.triton-operator.io/h100" in category, category
        plain = names("inferenceservices")
        assert plain in (ours, theirs), plain  # one of the two, never both: hence the page's advice
        print(f"'kubectl get inferenceservices' with both installed lists {plain}")
    finally:
        c.kubectl("delete", "crd", "inferenceservices.serving.kserve.io", "--ignore-not-found", "--timeout=60s",
                  check=False)
