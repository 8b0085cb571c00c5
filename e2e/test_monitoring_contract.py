"""The chart's PodMonitor gives Triton's series the labels the operator's queries group by, as a
real Prometheus evaluates it against a real Triton. No cluster.

The autoscaler reads ``sum by (namespace, inferenceservice) (...)`` (triton_operator.settings
defaults). Those labels exist only because the chart's PodMonitor relabels the pod label
``serving.triton-operator.io/inferenceservice`` into ``inferenceservice`` and the Prometheus
Operator adds ``namespace``. Here the pieces meet for real:

- the PodMonitor is the one ``helm template`` prints with ``tritonPodMonitor.enabled=true``;
- it becomes the scrape config the Prometheus Operator would generate (``harness.podmonitor``);
- the targets are those Prometheus's Kubernetes discovery would make of a pod of the Deployment
  the operator renders for ``examples/resnet50-onnx.yaml`` (every container port, the pod's
  labels as ``__meta_kubernetes_pod_label_*``), the metrics port pointing at a local Triton;
- a real Prometheus relabels and scrapes, and the operator's own PrometheusSource queries it.

What stands in for the cluster: the discovery (static targets with the discovery's labels) and
the Prometheus Operator's config generation (mirrored; see harness/podmonitor.py).

Run: .venv/bin/python -m pytest e2e/test_monitoring_contract.py -q   (helm, Prometheus, Triton)
"""

from __future__ import annotations

import copy
import subprocess
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml

from triton_operator.api import GPUClass, InferenceService
from triton_operator.autoscaling.prometheus import PrometheusSource
from triton_operator.planning.assign import assign
from triton_operator.render import render
from triton_operator.settings import Settings

from .harness import REPO_ROOT
from .harness.podmonitor import pod_targets, scrape_config, selects_namespace
from .harness.prometheus import Prometheus
from .harness.triton import TritonServer

CHART = REPO_ROOT / "charts" / "triton-operator"
EXAMPLES = REPO_ROOT / "examples"
KUBE_VERSION = "1.36.0"
RELEASE, RELEASE_NS = "triton-operator", "triton-system"
POD_NAME = "resnet50-7d9f8c6b5-x2k9q"  # a Deployment's pod: <deployment>-<replicaset hash>-<suffix>
CONTROL = "without-chart-relabelings"


def _load(path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def helm() -> str:
    bin_dir = subprocess.run([REPO_ROOT / "hack" / "install-tools.sh"], check=True, capture_output=True,
                             text=True).stdout.strip()
    return f"{bin_dir}/helm"


def _podmonitor(helm: str, *args: str) -> dict[str, Any]:
    out = subprocess.run([helm, "template", RELEASE, str(CHART), "-n", RELEASE_NS, "--kube-version", KUBE_VERSION,
                          "--set", "tritonPodMonitor.enabled=true", *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (podmonitor,) = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "PodMonitor"]
    return podmonitor


@pytest.fixture(scope="module")
def podmonitor(helm: str) -> dict[str, Any]:
    return _podmonitor(helm)


@pytest.fixture(scope="module")
def service() -> InferenceService:
    return InferenceService.model_validate(_load(EXAMPLES / "resnet50-onnx.yaml")[0])


@pytest.fixture(scope="module")
def pod(service: InferenceService) -> dict[str, Any]:
    """A pod of the Deployment the operator renders, as the API server would hold it."""
    classes = {c.name: c for c in (GPUClass.model_validate(d) for d in _load(EXAMPLES / "gpuclasses.yaml"))}
    obj = service.model_copy(deep=True)
    obj.metadata["uid"] = "00000000-0000-0000-0000-000000000001"
    deployment = render(obj, classes, Settings(), assign(obj, classes)).by_kind("Deployment")
    template = copy.deepcopy(deployment["spec"]["template"])
    return {
        "metadata": {**template["metadata"], "name": POD_NAME, "namespace": deployment["metadata"]["namespace"],
                     "ownerReferences": [{"kind": "ReplicaSet", "name": POD_NAME.rsplit("-", 1)[0],
                                          "controller": True}]},
        "spec": template["spec"],
    }


@pytest.fixture(scope="module")
def triton():
    with TritonServer(model_name="resnet50", delay_ms=0) as server:
        yield server


@pytest.fixture(scope="module")
def prom(podmonitor, pod, triton):
    metrics_port = next(p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])
                        if p["name"] == "metrics")
    targets = pod_targets(pod, addresses={metrics_port: triton.metrics_address})
    # The control: the same PodMonitor without the chart's own relabelings, under another name.
    control = copy.deepcopy(podmonitor)
    control["metadata"]["name"] = CONTROL
    for ep in control["spec"]["podMetricsEndpoints"]:
        ep.pop("relabelings", None)
    configs = [scrape_config(podmonitor, targets=targets), scrape_config(control, targets=targets)]
    with Prometheus([], scrape_configs=configs) as p:
        yield p


def _job(podmonitor: dict[str, Any]) -> str:
    return f"{podmonitor['metadata']['namespace']}/{podmonitor['metadata']['name']}"


def test_the_podmonitor_covers_the_service_namespace(helm, podmonitor, service):
    namespace = service.metadata["namespace"]
    assert selects_namespace(podmonitor, namespace)  # default: every namespace
    assert selects_namespace(_podmonitor(helm, "--set-json", f'watchNamespaces=["{namespace}"]'), namespace)
    assert not selects_namespace(_podmonitor(helm, "--set-json", 'watchNamespaces=["elsewhere"]'), namespace)


def _wait_targets(prom: Prometheus, scrape_job: str, timeout: float = 60) -> dict[str, list[dict[str, Any]]]:
    """Active and dropped targets of one scrape job, once Prometheus has synced it (the first
    target sync comes some seconds after start)."""
    deadline = time.monotonic() + timeout
    while True:
        data = prom.api("targets")
        found = {
            "active": [t for t in data["activeTargets"] if t["scrapePool"] == scrape_job],
            # A dropped target's labels are those it had when it was dropped: by then the
            # Operator's first rule has copied `job` into __tmp_prometheus_job_name.
            "dropped": [t for t in data["droppedTargets"]
                        if scrape_job in (t.get("scrapePool"), t["discoveredLabels"].get("job"),
                                          t["discoveredLabels"].get("__tmp_prometheus_job_name"))],
        }
        if found["active"] or found["dropped"]:
            return found
        assert time.monotonic() < deadline, f"Prometheus has no targets for {scrape_job} after {timeout}s"
        time.sleep(0.5)


def test_only_the_triton_metrics_port_is_scraped(prom, podmonitor, pod, triton):
    job = _job(podmonitor)
    targets = _wait_targets(prom, f"podMonitor/{job}/0")
    active = targets["active"]
    assert [t["labels"]["job"] for t in active] == [job]
    assert [t["scrapeUrl"] for t in active] == [f"http://{triton.metrics_address}/metrics"], active
    dropped = [t["discoveredLabels"] for t in targets["dropped"]]
    containers = {c["name"] for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])}
    assert sorted((d["__meta_kubernetes_pod_container_name"], d.get("__meta_kubernetes_pod_container_port_name", ""))
                  for d in dropped) == sorted(
        (c["name"], p.get("name", "")) for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
        for p in (c.get("ports") or [{}]) if p.get("name") != "metrics")
    assert containers == {"triton", "stage-model"}


def test_scraped_series_carry_namespace_and_inferenceservice(prom, podmonitor, service, triton):
    job = _job(podmonitor)
    series = prom.wait_for(f'nv_inference_pending_request_count{{job="{job}"}}', lambda v: len(v) == 1,
                           timeout=60)
    labels, _ = series[0]
    settings = Settings()
    assert labels == {
        "__name__": "nv_inference_pending_request_count",
        settings.metrics_namespace_label: service.metadata["namespace"],
        settings.metrics_service_label: service.metadata["name"],
        "pod": POD_NAME, "container": "triton", "endpoint": "metrics", "job": job,
        "instance": triton.metrics_address, "model": "resnet50", "version": "1",
    }


def test_without_the_chart_relabeling_the_service_label_is_missing(prom, podmonitor, service):
    """The control job proves the label comes from the chart's rule, not from the harness."""
    job = f"{podmonitor['metadata']['namespace']}/{CONTROL}"
    series = prom.wait_for(f'nv_inference_pending_request_count{{job="{job}"}}', lambda v: len(v) == 1,
                           timeout=60)
    labels, _ = series[0]
    assert labels["namespace"] == service.metadata["namespace"]
    assert Settings().metrics_service_label not in labels


def test_the_operator_queries_find_the_service_under_its_key(prom, service, triton):
    # One inference, so that the latency summary has a p99 to report.
    client = httpclient.InferenceServerClient(triton.http_address)
    try:
        inp = httpclient.InferInput("INPUT0", [4], "FP32")
        inp.set_data_from_numpy(np.arange(4, dtype=np.float32))
        client.infer("resnet50", [inp])
    finally:
        client.close()
    source = PrometheusSource(Settings(prometheus_url=prom.url))
    key = (service.metadata["namespace"], service.metadata["name"])
    deadline = time.monotonic() + 60
    while True:
        snap = source.snapshot()
        if snap.queue and snap.p99 and not snap.errors:
            break
        assert time.monotonic() < deadline, f"no queue or p99 for {key} in 60s: {snap}"
        time.sleep(0.5)
    # Exactly one service: the control job's series (no inferenceservice label) are not counted.
    assert snap.queue == {key: 0.0}
    assert set(snap.p99) == {key}
