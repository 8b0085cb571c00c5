"""Where a warm floor is the answer (pure: runs simulations, writes nothing): `simulate`'s
recommendation of minReplicas.

A reactive policy learns of a burst when it arrives; replicas asked for then serve a start-up
later. Where bursts are shorter than a start-up and come without warning, no policy that cannot
see them coming serves them: only replicas already running do. Ours keeps replicas between the
bursts it has seen (the break-even keep-alive), but it must see some first. So `simulate` also runs
ours with minReplicas raised one at a time, and fixed pools of the same sizes, on the same workload,
and recommends:

- the smallest minReplicas with which ours meets the attainment target, when ours does not at the
  spec's (a warm floor the bursts need from their first second);
- or none, when the spec's minReplicas already meets it (or no floor up to the largest tried does:
  then the target is not met by replicas in warm reserve either).

It also says when a fixed pool reaches the target for fewer GPU-hours than every floor tried: then
the load is best served by that pool, not by an autoscaler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from .results import Summary

MAX_FLOORS = 6      # floors tried above the spec's minReplicas


@dataclass(frozen=True)
class Recommendation:
    target: float                      # the attainment aimed at
    floors: list[tuple[int, Summary]]  # ours with minReplicas = n
    pools: list[tuple[int, Summary]]   # fixed:n
    min_replicas: int | None           # recommended, None: keep the spec's
    pool: int | None                   # a fixed pool that reaches the target cheaper than every floor

    def text(self, spec_min: int) -> str:
        lines = [f"Warm floors (ours with minReplicas raised) and fixed pools, against an attainment target of "
                 f"{self.target:.1%}:"]
        for n, s in self.floors:
            lines.append(f"  ours, minReplicas {n}: {s.slo_attainment:.2%} at {s.gpu_hours:.2f} GPU-h")
        for n, s in self.pools:
            lines.append(f"  fixed:{n}: {s.slo_attainment:.2%} at {s.gpu_hours:.2f} GPU-h")
        if self.min_replicas is not None:
            lines.append(f"Recommendation: minReplicas {self.min_replicas} (now {spec_min}): with fewer replicas "
                         f"kept warm the target is missed, as load rises faster than replicas start.")
        elif self.floors and self.floors[0][1].slo_attainment >= self.target:
            lines.append(f"Recommendation: keep minReplicas {spec_min}: ours meets the target with it.")
        else:
            lines.append("Recommendation: no floor tried meets the target; raise maxReplicas or relax the target.")
        if self.pool is not None:
            lines.append(f"A fixed pool of {self.pool} replicas reaches the target for fewer GPU-hours than any floor "
                         f"tried: this load is best served warm, not autoscaled.")
        return "\n".join(lines)


def recommend(run: Callable[[str, int], Summary], spec_min: int, spec_max: int, target: float) -> Recommendation:
    """`run(policy, min_replicas)` simulates one policy. Floors are tried from the spec's minimum up,
    until ours meets the target or MAX_FLOORS more have been tried; fixed pools of the same sizes."""
    floors: list[tuple[int, Summary]] = []
    pools: list[tuple[int, Summary]] = []
    for n in range(max(1, spec_min), min(spec_max, max(1, spec_min) + MAX_FLOORS) + 1):
        floors.append((n, run("ours", n)))
        pools.append((n, run(f"fixed:{n}", n)))
        if floors[-1][1].slo_attainment >= target:
            break
    meets = [(n, s) for n, s in floors if s.slo_attainment >= target]
    chosen = meets[0][0] if meets and meets[0][0] != floors[0][0] else None
    best_floor = min((s.gpu_hours for _, s in meets), default=math.inf)
    pool = next((n for n, s in pools if s.slo_attainment >= target and s.gpu_hours < best_floor), None)
    return Recommendation(target, floors, pools, chosen, pool)
