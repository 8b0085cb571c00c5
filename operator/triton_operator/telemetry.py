"""The operator's own metrics (prometheus_client)."""

from __future__ import annotations

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
