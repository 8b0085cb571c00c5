from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from triton_operator.api import GPUClass, InferenceService

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture
def classes() -> dict[str, GPUClass]:
    return {c.name: c for c in (GPUClass.model_validate(d) for d in load(EXAMPLES / "gpuclasses.yaml"))}


BASE = {
    "apiVersion": "serving.triton-operator.io/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "demo", "namespace": "ml", "uid": "1234-abcd", "generation": 3},
    "spec": {
        "model": {"source": "hf://org/model", "format": "onnx", "parameters": "8B", "precision": "fp16"},
        "gpu": {"class": "h100", "count": 1},
        "replicas": 2,
    },
}


def isvc_doc(**spec_changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    for path, value in spec_changes.items():
        node = doc["spec"]
        keys = path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return doc


def isvc(**spec_changes: Any) -> InferenceService:
    return InferenceService.model_validate(isvc_doc(**spec_changes))
