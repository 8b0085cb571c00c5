"""A tensorrt-llm service's model preparation on the local cluster: one preparation Job, which
quantizes on a node of the preferred class (fp8 here), status moves through Preparing to
ModelReady, serving pods (NVIDIA's stock image, the repository written by our init container)
appear only after it, and a change of what is prepared replaces the Job while the running
Deployment keeps serving.

Simulated: kwok runs no containers, and it moves a Job's pods to Succeeded by itself, so the Job
controller (real) marks the preparation Complete about a second after it starts; nothing is
really downloaded or quantized (that needs a GPU and NVIDIA's image), and the init containers
are accepted and scheduled but not run (tests/test_runtime_build.py runs them; e2e/test_llm.py
serves the repository they write). The model cache PVC is bound by the real PersistentVolume
controller to a hostPath volume that nothing mounts."""

from __future__ import annotations

import threading
from datetime import datetime

from .cluster import Operator, model_cache, wait_for

GROUP = "serving.triton-operator.io"


class DeploymentRecorder:
    """(spec.replicas, status.readyReplicas) of every version of one Deployment, from a watch."""

    def __init__(self, cluster, namespace: str, name: str):
        from kubernetes import client, config, watch
        api = client.AppsV1Api(config.new_client_from_config(config_file=cluster.kubeconfig))
        self.versions: list[tuple[int, int]] = []
        self._watch = watch.Watch()

        def run() -> None:
            try:
                for event in self._watch.stream(api.list_namespaced_deployment, namespace,
                                                field_selector=f"metadata.name={name}", timeout_seconds=300):
                    dep = event["object"]
                    self.versions.append((dep.spec.replicas, dep.status.ready_replicas or 0))
            except Exception:  # noqa: BLE001 - the stream ends when the test stops it
                pass

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        wait_for("the watch's first event", lambda: self.versions, timeout=30)

    def stop(self) -> list[tuple[int, int]]:
        self._watch.stop()
        return list(self.versions)


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_one_preparation_then_serving_on_the_stock_image(operator: Operator, ns: str):
    c = operator.cluster
    c.apply(model_cache(ns))
    try:
        wait_for("PVC bound", lambda: (c.get("pvc", "triton-models", ns) or {}).get("status", {}).get("phase") == "Bound")
        c.apply({"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService",
                 "metadata": {"name": "llm", "namespace": ns},
                 "spec": {"model": {"source": "hf://meta-llama/Meta-Llama-3-8B-Instruct", "format": "tensorrt-llm",
                                    "parameters": "8B", "precision": "fp8"},
                          "gpu": {"class": "h100", "fallbackClasses": ["h200"]}, "replicas": 2}})
        c.wait_condition("llm", ns, "ModelReady", timeout=90)
        c.wait_ready("llm", ns, timeout=90)

        (job,) = c.get("jobs", namespace=ns)
        assert job["metadata"]["labels"][f"{GROUP}/gpu-class"] == "h100", "fp8 is quantized on the preferred class"
        (pod,) = c.get("pods", namespace=ns, selector=f"job-name={job['metadata']['name']}")
        node = c.get("node", pod["spec"]["nodeName"])
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        install, doctor, download = pod["spec"]["initContainers"]
        assert install["command"] == ["triton-runtime"] and install["args"][0] == "install"
        assert doctor["args"][:6] == ["python3", "-m", "triton_runtime.cli", "doctor", "--for", "prepare"]
        assert "command" not in doctor and doctor["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert download["command"] == ["triton-runtime"] and "--download-to" in download["args"]
        assert "nvidia.com/gpu" not in download["resources"]["requests"]
        rules = job["spec"]["podFailurePolicy"]["rules"]  # kept by the API server as rendered
        assert rules[0]["action"] == "FailJob" and rules[0]["onExitCodes"]["values"] == [2, 3]
        status = c.get("infsvc", "llm", ns)["status"]
        assert [(e["precision"], e.get("gpuClass"), e["phase"]) for e in status["preparation"]] == \
            [("fp8", "h100", "Ready")]
        conds = {x["type"]: x for x in status["conditions"]}
        prepared = _ts(job["status"]["completionTime"])
        serving = c.get("pods", namespace=ns, selector=f"{GROUP}/inferenceservice=llm,app.kubernetes.io/component=server")
        assert len(serving) == 2
        assert all(_ts(p["metadata"]["creationTimestamp"]) >= prepared for p in serving), \
            "serving pods were created before the model was prepared"
        for p in serving:
            assert [i["name"] for i in p["spec"]["initContainers"]] == ["model-repository", "doctor"]
            assert p["spec"]["containers"][0]["image"] == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
            assert p["spec"]["containers"][0]["args"][0] == "tritonserver"
        assert conds["ModelReady"]["reason"] == "Prepared"
        reasons = c.kubectl("get", "events", "-n", ns, "--field-selector", "involvedObject.name=llm",
                            "-o", "custom-columns=R:.reason", "--no-headers").stdout.split()
        assert "Preparing" in reasons and "Prepared" in reasons

        old = job["metadata"]["name"]
        seen = DeploymentRecorder(c, ns, "llm")  # every version of the Deployment from here on
        c.kubectl("patch", "infsvc", "llm", "-n", ns, "--type=merge", "-p", '{"spec": {"model": {"revision": "v2"}}}')
        new = wait_for("a new preparation Job replaces the old", lambda: (names := {
            j["metadata"]["name"] for j in c.get("jobs", namespace=ns)}) and old not in names and len(names) == 1
            and names, timeout=60)
        wait_for("the model prepared for generation 2", lambda: (x := c.condition("infsvc", "llm", ns, "ModelReady"))
                 and x["status"] == "True" and x["observedGeneration"] == 2, timeout=60)
        dep = c.get("deployment", "llm", ns)
        args = next(i for i in dep["spec"]["template"]["spec"]["initContainers"] if i["name"] == "model-repository")["args"]
        assert args[args.index("--revision") + 1] == "v2"
        assert {j["metadata"]["name"] for j in c.get("jobs", namespace=ns)} == new
        wait_for("the Deployment rolled out for generation 2", lambda: (d := c.get("deployment", "llm", ns))
                 and (d["status"].get("updatedReplicas") or 0) == 2 and (d["status"].get("readyReplicas") or 0) == 2)
        versions = seen.stop()
        assert versions, "the watch saw the Deployment"
        assert min(v[0] for v in versions) == 2, "the running Deployment keeps its replicas while the model is prepared"
        assert min(v[1] for v in versions) >= 1, "something serves throughout"
    finally:
        c.kubectl("delete", "infsvc", "llm", "-n", ns, "--wait=true", check=False)
        c.kubectl("delete", "pv", f"models-{ns}", "--wait=false", check=False)


def test_engine_spec_on_a_non_llm_format_is_rejected(installed, ns: str):
    out = installed.apply({"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService",
                           "metadata": {"name": "bad-format", "namespace": ns},
                           "spec": {"model": {"source": "hf://a/b", "format": "onnx"}, "gpu": {"class": "l4"},
                                    "engine": {"maxBatchSize": 8}}}, check=False)
    assert out.returncode != 0 and "engine applies only to model.format tensorrt-llm" in out.stderr
    out = installed.apply({"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService",
                           "metadata": {"name": "bad-lengths", "namespace": ns},
                           "spec": {"model": {"source": "hf://a/b", "format": "tensorrt-llm"}, "gpu": {"class": "l4"},
                                    "engine": {"maxInputLen": 4096, "maxSeqLen": 4096}}}, check=False)
    assert out.returncode != 0 and "maxInputLen must be less than maxSeqLen" in out.stderr


def test_llm_specs_the_runtime_cannot_honour_are_rejected_at_admission(installed, ns: str):
    """The CEL rules of the CRD, evaluated by the real API server."""
    llm = {"source": "hf://meta-llama/Llama-3.2-1B", "format": "tensorrt-llm", "precision": "fp8"}
    cases = [
        ("int8", {"model": {**llm, "precision": "int8"}}, "precision int8 is not served by TensorRT-LLM"),
        ("chatglm", {"model": {**llm, "source": "hf://THUDM/chatglm3-6b"}}, "serve it with format triton"),
        ("calib", {"model": {**llm, "precision": "fp16"}, "engine": {"calibrationDataset": "pvc://data/calib"}},
         "engine.calibrationDataset applies only to precisions fp8, nvfp4 and int4-awq"),
    ]
    for name, spec, words in cases:
        out = installed.apply({"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService",
                               "metadata": {"name": f"bad-{name}", "namespace": ns},
                               "spec": {"gpu": {"class": "h100"}, **spec}}, check=False)
        assert out.returncode != 0 and words in out.stderr, (name, out.stderr)
    # What stays allowed beside them: a serving image of one's own, a calibration set for fp8, nvfp4.
    for name, spec in (("llm-image", {"model": llm, "server": {
                            "image": "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"}}),
                       ("fp8-calib", {"model": llm, "engine": {"calibrationDataset": "pvc://data/calib"}}),
                       ("nvfp4", {"model": {**llm, "precision": "nvfp4"}, "gpu": {"class": "h100"}})):
        out = installed.apply({"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService",
                               "metadata": {"name": name, "namespace": ns},
                               "spec": {"gpu": {"class": "h100"}, **spec}}, check=False)
        assert out.returncode == 0, (name, out.stderr)
        installed.kubectl("delete", "infsvc", name, "-n", ns, "--wait=false", check=False)
