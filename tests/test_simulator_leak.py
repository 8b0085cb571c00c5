"""No information leak into ours: it is told about a replica what the live loop is told (the
planner's estimate from the InferenceService and its GPUClass), never the simulated engine, and
the engine can be swapped for one shaped unlike the plan (`--replica-model curved`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from triton_operator import cli
from triton_operator.api import GPUClass, InferenceService
from triton_operator.autoscaling import policy as live_policy
from triton_operator.simulator import policies, replica, workload
from triton_operator.simulator.simulation import SimulationSettings

ROOT = Path(__file__).resolve().parent.parent
CLASSES = {d["metadata"]["name"]: GPUClass.model_validate(d) for d in cli.default_catalog()}
SVC = InferenceService.model_validate({
    "apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "x"},
    "spec": {"model": {"source": "hf://a/b", "format": "tensorrt-llm", "parameters": "8B", "precision": "fp8"},
             "gpu": {"class": "h100", "count": 1}, "engine": {"maxBatchSize": 64, "maxInputLen": 16000, "maxSeqLen": 17000},
             "autoscaling": {"minReplicas": 1, "maxReplicas": 16, "targetQueueDepth": 4, "targetP99LatencyMs": 8000}}})


def test_ours_sizes_from_the_planner_and_never_asks_the_engine(monkeypatch):
    planned = replica.llm_performance(SVC.spec, CLASSES["h100"].spec)
    engine = replica.replica_model("curved", planned)

    def leak(*_args, **_kwargs):
        raise AssertionError("the simulated engine was asked to size a replica for ours")

    monkeypatch.setattr(replica.CurvedLLMPerformance, "sizing", leak)
    hints = []
    real = live_policy.decide

    def spy(spec, current, signals, history, now):
        hints.append(signals.capacity_hint)
        return real(spec, current, signals, history, now)

    monkeypatch.setattr(live_policy, "decide", spy)
    reqs = workload.generate("poisson:rate=30,duration=600,prompt=1000,output=200", seed=1)
    policies.run_policy("ours", reqs, engine, replica.ColdStart(0, 0, 0, 0), SVC.spec.autoscaling,
                        SimulationSettings(max_replicas=16, slo_s=8.0), "h100", planned)
    got = [h for h in hints if h is not None]
    assert len(got) > 30
    assert got[-1] == pytest.approx(planned.sizing(1000, 200).rate), "the planner's figure for the measured mix"


def test_the_curved_replica_is_shaped_unlike_the_plan():
    planned = replica.llm_performance(SVC.spec, CLASSES["h100"].spec)
    curved = replica.replica_model("curved", planned)
    cfg = SimulationSettings(slo_s=8.0)
    mixes = {"chat": (1000, 200), "code": (4000, 30), "decode": (300, 600)}
    ratios = {}
    for name, (p, o) in mixes.items():
        reqs = [workload.Request(0.0, p, o)] * 400
        ratios[name] = (policies.saturated_throughput(reqs, curved, cfg)
                        / policies.saturated_throughput(reqs, planned, cfg))
    assert all(0.5 < r < 0.95 for r in ratios.values()), ratios
    assert max(ratios.values()) - min(ratios.values()) > 0.05, "not one efficiency factor for every mix"
    assert curved.kv_capacity_tokens == pytest.approx(0.35 * planned.kv_capacity_tokens)
    assert curved.decode_step_s(64, 0) > 1.5 * planned.decode_step_s(64, 0)
    assert curved.decode_step_s(1, 0) == pytest.approx(planned.decode_step_s(1, 0), rel=0.01)
    with pytest.raises(ValueError, match="--replica-model must be one of planner, curved, got 'flat'"):
        replica.replica_model("flat", planned)


def test_simulate_runs_the_curved_replica(capsys):
    args = ["simulate", "-f", str(ROOT / "examples/llama3-8b.yaml"), "--generate", "poisson:rate=10,duration=300",
            "--slo-ms", "5000", "--json", "--policy", "fixed:2"]
    assert cli.main(args) == 0
    planner = json.loads(capsys.readouterr().out)
    assert cli.main(args + ["--replica-model", "curved"]) == 0
    curved = json.loads(capsys.readouterr().out)
    assert "replica model curved" in curved["details"] and "replica model planner" in planner["details"]
    assert curved["policies"][0]["latency_p50_ms"] > planner["policies"][0]["latency_p50_ms"]
