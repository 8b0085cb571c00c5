"""The chart's Grafana dashboards, written as JSON into charts/triton-operator/dashboards/ by
`make dashboards` (tests/generated.py keeps the files current; `make check-generated` fails on a
stale one). Edit the panels here, not the JSON.

Every query reads a series the code exports: the operator's (operator/triton_operator/telemetry.py),
the gateway's (operator/triton_operator/gateway/telemetry.py), the LLM model's on Triton's metrics
port (runtime/triton_runtime/serving/triton_model.py), Triton's own (nv_inference_*) and the
PrometheusRule's recording rules (charts/triton-operator/templates/prometheusrule.yaml).
e2e/test_dashboards.py evaluates every one against a real Prometheus with real series.

Grafana variables used: $datasource, $namespace, $service, $__rate_interval, $__range.
"""

from __future__ import annotations

import json
from typing import Any

DS = {"type": "prometheus", "uid": "${datasource}"}
TAGS = ["triton-operator"]


class Layout:
    """Panels placed left to right in rows of 24 columns; ids unique within a dashboard."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = self.row_h = 0

    def _id(self) -> int:
        return len(self.panels) + 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({"id": self._id(), "type": "row", "title": title, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x = self.row_h = 0

    def panel(self, kind: str, title: str, description: str, targets: list[tuple[str, str]], *, unit: str = "short",
              w: int = 8, h: int = 8, **options: Any) -> None:
        if self.x + w > 24:
            self._newline()
        panel: dict[str, Any] = {
            "id": self._id(), "type": kind, "title": title, "description": description, "datasource": DS,
            "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend,
                         **({"instant": True, "format": "table"} if kind == "table" else {})}
                        for i, (expr, legend) in enumerate(targets)],
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        }
        if kind == "timeseries":
            panel["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                                "tooltip": {"mode": "multi", "sort": "desc"}}
        elif kind == "stat":
            panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                                "colorMode": "value", "graphMode": "area", "textMode": "auto"}
        elif kind == "table":
            panel["options"] = {"showHeader": True}
            panel["transformations"] = [{"id": "organize", "options": {"excludeByName": {"Time": True}}}]
        panel["options"].update(options)
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def _variables(service: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{
        "name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
        "current": {}, "hide": 0, "refresh": 1, "options": []}]
    ns = {"name": "namespace", "label": "Namespace", "type": "query", "datasource": DS,
          "definition": "label_values(triton_operator_service_condition, namespace)",
          "query": {"query": "label_values(triton_operator_service_condition, namespace)", "refId": "namespace"},
          "refresh": 2, "sort": 1, "current": {}, "options": [], "hide": 0}
    if service:
        out.append({**ns, "multi": False, "includeAll": False})
        q = 'label_values(triton_operator_service_condition{namespace="$namespace"}, inferenceservice)'
        out.append({"name": "service", "label": "InferenceService", "type": "query", "datasource": DS,
                    "definition": q, "query": {"query": q, "refId": "service"}, "refresh": 2, "sort": 1,
                    "current": {}, "options": [], "hide": 0, "multi": False, "includeAll": False})
    else:
        out.append({**ns, "multi": True, "includeAll": True, "allValue": ".*"})
    return out


def _dashboard(uid: str, title: str, description: str, layout: Layout, service: bool) -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": description, "tags": TAGS, "editable": True,
        "schemaVersion": 39, "version": 1, "graphTooltip": 1, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"}, "timezone": "browser",
        "templating": {"list": _variables(service)},
        "annotations": {"list": []},
        "links": [{"title": "Triton Operator", "type": "dashboards", "tags": TAGS, "asDropdown": False,
                   "includeVars": False, "keepTime": True}],
        "panels": layout.panels,
    }


def fleet() -> dict[str, Any]:
    n = 'namespace=~"$namespace"'
    ri = "$__rate_interval"
    price = "on (gpu_class) group_left max by (gpu_class) (triton_operator_gpu_class_price_per_hour)"
    lay = Layout()
    lay.row("Services")
    lay.panel("stat", "InferenceServices", "InferenceServices the operator manages.",
              [(f'count(count by (namespace, inferenceservice) (triton_operator_service_condition{{{n}, condition="Ready"}}))', "services")], w=4, h=5)
    lay.panel("stat", "Ready", "Services whose Ready condition is True.",
              [(f'count(max by (namespace, inferenceservice) (triton_operator_service_condition{{{n}, condition="Ready", status="True"}}))', "ready")], w=4, h=5)
    lay.panel("stat", "Degraded", "Services whose Degraded condition is True: a human is needed.",
              [(f'count(max by (namespace, inferenceservice) (triton_operator_service_condition{{{n}, condition="Degraded", status="True"}}))', "degraded")], w=4, h=5)
    lay.panel("stat", "GPUs in use", "GPUs held by ready replicas (ready replicas x GPUs per replica).",
              [(f"sum(triton_operator_service_gpus{{{n}}})", "GPUs")], w=4, h=5)
    lay.panel("stat", "Cost per hour", "GPUs in use times their GPUClass's pricePerHour.",
              [(f"sum(triton_operator_service_gpus{{{n}}} * {price})", "per hour")], unit="currencyUSD", w=4, h=5)
    lay.panel("stat", "GPU-hours in range", "GPU-hours of ready replicas over the dashboard's time range (1-minute steps).",
              [(f"sum(sum_over_time(triton_operator_service_gpus{{{n}}}[$__range:1m])) / 60", "GPU-hours")], w=4, h=5)
    lay.panel("table", "Services not Ready", "Services whose Ready condition is not True, with the reason.",
              [(f'max by (namespace, inferenceservice, reason) (triton_operator_service_condition{{{n}, condition="Ready", status!="True"}})', "")], w=12)
    lay.panel("table", "Services Degraded", "Services whose Degraded condition is True, with the reason "
              "(GPUClassesFull, Unschedulable, PreparationFailed, CrashLoopBackOff, ...).",
              [(f'max by (namespace, inferenceservice, reason) (triton_operator_service_condition{{{n}, condition="Degraded", status="True"}})', "")], w=12)
    lay.row("GPU classes")
    lay.panel("timeseries", "Ready replicas by GPU class", "Ready replicas of every service, per GPU class.",
              [(f'sum by (gpu_class) (triton_operator_service_replicas{{{n}, state="ready"}})', "{{gpu_class}}")])
    lay.panel("timeseries", "Desired replicas by GPU class", "Replicas the operator wants per class (the preferred class and the classes spilled to).",
              [(f'sum by (gpu_class) (triton_operator_service_replicas{{{n}, state="desired"}})', "{{gpu_class}}")])
    lay.panel("timeseries", "Spilled replicas", "Replicas placed on a fallback class because the preferred class is full (spec.gpu.spill).",
              [(f"sum by (namespace, inferenceservice) (triton_operator_service_spilled_replicas{{{n}}})", "{{namespace}}/{{inferenceservice}}")])
    lay.panel("timeseries", "GPUs in use by class", "Ready replicas x GPUs per replica, per GPU class.",
              [(f"sum by (gpu_class) (triton_operator_service_gpus{{{n}}})", "{{gpu_class}}")])
    lay.panel("timeseries", "Cost per hour by class", "GPUs in use x the class's pricePerHour.",
              [(f"sum by (gpu_class) (triton_operator_service_gpus{{{n}}} * {price})", "{{gpu_class}}")], unit="currencyUSD")
    lay.panel("timeseries", "Cost per hour by service", "GPUs in use x the class's pricePerHour, per service.",
              [(f"sum by (namespace, inferenceservice) (triton_operator_service_gpus{{{n}}} * {price})", "{{namespace}}/{{inferenceservice}}")], unit="currencyUSD")
    lay.row("Gateway")
    lay.panel("timeseries", "Gateway requests by code", "Requests the gateway answered per second, by HTTP status.",
              [(f"sum by (code) (rate(triton_gateway_requests_total{{{n}}}[{ri}]))", "{{code}}")], unit="reqps")
    lay.panel("timeseries", "Requests refused by reason", "Requests refused before reaching a service (unauthorized, rate_limited, hold_full, ...).",
              [(f"sum by (reason) (rate(triton_gateway_rejected_requests_total[{ri}]))", "{{reason}}")], unit="reqps")
    lay.panel("timeseries", "Held requests", "Requests waiting for a ready replica (services waking from zero or starting).",
              [(f"sum by (namespace, inferenceservice) (triton_gateway_held_requests{{{n}}})", "{{namespace}}/{{inferenceservice}}")])
    lay.row("Operator")
    lay.panel("stat", "Leading replicas", "Operator replicas holding the leader Lease (1 expected).",
              [("sum(triton_operator_leader)", "leaders")], w=4, h=6)
    lay.panel("timeseries", "Leader by replica", "1 for the replica that leads, 0 for a standby.",
              [("max by (instance) (triton_operator_leader)", "{{instance}}")], w=8, h=6)
    lay.panel("timeseries", "Work queue", "InferenceServices waiting to be reconciled.",
              [("max(triton_operator_workqueue_depth)", "queued")], w=12, h=6)
    lay.panel("timeseries", "Reconciles by outcome", "Reconcile passes per second by outcome (ok, retry, error, namespace_terminating).",
              [(f"sum by (outcome) (rate(triton_operator_reconciles_total[{ri}]))", "{{outcome}}")], unit="ops")
    lay.panel("timeseries", "Reconcile errors", "Passes that failed: retry (the API server refused or was unreachable) and error (a bug; see the log).",
              [(f'sum by (outcome) (rate(triton_operator_reconciles_total{{outcome=~"retry|error"}}[{ri}]))', "{{outcome}}")], unit="ops")
    lay.panel("timeseries", "Reconcile latency", "Duration of one reconcile pass.",
              [(f"histogram_quantile(0.5, sum by (le) (rate(triton_operator_reconcile_seconds_bucket[{ri}])))", "p50"),
               (f"histogram_quantile(0.99, sum by (le) (rate(triton_operator_reconcile_seconds_bucket[{ri}])))", "p99")], unit="s")
    lay.panel("timeseries", "API requests", "Requests the operator made to the API server per second (watches included).",
              [(f"sum(rate(triton_operator_api_requests_total[{ri}]))", "requests")], unit="reqps")
    lay.panel("timeseries", "Writes by kind", "Writes to the API server per second, by kind and verb (only what differs is written).",
              [(f"sum by (kind, verb) (rate(triton_operator_writes_total[{ri}]))", "{{verb}} {{kind}}")], unit="ops")
    lay.panel("timeseries", "Cached objects", "Objects in the watch-fed cache, by kind.",
              [("max by (kind) (triton_operator_cache_objects)", "{{kind}}")])
    lay.row("Autoscaler")
    lay.panel("timeseries", "Scale decisions", "Autoscaler decisions per second by direction (all services).",
              [(f"sum by (direction) (rate(triton_operator_autoscaler_decisions_total[{ri}]))", "{{direction}}")], unit="ops")
    lay.panel("timeseries", "Autoscaled services", "Services with autoscaling in the last tick, and those whose report changed.",
              [("max(triton_operator_autoscaled_services)", "autoscaled"),
               ("max(triton_operator_autoscaler_reports_changed)", "reports changed")])
    lay.panel("timeseries", "Prometheus query latency", "The autoscaler's query latency (one query per tick).",
              [(f"histogram_quantile(0.99, sum by (le) (rate(triton_operator_prometheus_query_seconds_bucket[{ri}])))", "p99")],
              unit="s", w=4)
    lay.panel("timeseries", "Prometheus query errors", "The autoscaler's failed queries per second: while they fail it "
              "holds replicas (MetricsAvailable=False).",
              [(f"sum(rate(triton_operator_prometheus_query_errors_total[{ri}]))", "errors")], unit="ops", w=4)
    lay.panel("timeseries", "Decision CPU", "CPU time of the autoscaler's decisions per tick.",
              [("max(triton_operator_autoscaler_last_decision_cpu_seconds)", "last tick"),
               (f"sum(rate(triton_operator_autoscaler_decision_cpu_seconds_total[{ri}])) / sum(rate(triton_operator_autoscaler_ticks_total[{ri}]))", "mean per tick")], unit="s")
    return _dashboard("triton-operator-fleet", "Triton Operator / Fleet",
                      "Every InferenceService: replicas by GPU class, spill-over, GPU-hours and cost, the gateway, and "
                      "the operator's health.", lay, service=False)


def service() -> dict[str, Any]:
    s = 'namespace="$namespace", inferenceservice="$service"'
    ri = "$__rate_interval"
    price = "on (gpu_class) group_left max by (gpu_class) (triton_operator_gpu_class_price_per_hour)"

    def q(p: float, metric: str) -> str:
        return f"histogram_quantile({p}, sum by (le) (rate({metric}_bucket{{{s}}}[{ri}])))"

    lay = Layout()
    lay.row("Status")
    lay.panel("table", "Conditions", "The service's status conditions, with their reasons.",
              [(f"max by (condition, status, reason) (triton_operator_service_condition{{{s}}})", "")], w=12, h=7)
    lay.panel("timeseries", "Replicas by GPU class", "Desired and ready replicas per GPU class (spilled replicas on a fallback class).",
              [(f"sum by (gpu_class, state) (triton_operator_service_replicas{{{s}}})", "{{state}} {{gpu_class}}"),
               (f"sum(triton_operator_service_spilled_replicas{{{s}}})", "spilled")], w=12, h=7)
    lay.row("Load")
    lay.panel("timeseries", "Queue", "Requests waiting: the LLM engine's queue (accepted, not generating), Triton's pending "
              "requests (other formats; 0 for a decoupled LLM) and requests held at the gateway.",
              [(f"sum(triton_llm_queued_requests{{{s}}})", "engine queue"),
               (f"sum(nv_inference_pending_request_count{{{s}}})", "Triton pending"),
               (f"sum(triton_gateway_held_requests{{{s}}})", "held at gateway")])
    lay.panel("timeseries", "In flight", "Requests in the LLM engines' batches, and requests the gateway has sent to replicas.",
              [(f"sum(triton_llm_active_requests{{{s}}})", "generating"),
               (f"sum(triton_gateway_in_flight_requests{{{s}}})", "gateway in flight")])
    lay.panel("timeseries", "Throughput", "Requests finished per second: by the LLM engine (by finish reason) and by Triton (other formats).",
              [(f"sum by (finish_reason) (rate(triton_llm_requests_total{{{s}}}[{ri}]))", "{{finish_reason}}"),
               (f"sum(rate(nv_inference_request_success{{{s}}}[{ri}]))", "Triton successes")], unit="reqps")
    lay.row("Latency")
    lay.panel("timeseries", "Request latency", "Request to last token (the engine's histogram, LLMs), Triton's p99 summary "
              "(other formats), and through the gateway; the dashed target is the service level's end-to-end "
              "latency target (spec.autoscaling.slo or targetP99LatencyMs).",
              [(q(0.5, "triton_llm_request_duration_seconds"), "p50 engine"),
               (q(0.99, "triton_llm_request_duration_seconds"), "p99 engine"),
               (f'max(nv_inference_request_summary_us{{{s}, quantile="0.99"}}) / 1e6', "p99 Triton"),
               (q(0.99, "triton_gateway_request_duration_seconds"), "p99 gateway"),
               (f"max(triton_operator_service_latency_target_seconds{{{s}}})", "target")], unit="s")
    lay.panel("timeseries", "Time to first token", "Arrival to first generated token: the engine's (LLMs) and the gateway's (streamed answers).",
              [(q(0.5, "triton_llm_time_to_first_token_seconds"), "p50 engine"),
               (q(0.99, "triton_llm_time_to_first_token_seconds"), "p99 engine"),
               (q(0.99, "triton_gateway_time_to_first_token_seconds"), "p99 gateway")], unit="s")
    lay.panel("timeseries", "Inter-token latency", "Mean time between tokens after the first, per request (the LLM engine's).",
              [(q(0.5, "triton_llm_inter_token_latency_seconds"), "p50"),
               (q(0.99, "triton_llm_inter_token_latency_seconds"), "p99")], unit="s")
    lay.panel("timeseries", "Latency SLO errors", "Share of requests that missed the service level's latency target "
              "(the PrometheusRule's recording rules; alerts.enabled), and the error budget (one less the "
              "attainment spec.autoscaling.slo asks for): the burn-rate alerts compare the two.",
              [(f"max(inferenceservice:latency_slo_errors:ratio_rate5m{{{s}}})", "5m"),
               (f"max(inferenceservice:latency_slo_errors:ratio_rate1h{{{s}}})", "1h"),
               (f"1 - max(triton_operator_service_slo_objective{{{s}}})", "budget")], unit="percentunit")
    lay.row("Tokens")
    lay.panel("timeseries", "Tokens per second", "Prompt and generated tokens of finished requests (the engine's counts), "
              "and tokens streamed to clients by the gateway.",
              [(f"sum(rate(triton_llm_prompt_tokens_total{{{s}}}[{ri}]))", "prompt"),
               (f"sum(rate(triton_llm_generation_tokens_total{{{s}}}[{ri}]))", "generated"),
               (f"sum(rate(triton_gateway_output_tokens_total{{{s}}}[{ri}]))", "to clients")])
    lay.panel("timeseries", "Decode speed", "Tokens per second of each streamed answer after its first token (the gateway's).",
              [(q(0.5, "triton_gateway_tokens_per_second"), "p50")])
    lay.panel("timeseries", "KV cache", "Fraction of the KV cache in use (the engine's).",
              [(f"avg(triton_llm_kv_cache_utilization{{{s}}})", "used")], unit="percentunit")
    lay.panel("timeseries", "Prefix cache hit rate", "Share of prompt tokens the engine's prefix cache held, "
              "not evaluated again (the CPU engine's; routing by prefix raises it).",
              [(f"sum(rate(triton_llm_prompt_tokens_cached_total{{{s}}}[{ri}])) / "
                f"sum(rate(triton_llm_prompt_tokens_total{{{s}}}[{ri}]))", "hit rate")], unit="percentunit")
    lay.panel("timeseries", "Tokens by API key", "Tokens each key used at this service, by kind.",
              [(f"sum by (key, kind) (rate(triton_gateway_key_tokens_total{{{s}}}[{ri}]))", "{{key}} {{kind}}")])
    lay.row("Autoscaler and gateway")
    lay.panel("timeseries", "Autoscaler decisions", "Replicas the autoscaler asks for (desired) and the ready ones: each step is a decision "
              "(status.autoscaling has its reason).",
              [(f'sum(triton_operator_service_replicas{{{s}, state="desired"}})', "desired"),
               (f'sum(triton_operator_service_replicas{{{s}, state="ready"}})', "ready")])
    lay.panel("timeseries", "Metrics available", "The autoscaler's MetricsAvailable condition (1 = True): False means it holds replicas.",
              [(f'max by (reason) (triton_operator_service_condition{{{s}, condition="MetricsAvailable", status="True"}})', "available {{reason}}"),
               (f'max by (reason) (triton_operator_service_condition{{{s}, condition="MetricsAvailable", status="False"}})', "unavailable {{reason}}")])
    lay.panel("timeseries", "Gateway responses by code", "Requests the gateway answered per second, by HTTP status and route.",
              [(f"sum by (code, route) (rate(triton_gateway_requests_total{{{s}}}[{ri}]))", "{{code}} {{route}}")], unit="reqps")
    lay.panel("timeseries", "Held requests", "Requests the gateway holds while no replica is ready, and how long they waited.",
              [(f"sum(triton_gateway_held_requests{{{s}}})", "held"),
               (q(0.99, "triton_gateway_hold_seconds"), "p99 wait (s)")])
    lay.panel("timeseries", "GPUs and cost per hour", "GPUs held by ready replicas per class, and their price per hour.",
              [(f"sum by (gpu_class) (triton_operator_service_gpus{{{s}}})", "GPUs {{gpu_class}}"),
               (f"sum(triton_operator_service_gpus{{{s}}} * {price})", "cost per hour")])
    return _dashboard("triton-operator-service", "Triton Operator / InferenceService",
                      "One InferenceService: queue, latency (p99, time to first token, inter-token), throughput, tokens, "
                      "the autoscaler's decisions and the gateway's answers.", lay, service=True)


DASHBOARDS = {"fleet.json": fleet, "service.json": service}


def render() -> dict[str, str]:
    """file name -> JSON text."""
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


if __name__ == "__main__":
    for name, text in render().items():
        print(name, len(text))
