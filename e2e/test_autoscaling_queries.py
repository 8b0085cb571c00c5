"""The autoscaler's one combined PromQL query, evaluated by a real Prometheus over metrics in the
exact shape an LLM pod exposes, and read back through the operator's own source
(autoscaling/prometheus.PrometheusSource).

Mocked, so that the figures are known exactly: the LLM pods' /metrics. A small loopback HTTP
server serves text in the shape of the llm model's custom metrics (runtime/triton_runtime/serving/
triton_model.py: triton_llm_queued_requests, triton_llm_active_requests, triton_llm_requests_total
{finish_reason}, triton_llm_prompt_tokens_total, triton_llm_prompt_tokens_cached_total,
triton_llm_generation_tokens_total,
triton_llm_request_duration_seconds; e2e/test_llm.py reads the same series from the real model on
the real Triton) beside Triton's own counters for it (which stay at 0 pending: the model is
decoupled), with counters that grow at known rates. The gateway's series are the real gateway's
gauges (triton_operator.gateway.telemetry) exposed by prometheus_client, scraped as the chart's
ServiceMonitor does (its namespace and inferenceservice labels kept). No cluster is needed.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from datetime import datetime, timezone

import prometheus_client

from triton_operator.api import AutoscalingSpec
from triton_operator.autoscaling import history, policy
from triton_operator.autoscaling.loop import signals_for
from triton_operator.autoscaling.prometheus import PrometheusSource
from triton_operator.gateway import telemetry as gateway_metrics
from triton_operator.settings import Settings
from triton_runtime.serving.contract import DURATION_BUCKETS

from .cluster import wait_for
from .harness.prometheus import Prometheus, Target

LABELS = 'engine="trtllm",model="llm"'


class Pod:
    """One LLM pod's figures: `queued` requests in the engine's queue, `active` generating,
    completing `rate` requests/s (and `failed` errors) of `prompt`/`output` tokens (`cached` of the
    prompt's from the engine's prefix cache), every one in the request-duration bucket (4, 5] s."""

    def __init__(self, active: int, queued: int, rate: float, failed: int = 0):
        self.active, self.queued, self.rate, self.failed = active, queued, rate, failed
        self.started = time.monotonic()

    def text(self, prompt: float = 1000.0, output: float = 200.0, cached: float = 400.0) -> str:
        done = 1000 + int(self.rate * (time.monotonic() - self.started))
        lines = ['# TYPE nv_inference_pending_request_count gauge',
                 'nv_inference_pending_request_count{model="llm",version="1"} 0',
                 '# TYPE nv_inference_request_success counter',
                 f'nv_inference_request_success{{model="llm",version="1"}} {done * 7}',   # not a throughput
                 "# TYPE triton_llm_queued_requests gauge", f"triton_llm_queued_requests{{{LABELS}}} {self.queued}",
                 "# TYPE triton_llm_active_requests gauge", f"triton_llm_active_requests{{{LABELS}}} {self.active}",
                 "# TYPE triton_llm_requests_total counter"]
        for reason, n in (("stop", done), ("length", 0), ("cancelled", 0), ("error", self.failed)):
            lines.append(f'triton_llm_requests_total{{{LABELS},finish_reason="{reason}"}} {n}')
        lines += ["# TYPE triton_llm_prompt_tokens_total counter", f"triton_llm_prompt_tokens_total{{{LABELS}}} {done * prompt}",
                  "# TYPE triton_llm_prompt_tokens_cached_total counter",
                  f"triton_llm_prompt_tokens_cached_total{{{LABELS}}} {done * cached}",
                  "# TYPE triton_llm_generation_tokens_total counter",
                  f"triton_llm_generation_tokens_total{{{LABELS}}} {done * output}",
                  "# TYPE triton_llm_request_duration_seconds histogram"]
        for le in DURATION_BUCKETS:
            lines.append(f'triton_llm_request_duration_seconds_bucket{{{LABELS},le="{le}"}} {done if le >= 5 else 0}')
        lines += [f'triton_llm_request_duration_seconds_bucket{{{LABELS},le="+Inf"}} {done}',
                  f"triton_llm_request_duration_seconds_sum{{{LABELS}}} {done * 4}",
                  f"triton_llm_request_duration_seconds_count{{{LABELS}}} {done}"]
        return "\n".join(lines) + "\n"


class PlainPod:
    """A non-LLM Triton pod (one model, no TensorRT-LLM metrics) with `pending` queued requests."""

    def __init__(self, pending: int):
        self.pending = pending

    def text(self) -> str:
        return (f'nv_inference_pending_request_count{{model="resnet",version="1"}} {self.pending}\n'
                f'nv_inference_request_success{{model="resnet",version="1"}} 5\n')


class Gateway:
    """The gateway's /metrics: 3 requests held for `sleepy` (scaled to zero), 7 in flight to `chat`."""

    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        for gauge in (gateway_metrics.HELD, gateway_metrics.IN_FLIGHT):
            self.registry.register(gauge)
        gateway_metrics.HELD.labels("prod", "sleepy").set(3)
        gateway_metrics.IN_FLIGHT.labels("prod", "chat").set(7)

    def text(self) -> str:
        return prometheus_client.generate_latest(self.registry).decode()


def serve(pod: Pod | PlainPod | Gateway) -> ThreadingHTTPServer:
    """`pod`'s /metrics on its own loopback port (its own `instance`, as each pod has its own IP)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = pod.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def prometheus() -> Iterator[Prometheus]:
    pods: dict[str, Pod | PlainPod] = {
        "chat-a": Pod(active=64, queued=26, rate=20, failed=10),
        "chat-b": Pod(active=40, queued=2, rate=10),
        "vision-a": PlainPod(pending=5),
    }
    servers = {name: serve(pod) for name, pod in pods.items()}
    gateway = serve(Gateway())
    servers["gateway"] = gateway
    # The labels the chart's PodMonitor gives a serving pod's series; the gateway's series carry
    # their own, kept by honor_labels as the chart's ServiceMonitor (honorLabels) keeps them.
    targets = [Target(f"127.0.0.1:{server.server_address[1]}",
                      {"namespace": "prod", "inferenceservice": name.rsplit("-", 1)[0], "pod": name})
               for name, server in servers.items() if name != "gateway"]
    gateway_job = {"job_name": "gateway", "honor_labels": True, "scrape_interval": "1s",
                   "static_configs": [{"targets": [f"127.0.0.1:{gateway.server_address[1]}"],
                                       "labels": {"namespace": "triton-system"}}]}
    try:
        with Prometheus(targets, scrape_interval="1s", scrape_configs=[gateway_job]) as prom:
            prom.start()
            yield prom
    finally:
        for server in servers.values():
            server.shutdown()
            server.server_close()


def test_one_query_reads_every_signal_of_an_llm_service_and_a_plain_one(prometheus: Prometheus):
    source = PrometheusSource(Settings(prometheus_url=prometheus.url))
    chat, vision = ("prod", "chat"), ("prod", "vision")

    def complete():
        # Prometheus's rate() reads a series younger than its 1m window low (it extrapolates by
        # half a scrape interval, then divides by the whole window): wait for a full window.
        snap = source.snapshot()
        throughput = snap.get("throughput", chat) if snap.error is None else None
        return throughput is not None and throughput > 0.85 * 30 and snap

    snap = wait_for("a minute of rates in Prometheus", complete, timeout=150, interval=2)
    assert snap.queries == 1
    # Waiting: the engines' queues (26 + 2); Triton's pending is 0 for the decoupled model.
    assert snap.get("queue", chat) == 26 + 2
    assert snap.get("in_flight", chat) == 64 + 40
    # Answers finished by the engines (errors and Triton's own request counter left out).
    assert snap.get("throughput", chat) == pytest.approx(30, rel=0.15)
    # The same over the last 20 s (bursts inside a minute); a plain model's from Triton's successes.
    assert snap.get("recent_throughput", chat) == pytest.approx(30, rel=0.15)
    assert snap.get("recent_throughput", vision) == snap.get("throughput", vision) == 0
    assert snap.get("prompt_tokens", chat) == pytest.approx(1000) and snap.get("output_tokens", chat) == pytest.approx(200)
    assert snap.get("cached_tokens", chat) == pytest.approx(400)
    # p99 of request to last token from the histogram: all in (4, 5] s -> 4 + 0.99 x 1 s.
    assert snap.get("p99", chat) == pytest.approx(4990) and snap.get("reporting", chat) == 2
    # A plain model: its pending requests alone, no LLM signal invented as 0.
    assert snap.get("queue", vision) == 5 and snap.get("reporting", vision) == 1
    assert snap.get("in_flight", vision) is None and snap.get("prompt_tokens", vision) is None
    assert snap.get("cached_tokens", vision) is None


def test_the_gateways_held_and_in_flight_requests_are_two_more_signals_of_the_one_query(prometheus: Prometheus):
    """A service at zero (`sleepy`: no Triton series) with requests held at the gateway wakes on
    the tick that reads them; held and in flight come from the same single query."""
    source = PrometheusSource(Settings(prometheus_url=prometheus.url))
    sleepy, chat = ("prod", "sleepy"), ("prod", "chat")
    snap = wait_for("the gateway scraped", lambda: (s := source.snapshot()).error is None
                    and s.get("held", sleepy) is not None and s.get("queue", chat) is not None and s, timeout=60)
    assert snap.queries == 1
    assert snap.get("held", sleepy) == 3 and snap.get("queue", sleepy) is None
    assert snap.get("gateway_in_flight", chat) == 7 and snap.get("held", chat) is None
    signals = signals_for(sleepy, snap, ready=0, current=0)
    assert signals.error is None and signals.held == 3 and signals.queue_depth == 0
    spec = AutoscalingSpec(min_replicas=0, max_replicas=4, target_queue_depth=4)
    now = datetime.now(timezone.utc)
    decision = policy.decide(spec, 0, signals, history.seed(now, 0), now)
    assert decision.desired == 1 and "3 held at the gateway" in decision.reason
    # With replicas, no Triton series is still an error (the policy holds), never "no load".
    assert signals_for(sleepy, snap, ready=0, current=1).error
