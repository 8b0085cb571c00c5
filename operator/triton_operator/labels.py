"""Label and annotation names the operator puts on what it creates, and selects by."""

from __future__ import annotations

LABEL_SERVICE = "serving.triton-operator.io/inferenceservice"
LABEL_GPU_CLASS = "serving.triton-operator.io/gpu-class"
MANAGED_BY = "triton-operator"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# The Gateway API Inference Extension's endpoint picker reads a pod's metrics by the names of
# the engine this label names.
LABEL_ENGINE_TYPE = "inference.networking.k8s.io/engine-type"


def selector_labels(name: str) -> dict[str, str]:
    """Labels that select the serving pods of one InferenceService."""
    return {LABEL_SERVICE: name, "app.kubernetes.io/component": "server"}
