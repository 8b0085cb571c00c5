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
    ({"gpu__count": 0}, "spec.gpu.count", "greater than or equal to 1"),
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


def test_gpu_class_spec_needs_figures_and_parses_capability():
    spec = GPUClassSpec.model_validate({"productNames": ["NVIDIA-L4"], "memoryGiB": 24,
                                        "memoryBandwidthTBps": 0.3, "computeCapability": "8.9"})
    assert spec.capability == (8, 9)
    assert spec.tolerations[0].key == "nvidia.com/gpu" and spec.resource_name == "nvidia.com/gpu"
    with pytest.raises(ValidationError, match="memoryGiB"):
        GPUClassSpec.model_validate({"productNames": ["x"], "memoryBandwidthTBps": 1, "computeCapability": "9.0"})
