"""Stage a non-LLM model (onnx, pytorch, tensorrt, python, or a ready Triton repository) from its
source into the model repository Triton serves."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from .fetch import FetchError, fetch

# format -> (file name Triton expects in the version folder, backend, can Triton auto-complete the
# config's inputs/outputs?)
FORMATS = {
    "onnx": ("model.onnx", "onnxruntime", True),
    "tensorrt": ("model.plan", "tensorrt", True),
    "pytorch": ("model.pt", "pytorch", False),
    "python": ("model.py", "python", False),
}
SUFFIXES = {"onnx": (".onnx",), "tensorrt": (".plan", ".engine"), "pytorch": (".pt", ".pth"), "python": (".py",)}


class StageError(RuntimeError):
    pass


def _named(config: str, name: str) -> str:
    """The config with its name set to the folder's (Triton requires them to match)."""
    if re.search(r'^\s*name\s*:', config, re.M):
        return re.sub(r'^(\s*name\s*:\s*)"[^"]*"', rf'\1"{name}"', config, count=1, flags=re.M)
    return f'name: "{name}"\n' + config


def _find(root: Path, suffixes: tuple[str, ...]) -> Path:
    found = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in suffixes)
    if len(found) != 1:
        what = "none" if not found else ", ".join(str(p.relative_to(root)) for p in found[:5])
        raise StageError(f"expected exactly one {'/'.join(suffixes)} file in the source, found {what}")
    return found[0]


def stage(source: str, fmt: str, model_name: str, repository: Path, scratch: Path,
          revision: str | None = None) -> Path:
    """Fetch and lay out the model; returns the repository folder to serve."""
    try:
        root = fetch(source, scratch, revision)
    except FetchError as e:
        raise StageError(str(e)) from None
    repository.mkdir(parents=True, exist_ok=True)
    if fmt == "triton":
        models = [p.parent for p in root.glob("*/config.pbtxt")]
        if not models:
            raise StageError(f"{source} is not a Triton model repository: no MODEL/config.pbtxt at its top")
        shutil.copytree(root, repository, dirs_exist_ok=True)
        return repository
    if fmt not in FORMATS:
        raise StageError(f"format {fmt!r} is not staged here (tensorrt-llm uses prepare and make-repository)")
    filename, backend, autocompletes = FORMATS[fmt]
    target = repository / model_name
    (target / "1").mkdir(parents=True, exist_ok=True)
    config = next(iter(sorted(root.rglob("config.pbtxt"))), None)
    if config is None and not autocompletes:
        raise StageError(f"a {fmt} model needs a config.pbtxt declaring its inputs and outputs next to "
                         f"{filename} in {source}")
    text = config.read_text() if config else f'backend: "{backend}"\n'
    (target / "config.pbtxt").write_text(_named(text, model_name))
    shutil.copyfile(_find(root, SUFFIXES[fmt]), target / "1" / filename)
    return repository
