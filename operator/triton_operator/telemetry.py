"""The operator's own metrics (prometheus_client)."""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram

DECISIONS = Counter(
    "triton_operator_autoscaler_decisions_total", "Autoscaler decisions by outcome.", ["direction"])
QUERY_ERRORS = Counter(
    "triton_operator_prometheus_query_errors_total", "Failed Prometheus queries by signal.", ["signal"])
QUERY_SECONDS = Histogram(
    "triton_operator_prometheus_query_seconds", "Duration of Prometheus queries by signal.", ["signal"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
QUERIES_PER_TICK = Gauge(
    "triton_operator_prometheus_queries_per_tick", "Prometheus queries made in the last autoscaler tick.")
AUTOSCALED_SERVICES = Gauge(
    "triton_operator_autoscaled_services", "InferenceServices with autoscaling in the last tick.")
RECONCILE_SECONDS = Histogram(
    "triton_operator_reconcile_seconds", "Duration of one reconcile pass.", ["outcome"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
DECISION_CPU_SECONDS = Gauge(
    "triton_operator_autoscaler_last_decision_cpu_seconds", "CPU time of the decisions in the last autoscaler tick.")
REPORTS_CHANGED = Gauge(
    "triton_operator_autoscaler_reports_changed", "Services whose autoscaling report changed in the last tick.")
API_REQUESTS = Counter(
    "triton_operator_api_requests", "API requests made (watches included), counted when the operator's health "
                                    "or the periodic check looks.")
QUEUE_DEPTH = Gauge(
    "triton_operator_workqueue_depth", "InferenceServices waiting to be reconciled.")
RECONCILES = Counter(
    "triton_operator_reconciles_total", "Reconcile passes by outcome.", ["outcome"])
OWNER_READS = Counter(
    "triton_operator_owner_reads_total",
    "InferenceServices read from the API server before a child of theirs was created (the cache may lag a "
    "deletion; nothing is created for an owner that is gone).")
WRITES = Counter(
    "triton_operator_writes_total", "Writes to the API server by kind and verb.", ["kind", "verb"])
SERVICE_GPUS = Gauge(
    "triton_operator_service_gpus",
    "GPUs held by the ready replicas of an InferenceService, per GPU class (ready replicas x GPUs per replica): "
    "integrated over time, its GPU-seconds.", ["namespace", "inferenceservice", "gpu_class"])
GPU_CLASS_PRICE = Gauge(
    "triton_operator_gpu_class_price_per_hour", "pricePerHour of each GPUClass that has one (for cost per hour).",
    ["gpu_class"])
CACHE_OBJECTS = Gauge(
    "triton_operator_cache_objects", "Objects in the watch-fed cache by kind.", ["kind"])
TICKS = Counter("triton_operator_autoscaler_ticks_total", "Autoscaler ticks that found services to scale.")
DECISION_CPU_SECONDS_TOTAL = Counter(
    "triton_operator_autoscaler_decision_cpu_seconds_total", "CPU time spent on autoscaling decisions.")
LEADER = Gauge(
    "triton_operator_leader", "1 when this replica leads (acts), 0 while it waits for the lease.")

# Per InferenceService, from its spec and status (controller/series.py computes them).
SERVICE = ["namespace", "inferenceservice"]
SERVICE_CONDITION = Gauge(
    "triton_operator_service_condition",
    "1 for each status condition of an InferenceService, with its status and reason.",
    SERVICE + ["condition", "status", "reason"])
SERVICE_REPLICAS = Gauge(
    "triton_operator_service_replicas", "Desired and ready replicas of an InferenceService per GPU class.",
    SERVICE + ["gpu_class", "state"])
SERVICE_SPILLED = Gauge(
    "triton_operator_service_spilled_replicas",
    "Desired replicas of an InferenceService placed on a fallback GPU class because its preferred class is full.",
    SERVICE)
SERVICE_LATENCY_TARGET = Gauge(
    "triton_operator_service_latency_target_seconds",
    "The end-to-end latency target of an InferenceService's service level (spec.autoscaling.slo.latencyMs with "
    "latency endToEnd, or targetP99LatencyMs), in seconds.", SERVICE)
SERVICE_SLO_OBJECTIVE = Gauge(
    "triton_operator_service_slo_objective",
    "The share of an InferenceService's requests its service level asks to meet the latency target "
    "(spec.autoscaling.slo.attainment; 0.99 with targetP99LatencyMs), by which latency the target bounds.",
    SERVICE + ["latency"])
_SERVICE_GAUGES = {
    "triton_operator_service_condition": SERVICE_CONDITION,
    "triton_operator_service_replicas": SERVICE_REPLICAS,
    "triton_operator_service_spilled_replicas": SERVICE_SPILLED,
    "triton_operator_service_latency_target_seconds": SERVICE_LATENCY_TARGET,
    "triton_operator_service_slo_objective": SERVICE_SLO_OBJECTIVE,
}


class ServiceSeries:
    """Keeps the per-service gauges equal to what controller.series computed for each service:
    series a service no longer has (a condition's old reason, a class it left) are removed, and
    every series of a deleted service with it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], dict[str, set[tuple[str, ...]]]] = {}

    def set(self, key: tuple[str, str], series: dict[str, dict[tuple[str, ...], float]]) -> None:
        with self._lock:
            held = self._held.setdefault(key, {})
            for metric, values in series.items():
                gauge = _SERVICE_GAUGES[metric]
                for gone in held.get(metric, set()) - set(values):
                    gauge.remove(*key, *gone)
                for labels, value in values.items():
                    gauge.labels(*key, *labels).set(value)
                held[metric] = set(values)

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            for metric, labels in self._held.pop(key, {}).items():
                for extra in labels:
                    _SERVICE_GAUGES[metric].remove(*key, *extra)
