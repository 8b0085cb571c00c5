"""The names and labels of what is rendered for one InferenceService: the model Triton serves, each
class's Deployment, the labels every child carries, and the controller reference."""

from __future__ import annotations

from typing import Any

from ..api import API_VERSION, InferenceService
from ..api.serving import INFERENCE_POOL_ENGINE
from ..labels import LABEL_ENGINE_TYPE, LABEL_SERVICE, MANAGED_BY
from . import llm


def engine_type_label(isvc: InferenceService) -> dict[str, str]:
    """The serving pods' engine label when an InferencePool selects them (its endpoint picker reads
    their metrics by the names of that engine, which the llm model exports), else none."""
    routing = isvc.spec.routing
    return {LABEL_ENGINE_TYPE: INFERENCE_POOL_ENGINE} if routing is not None and routing.inference_pool else {}


def model_name(isvc: InferenceService) -> str:
    """The model Triton serves and reports metrics for (the composing model for TRT-LLM)."""
    m = isvc.spec.model
    if m.name:
        return m.name
    return llm.LLM_MODEL if m.format == "tensorrt-llm" else isvc.name


def labels_for(isvc: InferenceService, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "triton",
        "app.kubernetes.io/instance": isvc.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": isvc.name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_SERVICE: isvc.name,
    }


SPILL_INFIX = "-spill-"


def deployment_name(isvc_name: str, gpu_class: str, preferred: str) -> str:
    """The preferred class keeps the service's own name (so an upgrade restarts nothing); a
    spill-over class gets `<name>-spill-<class>`, stable for as long as it is used."""
    return isvc_name if gpu_class == preferred else f"{isvc_name}{SPILL_INFIX}{gpu_class}"


def owner_reference(isvc: InferenceService) -> dict[str, Any] | None:
    """The controller reference; None offline, where the object has no uid yet."""
    if not isvc.metadata.get("uid"):
        return None
    return {
        "apiVersion": API_VERSION, "kind": "InferenceService", "name": isvc.name,
        "uid": isvc.metadata["uid"], "controller": True, "blockOwnerDeletion": True,
    }
