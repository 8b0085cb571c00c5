"""TensorRT-LLM command lines from an EngineSpec (pure): checkpoint conversion or quantization,
then trtllm-build, then the tritonserver launch.

Flags follow NVIDIA/TensorRT-LLM v0.17.0: examples/<arch>/convert_checkpoint.py (--model_dir,
--output_dir, --dtype, --tp_size, --pp_size, --use_weight_only, --weight_only_precision),
examples/quantization/quantize.py (--qformat, --kv_cache_dtype, --awq_block_size, --calib_size,
--calib_dataset) and tensorrt_llm/commands/build.py (trtllm-build); the launch mirrors
triton-inference-server/tensorrtllm_backend v0.17.0 scripts/launch_triton_server.py."""

from __future__ import annotations

from pathlib import Path

from .spec import EngineSpec, SpecError

# Hugging Face config.json model_type -> the TensorRT-LLM examples folder holding its converter.
# Only converters that take the common flags above and models whose tokenizer loads without
# trust_remote_code (the tokenizer models refuse remote code) are listed.
ARCHITECTURES = {
    "llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen",
    "phi3": "phi", "phi": "phi", "falcon": "falcon",
    "gpt2": "gpt", "gptj": "gptj", "mpt": "mpt",
}
# Refused with a reason: building them needs what this runtime does not do.
UNSUPPORTED = {
    # NVIDIA/TensorRT-LLM v0.17.0 examples/gemma/convert_checkpoint.py takes --ckpt-type hf
    # --model-dir --output-model-dir --world-size, not the common flags.
    "gemma": "its converter (examples/gemma/convert_checkpoint.py) takes other flags",
    "gemma2": "its converter (examples/gemma/convert_checkpoint.py) takes other flags",
    # Their tokenizers are Python files shipped in the checkpoint (trust_remote_code=True).
    "chatglm": "its tokenizer is remote code in the checkpoint (trust_remote_code), which the tokenizer models refuse",
    "baichuan": "its tokenizer is remote code in the checkpoint (trust_remote_code), which the tokenizer models refuse",
    "qwen": "Qwen (v1) tokenizers are remote code in the checkpoint (trust_remote_code), which the tokenizer "
            "models refuse; Qwen1.5 and later (model_type qwen2) are supported",
}
UNSUPPORTED_HINT = ("build the engine and the Triton model repository yourself (tensorrtllm_backend's "
                    "inflight_batcher_llm) and serve them with model.format triton")
DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# quantize.py handles these; fp8 also quantizes the KV cache.
QFORMAT = {"fp8": ["--qformat", "fp8", "--kv_cache_dtype", "fp8"],
           "int4-awq": ["--qformat", "int4_awq", "--awq_block_size", "128"]}
CALIBRATION_SAMPLES = 512  # quantize.py's default --calib_size, stated so the dataset size is known


def architecture(model_type: str) -> str:
    if model_type in UNSUPPORTED:
        raise SpecError(f"model_type {model_type!r} is not built here: {UNSUPPORTED[model_type]}; {UNSUPPORTED_HINT}")
    try:
        return ARCHITECTURES[model_type]
    except KeyError:
        known = ", ".join(sorted(ARCHITECTURES))
        raise SpecError(f"model_type {model_type!r} has no TensorRT-LLM converter here (known: {known})") from None


def converter(spec: EngineSpec, model_type: str, examples_dir: Path) -> Path:
    """The script that converts this checkpoint: quantize.py for fp8/int4-awq, else the
    architecture's convert_checkpoint.py."""
    if spec.precision in QFORMAT:
        architecture(model_type)  # refuse what cannot be served even if quantize.py could read it
        return examples_dir / "quantization" / "quantize.py"
    return examples_dir / architecture(model_type) / "convert_checkpoint.py"


def checkpoint_command(spec: EngineSpec, model_type: str, model_dir: Path, out_dir: Path,
                       examples_dir: Path, python: str = "python3",
                       calibration_dataset: Path | None = None) -> list[str]:
    """The command that turns a Hugging Face checkpoint into a TensorRT-LLM checkpoint.
    `calibration_dataset` is a local datasets folder (train split, text column) for quantize.py;
    without it quantize.py downloads cnn_dailymail from the Hugging Face Hub."""
    script = str(converter(spec, model_type, examples_dir))
    common = ["--model_dir", str(model_dir), "--output_dir", str(out_dir),
              "--tp_size", str(spec.tensor_parallelism), "--pp_size", str(spec.pipeline_parallelism)]
    if spec.precision in QFORMAT:
        calib = ["--calib_dataset", str(calibration_dataset)] if calibration_dataset else []
        return [python, script, *common, "--dtype", "float16", *QFORMAT[spec.precision],
                "--calib_size", str(CALIBRATION_SAMPLES), *calib]
    if spec.precision == "int8":
        return [python, script, *common, "--dtype", "float16",
                "--use_weight_only", "--weight_only_precision", "int8"]
    return [python, script, *common, "--dtype", DTYPE[spec.precision]]


def build_command(spec: EngineSpec, checkpoint_dir: Path, engine_dir: Path) -> list[str]:
    return [
        "trtllm-build",
        "--checkpoint_dir", str(checkpoint_dir),
        "--output_dir", str(engine_dir),
        "--max_batch_size", str(spec.max_batch_size),
        "--max_input_len", str(spec.max_input_len),
        "--max_seq_len", str(spec.max_seq_len),
        "--max_num_tokens", str(spec.max_num_tokens),
        "--gemm_plugin", "auto",
        "--gpt_attention_plugin", "auto",
        "--use_paged_context_fmha", "enable",
        "--kv_cache_type", "paged",
        "--workers", str(spec.tensor_parallelism * spec.pipeline_parallelism),
    ]


def serve_command(repository: Path, world_size: int, http_port: int = 8000, grpc_port: int = 8001,
                  metrics_port: int = 8002, extra: list[str] | None = None) -> list[str]:
    """tritonserver, or for tensor/pipeline parallelism one tritonserver per rank under mpirun
    (as tensorrtllm_backend's launcher does): rank 0 serves, the others only run the engine."""
    base = ["tritonserver", f"--model-repository={repository}", "--disable-auto-complete-config"]
    served = [f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
              "--strict-readiness=true", "--allow-metrics=true", "--metrics-config=summary_latencies=true",
              *(extra or [])]
    if world_size == 1:
        return [*base, *served]
    cmd = ["mpirun", "--allow-run-as-root"]
    for rank in range(world_size):
        shm = f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"
        rank_args = served if rank == 0 else ["--model-control-mode=explicit", "--load-model=tensorrt_llm",
                                              "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"]
        cmd += ["-n", "1", *base, shm, *rank_args, ":"]
    return cmd[:-1]
