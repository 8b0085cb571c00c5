"""Facts about NVIDIA's stock serving image that the runtime relies on.

The image is `nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3`: Triton 2.71.0, TensorRT-LLM
1.2.1, CUDA 13.1.0.036, NVIDIA driver 590.44.01 or newer, Python 3.12.3 (triton-inference-server/
server r26.08 docs/introduction/compatibility.md, the 26.07 trtllm-python-py3 row; build.py at
v2.71.0: release_version 2.71.0, triton_container_version 26.07). It is the newest release whose
TensorRT-LLM contents upstream states (26.08 has no trtllm row there), and it is past the 25.07
fixes of CVE-2025-23310/23311 and CVE-2025-23319/23320/23334.

To move the pin: read the new release's row in compatibility.md, set the chart's triton.llmImage,
triton.trtllmVersion and triton.minDriver from it (the preparation key carries the TensorRT-LLM
version, so a new version prepares again), and run the GPU smoke procedure in runtime/README.md.
"""

from __future__ import annotations

import re
from importlib import metadata

IMAGE = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
TRTLLM_VERSION = "1.2.1"
CUDA_VERSION = "13.1"
MIN_DRIVER = "590.44.01"

# The distribution whose version the preparation key carries. Read from its metadata, never by
# importing it: `import tensorrt_llm` loads CUDA and needs libcuda.so.1, which the NVIDIA container
# runtime injects only into containers that were given a GPU.
TRTLLM_DISTRIBUTION = "tensorrt_llm"


# The image's unprivileged user (uid 1000) has no home directory (Triton's build.py creates
# triton-server with `useradd` without -m; triton-inference-server/server#7015). Hugging Face,
# datasets, torch and TensorRT-LLM keep caches under $HOME: the operator points them at a mounted
# folder, and `triton-runtime doctor` checks that each is writable.
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


def trtllm_version() -> str | None:
    """The installed TensorRT-LLM version, or None when it is not installed."""
    try:
        return metadata.version(TRTLLM_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def release(text: str) -> tuple[int, int, int] | None:
    """A TensorRT-LLM version's release, major.minor.patch: what a preparation depends on. Images
    report more than the release ("1.0.3.2510" carries a build, "1.2.0rc2.post1" a pre-release
    and a post tag), so versions are compared by release, never as strings. None when `text`
    does not start with major.minor."""
    m = _RELEASE.match(text.strip())
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def same_release(installed: str, expected: str) -> bool:
    """The image's TensorRT-LLM and the one a service expects are the same release (equal
    strings when either has no release to read)."""
    a, b = release(installed), release(expected)
    return installed == expected if a is None or b is None else a == b


_RELEASE = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")
