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
