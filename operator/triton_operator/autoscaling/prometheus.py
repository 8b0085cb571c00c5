"""Reading Triton's metrics from Prometheus: one query per signal per tick for all services."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from string import Template

from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from requests import RequestException
from urllib3.util.retry import Retry

from .. import telemetry
from ..settings import Settings

Key = tuple[str, str]  # (namespace, InferenceService name)


@dataclass
class Snapshot:
    """Per service: queue depth (sum over pods), requests held and in flight at the gateway,
    throughput (requests/s) and p99 in ms. `errors` name failed queries ("queue" covers the
    demand query's signals)."""

    queue: dict[Key, float] = field(default_factory=dict)
    p99: dict[Key, float] = field(default_factory=dict)
    held: dict[Key, float] = field(default_factory=dict)
    gateway_in_flight: dict[Key, float] = field(default_factory=dict)
    throughput: dict[Key, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    queries: int = 0


def render_query(template: str, settings: Settings) -> str:
    return Template(template).safe_substitute(
        namespace=settings.metrics_namespace_label, service=settings.metrics_service_label)


class PrometheusSource:
    def __init__(self, settings: Settings):
        if not settings.prometheus_url:
            raise ValueError("TRITON_OPERATOR_PROMETHEUS_URL is not set")
        self.settings = settings
        self.client = PrometheusConnect(
            url=settings.prometheus_url, disable_ssl=False, retry=Retry(total=0),
            timeout=settings.prometheus_timeout_seconds)
        self.queries = {
            "queue": render_query(settings.queue_query, settings),
            "p99": render_query(settings.p99_query, settings),
        }

    def _series(self, signal: str, snapshot: Snapshot) -> dict[str, dict[Key, float]]:
        """{signal label (or `signal` for series without one): {service: value}}."""
        out: dict[str, dict[Key, float]] = {}
        started = time.monotonic()
        snapshot.queries += 1
        try:
            result = self.client.custom_query(self.queries[signal])
        except (RequestException, PrometheusApiClientException, ValueError) as e:
            telemetry.QUERY_ERRORS.labels(signal).inc()
            snapshot.errors[signal] = _short(e)
            return out
        finally:
            telemetry.QUERY_SECONDS.labels(signal).observe(time.monotonic() - started)
        ns_label, svc_label = self.settings.metrics_namespace_label, self.settings.metrics_service_label
        for item in result:
            labels = item.get("metric", {})
            key = (labels.get(ns_label, ""), labels.get(svc_label, ""))
            series = out.setdefault(labels.get("signal", signal), {})
            try:
                series[key] = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                series[key] = math.nan
        return out

    def snapshot(self) -> Snapshot:
        snap = Snapshot()
        demand = self._series("queue", snap)
        snap.queue, snap.held = demand.get("queue", {}), demand.get("held", {})
        snap.gateway_in_flight, snap.throughput = demand.get("gateway_in_flight", {}), demand.get("throughput", {})
        snap.p99 = self._series("p99", snap).get("p99", {})
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
        why = "no Prometheus configured (set TRITON_OPERATOR_PROMETHEUS_URL)"
        return Snapshot(errors={"queue": why, "p99": why})


def source_for(settings: Settings) -> PrometheusSource | Unconfigured:
    return PrometheusSource(settings) if settings.prometheus_url else Unconfigured()
