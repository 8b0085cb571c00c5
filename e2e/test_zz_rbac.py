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
from .conftest import CLUSTER_NAME, RELEASE, RELEASE_NS, SERVICE_ACCOUNT

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
}


def _granted() -> set[tuple[str, str, str]]:
    out = subprocess.run([f"{_tools()}/helm", "template", RELEASE, str(ROOT / "charts" / "triton-operator"),
                          "-n", RELEASE_NS, "--kube-version", "1.36.0"], capture_output=True, text=True, check=True)
    granted = set()
    for doc in yaml.safe_load_all(out.stdout):
        if doc and doc["kind"] in ("ClusterRole", "Role"):
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


@pytest.mark.skipif(bool(os.environ.get("E2E_USE_EXISTING_CLUSTER")), reason="needs the local cluster's audit log")
def test_every_granted_permission_is_used_or_explained(operator: Operator):
    log = subprocess.run([ROOT / "hack" / "cluster.sh", "audit-log", CLUSTER_NAME], capture_output=True,
                         text=True, check=True).stdout.strip()
    user = f"system:serviceaccount:{RELEASE_NS}:{SERVICE_ACCOUNT}"
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
    granted = _granted()
    assert used, "the audit log holds requests of the operator's ServiceAccount"
    assert not denied, f"the operator was refused: {sorted(denied)}"
    unused = granted - used - set(IMPLICIT)
    assert not unused, f"granted but never used, narrow the chart's RBAC: {sorted(unused)}"
    print(f"RBAC: {len(granted)} grants, {len(used)} used in this run, {len(IMPLICIT)} implicit")
