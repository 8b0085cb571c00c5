"""Models bigger than a node, against the real LeaderWorkerSet controller: DeepSeek-V3 (671B) in fp8
needs 16 H100s, two nodes of the local cluster's 8-GPU kwok nodes, so each replica is a
LeaderWorkerSet group of two pods (hack/lws.sh runs LWS v0.9.0's manager, built from the Go
module proxy, with its webhooks registered by URL; the StatefulSets and pods are made by the real
controller-manager and placed by the real scheduler).

Simulated: kwok runs no containers (it marks scheduled pods Running and Ready, and a preparation
Job's pods Succeeded), so nothing is downloaded, no SSH server or MPI starts, and no model
answers; tests/test_render_group.py runs the leader's and the workers' scripts in a real shell.
"""

from __future__ import annotations

from typing import Any

from .cluster import Cluster, Operator, model_cache, wait_for

GROUP = "serving.triton-operator.io"
LWS = "leaderworkerset.sigs.k8s.io"
H200 = "NVIDIA-H200"


def big(ns: str, replicas: int, **gpu: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService", "metadata": {"name": "big", "namespace": ns},
            "spec": {"model": {"source": "hf://deepseek-ai/DeepSeek-V3", "format": "tensorrt-llm",
                               "parameters": "671B", "precision": "fp8"},
                     "gpu": {"class": "h100", "count": 16, "fallbackClasses": ["h200"],
                             "spill": {"after": "5s", "returnAfter": "600s"}, **gpu},
                     # what a quantization of 671B asks of a node by default (1.9 TiB of memory) is
                     # more than the kwok nodes offer: it is told what it may have
                     "engine": {"buildResources": {"requests": {"memory": "256Gi", "ephemeral-storage": "1Ti"}}},
                     "replicas": replicas}}


def h200_node(name: str) -> dict[str, Any]:
    """One more 8-GPU H200 kwok node (the local cluster has one; a group needs two)."""
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "kwok",
              "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": H200, "nvidia.com/gpu.count": "8",
              "nvidia.com/gpu.memory": "143771", "nvidia.com/gpu.family": "hopper",
              "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0", "nvidia.com/mig.strategy": "none"}
    res = {"cpu": "96", "memory": "1000Gi", "pods": "110", "nvidia.com/gpu": "8", "ephemeral-storage": "2Ti"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels,
                         "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            "status": {"allocatable": res, "capacity": res,
                       "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "fake",
                                    "kubeProxyVersion": "fake"}}}


def group_pods(c: Cluster, ns: str, lws: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in c.get("pods", namespace=ns, selector=f"{LWS}/name={lws}")
            if not p["metadata"].get("deletionTimestamp")}


def running(pods: dict[str, dict[str, Any]]) -> bool:
    return bool(pods) and all(p["status"].get("phase") == "Running" and p["spec"].get("nodeName") for p in pods.values())


def test_a_model_bigger_than_a_node_runs_and_scales_as_groups(operator: Operator, ns: str):
    c = operator.cluster
    c.apply(model_cache(ns))
    wait_for("PVC bound", lambda: (c.get("pvc", "triton-models", ns) or {}).get("status", {}).get("phase") == "Bound")
    c.apply(big(ns, replicas=1))
    c.wait_ready("big", ns, timeout=120)

    # One group of two pods, each on its own H100 node with all 8 of its GPUs.
    lws = c.get("leaderworkerset", "big-group", ns)
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2 and lws["status"]["readyReplicas"] == 1
    assert c.get("deployment", "big", ns) is None
    pods = wait_for("the group's pods running", lambda: (p := group_pods(c, ns, "big-group")) and running(p) and p)
    assert sorted(pods) == ["big-group-0", "big-group-0-1"]
    leader, worker = pods["big-group-0"], pods["big-group-0-1"]
    assert leader["metadata"]["labels"]["app.kubernetes.io/component"] == "server"
    assert worker["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    assert worker["metadata"]["labels"][f"{LWS}/worker-index"] == "1"        # LWS's pod webhook
    env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert env["LWS_LEADER_ADDRESS"] == f"big-group-0.big-group.{ns}" and env["LWS_GROUP_SIZE"] == "2"
    nodes = {p["spec"]["nodeName"] for p in pods.values()}
    assert len(nodes) == 2 and all(n.startswith("gpu-h100-") for n in nodes)
    # The Service sends requests to the leader only; the key pair exists, made by the operator.
    (slice_,) = c.get("endpointslices", namespace=ns, selector="kubernetes.io/service-name=big")
    assert [e["targetRef"]["name"] for e in slice_["endpoints"]] == ["big-group-0"]
    secret = c.get("secret", "big-mpi-ssh", ns)
    assert secret["metadata"]["ownerReferences"][0]["name"] == "big"
    assert set(secret["data"]) == {"id_ed25519", "id_ed25519.pub"}
    status = c.get("infsvc", "big", ns)["status"]
    assert status["readyReplicas"] == 1
    row = c.kubectl("get", "infsvc", "big", "-n", ns, "--no-headers").stdout.split()
    assert row[:5] == ["big", "h100", "1", "1", "2"], row     # one group, of 2 nodes

    # A worker that dies takes its group with it: LWS recreates the whole group, leader included.
    old_leader = leader["metadata"]["uid"]
    c.kubectl("delete", "pod", "big-group-0-1", "-n", ns, "--wait=false")
    # LWS deletes the group and its StatefulSets make it again: seconds when the machine is idle,
    # over 90 s once when it was not (the whole suite on two cores).
    wait_for("the group recreated", lambda: (p := group_pods(c, ns, "big-group")).get("big-group-0") is not None
             and p["big-group-0"]["metadata"]["uid"] != old_leader and running(p) and len(p) == 2, timeout=180)
    c.wait_ready("big", ns, timeout=90)
    restarted = wait_for("the GroupRestarted Event", lambda: c.kubectl(
        "get", "events", "-n", ns, "--field-selector", "involvedObject.name=big,reason=GroupRestarted",
        "-o", "custom-columns=M:.message", "--no-headers").stdout.strip(), timeout=30)
    assert restarted.startswith("group 0 of big-group was recreated whole"), restarted

    # Two groups: the H100 pool holds one, so the second spills, whole, to two H200 nodes.
    c.apply(h200_node("gpu-h200-extra"))
    try:
        c.kubectl("patch", "infsvc", "big", "-n", ns, "--type=merge", "-p", '{"spec": {"replicas": 2}}')
        wait_for("a group on h200", lambda: running(group_pods(c, ns, "big-spill-h200-group"))
                 and len(group_pods(c, ns, "big-spill-h200-group")) == 2, timeout=120)
        spilled = group_pods(c, ns, "big-spill-h200-group")
        assert {c.get("node", p["spec"]["nodeName"])["metadata"]["labels"]["nvidia.com/gpu.product"]
                for p in spilled.values()} == {H200}
        assert len({p["spec"]["nodeName"] for p in spilled.values()}) == 2
        wait_for("2/2 groups ready", lambda: (c.get("infsvc", "big", ns)["status"].get("readyReplicas") or 0) == 2,
                 timeout=60)
        c.wait_ready("big", ns, timeout=60)
        assert c.get("leaderworkerset", "big-group", ns)["spec"]["replicas"] == 1

        # Back to one group: the spilled group goes, its LeaderWorkerSet deleted; the H100 one stays.
        c.kubectl("patch", "infsvc", "big", "-n", ns, "--type=merge", "-p", '{"spec": {"replicas": 1}}')
        wait_for("the spilled group set deleted", lambda: c.get("leaderworkerset", "big-spill-h200-group", ns) is None,
                 timeout=90)
        assert c.get("leaderworkerset", "big-group", ns)["spec"]["replicas"] == 1
        c.wait_ready("big", ns, timeout=60)
    finally:
        # The suite's other tests count the GPUs of these nodes: leave them as they were found.
        c.kubectl("delete", "infsvc", "big", "-n", ns, "--wait=true", check=False)
        wait_for("the groups' pods gone", lambda: not c.get("pods", namespace=ns,
                                                            selector=f"{GROUP}/inferenceservice=big"), timeout=90)
        c.kubectl("delete", "node", "gpu-h200-extra", "--wait=true", check=False)
