"""One service's Signals from what Prometheus returned for it (pure): the rules the live loop
(loop.signals_for, over the tick's snapshot) and the simulator (policies/ours, over its model of
Prometheus) share, so the two cannot drift apart.

Each argument is one signal's value for the service as the query returned it (settings.py holds
the PromQL): None where the service has no series, NaN where Prometheus returned NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..planning.llm_performance import Sizing

NO_SERIES = "no Triton metrics for this service in Prometheus"


# Signals is a value, never changed after it is made; it is not `frozen` because a frozen
# dataclass's __init__ sets each field through object.__setattr__, three times slower, and the tick
# makes one per service (policy.Decision likewise).
@dataclass(slots=True)
class Signals:
    """One service's figures from one tick. `error` set means the figures cannot be trusted.

    The optional fields feed the demand rule; without them the policy runs on queue and p99."""

    queue_depth: float | None = None   # requests waiting, summed over the service's pods
    p99_ms: float | None = None        # None: no traffic in the window (the summary is NaN)
    ready: int = 0                     # replicas serving
    error: str | None = None
    arrival_rate: float | None = None  # requests/s received over the last minute, when measured directly
    throughput: float | None = None    # requests/s completed over the last minute
    recent_throughput: float | None = None  # requests/s completed over the last SHORT_WINDOW_S (history.py)
    startup_s: float | None = None     # seconds a new pod takes to become ready (last observed)
    in_flight: float | None = None     # requests inside the engines' batches, summed over pods
    capacity_hint: float | None = None  # planned requests/s of one saturated replica (planning/llm_performance)
    solo_latency_s: float | None = None  # planned seconds one request spends alone in a batch
    batch_slots: float | None = None   # requests one replica's batch holds
    prefill_s: float | None = None     # planned seconds a replica's batch stalls for one request's prefill
    reporting: int | None = None       # pods whose metrics Prometheus has (fewer than ready: partial figures)
    held: float | None = None          # requests the gateway holds for a ready replica (none is ready)
    gateway_in_flight: float | None = None  # requests the gateway has sent to replicas and not finished
    attainment: float | None = None    # share of the last 10 minutes' requests that met the latency target
    slo_requests: float | None = None  # how many requests that share is of

    def busy(self) -> bool:
        """Any sign of use: something queued, held, inside a batch, in flight at the gateway, or
        completed in the rate window."""
        return any(x is not None and math.isfinite(x) and x > 0 for x in (
            self.queue_depth, self.held, self.in_flight, self.gateway_in_flight, self.throughput,
            self.arrival_rate))


def service_signals(*, ready: int, current: int, error: str | None = None, queue: float | None = None,
                    p99_ms: float | None = None, throughput: float | None = None,
                    recent_throughput: float | None = None, in_flight: float | None = None,
                    reporting: float | None = None, held: float | None = None,
                    gateway_in_flight: float | None = None, startup_s: float | None = None,
                    sizing: Sizing | None = None, slo_met: float | None = None,
                    slo_requests: float | None = None) -> Signals:
    """A failed query is an error (the policy holds, at zero too); so is no queue series for a
    service with replicas. A service scaled to zero (`current` 0) has no replica to report, so
    there no series is no demand, unless the gateway holds requests for it. Any other signal the
    service lacks (absent or not finite) is None, never 0. `sizing` is the planner's estimate of
    one replica for the measured token mix (planning/llm_performance), `startup_s` the creation-to-Ready
    seconds of the newest ready pod."""
    if error is not None:
        return Signals(ready=ready, error=error)

    share = attainment(slo_met, slo_requests)
    gateway = {"held": _finite(held), "gateway_in_flight": _finite(gateway_in_flight), "attainment": share,
               "slo_requests": None if share is None else slo_requests}
    if queue is None:
        if current == 0:
            return Signals(queue_depth=0.0, ready=ready, **gateway)
        why = NO_SERIES + (" yet: no replica is ready" if ready == 0 else " (is it scraped, with the service label?)")
        return Signals(ready=ready, error=why)

    pods = _finite(reporting)
    return Signals(
        queue_depth=queue, p99_ms=p99_ms, ready=ready, throughput=_finite(throughput),
        recent_throughput=_finite(recent_throughput),
        in_flight=_finite(in_flight), startup_s=startup_s, reporting=None if pods is None else int(pods),
        capacity_hint=sizing.rate if sizing else None, solo_latency_s=sizing.solo_s if sizing else None,
        batch_slots=sizing.slots if sizing else None, prefill_s=sizing.prefill_s if sizing else None, **gateway)


def attainment(met: float | None, requests: float | None) -> float | None:
    """The share of the last window's requests that met the latency target (None: none counted)."""
    met, requests = _finite(met), _finite(requests)
    if met is None or requests is None or requests < 1:
        return None
    return min(1.0, max(0.0, met / requests))


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None
