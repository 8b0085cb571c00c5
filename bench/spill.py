"""make bench-spill: requests served within the SLO during a GPU shortage, with and without
spill-over, in the simulator (simulator/shortage.py), with the operator's own
autoscaling policy and its own placement function; writes bench/results/spill.md.

The service is bench/specs/llama3-8b-h100.yaml (Llama 3 8B FP8, p99 target 8 s) with
fallbackClasses [h200]; the shortage: h100 has room for 2 replicas for the whole run, h200 for 8.
Workloads: the Azure LLM inference trace 2023 (conversation, CC-BY 4.0, Patel et al., "Splitwise",
ISCA 2024) x16 as in make bench-autoscaling, and a step from 60 to 180 req/s. The policy gets the
planner's sizing of a replica on the preferred class (h100), as the live loop does: it sizes from
the class of the service's main Deployment."""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

from triton_operator.api import GPUClass, InferenceService
from triton_operator.simulator import policies, replica, results
from triton_operator.simulator.simulation import SimulationSettings
from triton_operator.simulator.shortage import ClassSlot, simulate_shortage
from triton_operator.cli import default_catalog
from triton_operator.planning.placement import Spill

sys.path.insert(0, str(Path(__file__).resolve().parent))
from autoscaling import azure, machine  # noqa: E402

from triton_operator.simulator import workload  # noqa: E402

ROOT = Path(__file__).resolve().parent
SPEC = ROOT / "specs/llama3-8b-h100.yaml"
ROOM = {"h100": 2, "h200": 8}
SPILL = Spill(after_s=120, return_after_s=600)


def shortage_workloads() -> dict[str, tuple[list, float | None]]:
    """The shortage's two workloads (requests, duration): the Azure trace at 16x (seed 1), and a step
    from 60 to 180 req/s whose token counts are drawn from the trace's rows (seed 1)."""
    trace = azure()
    mix = workload.mix_tokens([(r.prompt_tokens, r.output_tokens) for r in trace])
    return {"azure-conv x16": (workload.rescale(trace, rate_scale=16, seed=1), None),
            "step 60->180 req/s": (workload.generate("step:low=60,high=180,at=1200,duration=3600", 1, mix), 3600.0)}


def main() -> int:
    svc = InferenceService.model_validate(yaml.safe_load(SPEC.read_text()))
    classes = {d["metadata"]["name"]: GPUClass.model_validate(d) for d in default_catalog()}
    perfs = {c: replica.llm_performance(svc.spec, classes[c].spec) for c in ROOM}
    cold = replica.default_cold_start(svc.spec)
    auto = svc.spec.autoscaling
    started = datetime.now(timezone.utc)
    lines = []
    for label, (reqs, duration) in shortage_workloads().items():
        cfg = SimulationSettings(min_replicas=auto.min_replicas, max_replicas=auto.max_replicas, gpus_per_replica=1,
                       price_per_gpu_hour=classes["h100"].spec.price_per_hour,
                       slo_s=auto.target_p99_latency_ms / 1000.0, seed=1, duration=duration)
        cfg = policies.warm_start(reqs, perfs["h100"], cfg)
        rows = []
        for name, spill in (("no spill (waits for h100)", None), ("spill to h200 after 120 s", SPILL)):
            t = time.perf_counter()
            run, sim = simulate_shortage(reqs, [ClassSlot(c, perfs[c], ROOM[c]) for c in ROOM], cold,
                                         policies.Ours(auto, perfs["h100"]), cfg, spill)
            s = results.summarize(run)
            moved = sum(m[4] for m in sim.moves if m[1] == "SpilledOver")
            rows.append(f"| {name} | {s.slo_attainment:.2%} | {s.slo_violations} | {s.latency_p50_ms:.0f} | "
                        f"{s.latency_p99_ms:.0f} | {s.ttft_p99_ms:.0f} | {s.gpu_hours:.2f} | "
                        f"{sim.peak['h100']} / {sim.peak['h200']} | {moved} | {s.dropped} |")
            print(f"{label:22} {name:28} {time.perf_counter() - t:6.1f}s  SLO {s.slo_attainment:.2%}", file=sys.stderr)
        lines += [f"## {label} ({len(reqs)} requests)", "",
                  "| placement | SLO met | violations | p50 ms | p99 ms | TTFT p99 ms | GPU-h | most replicas h100 / h200 "
                  "| replicas spilled | dropped |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", *rows, ""]
    head = ["# Spill-over during a GPU shortage", "",
            f"Command: `make bench-spill` (python bench/spill.py). Date: {started:%Y-%m-%d %H:%M} UTC. "
            f"Machine: {machine()}.", "",
            f"Service: {SPEC.relative_to(ROOT.parent)} (Llama 3 8B FP8, targetP99LatencyMs "
            f"{auto.target_p99_latency_ms:g}, replicas {auto.min_replicas}-{auto.max_replicas}), autoscaled by the "
            f"operator's policy (`ours`); placement by planning.placement.place, the controller's function. "
            f"Room: h100 {ROOM['h100']} replicas, h200 {ROOM['h200']} (the shortage lasts the whole run); "
            f"spill after 120 s, returnAfter 600 s. A replica on h200 runs the H200's replica model "
            f"(4.8 TB/s against 3.35). Cold start {cold.ready_after():g} s. The SLO is end-to-end latency <= "
            f"{auto.target_p99_latency_ms / 1000:g} s.", ""]
    text = "\n".join(head + lines)
    (ROOT / "results" / "spill.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
