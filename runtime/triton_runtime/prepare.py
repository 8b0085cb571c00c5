"""Model preparation: what replaced the engine build when TensorRT-LLM moved to its PyTorch
backend (the LLM API loads Hugging Face checkpoints directly; TensorRT-LLM's
docs/source/legacy/tensorrt-backend-removal.md: "no engine-build step").

Once per (source, revision, precision, TensorRT-LLM version), in a Job:
1. fetch only what the checkpoint needs: its config and tokenizer files first, then the weight
   shards its index names (model.safetensors.index.json's weight_map), or the top-level
   safetensors when it has no index; never `original/` or a second copy of the weights;
2. quantize when the precision asks for it and the checkpoint is not quantized already, with
   NVIDIA Model Optimizer (`modelopt.torch.quantization.quantize` with FP8_DEFAULT_CFG,
   NVFP4_DEFAULT_CFG or INT4_AWQ_CFG, then `modelopt.torch.export.export_hf_checkpoint`, which
   writes hf_quant_config.json that TensorRT-LLM reads); a checkpoint already quantized to the
   asked precision is used as it is, one quantized otherwise is refused, naming what it holds;
3. publish the folder atomically in the shared cache under the key (cache.py); serving pods
   mount it read-only and download nothing.

`action_for` (pure) decides what a checkpoint needs; `run` does it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import cache
from .fetch import CHECKPOINT_SIDE_FILES, FetchError, fetch, resolve

PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "nvfp4", "int4-awq")
QUANTIZED = ("fp8", "nvfp4", "int4-awq")
# What ModelOpt's unified checkpoints (hf_quant_config.json quantization.quant_algo) and Hugging
# Face quantization_config (config.json) call each precision here.
QUANT_ALGOS = {"FP8": "fp8", "FP8_PB_WO": "fp8", "NVFP4": "nvfp4", "W4A16_AWQ": "int4-awq", "INT4_AWQ": "int4-awq"}
HF_QUANT_METHODS = {"fp8": "fp8"}
# The dtype TensorRT-LLM's LLM(dtype=...) loads unquantized weights in.
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


class PrepareError(ValueError):
    """A preparation that cannot be done as asked; the message says what to change."""


@dataclass(frozen=True)
class Preparation:
    """One model preparation: the checkpoint, the precision it is served in, and the TensorRT-LLM
    version it is prepared for; `key` names the result in the model cache."""

    source: str
    precision: str
    revision: str = "main"
    trtllm_version: str = ""
    calibration_dataset: str | None = None

    def key(self) -> str:
        fields = {"source": self.source, "revision": self.revision, "precision": self.precision,
                  "trtllm_version": self.trtllm_version, "calibration": self.calibration_dataset}
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
        name = self.source.rstrip("/").rsplit("/", 1)[-1].lower()
        safe = "".join(ch if ch.isalnum() or ch in "-." else "-" for ch in name)[:40]
        return f"{safe}-{self.precision}-{digest}"


def quantized_as(checkpoint: Path) -> str | None:
    """The precision a checkpoint is quantized to (ours), None when it holds plain weights;
    PrepareError for a quantization this path cannot serve."""
    hf_quant = checkpoint / "hf_quant_config.json"
    if hf_quant.is_file():
        algo = ((json.loads(hf_quant.read_text()).get("quantization") or {}).get("quant_algo") or "")
        if algo.upper() not in QUANT_ALGOS:
            raise PrepareError(f"the checkpoint is quantized with ModelOpt algorithm {algo!r}, which this operator "
                               f"does not serve (it serves {', '.join(sorted(QUANT_ALGOS))})")
        return QUANT_ALGOS[algo.upper()]
    config = checkpoint / "config.json"
    q = (json.loads(config.read_text()).get("quantization_config") or {}) if config.is_file() else {}
    if not q:
        return None
    method = str(q.get("quant_method") or "").lower()
    if method == "modelopt" and str(q.get("quant_algo") or "").upper() in QUANT_ALGOS:
        return QUANT_ALGOS[str(q["quant_algo"]).upper()]
    if method in HF_QUANT_METHODS:
        return HF_QUANT_METHODS[method]
    raise PrepareError(f"the checkpoint is quantized with {method or 'an unknown method'!r} (config.json "
                       f"quantization_config), which TensorRT-LLM's PyTorch backend does not load here: use a "
                       f"ModelOpt checkpoint (FP8, NVFP4, INT4-AWQ) or the unquantized one with a precision to "
                       f"quantize to")


def action_for(precision: str, found: str | None) -> str:
    """What to do with a checkpoint holding `found` to serve `precision`: 'use' or 'quantize'."""
    if precision not in PRECISIONS:
        raise PrepareError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if found is None:
        return "quantize" if precision in QUANTIZED else "use"
    if found == precision:
        return "use"
    raise PrepareError(f"the checkpoint is already quantized to {found}; set model.precision: {found} (or point "
                       f"model.source at the unquantized checkpoint to quantize it to {precision})")


def weight_files(checkpoint: Path, listing: list[str]) -> list[str]:
    """The weights to download: the shards the index names, else the top-level safetensors (else
    .bin files)."""
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set((json.loads(index.read_text()).get("weight_map") or {}).values()))
        missing = [s for s in shards if s not in listing]
        if missing:
            raise PrepareError(f"model.safetensors.index.json names shards the source does not have: {missing[:3]}")
        return shards
    top = [f for f in listing if "/" not in f]
    weights = [f for f in top if f.endswith(".safetensors")] or [f for f in top if f.endswith(".bin")]
    if not weights:
        raise PrepareError("no *.safetensors or *.bin weights at the top of the checkpoint: TensorRT-LLM loads "
                           "Hugging Face transformers checkpoints")
    return sorted(weights)


def side_files(listing: list[str]) -> list[str]:
    return sorted(f for f in listing if "/" not in f and f.endswith(CHECKPOINT_SIDE_FILES))


def download(source: str, revision: str, dest: Path) -> tuple[Path, str | None]:
    """Fetch the checkpoint in two steps (its index first, then what the index names), both from
    the one commit the revision points at when the download starts (a push between the two
    steps cannot mix two versions); the folder, and that commit (None: the source has none)."""
    names: list[str] = []
    commit = resolve(source, revision)
    at = commit or revision

    def sides(files: Any) -> list[str]:
        names[:] = list(files)
        return side_files(names)

    where = fetch(source, dest, at, select=sides)
    if where != dest:   # pvc:// sources are used in place
        return where, commit
    fetch(source, dest, at, select=lambda files: weight_files(dest, list(files)))
    return dest, commit


def quantize(checkpoint: Path, precision: str, out: Path, calibration: Path | None, samples: int = 512) -> None:
    """Post-training quantization with NVIDIA Model Optimizer (needs the GPUs of the Job)."""
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer

    configs = {"fp8": mtq.FP8_DEFAULT_CFG, "nvfp4": mtq.NVFP4_DEFAULT_CFG, "int4-awq": mtq.INT4_AWQ_CFG}
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype="auto", device_map="auto")
    texts = calibration_texts(calibration, samples)

    def forward_loop(m: Any) -> None:
        for text in texts:
            batch = tokenizer(text, return_tensors="pt", truncation=True, max_length=512).to(m.device)
            m(**batch)

    with torch.inference_mode():
        mtq.quantize(model, configs[precision], forward_loop)
        export_hf_checkpoint(model, export_dir=str(out))
    tokenizer.save_pretrained(out)
    for f in checkpoint.iterdir():   # the chat template, generation config and anything else beside
        if f.is_file() and not (out / f.name).exists() and not f.name.endswith((".safetensors", ".bin")):
            shutil.copyfile(f, out / f.name)


def calibration_texts(folder: Path | None, samples: int) -> list[str]:
    """Calibration text: a datasets folder's train split (text column), else cnn_dailymail."""
    from datasets import load_dataset

    data = (load_dataset(str(folder), split="train") if folder is not None
            else load_dataset("cnn_dailymail", "3.0.0", split="train"))
    column = "text" if "text" in data.column_names else ("article" if "article" in data.column_names else None)
    if column is None:
        raise PrepareError(f"the calibration dataset has no text column (columns: {data.column_names})")
    return [row[column] for row in data.select(range(min(samples, len(data))))]


DOWNLOADED = "download.json"   # what a download step fetched, for the step that quantizes


def download_inputs(request: Preparation, dest: Path) -> tuple[Path, Path | None, str | None]:
    """Fetch the checkpoint (and the calibration set) under dest, or find them on their claims,
    with the commit the checkpoint came from; all three are also written to dest/download.json
    for a later step in another image."""
    dest.mkdir(parents=True, exist_ok=True)
    checkpoint, commit = download(request.source, request.revision, dest / "checkpoint")
    calibration = None
    # action_for() refuses a checkpoint quantized otherwise here already, before the calibration download.
    if request.calibration_dataset and action_for(request.precision, quantized_as(checkpoint)) == "quantize":
        calibration = fetch(request.calibration_dataset, dest / "calibration", repo_type="dataset")
    (dest / DOWNLOADED).write_text(json.dumps({"request": request.key(), "checkpoint": str(checkpoint),
                                               "calibration": str(calibration) if calibration else None,
                                               "commit": commit}))
    return checkpoint, calibration, commit


def downloaded_inputs(request: Preparation, dest: Path) -> tuple[Path, Path | None, str | None]:
    """What a download step left under dest for this request."""
    try:
        found = json.loads((dest / DOWNLOADED).read_text())
    except (OSError, ValueError) as e:
        raise PrepareError(f"no download of this model under {dest} ({e}): the download step has not run") from None
    if found.get("request") != request.key():
        raise PrepareError(f"the download under {dest} is of another preparation ({found.get('request')})")
    calibration = Path(found["calibration"]) if found.get("calibration") else None
    return Path(found["checkpoint"]), calibration, found.get("commit")


def run(request: Preparation, cache_dir: Path, scratch: Path | None = None, downloaded: Path | None = None) -> Path:
    """Prepare (or find) the model for `request` in the cache; its folder. With `downloaded`, the
    inputs a download step fetched there (the Job downloads in the operator's image, which has
    every scheme's client, and quantizes in NVIDIA's, which has Model Optimizer)."""
    if request.precision not in PRECISIONS:
        raise PrepareError(f"precision {request.precision!r} is not one of {', '.join(PRECISIONS)}")

    def build(out: Path) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(dir=scratch) as tmp:
            if downloaded is not None:
                checkpoint, calibration, commit = downloaded_inputs(request, downloaded)
            else:
                checkpoint, calibration, commit = download_inputs(request, Path(tmp))
            action = action_for(request.precision, quantized_as(checkpoint))
            if action == "quantize":
                quantize(checkpoint, request.precision, out, calibration)
            else:
                for f in checkpoint.iterdir():
                    if f.is_file():
                        shutil.copyfile(f, out / f.name)
        return {"source": request.source, "revision": request.revision, "commit": commit,
                "precision": request.precision, "trtllm_version": request.trtllm_version, "action": action}

    return cache.publish(cache_dir, request.key(), build)


__all__ = ["FetchError", "PrepareError", "Preparation", "action_for", "download_inputs", "downloaded_inputs",
           "quantized_as", "run", "weight_files"]
