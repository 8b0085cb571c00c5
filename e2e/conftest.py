"""End-to-end fixtures: a real local control plane with simulated GPU nodes, and the operator.

The cluster is hack/cluster.sh's (kube-apiserver, etcd, controller-manager, scheduler and kwok,
all real binaries). Set E2E_USE_EXISTING_CLUSTER=1 to run against the cluster $KUBECONFIG names
instead (kind, a cloud); set E2E_KEEP_CLUSTER=1 to leave the local one running afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from .cluster import ROOT, Cluster, Operator, wait_for
from .harness.gateway import GatewayProcess

CLUSTER_NAME = os.environ.get("E2E_CLUSTER_NAME", "triton-e2e")


FAILURE_LOGS = Path.home() / ".cache" / "triton-operator" / "e2e-failures"
LOG_TAIL_BYTES = 4 << 20


def keep_cluster_logs() -> Path | None:
    """After a session with failures, the last 4 MiB of each control-plane component's log (kwok,
    controller-manager, scheduler, apiserver, etcd, the audit log) and the operator's, in
    ~/.cache/triton-operator/e2e-failures/<time>/ (the newest three kept): what happened in the
    cluster while a test waited, which a CI log does not show."""
    logs = subprocess.run([ROOT / "hack" / "cluster.sh", "logs", CLUSTER_NAME], capture_output=True, text=True)
    src = Path(logs.stdout.strip()) if logs.returncode == 0 else None
    if src is None or not src.is_dir():
        return None
    dest = FAILURE_LOGS / time.strftime("%Y%m%d-%H%M%S")
    dest.mkdir(parents=True, exist_ok=True)
    files = [*src.iterdir()]
    if (op := _SHARED.get("operator")) is not None:
        files.append(op.log_path)
    for f in files:
        if f.is_file():
            with open(f, "rb") as r:
                r.seek(max(0, f.stat().st_size - LOG_TAIL_BYTES))
                (dest / f.name).write_bytes(r.read())
    for old in sorted(FAILURE_LOGS.iterdir())[:-3]:
        shutil.rmtree(old, ignore_errors=True)
    return dest


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    if os.environ.get("E2E_USE_EXISTING_CLUSTER"):
        kubeconfig = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
        yield Cluster(kubeconfig=kubeconfig, bin_dir=None)
        return
    bin_dir = subprocess.run([ROOT / "hack" / "install-tools.sh"], check=True, capture_output=True,
                             text=True).stdout.strip()
    up = subprocess.run([ROOT / "hack" / "cluster.sh", "up", CLUSTER_NAME], capture_output=True, text=True)
    if up.returncode != 0:
        raise RuntimeError(f"cluster did not come up:\n{up.stderr[-4000:]}")
    try:   # from here on the cluster is taken down whatever fails, setup included
        # LeaderWorkerSet's real manager and webhooks, before the operator starts (it watches them)
        lws = subprocess.run([ROOT / "hack" / "lws.sh", "up", CLUSTER_NAME], capture_output=True, text=True,
                             timeout=180)
        if lws.returncode != 0:
            raise RuntimeError(f"LeaderWorkerSet did not start:\n{lws.stderr[-4000:]}")
        # The Gateway API Inference Extension's InferencePool CRD, before the operator starts (it watches pools)
        c = Cluster(kubeconfig=up.stdout.strip().splitlines()[-1], bin_dir=bin_dir)
        c.kubectl("apply", "--server-side", "-f", f"{bin_dir}/inference-extension-crds.yaml")
        c.established("crd/inferencepools.inference.networking.k8s.io")
        yield c
    finally:
        if request.session.testsfailed and (kept := keep_cluster_logs()):
            print(f"\ne2e: {request.session.testsfailed} failed; the cluster's logs are kept in {kept}")
        if not os.environ.get("E2E_KEEP_CLUSTER"):
            subprocess.run([ROOT / "hack" / "lws.sh", "down", CLUSTER_NAME], capture_output=True, timeout=60)
            subprocess.run([ROOT / "hack" / "cluster.sh", "down", CLUSTER_NAME], capture_output=True)


RELEASE, RELEASE_NS = "triton-operator", "triton-system"

# The session's operator while it runs: a failing test's report carries the end of its log.
_SHARED: dict[str, Operator] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test (or fixture) that ran while the shared operator ran: its report ends with the
    operator's last log lines (what it decided, or why it did not), which a CI log otherwise lacks."""
    outcome = yield
    report = outcome.get_result()
    op = _SHARED.get("operator")
    if report.failed and op is not None and op.proc is not None and op.proc.poll() is None:
        report.sections.append(("shared operator: last 60 log lines", op.log_tail(60)))

SERVICE_ACCOUNT = "triton-operator"
GATEWAY_SERVICE_ACCOUNT = "triton-operator-gateway"


@pytest.fixture(scope="session")
def installed(cluster: Cluster) -> Cluster:
    """The Helm chart, as a user installs it: CRDs, RBAC, ServiceAccount, catalog, Deployment, and
    the gateway's. (kwok simulates the chart's pods; the operator and the gateway under test run as
    local processes with those pods' identities, see `operator` and e2e/test_gateway.py.)"""
    out = subprocess.run(
        ["helm", "upgrade", "--install", RELEASE, str(ROOT / "charts" / "triton-operator"), "-n", RELEASE_NS,
         "--create-namespace", "--wait", "--timeout", "120s", "--set", "gateway.enabled=true"],
        capture_output=True, text=True, env=cluster.env, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"helm install failed: {out.stderr}")
    cluster.established("crd/inferenceservices.serving.triton-operator.io", "crd/gpuclasses.serving.triton-operator.io")
    return cluster


@pytest.fixture(scope="session")
def operator(installed: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """The operator process, authenticated as the chart's ServiceAccount (a real token, so every
    request goes through the chart's RBAC), reading the chart's GPUClass catalog, leader-elected."""
    work = tmp_path_factory.mktemp("operator")
    catalog = work / "gpuclasses.yaml"
    catalog.write_text(installed.kubectl(
        "get", "configmap", f"{RELEASE}-gpuclasses", "-n", RELEASE_NS,
        "-o", r"jsonpath={.data.gpuclasses\.yaml}").stdout)
    op = Operator(installed, work, kubeconfig=service_account_kubeconfig(installed, work),
                  args=["--leader-elect", "--leader-elect-namespace", RELEASE_NS],
                  extra_env={"TRITON_OPERATOR_CATALOG_FILE": str(catalog), **chart_env(installed, ["NETWORK_POLICY"])})
    op.start()
    wait_for("the catalog's GPUClasses", lambda: len(installed.get("gpuclass") or []) >= 4, timeout=60)
    _SHARED["operator"] = op   # kept after it stops: the cluster's teardown keeps its log on failure
    try:
        yield op
    finally:
        assert op.stop(), f"the operator did not exit within 20 s of SIGTERM; log:\n{op.log_tail()}"


def chart_env(cluster: Cluster, names: list[str]) -> dict[str, str]:
    """TRITON_OPERATOR_<name> as the installed chart's operator Deployment sets them."""
    dep = json.loads(cluster.kubectl("get", "deployment", "-n", RELEASE_NS, "-l", "app.kubernetes.io/name=triton-operator",
                                     "-o", "json").stdout)["items"][0]
    env = {e["name"]: e.get("value", "") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    return {f"TRITON_OPERATOR_{n}": env[f"TRITON_OPERATOR_{n}"] for n in names}


def service_account_kubeconfig(cluster: Cluster, work: Path, account: str = SERVICE_ACCOUNT) -> str:
    """A kubeconfig holding only a token of one of the chart's ServiceAccounts (no admin certificate)."""
    token = cluster.kubectl("create", "token", account, "-n", RELEASE_NS, "--duration=6h").stdout.strip()
    view = yaml.safe_load(cluster.kubectl("config", "view", "--minify", "--raw", "-o", "yaml").stdout)
    server = view["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "operator",
        "clusters": [{"name": "local", "cluster": server}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": "operator"}}],
    }
    path = work / f"{account}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def ns(installed: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace enforcing the restricted Pod Security Standard."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:30].strip("-")
    name = f"e2e-{slug}-{uuid.uuid4().hex[:5]}"
    installed.kubectl("create", "namespace", name)
    installed.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted",
                      "pod-security.kubernetes.io/enforce-version=latest")
    wait_for("default ServiceAccount", lambda: installed.get("serviceaccount", "default", name), timeout=30)
    yield name
    installed.kubectl("delete", "namespace", name, "--wait=false", check=False)


@contextlib.contextmanager
def tenant_gateway(cluster: Cluster, work: Path, keys: list[dict], namespace: str) -> Iterator[GatewayProcess]:
    """The gateway as a process with a token of the chart's gateway ServiceAccount, serving these
    keys-file entries, in front of `namespace` (created here, at the restricted pod-security level)."""
    path = work / "keys.yaml"
    path.write_text(json.dumps({"keys": keys}))
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    gw = GatewayProcess(service_account_kubeconfig(cluster, work, GATEWAY_SERVICE_ACCOUNT), path, work, namespace)
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()
