"""What the autoscaler shows in status (pure): a decision -> the `status.autoscaling` and
`status.metrics` fields, the MetricsAvailable condition and the Events a change deserves.

A report is rewritten only when something a reader cares about changed: the desired replicas,
whether metrics are available, whether a target is out of reach (the reason then says why), or
a figure at two significant digits (3.14 and 3.12 queued requests both show 3.1). Noise in the metrics therefore writes nothing, and 1,000 services at a
steady load cost no API requests per tick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .. import conditions as c
from .policy import Decision

METRICS_AVAILABLE = "MetricsAvailable"


def significant(x: float | None, digits: int = 2) -> float | None:
    """`x` rounded to `digits` significant digits (None and NaN stay None)."""
    if x is None or math.isnan(x):
        return None
    if x == 0:
        return 0.0
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


@dataclass(frozen=True)
class Report:
    desired: int
    metrics_available: bool
    reason: str
    last_scale_time: str | None = None
    queue_depth: float | None = None
    p99_ms: float | None = None
    observed_at: str | None = None
    unattainable: bool = False          # a target no replica count can meet (lastDecision says which)
    slo_attainment: float | None = None  # share of the last 10 minutes' requests within the latency target

    def shown(self) -> tuple[Any, ...]:
        """What is worth a write when it changes (not the reason text, not the timestamps)."""
        return (self.desired, self.metrics_available, self.queue_depth, self.p99_ms, self.unattainable,
                self.slo_attainment)

    def same_as(self, other: Report | None) -> bool:
        return other is not None and self.shown() == other.shown()

    def status(self) -> dict[str, Any]:
        """The status fields this report owns. While metrics are unavailable the last good
        figures stay as they were (status.metrics is left out, not cleared)."""
        auto = {"desiredReplicas": self.desired, "lastDecision": self.reason, "lastScaleTime": self.last_scale_time}
        out: dict[str, Any] = {"autoscaling": {k: v for k, v in auto.items() if v is not None}}
        if self.metrics_available:
            metrics = {"queueDepth": self.queue_depth, "p99LatencyMs": self.p99_ms,
                       "sloAttainment": self.slo_attainment, "observedAt": self.observed_at}
            out["metrics"] = {k: v for k, v in metrics.items() if v is not None}
        return out

    def condition(self) -> tuple[bool, str, str]:
        if self.metrics_available:
            return True, "MetricsFresh", "queue depth and latency read from Prometheus"
        return False, "MetricsUnavailable", self.reason

    @staticmethod
    def from_status(status: dict[str, Any]) -> Report | None:
        """The report an earlier run left in status, so a restart does not rewrite it."""
        auto = status.get("autoscaling") or {}
        if auto.get("desiredReplicas") is None:
            return None
        cond = c.find(status.get("conditions") or [], METRICS_AVAILABLE)
        metrics = status.get("metrics") or {}
        return Report(int(auto["desiredReplicas"]), bool(cond and cond.get("status") == "True"),
                      auto.get("lastDecision") or "", auto.get("lastScaleTime"),
                      metrics.get("queueDepth"), metrics.get("p99LatencyMs"), metrics.get("observedAt"),
                      slo_attainment=metrics.get("sloAttainment"))


def report(decision: Decision, current: int, previous: Report | None, now: datetime, stamp: str | None = None
           ) -> tuple[Report, list[tuple[str, str, str]]]:
    """The report for `decision` (the previous one when nothing worth showing changed), and the
    Events (type, reason, message): one per scale, one when metrics go missing or come back.
    `stamp` is `now` as status shows it (the tick formats it once for every service)."""
    # A scale is a change of what the autoscaler asks for; while the Deployment catches up with a
    # request already shown, repeating it is no new scale.
    base = previous.desired if previous is not None else current
    scaled = decision.desired != base
    available = decision.metrics_available
    queue = significant(decision.queue_per_replica) if available else None
    p99 = significant(decision.p99_ms) if available else None
    unattainable = decision.unattainable is not None
    attained = attainment_shown(decision.attainment) if available else None
    events: list[tuple[str, str, str]] = []
    if scaled:
        events.append(("Normal", "ScaledUp" if decision.desired > base else "ScaledDown", decision.reason))
    if previous is None or previous.metrics_available != decision.metrics_available:
        if not decision.metrics_available:
            events.append(("Warning", "MetricsUnavailable", decision.reason))
        elif previous is not None:
            events.append(("Normal", "MetricsAvailable", "metrics are back; autoscaling resumed"))
    if decision.unattainable is not None and not (previous is not None and previous.unattainable):
        events.append(("Warning", "TargetUnattainable", decision.unattainable))
    if previous is not None and not scaled and (
            decision.desired, available, queue, p99, unattainable, attained) == previous.shown():
        return previous, events   # nothing worth a write: the same object, and no timestamp to format
    stamp = stamp or c.timestamp(now)
    new = Report(
        desired=decision.desired, metrics_available=available, reason=decision.reason,
        last_scale_time=stamp if scaled else (previous.last_scale_time if previous else None),
        queue_depth=queue, p99_ms=p99, observed_at=stamp if available else None, unattainable=unattainable,
        slo_attainment=attained)
    return new, events


def attainment_shown(x: float | None) -> float | None:
    """The attainment as status shows it: three decimals of the share (0.973), never 1.0 for a
    share that is not all (0.9996 shows 0.999)."""
    if x is None or math.isnan(x):
        return None
    return 1.0 if x >= 1.0 else math.floor(x * 1000) / 1000
