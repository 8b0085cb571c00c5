"""The Triton model repository for in-flight batching with TensorRT-LLM, as tensorrtllm_backend's
all_models/inflight_batcher_llm lays it out: ensemble = preprocessing -> tensorrt_llm ->
postprocessing. Configs are text protobuf (Triton's ModelConfig); the tests parse each one.

Tensor and parameter names, types and the ensemble's wiring are a subset of
triton-inference-server/tensorrtllm_backend v0.17.0 all_models/inflight_batcher_llm/
{ensemble,preprocessing,tensorrt_llm,postprocessing}/config.pbtxt, so clients written for the
upstream ensemble (text_input, max_tokens, stream, end_id, pad_id, temperature, top_k, top_p,
exclude_input_in_output -> text_output) work unchanged."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path


@dataclass(frozen=True)
class RepositorySpec:
    engine_dir: str
    tokenizer_dir: str
    max_batch_size: int = 64
    decoupled: bool = False          # True for token streaming (gRPC stream / generate_stream)
    kv_cache_free_gpu_mem_fraction: float = 0.9
    enable_kv_cache_reuse: bool = True
    batch_scheduler_policy: str = "max_utilization"
    max_queue_delay_microseconds: int = 0
    # Return only the generated tokens, not the prompt echoed before them. The backend reads this
    # parameter as the default (inflight_batcher_llm/src/model_instance_state.cc: false when unset);
    # a request's exclude_input_in_output input overrides it.
    exclude_input_in_output: bool = True


def _param(key: str, value: object) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return f'parameters: {{ key: "{key}" value: {{ string_value: "{text}" }} }}'


def _tensor(name: str, dtype: str, dims: str, optional: bool = False, scalar: bool = False,
            ragged: bool = False) -> str:
    extra = " reshape: { shape: [ ] }" if scalar else ""
    extra += " optional: true" if optional else ""
    extra += " allow_ragged_batch: true" if ragged else ""
    return f'  {{ name: "{name}" data_type: {dtype} dims: [ {dims} ]{extra} }}'


def _io(kind: str, tensors: list[str]) -> str:
    return f"{kind} [\n" + ",\n".join(tensors) + "\n]"


def tensorrt_llm_config(spec: RepositorySpec) -> str:
    inputs = [
        # Prompts of different lengths batch without padding (upstream: allow_ragged_batch: true).
        _tensor("input_ids", "TYPE_INT32", "-1", ragged=True),
        _tensor("input_lengths", "TYPE_INT32", "1", scalar=True),
        _tensor("request_output_len", "TYPE_INT32", "1", scalar=True),
        # Without end_id the executor never stops at EOS and always generates request_output_len.
        _tensor("end_id", "TYPE_INT32", "1", optional=True, scalar=True),
        _tensor("pad_id", "TYPE_INT32", "1", optional=True, scalar=True),
        _tensor("streaming", "TYPE_BOOL", "1", optional=True, scalar=True),
        _tensor("exclude_input_in_output", "TYPE_BOOL", "1", optional=True, scalar=True),
        _tensor("temperature", "TYPE_FP32", "1", optional=True, scalar=True),
        _tensor("runtime_top_k", "TYPE_INT32", "1", optional=True, scalar=True),
        _tensor("runtime_top_p", "TYPE_FP32", "1", optional=True, scalar=True),
    ]
    outputs = [_tensor("output_ids", "TYPE_INT32", "-1, -1"), _tensor("sequence_length", "TYPE_INT32", "-1")]
    return "\n".join([
        'name: "tensorrt_llm"',
        'backend: "tensorrtllm"',
        f"max_batch_size: {spec.max_batch_size}",
        f"model_transaction_policy {{ decoupled: {str(spec.decoupled).lower()} }}",
        f"dynamic_batching {{ preferred_batch_size: [ {spec.max_batch_size} ] "
        f"max_queue_delay_microseconds: {spec.max_queue_delay_microseconds} }}",
        _io("input", inputs),
        _io("output", outputs),
        "instance_group [ { count: 1 kind: KIND_CPU } ]",
        _param("gpt_model_type", "inflight_fused_batching"),
        _param("gpt_model_path", spec.engine_dir),
        _param("batch_scheduler_policy", spec.batch_scheduler_policy),
        _param("kv_cache_free_gpu_mem_fraction", spec.kv_cache_free_gpu_mem_fraction),
        _param("enable_kv_cache_reuse", spec.enable_kv_cache_reuse),
        _param("exclude_input_in_output", spec.exclude_input_in_output),
        _param("max_beam_width", 1),
        "",
    ])


def _tokenizer_model(name: str, spec: RepositorySpec, inputs: list[str], outputs: list[str]) -> str:
    """A Python-backend model that loads the checkpoint's tokenizer (pre- and postprocessing)."""
    return "\n".join([
        f'name: "{name}"',
        'backend: "python"',
        f"max_batch_size: {spec.max_batch_size}",
        _io("input", inputs),
        _io("output", outputs),
        "instance_group [ { count: 1 kind: KIND_CPU } ]",
        _param("tokenizer_dir", spec.tokenizer_dir),
        "",
    ])


def preprocessing_config(spec: RepositorySpec) -> str:
    return _tokenizer_model(
        "preprocessing", spec,
        [_tensor("QUERY", "TYPE_STRING", "1"), _tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", "1"),
         _tensor("END_ID", "TYPE_INT32", "1", optional=True), _tensor("PAD_ID", "TYPE_INT32", "1", optional=True)],
        [_tensor("INPUT_ID", "TYPE_INT32", "-1"), _tensor("REQUEST_INPUT_LEN", "TYPE_INT32", "1"),
         _tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", "1"),
         _tensor("OUT_END_ID", "TYPE_INT32", "1"), _tensor("OUT_PAD_ID", "TYPE_INT32", "1")])


def postprocessing_config(spec: RepositorySpec) -> str:
    return _tokenizer_model(
        "postprocessing", spec,
        [_tensor("TOKENS_BATCH", "TYPE_INT32", "-1, -1"), _tensor("SEQUENCE_LENGTH", "TYPE_INT32", "-1")],
        [_tensor("OUTPUT", "TYPE_STRING", "-1")])


# The ensemble's own inputs (all but text_input and max_tokens optional), as upstream names them.
ENSEMBLE_INPUTS = [
    _tensor("text_input", "TYPE_STRING", "1"),
    _tensor("max_tokens", "TYPE_INT32", "1"),
    _tensor("end_id", "TYPE_INT32", "1", optional=True),
    _tensor("pad_id", "TYPE_INT32", "1", optional=True),
    _tensor("stream", "TYPE_BOOL", "1", optional=True),
    _tensor("exclude_input_in_output", "TYPE_BOOL", "1", optional=True),
    _tensor("temperature", "TYPE_FP32", "1", optional=True),
    _tensor("top_k", "TYPE_INT32", "1", optional=True),
    _tensor("top_p", "TYPE_FP32", "1", optional=True),
]

STEPS = [
    ("preprocessing",
     {"QUERY": "text_input", "REQUEST_OUTPUT_LEN": "max_tokens", "END_ID": "end_id", "PAD_ID": "pad_id"},
     {"INPUT_ID": "_INPUT_ID", "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
      "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
      "OUT_END_ID": "_PREPROCESSOR_END_ID", "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID"}),
    ("tensorrt_llm",
     {"input_ids": "_INPUT_ID", "input_lengths": "_REQUEST_INPUT_LEN",
      "request_output_len": "_REQUEST_OUTPUT_LEN",
      "end_id": "_PREPROCESSOR_END_ID", "pad_id": "_PREPROCESSOR_PAD_ID",
      "streaming": "stream", "exclude_input_in_output": "exclude_input_in_output",
      "temperature": "temperature", "runtime_top_k": "top_k", "runtime_top_p": "top_p"},
     {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH"}),
    ("postprocessing", {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
     {"OUTPUT": "text_output"}),
]


def ensemble_config(spec: RepositorySpec) -> str:
    steps = []
    for model, inputs, outputs in STEPS:
        maps = [f'      input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
        maps += [f'      output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
        steps.append(f'    {{\n      model_name: "{model}"\n      model_version: -1\n' + "\n".join(maps) + "\n    }")
    return "\n".join([
        'name: "ensemble"',
        'platform: "ensemble"',
        f"max_batch_size: {spec.max_batch_size}",
        _io("input", ENSEMBLE_INPUTS),
        _io("output", [_tensor("text_output", "TYPE_STRING", "-1")]),
        "ensemble_scheduling {\n  step [\n" + ",\n".join(steps) + "\n  ]\n}",
        "",
    ])


def configs(spec: RepositorySpec) -> dict[str, str]:
    return {
        "ensemble": ensemble_config(spec),
        "preprocessing": preprocessing_config(spec),
        "tensorrt_llm": tensorrt_llm_config(spec),
        "postprocessing": postprocessing_config(spec),
    }


def write(spec: RepositorySpec, repository: Path) -> list[Path]:
    """Write the four models; the Python ones get the tokenizer models shipped in this package."""
    written = []
    for name, text in configs(spec).items():
        model_dir = repository / name
        (model_dir / "1").mkdir(parents=True, exist_ok=True)
        (model_dir / "config.pbtxt").write_text(text)
        written.append(model_dir / "config.pbtxt")
        if name in ("preprocessing", "postprocessing"):
            source = resources.files("triton_runtime").joinpath(f"models/{name}.py")
            with resources.as_file(source) as path:
                shutil.copyfile(path, model_dir / "1" / "model.py")
    return written
