"""From a parsed --policy to a simulated run (pure): every autoscaling policy starts from the
same warm replica count (a `fixed:N` pool from its N, warm), then runs through the simulation
(the oracle through its search)."""

from __future__ import annotations

import math
from typing import Sequence

from ...api import AutoscalingSpec
from ..replica import ColdStart, LLMPerformance, Performance
from ..simulation import Run, SimulationSettings, simulate
from ..workload import Request
from .common import PolicyError
from .fixed import Fixed
from .hpa import HPA, HPA_DOWN_WINDOW_S
from .keda import KEDA, KEDA_COOLDOWN_S, KEDA_POLLING_S
from .knative import KPA, KPA_TARGET, KPA_UTILIZATION, KPA_WINDOW_S
from .oracle import run_oracle, saturated_throughput
from .ours import Ours
from .parse import PolicySpec, check_min_replicas, parse_policy


def warm_start(requests: Sequence[Request], perf: Performance, settings: SimulationSettings) -> SimulationSettings:
    """SimulationSettings whose initial replicas serve the first minute's arrivals at 80 % of a replica's
    saturated throughput, as if the service had been running: every policy starts from the
    same, sensible place instead of from minReplicas under full load."""
    if settings.initial_replicas is not None or not requests:
        return settings
    capacity = saturated_throughput(requests, perf, settings)
    first = sum(1 for r in requests if r.arrival < 60.0) / 60.0
    initial = max(settings.min_replicas, min(settings.max_replicas, math.ceil(first / (capacity * 0.8))))
    return SimulationSettings(**{**settings.__dict__, "initial_replicas": initial})


def build_policy(p: PolicySpec, spec: AutoscalingSpec, cold: ColdStart, slots: float,
                 planner: LLMPerformance | None = None) -> object:
    """The simulator's policy object for a parsed spec (not the oracle, which is a search)."""
    get = p.get
    if p.family == "ours":
        return Ours(spec, planner)
    if p.family == "hpa":
        return HPA(spec, cold, metric=str(get("metric", "queue")), target=_opt(get("target")),
                   stabilization=float(get("stabilization", HPA_DOWN_WINDOW_S)),  # type: ignore[arg-type]
                   slots=slots, name=p.name)
    if p.family == "keda":
        return KEDA(spec, metric=str(get("metric", "queue")), target=_opt(get("target")),
                    activation=float(get("activation", 0.0)), polling=float(get("polling", KEDA_POLLING_S)),  # type: ignore[arg-type]
                    cooldown=float(get("cooldown", KEDA_COOLDOWN_S)),  # type: ignore[arg-type]
                    stabilization=float(get("stabilization", HPA_DOWN_WINDOW_S)), slots=slots, name=p.name)  # type: ignore[arg-type]
    if p.family == "kpa":
        return KPA(spec, target_per_pod=float(get("target", KPA_TARGET)),  # type: ignore[arg-type]
                   utilization=float(get("utilization", KPA_UTILIZATION * 100)) / 100,  # type: ignore[arg-type]
                   stable_window=float(get("window", KPA_WINDOW_S)), name=p.name)  # type: ignore[arg-type]
    if p.family == "fixed":
        return Fixed(int(get("replicas")), name=p.name)  # type: ignore[arg-type]
    raise PolicyError(f"policy {p.name!r} cannot be built")


def _opt(x: float | str | None) -> float | None:
    return None if x is None else float(x)


def run_policy(name: str | PolicySpec, requests: Sequence[Request], perf: Performance, cold: ColdStart,
               spec: AutoscalingSpec, settings: SimulationSettings, gpu_class: str = "",
               planner: LLMPerformance | None = None) -> Run:
    """Run one policy. `perf` is the simulated replica (the engine); `planner` is what ours is
    told about a replica: the planner's estimate from the InferenceService and its GPUClass
    (planning/llm_performance.llm_performance), as the live loop computes it, never the engine itself."""
    p = parse_policy(name)
    check_min_replicas([p], spec)
    settings = warm_start(requests, perf, settings)
    if p.family == "oracle":
        h = p.get("headroom")
        return run_oracle(requests, perf, cold, settings, gpu_class, headroom=None if h is None else float(h))
    slots = float(perf.max_batch if isinstance(perf, LLMPerformance) else perf.slots)
    policy = build_policy(p, spec, cold, slots, planner)
    if p.family == "fixed":
        n = int(p.get("replicas"))  # type: ignore[arg-type]
        settings = SimulationSettings(**{**settings.__dict__, "initial_replicas": n,
                               "max_replicas": max(n, settings.max_replicas),
                               "min_replicas": min(n, settings.min_replicas)})
    return simulate(requests, perf, cold, policy, settings, gpu_class)  # type: ignore[arg-type]
