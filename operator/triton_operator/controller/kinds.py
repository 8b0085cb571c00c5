"""The operator's own kinds (its CRDs) in the API, next to the built-in ones `kube.client` knows;
`OWN_KINDS` is what the operator's client may apply beyond those."""

from __future__ import annotations

from ..api import API_VERSION
from ..kube.kinds import Kind

INFERENCE_SERVICE = Kind(API_VERSION, "InferenceService", "inferenceservices")
GPU_CLASS = Kind(API_VERSION, "GPUClass", "gpuclasses", namespaced=False)
OWN_KINDS = (INFERENCE_SERVICE, GPU_CLASS)
