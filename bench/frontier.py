"""The cost/violation frontier of swept baselines, comparisons with it at equal SLO attainment and
at equal GPU-hours, and the fluid lower bound (pure: figures in, figures out; bench/autoscaling.py
runs the simulations).

- A point is (GPU-hours, SLO-violating requests) of one run. The frontier is the set of swept
  baseline points no other swept point beats on both (Pareto), joined by straight lines: a
  platform team choosing between two configurations could get anything in between by running
  each part of the time.
- At equal attainment: the frontier's GPU-hours at ours' violations, interpolated; `ratio` is
  ours' GPU-hours over that. None when ours has fewer violations than every swept point (no
  baseline configuration reaches its attainment: there is nothing to compare at).
- At equal GPU-hours: the frontier's violations at ours' GPU-hours; `fewer` is 1 - ours' over
  that. None when ours is cheaper than every swept point.
- Dominated: some swept point has no more GPU-hours and no more violations, one of them fewer.
- Foresight plans (the simulator's `oracle:headroom=H` at a range of H) are not swept baselines:
  they know every arrival. Their own frontier, at ours' violations, says what plans that see the
  future, with one headroom for every minute, need in the same simulation (queueing, batching,
  cold starts included); ours over it is roughly the price of not seeing it, and it over the fluid
  bound is what such a plan still pays over the bound (bench/foresight.py chooses each minute on
  its own instead). None when no plan reaches ours' attainment. Judged by the goal themselves
  (`plans_meeting_goal`), they say where the goal is within reach of foresight at all.
- The fluid lower bound provisions, per 60 s bucket, the fewest whole replicas whose saturated
  throughput (on the workload's own mix) serves the bucket's arrivals, and starts from the same
  warm replicas as the policies. A replica added costs one cold start of GPU time before it
  serves; a replica needed again after a gap is held through the gap or started again,
  whichever costs less. At an attainment below 100 % it may leave requests unserved, dropping first the
  capacity that serves the fewest requests (greedy on requests lost per replica-bucket saved).
  No policy that cannot see the future or serve faster than saturation needs fewer GPU-hours
  (it ignores queueing, so it is optimistic, as a bound should be). Below 100 % attainment the
  greedy drop is optimal for the buckets' own GPU time but does not weigh the start-ups a drop
  adds or saves, so there the figure is a close estimate of the bound, not a proof of it."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Point:
    name: str
    gpu_hours: float
    violations: int


def frontier(points: Sequence[Point]) -> list[Point]:
    """Pareto points, cheapest first (violations strictly falling)."""
    out: list[Point] = []
    for p in sorted(points, key=lambda p: (p.gpu_hours, p.violations)):
        if not out or p.violations < out[-1].violations:
            out.append(p)
    return out


def gpu_at_violations(front: Sequence[Point], violations: float) -> float | None:
    """The frontier's GPU-hours at this many violations (None below its fewest)."""
    if not front or violations < front[-1].violations:
        return None
    if violations >= front[0].violations:
        return front[0].gpu_hours
    for a, b in zip(front, front[1:]):
        if b.violations <= violations <= a.violations:
            w = (a.violations - violations) / (a.violations - b.violations)
            return a.gpu_hours + w * (b.gpu_hours - a.gpu_hours)
    return None  # pragma: no cover - the loop covers every case


def violations_at_gpu(front: Sequence[Point], gpu_hours: float) -> float | None:
    """The frontier's violations at this many GPU-hours (None below its cheapest)."""
    if not front or gpu_hours < front[0].gpu_hours:
        return None
    if gpu_hours >= front[-1].gpu_hours:
        return float(front[-1].violations)
    for a, b in zip(front, front[1:]):
        if a.gpu_hours <= gpu_hours <= b.gpu_hours:
            w = (gpu_hours - a.gpu_hours) / (b.gpu_hours - a.gpu_hours)
            return a.violations + w * (b.violations - a.violations)
    return None  # pragma: no cover


def dominated_by(points: Sequence[Point], ours: Point) -> list[Point]:
    return [p for p in points if p.gpu_hours <= ours.gpu_hours and p.violations <= ours.violations
            and (p.gpu_hours < ours.gpu_hours or p.violations < ours.violations)]


@dataclass(frozen=True)
class Comparison:
    ratio: float | None          # ours' GPU-hours / the frontier's at ours' attainment
    fewer: float | None          # 1 - ours' violations / the frontier's at ours' GPU-hours
    dominated: tuple[str, ...]   # swept configurations that dominate ours
    fluid_ratio: float           # ours' GPU-hours / the fluid bound's at ours' attainment
    foresight_ratio: float | None = None   # ours' GPU-hours / the foresight plans' at ours' attainment

    @property
    def frontier_fluid_ratio(self) -> float | None:
        """The frontier's GPU-hours at ours' attainment over the fluid bound's: how far the best
        swept configuration is from the bound (None where no configuration reaches ours'
        attainment)."""
        return None if self.ratio is None else self.fluid_ratio / self.ratio

    @property
    def foresight_fluid_ratio(self) -> float | None:
        """The foresight plans' GPU-hours at ours' attainment over the fluid bound's."""
        return None if self.foresight_ratio is None else self.fluid_ratio / self.foresight_ratio

    def beats_baselines(self, ratio_goal: float = 0.85, fewer_goal: float = 0.30) -> bool:
        """Not dominated by any swept configuration, and at most 0.85x the frontier's GPU-hours at
        equal attainment or at least 30 % fewer violations at equal GPU-hours."""
        better = (self.ratio is not None and self.ratio <= ratio_goal) or (
            self.fewer is not None and self.fewer >= fewer_goal)
        return not self.dominated and better

    def near_foresight(self, goal: float = 1.15) -> bool:
        """Within 1.15x the GPU-hours of the plans with foresight at equal attainment (true when no
        plan reaches ours' attainment: there is nothing cheaper at it to be near)."""
        return self.foresight_ratio is None or self.foresight_ratio <= goal

    def goal_met(self) -> bool:
        """Both: beats the baselines and is near the plans with foresight."""
        return self.beats_baselines() and self.near_foresight()


def compare(points: Sequence[Point], ours: Point, fluid_gpu_hours: float,
            foresight: Sequence[Point] = ()) -> Comparison:
    front = frontier(points)
    at = gpu_at_violations(front, ours.violations)
    ref = violations_at_gpu(front, ours.gpu_hours)
    fewer = None
    if ref is not None:
        fewer = (1 - ours.violations / ref) if ref > 0 else (0.0 if ours.violations == 0 else -math.inf)
    seen = gpu_at_violations(frontier(foresight), ours.violations)
    return Comparison(None if at is None or at <= 0 else ours.gpu_hours / at, fewer,
                      tuple(p.name for p in dominated_by(points, ours)),
                      ours.gpu_hours / fluid_gpu_hours if fluid_gpu_hours > 0 else math.inf,
                      None if seen is None or seen <= 0 else ours.gpu_hours / seen)


def plans_meeting_goal(points: Sequence[Point], plans: Sequence[Point]) -> list[str]:
    """The foresight plans that beat the baselines themselves, each judged like ours against the
    swept points. Where none does, beating the baselines by that margin asks more than plans that
    know every arrival deliver here."""
    return [p.name for p in plans if compare(points, p, math.inf).beats_baselines()]


def fluid_bound(arrivals: Sequence[float], capacity: float, duration: float, cold_s: float,
                initial: int, min_replicas: int, allowed_violations: float, bucket_s: float = 60.0,
                gpus_per_replica: int = 1) -> float:
    """GPU-hours of per-bucket fluid provisioning (see the module) that leaves at most
    `allowed_violations` requests unserved."""
    buckets = max(1, math.ceil(duration / bucket_s))
    counts = [0] * buckets
    for a in arrivals:
        counts[min(buckets - 1, int(a // bucket_s))] += 1
    per_replica = capacity * bucket_s
    need = [max(min_replicas, math.ceil(c / per_replica - 1e-9)) for c in counts]
    # Give up capacity where it serves the fewest requests: the top replica of a bucket serves
    # what is left over the others; every other one a full bucket's worth.
    heap = [(_lost(counts[b], need[b], per_replica), b) for b in range(buckets) if need[b] > min_replicas]
    heapq.heapify(heap)
    budget = allowed_violations
    while heap:
        lost, b = heapq.heappop(heap)
        if lost > budget:
            break
        budget -= lost
        need[b] -= 1
        if need[b] > min_replicas:
            heapq.heappush(heap, (_lost(counts[b], need[b], per_replica), b))
    return (sum(n * bucket_s for n in need) + _starts(need, initial, bucket_s, cold_s)) * gpus_per_replica / 3600.0


def _starts(need: Sequence[int], initial: int, bucket_s: float, cold_s: float) -> float:
    """GPU-seconds outside the buckets' own need: each replica layer (the k-th replica) that
    is needed again after a gap is either held through the gap or stopped and started again,
    whichever costs less (the gap, or one cold start); a layer first needed above the warm
    replicas is started once. The warm layers count as needed just before the first bucket."""
    seconds = 0.0
    for layer in range(1, max(need, default=0) + 1):
        last = -1 if layer <= initial else None  # the bucket this layer was last needed in
        for b, n in enumerate(need):
            if n < layer:
                continue
            if last is None:
                seconds += cold_s
            elif b - last > 1:
                seconds += min((b - last - 1) * bucket_s, cold_s)
            last = b
    return seconds


def _lost(count: int, replicas: int, per_replica: float) -> float:
    """Requests no longer served when a bucket with `replicas` keeps one fewer."""
    return min(count, replicas * per_replica) - min(count, (replicas - 1) * per_replica)
