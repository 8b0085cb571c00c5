from __future__ import annotations

import pytest

from triton_operator.planning import fit
from triton_operator.api import ModelSpec


def test_70b_fp8_on_h100_matches_the_reference_figures(classes):
    """~70 GB of weights; decode bound 3.35 TB/s / 70 GB = ~48 tokens/s per stream."""
    p = fit.fit(ModelSpec(source="hf://a/b", format="tensorrt-llm", parameters="70B", precision="fp8"),
                      classes["h100"].spec, 1)
    assert p.weights_gib == pytest.approx(65.2, abs=0.1)
    assert p.decode_tokens_per_s_bound == pytest.approx(47.9, abs=0.1)
    assert p.fits and p.cost_per_hour == 4.0


@pytest.mark.parametrize("params, precision, cls, count, fits, min_gpus", [
    ("70B", "fp16", "h100", 1, False, 2),
    ("70B", "fp16", "h100", 2, True, 2),
    ("70B", "fp16", "h200", 1, False, 2),
    ("8B", "fp16", "l4", 1, True, 1),
    ("70B", "int4-awq", "a100-80gb", 1, True, 1),
])
def test_fit_table(classes, params, precision, cls, count, fits, min_gpus):
    p = fit.fit(ModelSpec(source="hf://a/b", format="onnx", parameters=params, precision=precision),
                      classes[cls].spec, count)
    assert (p.fits, p.min_gpus) == (fits, min_gpus)


def test_unknown_size_always_fits(classes):
    p = fit.fit(ModelSpec(source="hf://a/b", format="onnx"), classes["l4"].spec, 1)
    assert p.fits and p.weights_gib is None


def test_planning_never_divides_by_zero(classes):
    """model.parameters 0B is refused by the API; a plan of a zero count (as a model built without
    validation could hold) still answers instead of raising ZeroDivisionError."""
    zero = ModelSpec.model_construct(source="hf://a/b", format="onnx", parameters="0B", precision="fp16")
    p = fit.fit(zero, classes["h100"].spec, 1)
    assert p.fits and p.weights_gib == 0 and p.decode_tokens_per_s_bound is None
    assert fit.problems(zero, "h100", classes["h100"].spec, 1) == []


@pytest.mark.parametrize("params", ["0.001K", "999999999999999T", "1.5B"])
def test_extreme_parameter_counts_plan_to_finite_figures(classes, params):
    import math
    m = ModelSpec(source="hf://a/b", format="onnx", parameters=params)
    p = fit.fit(m, classes["l4"].spec, 1)
    assert math.isfinite(p.weights_gib) and p.min_gpus >= 1 and math.isfinite(p.decode_tokens_per_s_bound)


LLAMA_405B = ModelSpec(source="hf://meta-llama/Llama-3.1-405B-Instruct", format="tensorrt-llm", parameters="405B",
                       precision="bf16")


@pytest.mark.parametrize("cls, count, text, nodes, tensor, pipeline, per_gpu, kv", [
    # 405B x 2 bytes = 754.4 GiB: 47.1 GiB a GPU over 16; an H100's 80 GiB x 0.9 leaves 24.9 for the KV cache.
    ("h100", 16, "TP8xPP2 on 2 nodes", 2, 8, 2, 47.1, 24.9),
    ("h200", 16, "TP8xPP2 on 2 nodes", 2, 8, 2, 47.1, 79.8),
    ("gb200", 16, "TP4xPP4 on 4 nodes", 4, 4, 4, 47.1, 120.3),   # 4 GPUs a node
    ("h100", 8, "TP8", 1, 8, 1, 94.3, -22.3),                    # one node: the weights do not fit
])
def test_a_replica_larger_than_a_node_is_laid_out_in_whole_nodes(classes, cls, count, text, nodes, tensor, pipeline,
                                                                 per_gpu, kv):
    lay = fit.layout(LLAMA_405B, classes[cls].spec, count)
    assert (lay.text, lay.nodes, lay.tensor, lay.pipeline) == (text, nodes, tensor, pipeline)
    assert (lay.weights_per_gpu_gib, lay.kv_cache_per_gpu_gib) == (per_gpu, kv)
    assert lay.tensor * lay.pipeline == count


def test_a_layout_of_unknown_size_has_no_memory_figures(classes):
    lay = fit.layout(ModelSpec(source="hf://a/b", format="tensorrt-llm"), classes["h100"].spec, 4)
    assert (lay.text, lay.weights_per_gpu_gib, lay.kv_cache_per_gpu_gib) == ("TP4", None, None)


def _reasons(model, cls, count, classes):
    return {p.reason: p.message for p in fit.problems(model, cls, classes[cls].spec, count)}


def test_a_model_larger_than_a_node_is_told_how_many_nodes_it_needs(classes):
    found = _reasons(LLAMA_405B, "h100", 8, classes)
    assert list(found) == ["ModelDoesNotFit"]
    assert found["ModelDoesNotFit"] == (
        "405B parameters at bf16 need about 754.4 GiB for weights, but 8 x h100 leave 576.0 GiB; set gpu.count to "
        "16 (2 nodes of 8 GPUs a replica).")


def test_counts_that_span_nodes_say_why_they_cannot_run(classes):
    assert _reasons(LLAMA_405B, "h100", 12, classes)["GPUCountNotWholeNodes"] == (
        "gpu.count 12 spans 2 h100 nodes of 8 GPUs but does not fill them: a replica on more than one node takes "
        "whole nodes. Use gpu.count 16 or at most 8.")
    assert _reasons(LLAMA_405B, "h100", 16, classes) == {}   # 2 nodes of 8: served as a group
    onnx = ModelSpec(source="hf://a/b", format="onnx", parameters="8B")
    assert _reasons(onnx, "l4", 8, classes) == {"MultiNodeNeedsLLMEngine": (
        "gpu.count 8 spans 2 l4 nodes of 4 GPUs; only format tensorrt-llm (TensorRT-LLM's LLM API) runs one model "
        "across nodes. Use gpu.count 4 or fewer.")}


@pytest.mark.parametrize("model_format", ["tensorrt-llm", "onnx"])
@pytest.mark.parametrize("precision", ["fp8", "nvfp4"])
def test_plan_suggests_only_precisions_admission_accepts(classes, capsys, tmp_path, model_format, precision):
    """`plan` on a class too old for the precision names others to choose: each one must be admitted
    for the format (tensorrt-llm refuses int8) and run on that class; int8 was once suggested for
    tensorrt-llm on an A100, which admission then refused."""
    import re

    import yaml

    from triton_operator import cli

    spec = tmp_path / "svc.yaml"
    spec.write_text(yaml.safe_dump({
        "apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "svc", "namespace": "ml"},
        "spec": {"model": {"source": "hf://a/b", "format": model_format, "parameters": "8B", "precision": precision},
                 "gpu": {"class": "a100-80gb"}}}))
    assert cli.main(["plan", "-f", str(spec)]) == 0
    said = re.search(r"Choose (.+), or a newer GPU class", capsys.readouterr().out)
    assert said, "plan names the precisions to choose instead"
    suggested = re.split(r", | or ", said.group(1))
    assert suggested and precision not in suggested
    assert ("int8" in suggested) == (model_format != "tensorrt-llm")
    for p in suggested:
        model = ModelSpec(source="hf://a/b", format=model_format, parameters="8B", precision=p)  # admitted
        assert not fit.problems(model, "a100-80gb", classes["a100-80gb"].spec, 1), p   # and runs there
