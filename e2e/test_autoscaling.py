"""Autoscaling end to end: a real Triton server (from the nvidia-pytriton wheel, on CPU) under a
tritonclient load generator, a real Prometheus scraping it every second, and the operator scaling
a Deployment in the local cluster.

Mocked, because no GPU runs here: the InferenceService's pods are kwok-simulated, so the real
Triton stands in for them; Prometheus attaches the labels a PodMonitor would give the pods'
series (namespace, inferenceservice). Queue per replica is Triton's queue over the ready count of
the simulated Deployment.

Timing: the tests wait for events and conditions with generous bounds (the machine may be loaded)
and observe the Deployment through a watch (kubernetes client), not by polling kubectl. Speed is
printed, in seconds and autoscaler ticks, not asserted: the autoscaling benchmark measures it
(make bench-autoscaling). What is asserted are orderings: nothing scales down sooner than the
window after the load, every scale-down step (the first one too) removes one replica, replicas do
not move across an operator restart or a metrics outage.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from typing import Any, Callable, Iterator

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

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
    """The session's operator, restarted with Prometheus and a 2 s autoscaler tick. The one real
    Triton speaks for every simulated pod, so the pods-reporting signal counts it as all of them
    (by default it counts scraped pods, and fewer than ready would hold every scale-down)."""
    saved = dict(operator.extra_env)
    operator.extra_env.update({"TRITON_OPERATOR_PROMETHEUS_URL": prometheus.url,
                               "TRITON_OPERATOR_AUTOSCALE_INTERVAL_SECONDS": str(TICK),
                               "TRITON_OPERATOR_REPORTING_QUERY":
                                   'count by ($namespace, $service) (nv_inference_pending_request_count{$service!=""}) * 1000'})
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


class ReplicaLog:
    """Every change of one Deployment's spec.replicas as (wall-clock time, replicas), recorded by
    a watch on its own thread (relisting after a 410 or a dropped connection)."""

    def __init__(self, c: Cluster, namespace: str = NS, name: str = NAME):
        self.apps = client.AppsV1Api(config.new_client_from_config(config_file=c.kubeconfig))
        self.namespace, self.selector = namespace, f"metadata.name={name}"
        self.changes: list[tuple[float, int]] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica-log", daemon=True)

    def __enter__(self) -> ReplicaLog:
        self._thread.start()
        self.wait(lambda n: n is not None, "the Deployment in the watch", timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _record(self, replicas: int | None) -> None:
        with self._cond:
            if replicas is not None and (not self.changes or self.changes[-1][1] != replicas):
                self.changes.append((time.time(), replicas))
                self._cond.notify_all()

    def _run(self) -> None:
        version = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = self.apps.list_namespaced_deployment(self.namespace, field_selector=self.selector)
                    for dep in listed.items:
                        self._record(dep.spec.replicas)
                    version = listed.metadata.resource_version
                for event in watch.Watch().stream(self.apps.list_namespaced_deployment, self.namespace,
                                                  field_selector=self.selector, resource_version=version,
                                                  timeout_seconds=5):
                    version = event["object"].metadata.resource_version
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._record(event["object"].spec.replicas)
                    if self._stop.is_set():
                        return
            except ApiException as e:
                version = None if e.status == 410 else version
                self._stop.wait(0.5)
            except (HTTPError, OSError):
                version = None
                self._stop.wait(0.5)

    @property
    def current(self) -> int | None:
        with self._cond:
            return self.changes[-1][1] if self.changes else None

    def wait(self, predicate: Callable[[int | None], bool], what: str, timeout: float) -> float:
        """Waits until `predicate(replicas)` holds; returns the wall-clock time of that change."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                replicas = self.changes[-1][1] if self.changes else None
                if predicate(replicas):
                    return self.changes[-1][0] if self.changes else time.time()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}; replicas {self.changes}")
                self._cond.wait(left)

    def since(self, t: float) -> list[tuple[float, int]]:
        with self._cond:
            return [change for change in self.changes if change[0] >= t]


def service_status(c: Cluster) -> dict[str, Any]:
    api = client.CustomObjectsApi(config.new_client_from_config(config_file=c.kubeconfig))
    return api.get_namespaced_custom_object(GROUP, "v1alpha1", NS, "inferenceservices", NAME).get("status") or {}


def metrics_condition(c: Cluster) -> dict[str, Any] | None:
    return next((x for x in service_status(c).get("conditions") or [] if x["type"] == "MetricsAvailable"), None)


def wait_metrics_available(c: Cluster, status: str, timeout: float = 60) -> dict[str, Any]:
    """Polls the InferenceService through the kubernetes client (every 0.5 s)."""
    return wait_for(f"MetricsAvailable={status}", lambda: (x := metrics_condition(c)) and x["status"] == status and x,
                    timeout=timeout)


def queue_in_prometheus(prom: Prometheus) -> float:
    values = prom.query_values(f'sum(nv_inference_pending_request_count{{inferenceservice="{NAME}"}})')
    return max((v for _, v in values), default=0.0)


def queue_times(prom: Prometheus, since: float, threshold: float = 0.0) -> list[float]:
    """Wall-clock times (0.5 s steps) since `since` at which Prometheus had the queue above `threshold`."""
    series = prom.query_range(f'sum(nv_inference_pending_request_count{{inferenceservice="{NAME}"}})',
                              since, time.time(), 0.5)
    return [float(t) for s in series for t, v in s["values"] if float(v) > threshold]


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


def scale_events(c: Cluster) -> list[str]:
    return c.kubectl("get", "events", "-n", NS, "--field-selector", f"involvedObject.name={NAME}",
                     "-o", "custom-columns=REASON:.reason", "--no-headers").stdout.split()


def test_load_step_scales_up_then_down_after_the_window(scaling_operator: Operator, triton: TritonServer,
                                                        prometheus: Prometheus):
    c = scaling_operator.cluster
    apply_service(c)
    c.wait_ready(NAME, NS, timeout=120)
    wait_metrics_available(c, "True")
    triton.set_delay_ms(100)
    with ReplicaLog(c) as log:
        assert log.current == 1
        began = time.time()
        with LoadGenerator(triton.grpc_address, "slow", concurrency=12, duration_s=120):
            scaled = log.wait(lambda n: n > 1, "a scale-up", timeout=90)
            seen = min(queue_times(prometheus, began, threshold=2), default=scaled)
            print(f"\nreaction: Prometheus had the queue -> Deployment scaled in {scaled - seen:.1f}s "
                  f"({(scaled - seen) / TICK:.1f} ticks of {TICK}s)")
            log.wait(lambda n: n == 6, "6 replicas (queue 11 / target 2)", timeout=90)
            # The reconcile writes the Deployment, then status: the watch can see 6 replicas before
            # status says so.
            status = wait_for("status.autoscaling.desiredReplicas 6", lambda: (
                st := service_status(c)).get("autoscaling", {}).get("desiredReplicas") == 6 and st, timeout=15)
            assert "queue" in status["autoscaling"]["lastDecision"]
            assert status["metrics"]["queueDepth"] > 0
            header, row = (line.split() for line in c.kubectl("get", "infsvc", NAME, "-n", NS).stdout.splitlines()[:2])
            columns = dict(zip(header, row))   # by name: the printer columns grow (Classes, Zero)
            assert columns["GPU"] == "h100" and float(columns["QUEUE"]) > 0
            loaded_until = time.time()
        log.wait(lambda n: n == 1, "back to minReplicas", timeout=WINDOW + 180)
        changes = log.since(began)
    print(f"replicas: {[(round(t - began, 1), n) for t, n in changes]}")
    counts = [n for _, n in changes]
    peak = counts.index(6)
    assert counts[:peak + 1] == sorted(counts[:peak + 1]), f"replicas went down under a steady load: {counts}"
    assert counts[peak + 1] == 5, f"the first scale-down step is not 6 -> 5: {counts}"
    assert all(a - b == 1 for a, b in zip(counts[peak:], counts[peak + 1:])), f"scale-down steps: {counts}"
    # Nothing scales down within the window after the last tick that asked for 6 replicas: it saw
    # Prometheus's last sample with more than 10 queued (ceil(queue / 2) = 6), at most one tick
    # earlier, and the range query shows a sample up to one scrape after it was taken.
    first_down = changes[peak + 1][0]
    last_busy = max(queue_times(prometheus, began, threshold=10), default=loaded_until)
    print(f"scale-down began {first_down - last_busy:.1f}s after the last queue of 6 replicas (window {WINDOW}s)")
    assert first_down >= last_busy + WINDOW - TICK - 2, "scaled down inside the stabilization window"
    events = scale_events(c)
    assert "ScaledUp" in events and "ScaledDown" in events


def test_p99_made_of_service_time_is_reported_not_chased(scaling_operator: Operator, triton: TritonServer,
                                                         prometheus: Prometheus):
    """One request at a time, 300 ms each, against a 100 ms p99 target: nothing waits, so more
    replicas would not shorten it. The operator says so (status and a Warning) and scales nothing."""
    c = scaling_operator.cluster
    apply_service(c, targetQueueDepth=1000, targetP99LatencyMs=100)
    c.wait_ready(NAME, NS, timeout=120)
    triton.set_delay_ms(300)
    try:
        with ReplicaLog(c) as log, LoadGenerator(triton.grpc_address, "slow", concurrency=1, duration_s=300):
            began, start = time.time(), log.current
            # Up to two summary windows after the last queue (the previous test's) before the
            # latency is known to be service time alone.
            decision = wait_for("the p99 target reported out of reach", lambda: (
                d := service_status(c).get("autoscaling", {}).get("lastDecision", "")) and "service time" in d and d,
                timeout=240, interval=1)
            assert "more replicas would not meet it" in decision and log.current == start
            assert log.since(began) == [], f"replicas changed chasing service time: {log.since(began)}"
            assert queue_in_prometheus(prometheus) == 0
        events = c.kubectl("get", "events", "-n", NS, "--field-selector",
                           f"involvedObject.name={NAME},reason=TargetUnattainable", "-o", "name").stdout
        assert events.strip()
    finally:
        triton.set_delay_ms(100)


def test_p99_above_target_with_a_short_queue_scales_up(scaling_operator: Operator, triton: TritonServer,
                                                       prometheus: Prometheus):
    """Two requests at a time against one Triton instance: one waits (a queue of 1, far below
    targetQueueDepth 1000), and p99 (waiting + service) is over target: latency asks for more."""
    c = scaling_operator.cluster
    apply_service(c, targetQueueDepth=1000, targetP99LatencyMs=100)
    c.wait_ready(NAME, NS, timeout=120)
    triton.set_delay_ms(300)
    try:
        with ReplicaLog(c) as log, LoadGenerator(triton.grpc_address, "slow", concurrency=2, duration_s=180):
            start = log.current
            wait_for("p99 above 100ms in Prometheus", lambda: any(
                v > 100_000 for _, v in prometheus.query_values(
                    f'nv_inference_request_summary_us{{inferenceservice="{NAME}",quantile="0.99"}}')), timeout=60)
            try:
                log.wait(lambda n: n > start, "a scale-up on latency", timeout=120)
            except AssertionError as e:
                raise AssertionError(f"{e}; last decision: {service_status(c).get('autoscaling')}") from None
            assert "p99" in service_status(c)["autoscaling"]["lastDecision"]
            assert queue_in_prometheus(prometheus) <= 2  # the queue alone (target 1000) would not have scaled
    finally:
        triton.set_delay_ms(100)


def test_prometheus_outage_holds_replicas_then_recovers(scaling_operator: Operator, triton: TritonServer,
                                                        prometheus: Prometheus):
    """Without fail-static, an idle service after an outage would drop to minReplicas."""
    c = scaling_operator.cluster
    apply_service(c, minReplicas=1, targetQueueDepth=2, targetP99LatencyMs=60000)
    with ReplicaLog(c) as log:
        with LoadGenerator(triton.grpc_address, "slow", concurrency=8, duration_s=90):
            log.wait(lambda n: n >= 4, "a scale-up under load", timeout=90)
        held = log.current
        prometheus.kill()
        killed = time.time()
        try:
            cond = wait_metrics_available(c, "False")
            assert "metrics unavailable" in cond["message"] and f"holding {held} replicas" in cond["message"]
            # Longer than the window: an idle service would have scaled down by now.
            time.sleep(WINDOW + 5 * TICK)
            assert log.since(killed) == [], f"replicas changed while metrics were missing: {log.since(killed)}"
            events = c.kubectl("get", "events", "-n", NS, "--field-selector",
                               f"involvedObject.name={NAME},reason=MetricsUnavailable", "-o", "name").stdout
            assert events.strip()
        finally:
            prometheus.start()
        wait_metrics_available(c, "True")
        log.wait(lambda n: n < held, "the idle service scaling down once data is back", timeout=WINDOW + 120)


def test_operator_restart_does_not_jump_replicas(scaling_operator: Operator, triton: TritonServer):
    c = scaling_operator.cluster
    apply_service(c, targetQueueDepth=2)
    with ReplicaLog(c) as log, LoadGenerator(triton.grpc_address, "slow", concurrency=8, duration_s=180):
        log.wait(lambda n: n >= 4, "a scale-up under load", timeout=90)
        steady = log.changes[-1][0]
        wait_for("no change for three ticks", lambda: time.time() - log.changes[-1][0] >= 3 * TICK, timeout=90)
        before = log.current
        restarted = time.time()
        scaling_operator.stop()
        scaling_operator.start()  # waits out the old leader's lease
        wait_for("a few ticks of the new operator", lambda: operator_metric(
            scaling_operator, "triton_operator_autoscaled_services") >= 1, timeout=60)
        time.sleep(6 * TICK)
        moved = log.since(restarted)
    print(f"\nreplicas across the restart: {before} -> {moved or 'unchanged'} (steady since {restarted - steady:.0f}s)")
    assert moved == [], f"replicas moved across a restart under the same load: {moved}"


def test_one_query_per_tick_for_1_and_50_services(scaling_operator: Operator, prometheus: Prometheus):
    """Issue 9: a tick makes at most 2 Prometheus queries whatever the number of services; the
    autoscaler makes one (every signal in one union)."""
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
        scaling_operator, "triton_operator_autoscaled_services") == 50, timeout=120)
    wait_for("50 Deployments", lambda: len(c.get("deployments", namespace=NS)) == 50, timeout=180)
    fifty = per_tick()
    print(f"\nPrometheus queries per tick: 1 service -> {one[0]:.0f} (measured at Prometheus {one[1]:.1f}), "
          f"50 services -> {fifty[0]:.0f} (measured {fifty[1]:.1f})")
    assert one[0] == fifty[0] == 1
    assert fifty[1] <= one[1] + 0.5, "the query count does not grow with the number of services"


def prometheus_query_count(prom: Prometheus) -> float:
    with urllib.request.urlopen(f"{prom.url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(
        r'^prometheus_http_requests_total\{[^}]*handler="/api/v1/query"[^}]*\} ([0-9.e+-]+)$', text, re.M))
