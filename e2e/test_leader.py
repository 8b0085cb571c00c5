"""Two operator replicas, started with exactly the arguments and environment the chart gives its
Deployment (from `helm template`, the liveness address moved to loopback): one leads, the other
waits and answers the chart's probes meanwhile (the kubelet would restart a standby that does
not); a leader killed without a word, frozen (SIGSTOP) or cut off from the API server (the fault
proxy: a silent partition) is replaced within the lease duration, a blip shorter than the renew
deadline costs it nothing, and a frozen or cut-off leader that comes back
exits instead of acting beside the new one; a leader stopped cleanly gives the lease up at once.
(kwok runs no containers, so the chart's pods cannot run the operator: local processes with the
chart's ServiceAccount token stand in for them, and the kubelet's probes are applied by
ProbeSampler with the chart's own probe settings.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import pytest
import yaml

from .cluster import ROOT, Cluster, Operator, wait_for
from .conftest import RELEASE, RELEASE_NS
from .harness.faultproxy import FaultProxy
from .test_lifecycle import service

LEASE_SECONDS, RENEW_DEADLINE_SECONDS = 30, 20  # kube/leader.py
# How long the standby is probed while the leader holds the lease (bench/standby.py sets 600).
STANDBY_SECONDS = float(os.environ.get("E2E_STANDBY_SECONDS", "10"))


def chart_deployment(cluster: Cluster) -> dict:
    out = subprocess.run(["helm", "template", RELEASE, str(ROOT / "charts" / "triton-operator"), "-n", RELEASE_NS,
                          "--kube-version", "1.36.0"],
                         capture_output=True, text=True, env=cluster.env, check=True).stdout
    return next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment")


def chart_container(cluster: Cluster) -> tuple[list[str], dict[str, str]]:
    """The operator container's args and env as the chart renders them."""
    container = chart_deployment(cluster)["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[e["name"]] = RELEASE_NS  # what the downward API gives the pod
    return container["args"], env


class ProbeSampler:
    """The kubelet's probe of one container, with the chart's settings: a GET every periodSeconds
    with timeoutSeconds; `failureThreshold` failures in a row (3 by default) would restart it."""

    def __init__(self, url: str, probe: dict):
        self.url, self.period = url, float(probe.get("periodSeconds", 10))
        self.timeout, self.threshold = float(probe.get("timeoutSeconds", 1)), int(probe.get("failureThreshold", 3))
        self.results: list[bool] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=self.timeout) as r:
                    self.results.append(r.status == 200)
            except OSError:
                self.results.append(False)
            self._stop.wait(self.period)

    def start(self) -> "ProbeSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 1)

    def worst_streak(self) -> int:
        worst = run = 0
        for ok in self.results:
            run = 0 if ok else run + 1
            worst = max(worst, run)
        return worst


def metric(op: Operator, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def leading(op: Operator) -> bool:
    return "leading as" in op.log_since_start()


@pytest.fixture
def replicas(operator: Operator, tmp_path: Path) -> Iterator[list[Operator]]:
    """The session's operator steps aside (a clean stop: it releases the lease); two replicas with
    the chart's flags take its place; afterwards the session's operator comes back."""
    args, env = chart_container(operator.cluster)
    assert "--leader-elect" in args and not any(a.startswith("--leader-elect-namespace") for a in args), \
        "the chart passes a bare --leader-elect: the namespace comes from the pod"
    args = [a for a in args if a != "run" and not a.startswith("--liveness")]
    # each replica's metrics on a loopback port of its own (the harness's), not the chart's 8081
    env = {k: v for k, v in {**env, **operator.extra_env}.items()
           if k not in ("TRITON_OPERATOR_METRICS_PORT", "TRITON_OPERATOR_METRICS_ADDRESS")}
    operator.stop()
    ops = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        ops.append(Operator(operator.cluster, tmp_path / name, extra_env=env, kubeconfig=operator.kubeconfig, args=args))
    try:
        yield ops
    finally:
        for op in ops:
            op.stop()
        operator.start()


def test_one_replica_leads_and_a_follower_takes_over_when_it_dies(replicas: list[Operator], ns: str):
    a, b = replicas
    a.start()
    assert leading(a)
    b.start(wait=False)
    wait_for("the standby to answer its probes", b.healthy, timeout=30)
    assert "waiting to lead" in b.log_path.read_text()
    pod = chart_deployment(a.cluster)["spec"]["template"]["spec"]["containers"][0]
    path = pod["livenessProbe"]["httpGet"]["path"]
    assert pod["readinessProbe"]["httpGet"]["path"] == path
    probes = ProbeSampler(f"http://127.0.0.1:{b.port}{path}", {**pod["livenessProbe"], "periodSeconds": 2}).start()
    assert (metric(a, "triton_operator_leader"), metric(b, "triton_operator_leader")) == (1.0, 0.0), \
        "every replica serves its metrics; the gauge says which leads"
    c = a.cluster
    c.apply(service("first", ns))
    c.wait_ready("first", ns, timeout=90)
    assert not leading(b), "only one replica acts"
    # More probes of the standby while the leader holds the lease (make bench-standby: 10 minutes).
    time.sleep(STANDBY_SECONDS)
    probes.stop()
    print(f"standby probed for {STANDBY_SECONDS:.0f} s: {sum(probes.results)}/{len(probes.results)} probes answered 200, "
          f"worst failure streak {probes.worst_streak()} (the kubelet restarts at {probes.threshold})")
    assert len(probes.results) >= 5 and all(probes.results), \
        f"the standby failed the chart's probe: {probes.results} (the kubelet restarts it at {probes.threshold})"

    a.kill(signal.SIGKILL)  # no clean stop: the lease must expire
    killed = time.monotonic()
    wait_for("the follower to lead", lambda: leading(b), timeout=LEASE_SECONDS + 60)
    print(f"failover after SIGKILL: {time.monotonic() - killed:.1f} s (lease {LEASE_SECONDS} s)")
    assert time.monotonic() - killed <= LEASE_SECONDS + 15
    wait_for("the new leader's liveness endpoint", b.healthy, timeout=60)
    assert metric(b, "triton_operator_leader") == 1.0
    c.apply(service("second", ns))
    c.wait_ready("second", ns, timeout=90)
    log = b.log_path.read_text()
    assert re.search(r"leading as \S+", log) and "Traceback" not in log


def test_a_frozen_leader_is_replaced_and_exits_when_it_thaws(replicas: list[Operator], ns: str):
    """SIGSTOP: the process holds its connections but renews nothing (a node under memory pressure,
    a debugger). The follower leads once the lease expires; the old leader, resumed, finds that it
    lost the lease and exits (its pod would restart as a standby) instead of acting beside it."""
    a, b = replicas
    a.start()
    b.start(wait=False)
    wait_for("the standby", lambda: "waiting to lead" in b.log_path.read_text(), timeout=60)
    assert a.proc is not None
    a.proc.send_signal(signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        wait_for("the follower to lead", lambda: leading(b), timeout=LEASE_SECONDS + 60)
        print(f"failover after SIGSTOP: {time.monotonic() - frozen:.1f} s (lease {LEASE_SECONDS} s)")
    finally:
        a.proc.send_signal(signal.SIGCONT)
    code = a.proc.wait(timeout=60)
    assert code == 1 and "lost the leader lease" in a.log_path.read_text(), a.log_tail()
    c = b.cluster
    c.apply(service("after-freeze", ns))
    c.wait_ready("after-freeze", ns, timeout=90)


def test_a_leader_cut_off_from_the_api_server_steps_down(replicas: list[Operator], ns: str, tmp_path: Path):
    """Between the leader and the API server, the fault proxy. A blip shorter than the renew
    deadline (every connection reset for 8 s, one renewal missed) leaves it leading and renewing.
    A silent partition (the proxy holds every byte, nothing is ever answered or refused): each
    renewal times out, the leader stops leading after the renew deadline and exits; the follower
    leads once the lease expires."""
    a, b = replicas
    config = yaml.safe_load(Path(a.kubeconfig).read_text())
    server = urlparse(config["clusters"][0]["cluster"]["server"])
    proxy = FaultProxy(f"{server.hostname}:{server.port}").start()
    try:
        config["clusters"][0]["cluster"]["server"] = f"https://{proxy.address}"
        via = tmp_path / "via-proxy.kubeconfig"
        via.write_text(yaml.safe_dump(config))
        via.chmod(0o600)
        a.kubeconfig = str(via)
        a.start()
        assert leading(a)
        b.start(wait=False)
        wait_for("the standby", lambda: "waiting to lead" in b.log_path.read_text(), timeout=60)
        assert a.proc is not None

        proxy.mode("reset")
        time.sleep(8)
        proxy.mode("pass")
        assert proxy.injected["reset"] >= 1
        renewed = a.log_since_start().count("successfully acquired lease")
        wait_for("a renewal after the blip",
                 lambda: a.log_since_start().count("successfully acquired lease") > renewed, timeout=30)
        assert a.proc.poll() is None and "lost the leader lease" not in a.log_since_start(), a.log_tail()
        assert "Error retrieving resource lock" in a.log_since_start(), "the blip cost a renewal"

        proxy.mode("delay", seconds=3600)
        cut = time.monotonic()
        code = a.proc.wait(timeout=RENEW_DEADLINE_SECONDS + 40)
        stepped_down = time.monotonic() - cut
        assert code == 1 and "lost the leader lease" in a.log_path.read_text(), a.log_tail()
        wait_for("the follower to lead", lambda: leading(b), timeout=LEASE_SECONDS + 60)
        print(f"silent partition: the leader stepped down after {stepped_down:.1f} s (renew deadline "
              f"{RENEW_DEADLINE_SECONDS} s), the follower led after {time.monotonic() - cut:.1f} s")
        c = b.cluster
        c.apply(service("after-partition", ns))
        c.wait_ready("after-partition", ns, timeout=90)
    finally:
        proxy.stop()


def test_a_clean_stop_hands_the_lease_over_at_once(replicas: list[Operator], ns: str):
    a, b = replicas
    a.start()
    b.start(wait=False)
    wait_for("the second replica to wait for the lease", lambda: "waiting to lead" in b.log_path.read_text(),
             timeout=60)
    a.stop()
    assert "released the lease" in a.log_path.read_text()
    # The lease was given up: the follower's next retry (every 5 s) takes it, long before it expires.
    wait_for("the follower to lead", lambda: leading(b), timeout=LEASE_SECONDS - 10)
    wait_for("the new leader's liveness endpoint", b.healthy, timeout=60)
    c = b.cluster
    c.apply(service("handover", ns))
    c.wait_ready("handover", ns, timeout=90)
