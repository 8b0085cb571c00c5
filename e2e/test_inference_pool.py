"""spec.routing.inferencePool against the real API server with the Gateway API Inference
Extension's own InferencePool CRD (v1.5.0, fetched by hack/install-tools.sh from the Go module
proxy and installed by the suite's cluster): the operator renders the pool, the API server's
schema and CEL rules accept it, the pods it selects carry the engine label, and the pool goes
when the field does. A model that is no LLM is refused at admission.

Not run here: a gateway that implements the extension and its endpoint picker (no Envoy, and
kwok runs no containers); the pool's fields are the contract they read.
"""

from __future__ import annotations

import json
from typing import Any

from .cluster import Operator, model_cache, wait_for

GROUP = "serving.triton-operator.io"
ENGINE_LABEL = "inference.networking.k8s.io/engine-type"


def chat(ns: str, **routing: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService", "metadata": {"name": "pooled", "namespace": ns},
            "spec": {"model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct", "format": "tensorrt-llm",
                               "parameters": "8B", "precision": "fp8"},
                     "gpu": {"class": "h100", "count": 1}, "replicas": 1, "routing": routing}}


def test_the_inference_pool_is_applied_accepted_and_removed_with_the_field(operator: Operator, ns: str):
    c = operator.cluster
    c.apply(model_cache(ns))
    c.apply(chat(ns, policy="prefix", inferencePool={"endpointPicker": {"name": "pooled-epp", "failureMode": "FailOpen"}}))
    pool = wait_for("the InferencePool", lambda: c.get("inferencepools.inference.networking.k8s.io", "pooled", ns),
                    timeout=60)
    spec = pool["spec"]
    assert spec["selector"]["matchLabels"] == {f"{GROUP}/inferenceservice": "pooled",
                                               "app.kubernetes.io/component": "server"}
    assert spec["targetPorts"] == [{"number": 8000}] and spec["appProtocol"] == "http"
    assert spec["endpointPickerRef"] == {"group": "", "kind": "Service", "name": "pooled-epp",
                                         "port": {"number": 9002}, "failureMode": "FailOpen"}
    owner = pool["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "InferenceService" and owner["name"] == "pooled" and owner["controller"] is True
    # the pods it selects carry the engine label (the endpoint picker reads their metrics by its names)
    template = c.get("deployment", "pooled", ns)["spec"]["template"]["metadata"]["labels"]
    assert template[ENGINE_LABEL] == "triton-tensorrt-llm"
    assert spec["selector"]["matchLabels"].items() <= template.items()

    # The field taken out once the service is settled (its model prepared, its replica written):
    # the pool is deleted and the label goes, though every field still rendered is in place.
    wait_for("the replica written", lambda: c.get("deployment", "pooled", ns)["spec"]["replicas"] == 1, timeout=60)
    wait_for("the service Ready", lambda: (c.condition("infsvc", "pooled", ns, "Ready") or {}).get("status") == "True",
             timeout=60)
    c.kubectl("patch", "infsvc", "pooled", "-n", ns, "--type=merge",
              "-p", json.dumps({"spec": {"routing": {"inferencePool": None}}}))
    wait_for("the InferencePool deleted",
             lambda: c.get("inferencepools.inference.networking.k8s.io", "pooled", ns) is None, timeout=60)
    wait_for("the engine label gone", lambda: ENGINE_LABEL not in c.get("deployment", "pooled", ns)["spec"]["template"]
             ["metadata"]["labels"], timeout=60)
    c.kubectl("delete", "infsvc", "pooled", "-n", ns, "--wait=true")


def test_a_pool_for_a_model_that_is_no_llm_is_refused_at_admission(operator: Operator, ns: str):
    doc = chat(ns, inferencePool={"endpointPicker": {"name": "epp"}})
    doc["spec"]["model"] = {"source": "hf://org/resnet", "format": "onnx"}
    refused = operator.cluster.kubectl("apply", "-f", "-", input=json.dumps(doc), check=False)
    assert refused.returncode != 0
    assert refused.stderr.strip() == (
        'The InferenceService "pooled" is invalid: spec.routing.inferencePool: Invalid value: routing.inferencePool '
        "needs model.format tensorrt-llm (the endpoint picker scores pods by the LLM engine's queue and KV cache)")
