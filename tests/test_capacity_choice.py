"""Free GPUs per class from nodes and pods, capacity per class, and the planner's choice for
`gpu.class: auto` and the spill-over targets."""

from __future__ import annotations

import pytest

from triton_operator.api import InferenceService
from triton_operator.planning import capacity, choice

from .conftest import isvc, isvc_doc


def node(name, product, gpus=8, taints=None, **extra):
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "spec": {"taints": taints if taints is not None else [{"key": "nvidia.com/gpu", "value": "present",
                                                                    "effect": "NoSchedule"}], **extra},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "ready": True}}


def pod(node_name, gpus):
    return {"metadata": {"name": f"p-{node_name}-{gpus}"}, "spec": {"nodeName": node_name},
            "requests": {"nvidia.com/gpu": gpus}}


def test_free_gpus_subtract_every_bound_pod_and_skip_nodes_that_take_no_pods(classes):
    nodes = [node("a", "NVIDIA-H100-80GB-HBM3"), node("b", "NVIDIA-H100-80GB-HBM3"),
             node("c", "NVIDIA-H100-80GB-HBM3", unschedulable=True),
             node("d", "NVIDIA-H100-80GB-HBM3", taints=[{"key": "maintenance", "effect": "NoSchedule"}]),
             node("e", "NVIDIA-H200")]
    pods = [pod("a", 8), pod("b", 3), pod("b", 2), pod("e", 1)]
    free = capacity.free_gpus(nodes, pods, classes)
    assert sorted(free["h100"]) == [0, 3] and free["h200"] == [7] and free["l4"] == []
    assert capacity.room(free["h100"], 1) == 3 and capacity.room(free["h100"], 2) == 1
    assert capacity.room([4, 4], 8) == 0, "a replica's GPUs must be on one node"


def test_pod_requests_follow_the_schedulers_rule():
    spec = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}},
                           {"resources": {"requests": {"nvidia.com/gpu": "1"}}}],
            "initContainers": [{"resources": {"requests": {"nvidia.com/gpu": "4"}}},
                               {"restartPolicy": "Always", "resources": {"requests": {"example.com/fpga": "1"}}}]}
    assert capacity.pod_requests({"spec": spec}) == {"nvidia.com/gpu": 4, "example.com/fpga": 1}
    assert capacity.pod_requests({"spec": {"containers": [{"resources": {"requests": {"cpu": "2"}}}]}}) == {}


def test_relative_capacity_follows_bandwidth(classes):
    w = capacity.relative_capacity({n: (classes[n].spec, 1) for n in ("h100", "h200", "a100-80gb")}, "h100")
    assert w == {"h100": 1.0, "h200": pytest.approx(1.433, abs=0.001), "a100-80gb": pytest.approx(0.597, abs=0.001)}
    assert capacity.equivalent_replicas({"h100": 1, "a100-80gb": 2}, w) == pytest.approx(2.194, abs=0.01)
    # 4 H100-replicas of capacity with 1 on h100 and 2 on a100 (2.19): 1.81 more = 3.03 a100 replicas -> 4 -> 7.
    assert capacity.replicas_for(4, {"h100": 1, "a100-80gb": 2}, w, "a100-80gb") == 7
    assert capacity.replicas_for(4, {"h100": 1, "a100-80gb": 2}, w, "h100") == 5


def auto(**gpu):
    doc = isvc_doc(gpu={"class": "auto", "count": 0, **gpu})
    doc["spec"]["model"] = {"source": "hf://org/m", "format": "tensorrt-llm", "parameters": "70B", "precision": "fp8"}
    return InferenceService.model_validate(doc).spec


def test_auto_picks_the_cheapest_class_and_count_that_fit(classes):
    ranking = choice.rank(auto(), classes)
    top = [(o.gpu_class, o.count, o.cost_per_hour) for o in ranking if o.usable]
    # 70B at FP8 = 65 GiB: one H100 (72 GiB usable) at 4.0/h beats one H200 at 5.5/h; L4 needs 4 x 24 GiB.
    # A class without a price (gb200 in the example catalog) ranks after every priced one.
    assert top == [("l4", 4, 3.2), ("h100", 1, 4.0), ("h200", 1, 5.5), ("b200", 1, 14.0), ("gb200", 1, None)]
    a100 = next(o for o in ranking if o.gpu_class == "a100-80gb")
    assert a100.reason == "PrecisionUnsupported"


def test_auto_honours_the_latency_target_and_the_price_cap(classes):
    # L4: 4 x 0.3 TB/s / 70 GB = 17.1 tokens/s -> 58 ms a token; H100: 21 ms.
    ranking = choice.rank(auto(maxTimePerOutputTokenMs=30), classes)
    assert [o.gpu_class for o in ranking if o.usable] == ["h100", "h200", "b200", "gb200"]
    l4 = next(o for o in ranking if o.gpu_class == "l4")
    assert l4.reason == "TooSlow" and "at least 58.48 ms per token" in l4.message
    capped = choice.candidates(auto(maxTimePerOutputTokenMs=30, maxPricePerHour=5, spill={}), classes)
    assert capped.preferred.gpu_class == "h100" and capped.spill == ()
    assert {o.gpu_class: o.reason for o in capped.skipped} == {
        "h200": "OverPriceCap", "b200": "OverPriceCap", "gb200": "NoPrice", "l4": "TooSlow",
        "a100-80gb": "PrecisionUnsupported"}
    nothing = choice.candidates(auto(maxPricePerHour=1), classes)
    assert nothing.preferred is None and nothing.error.reason == "NoGPUClassQualifies"
    assert "l4:" in nothing.error.message


def test_a_fixed_count_with_auto_only_chooses_the_class(classes):
    spec = auto()
    spec.gpu.count = 2
    c = choice.candidates(spec, classes)
    # Two L4s (43 GiB) cannot hold 65 GiB of weights: two H100s (8.0/h) beat two H200s (11.0/h).
    assert (c.preferred.gpu_class, c.preferred.count, c.preferred.cost_per_hour) == ("h100", 2, 8.0)


def test_spill_targets_skip_classes_that_cannot_serve_the_model(classes):
    spec = isvc(model={"source": "hf://o/m", "format": "tensorrt-llm", "parameters": "8B", "precision": "fp8"},
                gpu={"class": "h100", "fallbackClasses": ["h200", "a100-80gb", "x100", "l4"], "spill": {}}).spec
    c = choice.candidates(spec, classes)
    assert c.preferred.gpu_class == "h100"
    assert [o.gpu_class for o in c.spill] == ["h200", "l4"]
    assert {o.gpu_class: o.reason for o in c.skipped} == {"a100-80gb": "PrecisionUnsupported", "x100": "GPUClassNotFound"}
    no_spill = choice.candidates(isvc(gpu={"class": "h100", "fallbackClasses": ["h200"]}).spec, classes)
    assert no_spill.spill == () and no_spill.skipped == ()


def test_the_named_class_is_exempt_from_the_constraints_and_its_problems_are_errors(classes):
    spec = isvc(gpu={"class": "h200", "fallbackClasses": ["h100"], "maxPricePerHour": 4.5, "spill": {}}).spec
    c = choice.candidates(spec, classes)
    assert c.preferred.gpu_class == "h200" and [o.gpu_class for o in c.spill] == ["h100"]
    bad = choice.candidates(isvc(model={"source": "hf://o/m", "format": "onnx", "parameters": "8B", "precision": "fp8"},
                                 gpu={"class": "a100-80gb"}).spec, classes)
    assert bad.preferred is None and bad.error.reason == "PrecisionUnsupported"
