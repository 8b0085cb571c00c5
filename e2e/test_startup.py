"""Start-up with a broken GPUClass catalog file (the chart mounts it; an admin may break it): the
operator says what is wrong in one line, leaves the classes in the cluster as they are, and
serves on."""

from __future__ import annotations

from pathlib import Path

import pytest

from .cluster import Operator, wait_for
from .test_lifecycle import service

BROKEN = {
    "invalid class": ("apiVersion: serving.triton-operator.io/v1alpha1\nkind: GPUClass\nmetadata: {name: h100}\n"
                      "spec: {productNames: [NVIDIA-H100-80GB-HBM3], memoryGiB: -1, memoryBandwidthTBps: 3.35, "
                      "computeCapability: '9.0'}\n", "GPUClass h100: spec.memoryGiB"),
    "not YAML": ("kind: GPUClass\nspec: [unclosed\n", "GPUClass catalog not applied"),
    "missing file": (None, "cannot read GPUClass catalog"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_catalog_is_reported_and_the_operator_serves_on(operator: Operator, ns: str, tmp_path: Path, case: str):
    text, words = BROKEN[case]
    catalog = tmp_path / "gpuclasses.yaml"
    if text is not None:
        catalog.write_text(text)
    c = operator.cluster
    before = c.get("gpuclass", "h100")["spec"]
    second = Operator(c, tmp_path, kubeconfig=operator.kubeconfig, args=[],
                      extra_env={**operator.extra_env, "TRITON_OPERATOR_CATALOG_FILE": str(catalog)})
    operator.stop()
    try:
        second.start()
        c.apply(service("after-broken-catalog", ns))
        c.wait_ready("after-broken-catalog", ns, timeout=90)
        log = second.log_path.read_text()
        lines = [line for line in log.splitlines() if "GPUClass catalog not applied" in line]
        assert len(lines) == 1 and words in lines[0], log[-2000:]
        assert "Traceback" not in log
        assert c.get("gpuclass", "h100")["spec"] == before, "the classes in the cluster are left as they were"
    finally:
        second.stop()
        operator.start()
        wait_for("the session's operator", operator.healthy, timeout=60)
