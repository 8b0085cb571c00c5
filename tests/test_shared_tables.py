"""The tables the operator and the runtime must agree on, held equal.

Neither side can import the other: the operator's virtualenv (and image environment) does not
install triton_runtime, which needs other versions of shared dependencies, and the runtime is
copied alone into NVIDIA's image, where triton_operator is not. So each table is written once per
distribution, each names where the other is, and this module pins them equal. (The llm model's
prefix-key bound is pinned beside its routing, in test_gateway_kv_events.)
"""

from __future__ import annotations

from typing import get_args

from hypothesis import given, strategies as st

from triton_operator.api import CALIBRATED_PRECISIONS
from triton_operator import quantity
from triton_operator.api.model import BYTES_PER_PARAMETER, Precision
from triton_operator.gateway import openai_schema, routing, translate
from triton_operator.render import runtime as rendered
from triton_operator.settings import Settings
from triton_runtime import doctor, image, prepare
from triton_runtime import quantity as runtime_quantity
from triton_runtime.serving import contract


def test_a_precision_takes_the_same_bytes_for_the_planner_and_the_doctor():
    """The planner sizes GPU memory with them, the doctor the prepared checkpoint in the cache."""
    assert doctor.BYTES_PER_PARAMETER == {p: BYTES_PER_PARAMETER[p] for p in doctor.BYTES_PER_PARAMETER}
    assert doctor.SOURCE_BYTES_PER_PARAMETER == rendered.SOURCE_BYTES_PER_PARAMETER


def test_int4_awq_counts_its_group_scales():
    """4-bit weights and one 16-bit scale per group of 128: 4.125 bits."""
    assert BYTES_PER_PARAMETER["int4-awq"] == doctor.BYTES_PER_PARAMETER["int4-awq"] == (4 + 16 / 128) / 8
    assert BYTES_PER_PARAMETER["nvfp4"] == (4 + 8 / 16) / 8


def test_the_runtime_prepares_every_precision_the_api_admits_for_tensorrt_llm():
    """Every precision but int8, which the API refuses for tensorrt-llm; and the same ones quantized."""
    assert set(prepare.PRECISIONS) == set(get_args(Precision)) - {"int8"} == set(doctor.BYTES_PER_PARAMETER)
    assert set(prepare.QUANTIZED) == set(CALIBRATED_PRECISIONS)


def test_the_operator_defaults_to_the_image_the_runtime_checks():
    settings = Settings()
    assert (settings.llm_image, settings.trtllm_version, settings.min_driver) == (
        image.IMAGE, image.TRTLLM_VERSION, image.MIN_DRIVER)


def test_the_gateway_reads_the_llm_models_contract():
    assert (openai_schema.MAX_N, openai_schema.MAX_TOP_LOGPROBS) == (contract.MAX_N, contract.MAX_TOP_LOGPROBS)
    assert translate.MODEL_ERROR_TAG == contract.ERROR_TAG
    assert routing.LLM_MODEL == contract.MODEL_NAME


def test_one_quantity_grammar():
    assert runtime_quantity.QUANTITY == quantity.QUANTITY


@given(st.from_regex(quantity.QUANTITY, fullmatch=True).filter(lambda q: len(q) <= quantity.QUANTITY_MAX_LENGTH))
def test_the_runtime_reads_a_size_as_the_operator_renders_it(text):
    """--scratch-size is the preparation's ephemeral-storage request: any quantity the CRD admits."""
    assert runtime_quantity.parse_quantity(text) == quantity.parse_quantity(text)
    assert runtime_quantity.quantity_bytes(text) == int(quantity.parse_quantity(text))
