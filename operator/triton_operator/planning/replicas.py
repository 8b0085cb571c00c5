"""How many serving replicas a service wants before placement: spec.replicas, or with autoscaling, until
the autoscaler has decided (the reconcile gives its decision instead), the running count (else the
last decision in status, else minReplicas), within its bounds."""

from __future__ import annotations

from ..api import InferenceService


def desired_replicas(isvc: InferenceService, current: int | None = None) -> int:
    """spec.replicas; with autoscaling, the running count `current` (the replicas the operator last
    asked of the Deployments), else the last decision status shows (no Deployment: the offline
    render, a Deployment deleted), else minReplicas, clamped to [minReplicas, maxReplicas].

    The running count first: a pass writes the Deployment before the status, so after a restart
    the Deployment is at least as new as the decision in status. When the status write of a scale
    was lost (an API server failing mid-scale, the process restarting before the retry), status
    still shows the count before it; rendered from status, the new process's first pass undid the
    scale before its autoscaler's first tick (which starts from the running count, history.seed)
    asked for it again, and the replicas started for it were stopped and started over."""
    a = isvc.spec.autoscaling
    if a is None:
        return isvc.spec.replicas
    decided = isvc.status.autoscaling.desired_replicas if isvc.status and isvc.status.autoscaling else None
    base = current if current is not None else (decided if decided is not None else a.min_replicas)
    return max(a.min_replicas, min(a.max_replicas, base))
