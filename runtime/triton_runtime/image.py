"""What the serving image holds and where: the layout of NGC's tritonserver:25.01-trtllm-python-py3
(Triton server v2.54.0, tensorrtllm_backend v0.17.0, TensorRT-LLM 0.17.0), read from the upstream
sources at those tags. Every constant names the file it mirrors."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

# TensorRT-LLM's converters (convert_checkpoint.py per architecture, quantization/quantize.py).
# triton-inference-server/tensorrtllm_backend v0.17.0, dockerfile/Dockerfile.triton.trt_llm_backend:
# `WORKDIR /app` then `COPY tensorrt_llm/examples examples`; its README builds from
# `cd /app/examples/gpt` and fills templates with /app/tools/fill_template.py.
DEFAULT_EXAMPLES_DIR = "/app/examples"
EXAMPLES_ENV = "TRTLLM_EXAMPLES_DIR"  # an override for images laid out otherwise

# The distribution whose version names the engine in the cache key. Read from its metadata, never
# by importing it: `import tensorrt_llm` loads CUDA plugins and needs libcuda.so.1, which the NVIDIA
# container runtime injects only into containers that were given a GPU (the make-repository init
# container has none).
TRTLLM_DISTRIBUTION = "tensorrt_llm"

# The image's unprivileged user (uid 1000) is created without a home directory: Triton server
# v2.54.0 build.py, dockerfile_prepare_container_linux(): `useradd $TRITON_SERVER_USER` (no -m;
# triton-inference-server/server#7015). quantize.py calibrates with datasets.load_dataset() into
# HF_DATASETS_CACHE, transformers and huggingface_hub cache into HF_HOME, torch JIT extensions go
# to TORCH_EXTENSIONS_DIR: all default under $HOME. The operator sets these to a mounted, writable
# folder; `triton-runtime doctor` checks that each is writable.
def cache_environment(home: str) -> dict[str, str]:
    """The variables that place every per-user cache under `home` (ordered: HOME first)."""
    return {
        "HOME": home,
        "XDG_CACHE_HOME": f"{home}/.cache",
        "HF_HOME": f"{home}/.cache/huggingface",
        "HF_DATASETS_CACHE": f"{home}/.cache/huggingface/datasets",
        "TORCH_EXTENSIONS_DIR": f"{home}/.cache/torch_extensions",
    }


CACHE_VARIABLES = tuple(cache_environment("/"))


def examples_dir(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get(EXAMPLES_ENV) or DEFAULT_EXAMPLES_DIR)


def trtllm_version() -> str | None:
    """The installed TensorRT-LLM version, or None when it is not installed."""
    try:
        return metadata.version(TRTLLM_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
