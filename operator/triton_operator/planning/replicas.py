"""How many serving replicas a service wants before placement: spec.replicas, or with autoscaling the
autoscaler's last decision (else the running count, else minReplicas), within its bounds."""

from __future__ import annotations

from ..api import InferenceService


def desired_replicas(isvc: InferenceService, current: int | None = None) -> int:
    """spec.replicas; with autoscaling, the autoscaler's last decision, else the running count
    (else minReplicas), clamped to [minReplicas, maxReplicas]."""
    a = isvc.spec.autoscaling
    if a is None:
        return isvc.spec.replicas
    decided = isvc.status.autoscaling.desired_replicas if isvc.status and isvc.status.autoscaling else None
    base = decided if decided is not None else (current if current is not None else a.min_replicas)
    return max(a.min_replicas, min(a.max_replicas, base))
