"""Autoscaling end to end: a real Triton server (from the nvidia-pytriton wheel, on CPU) under a
tritonclient load generator, a real Prometheus scraping it every second, and the operator scaling
a Deployment in the local cluster.

Mocked, because no GPU runs here: the InferenceService's pods are kwok-simulated, so the real
Triton stands in for them; Prometheus attaches the labels a PodMonitor would give the pods'
series (namespace, inferenceservice). Queue per replica is Triton's queue over the ready count of
the simulated Deployment.
"""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Iterator

import pytest

from .cluster import Cluster, Operator, wait_for
from .harness.loadgen import LoadGenerator
from .harness.prometheus import Prometheus, Target
from .harness.triton import TritonServer

NS, NAME = "autoscale", "web"
TICK = 2.0  # the operator's autoscaler interval in this module
WINDOW = 20  # the test-shortened scale-down stabilization window
GROUP = "serving.triton-operator.io"


@pytest.fixture(scope="module")
def triton() -> Iterator[TritonServer]:
    with TritonServer(model_name="slow", delay_ms=100) as server:
        server.wait_ready(120)
        yield server


@pytest.fixture(scope="module")
def prometheus(triton: TritonServer) -> Iterator[Prometheus]:
    prom = Prometheus([Target(triton.metrics_address, {"namespace": NS, "inferenceservice": NAME, "pod": f"{NAME}-0"})],
                      scrape_interval="1s")
    prom.start()
    prom.wait_for(f'nv_inference_pending_request_count{{inferenceservice="{NAME}"}}', lambda v: len(v) > 0)
    try:
        yield prom
    finally:
        prom.close()


@pytest.fixture(scope="module")
def scaling_operator(operator: Operator, prometheus: Prometheus) -> Iterator[Operator]:
    """The session's operator, restarted with Prometheus and a 2 s autoscaler tick."""
    saved = dict(operator.extra_env)
    operator.extra_env.update({"TRITON_OPERATOR_PROMETHEUS_URL": prometheus.url,
                               "TRITON_OPERATOR_AUTOSCALE_INTERVAL_SECONDS": str(TICK)})
    operator.stop()
    operator.start()
    c = operator.cluster
    c.kubectl("create", "namespace", NS)
    c.kubectl("label", "namespace", NS, "pod-security.kubernetes.io/enforce=restricted")
    wait_for("default ServiceAccount", lambda: c.get("serviceaccount", "default", NS), timeout=30)
    try:
        yield operator
    finally:
        c.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        operator.extra_env.clear()
        operator.extra_env.update(saved)
        operator.stop()
        operator.start()


def replicas(c: Cluster) -> int:
    return int(c.get("deployment", NAME, NS)["spec"]["replicas"])


def queue_in_prometheus(prom: Prometheus) -> float:
    values = prom.query_values(f'sum(nv_inference_pending_request_count{{inferenceservice="{NAME}"}})')
    return max((v for _, v in values), default=0.0)


def operator_metric(op: Operator, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    assert match, f"{name} not exported"
    return float(match.group(1))


def apply_service(c: Cluster, **autoscaling) -> None:
    spec = {"minReplicas": 1, "maxReplicas": 6, "targetQueueDepth": 2, "targetP99LatencyMs": 60000,
            "scaleDownStabilizationSeconds": WINDOW, **autoscaling}
    c.apply({"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService",
             "metadata": {"name": NAME, "namespace": NS},
             "spec": {"model": {"source": "hf://org/slow", "format": "python", "name": "slow"},
                      "gpu": {"class": "h100", "count": 1}, "autoscaling": spec}})


def metrics_available(c: Cluster) -> str | None:
    cond = c.condition("infsvc", NAME, NS, "MetricsAvailable")
    return cond and cond["status"]


def test_load_step_scales_up_then_down_after_the_window(scaling_operator: Operator, triton: TritonServer,
                                                        prometheus: Prometheus):
    c = scaling_operator.cluster
    apply_service(c)
    c.kubectl("wait", "--for=condition=Ready", f"infsvc/{NAME}", "-n", NS, "--timeout=60s")
    wait_for("MetricsAvailable=True", lambda: metrics_available(c) == "True", timeout=30)
    assert replicas(c) == 1

    triton.set_delay_ms(100)
    with LoadGenerator(triton.grpc_address, "slow", concurrency=12, duration_s=120) as load:
        seen = wait_for("Prometheus sees the queue", lambda: queue_in_prometheus(prometheus) > 2 and time.monotonic(),
                        timeout=30, interval=0.1)
        scaled = wait_for("scale-up patch", lambda: replicas(c) > 1 and time.monotonic(), timeout=30, interval=0.1)
        reaction = scaled - seen
        print(f"\nreaction: Prometheus saw the queue -> Deployment scaled in {reaction:.2f}s (tick {TICK}s)")
        assert reaction <= 2 * TICK + 0.5, f"scale-up took {reaction:.1f}s, more than two ticks"
        wait_for("6 replicas (queue 11 / target 2)", lambda: replicas(c) == 6, timeout=30)
        status = c.get("infsvc", NAME, NS)["status"]
        assert status["autoscaling"]["desiredReplicas"] == 6
        assert "queue" in status["autoscaling"]["lastDecision"]
        assert status["metrics"]["queueDepth"] > 0
        row = c.kubectl("get", "infsvc", NAME, "-n", NS, "--no-headers").stdout.split()
        assert row[1] == "h100" and float(row[4]) > 0  # the QUEUE column
        time.sleep(3 * TICK)
        assert replicas(c) == 6, "the same load asks for nothing more once capacity is on the way"
    stopped = wait_for("queue drains", lambda: queue_in_prometheus(prometheus) == 0 and time.monotonic(),
                       timeout=30, interval=0.2)
    samples = []
    while time.monotonic() < stopped + WINDOW - 2 * TICK:
        samples.append(replicas(c))
        time.sleep(0.5)
    assert set(samples) == {6}, f"scaled down inside the stabilization window: {samples}"
    wait_for("scale-down begins", lambda: replicas(c) < 6, timeout=WINDOW + 10 * TICK)
    down_at = time.monotonic() - stopped
    print(f"scale-down began {down_at:.1f}s after the load stopped (window {WINDOW}s)")
    history = [replicas(c)]
    wait_for("back to minReplicas", lambda: history.append(replicas(c)) or history[-1] == 1, timeout=60)
    assert all(a - b <= 1 for a, b in zip(history, history[1:])), f"steps larger than 1: {history}"
    events = c.kubectl("get", "events", "-n", NS, "--field-selector", f"involvedObject.name={NAME}",
                       "-o", "custom-columns=REASON:.reason", "--no-headers").stdout.split()
    assert "ScaledUp" in events and "ScaledDown" in events


def test_p99_above_target_with_a_short_queue_scales_up(scaling_operator: Operator, triton: TritonServer,
                                                       prometheus: Prometheus):
    c = scaling_operator.cluster
    apply_service(c, targetQueueDepth=1000, targetP99LatencyMs=100)
    c.kubectl("wait", "--for=condition=Ready", f"infsvc/{NAME}", "-n", NS, "--timeout=60s")
    start = replicas(c)
    triton.set_delay_ms(300)
    with LoadGenerator(triton.grpc_address, "slow", concurrency=1, duration_s=90):
        wait_for("p99 above 100ms in Prometheus", lambda: any(
            v > 100_000 for _, v in prometheus.query_values(
                f'nv_inference_request_summary_us{{inferenceservice="{NAME}",quantile="0.99"}}')), timeout=30)
        wait_for("scale-up on latency", lambda: replicas(c) > start, timeout=6 * TICK)
        assert "p99" in c.get("infsvc", NAME, NS)["status"]["autoscaling"]["lastDecision"]
        assert queue_in_prometheus(prometheus) <= 1  # the queue alone would not have scaled
    triton.set_delay_ms(100)


def test_prometheus_outage_holds_replicas_then_recovers(scaling_operator: Operator, triton: TritonServer,
                                                        prometheus: Prometheus):
    """Without fail-static, an idle service after an outage would drop to minReplicas."""
    c = scaling_operator.cluster
    apply_service(c, minReplicas=1, targetQueueDepth=2, targetP99LatencyMs=60000)
    with LoadGenerator(triton.grpc_address, "slow", concurrency=8, duration_s=60):
        wait_for("scaled up under load", lambda: replicas(c) >= 4, timeout=30)
    held = replicas(c)
    prometheus.kill()
    try:
        cond = wait_for("MetricsAvailable=False", lambda: (x := c.condition("infsvc", NAME, NS, "MetricsAvailable"))
                        and x["status"] == "False" and x, timeout=5 * TICK)
        assert "metrics unavailable" in cond["message"] and f"holding {held} replicas" in cond["message"]
        deadline = time.monotonic() + WINDOW + 5 * TICK  # longer than the window: no scale-down
        while time.monotonic() < deadline:
            assert replicas(c) == held, "replicas changed while metrics were missing"
            time.sleep(0.5)
        events = c.kubectl("get", "events", "-n", NS, "--field-selector",
                           f"involvedObject.name={NAME},reason=MetricsUnavailable", "-o", "name").stdout
        assert events.strip()
    finally:
        prometheus.start()
    wait_for("MetricsAvailable=True again", lambda: metrics_available(c) == "True", timeout=30)
    wait_for("idle service scales down once data is back", lambda: replicas(c) < held, timeout=WINDOW + 10 * TICK)


def test_operator_restart_does_not_jump_replicas(scaling_operator: Operator, triton: TritonServer):
    c = scaling_operator.cluster
    apply_service(c, targetQueueDepth=2)
    with LoadGenerator(triton.grpc_address, "slow", concurrency=8, duration_s=120):
        wait_for("steady under load", lambda: replicas(c) >= 4, timeout=30)
        time.sleep(3 * TICK)
        before = replicas(c)
        scaling_operator.stop()
        samples = [replicas(c)]
        scaling_operator.start()  # waits out the old leader's lease
        deadline = time.monotonic() + 6 * TICK
        while time.monotonic() < deadline:
            samples.append(replicas(c))
            time.sleep(0.5)
    print(f"\nreplicas across the restart: {before} -> {sorted(set(samples))}")
    assert set(samples) == {before}, f"replicas moved across a restart under the same load: {samples}"


def test_one_query_per_signal_per_tick_for_1_and_50_services(scaling_operator: Operator, prometheus: Prometheus):
    c = scaling_operator.cluster
    apply_service(c)

    def per_tick() -> tuple[float, float]:
        wait_for("a tick", lambda: operator_metric(scaling_operator, "triton_operator_prometheus_queries_per_tick") > 0)
        before = prometheus_query_count(prometheus)
        time.sleep(10 * TICK)
        after = prometheus_query_count(prometheus)
        return operator_metric(scaling_operator, "triton_operator_prometheus_queries_per_tick"), (after - before) / 10

    one = per_tick()
    others = [{"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService",
               "metadata": {"name": f"svc-{i:02d}", "namespace": NS},
               "spec": {"model": {"source": "hf://org/m", "format": "onnx"}, "gpu": {"class": "a100-80gb"},
                        "autoscaling": {"maxReplicas": 2}}} for i in range(49)]
    c.apply(others)
    wait_for("50 autoscaled services", lambda: operator_metric(
        scaling_operator, "triton_operator_autoscaled_services") == 50, timeout=60)
    wait_for("50 Deployments", lambda: len(c.get("deployments", namespace=NS)) == 50, timeout=120)
    fifty = per_tick()
    print(f"\nPrometheus queries per tick: 1 service -> {one[0]:.0f} (measured at Prometheus {one[1]:.1f}), "
          f"50 services -> {fifty[0]:.0f} (measured {fifty[1]:.1f})")
    assert one[0] == fifty[0] == 2
    assert fifty[1] <= one[1] + 0.5, "the query count does not grow with the number of services"


def prometheus_query_count(prom: Prometheus) -> float:
    with urllib.request.urlopen(f"{prom.url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(
        r'^prometheus_http_requests_total\{[^}]*handler="/api/v1/query"[^}]*\} ([0-9.e+-]+)$', text, re.M))
