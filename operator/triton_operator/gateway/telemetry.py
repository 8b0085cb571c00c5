"""The gateway's Prometheus metrics. Service labels are `namespace` and `inferenceservice`, the
names the autoscaler's queries group Triton's series by, so the held-request gauge adds up with
Triton's queue per service (scrape the gateway with honor_labels, as the chart's ServiceMonitor
does, so Prometheus keeps these labels instead of the gateway pod's own namespace). Only services
that exist get a label value: a client's made-up model name never becomes a series."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

SERVICE = ["namespace", "inferenceservice"]

REQUESTS = Counter(
    "triton_gateway_requests_total", "Requests answered, by service, route and HTTP status.",
    SERVICE + ["route", "code"])
REJECTED = Counter(
    "triton_gateway_rejected_requests_total",
    "Requests refused before reaching a service, by reason (unauthorized, forbidden, rate_limited, "
    "too_large, bad_request, bad_path, not_found, hold_full, hold_timeout, unavailable, keys_unavailable, "
    "auth_throttled, too_many_in_flight, key_memory_share, memory_full, body_timeout, malformed, no_usable_replica, "
    "replicas_unreachable).", ["reason"])
HELD = Gauge(
    "triton_gateway_held_requests",
    "Requests waiting for a ready replica (a service scaled to zero or starting); demand for the autoscaler.",
    SERVICE)
IN_FLIGHT = Gauge(
    "triton_gateway_in_flight_requests", "Requests being answered by a replica, by service.", SERVICE)
# The chart's alerts.latencySLO.buckets lists these bounds and the LLM engine's (e2e/test_alerts.py).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
LATENCY = Histogram(
    "triton_gateway_request_duration_seconds", "Time from request to the end of the answer, by service and route.",
    SERVICE + ["route"], buckets=LATENCY_BUCKETS)
HOLD_SECONDS = Histogram(
    "triton_gateway_hold_seconds", "Time a held request waited for a ready replica, by service.", SERVICE,
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))
TTFT = Histogram(
    "triton_gateway_time_to_first_token_seconds", "Time from request to the first streamed token, by service.",
    SERVICE, buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
OUTPUT_TOKENS = Counter(
    "triton_gateway_output_tokens_total",
    "Tokens generated for clients, by service: the model's own count for LLM services (format tensorrt-llm); for "
    "other generate models, one streamed response counts as one.", SERVICE)
TOKENS_PER_SECOND = Histogram(
    "triton_gateway_tokens_per_second", "Decode speed of each streamed answer after its first token, by service.",
    SERVICE, buckets=(1, 5, 10, 20, 40, 60, 100, 150, 250, 500, 1000))
SLO_REQUESTS = Counter(
    "triton_gateway_slo_requests_total",
    "Requests a replica answered, by service and whether they met the service's latency target "
    "(spec.autoscaling.slo: end to end, to the first token, or between tokens); the autoscaler reads the share "
    "met over the last 10 minutes into status.metrics.sloAttainment. Requests that failed count as not met; "
    "an interToken target counts streamed answers only.", SERVICE + ["met"])
UPSTREAM_STALLED = Counter(
    "triton_gateway_upstream_stalled_total",
    "Answers cut because a replica sent nothing for upstreamIdleTimeoutSeconds once the answer had begun, by "
    "service.", SERVICE)
UPSTREAM_CONNECT_FAILURES = Counter(
    "triton_gateway_upstream_connect_failures_total",
    "Connections to a replica that failed (refused, timeout, tls); the replica then sits out 30 s, by service.",
    SERVICE + ["reason"])
API_KEYS = Gauge("triton_gateway_api_keys", "API keys loaded.")
SERVICES = Gauge("triton_gateway_services", "InferenceServices known to the gateway.")
CONNECTIONS = Gauge("triton_gateway_connections", "Client connections open on the API port.")
CONNECTIONS_REFUSED = Counter(
    "triton_gateway_connections_refused_total",
    "Client connections closed by the gateway's limits: too_many (past maxConnections, answered 503), "
    "per_address (past maxConnectionsPerAddress from one client address, answered 503), reaped (idle, or in a "
    "slow head, closed to make room in a nearly full pool), header_timeout (a request's headers took longer than "
    "headerTimeoutSeconds, answered 408), header_too_large (a head over maxHeaderBytes, answered 431), connect "
    "(a CONNECT request, answered 501: the gateway opens no tunnels) and client_stalled (a client that took no "
    "part of its answer for upstreamIdleTimeoutSeconds, or was still being answered upstreamTimeoutSeconds after "
    "its request went to a replica: cut).", ["reason"])
KEY_FILES_VALID = Gauge(
    "triton_gateway_key_files_valid",
    "1 when every API key file was read and parsed; 0 when one cannot be used: its keys are refused (503 "
    "keys_unavailable) until it is fixed, while the other files' keys keep working.")
# Usage per API key (its name, never the key), the start of showback. A key's GPU-seconds are its
# part of each service's: the service's GPU-seconds (the operator's triton_operator_service_gpus,
# integrated) times this key's share of the service's request-seconds (docs/gateway.md, "Usage per key").
KEY_SERVICE = ["key", "namespace", "inferenceservice"]
KEY_REQUESTS = Counter(
    "triton_gateway_key_requests_total", "Requests a key sent to a service's replicas.", KEY_SERVICE)
KEY_REQUEST_SECONDS = Counter(
    "triton_gateway_key_request_seconds_total",
    "Seconds a key's requests spent at a service's replicas (from sending to the end of the answer).", KEY_SERVICE)
KEY_TOKENS = Counter(
    "triton_gateway_key_tokens_total", "Tokens a key used, by kind (prompt, completion), as the model counted them.",
    KEY_SERVICE + ["kind"])


_children: dict[tuple[Any, ...], Any] = {}


def child(metric: Any, *labels: str) -> Any:
    """A labelled child of a metric, memoized (prometheus_client's labels() locks and hashes on
    every call; this is the gateway's hot path). The children are the metric's own, process-wide
    as the metrics are."""
    key = (metric, *labels)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*labels)
    return found
