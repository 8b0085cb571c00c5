"""bench/recompute.py recomputes a run's report from its --requests-out and --replicas-out files
alone: GPU-hours, scale events and SLO attainment equal what `simulate --json` reported, for an
autoscaler that scales both ways, a fixed pool and a baseline."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from triton_operator import cli

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = str(ROOT / "examples/llama3-8b.yaml")


def load_recompute():
    spec = importlib.util.spec_from_file_location("recompute", ROOT / "bench/recompute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recomputed_figures_equal_the_report(capsys, tmp_path):
    names = ["ours", "fixed:2", "kpa:target=24", "hpa:metric=concurrency,target=24,stabilization=60"]
    args = ["simulate", "-f", EXAMPLE, "--generate", "step:low=6,high=30,at=300,duration=900", "--slo-ms", "3000",
            "--cold-start", "5", "--json", "--requests-out", str(tmp_path / "req.csv"),
            "--replicas-out", str(tmp_path / "pods.csv")]
    for n in names:
        args += ["--policy", n]
    assert cli.main(args) == 0
    reported = {p["policy"]: p for p in json.loads(capsys.readouterr().out)["policies"]}
    recompute = load_recompute()
    slugs = {"ours": "ours", "fixed:2": "fixed-2", "kpa:target=24": "kpa-target-24",
             "hpa:metric=concurrency,target=24,stabilization=60": "hpa-metric-concurrency-target-24-stabilization-60"}
    moved = 0
    for name, slug in slugs.items():
        got = recompute.recompute(tmp_path / f"req-{slug}.csv", tmp_path / f"pods-{slug}.csv", 3000.0)
        want = reported[name]
        assert got["requests"] == want["requests"], name
        assert got["slo_violations"] == want["slo_violations"], name
        assert got["slo_attainment"] == pytest.approx(want["slo_attainment"], abs=1e-12), name
        assert got["gpu_hours"] == pytest.approx(want["gpu_hours"], rel=1e-6), name
        assert got["scale_events"] == want["scale_events"], name
        moved += want["scale_events"]
    assert reported["fixed:2"]["scale_events"] == 0 and moved >= 4, "the autoscalers moved both ways"
    header = (tmp_path / "pods-ours.csv").read_text().splitlines()[0]
    assert header == "replica,gpu_class,gpus,created,ready,deleted,stopped"


def test_recompute_command_prints_json_and_refuses_a_missing_file(capsys, tmp_path):
    recompute = load_recompute()
    assert recompute.main(["--requests", str(tmp_path / "no.csv"), "--replicas", str(tmp_path / "no.csv"),
                           "--slo-ms", "1000"]) == 2
    assert "No such file" in capsys.readouterr().err
