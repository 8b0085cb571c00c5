"""What containers of the stock image and of triton-runtime need beyond their arguments (pure):
a writable home, and the preparation Job's own resources.

NVIDIA's images run as uid 1000, which has no home directory (Triton's build.py runs `useradd`
without -m), yet Model Optimizer's calibration (datasets), huggingface_hub, transformers, torch
and TensorRT-LLM write caches under $HOME. Every such container therefore gets HOME and the cache
variables pointed at a mounted, writable folder: the scratch volume in preparation Jobs (the
calibration download counts against its size), a small emptyDir in serving pods.
"""

from __future__ import annotations

import math
from typing import Any

from ..api import ContainerResources, InferenceService
from ..quantity import within_limits

# Triton's NGC images run as the unprivileged user triton-server (uid 1000).
TRITON_UID = 1000
# triton-runtime's exit codes that retrying cannot fix: 2 a request it cannot do, 3 a pod the
# doctor found unfit (runtime/triton_runtime/cli.py EXIT_SPEC, doctor.py PROBLEMS_EXIT).
NO_RETRY_EXIT_CODES = [2, 3]
SERVING_HOME = "/home/triton-server"
SERVING_HOME_SIZE = "2Gi"       # tokenizers and the Python backend write little
SCRATCH_ROOT = "/scratch"
BUILD_HOME = f"{SCRATCH_ROOT}/home"
PROGRAM = "triton-runtime"      # container args start with it: the image's entrypoint stays in place

# The preparation Job's defaults (documented on spec.engine.buildResources):
SOURCE_BYTES_PER_PARAMETER = 2  # Hugging Face LLM checkpoints are 16-bit
HOST_MEMORY_HEADROOM = 1.25     # the checkpoint once in host memory while quantizing, plus a quarter
MIN_BUILD_MEMORY_GI = 16
UNKNOWN_SIZE_MEMORY = "32Gi"
SCRATCH_HEADROOM = 1.2
SCRATCH_EXTRA_GI = 10           # calibration set, huggingface caches, logs


def cache_environment(home: str) -> list[dict[str, str]]:
    """HOME and every per-user cache under it. Mirrors runtime/triton_runtime/image.py
    cache_environment (a test holds them equal): the doctor checks these very variables."""
    return [
        {"name": "HOME", "value": home},
        {"name": "XDG_CACHE_HOME", "value": f"{home}/.cache"},
        {"name": "HF_HOME", "value": f"{home}/.cache/huggingface"},
        {"name": "HF_DATASETS_CACHE", "value": f"{home}/.cache/huggingface/datasets"},
        {"name": "TORCH_EXTENSIONS_DIR", "value": f"{home}/.cache/torch_extensions"},
    ]


def merge_env(ours: list[dict[str, Any]], users: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours, then the user's; a user's variable of the same name replaces ours (an env list with a
    name twice is refused by server-side apply)."""
    theirs = {e["name"] for e in users}
    return [e for e in ours if e["name"] not in theirs] + users


def _gi(n_bytes: float) -> str:
    return f"{math.ceil(n_bytes / 1024**3)}Gi"


def scratch_size(isvc: InferenceService) -> str | None:
    """The preparation's scratch need: the 16-bit download, a fifth on top, and room for the
    calibration set and caches (the quantized checkpoint is written into the cache). None when
    the model size is unknown."""
    params = isvc.spec.model.parameter_count()
    if params is None:
        return None
    return _gi(params * SOURCE_BYTES_PER_PARAMETER * SCRATCH_HEADROOM + SCRATCH_EXTRA_GI * 1024**3)


def build_resources(isvc: InferenceService) -> dict[str, Any]:
    """Requests of the preparation container (GPUs added by the caller): from the model size and
    the GPU count, each key overridable in spec.engine.buildResources; limits only where set.
    The serving resources never apply: a quantization holds a whole checkpoint in host memory,
    serving does not."""
    params = isvc.spec.model.parameter_count()
    count = isvc.spec.gpu.count
    if params is None:
        memory = UNKNOWN_SIZE_MEMORY
    else:
        gib = params * SOURCE_BYTES_PER_PARAMETER * HOST_MEMORY_HEADROOM / 1024**3
        memory = f"{max(MIN_BUILD_MEMORY_GI, math.ceil(gib))}Gi"
    requests: dict[str, str] = {"cpu": str(2 + 2 * count), "memory": memory}
    scratch = scratch_size(isvc)
    if scratch:
        requests["ephemeral-storage"] = scratch
    user: ContainerResources | None = isvc.spec.engine.build_resources if isvc.spec.engine else None
    limits = (user.limits if user else None) or {}
    return {"requests": {**within_limits(requests, limits), **((user.requests if user else None) or {})},
            "limits": dict(limits)}
