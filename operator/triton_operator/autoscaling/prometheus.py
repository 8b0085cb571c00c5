"""Reading Triton's metrics from Prometheus: one query per tick for all services and all signals.

Each signal is its own PromQL expression (settings.*_query, one series per service). The source
tags every expression's series with the signal's name (label_replace) and asks Prometheus for
their union (`or`) in a single instant query, so a tick costs one query however many services
and signals there are (the control plane's budget is two). A failed query fails every signal: the policy then
holds replicas; a signal a service does not have (no TensorRT-LLM metrics, no traffic yet, no
gateway in front) is simply absent, and absent never reads as zero. The gateway's series (held
and gateway_in_flight) are two more signals of the same query, so the budget holds with it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from string import Template
from typing import Any

from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from requests import RequestException
from urllib3.util.retry import Retry

from .. import telemetry
from ..kube.store import Key
from ..settings import Settings

SIGNAL_LABEL = "triton_operator_signal"
# signal -> the setting that holds its PromQL
SIGNALS = {"queue": "queue_query", "p99": "p99_query", "in_flight": "in_flight_query",
           "throughput": "throughput_query", "recent_throughput": "recent_throughput_query",
           "prompt_tokens": "prompt_tokens_query",
           "cached_tokens": "cached_tokens_query", "output_tokens": "output_tokens_query",
           "reporting": "reporting_query",
           "held": "held_query", "gateway_in_flight": "gateway_in_flight_query",
           "slo_met": "slo_met_query", "slo_requests": "slo_requests_query"}


@dataclass
class Snapshot:
    """Per signal, per service: the value (NaN where Prometheus returned NaN). `error` set: the
    query failed and no figure can be trusted."""

    values: dict[str, dict[Key, float]] = field(default_factory=dict)
    error: str | None = None
    queries: int = 0

    def get(self, signal: str, key: Key) -> float | None:
        return self.values.get(signal, {}).get(key)

    @property
    def queue(self) -> dict[Key, float]:
        return self.values.get("queue", {})

    @property
    def p99(self) -> dict[Key, float]:
        return self.values.get("p99", {})

    @property
    def errors(self) -> dict[str, str]:
        """The failed signals and why (every one of them: they share the query)."""
        return {} if self.error is None else {signal: self.error for signal in SIGNALS}


def render_query(template: str, settings: Settings) -> str:
    return Template(template).safe_substitute(
        namespace=settings.metrics_namespace_label, service=settings.metrics_service_label)


def combined_query(settings: Settings) -> str:
    """Every signal's expression, tagged with its name, in one union."""
    return "\nor ".join(
        f'label_replace(({render_query(getattr(settings, setting), settings)}), "{SIGNAL_LABEL}", "{signal}", "", "")'
        for signal, setting in SIGNALS.items())


def parse(result: list[dict[str, Any]], settings: Settings) -> Snapshot:
    """The union's series, back into per-signal, per-service values."""
    snap = Snapshot(values={signal: {} for signal in SIGNALS})
    ns_label, svc_label = settings.metrics_namespace_label, settings.metrics_service_label
    for item in result:
        labels = item.get("metric") if isinstance(item, dict) else None
        if not isinstance(labels, dict):
            continue
        signal = labels.get(SIGNAL_LABEL)
        if signal not in snap.values:
            continue
        key = (labels.get(ns_label, ""), labels.get(svc_label, ""))
        try:
            snap.values[signal][key] = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            snap.values[signal][key] = math.nan
    return snap


NOT_PROMETHEUS = ("Prometheus answered without a query result (data.result): is TRITON_OPERATOR_PROMETHEUS_URL "
                  "the base URL of a Prometheus server?")


class PrometheusSource:
    def __init__(self, settings: Settings):
        if not settings.prometheus_url:
            raise ValueError("TRITON_OPERATOR_PROMETHEUS_URL is not set")
        self.settings = settings
        self.client = PrometheusConnect(
            url=settings.prometheus_url, disable_ssl=False, retry=Retry(total=0),
            timeout=settings.prometheus_timeout_seconds)
        self.query = combined_query(settings)

    def snapshot(self) -> Snapshot:
        started = time.monotonic()
        try:
            result = self.client.custom_query(self.query)
            if not isinstance(result, list):
                raise TypeError("the query result is not a list")
        except (RequestException, PrometheusApiClientException, ValueError) as e:
            telemetry.QUERY_ERRORS.labels("all").inc()
            snap = Snapshot(error=_short(e))
        except (KeyError, TypeError):
            # A 200 whose JSON is not a query's answer (data.result): a URL that reaches some other
            # service. Every signal fails, as for any failed query, and the reason says where to look.
            telemetry.QUERY_ERRORS.labels("all").inc()
            snap = Snapshot(error=NOT_PROMETHEUS)
        else:
            snap = parse(result, self.settings)
        finally:
            telemetry.QUERY_SECONDS.labels("all").observe(time.monotonic() - started)
        snap.queries = 1
        telemetry.QUERIES_PER_TICK.set(snap.queries)
        return snap


def _short(e: Exception) -> str:
    text = str(e)
    if isinstance(e, RequestException):
        text = f"Prometheus unreachable: {type(e).__name__}"
    return text[:200]


class Unconfigured:
    """The source when no Prometheus URL is set: every tick is an honest error, so autoscaled
    services hold their replicas and say why instead of silently never scaling."""

    def snapshot(self) -> Snapshot:
        return Snapshot(error="no Prometheus configured (set TRITON_OPERATOR_PROMETHEUS_URL)")


def source_for(settings: Settings) -> PrometheusSource | Unconfigured:
    return PrometheusSource(settings) if settings.prometheus_url else Unconfigured()
