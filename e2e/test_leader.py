"""Two operator replicas, started with exactly the arguments and environment the chart gives its
Deployment (from `helm template`, the liveness address moved to loopback): one leads, the other
waits; a leader killed without a word is replaced within the lease duration; a leader stopped
cleanly gives the lease up at once. (kwok runs no containers, so the chart's pods cannot run the
operator: local processes with the chart's ServiceAccount token stand in for them.)"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from .cluster import ROOT, Cluster, Operator, wait_for
from .conftest import RELEASE, RELEASE_NS
from .test_lifecycle import service, wait_ready

LEASE_SECONDS = 30  # controller/leader.py


def chart_container(cluster: Cluster) -> tuple[list[str], dict[str, str]]:
    """The operator container's args and env as the chart renders them."""
    out = subprocess.run(["helm", "template", RELEASE, str(ROOT / "charts" / "triton-operator"), "-n", RELEASE_NS,
                          "--kube-version", "1.36.0"],
                         capture_output=True, text=True, env=cluster.env, check=True).stdout
    dep = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[e["name"]] = RELEASE_NS  # what the downward API gives the pod
    return container["args"], env


def leading(op: Operator) -> bool:
    return "leading as" in op.log_path.read_text(errors="replace")


@pytest.fixture
def replicas(operator: Operator, tmp_path: Path) -> Iterator[list[Operator]]:
    """The session's operator steps aside (a clean stop: it releases the lease); two replicas with
    the chart's flags take its place; afterwards the session's operator comes back."""
    args, env = chart_container(operator.cluster)
    assert "--leader-elect" in args and not any(a.startswith("--leader-elect-namespace") for a in args), \
        "the chart passes a bare --leader-elect: the namespace comes from the pod"
    args = [a for a in args if a != "run" and not a.startswith("--liveness")]
    env = {**env, **operator.extra_env, "TRITON_OPERATOR_METRICS_PORT": "0"}
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
    wait_for("the second replica to wait for the lease", lambda: "is a follower" in b.log_path.read_text()
             or "waiting to lead" in b.log_path.read_text(), timeout=60)
    c = a.cluster
    c.apply(service("first", ns))
    wait_ready(c, "first", ns)
    assert not leading(b), "only one replica acts"

    a.kill(signal.SIGKILL)  # no clean stop: the lease must expire
    wait_for("the follower to lead", lambda: leading(b), timeout=LEASE_SECONDS + 60)
    wait_for("the new leader's liveness endpoint", b.healthy, timeout=60)
    c.apply(service("second", ns))
    wait_ready(c, "second", ns)
    log = b.log_path.read_text()
    assert re.search(r"leading as \S+", log) and "Traceback" not in log


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
    wait_ready(c, "handover", ns)
