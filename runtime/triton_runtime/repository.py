"""The Triton model repository an LLM service serves (writes files; the content is decided by pure
functions).

    <repository>/llm/config.pbtxt        contract.config_pbtxt(): Python backend, decoupled
    <repository>/llm/1/model.py          a loader: puts the package copy beside it on the path
    <repository>/llm/1/triton_runtime/   this package's serving code, copied (the stock NVIDIA image
                                         does not have it; the init container does)
    <repository>/llm/1/model.yaml        the engine, the model folder, the LLM API arguments, the
                                         chat template and stop tokens (below)

model.yaml keys: `engine` (trtllm | llamacpp), `model` (the prepared checkpoint folder, or a GGUF
file), `llm_args` (for trtllm: arguments of TensorRT-LLM's `LLM(...)`, i.e. TorchLlmArgs), `llamacpp`
(n_ctx, n_threads, prefix_cache_bytes), `chat_template`, `bos_token`, `eos_token`, `stop_token_ids`,
`default_max_tokens`, `max_tokens_limit`.

The chat template and stop tokens come from the checkpoint (tokenizer_config.json's chat_template
or chat_template.jinja; bos/eos tokens from tokenizer_config.json; eos_token_id, an int or a list,
from generation_config.json) unless the service gives its own template (spec.openai.chatTemplate).
For a GGUF file the engine reads them from the file's metadata.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .serving import contract

LOADER = '''"""Written by `triton-runtime make-repository`: the LLM model of triton-operator (its source is
the triton_runtime package copied beside this file)."""
import os
import site
import sys

for _dir in {site_dirs!r}:
    site.addsitedir(_dir)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from triton_runtime.serving.triton_model import TritonPythonModel  # noqa: E402,F401
'''

# The LLM API arguments set for every service (TorchLlmArgs; nvidia.github.io/TensorRT-LLM/1.2.1/
# llm-api/reference.html): iteration statistics on (LLM.get_stats, which the model turns into its
# queue and KV-cache metrics), and a guided-decoding backend so that response_format (JSON) can be
# honoured. (`backend` is left out: tensorrt_llm.LLM is the PyTorch backend, and the argument is
# deprecated.)
KV_EVENT_BUFFER = 16384   # KV cache events the engine keeps until they are read (read every half second)
BASE_LLM_ARGS: dict[str, Any] = {
    "enable_iter_perf_stats": True,
    "guided_decoding_backend": "xgrammar",
}


@dataclass(frozen=True)
class Spec:
    engine: str                          # trtllm | llamacpp
    model: str                           # the prepared checkpoint folder, or a GGUF file
    tensor_parallelism: int = 1
    pipeline_parallelism: int = 1        # > 1: one stage a node, across nodes (MPI, trtllm-llmapi-launch)
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    max_seq_len: int | None = None
    kv_cache_free_gpu_memory_fraction: float | None = None
    dtype: str | None = None
    default_max_tokens: int = 256
    chat_template: str | None = None     # the service's own, over the checkpoint's
    n_ctx: int = 4096                    # llamacpp
    n_threads: int | None = None         # llamacpp
    prefix_cache_bytes: int | None = None  # llamacpp: saved prompt-prefix states (0: none; None: the engine's 256 MiB)
    site_dirs: tuple[str, ...] = field(default_factory=tuple)  # extra Python paths (tests, dev)


class RepositoryError(ValueError):
    pass


def _token(value: Any) -> str:
    """A tokenizer_config token: a string or an AddedToken dict {content: ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def checkpoint_chat(folder: Path) -> dict[str, Any]:
    """Chat template, BOS/EOS tokens and stop token ids from a Hugging Face checkpoint folder."""
    out: dict[str, Any] = {}
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    template = config.get("chat_template")
    if isinstance(template, list):   # named templates: [{name, template}], "default" first choice
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text()
    if isinstance(template, str) and template.strip():
        out["chat_template"] = template
    out["bos_token"] = _token(config.get("bos_token"))
    out["eos_token"] = _token(config.get("eos_token"))
    generation = folder / "generation_config.json"
    if generation.is_file():
        eos = json.loads(generation.read_text()).get("eos_token_id")
        ids = eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else []
        out["stop_token_ids"] = [i for i in ids if isinstance(i, int)]
    return out


def model_yaml(spec: Spec) -> dict[str, Any]:
    """The model.yaml for `spec` (reads the checkpoint's tokenizer files for trtllm)."""
    doc: dict[str, Any] = {"engine": spec.engine, "model": spec.model, "default_max_tokens": spec.default_max_tokens}
    if spec.engine == "trtllm":
        args: dict[str, Any] = {**BASE_LLM_ARGS, "tensor_parallel_size": spec.tensor_parallelism}
        if spec.pipeline_parallelism > 1:
            # One stage on each node's GPUs: the LLM API maps ranks to nodes by gpus_per_node.
            args.update(pipeline_parallel_size=spec.pipeline_parallelism, gpus_per_node=spec.tensor_parallelism)
        for name in ("max_batch_size", "max_num_tokens", "max_seq_len", "dtype"):
            if getattr(spec, name) is not None:
                args[name] = getattr(spec, name)
        # Block reuse on (a shared prefix is prefilled once), and its events kept for the router
        # (KvCacheConfig.event_buffer_max_size: get_kv_cache_events reads them; serving/kv_events.py).
        args["kv_cache_config"] = {"enable_block_reuse": True, "event_buffer_max_size": KV_EVENT_BUFFER}
        if spec.kv_cache_free_gpu_memory_fraction is not None:
            args["kv_cache_config"]["free_gpu_memory_fraction"] = spec.kv_cache_free_gpu_memory_fraction
        doc["llm_args"] = args
        doc.update(checkpoint_chat(Path(spec.model)))
        if spec.max_seq_len:
            doc["max_tokens_limit"] = spec.max_seq_len
    elif spec.engine == "llamacpp":
        doc["llamacpp"] = {"n_ctx": spec.n_ctx, **({"n_threads": spec.n_threads} if spec.n_threads else {}),
                           **({"prefix_cache_bytes": spec.prefix_cache_bytes}
                              if spec.prefix_cache_bytes is not None else {})}
        doc["max_tokens_limit"] = spec.n_ctx
    else:
        raise RepositoryError(f"engine must be trtllm or llamacpp, got {spec.engine!r}")
    if spec.chat_template:
        doc["chat_template"] = spec.chat_template
    return doc


def write(spec: Spec, repository: Path) -> Path:
    """Write the llm model into `repository` (replacing an older one); its folder."""
    model = Path(spec.model)
    if not model.exists():
        raise RepositoryError(f"the model {model} does not exist: has its preparation Job finished?")
    folder = repository / contract.MODEL_NAME
    if folder.exists():
        shutil.rmtree(folder)
    version = folder / "1"
    version.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(contract.config_pbtxt())
    (version / "model.yaml").write_text(yaml.safe_dump(model_yaml(spec), sort_keys=False, allow_unicode=True))
    (version / "model.py").write_text(LOADER.format(site_dirs=list(spec.site_dirs)))
    copy_package(version)
    return folder


# Pure-Python libraries the model needs that NVIDIA's image may not have; copied beside the model
# (their compiled speed-ups, built for this Python, are left out: each falls back to pure Python).
LIBRARIES = ("yaml", "jinja2", "markupsafe")


def copy_tree(src: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))


def copy_libraries(dest: Path) -> None:
    import importlib

    for name in LIBRARIES:
        module = importlib.import_module(name)
        copy_tree(Path(module.__file__).resolve().parent, dest / name)


def copy_package(dest: Path) -> Path:
    """This package's serving code and the libraries it needs into dest (the model's version
    folder, which the loader puts first on sys.path)."""
    here = Path(__file__).resolve().parent
    target = dest / "triton_runtime"
    copy_tree(here / "serving", target / "serving")
    (target / "__init__.py").write_text('"""triton-operator\'s LLM model (a copy of triton_runtime.serving)."""\n')
    copy_libraries(dest)
    return target
