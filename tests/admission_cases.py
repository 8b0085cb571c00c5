"""The hostile cases of admission_cases.yaml as InferenceService documents (shared by the unit test
and hack/record-admission.py, which asks a real API server about them)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

GROUP, VERSION = "serving.triton-operator.io", "v1alpha1"
CASES = Path(__file__).resolve().parent / "admission_cases.yaml"
RECORDED = Path(__file__).resolve().parent / "admission_recorded.json"
BASE_SPEC = {"model": {"source": "hf://org/model", "format": "onnx"}, "gpu": {"class": "h100"}}
BASE_GPU_CLASS_SPEC = {"productNames": ["NVIDIA-L4"], "memoryGiB": 24, "memoryBandwidthTBps": 0.3,
                       "computeCapability": "8.9"}
PLURALS = {"InferenceService": "inferenceservices", "GPUClass": "gpuclasses"}
_FILLER = re.compile(r"@x([0-9]+)")
_CHAR_FILLER = re.compile(r"@u([0-9a-f]{4})x([0-9]+)")


def load_cases() -> list[dict[str, Any]]:
    return yaml.safe_load(CASES.read_text())


def _expand(value: Any) -> Any:
    """"@xN" in a key or value stands for N times "x", and "@uHHHHxN" for N times the character
    U+HHHH, so that long values stay readable."""
    if isinstance(value, str):
        value = _CHAR_FILLER.sub(lambda m: chr(int(m.group(1), 16)) * int(m.group(2)), value)
        return _FILLER.sub(lambda m: "x" * int(m.group(1)), value)
    if isinstance(value, dict):
        return {_expand(k): _expand(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v) for v in value]
    return value


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def case_document(case: dict[str, Any]) -> dict[str, Any]:
    kind = case.get("kind", "InferenceService")
    base = BASE_SPEC if kind == "InferenceService" else BASE_GPU_CLASS_SPEC
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": kind,
        "metadata": _merge({"name": "hostile"}, case.get("metadata") or {}),
        "spec": _expand(_merge(base, case.get("spec") or {})),
    }
