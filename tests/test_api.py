"""The API models: defaults, and every invalid spec refused with a message naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from triton_operator.api import GPUClassSpec, InferenceService, ModelSpec

from .conftest import isvc, isvc_doc


def test_defaults_fill_an_minimal_spec():
    s = InferenceService.model_validate({
        "apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "m"},
        "spec": {"model": {"source": "s3://b/p", "format": "triton"}, "gpu": {"class": "l4"}},
    }).spec
    assert (s.replicas, s.gpu.count, s.model.precision, s.autoscaling) == (1, 1, "fp16", None)
    assert s.server.startup_timeout_seconds == 1800 and s.server.shm_size == "2Gi"
    assert s.rollout.max_surge is None and s.rollout.max_unavailable == 1


def test_wire_form_is_camel_case_and_round_trips():
    doc = isvc_doc(autoscaling={"maxReplicas": 4, "targetP99LatencyMs": 800})
    obj = InferenceService.model_validate(doc)
    wire = obj.wire()
    assert wire["spec"]["autoscaling"]["targetP99LatencyMs"] == 800
    assert wire["spec"]["gpu"]["class"] == "h100"
    assert InferenceService.model_validate(wire) == obj


@pytest.mark.parametrize("changes, field, words", [
    ({"gpu__count": 0}, "spec.gpu", "gpu.count 0 (let the planner choose) needs gpu.class auto"),
    ({"gpu__count": -1}, "spec.gpu.count", "greater than or equal to 0"),
    ({"gpu": {"class": "auto", "fallbackClasses": ["h100"]}}, "spec.gpu", "do not apply to gpu.class auto"),
    ({"gpu": {"class": "h100", "spill": {}}}, "spec.gpu", "gpu.spill needs fallbackClasses"),
    ({"gpu": {"class": "h100", "fallbackClasses": ["h200"], "spill": {"after": "2 minutes"}}},
     "spec.gpu.spill.after", "pattern"),
    ({"gpu": {"class": "h100", "fallbackClasses": ["h200"], "spill": {"after": "1s"}}},
     "spec.gpu.spill", "after must be between 5s and 1h"),
    ({"gpu": {"class": "h100", "fallbackClasses": ["h200"], "spill": {"after": "10m", "returnAfter": "5m"}}},
     "spec.gpu.spill", "returnAfter must be at least after"),
    ({"gpu": {"class": "auto", "maxPricePerHour": 0}}, "spec.gpu.maxPricePerHour", "greater than 0"),
    ({"gpu": {"class": "auto", "count": 0}, "model": {"source": "hf://a/b", "format": "onnx"}}, "spec",
     "gpu.class auto needs model.parameters"),
    ({"gpu__class": "H100!"}, "spec.gpu.class", "pattern"),
    ({"gpu__fallbackClasses": ["h100"]}, "spec.gpu", "must not repeat class"),
    ({"gpu__fallbackClasses": ["h200", "h200"]}, "spec.gpu.fallbackClasses", "must not repeat"),
    ({"model__source": "ftp://x/y"}, "spec.model.source", "pattern"),
    ({"model__source": "hf://only-org"}, "spec.model.source", "pattern"),
    ({"model__format": "gguf"}, "spec.model.format", "tensorrt-llm"),
    ({"model__precision": "fp4"}, "spec.model.precision", "fp8"),
    ({"model__parameters": "8 billion"}, "spec.model.parameters", "pattern"),
    ({"replicas": -1}, "spec.replicas", "greater than or equal to 0"),
    ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, "spec.autoscaling", "minReplicas must be less"),
    ({"autoscaling": {"minReplicas": 1}}, "spec.autoscaling.maxReplicas", "Field required"),
    ({"autoscaling": {"maxReplicas": 3, "targetQueueDepth": 0}}, "spec.autoscaling.targetQueueDepth", "greater than 0"),
    ({"server__resources": {"limits": {"nvidia.com/gpu": "1"}}}, "spec.server.resources", "spec.gpu"),
    ({"server__resources": {"requests": {"cpu": "four"}}}, "spec.server.resources.requests.cpu", "pattern"),
    ({"server__startupTimeoutSeconds": 5}, "spec.server.startupTimeoutSeconds", "greater than or equal to 60"),
    ({"rollout": {"maxSurge": 0, "maxUnavailable": 0}}, "spec", "cannot both be 0"),
    ({"unknownField": 1}, "spec.unknownField", "Extra inputs are not permitted"),
])
def test_invalid_specs_are_refused_naming_the_field(changes, field, words):
    with pytest.raises(ValidationError) as err:
        isvc(**changes)
    first = err.value.errors()[0]
    assert ".".join(str(p) for p in first["loc"]).startswith(field)
    assert words in str(err.value)


def test_names_longer_than_children_allow_are_refused():
    doc = isvc_doc()
    doc["metadata"]["name"] = "x" * 53
    with pytest.raises(ValidationError, match="at most 52"):
        InferenceService.model_validate(doc)


@pytest.mark.parametrize("text, count", [("8B", 8e9), ("70B", 70e9), ("1.5B", 1.5e9), ("350M", 350e6), (None, None)])
def test_parameter_count(text, count):
    assert ModelSpec(source="hf://a/b", format="onnx", parameters=text).parameter_count() == count


def test_spill_and_auto_specs_parse_with_defaults():
    s = isvc(gpu={"class": "h100", "fallbackClasses": ["h200"], "spill": {}}).spec.gpu
    assert (s.spill.after_seconds, s.spill.return_after_seconds) == (120, 600)
    s = isvc(gpu={"class": "h100", "fallbackClasses": ["h200"], "spill": {"after": "1m30s", "returnAfter": "1.5h"}}).spec.gpu
    assert (s.spill.after_seconds, s.spill.return_after_seconds) == (90, 5400)
    auto = isvc(gpu={"class": "auto", "count": 0, "maxPricePerHour": 10, "spill": {}}).spec.gpu
    assert auto.auto and auto.count == 0 and auto.max_price_per_hour == 10
    assert isvc().spec.gpu.spill is None, "spill is opt-in: existing specs keep waiting for their class"


def test_no_gpu_class_may_be_called_auto():
    from triton_operator.api import GPUClass
    with pytest.raises(ValidationError, match="reserved"):
        GPUClass.model_validate({"metadata": {"name": "auto"}, "spec": {
            "productNames": ["x"], "memoryGiB": 24, "memoryBandwidthTBps": 1, "computeCapability": "9.0"}})


def test_gpu_class_spec_needs_figures_and_parses_capability():
    spec = GPUClassSpec.model_validate({"productNames": ["NVIDIA-L4"], "memoryGiB": 24,
                                        "memoryBandwidthTBps": 0.3, "computeCapability": "8.9"})
    assert spec.capability == (8, 9)
    assert spec.tolerations[0].key == "nvidia.com/gpu" and spec.resource_name == "nvidia.com/gpu"
    with pytest.raises(ValidationError, match="memoryGiB"):
        GPUClassSpec.model_validate({"productNames": ["x"], "memoryBandwidthTBps": 1, "computeCapability": "9.0"})


LLM = {"model": {"source": "hf://meta-llama/Llama-3.2-1B", "format": "tensorrt-llm", "parameters": "1B",
                 "precision": "fp8"}}


@pytest.mark.parametrize("changes, field, words", [
    # The server image of an LLM is the runtime image: its TensorRT-LLM built the engine.
    ({**LLM, "server": {"image": "nvcr.io/nvidia/tritonserver:25.02-trtllm-python-py3"}}, "spec",
     "server.image cannot be set for model.format tensorrt-llm"),
    ({"model": {**LLM["model"], "source": "hf://google/gemma-2-9b-it"}}, "spec.model", "Gemma, ChatGLM/GLM-4 or Baichuan"),
    ({"model": {**LLM["model"], "source": "hf://THUDM/chatglm3-6b"}}, "spec.model", "serve them with format triton"),
    ({"model": {**LLM["model"], "source": "hf://THUDM/glm-4-9b-chat"}}, "spec.model", "remote code"),
    ({"model": {**LLM["model"], "source": "s3://models/Baichuan2-7B"}}, "spec.model", "Baichuan"),
    ({"model": {**LLM["model"], "precision": "fp16"}, "engine": {"calibrationDataset": "pvc://data/calib"}}, "spec",
     "calibrationDataset applies only to precisions fp8 and int4-awq"),
    ({**LLM, "engine": {"calibrationDataset": "file:///data"}}, "spec.engine.calibrationDataset", "pattern"),
    ({**LLM, "engine": {"buildResources": {"limits": {"nvidia.com/gpu": "2"}}}}, "spec.engine.buildResources",
     "spec.gpu"),
])
def test_llm_specs_the_runtime_cannot_honour_are_refused(changes, field, words):
    with pytest.raises(ValidationError) as err:
        isvc(**changes)
    assert ".".join(str(p) for p in err.value.errors()[0]["loc"]).startswith(field)
    assert words in str(err.value)


def test_what_stays_allowed_next_to_those_refusals():
    assert isvc(server={"image": "registry.local/tritonserver:25.01-py3"}).spec.server.image  # onnx may pick its image
    assert isvc(model={"source": "hf://google/gemma-onnx", "format": "onnx"})  # only tensorrt-llm builds engines
    calibrated = isvc(**LLM, engine={"calibrationDataset": "hf://org/calib-text",
                                     "buildResources": {"requests": {"memory": "64Gi", "ephemeral-storage": "100Gi"}}})
    assert calibrated.spec.engine.calibration_dataset == "hf://org/calib-text"


def test_admission_rules_say_what_the_models_say():
    """The CRD's CEL rules carry the models' messages, so kubectl and `triton-operator render`
    refuse the same specs with the same words."""
    from triton_operator import api, crdgen
    schema = crdgen.inference_service_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = {r["message"]: r for r in schema["x-kubernetes-validations"]}
    assert rules[api.SERVER_IMAGE_MESSAGE]["fieldPath"] == ".server.image"
    assert "self.model.format != 'tensorrt-llm'" in rules[api.SERVER_IMAGE_MESSAGE]["rule"]
    assert rules[api.CALIBRATION_MESSAGE]["rule"].endswith("self.model.precision in ['fp8', 'int4-awq']")
    (family,) = schema["properties"]["model"]["x-kubernetes-validations"]
    assert family["message"] == api.UNBUILT_LLM_MESSAGE and api.UNBUILT_LLM_FAMILIES in family["rule"]
    assert rules[api.AUTO_PARAMETERS_MESSAGE]["fieldPath"] == ".model.parameters"
    gpu = {r["message"]: r for r in schema["properties"]["gpu"]["x-kubernetes-validations"]}
    for message in (api.COUNT_ZERO_MESSAGE, api.AUTO_FALLBACK_MESSAGE, api.SPILL_TARGET_MESSAGE):
        assert message in gpu
    spill = schema["properties"]["gpu"]["properties"]["spill"]
    assert "\\" not in str(spill["x-kubernetes-validations"]), "CEL string literals take no regex escapes"
    assert all("duration(self." in r["rule"] for r in spill["x-kubernetes-validations"])


def test_the_operator_refuses_the_families_the_runtime_refuses():
    """api.UNBUILT_LLM_FAMILIES (by name, at admission) covers runtime's UNSUPPORTED model_types
    that have a recognisable name; Qwen v1 (model_type qwen, names like Qwen-7B) is only caught by
    the runtime, as Qwen2 repositories share its name."""
    import re

    from triton_operator import api
    from triton_runtime import trtllm
    for model_type in set(trtllm.UNSUPPORTED) - {"qwen"}:
        assert re.search(api.UNBUILT_LLM_FAMILIES, model_type), model_type
