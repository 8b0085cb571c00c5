"""TensorRT-LLM command lines from an EngineSpec (pure): checkpoint conversion or quantization,
then trtllm-build. Flags follow TensorRT-LLM's examples (convert_checkpoint.py, quantize.py)."""

from __future__ import annotations

from pathlib import Path

from .spec import EngineSpec, SpecError

# Hugging Face config.json model_type -> the TensorRT-LLM examples folder holding its converter.
ARCHITECTURES = {
    "llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen", "qwen": "qwen",
    "gemma": "gemma", "gemma2": "gemma", "phi3": "phi", "phi": "phi", "falcon": "falcon",
    "gpt2": "gpt", "gptj": "gptj", "mpt": "mpt", "baichuan": "baichuan", "chatglm": "chatglm",
}
DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# quantize.py handles these; fp8 also quantizes the KV cache.
QFORMAT = {"fp8": ["--qformat", "fp8", "--kv_cache_dtype", "fp8"],
           "int4-awq": ["--qformat", "int4_awq", "--awq_block_size", "128"]}


def architecture(model_type: str) -> str:
    try:
        return ARCHITECTURES[model_type]
    except KeyError:
        known = ", ".join(sorted(ARCHITECTURES))
        raise SpecError(f"model_type {model_type!r} has no TensorRT-LLM converter here (known: {known})") from None


def checkpoint_command(spec: EngineSpec, model_type: str, model_dir: Path, out_dir: Path,
                       examples_dir: Path, python: str = "python3") -> list[str]:
    """The command that turns a Hugging Face checkpoint into a TensorRT-LLM checkpoint."""
    common = ["--model_dir", str(model_dir), "--output_dir", str(out_dir),
              "--tp_size", str(spec.tensor_parallelism), "--pp_size", str(spec.pipeline_parallelism)]
    if spec.precision in QFORMAT:
        return [python, str(examples_dir / "quantization" / "quantize.py"), *common, "--dtype", "float16",
                *QFORMAT[spec.precision], "--calib_size", "512"]
    converter = str(examples_dir / architecture(model_type) / "convert_checkpoint.py")
    if spec.precision == "int8":
        return [python, converter, *common, "--dtype", "float16",
                "--use_weight_only", "--weight_only_precision", "int8"]
    return [python, converter, *common, "--dtype", DTYPE[spec.precision]]


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
