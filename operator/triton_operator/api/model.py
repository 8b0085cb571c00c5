"""The model an InferenceService serves (spec.model): where it is, its format, size and
precision, and what the planner reads of a precision (bytes per parameter, the compute capability
it needs)."""

from __future__ import annotations

import re
from typing import Literal, get_args

from pydantic import ConfigDict, Field, model_validator

from .base import Model
from .syntax import DNS_LABEL, NO_NUL_PATTERN, cel

# A Triton model name: a path segment on every Triton route, so never "." or ".." (it starts
# with a letter, digit or underscore). The gateway checks names it reads with the same rule.
TRITON_MODEL_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
TRITON_MODEL_NAME_MAX_LENGTH = 128

# Where a model is: hf://ORG/NAME, s3://BUCKET[/PATH], gs://BUCKET[/PATH] or pvc://CLAIM[/PATH], no white space.
_NO_SPACE, _NO_SPACE_OR_SLASH = r"[^ \t\n\r\f\v\x00]", r"[^/ \t\n\r\f\v\x00]"   # nor NUL: exec cannot pass it
SOURCE_PATTERN = (rf"^(hf://{_NO_SPACE_OR_SLASH}+/{_NO_SPACE}+|s3://{_NO_SPACE_OR_SLASH}+(/{_NO_SPACE}*)?|"
                  rf"gs://{_NO_SPACE_OR_SLASH}+(/{_NO_SPACE}*)?|pvc://[a-z0-9]([-a-z0-9]{{0,251}}[a-z0-9])?(/{_NO_SPACE}*)?)$")
# A positive count: some digit other than 0 before or after the decimal point.
PARAMETERS_PATTERN = r"^([0-9]*[1-9][0-9]*([.][0-9]+)?|[0-9]+[.][0-9]*[1-9][0-9]*)[KMBT]$"

ModelFormat = Literal["tensorrt-llm", "onnx", "pytorch", "tensorrt", "python", "triton"]
Precision = Literal["fp32", "fp16", "bf16", "fp8", "nvfp4", "int8", "int4-awq"]

# Bytes a served weight takes. 4-bit weights carry their block scales: NVFP4 one FP8 scale per 16
# values (4.5 bits), INT4-AWQ one 16-bit scale per group of 128 (4.125 bits: ModelOpt's INT4_AWQ
# block size; TensorRT-LLM's W4A16_AWQ weight_scale is in the activations' dtype). Layers left
# unquantized (embeddings, lm_head) stay 16-bit, which a figure per parameter leaves out. The
# runtime's doctor sizes the prepared checkpoint with the same table (tests/test_shared_tables.py).
BYTES_PER_PARAMETER: dict[str, float] = {
    "fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "nvfp4": 0.5625, "int8": 1, "int4-awq": 0.515625,
}
# FP8 kernels need Ada Lovelace or newer (L4 8.9, H100/H200 9.0); A100 (8.0) has none. NVFP4 needs
# Blackwell (B200/GB200, 10.0).
MIN_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {"fp8": (8, 9), "nvfp4": (10, 0), "bf16": (8, 0)}
# Precisions the preparation Job quantizes to with NVIDIA Model Optimizer, calibrating on sample
# text, when the checkpoint is not quantized already (runtime/triton_runtime/prepare.py).
CALIBRATED_PRECISIONS = ("fp8", "nvfp4", "int4-awq")
# Checkpoint families format tensorrt-llm refuses by name: ChatGLM/GLM-4 and Baichuan tokenizers
# are Python code in the checkpoint, which runs only with trust_remote_code, and the llm model
# always passes the LLM API trust_remote_code=False (runtime/triton_runtime/serving/trtllm.py):
# refused here rather than failing every serving pod at load. RE2 and Python agree on
# this pattern (CEL's matches() searches like re.search).
UNBUILT_LLM_FAMILIES = r"(?i)(chatglm|glm-4|baichuan)"
UNBUILT_LLM_MESSAGE = (
    "model.source names a ChatGLM/GLM-4 or Baichuan checkpoint, whose tokenizer is Python code in the "
    "checkpoint (trust_remote_code), which the operator does not run: serve it with format triton and a "
    "model repository of your own")
INT8_LLM_MESSAGE = (
    "precision int8 is not served by TensorRT-LLM's PyTorch backend (its INT8 SmoothQuant path was part of the "
    "removed engine workflow): use fp8 (compute capability 8.9+), int4-awq, or bf16")
CALIBRATION_MESSAGE = "engine.calibrationDataset applies only to precisions fp8, nvfp4 and int4-awq"


def admitted_precisions(model_format: str) -> tuple[str, ...]:
    """The precisions admission accepts for a model format, in Precision's order: every one but int8
    for tensorrt-llm (INT8_LLM_MESSAGE; the CRD's CEL rule says the same). Whatever suggests a
    precision (the planner's messages) picks from these."""
    return tuple(p for p in get_args(Precision) if not (model_format == "tensorrt-llm" and p == "int8"))
# Names Triton's HTTP API matches before its model routes (src/http_server.cc, HTTPAPIServer::Handle):
# GET /v2/models/stats answers every model's statistics, so a model called "stats" has no metadata
# route and its name would reach another API. The gateway refuses to serve such a name too.
RESERVED_MODEL_NAMES = ("stats",)
RESERVED_MODEL_MESSAGE = ("the Triton model name 'stats' is kept by Triton's HTTP API (GET /v2/models/stats "
                          "answers every model's statistics): choose another")


class ModelSpec(Model):
    """Which model to serve, where it is, and how it is stored."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel(f"self.format != 'tensorrt-llm' || !self.source.matches('{UNBUILT_LLM_FAMILIES}')",
            UNBUILT_LLM_MESSAGE, "source"),
        cel("self.format != 'tensorrt-llm' || !has(self.precision) || self.precision != 'int8'",
            INT8_LLM_MESSAGE, "precision"),
        cel(f"!has(self.name) || !(self.name in {list(RESERVED_MODEL_NAMES)})", RESERVED_MODEL_MESSAGE, "name"),
    ]})

    source: str = Field(
        ..., pattern=SOURCE_PATTERN, max_length=2048,
        description="Where the model is: hf://ORG/NAME (Hugging Face), s3://BUCKET/PATH, gs://BUCKET/PATH, or pvc://CLAIM/PATH (a PersistentVolumeClaim in the same namespace).")
    format: ModelFormat = Field(
        ..., description="What the source holds: tensorrt-llm (a Hugging Face LLM checkpoint, served by TensorRT-LLM's LLM API on its PyTorch backend), onnx, pytorch, tensorrt, python, or triton (a ready Triton model repository).")
    name: str | None = Field(
        None, pattern=TRITON_MODEL_NAME, max_length=TRITON_MODEL_NAME_MAX_LENGTH,
        description="Name of the model inside Triton, used for metrics. Defaults to 'llm' for tensorrt-llm and to the InferenceService name otherwise.")
    revision: str | None = Field(None, max_length=128, pattern=NO_NUL_PATTERN, description="Revision (branch, tag or commit) of an hf:// source. A branch or tag is resolved "
                                      "to a commit once, when the model is first prepared, and everything is downloaded "
                                      "from that commit (status.preparation[].commit); the cache keeps it until this "
                                      "field changes, so name a commit to say which one is served.")
    parameters: str | None = Field(
        None, pattern=PARAMETERS_PATTERN, max_length=16,
        description="Model size as a positive count of parameters, e.g. 8B or 70B or 350M; used to plan GPU memory.")
    precision: Precision = Field(
        "fp16", description="Numeric precision of the served weights: fp32, fp16, bf16, fp8 (compute capability 8.9+), "
                            "nvfp4 (Blackwell, 10.0+), int8 (not for tensorrt-llm) or int4-awq. For tensorrt-llm "
                            "a checkpoint not already quantized to fp8, nvfp4 or int4-awq is quantized once by "
                            "the preparation Job.")
    credentials_secret: str | None = Field(
        None, pattern=DNS_LABEL, max_length=253,
        description="Name of a Secret in this namespace whose keys become environment variables of the container that fetches the model (e.g. HF_TOKEN, AWS_ACCESS_KEY_ID). The operator never reads it.")

    @property
    def scheme(self) -> str:
        return self.source.split("://", 1)[0]

    @model_validator(mode="after")
    def _buildable(self) -> ModelSpec:
        if self.format == "tensorrt-llm" and re.search(UNBUILT_LLM_FAMILIES, self.source):
            raise ValueError(UNBUILT_LLM_MESSAGE)
        if self.precision not in admitted_precisions(self.format):
            raise ValueError(INT8_LLM_MESSAGE)
        if self.name in RESERVED_MODEL_NAMES:
            raise ValueError(RESERVED_MODEL_MESSAGE)
        return self

    def parameter_count(self) -> float | None:
        if not self.parameters:
            return None
        scale = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[self.parameters[-1]]
        return float(self.parameters[:-1]) * scale
