"""Where a pod of a GPU class runs and what it reserves there: the class's node selector, affinity
and tolerations, and the container resources (the class's GPU resource, default host requests)."""

from __future__ import annotations

from typing import Any

from ..api import GPUClassSpec, InferenceService
from ..quantity import within_limits

DEFAULT_REQUESTS = {"cpu": "2", "memory": "8Gi"}


def node_scheduling(cls: GPUClassSpec) -> dict[str, Any]:
    """Node selector, affinity and tolerations that put a pod on a node of the class."""
    affinity = None
    if cls.product_names:
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": cls.product_label, "operator": "In", "values": cls.product_names}]},
        ]}}}
    return {"node_selector": cls.node_selector, "affinity": affinity,
            "tolerations": [t.wire() for t in cls.tolerations]}


def resources(isvc: InferenceService, cls: GPUClassSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """(GPU container resources, CPU-only init container resources)."""
    gpu = {cls.resource_name: str(isvc.spec.gpu.count)}
    user_res = isvc.spec.server.resources
    resources = {
        # Requests so the scheduler reserves host CPU and memory for the server; no default limits:
        # a model's host-memory peak while loading is unknown here, and a wrong limit OOM-kills it.
        "requests": {**within_limits(DEFAULT_REQUESTS, user_res.limits if user_res else None),
                     **((user_res.requests if user_res else None) or {}), **gpu},
        "limits": {**((user_res.limits if user_res else None) or {}), **gpu},
    }
    # The scheduler reserves max(init, app) per resource, so the same requests cost nothing extra.
    return resources, {"requests": {k: v for k, v in resources["requests"].items() if k not in gpu}}
