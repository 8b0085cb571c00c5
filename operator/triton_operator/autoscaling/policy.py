"""The autoscaling policy (pure): metrics snapshot + current replicas + spec + history + now ->
decision with a reason a human can read. The clock is passed in; the live loop and a simulator
call the same function.

Rules, and the failures they prevent (see shared/reference/autoscaling.md):
- Fail static: a Prometheus error, a missing or NaN queue series holds the current replicas
  (kubernetes#99394, keda#3065: an outage read as "no load" dropped services to minimum).
- Queue depth asks for ceil(total queued / target per replica) replicas: an absolute count, so
  pods that are still loading count as capacity on the way and one burst never compounds into a
  second burst of scale-ups while they start.
- p99 latency asks for ceil(ready x p99 / target): what the serving replicas need; pods still
  loading are already in the current count, so they are not asked for twice.
- The largest request wins. A tolerance band ignores small noise (llm-d-autoscaling#1427).
- Up fast: at once, at most max(2x, +4) per decision. Down slowly: only to the highest
  recommendation seen within the stabilization window, and at most maxStep per decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..api import AutoscalingSpec


@dataclass(frozen=True)
class Signals:
    """One service's figures from one tick. `error` set means the figures cannot be trusted."""

    queue_depth: float | None = None   # requests waiting, summed over the service's pods
    p99_ms: float | None = None        # None: no traffic in the window (the summary is NaN)
    ready: int = 0                     # replicas serving
    error: str | None = None


@dataclass(frozen=True)
class History:
    """Recommendations within the stabilization window, oldest first."""

    recommendations: tuple[tuple[datetime, int], ...] = ()

    def add(self, now: datetime, replicas: int, window: timedelta) -> History:
        kept = tuple((t, r) for t, r in self.recommendations if now - t < window)
        return History(kept + ((now, replicas),))

    def highest(self) -> int | None:
        return max((r for _, r in self.recommendations), default=None)


def seed(now: datetime, current: int) -> History:
    """History for a service first seen (e.g. after an operator restart): it counts as having
    recommended its current replicas just now, so nothing scales down before a full window."""
    return History(((now, current),))


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str
    metrics_available: bool
    history: History
    queue_per_replica: float | None = None
    p99_ms: float | None = None
    wants: dict[str, int] = field(default_factory=dict)

    def changes(self, current: int) -> bool:
        return self.desired != current


def _fmt(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def decide(spec: AutoscalingSpec, current: int, signals: Signals, history: History,
           now: datetime) -> Decision:
    lo, hi = spec.min_replicas, spec.max_replicas
    bounded = max(lo, min(hi, current))
    if signals.error is not None:
        why = f"metrics unavailable ({signals.error}): holding {bounded} replicas"
        if bounded != current:
            why += f" (moved into [{lo}, {hi}])"
        return Decision(bounded, why, False, history)
    queue = signals.queue_depth
    if queue is None or math.isnan(queue):
        return Decision(bounded, f"no queue-depth data: holding {bounded} replicas", False, history)

    ready = signals.ready
    tol = spec.tolerance
    wants: dict[str, int] = {}
    notes: list[str] = []
    capacity = max(current, 1)

    # Queue depth: replicas needed so that each holds at most the target queue.
    ratio = queue / (spec.target_queue_depth * capacity)
    wants["queue"] = current if abs(ratio - 1) <= tol else math.ceil(queue / spec.target_queue_depth)
    per_replica = queue / max(ready, 1)
    notes.append(f"queue {_fmt(per_replica)}/replica (target {_fmt(spec.target_queue_depth)})")

    p99 = signals.p99_ms
    if p99 is not None and math.isnan(p99):
        p99 = None
    if spec.target_p99_latency_ms is not None and p99 is not None and ready > 0:
        ratio = p99 / spec.target_p99_latency_ms
        # Based on ready replicas only: pods still loading do not lower latency yet, and since
        # they are part of `current`, a request they already cover adds nothing.
        wants["p99"] = current if abs(ratio - 1) <= tol else math.ceil(ready * ratio)
        notes.append(f"p99 {_fmt(p99)}ms (target {_fmt(spec.target_p99_latency_ms)}ms)")

    recommendation = max(lo, min(hi, max(wants.values())))
    window = timedelta(seconds=spec.scale_down_stabilization_seconds)
    history = history.add(now, recommendation, window)
    signals_text = ", ".join(notes)

    if recommendation > current:
        limit = max(2 * current, current + 4)
        desired = min(recommendation, limit)
        driver = max(wants, key=lambda k: wants[k])
        reason = f"scale up {current}->{desired}: {signals_text}; {driver} asks for {wants[driver]}"
        if desired < recommendation:
            reason += f" (step limited to {desired})"
    elif recommendation < current:
        stabilized = history.highest() or recommendation
        if stabilized >= current:
            desired = current
            reason = (f"holding {current}: {signals_text} ask for {recommendation}, but "
                      f"{stabilized} was recommended within the last {spec.scale_down_stabilization_seconds}s")
        else:
            desired = max(stabilized, current - spec.scale_down_max_step)
            reason = f"scale down {current}->{desired}: {signals_text}; highest recommendation in window {stabilized}"
    else:
        desired = current
        reason = f"steady at {current}: {signals_text}"
    return Decision(desired, reason, True, history, round(per_replica, 3),
                    None if p99 is None else round(p99, 3), wants)
