"""The keep-alive by break-even (pure): how long an idle replica is worth holding, from the
gaps between the ticks that needed it and what a restart costs. policy.py says why.
"""

from __future__ import annotations

import math
from datetime import datetime

MIN_GAP_S = 30.0           # a replica unasked for less than this (a tick or two) was needed throughout
RESTART_PENALTY = 0.2      # replica-seconds a second run a replica short costs, per attainment/(1 - attainment)


def keep_alive(gaps: list[float], restart_s: float, idle_s: float = 0.0) -> float:
    """How long to keep an idle replica after it was last needed (seconds), by break-even: holding
    it through a gap of g seconds costs g replica-seconds; releasing it and starting one again when
    it is next needed costs `restart_s` (its start-up, and the requests it misses while it starts,
    in replica-seconds).

    The replica has been idle `idle_s` so far, so this gap is longer than that: only the gaps seen
    that were longer say how much longer it may last (a burst's own short pauses say nothing about
    the quiet after it). Over those, the remaining hold W minimizes the mean of
    min(g - idle, W) + restart_s x [g - idle > W] ("Serverless in the Wild", ATC 2020, keeps
    functions alive on the same reasoning): 0 (release now) when they run long, the longest worth
    holding through when they recur.

    When no gap seen was longer (a need seen for the first time, or a quiet longer than any
    remembered), nothing says when it ends: the hold is `restart_s` itself, the break-even of the
    ski-rental problem, which never pays more than twice what hindsight would have (a need that
    never recurs costs one restart's worth of holding; one that does is met warm)."""
    longer = sorted(g - idle_s for g in gaps if g > idle_s)
    if not longer:
        return restart_s
    n = len(longer)
    best_w, best = 0.0, restart_s * n          # W = 0: every gap pays a restart
    held = 0.0                                   # sum of the gaps up to and including the j-th
    for j, g in enumerate(longer):
        held += g
        cost = held + (n - j - 1) * (g + restart_s)
        if cost < best:
            best_w, best = g, cost
    return idle_s + best_w if best_w > 0 else 0.0


def layer_gaps(needs: tuple[tuple[datetime, int], ...], layer: int, now: datetime) -> tuple[list[float], float]:
    """For replica number `layer`, from the needs remembered: the gaps (seconds) between the ticks
    that asked for it (shorter than MIN_GAP_S: needed throughout), and how long it has been
    unasked for now (inf: never asked within them).

    The quiet before its first need within the memory counts as a gap too: the service ran that
    long without it, so a gap between its needs lasts at least that long (a lower bound, which
    holds the replica for no longer than the true gap would). Without it a layer first reached in a
    burst after an hour without it counted as a need seen for the first time, held for a restart's
    whole cost: on the real code trace played twice, the second hour's largest burst asked for 7
    replicas where 3 had served the hour, and they were held 12 minutes."""
    gaps: list[float] = []
    last: datetime | None = None
    for t, n in needs:
        if n >= layer:
            step = (t - (last if last is not None else needs[0][0])).total_seconds()
            if step > MIN_GAP_S:
                gaps.append(step)
            last = t
    return gaps, math.inf if last is None else (now - last).total_seconds()


def restart_cost(lead_s: float, attainment: float) -> float:
    """A restart's cost in replica-seconds: the start-up it pays, and the start-up it then runs a
    replica short (the need is seen when its load arrives), priced by the SLO: the fewer
    violations the target allows, the dearer each second short (RESTART_PENALTY x attainment /
    (1 - attainment) replica-seconds; 0.99: 20.8 start-ups in all)."""
    a = min(max(attainment, 0.5), 0.9999)
    return lead_s * (1.0 + RESTART_PENALTY * a / (1.0 - a))
