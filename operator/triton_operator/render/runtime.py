"""What containers of the runtime image need beyond their arguments (pure): a writable home, the
doctor that runs first, and the engine-build Job's own resources.

The runtime image is NGC's tritonserver:25.01-trtllm-python-py3 plus triton-runtime (runtime/).
Its user uid 1000 has no home directory (Triton server v2.54.0 build.py runs `useradd` without
-m), yet quantize.py's calibration (datasets), huggingface_hub, transformers and torch write
caches under $HOME. Every runtime container therefore gets HOME and the cache variables pointed
at a mounted, writable folder: the scratch volume in build Jobs (the calibration download counts
against its size), a small emptyDir in serving pods.
"""

from __future__ import annotations

import math
from typing import Any

from ..api import BYTES_PER_PARAMETER, ContainerResources, InferenceService
from ..quantity import within_limits

SERVING_HOME = "/home/triton-server"
SERVING_HOME_SIZE = "2Gi"       # tokenizers and the Python backend write little
SCRATCH_ROOT = "/scratch"
BUILD_HOME = f"{SCRATCH_ROOT}/home"
PROGRAM = "triton-runtime"      # container args start with it: the image's entrypoint stays in place

# The build Job's defaults (documented on spec.engine.buildResources):
SOURCE_BYTES_PER_PARAMETER = 2  # Hugging Face LLM checkpoints are 16-bit
HOST_MEMORY_HEADROOM = 1.25     # the checkpoint once in host memory while converting, plus a quarter
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
    """The build's scratch need: the 16-bit download plus the checkpoint converted to the target
    precision, a fifth on top, and room for the calibration set and caches. None when the model
    size is unknown."""
    m = isvc.spec.model
    params = m.parameter_count()
    if params is None:
        return None
    data = params * (SOURCE_BYTES_PER_PARAMETER + BYTES_PER_PARAMETER[m.precision])
    return _gi(data * SCRATCH_HEADROOM + SCRATCH_EXTRA_GI * 1024**3)


def build_resources(isvc: InferenceService) -> dict[str, Any]:
    """Requests of the engine-build container (GPUs added by the caller): from the model size and
    the GPU count, each key overridable in spec.engine.buildResources; limits only where set.
    The serving resources never apply: a build holds a whole checkpoint in host memory, serving
    does not."""
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


def doctor_args(mode: str, engine_args: list[str], gpus: int, scratch: str | None = None,
                scratch_size_limit: str | None = None) -> list[str]:
    args = [PROGRAM, "doctor", "--for", mode, *engine_args, "--gpus", str(gpus)]
    if scratch:
        args += ["--scratch", scratch]
    if scratch_size_limit:
        args += ["--scratch-size", scratch_size_limit]
    return args
