"""`oracle` (pure): knows every future arrival. Per 60 s bucket it provisions the fewest replicas
whose saturated throughput (measured on this workload's own request mix) covers the bucket's
arrivals times (1 + headroom), starting pods one cold start early and removing them the moment
they are not needed, and starts warm with what its first start-up needs. `oracle` searches for the
smallest headroom (bisection) whose run meets the SLO target; `oracle:headroom=H` runs one plan
at H, so a sweep of H draws the plan's cost/violation curve. It is a reference, not a bound: one
headroom for every bucket, so an autoscaler without foresight can still beat it where load is
steady and it wastes headroom; bench/frontier.py has the lower bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..replica import ColdStart, LLMPerformance, Performance
from ..results import summarize
from ..simulation import Run, SimulationSettings, View, simulate
from ..workload import Request
from .fixed import Fixed


@dataclass
class Schedule:
    """Replica counts decided in advance (the oracle's plan)."""

    counts: list[int]            # per bucket
    bucket_s: float
    lead_s: float
    note: str
    name: str = "oracle"
    interval: float = 5.0
    sample_interval: float = 0.0

    def decide(self, view: View) -> tuple[int, str]:
        first = int(view.now // self.bucket_s)
        last = int((view.now + self.lead_s) // self.bucket_s)
        window = self.counts[first:last + 1] or self.counts[-1:]
        return max(window), f"oracle: {self.note}; buckets {first}-{last} need {max(window)}"

    def sample(self, view: View) -> None:  # pragma: no cover
        pass


def saturated_throughput(requests: Sequence[Request], perf: Performance, settings: SimulationSettings,
                         sample: int = 600) -> float:
    """Requests/s one replica completes when it is never idle, on this workload's own mix
    (trtllm-bench's "infinite rate" method): a deterministic sample of the requests, all queued
    at t = 0."""
    if not isinstance(perf, LLMPerformance):
        return perf.slots / perf.mean_s
    step = max(1, len(requests) // sample)
    picked = [Request(0.0, r.prompt_tokens, r.output_tokens) for r in requests[::step]
              if perf.fits(r.prompt_tokens, r.output_tokens)][:sample]
    if not picked:
        return 1.0
    cfg = SimulationSettings(min_replicas=1, max_replicas=1, slo_s=settings.slo_s, seed=settings.seed,
                   duration=0.0, horizon_s=1e9)
    run = simulate(picked, perf, ColdStart(0, 0, 0, 0), Fixed(1), cfg)
    makespan = max(f for f in run.finish if not math.isnan(f))
    return len(picked) / makespan if makespan > 0 else 1.0


def oracle_schedule(requests: Sequence[Request], capacity: float, headroom: float, duration: float,
                    bucket_s: float, lo: int, hi: int) -> list[int]:
    buckets = max(1, math.ceil(duration / bucket_s))
    counts = [0] * buckets
    for r in requests:
        b = min(buckets - 1, int(r.arrival // bucket_s))
        counts[b] += 1
    return [max(lo, min(hi, math.ceil(c / bucket_s * (1 + headroom) / capacity))) for c in counts]


def run_plan(requests: Sequence[Request], perf: Performance, cold: ColdStart, settings: SimulationSettings,
             counts: list[int], bucket_s: float, note: str, gpu_class: str = "") -> Run:
    """Simulate per-bucket replica counts decided in advance: pods start one cold start early, and
    the run starts warm with what the first start-up needs (at least settings.initial_replicas)."""
    lead = cold.ready_after()
    initial = max(counts[: int(lead // bucket_s) + 1])
    if settings.initial_replicas is not None:
        initial = max(initial, settings.initial_replicas)
    cfg = SimulationSettings(**{**settings.__dict__, "initial_replicas": initial})
    return simulate(requests, perf, cold, Schedule(counts, bucket_s, lead, note), cfg, gpu_class)


def run_oracle(requests: Sequence[Request], perf: Performance, cold: ColdStart, settings: SimulationSettings,
               gpu_class: str = "", bucket_s: float = 60.0, iterations: int = 5,
               headroom: float | None = None) -> Run:
    """The plan with foresight at `headroom`, or without one the cheapest (by bisection) that
    meets the SLO target (see the module docstring)."""
    capacity = saturated_throughput(requests, perf, settings)
    duration = settings.duration if settings.duration is not None else requests[-1].arrival

    def attempt(h: float) -> Run:
        counts = oracle_schedule(requests, capacity, h, duration, bucket_s, settings.min_replicas,
                                 settings.max_replicas)
        return run_plan(requests, perf, cold, settings, counts, bucket_s,
                        f"capacity {capacity:.2f} req/s/replica, headroom {h:+.0%}", gpu_class)

    if headroom is not None:
        return attempt(headroom)
    lo_h, hi_h = -0.3, 1.5
    best = attempt(hi_h)
    if summarize(best).slo_attainment < settings.slo_target:
        return best   # not even 2.5x the saturated need meets the target: report that run
    for _ in range(iterations):
        mid = (lo_h + hi_h) / 2
        run = attempt(mid)
        if summarize(run).slo_attainment >= settings.slo_target:
            best, hi_h = run, mid
        else:
            lo_h = mid
    return best
