"""The Prometheus series that describe one InferenceService, computed from its spec and the status
the reconcile pass wrote (pure). Dashboards and alerts read these; telemetry.ServiceSeries keeps
the gauges equal to them.

- ``triton_operator_service_condition{condition, status, reason}``: 1 per condition in status
  (Ready, Progressing, Degraded, ModelReady, MetricsAvailable, ScaledToZero), as kube-state-metrics
  exports a Deployment's conditions; the reason is one of the operator's fixed reasons or a pod's
  waiting reason, so the label stays bounded.
- ``triton_operator_service_replicas{gpu_class, state}``: desired and ready replicas per GPU class
  (status.placement: the preferred class first, then the classes spilled to).
- ``triton_operator_service_spilled_replicas``: desired replicas placed on another class than the
  preferred one (status.placement after its first entry) because it is full, whether the class
  spilled to is SpilledOver or itself Full (some of them unschedulable there too); 0 when none.
- ``triton_operator_service_latency_target_seconds``: the end-to-end latency target of the
  service level (spec.autoscaling.slo.latencyMs with latency endToEnd, or targetP99LatencyMs), in
  seconds: what the alerts read the request-duration histograms against.
- ``triton_operator_service_slo_objective{latency}``: the share of requests the service level
  asks to meet its target (slo.attainment; 0.99 for targetP99LatencyMs), for any latency: the
  alerts' error budget is one less it.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..api.spec import raw_service_level

CONDITION = "triton_operator_service_condition"
REPLICAS = "triton_operator_service_replicas"
SPILLED = "triton_operator_service_spilled_replicas"
LATENCY_TARGET = "triton_operator_service_latency_target_seconds"
SLO_OBJECTIVE = "triton_operator_service_slo_objective"

#: metric -> its label names after namespace and inferenceservice
LABELS: dict[str, tuple[str, ...]] = {
    CONDITION: ("condition", "status", "reason"),
    REPLICAS: ("gpu_class", "state"),
    SPILLED: (),
    LATENCY_TARGET: (),
    SLO_OBJECTIVE: ("latency",),
}

Series = dict[str, dict[tuple[str, ...], float]]


def service_series(spec: Mapping[str, Any] | None, status: Mapping[str, Any] | None) -> Series:
    """metric -> {extra label values: value} for one service (namespace and name are the caller's)."""
    spec, status = spec or {}, status or {}
    out: Series = {name: {} for name in LABELS}
    for cond in status.get("conditions") or []:
        if cond.get("type"):
            out[CONDITION][(cond["type"], str(cond.get("status", "Unknown")), str(cond.get("reason") or ""))] = 1.0
    placement = status.get("placement") or []
    replicas = out[REPLICAS]
    if placement:
        for entry in placement:
            gpu_class = entry.get("gpuClass")
            if not gpu_class or not (entry.get("desired") or entry.get("ready") or entry is placement[0]):
                continue   # a class left out (reason only): no replicas to show
            replicas[(gpu_class, "desired")] = float(entry.get("desired") or 0)
            replicas[(gpu_class, "ready")] = float(entry.get("ready") or 0)
    elif status.get("gpuClass"):
        replicas[(status["gpuClass"], "desired")] = float(status.get("replicas") or 0)
        replicas[(status["gpuClass"], "ready")] = float(status.get("readyReplicas") or 0)
    if status.get("gpuClass") or placement:
        out[SPILLED][()] = float(sum(int(e.get("desired") or 0) for e in placement[1:]))
    level = raw_service_level(spec.get("autoscaling"))
    if level is not None:
        latency, target_s, attainment = level
        out[SLO_OBJECTIVE][(latency,)] = attainment
        if latency == "endToEnd":
            out[LATENCY_TARGET][()] = target_s
    return out
