"""The API models: defaults, and every invalid spec refused with a message naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from triton_operator.api import AutoscalingSpec, GPUClassSpec, InferenceService, ModelSpec, first_error
from triton_operator.autoscaling.policy import attainment_target

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
    ({"gpu__count": 0}, "spec.gpu.count", "gpu.count 0 (let the planner choose) needs gpu.class auto"),
    ({"gpu__count": -1}, "spec.gpu.count", "greater than or equal to 0"),
    ({"gpu": {"class": "auto", "fallbackClasses": ["h100"]}}, "spec.gpu.fallbackClasses", "do not apply to gpu.class auto"),
    ({"gpu": {"class": "h100", "spill": {}}}, "spec.gpu.spill", "gpu.spill needs fallbackClasses"),
    ({"gpu": {"class": "h100", "fallbackClasses": ["h200"], "spill": {"after": "2 minutes"}}},
     "spec.gpu.spill.after", "pattern"),
    ({"gpu": {"class": "h100", "fallbackClasses": ["h200"], "spill": {"after": "1s"}}},
     "spec.gpu.spill.after", "after must be between 5s and 1h"),
    ({"gpu": {"class": "h100", "fallbackClasses": ["h200"], "spill": {"after": "10m", "returnAfter": "5m"}}},
     "spec.gpu.spill.returnAfter", "returnAfter must be at least after"),
    ({"gpu": {"class": "h100", "fallbackClasses": ["h200"], "spill": {"after": "20m"}}},
     "spec.gpu.spill.returnAfter", "returnAfter must be at least after"),  # against the default 600s
    ({"gpu": {"class": "h100", "fallbackClasses": ["h200"], "spill": {"after": "123456s"}}},
     "spec.gpu.spill.after", "pattern"),  # 5 digits at most: far from Go's duration overflow
    ({"gpu": {"class": "auto", "maxTimePerOutputTokenMs": 3600001}}, "spec.gpu.maxTimePerOutputTokenMs",
     "less than or equal to 3600000"),
    ({"gpu": {"class": "auto", "maxPricePerHour": 64000001}}, "spec.gpu.maxPricePerHour", "less than or equal to"),
    ({"gpu": {"class": "auto", "count": 1.0}}, "spec.gpu.count", "valid integer"),
    ({"gpu": {"class": "auto", "maxPricePerHour": 0}}, "spec.gpu.maxPricePerHour", "greater than 0"),
    ({"gpu": {"class": "auto", "count": 0}, "model": {"source": "hf://a/b", "format": "onnx"}}, "spec.gpu",
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
    ({"autoscaling": {"maxReplicas": 3, "targetQueueDepth": 0}}, "spec.autoscaling.targetQueueDepth", "greater than or equal to 0.01"),
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


@pytest.mark.parametrize("after, return_after, ok", [
    ("5000ms", "10s", True), ("4999ms", "10s", False), ("0.001h", "10s", False),  # 3.6 s
    ("1h", "1h", True), ("1h0.001s", "2h", False), ("360s", "0.1h", True),  # equal, read exactly
    ("59m60s", "0.999h", False), ("1.5m", "90s", True), ("10m", "24h", True), ("10m", "24h1ms", False),
])
def test_spill_durations_are_compared_exactly_as_go_reads_them(after, return_after, ok):
    """The bounds and returnAfter >= after in integer nanoseconds, as the API server's CEL
    duration() (Go's time.ParseDuration) reads them: no float rounding at the edges."""
    spec = {"class": "h100", "fallbackClasses": ["h200"], "spill": {"after": after, "returnAfter": return_after}}
    if ok:
        assert isvc(gpu=spec).spec.gpu.spill.after == after
    else:
        with pytest.raises(ValidationError, match="must be"):
            isvc(gpu=spec)


def test_assignment_keeps_the_optional_fields():
    """validate_assignment hands the before-validator every field, unset ones as None: they stay."""
    spec = isvc(gpu={"class": "auto", "count": 0, "spill": {}}).spec
    spec.gpu.count = 2
    assert spec.gpu.count == 2 and spec.gpu.spill is not None and spec.gpu.max_price_per_hour is None
    spec.model.precision = "fp8"
    assert spec.model.name is None and spec.model.parameters == "8B"


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
    # TensorRT-LLM's PyTorch backend has no INT8 SmoothQuant (it went with the engine workflow).
    ({"model": {**LLM["model"], "precision": "int8"}}, "spec.model", "precision int8 is not served by TensorRT-LLM"),
    ({"model": {**LLM["model"], "source": "hf://THUDM/chatglm3-6b"}}, "spec.model", "serve it with format triton"),
    ({"model": {**LLM["model"], "source": "hf://THUDM/glm-4-9b-chat"}}, "spec.model", "trust_remote_code"),
    ({"model": {**LLM["model"], "source": "s3://models/Baichuan2-7B"}}, "spec.model", "Baichuan"),
    ({"model": {**LLM["model"], "precision": "fp16"}, "engine": {"calibrationDataset": "pvc://data/calib"}}, "spec",
     "calibrationDataset applies only to precisions fp8, nvfp4 and int4-awq"),
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
    assert rules[api.CALIBRATION_MESSAGE]["rule"].endswith("self.model.precision in ['fp8', 'nvfp4', 'int4-awq']")
    family, int8, reserved = schema["properties"]["model"]["x-kubernetes-validations"]
    assert family["message"] == api.UNBUILT_LLM_MESSAGE and api.UNBUILT_LLM_FAMILIES in family["rule"]
    assert int8["message"] == api.INT8_LLM_MESSAGE and int8["fieldPath"] == ".precision"
    assert reserved["message"] == api.RESERVED_MODEL_MESSAGE and reserved["fieldPath"] == ".name"
    top = crdgen.inference_service_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert {"rule": api.MODEL_NAME_RULE, "message": api.RESERVED_SERVICE_MESSAGE} in top["x-kubernetes-validations"]
    assert rules[api.AUTO_PARAMETERS_MESSAGE]["fieldPath"] == ".gpu.class"
    gpu = {r["message"]: r for r in schema["properties"]["gpu"]["x-kubernetes-validations"]}
    for message in (api.COUNT_ZERO_MESSAGE, api.AUTO_FALLBACK_MESSAGE, api.SPILL_TARGET_MESSAGE):
        assert message in gpu
    spill = schema["properties"]["gpu"]["properties"]["spill"]
    rules = spill["x-kubernetes-validations"] + [
        r for name in ("after", "returnAfter") for r in spill["properties"][name]["x-kubernetes-validations"]]
    assert len(rules) == 3 and all("duration(self" in r["rule"] for r in rules)
    assert "\\" not in str(rules) + spill["properties"]["after"]["pattern"], "CEL string literals take no regex escapes"


def test_an_llm_may_choose_its_serving_image():
    """The stock image is the default; another tag (a patched or newer release) is allowed, and the
    serving pod's doctor checks its TensorRT-LLM version against the one models are prepared for."""
    svc = InferenceService.model_validate(isvc_doc(**{**LLM, "server": {"image": "registry.local/trtllm:26.07-fix"}}))
    assert svc.spec.server.image == "registry.local/trtllm:26.07-fix"


@pytest.mark.parametrize("changes, field", [
    ({"gpu__count": True}, "spec.gpu.count"),
    ({"replicas": 0.0}, "spec.replicas"),
    ({"replicas": 1.5}, "spec.replicas"),
    ({"autoscaling": {"minReplicas": "1", "maxReplicas": 3}}, "spec.autoscaling.minReplicas"),
    ({"autoscaling": {"maxReplicas": 3, "targetQueueDepth": True}}, "spec.autoscaling.targetQueueDepth"),
    ({"autoscaling": {"maxReplicas": 3, "targetQueueDepth": float("inf")}}, "spec.autoscaling.targetQueueDepth"),
    ({"rollout": {"maxSurge": 2**64}}, "spec.rollout.maxSurge"),
    ({"rollout": {"maxSurge": 2**31}}, "spec.rollout.maxSurge"),
    ({"engine": {"maxNumTokens": 2**31}, "model__format": "tensorrt-llm"}, "spec.engine.maxNumTokens"),
    ({"model__parameters": "0B"}, "spec.model.parameters"),
    ({"model__parameters": "0.00M"}, "spec.model.parameters"),
    ({"podLabels": {"team": "ml platform"}}, "spec.podLabels.team"),
    ({"podLabels": {"a/b/c": "x"}}, "spec.podLabels[a/b/c]"),
    ({"podAnnotations": {"note\n": "x"}}, "spec.podAnnotations[note\\n]"),
    ({"podAnnotations": {"a": "x" * 20000, "b": "x" * 12768}}, "spec.podAnnotations"),
    ({"server__env": [{"name": "A"}, {"name": "A", "value": "2"}]}, "spec.server.env"),
    ({"server__env": [{"name": "A", "value": "x" * 8193}]}, "spec.server.env[0].value"),
    ({"server__resources": {"requests": {"memory": "64Gi"}, "limits": {"memory": "32Gi"}}}, "spec.server.resources.limits"),
    ({"server__resources": {"limits": {"hugepages-2Mi": "1Gi"}}}, "spec.server.resources.limits"),
    ({"server__image": "nvcr.io/nvidia/tritonserver:25.01-py3 "}, "spec.server.image"),
    ({"server__shmSize": "-1Gi"}, "spec.server.shmSize"),
])
def test_what_kubernetes_would_refuse_in_a_child_is_refused_naming_the_field(changes, field):
    """Each of these once reached a child (or planning) and failed there; tests/admission_cases.yaml
    holds what the real API server says about the same specs."""
    with pytest.raises(ValidationError) as err:
        isvc(**changes)
    assert first_error(err.value).startswith(field + ":"), first_error(err.value)
    assert "\n" not in first_error(err.value)


def test_explicit_nulls_mean_unset_as_the_api_server_stores_them():
    obj = isvc(gpu__fallbackClasses=None, server={"image": None, "args": []}, podLabels={"team": None},
               autoscaling=None)
    assert obj.spec.gpu.fallback_classes == [] and obj.spec.server.image is None
    assert obj.spec.pod_labels == {} and obj.spec.autoscaling is None
    with pytest.raises(ValidationError, match="spec.model"):
        isvc(model=None)
    with pytest.raises(ValidationError, match="spec.server.args.0"):  # null list items are refused there too
        isvc(server={"args": [None]})


def test_names_are_service_names():
    for name in ("8b-llama", "llama.v3", "Llama"):
        doc = isvc_doc()
        doc["metadata"]["name"] = name
        with pytest.raises(ValidationError, match="metadata.name must be a lowercase letter"):
            InferenceService.model_validate(doc)
    doc = isvc_doc()
    doc["metadata"]["name"] = 5
    with pytest.raises(ValidationError, match="metadata.name is required"):
        InferenceService.model_validate(doc)


def test_gpu_class_refuses_what_pods_would_refuse():
    base = {"productNames": ["NVIDIA-L4"], "memoryGiB": 24, "memoryBandwidthTBps": 0.3, "computeCapability": "8.9"}
    for changes, words in [
        ({"productNames": ["NVIDIA L4"]}, "productNames.0"),
        ({"nodeSelector": {"pool": "gpu a"}}, "nodeSelector.pool"),
        ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "operator must be Exists when key is empty"),
        ({"tolerations": [{"key": "k", "tolerationSeconds": 5}]}, "effect must be NoExecute"),
        ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "value must be empty"),
        ({"resourceName": "kubernetes.io/gpu"}, "kubernetes.io"),
        ({"memoryGiB": 0.5}, "memoryGiB"),
        ({"productNames": [], "nodeSelector": {}}, "set productNames or nodeSelector"),
    ]:
        with pytest.raises(ValidationError, match=words):
            GPUClassSpec.model_validate({**base, **changes})


@pytest.mark.parametrize("autoscaling, latency_ms, end_to_end_ms, attainment", [
    ({"maxReplicas": 4}, None, None, 0.99),
    ({"maxReplicas": 4, "targetP99LatencyMs": 2500}, 2500.0, 2500.0, 0.99),
    ({"maxReplicas": 4, "slo": {"latencyMs": 4000, "attainment": 0.95}}, 4000.0, 4000.0, 0.95),
    ({"maxReplicas": 4, "slo": {"latencyMs": 300, "latency": "timeToFirstToken", "attainment": 0.9}},
     300.0, None, 0.9),
])
def test_the_autoscalers_targets_are_the_service_level(autoscaling, latency_ms, end_to_end_ms, attainment):
    """The end-to-end target and the attainment the policy reads are the service level's:
    targetP99LatencyMs is an end-to-end 0.99 level, and a latency other than end to end has no
    end-to-end target. The level is built once, not on every read (every tick, every service)."""
    spec = AutoscalingSpec.model_validate(autoscaling)
    level = spec.service_level()
    assert spec.service_level() is level
    assert (level.latency_ms if level else None) == latency_ms
    assert spec.end_to_end_target_ms() == end_to_end_ms
    assert attainment_target(spec) == attainment
    assert attainment_target(spec) == (level.attainment if level else 0.99)
