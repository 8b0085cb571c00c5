"""Every example users copy runs: each InferenceService in examples/ is applied, as it is, to the
simulated cluster and becomes Ready (its namespace swapped for the test's, and the claims its pods
mount made: the model cache of tensorrt-llm services, the claim a pvc:// source names). An example
that cannot run here says so in its first line (EXAMPLE_NEEDS_GPUS) and is rendered offline by
tests/test_examples.py instead. The GPUClass catalog is applied with a server-side dry run: the
chart already installed the same classes (e2e/test_chart.py compares them) and owns them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from .cluster import ROOT, Cluster, Operator, model_cache, wait_for

EXAMPLES = ROOT / "examples"
CATALOG = EXAMPLES / "gpuclasses.yaml"
EXAMPLE_NEEDS_GPUS = "# Runs on real GPUs only:"


def _runnable() -> list[Path]:
    return [p for p in sorted(EXAMPLES.glob("*.yaml"))
            if p != CATALOG and not p.read_text().startswith(EXAMPLE_NEEDS_GPUS)]


def _claim(namespace: str, name: str, size: str = "10Gi") -> list[dict[str, Any]]:
    """A claim bound to a hostPath volume nothing on the kwok nodes mounts (as model_cache's)."""
    return [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{name}-{namespace}"},
         "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "hostPath": {"path": f"/tmp/{namespace}-{name}"}, "claimRef": {"namespace": namespace, "name": name}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"{name}-{namespace}",
                  "resources": {"requests": {"storage": size}}}},
    ]


def _bound(c: Cluster, namespace: str, name: str) -> bool:
    return ((c.get("pvc", name, namespace) or {}).get("status") or {}).get("phase") == "Bound"


def test_the_examples_are_split_between_this_test_and_the_offline_one():
    """Something runs here (the quick start's example among them), and nothing is skipped silently."""
    names = {p.name for p in _runnable()}
    assert "quickstart.yaml" in names and len(names) >= 4, names


@pytest.mark.parametrize("example", _runnable(), ids=lambda p: p.stem)
def test_each_example_is_applied_and_becomes_ready(operator: Operator, ns: str, example: Path):
    c = operator.cluster
    docs = [d for d in yaml.safe_load_all(example.read_text()) if d]
    assert docs and all(d["kind"] == "InferenceService" for d in docs), "examples hold InferenceServices"
    claims: list[dict[str, Any]] = []
    if any(d["spec"]["model"]["format"] == "tensorrt-llm" for d in docs):
        claims += model_cache(ns)
    for d in docs:
        source = d["spec"]["model"]["source"]
        if source.startswith("pvc://"):
            claims += _claim(ns, source.removeprefix("pvc://").split("/", 1)[0])
    try:
        if claims:
            c.apply(claims)
            for claim in (x for x in claims if x["kind"] == "PersistentVolumeClaim"):
                wait_for(f"claim {claim['metadata']['name']} bound", lambda: _bound(c, ns, claim["metadata"]["name"]))
        for d in docs:
            d["metadata"]["namespace"] = ns
        c.apply(docs)
        for d in docs:
            c.wait_ready(d["metadata"]["name"], ns, timeout=180)
            status = c.get("infsvc", d["metadata"]["name"], ns)["status"]
            assert status["readyReplicas"] >= 1 and status["gpuClass"] == d["spec"]["gpu"]["class"], status
    finally:
        # Services first, so their pods release the GPUs before the next example asks for them.
        c.kubectl("delete", "infsvc", "--all", "-n", ns, "--wait=true", "--timeout=60s", check=False)
        for pv in (x for x in claims if x["kind"] == "PersistentVolume"):
            c.kubectl("delete", "pv", pv["metadata"]["name"], "--wait=false", check=False)


def test_the_gpuclass_catalog_is_admitted(installed: Cluster):
    out = installed.kubectl("apply", "--dry-run=server", "-f", str(CATALOG))
    assert out.stdout.count("gpuclass.serving.triton-operator.io/") == len(
        [d for d in yaml.safe_load_all(CATALOG.read_text()) if d]), out.stdout
