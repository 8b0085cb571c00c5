"""TensorRT-LLM engines on the local cluster: one build Job per GPU class in use lands on a node
of that class, status moves through EngineBuilding to EngineReady, serving pods appear only after
the engine exists, and a spec change replaces the Jobs.

Simulated: kwok runs no containers, and it moves a Job's pods to Succeeded by itself, so the Job
controller (real) marks each build Complete about a second after it starts; no engine is really
built (that needs a GPU and the runtime image), and the `triton-runtime doctor` init container that
leads every build pod and serving pod is accepted and scheduled but not run (tests/
test_runtime_build.py runs it). The engine cache PVC is bound by the real PersistentVolume
controller to a hostPath volume that nothing mounts."""

from __future__ import annotations

import threading
from datetime import datetime

from .cluster import Operator, wait_for

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


def test_engine_builds_per_class_then_serving(operator: Operator, ns: str):
    c = operator.cluster
    c.apply([
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"engines-{ns}"},
         "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "hostPath": {"path": f"/tmp/{ns}"}, "claimRef": {"namespace": ns, "name": "trtllm-engines"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "trtllm-engines", "namespace": ns},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"engines-{ns}",
                  "resources": {"requests": {"storage": "100Gi"}}}},
    ])
    try:
        wait_for("PVC bound", lambda: (c.get("pvc", "trtllm-engines", ns) or {}).get("status", {}).get("phase") == "Bound")
        c.apply({"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService",
                 "metadata": {"name": "llm", "namespace": ns},
                 "spec": {"model": {"source": "hf://meta-llama/Meta-Llama-3-8B-Instruct", "format": "tensorrt-llm",
                                    "parameters": "8B", "precision": "fp16"},
                          "gpu": {"class": "h100", "fallbackClasses": ["h200"]}, "replicas": 2}})
        c.kubectl("wait", "--for=condition=EngineReady", "infsvc/llm", "-n", ns, "--timeout=90s", timeout=120)
        c.kubectl("wait", "--for=condition=Ready", "infsvc/llm", "-n", ns, "--timeout=90s", timeout=120)

        jobs = {j["metadata"]["labels"][f"{GROUP}/gpu-class"]: j for j in c.get("jobs", namespace=ns)}
        assert set(jobs) == {"h100", "h200"}, "an engine per class the service may run on"
        for cls, product in (("h100", "NVIDIA-H100-80GB-HBM3"), ("h200", "NVIDIA-H200")):
            (pod,) = c.get("pods", namespace=ns, selector=f"job-name={jobs[cls]['metadata']['name']}")
            node = c.get("node", pod["spec"]["nodeName"])
            assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == product
            (doctor,) = pod["spec"]["initContainers"]
            assert doctor["args"][:4] == ["triton-runtime", "doctor", "--for", "build"] and "command" not in doctor
            assert doctor["resources"]["limits"]["nvidia.com/gpu"] == "1"
            rules = jobs[cls]["spec"]["podFailurePolicy"]["rules"]  # kept by the API server as rendered
            assert rules[0]["action"] == "FailJob" and rules[0]["onExitCodes"]["values"] == [2, 3]
        status = c.get("infsvc", "llm", ns)["status"]
        assert sorted((e["gpuClass"], e["phase"]) for e in status["engines"]) == [("h100", "Ready"), ("h200", "Ready")]
        conds = {x["type"]: x for x in status["conditions"]}
        built = _ts(jobs["h100"]["status"]["completionTime"])
        serving = c.get("pods", namespace=ns, selector=f"{GROUP}/inferenceservice=llm,app.kubernetes.io/component=server")
        assert len(serving) == 2
        assert all(_ts(p["metadata"]["creationTimestamp"]) >= built for p in serving), \
            "serving pods were created before their class's engine was built"
        assert all([i["name"] for i in p["spec"]["initContainers"]] == ["doctor", "make-repository"] for p in serving)
        assert all(p["spec"]["initContainers"][0]["args"][:4] == ["triton-runtime", "doctor", "--for", "serve"]
                   for p in serving)
        assert conds["EngineReady"]["reason"] == "EngineReady"
        reasons = c.kubectl("get", "events", "-n", ns, "--field-selector", "involvedObject.name=llm",
                            "-o", "custom-columns=R:.reason", "--no-headers").stdout.split()
        assert "EngineBuilding" in reasons and "EngineReady" in reasons

        old = {j["metadata"]["name"] for j in jobs.values()}
        seen = DeploymentRecorder(c, ns, "llm")  # every version of the Deployment from here on
        c.kubectl("patch", "infsvc", "llm", "-n", ns, "--type=merge", "-p", '{"spec": {"engine": {"maxBatchSize": 128}}}')
        new = wait_for("new build Jobs replace the old", lambda: (names := {j["metadata"]["name"] for j in c.get("jobs", namespace=ns)})
                       and len(names) == 2 and not names & old and names, timeout=60)
        wait_for("engines ready for generation 2", lambda: (x := c.condition("infsvc", "llm", ns, "EngineReady"))
                 and x["status"] == "True" and x["observedGeneration"] == 2, timeout=60)
        dep = c.get("deployment", "llm", ns)
        args = next(i for i in dep["spec"]["template"]["spec"]["initContainers"] if i["name"] == "make-repository")["args"]
        assert args[args.index("--max-batch-size") + 1] == "128"
        assert {j["metadata"]["name"] for j in c.get("jobs", namespace=ns)} == new
        wait_for("the Deployment rolled out for generation 2", lambda: (d := c.get("deployment", "llm", ns))
                 and (d["status"].get("updatedReplicas") or 0) == 2 and (d["status"].get("readyReplicas") or 0) == 2)
        versions = seen.stop()
        assert versions, "the watch saw the Deployment"
        assert min(v[0] for v in versions) == 2, "the running Deployment keeps its replicas while the new engine builds"
        assert min(v[1] for v in versions) >= 1, "something serves throughout the rebuild"
    finally:
        c.kubectl("delete", "infsvc", "llm", "-n", ns, "--wait=true", check=False)
        c.kubectl("delete", "pv", f"engines-{ns}", "--wait=false", check=False)


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
        ("image", {"model": llm, "server": {"image": "nvcr.io/nvidia/tritonserver:25.02-trtllm-python-py3"}},
         "server.image cannot be set for model.format tensorrt-llm"),
        ("gemma", {"model": {**llm, "source": "hf://google/gemma-2-9b-it"}}, "serve them with format triton"),
        ("calib", {"model": {**llm, "precision": "fp16"}, "engine": {"calibrationDataset": "pvc://data/calib"}},
         "engine.calibrationDataset applies only to precisions fp8 and int4-awq"),
    ]
    for name, spec, words in cases:
        out = installed.apply({"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService",
                               "metadata": {"name": f"bad-{name}", "namespace": ns},
                               "spec": {"gpu": {"class": "h100"}, **spec}}, check=False)
        assert out.returncode != 0 and words in out.stderr, (name, out.stderr)
    # What stays allowed beside them: an image for other formats, a calibration set for fp8.
    for name, spec in (("onnx-image", {"model": {"source": "hf://a/b", "format": "onnx"},
                                       "server": {"image": "nvcr.io/nvidia/tritonserver:25.01-py3"}}),
                       ("fp8-calib", {"model": llm, "engine": {"calibrationDataset": "pvc://data/calib"}})):
        out = installed.apply({"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService",
                               "metadata": {"name": name, "namespace": ns},
                               "spec": {"gpu": {"class": "h100"}, **spec}}, check=False)
        assert out.returncode == 0, (name, out.stderr)
        installed.kubectl("delete", "infsvc", name, "-n", ns, "--wait=false", check=False)
