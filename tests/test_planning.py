from __future__ import annotations

import pytest

from triton_operator import planning
from triton_operator.api import ModelSpec


def test_70b_fp8_on_h100_matches_the_reference_figures(classes):
    """~70 GB of weights; decode bound 3.35 TB/s / 70 GB = ~48 tokens/s per stream."""
    p = planning.plan(ModelSpec(source="hf://a/b", format="tensorrt-llm", parameters="70B", precision="fp8"),
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
    p = planning.plan(ModelSpec(source="hf://a/b", format="onnx", parameters=params, precision=precision),
                      classes[cls].spec, count)
    assert (p.fits, p.min_gpus) == (fits, min_gpus)


def test_unknown_size_always_fits(classes):
    p = planning.plan(ModelSpec(source="hf://a/b", format="onnx"), classes["l4"].spec, 1)
    assert p.fits and p.weights_gib is None
