"""Label and annotation names the operator puts on what it creates, and selects by."""

from __future__ import annotations

LABEL_SERVICE = "serving.triton-operator.io/inferenceservice"
LABEL_GPU_CLASS = "serving.triton-operator.io/gpu-class"
MANAGED_BY = "triton-operator"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# The Gateway API Inference Extension's endpoint picker reads a pod's metrics by the names of
# the engine this label names.
LABEL_ENGINE_TYPE = "inference.networking.k8s.io/engine-type"
# A digest of what the operator rendered for a child, on the child: a field the operator stops
# rendering (a label, a selector, a limit) changes it, where comparing the rendered fields with
# the live ones alone would find them all in place and leave the old field standing.
RENDERED_ANNOTATION = "serving.triton-operator.io/rendered"


def selector_labels(name: str) -> dict[str, str]:
    """Labels that select the serving pods of one InferenceService."""
    return {LABEL_SERVICE: name, "app.kubernetes.io/component": "server"}
