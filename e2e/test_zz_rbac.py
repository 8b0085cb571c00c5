"""Least privilege, proven from the API server's audit log: every permission the chart grants the
operator was used by the operator during this e2e run, or is listed below with the reason it is
needed without showing up as a request of its own. (Runs last: it reads what the suite did.)"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from .cluster import ROOT, Operator, wait_for
from .conftest import CLUSTER_NAME, GATEWAY_SERVICE_ACCOUNT, RELEASE, RELEASE_NS, SERVICE_ACCOUNT

# Granted but never a request of their own: (group, resource, verb) -> why.
IMPLICIT = {
    ("serving.triton-operator.io", "inferenceservices/finalizers", "update"):
        "checked by the OwnerReferencesPermissionEnforcement admission plugin when children set "
        "blockOwnerDeletion; never called",
    ("apps", "deployments", "create"): "server-side apply (a PATCH) of an absent object needs create",
    ("", "services", "create"): "server-side apply (a PATCH) of an absent object needs create",
    ("policy", "poddisruptionbudgets", "create"): "server-side apply (a PATCH) of an absent object needs create",
    ("serving.triton-operator.io", "gpuclasses", "create"): "server-side apply (a PATCH) of an absent object needs create",
    ("batch", "jobs", "create"): "server-side apply (a PATCH) of an absent object needs create",
    ("networking.k8s.io", "networkpolicies", "create"): "server-side apply (a PATCH) of an absent object needs create",
    ("leaderworkerset.x-k8s.io", "leaderworkersets", "create"):
        "server-side apply (a PATCH) of an absent object needs create",
    ("inference.networking.k8s.io", "inferencepools", "create"):
        "server-side apply (a PATCH) of an absent object needs create",
}


def _granted(gateway: bool = False) -> set[tuple[str, str, str]]:
    """The operator's grants, or the gateway's (the chart installed as conftest installs it; not the
    `helm test` hook's, which e2e/test_chart.py runs with its own account)."""
    out = subprocess.run([f"{_tools()}/helm", "template", RELEASE, str(ROOT / "charts" / "triton-operator"),
                          "-n", RELEASE_NS, "--kube-version", "1.36.0", "--set", "gateway.enabled=true"],
                         capture_output=True, text=True, check=True)
    granted = set()
    for doc in yaml.safe_load_all(out.stdout):
        hook = "helm.sh/hook" in (doc or {}).get("metadata", {}).get("annotations", {})   # helm test's own account
        if doc and not hook and doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["name"].endswith("-gateway") == gateway:
            for rule in doc["rules"]:
                granted |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return granted


def _tools() -> str:
    return subprocess.run([ROOT / "hack" / "install-tools.sh"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_catalog_classes_switched_off_are_pruned(operator: Operator):
    """The one use of `delete` on GPUClasses: a class labelled as the catalog's but no longer in it."""
    c = operator.cluster
    c.apply({"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "GPUClass",
             "metadata": {"name": "retired", "labels": {"serving.triton-operator.io/catalog": "default"}},
             "spec": {"productNames": ["NVIDIA-L4"], "memoryGiB": 24, "memoryBandwidthTBps": 0.3,
                      "computeCapability": "8.9"}})
    c.apply({"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "GPUClass",
             "metadata": {"name": "handmade"},
             "spec": {"productNames": ["NVIDIA-L4"], "memoryGiB": 24, "memoryBandwidthTBps": 0.3,
                      "computeCapability": "8.9"}})
    operator.stop()
    operator.start()
    wait_for("retired class pruned", lambda: c.get("gpuclass", "retired") is None, timeout=60)
    assert c.get("gpuclass", "handmade") is not None, "classes not from the catalog are never touched"
    assert c.get("gpuclass", "l4") is not None
    c.kubectl("delete", "gpuclass", "handmade")


def _audit(account: str) -> tuple[set[tuple[str, str, str]], set[tuple[str, str, str]]]:
    """(used, denied) (group, resource, verb) of one ServiceAccount in the audit log of this run."""
    log = subprocess.run([ROOT / "hack" / "cluster.sh", "audit-log", CLUSTER_NAME], capture_output=True,
                         text=True, check=True).stdout.strip()
    user = f"system:serviceaccount:{RELEASE_NS}:{account}"
    used, denied = set(), set()
    with open(log) as f:
        for line in f:
            event = json.loads(line)
            if event.get("user", {}).get("username") != user or "objectRef" not in event:
                continue
            ref = event["objectRef"]
            resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            key = (ref.get("apiGroup", ""), resource, event["verb"])
            if event.get("annotations", {}).get("authorization.k8s.io/decision") == "forbid":
                denied.add(key)
            else:
                used.add(key)
    return used, denied


@pytest.mark.skipif(bool(os.environ.get("E2E_USE_EXISTING_CLUSTER")), reason="needs the local cluster's audit log")
def test_every_granted_permission_is_used_or_explained(operator: Operator):
    used, denied = _audit(SERVICE_ACCOUNT)
    granted = _granted()
    assert used, "the audit log holds requests of the operator's ServiceAccount"
    assert not denied, f"the operator was refused: {sorted(denied)}"
    unused = granted - used - set(IMPLICIT)
    assert not unused, f"granted but never used, narrow the chart's RBAC: {sorted(unused)}"
    print(f"RBAC: {len(granted)} grants, {len(used)} used in this run, {len(IMPLICIT)} implicit")


@pytest.mark.skipif(bool(os.environ.get("E2E_USE_EXISTING_CLUSTER")), reason="needs the local cluster's audit log")
def test_the_gateway_uses_exactly_its_grants():
    """The gateway's requests in this run (e2e/test_gateway.py), against the chart's grants for it:
    list and watch of InferenceServices and EndpointSlices, nothing more, nothing refused."""
    used, denied = _audit(GATEWAY_SERVICE_ACCOUNT)
    if not used:
        pytest.skip("the gateway did not run in this session (e2e/test_gateway.py was not selected)")
    granted = _granted(gateway=True)
    assert granted == {("serving.triton-operator.io", "inferenceservices", "list"),
                       ("serving.triton-operator.io", "inferenceservices", "watch"),
                       ("discovery.k8s.io", "endpointslices", "list"), ("discovery.k8s.io", "endpointslices", "watch")}
    assert not denied, f"the gateway was refused: {sorted(denied)}"
    assert used == granted, f"used {sorted(used)}, granted {sorted(granted)}"
