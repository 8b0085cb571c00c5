"""End-to-end fixtures: a real local control plane with simulated GPU nodes, and the operator.

The cluster is hack/cluster.sh's (kube-apiserver, etcd, controller-manager, scheduler and kwok,
all real binaries). Set E2E_USE_EXISTING_CLUSTER=1 to run against the cluster $KUBECONFIG names
instead (kind, a cloud); set E2E_KEEP_CLUSTER=1 to leave the local one running afterwards.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from .cluster import ROOT, Cluster, Operator, wait_for

CLUSTER_NAME = os.environ.get("E2E_CLUSTER_NAME", "triton-e2e")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if os.environ.get("E2E_USE_EXISTING_CLUSTER"):
        kubeconfig = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
        yield Cluster(kubeconfig=kubeconfig, bin_dir=None)
        return
    bin_dir = subprocess.run([ROOT / "hack" / "install-tools.sh"], check=True, capture_output=True,
                             text=True).stdout.strip()
    up = subprocess.run([ROOT / "hack" / "cluster.sh", "up", CLUSTER_NAME], capture_output=True, text=True)
    if up.returncode != 0:
        raise RuntimeError(f"cluster did not come up:\n{up.stderr[-4000:]}")
    try:
        yield Cluster(kubeconfig=up.stdout.strip().splitlines()[-1], bin_dir=bin_dir)
    finally:
        if not os.environ.get("E2E_KEEP_CLUSTER"):
            subprocess.run([ROOT / "hack" / "cluster.sh", "down", CLUSTER_NAME], capture_output=True)


@pytest.fixture(scope="session")
def installed(cluster: Cluster) -> Cluster:
    """CRDs and the example GPU classes."""
    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/inferenceservices.serving.triton-operator.io",
                    "crd/gpuclasses.serving.triton-operator.io", "--timeout=60s")
    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "examples" / "gpuclasses.yaml"))
    return cluster


@pytest.fixture(scope="session")
def operator(installed: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    op = Operator(installed, tmp_path_factory.mktemp("operator"))
    op.start()
    try:
        yield op
    finally:
        op.stop()


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
