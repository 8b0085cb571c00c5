"""The autoscaler's one combined PromQL query, evaluated by a real Prometheus over metrics in the
exact shape a Triton + TensorRT-LLM pod exposes, and read back through the operator's own source
(autoscaling/prometheus.PrometheusSource).

Mocked, because no GPU runs here: the TensorRT-LLM pods' /metrics. A small loopback HTTP server
serves text in the format of the TensorRT-LLM backend's custom metrics reporter
(nv_trt_llm_request_metrics{request_type=...}, nv_llm_input_token_len / nv_llm_output_token_len
histograms; NVIDIA/TensorRT-LLM triton_backend/inflight_batcher_llm/src/custom_metrics_reporter)
and Triton's per-model counters for the runtime's ensemble (ensemble, preprocessing, tensorrt_llm,
postprocessing), with counters that grow at known rates. The gateway's series are the real
gateway's gauges (triton_operator.gateway.metrics) exposed by prometheus_client, scraped as the
chart's ServiceMonitor does (its namespace and inferenceservice labels kept). No cluster is needed.
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
from triton_operator.autoscaling import policy
from triton_operator.autoscaling.loop import signals_for
from triton_operator.autoscaling.prometheus import PrometheusSource
from triton_operator.gateway import metrics as gateway_metrics
from triton_operator.settings import Settings

from .cluster import wait_for
from .harness.prometheus import Prometheus, Target

MODELS = ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing")


class Pod:
    """One TensorRT-LLM pod's figures: `backlog` requests past preprocessing beyond the batch,
    `active` in the batch, completing `rate` requests/s of `prompt`/`output` tokens."""

    def __init__(self, active: int, backlog: int, rate: float, failed: int = 0, pending: int = 0):
        self.active, self.backlog, self.rate, self.failed, self.pending = active, backlog, rate, failed, pending
        self.started = time.monotonic()

    def text(self, prompt: float = 1000.0, output: float = 200.0) -> str:
        done = 1000 + int(self.rate * (time.monotonic() - self.started))
        lines = ["# TYPE nv_inference_request_success counter", "# TYPE nv_inference_request_failure counter",
                 "# TYPE nv_inference_pending_request_count gauge"]
        for model in MODELS:
            # what preprocessing finished and tensorrt_llm has not (failures included) is in the engine
            success = done + (self.active + self.backlog + self.failed if model == "preprocessing" else 0)
            lines.append(f'nv_inference_request_success{{model="{model}",version="1"}} {success}')
            for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
                failed = self.failed if (model, reason) == ("tensorrt_llm", "BACKEND") else 0
                lines.append(f'nv_inference_request_failure{{model="{model}",reason="{reason}",version="1"}} {failed}')
            pending = self.pending if model == "preprocessing" else 0
            lines.append(f'nv_inference_pending_request_count{{model="{model}",version="1"}} {pending}')
        lines += ["# TYPE nv_inference_request_summary_us summary",
                  'nv_inference_request_summary_us{model="ensemble",version="1",quantile="0.99"} 2500000',
                  'nv_inference_request_summary_us_sum{model="ensemble",version="1"} 1',
                  'nv_inference_request_summary_us_count{model="ensemble",version="1"} 1',
                  "# TYPE nv_trt_llm_request_metrics gauge"]
        for kind, value in (("active", self.active), ("max", 64), ("scheduled", self.active), ("context", 1),
                            ("waiting", 0)):
            lines.append(f'nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="{kind}",version="1"}} {value}')
        for name, mean, label in (("nv_llm_input_token_len", prompt, "total_input_tokens"),
                                  ("nv_llm_output_token_len", output, "total_output_tokens")):
            lines.append(f"# TYPE {name} histogram")
            labels = f'model="tensorrt_llm",response_metric_type="{label}",version="1"'
            lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {done}')
            lines.append(f"{name}_sum{{{labels}}} {done * mean}")
            lines.append(f"{name}_count{{{labels}}} {done}")
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
        "chat-a": Pod(active=64, backlog=26, rate=20, failed=10, pending=2),
        "chat-b": Pod(active=40, backlog=0, rate=10),
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


def test_one_query_reads_every_signal_of_a_tensorrt_llm_service_and_a_plain_one(prometheus: Prometheus):
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
    # Waiting: Triton's pending (2 in preprocessing) plus what each engine holds beyond its batch
    # (pod a: 26; pod b: none). Failed requests (10) are not waiting.
    assert snap.get("queue", chat) == 2 + 26
    assert snap.get("in_flight", chat) == 64 + 40
    assert snap.get("throughput", chat) == pytest.approx(30, rel=0.15)
    assert snap.get("prompt_tokens", chat) == pytest.approx(1000) and snap.get("output_tokens", chat) == pytest.approx(200)
    assert snap.get("p99", chat) == 2500 and snap.get("reporting", chat) == 2
    # A plain model: its pending requests alone, no TensorRT-LLM signal invented as 0.
    assert snap.get("queue", vision) == 5 and snap.get("reporting", vision) == 1
    assert snap.get("in_flight", vision) is None and snap.get("prompt_tokens", vision) is None


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
    decision = policy.decide(spec, 0, signals, policy.seed(now, 0), now)
    assert decision.desired == 1 and "3 held at the gateway" in decision.reason
    # With replicas, no Triton series is still an error (the policy holds), never "no load".
    assert signals_for(sleepy, snap, ready=0, current=1).error
