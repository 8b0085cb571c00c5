"""Where the operator's own kinds (its CRDs) live in the API, as `kube.kinds` places the built-in
ones; `OWN_KINDS` is what the operator's client may apply beyond those. The gateway watches
InferenceServices through the same definition."""

from __future__ import annotations

from ..kube.kinds import Kind
from .base import API_VERSION

INFERENCE_SERVICE = Kind(API_VERSION, "InferenceService", "inferenceservices")
GPU_CLASS = Kind(API_VERSION, "GPUClass", "gpuclasses", namespaced=False)
OWN_KINDS = (INFERENCE_SERVICE, GPU_CLASS)
