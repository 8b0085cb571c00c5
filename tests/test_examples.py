"""The examples users copy: those that need real GPUs say so in their first line and render and plan
offline here (every other one is applied to the simulated cluster by e2e/test_examples.py); the
chart's NOTES and the quick start point at one that runs on `make dev`'s cluster as it is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from triton_operator import cli

from .conftest import ROOT

EXAMPLES = ROOT / "examples"
CATALOG = EXAMPLES / "gpuclasses.yaml"
EXAMPLE_NEEDS_GPUS = "# Runs on real GPUs only:"   # the same marker as e2e/test_examples.py's
SERVICES = [p for p in sorted(EXAMPLES.glob("*.yaml")) if p != CATALOG]
NEED_GPUS = [p for p in SERVICES if p.read_text().startswith(EXAMPLE_NEEDS_GPUS)]


def _needs_gpus(path: Path) -> bool:
    return path.read_text().startswith(EXAMPLE_NEEDS_GPUS)


def test_the_marker_is_the_first_line_and_says_why():
    for p in SERVICES:
        text = p.read_text()
        assert EXAMPLE_NEEDS_GPUS not in text or text.startswith(EXAMPLE_NEEDS_GPUS), p.name
        if _needs_gpus(p):
            assert len(text.splitlines()[0]) > len(EXAMPLE_NEEDS_GPUS) + 10, f"{p.name}: say what it needs"
    assert NEED_GPUS, "llama3-405b.yaml needs two whole H100 nodes a replica"


@pytest.mark.parametrize("example", NEED_GPUS, ids=lambda p: p.stem)
def test_an_example_that_needs_gpus_renders_and_plans(example, capsys):
    assert cli.main(["render", "-f", str(example), "--gpu-class-file", str(CATALOG)]) == 0
    manifests = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert {"Service", "PodDisruptionBudget"} <= {m["kind"] for m in manifests}
    assert cli.main(["plan", "-f", str(example), "--gpu-class-file", str(CATALOG)]) == 0
    assert "preferred" in capsys.readouterr().out


def _pointed_at(text: str) -> set[str]:
    return set(re.findall(r"examples/([a-z0-9-]+\.yaml)", text))


def test_notes_and_the_quick_start_point_at_an_example_that_runs_on_make_dev():
    """Not at one that needs another namespace, a Secret, a bucket or real GPUs: the quick start's
    example is applied as it is by e2e/test_examples.py, in namespace ml as make dev makes it."""
    notes = (ROOT / "charts/triton-operator/templates/NOTES.txt").read_text()
    quickstart = (ROOT / "docs/quickstart.md").read_text()
    for text in (notes, quickstart):
        named = _pointed_at(text)
        assert named == {"quickstart.yaml"}, named
    example = EXAMPLES / "quickstart.yaml"
    assert not _needs_gpus(example)
    (doc,) = [d for d in yaml.safe_load_all(example.read_text()) if d]
    spec = doc["spec"]
    assert doc["metadata"]["namespace"] == "ml", "make dev makes namespace ml and its model cache claim"
    assert "credentialsSecret" not in spec["model"] and spec["model"]["source"].startswith("hf://")
    dev = (ROOT / "hack/dev.sh").read_text()
    assert "create namespace ml" in dev and "dev-storage.yaml" in dev
    assert "claimRef: {namespace: ml, name: triton-models}" in (ROOT / "hack/dev-storage.yaml").read_text()
