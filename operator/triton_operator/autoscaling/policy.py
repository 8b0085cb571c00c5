"""The autoscaling policy (pure): metrics snapshot + current replicas + spec + history + now ->
decision with a reason a human can read. The clock is passed in; the live loop and the simulator
(autoscaling/simulator, `triton-operator simulate`) call the same function.

Rules, and the failures they prevent (see shared/reference/autoscaling.md):
- Fail static: a Prometheus error, a missing or NaN queue series holds the current replicas
  (kubernetes#99394, keda#3065: an outage read as "no load" dropped services to minimum).
- Queue depth asks for ceil(total queued / target per replica) replicas: an absolute count, so
  pods that are still loading count as capacity on the way and one burst never compounds into a
  second burst of scale-ups while they start.
- p99 latency asks for ceil(ready x p99 / target), but only while requests wait: latency made of
  service time (the queue is empty) does not fall with more replicas, so a p99 target below it
  is reported as out of reach instead of scaling to max.
- Demand (when the loop feeds the arrival rate): replicas = (arrival rate + its rising trend x
  the pod start-up time) / (a replica's capacity x UTILIZATION), plus what drains the queue
  within DRAIN_S. A replica's capacity is learned from the metrics: whenever requests wait, every
  ready replica is full, so throughput / ready over a minute spent saturated is what one replica
  can do (a running average of those samples, kept in History). Until one is learned the queue rule alone decides. With a capacity
  known, demand replaces the queue rule, which over-asks on a backlog (a queue of 400 is not 100
  replicas of steady load) and under-asks when in-flight batching hides the load (the queue is
  empty while every batch slot is busy).
- Scale to zero (minReplicas 0): requests held at the gateway count as queued requests, so a
  service at zero asks for a replica on the first tick that sees one held. Below one replica it
  goes only after the idle window (scaleToZeroAfterSeconds) without a request queued, running,
  held or completed; until then the floor is one replica (an empty queue alone is no proof of
  idleness: in-flight batching serves a full load with nothing waiting). The idle window is the
  stabilization of that last step, so it goes to zero at once when it has passed.
- The largest request wins. A tolerance band ignores small noise (llm-d-autoscaling#1427).
- Up fast: at once, at most max(2x, +4) per decision. Down slowly: only to the highest
  recommendation seen within the stabilization window, and at most maxStep per decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from ..api import AutoscalingSpec

UTILIZATION = 0.8          # share of a replica's learned capacity the demand rule plans to use
DRAIN_S = 60.0             # the demand rule drains a backlog within this many seconds
CAPACITY_WEIGHT = 0.2      # weight of a new capacity sample in the running average
TREND_WINDOW_S = 120.0     # arrival-rate history used for the trend
DEFAULT_STARTUP_S = 60.0   # pod start-up time assumed when the loop does not measure it
RATE_WINDOW_S = 60.0       # the window of the throughput and arrival-rate queries


@dataclass(frozen=True)
class Signals:
    """One service's figures from one tick. `error` set means the figures cannot be trusted.

    The optional rates feed the demand rule; without them the policy runs on queue and p99."""

    queue_depth: float | None = None   # requests waiting, summed over the service's pods
    p99_ms: float | None = None        # None: no traffic in the window (the summary is NaN)
    ready: int = 0                     # replicas serving
    error: str | None = None
    arrival_rate: float | None = None  # requests/s the service received over the last minute
    throughput: float | None = None    # requests/s it completed over the last minute
    startup_s: float | None = None     # seconds a new pod takes to become ready (last observed)
    held: float | None = None          # requests held at the gateway, waiting for a ready replica
    gateway_in_flight: float | None = None  # requests the gateway has sent to replicas and not finished

    def busy(self) -> bool:
        """Any sign of use: something queued, held, running, or completed in the rate window."""
        return any(x is not None and math.isfinite(x) and x > 0 for x in (
            self.queue_depth, self.held, self.gateway_in_flight, self.throughput, self.arrival_rate))


@dataclass(frozen=True)
class History:
    """Recommendations within the stabilization window, oldest first; the learned per-replica
    capacity (requests/s) and recent arrival rates."""

    recommendations: tuple[tuple[datetime, int], ...] = ()
    capacity: float | None = None
    rates: tuple[tuple[datetime, float], ...] = ()
    saturated_since: datetime | None = None
    idle_since: datetime | None = None  # first tick of the current run without any use

    def add(self, now: datetime, replicas: int, window: timedelta) -> History:
        kept = tuple((t, r) for t, r in self.recommendations if now - t < window)
        return replace(self, recommendations=kept + ((now, replicas),))

    def highest(self) -> int | None:
        return max((r for _, r in self.recommendations), default=None)

    def learn(self, now: datetime, signals: Signals) -> History:
        """Capacity from saturated ticks (requests waiting: every ready replica is full), and
        the arrival-rate trail for the trend."""
        capacity, since = self.capacity, self.saturated_since
        saturated = (signals.ready > 0 and signals.queue_depth is not None
                     and signals.queue_depth >= signals.ready)
        since = (since or now) if saturated else None
        # Only a throughput measured over a fully saturated rate window is a capacity sample.
        if (since is not None and now - since >= timedelta(seconds=RATE_WINDOW_S)
                and signals.throughput is not None and signals.throughput > 0):
            sample = signals.throughput / signals.ready
            capacity = sample if capacity is None else (
                (1 - CAPACITY_WEIGHT) * capacity + CAPACITY_WEIGHT * sample)
        rates = self.rates
        if signals.arrival_rate is not None and math.isfinite(signals.arrival_rate):
            cutoff = now - timedelta(seconds=TREND_WINDOW_S)
            rates = tuple((t, r) for t, r in rates if t >= cutoff) + ((now, signals.arrival_rate),)
        return replace(self, capacity=capacity, rates=rates, saturated_since=since)

    def trend(self) -> float:
        """Least-squares slope of the arrival rate (requests/s per s) over the trail; 0 below
        three points."""
        if len(self.rates) < 3:
            return 0.0
        t0 = self.rates[0][0]
        xs = [(t - t0).total_seconds() for t, _ in self.rates]
        ys = [r for _, r in self.rates]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        return 0.0 if var == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var


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
    unattainable: str | None = None    # a target no replica count can meet, and why


def _fmt(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _demand(spec: AutoscalingSpec, current: int, queue: float, signals: Signals,
            history: History) -> tuple[int, str] | None:
    capacity, rate = history.capacity, signals.arrival_rate
    if capacity is None or capacity <= 0 or rate is None or not math.isfinite(rate):
        return None
    lead = signals.startup_s if signals.startup_s is not None else DEFAULT_STARTUP_S
    rising = max(0.0, history.trend()) * lead
    need = (rate + rising) / (capacity * UTILIZATION) + queue / (capacity * DRAIN_S)
    replicas = max(1, math.ceil(need - 1e-9))
    ratio = need / max(current, 1)
    if abs(ratio - 1) <= spec.tolerance and need <= current:
        replicas = current
    note = f"demand {_fmt(rate)} req/s"
    if rising > 0:
        note += f" (+{_fmt(rising)} rising over {_fmt(lead)}s start-up)"
    note += f" / capacity {_fmt(capacity)} req/s/replica at {UTILIZATION:.0%}"
    return replicas, note


def decide(spec: AutoscalingSpec, current: int, signals: Signals, history: History,
           now: datetime) -> Decision:
    if spec.min_replicas == 0:
        return _decide_to_zero(spec, current, signals, history, now)
    return _decide(spec, current, signals, history, now, spec.min_replicas)


def _decide_to_zero(spec: AutoscalingSpec, current: int, signals: Signals, history: History,
                    now: datetime) -> Decision:
    """minReplicas 0: the floor is one replica until the idle window has passed (see the module)."""
    if signals.error is not None:
        return _decide(spec, current, signals, history, now, 0 if current == 0 else 1)
    idle_since = None if signals.busy() else (history.idle_since or now)
    history = replace(history, idle_since=idle_since)
    idle_s = (now - idle_since).total_seconds() if idle_since is not None else 0.0
    if idle_since is not None and (current == 0 or idle_s >= spec.scale_to_zero_after_seconds):
        held = signals.held or 0
        kept = history.add(now, 0, timedelta(seconds=spec.scale_down_stabilization_seconds))
        if current == 0:
            return Decision(0, "scaled to zero: no requests queued, running or held", True, kept, 0.0,
                            None, {"idle": 0})
        return Decision(0, f"scale to zero {current}->0: no requests for {_fmt(idle_s)}s "
                           f"(scaleToZeroAfterSeconds {spec.scale_to_zero_after_seconds}); held {_fmt(held)}",
                        True, kept, 0.0, None, {"idle": 0})
    decision = _decide(spec, current, signals, history, now, 1)
    if idle_since is not None:
        left = spec.scale_to_zero_after_seconds - idle_s
        decision = replace(decision, reason=decision.reason + f"; idle for {_fmt(idle_s)}s, zero in {_fmt(left)}s")
    return decision


def _decide(spec: AutoscalingSpec, current: int, signals: Signals, history: History,
            now: datetime, lo: int) -> Decision:
    hi = spec.max_replicas
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
    unattainable: str | None = None
    capacity = max(current, 1)
    history = history.learn(now, signals)

    per_replica = queue / max(ready, 1)
    # Requests held at the gateway (a service waking from zero) wait like queued ones.
    held = signals.held if signals.held is not None and math.isfinite(signals.held) else 0.0
    queue += held
    demand = _demand(spec, current, queue, signals, history)
    if demand is not None:
        wants["demand"], note = demand
        notes.append(note)
        notes.append(f"queue {_fmt(per_replica)}/replica")
    else:
        # Queue depth: replicas needed so that each holds at most the target queue.
        ratio = queue / (spec.target_queue_depth * capacity)
        wants["queue"] = current if abs(ratio - 1) <= tol else math.ceil(queue / spec.target_queue_depth)
        notes.append(f"queue {_fmt(per_replica)}/replica (target {_fmt(spec.target_queue_depth)})")
    if held:
        notes.append(f"{_fmt(held)} held at the gateway")

    p99 = signals.p99_ms
    if p99 is not None and math.isnan(p99):
        p99 = None
    target = spec.target_p99_latency_ms
    if target is not None and p99 is not None and ready > 0:
        ratio = p99 / target
        notes.append(f"p99 {_fmt(p99)}ms (target {_fmt(target)}ms)")
        if ratio > 1 + tol and queue < 1:
            # Nothing waits: the latency is service time, which more replicas do not shorten.
            unattainable = (f"p99 {_fmt(p99)}ms is over the {_fmt(target)}ms target with no "
                            f"queue: that is service time, more replicas would not meet it")
        else:
            # Based on ready replicas only: pods still loading do not lower latency yet, and since
            # they are part of `current`, a request they already cover adds nothing.
            wants["p99"] = current if abs(ratio - 1) <= tol else math.ceil(ready * ratio)

    recommendation = max(lo, min(hi, max(wants.values())))
    window = timedelta(seconds=spec.scale_down_stabilization_seconds)
    history = history.add(now, recommendation, window)
    signals_text = ", ".join(notes)
    if unattainable:
        signals_text += f" ({unattainable})"

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
                    None if p99 is None else round(p99, 3), wants, unattainable)

