"""Real faults between the operator and what it talks to: a TCP fault proxy
(e2e/harness/faultproxy.py) sits between the operator and the API server, and between the
autoscaler and a real Prometheus. Resets, refusals, delays and HTTP 503s become retries with
backoff, held replicas and conditions, never a crash, a traceback or a log line per object per
retry. Prometheus scrapes a small exporter that holds Triton's two series for the services (a
real Triton adds nothing here: the series' values are what the test controls)."""

from __future__ import annotations

import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

import pytest
import yaml

from .cluster import Operator, wait_for
from .harness import free_port
from .harness.faultproxy import FaultProxy
from .harness.prometheus import Prometheus, Target
from .test_lifecycle import service

TICK = 2.0


class Exporter:
    """nv_inference_pending_request_count and the p99 summary for the services named in `values`."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], float] = {}
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                lines = []
                for (ns, name), queue in list(exporter.values.items()):
                    labels = f'namespace="{ns}",inferenceservice="{name}",model="m"'
                    lines += [f"nv_inference_pending_request_count{{{labels}}} {queue}",
                              f'nv_inference_request_summary_us{{{labels},quantile="0.99"}} 100000']
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()


class Faulty:
    def __init__(self, operator: Operator, api: FaultProxy, prometheus: FaultProxy, exporter: Exporter):
        self.operator, self.api, self.prometheus, self.exporter = operator, api, prometheus, exporter

    def log_since(self, offset: int) -> str:
        return self.operator.log_path.read_bytes()[offset:].decode(errors="replace")

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.operator.metrics_port}/metrics", timeout=5) as r:
            return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                       if line.startswith(name))


@pytest.fixture(scope="module")
def faulty(operator: Operator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faulty]:
    """The session's operator steps aside; one whose API server and Prometheus are reached through
    fault proxies takes its place (same ServiceAccount token), and the session's comes back after."""
    work = tmp_path_factory.mktemp("faulty")
    config = yaml.safe_load(Path(operator.kubeconfig).read_text())
    server = urlparse(config["clusters"][0]["cluster"]["server"])
    api = FaultProxy(f"{server.hostname}:{server.port}").start()
    config["clusters"][0]["cluster"]["server"] = f"https://{api.address}"
    kubeconfig = work / "via-proxy.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    kubeconfig.chmod(0o600)
    exporter = Exporter()
    prom = Prometheus([Target(exporter.address)], scrape_interval="1s")
    prom.start()
    prom_proxy = FaultProxy(prom.address).start()
    # Without leader election: a leader that cannot renew its lease for 20 s stops on purpose
    # (test_leader.py); here the point is what an outage does to the controller itself.
    faulty_op = Operator(operator.cluster, work, kubeconfig=str(kubeconfig), args=[],
                         extra_env={**operator.extra_env, "TRITON_OPERATOR_PROMETHEUS_URL": f"http://{prom_proxy.address}",
                                    "TRITON_OPERATOR_AUTOSCALE_INTERVAL_SECONDS": str(TICK),
                                    "TRITON_OPERATOR_PROMETHEUS_TIMEOUT_SECONDS": "2"})
    operator.stop()
    faulty_op.start()
    try:
        yield Faulty(faulty_op, api, prom_proxy, exporter)
    finally:
        faulty_op.stop()
        for closer in (prom_proxy.stop, prom.close, exporter.close, api.stop):
            closer()
        operator.start()


def test_an_api_outage_is_retried_with_backoff_and_a_bounded_log(faulty: Faulty, ns: str):
    op, c = faulty.operator, faulty.operator.cluster
    c.apply([service(f"calm-{i}", ns) for i in range(5)])
    for i in range(5):
        c.wait_ready(f"calm-{i}", ns, timeout=90)
    offset = op.log_path.stat().st_size

    faulty.api.mode("reset")  # every connection the operator holds or opens is reset
    c.apply([service(f"calm-{i}", ns, replicas=2) for i in range(5)])  # kubectl reaches the API server directly
    c.apply(service("during", ns))
    wait_for("the operator to meet the outage", lambda: faulty.api.injected["reset"] >= 10, timeout=60)
    time.sleep(20)  # an outage long enough for every informer and retry to fail several times
    assert op.proc is not None and op.proc.poll() is None, "the operator rides the outage out"
    during = faulty.log_since(offset)
    warnings = [line for line in during.splitlines() if "WARNING" in line or "ERROR" in line]
    assert warnings, "the outage is reported"
    assert len(warnings) <= 20, f"a summary per interval, not a line per object per retry:\n{during[-3000:]}"
    assert c.get("deployment", "during", ns) is None

    faulty.api.mode("pass")
    c.wait_ready("during", ns, timeout=120)
    for i in range(5):
        wait_for(f"calm-{i} at generation 2 with 2 replicas", lambda i=i: (s := (c.get("infsvc", f"calm-{i}", ns) or {})
                 .get("status") or {}) and s.get("observedGeneration") == 2 and s.get("readyReplicas") == 2, timeout=120)
    log = faulty.log_since(offset)
    assert "recovered" in log and "Traceback" not in log


def test_a_slow_api_server_still_converges(faulty: Faulty, ns: str):
    c = faulty.operator.cluster
    faulty.api.mode("delay", seconds=0.5)
    try:
        c.apply(service("slow", ns, replicas=2))
        c.wait_ready("slow", ns, timeout=120)
        assert faulty.api.injected["delay"] > 0
    finally:
        faulty.api.mode("pass")


def test_prometheus_errors_hold_replicas_and_say_why(faulty: Faulty, ns: str):
    op, c = faulty.operator, faulty.operator.cluster
    faulty.exporter.values[(ns, "scaled")] = 0.0
    c.apply(service("scaled", ns, autoscaling={"minReplicas": 1, "maxReplicas": 4, "targetQueueDepth": 4,
                                               "scaleDownStabilizationSeconds": 0}))
    wait_for("MetricsAvailable=True", lambda: (m := c.condition("infsvc", "scaled", ns, "MetricsAvailable"))
             and m["status"] == "True", timeout=90)
    c.wait_ready("scaled", ns, timeout=90)

    faulty.prometheus.mode("http_error", status=503)
    faulty.exporter.values[(ns, "scaled")] = 20.0  # load the autoscaler must not see during the outage
    cond = wait_for("MetricsAvailable=False", lambda: (m := c.condition("infsvc", "scaled", ns, "MetricsAvailable"))
                    and m["status"] == "False" and m, timeout=60)
    assert cond["reason"] == "MetricsUnavailable" and "holding 1 replicas" in cond["message"], cond
    held = faulty.metric('triton_operator_autoscaler_decisions_total{direction="hold_no_metrics"}')
    wait_for("two more ticks holding", lambda: faulty.metric(
        'triton_operator_autoscaler_decisions_total{direction="hold_no_metrics"}') >= held + 2, timeout=60)
    assert c.get("deployment", "scaled", ns)["spec"]["replicas"] == 1, "an outage is not read as load, nor as no load"
    assert faulty.prometheus.injected["http_error"] > 0
    events = c.kubectl("get", "events", "-n", ns, "--field-selector",
                       "involvedObject.name=scaled,reason=MetricsUnavailable", "-o", "name").stdout
    assert events.strip()

    faulty.prometheus.mode("pass")
    wait_for("scaled up once metrics are back", lambda: c.get("deployment", "scaled", ns)["spec"]["replicas"] == 4,
             timeout=90)
    assert c.condition("infsvc", "scaled", ns, "MetricsAvailable")["status"] == "True"
    assert "Traceback" not in op.log_path.read_text()


class DeploymentWatch:
    """Every Deployment created in a namespace, seen from outside the operator (a watch of the
    test's own, straight to the API server): name, the uid of the InferenceService owning it, when."""

    def __init__(self, cluster: Any, namespace: str) -> None:
        from kubernetes import client, config, watch

        configuration = client.Configuration()
        config.load_kube_config(config_file=cluster.kubeconfig, client_configuration=configuration)
        self.api = client.AppsV1Api(client.ApiClient(configuration))
        self.created: list[tuple[str, str, float]] = []
        self.watch = watch.Watch()
        self.namespace = namespace
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        seen: set[str] = set()
        while True:
            try:
                for event in self.watch.stream(self.api.list_namespaced_deployment, self.namespace,
                                               timeout_seconds=300):
                    d = event["object"]
                    if event["type"] == "ADDED" and d.metadata.uid not in seen:
                        seen.add(d.metadata.uid)
                        owners = [o.uid for o in d.metadata.owner_references or []]
                        self.created.append((d.metadata.name, owners[0] if owners else "", time.monotonic()))
            except Exception:  # noqa: BLE001 - a stream ends; watch again (ADDED replays what exists)
                time.sleep(0.2)

    def stop(self) -> None:
        self.watch.stop()


@pytest.mark.parametrize("outage", [30, 90])
def test_after_an_api_outage_changes_converge_within_seconds_and_nothing_is_made_for_a_deleted_service(
        faulty: Faulty, ns: str, outage: int):
    """Services are deleted while the operator cannot reach the API server; when it can again,
    changes made after that converge within 5 s (the watches wait for the server to answer, not
    for a doubling pause), and no Deployment is ever created for a deleted service (the
    InferenceServices are listed again before anything is written, and an owner is read afresh
    before a child of its is created)."""
    c = faulty.operator.cluster
    gone = [f"gone-{outage}-{i}" for i in range(3)]
    kept = [f"kept-{outage}-{i}" for i in range(2)]
    c.apply([service(n, ns) for n in gone + kept])
    for n in gone + kept:
        wait_for(f"{n}'s Deployment", lambda n=n: c.get("deployment", n, ns), timeout=60)
    uids = {n: c.get("infsvc", n, ns)["metadata"]["uid"] for n in gone}
    watcher = DeploymentWatch(c, ns)
    try:
        time.sleep(1.0)
        faulty.api.mode("reset")
        cut = time.monotonic()
        time.sleep(2.0)
        c.kubectl("delete", "infsvc", *gone, "-n", ns, "--wait=false")
        deleted = time.monotonic()
        for n in gone:   # the garbage collector removes their Deployments meanwhile
            wait_for(f"{n}'s Deployment collected", lambda n=n: c.get("deployment", n, ns) is None, timeout=60)
        time.sleep(max(0.0, cut + outage - time.monotonic()))
        faulty.api.mode("pass")
        back = time.monotonic()
        c.apply([service(n, ns, replicas=2) for n in kept] + [service(f"new-{outage}", ns)])

        def converged() -> bool:
            deps = [c.get("deployment", n, ns) for n in kept]
            return all(d is not None and d["spec"].get("replicas") == 2 for d in deps) and c.get(
                "deployment", f"new-{outage}", ns) is not None
        wait_for("the changes made after the outage", converged, timeout=60, interval=0.2)
        took = time.monotonic() - back
        print(f"\nafter a {outage} s API outage: changes converged {took:.1f} s after the API server came back")
        assert took <= 5.0, f"{took:.1f} s to converge after a {outage} s outage"
        time.sleep(5.0)   # and nothing comes back for the deleted services afterwards either
        made = [(name, owner) for name, owner, t in watcher.created if owner in uids.values() and t > deleted]
        assert made == [], f"Deployments created for deleted services: {made}"
        assert all(c.get("deployment", n, ns) is None for n in gone)
    finally:
        watcher.stop()
