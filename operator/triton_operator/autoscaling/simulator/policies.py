"""Autoscaling policies the simulator can run (pure).

- `ours`: the operator's own policy. It calls triton_operator.autoscaling.policy.decide, the
  very function the live loop calls, with Signals built by the function loop.signals_for calls
  (signals.service_signals) from what the PromQL expressions in settings.py return (requests
  waiting, max of per-pod p99, requests in the batches, completions per second, the token mix,
  pods reporting, the gateway's held and in-flight requests) and the planner's sizing. With
  minReplicas 0 that is decide's scale-to-zero path: the service goes to zero after
  scaleToZeroAfterSeconds idle and wakes on the requests the gateway holds. It is told about a
  replica what the live loop is told: the planner's estimate from the InferenceService and its
  GPUClass (`planner`), never the simulated engine.
- Baselines configured as a user configures them (`--policy`, parse_policy), each with the
  upstream defaults for the keys left out (cited on the classes):
  - `hpa[:metric=M,target=N,stabilization=S]`: Kubernetes autoscaling/v2 on a Pods metric
    through prometheus-adapter, AverageValue target. Replica calculation follows
    pkg/controller/podautoscaler/replica_calculator.go (calcPlainMetricReplicas, groupPods), the
    behaviour horizontal.go (stabilizeRecommendationWithBehaviors, calculateScaleUpLimit...):
    scale up window 0 s, max(100 %, 4 pods) per 15 s; scale down window S (300 s), 100 % per
    15 s; tolerance 0.1; sync every 15 s.
  - `keda[:metric=M,target=N,activation=A,polling=S,cooldown=S]`: KEDA's Prometheus scaler
    feeding the HPA an External metric; scales to zero and back with minReplicas 0.
  - `kpa[:target=N,utilization=U,window=S]`: Knative's autoscaler on the queue-proxies'
    concurrency, stable and panic windows; scales to zero and back with minReplicas 0.
  M is one of queue, inflight, occupancy, concurrency (pod_metric). Bare `hpa` and `keda` scale
  on the queue per pod with targetQueueDepth.
- `fixed:N`: N replicas, never changed.
- `oracle`: knows every future arrival. Per 60 s bucket it provisions the fewest replicas whose
  saturated throughput (measured on this workload's own request mix) covers the bucket's
  arrivals times (1 + headroom), starting pods one cold start early and removing them the moment
  they are not needed; the headroom is the smallest (bisection) whose run meets the SLO target.
  It is the reference for GPU-hours: an autoscaler without foresight cannot do much better.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Sequence

from ...api import AutoscalingSpec
from ...planning.serving import Sizing
from .. import policy as live_policy
from ..signals import service_signals
from .simulation import Run, Settings, View, simulate
from .metrics import Sample
from .replica import ColdStart, LLMPerformance, Performance
from .workload import Request

EPOCH = datetime(2023, 11, 16, 18, 0, tzinfo=timezone.utc)
LIVE_TICK_S = 10.0        # settings.autoscale_interval_seconds default
HPA_SYNC_S = 15.0         # --horizontal-pod-autoscaler-sync-period default
HPA_TOLERANCE = 0.1       # --horizontal-pod-autoscaler-tolerance default
HPA_DOWN_WINDOW_S = 300.0 # behavior.scaleDown.stabilizationWindowSeconds default
ADAPTER_RELIST_S = 60.0   # prometheus-adapter --metrics-relist-interval as kube-prometheus sets it
KEDA_POLLING_S = 30.0     # ScaledObject pollingInterval default
KEDA_COOLDOWN_S = 300.0   # ScaledObject cooldownPeriod default
KPA_TARGET = 100.0        # config-autoscaler container-concurrency-target-default
KPA_UTILIZATION = 0.7     # container-concurrency-target-percentage (70)
KPA_WINDOW_S = 60.0       # stable-window
KPA_GRACE_S = 30.0        # scale-to-zero-grace-period


class PolicyError(ValueError):
    pass


# ------------------------------------------------------------------------------------------------
# ours
# ------------------------------------------------------------------------------------------------

TOKEN_WINDOW_S = 300.0    # the token-mix query: rate(..._sum[5m]) / rate(..._count[5m])


def live_signals(view: View, perf: Performance | None = None) -> live_policy.Signals:
    """The Signals the live loop would build at this instant: what its queries
    (prometheus.PrometheusSource.snapshot) would return, read from the simulated Prometheus,
    through the rules the loop applies (signals.service_signals). A failed query returns no
    series; a service's figures are those of its fresh series: queue = the sum of pending
    requests, p99 = the max of the per-pod p99 (NaN without traffic), reporting = pods with a
    series, throughput = sum(rate(nv_inference_request_success[1m])); for TensorRT-LLM only,
    in_flight = sum(nv_trt_llm_request_metrics{request_type="active"}) and `sizing` = the planner's
    estimate of a replica (`perf`, as loop.sizing_for computes it) for the token mix measured from
    nv_llm_input_token_len and nv_llm_output_token_len; startup_s = creation-to-Ready of the
    newest ready pod; the gateway's held and in-flight requests."""
    prom, now = view.prometheus, view.now
    error = prom.query_error(now)
    fresh = {} if error is not None else prom.fresh(now)
    gw = None if error is not None else prom.gateway_at(now)
    figures: dict[str, Any] = {}
    if fresh:
        llm = isinstance(perf, LLMPerformance)
        p99s = [s.p99_ms for s in fresh.values() if not math.isnan(s.p99_ms)]
        figures = {"queue": sum(s.pending for s in fresh.values()), "p99_ms": max(p99s) if p99s else math.nan,
                   "reporting": len(fresh), "throughput": prom.rate(now, 60.0),
                   "in_flight": float(sum(s.active for s in fresh.values())) if llm else None,
                   "sizing": _measured_sizing(view, perf) if llm else None, "startup_s": _startup_s(view)}
    return service_signals(ready=view.ready, current=view.desired, error=error,
                           held=None if gw is None else gw.held,
                           gateway_in_flight=None if gw is None else gw.in_flight, **figures)


def _measured_sizing(view: View, perf: Performance | None) -> Sizing | None:
    """The planner's sizing for the token mix of the requests completed in the last 5 minutes
    (None before any completed)."""
    prom, now = view.prometheus, view.now
    count = prom.rate(now, TOKEN_WINDOW_S)
    prompt, output = prom.rate(now, TOKEN_WINDOW_S, counter="prompt_tokens"), prom.rate(
        now, TOKEN_WINDOW_S, counter="output_tokens")
    if count and prompt is not None and output is not None:
        return perf.sizing(prompt / count, output / count)  # type: ignore[union-attr]
    return None


def _startup_s(view: View) -> float | None:
    # Every ready pod has a creation and a Ready time, those the run starts with too (they were
    # created one cold start before it).
    started = [p for p in view.pods if p.state == "ready" and p.ready_at > p.created]
    newest = max(started, key=lambda p: p.ready_at) if started else None
    return None if newest is None else newest.ready_at - newest.created


@dataclass
class Ours:
    spec: AutoscalingSpec
    planner: Performance | None = None   # the planner's estimate (planning/serving), not the engine
    signals: Callable[[View, Performance | None], live_policy.Signals] = live_signals
    name: str = "ours"
    interval: float = LIVE_TICK_S
    sample_interval: float = 0.0
    history: live_policy.History | None = None

    def decide(self, view: View) -> tuple[int, str]:
        now = EPOCH + timedelta(seconds=view.now)
        if self.history is None:
            self.history = live_policy.seed(now, view.desired)
        d = live_policy.decide(self.spec, view.desired, self.signals(view, self.planner), self.history, now)
        self.history = d.history
        return d.desired, d.reason

    def sample(self, view: View) -> None:  # pragma: no cover - never sampled
        pass


# ------------------------------------------------------------------------------------------------
# Kubernetes HPA (autoscaling/v2) and KEDA on top of it
# ------------------------------------------------------------------------------------------------

# The per-pod figures a user can scale on (each a Prometheus series of the llm model, through
# prometheus-adapter for the HPA or a KEDA Prometheus trigger):
# - queue: requests waiting (triton_llm_queued_requests); 0 until a replica's batch is full;
# - inflight: requests inside the engine's batch (triton_llm_active_requests);
# - concurrency: both (what waits plus what runs: Knative's notion of concurrency);
# - occupancy: the batch's busy share in percent (inflight / maxBatchSize x 100), the way a
#   Utilization target reads.
METRICS = ("queue", "inflight", "occupancy", "concurrency")


def pod_metric(sample: Sample, metric: str, slots: float) -> float:
    if metric == "queue":
        return sample.pending
    if metric == "inflight":
        return float(sample.active)
    if metric == "concurrency":
        return sample.pending + sample.active
    return 100.0 * sample.active / slots


@dataclass
class HPABehavior:
    """horizontal.go's normalizeDesiredReplicasWithBehaviors: scale up without a window, by
    max(100 %, 4 pods) per 15 s; scale down to the highest recommendation within `down_window`
    (scaleDown.stabilizationWindowSeconds, 300 s by default), by up to 100 % per 15 s."""

    min_replicas: int
    max_replicas: int
    up_window: float = 0.0
    down_window: float = HPA_DOWN_WINDOW_S
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    up_events: list[tuple[float, int]] = field(default_factory=list)
    down_events: list[tuple[float, int]] = field(default_factory=list)

    seeded: bool = False

    def seed(self, now: float, current: int) -> None:
        """The same start as ours (policy.seed): on its first decision the controller counts as
        having recommended the current replicas just now, as one that had been running would."""
        if not self.seeded:
            self.seeded = True
            self.recommendations.append((now, current))

    def _changed_within(self, events: list[tuple[float, int]], now: float, period: float) -> int:
        return sum(n for t, n in events if t > now - period)

    def normalize(self, now: float, current: int, desired: int) -> tuple[int, str]:
        up = down = desired
        for t, r in self.recommendations:
            if t > now - self.up_window:
                up = min(up, r)
            if t > now - self.down_window:
                down = max(down, r)
        stabilized = max(current, up)
        stabilized = min(stabilized, down)
        keep = max(self.up_window, self.down_window)
        self.recommendations = [(t, r) for t, r in self.recommendations if t > now - keep]
        self.recommendations.append((now, desired))
        why = ""
        if stabilized != desired:
            why = (f" (ScaleDownStabilized: highest recommendation in {self.down_window:g}s)" if desired < current
                   else " (ScaleUpStabilized)")
        result = stabilized
        if stabilized > current:
            added = self._changed_within(self.up_events, now, 15)
            deleted = self._changed_within(self.down_events, now, 15)
            start = current - added + deleted
            limit = max(start + 4, math.ceil(start * 2.0))       # Pods 4 / Percent 100, selectPolicy Max
            limit = min(self.max_replicas, max(limit, current))
            if result > limit:
                result, why = limit, why + " (ScaleUpLimit)"
        elif stabilized < current:
            added = self._changed_within(self.up_events, now, 15)
            deleted = self._changed_within(self.down_events, now, 15)
            start = current - added + deleted
            limit = min(current, int(start * (1 - 1.0)))          # Percent 100 per 15 s
            floor = max(self.min_replicas, limit)
            if result < floor:
                result = floor
        result = max(self.min_replicas, min(self.max_replicas, result))
        if result > current:
            self.up_events.append((now, result - current))
        elif result < current:
            self.down_events.append((now, current - result))
        self.up_events = [e for e in self.up_events if e[0] > now - 15]
        self.down_events = [e for e in self.down_events if e[0] > now - 15]
        return result, why


def hpa_pods_metric(values: dict[int, float], pods: list[tuple[int, str]], current: int,
                    target: float, tolerance: float = HPA_TOLERANCE) -> int | None:
    """replica_calculator.go calcPlainMetricReplicas for a Pods metric. `pods` holds (id, phase)
    with phase Pending or Running; `values` the metric of pods that have one. None: the HPA
    cannot compute ("did not receive metrics for any ready pods")."""
    ready_count, ignored, missing = 0, set(), set()
    metrics: dict[int, float] = {}
    for rid, phase in pods:
        if phase == "Pending":
            ignored.add(rid)
            continue
        if rid not in values:
            missing.add(rid)
            continue
        metrics[rid] = values[rid]
        ready_count += 1
    if not metrics:
        return None
    ratio = sum(metrics.values()) / len(metrics) / target
    rebalance = bool(ignored) and ratio > 1.0
    if not rebalance and not missing:
        if abs(1.0 - ratio) <= tolerance:
            return current
        return math.ceil(ratio * ready_count)
    if missing:
        fill = target if ratio < 1.0 else 0.0
        for rid in missing:
            metrics[rid] = fill
    if rebalance:
        for rid in ignored:
            metrics[rid] = 0.0
    new_ratio = sum(metrics.values()) / len(metrics) / target
    if abs(1.0 - new_ratio) <= tolerance or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current
    return math.ceil(new_ratio * len(metrics))


@dataclass
class HPA:
    """An HPA (autoscaling/v2) on a Pods metric with an AverageValue target: `metric` per pod
    through prometheus-adapter (relisted every 60 s), `target` per pod, scale-down stabilization
    `stabilization` seconds. Defaults (Kubernetes API reference, HorizontalPodAutoscalerBehavior;
    kube-controller-manager flags): stabilization 300 s, tolerance 0.1, sync every 15 s; it
    cannot scale to zero (that needs the HPAScaleToZero feature gate and an Object or External
    metric)."""

    spec: AutoscalingSpec
    cold: ColdStart
    metric: str = "queue"
    target: float | None = None          # None: the InferenceService's targetQueueDepth
    stabilization: float = HPA_DOWN_WINDOW_S
    slots: float = 64.0                  # the engine's maxBatchSize (occupancy)
    name: str = "hpa"
    interval: float = HPA_SYNC_S
    sample_interval: float = 0.0
    behavior: HPABehavior | None = None
    last_relist: float = 0.0

    def __post_init__(self) -> None:
        if self.target is None:
            self.target = self.spec.target_queue_depth
        self.behavior = HPABehavior(self.spec.min_replicas, self.spec.max_replicas, down_window=self.stabilization)

    def decide(self, view: View) -> tuple[int, str]:
        assert self.behavior is not None and self.target is not None
        current = view.desired
        self.behavior.seed(view.now, current)
        if view.prometheus.query_error(view.now):
            return current, "hpa: unable to get metric (adapter: Prometheus unreachable): holding"
        while self.last_relist + ADAPTER_RELIST_S <= view.now:
            self.last_relist += ADAPTER_RELIST_S
        fresh = view.prometheus.fresh(view.now)
        listed = {rid: pod_metric(s, self.metric, self.slots) for rid, s in fresh.items()
                  if view.prometheus.first_seen.get(rid, math.inf) <= self.last_relist}
        started = self.cold.schedule_s + self.cold.pull_s
        pods = [(p.rid, "Pending" if p.state == "loading" and view.now - p.created < started else "Running")
                for p in view.pods if p.state in ("loading", "ready")]
        desired = hpa_pods_metric(listed, pods, current, self.target)
        if desired is None:
            return current, "hpa: did not receive metrics for any ready pods: holding"
        desired = max(self.spec.min_replicas, min(self.spec.max_replicas, desired))
        result, why = self.behavior.normalize(view.now, current, desired)
        return result, (f"hpa: {self.metric}/pod {sum(listed.values()) / max(1, len(listed)):.1f} "
                        f"(target {self.target:g}) -> {desired}{why}")

    def sample(self, view: View) -> None:  # pragma: no cover
        pass


@dataclass
class KEDA:
    """KEDA's Prometheus scaler (pkg/scalers/prometheus_scaler.go): the query sums `metric` over
    the service's pods plus the requests the gateway holds (so it sees demand at zero replicas),
    an External metric with an AverageValue `target` that the HPA turns into
    ceil(value / target) (GetExternalPerPodMetricReplicas, over spec replicas). An empty or NaN
    result reads as 0 (ignoreNullValues defaults to true); a query error leaves the HPA unable to
    compute, so replicas hold (no fallback configured, the default).

    Scale to zero (minReplicas 0, KEDA's own default minReplicaCount): every `polling` seconds
    the operator checks activity (value > `activation`); inactive for `cooldown` seconds it scales
    to zero, active at zero it scales to one and the HPA takes over. Defaults
    (keda.sh/docs/2.22/reference/scaledobject-spec, /scalers/prometheus): pollingInterval 30 s,
    cooldownPeriod 300 s, activationThreshold 0; the HPA's behaviour defaults otherwise."""

    spec: AutoscalingSpec
    metric: str = "queue"
    target: float | None = None
    activation: float = 0.0
    polling: float = KEDA_POLLING_S
    cooldown: float = KEDA_COOLDOWN_S
    stabilization: float = HPA_DOWN_WINDOW_S
    slots: float = 64.0
    name: str = "keda"
    interval: float = HPA_SYNC_S
    sample_interval: float = 0.0
    ignore_null_values: bool = True
    behavior: HPABehavior | None = None
    last_poll: float = -math.inf
    last_active: float = 0.0

    def __post_init__(self) -> None:
        if self.target is None:
            self.target = self.spec.target_queue_depth
        self.behavior = HPABehavior(max(1, self.spec.min_replicas), self.spec.max_replicas,
                                    down_window=self.stabilization)
        self.interval = min(HPA_SYNC_S, self.polling)

    def _value(self, view: View) -> tuple[float, str] | None:
        fresh = view.prometheus.fresh(view.now)
        gw = view.prometheus.gateway_at(view.now)
        held = gw.held if gw is not None and self.metric in ("queue", "concurrency") else 0.0
        if not fresh and not held:
            if not self.ignore_null_values:
                return None
            return 0.0, " (empty result read as 0)"
        return sum(pod_metric(s, self.metric, self.slots) for s in fresh.values()) + held, ""

    def decide(self, view: View) -> tuple[int, str]:
        assert self.behavior is not None and self.target is not None
        current = view.desired
        self.behavior.seed(view.now, current)
        if view.prometheus.query_error(view.now):
            return current, "keda: scaler error (Prometheus unreachable), no fallback: holding"
        got = self._value(view)
        if got is None:
            return current, "keda: empty result is an error: holding"
        value, note = got
        if self.spec.min_replicas == 0 and view.now - self.last_poll >= self.polling - 1e-9:
            self.last_poll = view.now
            if value > self.activation:
                self.last_active = view.now
                if current == 0:
                    return 1, f"keda: {self.metric} {value:.1f} > activation {self.activation:g}: 0 -> 1"
            elif current > 0 and view.now - self.last_active >= self.cooldown:
                return 0, f"keda: inactive for {self.cooldown:g}s (cooldownPeriod): -> 0"
        if current == 0:
            return 0, f"keda: {self.metric} {value:.1f}{note}, not active: at zero"
        ratio = value / (self.target * current)
        desired = current if abs(1.0 - ratio) <= HPA_TOLERANCE else math.ceil(value / self.target)
        desired = max(max(1, self.spec.min_replicas), min(self.spec.max_replicas, desired))
        result, why = self.behavior.normalize(view.now, current, desired)
        return result, f"keda: {self.metric} {value:.1f}{note} (target {self.target:g}) -> {desired}{why}"

    def sample(self, view: View) -> None:  # pragma: no cover
        pass


# ------------------------------------------------------------------------------------------------
# Knative KPA
# ------------------------------------------------------------------------------------------------

@dataclass
class KPA:
    """Knative's autoscaler (pkg/autoscaler/scaling/autoscaler.go) on the concurrency the
    queue-proxies (and, at zero, the activator) report every second. Defaults (config-autoscaler,
    knative.dev/docs/serving/autoscaling/): container-concurrency-target-default 100, target
    utilization 70 %, stable window 60 s, panic window 10 % of it, panic threshold 200 %, max
    scale up rate 1000, max scale down rate 2, tick 2 s, scale-to-zero-grace-period 30 s (with
    minReplicas 0). It does not read Prometheus."""

    spec: AutoscalingSpec
    target_per_pod: float = KPA_TARGET
    utilization: float = KPA_UTILIZATION
    stable_window: float = KPA_WINDOW_S
    panic_window_pct: float = 10.0
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    grace_s: float = KPA_GRACE_S
    name: str = "kpa"
    interval: float = 2.0
    sample_interval: float = 1.0
    samples: deque[tuple[float, float]] = field(default_factory=deque)
    panic_time: float | None = None
    max_panic_pods: int = 0
    last_busy: float = -math.inf

    def sample(self, view: View) -> None:
        self.samples.append((view.now, view.concurrency))
        while self.samples and self.samples[0][0] <= view.now - self.stable_window:
            self.samples.popleft()

    def _average(self, now: float, window: float) -> float | None:
        values = [c for t, c in self.samples if t > now - window]
        return sum(values) / len(values) if values else None

    def decide(self, view: View) -> tuple[int, str]:
        now = view.now
        ready = max(1.0, float(view.ready))
        stable = self._average(now, self.stable_window)
        panic = self._average(now, self.stable_window * self.panic_window_pct / 100)
        if stable is None or panic is None:
            return view.desired, "kpa: no data to scale on yet"
        target = self.target_per_pod * self.utilization
        max_up = math.ceil(self.max_scale_up_rate * ready)
        max_down = math.floor(ready / self.max_scale_down_rate)
        dspc, dppc = math.ceil(stable / target), math.ceil(panic / target)
        stable_pods = int(min(max(dspc, max_down), max_up))
        panic_pods = int(min(max(dppc, max_down), max_up))
        over = dppc / ready >= self.panic_threshold
        if self.panic_time is None and over:
            self.panic_time = now
        elif over:
            self.panic_time = now
        elif self.panic_time is not None and self.panic_time + self.stable_window < now:
            self.panic_time, self.max_panic_pods = None, 0
        desired = stable_pods
        mode = "stable"
        if self.panic_time is not None:
            mode = "panic"
            desired = max(desired, panic_pods)
            self.max_panic_pods = max(self.max_panic_pods, desired)
            desired = self.max_panic_pods
        if view.concurrency > 0 or desired > 0:
            self.last_busy = now
        if self.spec.min_replicas == 0 and view.concurrency > 0:
            desired = max(desired, 1)       # the activator holds a request: wake
        if desired == 0 and view.desired > 0 and now - self.last_busy < self.grace_s:
            desired = 1                     # scale-to-zero-grace-period
        desired = max(self.spec.min_replicas, min(self.spec.max_replicas, desired))
        return desired, f"kpa ({mode}): concurrency {stable:.1f} stable / {panic:.1f} panic, target {target:.1f}/pod"


# ------------------------------------------------------------------------------------------------
# fixed and oracle
# ------------------------------------------------------------------------------------------------

@dataclass
class Fixed:
    replicas: int
    name: str = "fixed"
    interval: float = 60.0
    sample_interval: float = 0.0

    def decide(self, view: View) -> tuple[int, str]:
        return self.replicas, f"fixed at {self.replicas}"

    def sample(self, view: View) -> None:  # pragma: no cover
        pass


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


def saturated_throughput(requests: Sequence[Request], perf: Performance, settings: Settings,
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
    cfg = Settings(min_replicas=1, max_replicas=1, slo_s=settings.slo_s, seed=settings.seed,
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


def run_oracle(requests: Sequence[Request], perf: Performance, cold: ColdStart, settings: Settings,
               gpu_class: str = "", bucket_s: float = 60.0, iterations: int = 5) -> Run:
    """The cheapest plan with foresight that meets the SLO target (see the module docstring)."""
    from .results import summarize

    capacity = saturated_throughput(requests, perf, settings)
    duration = settings.duration if settings.duration is not None else requests[-1].arrival
    lead = cold.ready_after()

    def attempt(h: float) -> Run:
        counts = oracle_schedule(requests, capacity, h, duration, bucket_s, settings.min_replicas,
                                 settings.max_replicas)
        note = f"capacity {capacity:.2f} req/s/replica, headroom {h:+.0%}"
        initial = max(counts[: int(lead // bucket_s) + 1])
        if settings.initial_replicas is not None:
            initial = max(initial, settings.initial_replicas)
        cfg = Settings(**{**settings.__dict__, "initial_replicas": initial})
        return simulate(requests, perf, cold, Schedule(counts, bucket_s, lead, note), cfg, gpu_class)

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


# ------------------------------------------------------------------------------------------------
# policies as users write them: ours | oracle | fixed:N | hpa:... | keda:... | kpa:...
# ------------------------------------------------------------------------------------------------

POLICY_KEYS: dict[str, tuple[str, ...]] = {
    "hpa": ("metric", "target", "stabilization"),
    "keda": ("metric", "target", "activation", "polling", "cooldown", "stabilization"),
    "kpa": ("target", "utilization", "window"),
}
USAGE = ("ours, oracle, fixed:N, hpa[:metric=M,target=N,stabilization=S], "
         "keda[:metric=M,target=N,activation=A,polling=S,cooldown=S], kpa[:target=N,utilization=U,window=S] "
         f"(M: {'|'.join(METRICS)})")
POLICY_NAMES = ("ours", "hpa", "keda", "kpa", "oracle", "fixed:N")
# key -> (lowest allowed, whether the lowest itself is allowed, what to say)
_RANGES = {
    "target": (0.0, False, "a number > 0"),
    "stabilization": (0.0, True, "a number of seconds >= 0"),
    "activation": (0.0, True, "a number >= 0"),
    "polling": (0.0, False, "a number of seconds > 0"),
    "cooldown": (0.0, True, "a number of seconds >= 0"),
    "utilization": (0.0, False, "a percentage in (0, 100]"),
    "window": (6.0, True, "a number of seconds >= 6 (Knative's minimum)"),
}


@dataclass(frozen=True)
class PolicySpec:
    """A parsed --policy: the family and its settings; `name` is the text as given (the run's name)."""

    family: str
    settings: tuple[tuple[str, float | str], ...] = ()
    name: str = ""

    def get(self, key: str, default: float | str | None = None) -> float | str | None:
        return dict(self.settings).get(key, default)


def parse_policy(text: str | PolicySpec) -> PolicySpec:
    """`ours`, `oracle`, `fixed:N`, or a baseline with its settings as a user configures it.
    Keys left out take the upstream defaults (see HPA, KEDA and KPA). Bare `hpa` and `keda` scale
    on the queue per pod with the InferenceService's targetQueueDepth as the target (a metric and
    its target have no upstream default, so they are given together or not at all); bare `kpa` is
    Knative with its defaults (target 100, utilization 70 %)."""
    if isinstance(text, PolicySpec):
        return text
    raw = text.strip()
    family, sep, rest = raw.partition(":")
    if family in ("ours", "oracle"):
        if sep:
            raise PolicyError(f"policy {text!r}: {family} takes no settings")
        return PolicySpec(family, (), family)
    if family == "fixed":
        if rest.isdigit() and int(rest) >= 1:
            return PolicySpec("fixed", (("replicas", float(int(rest))),), f"fixed:{int(rest)}")
        raise PolicyError(f"policy {text!r}: fixed:N needs a whole number N >= 1")
    keys = POLICY_KEYS.get(family)
    if keys is None:
        raise PolicyError(f"unknown policy {text!r}; choose from {USAGE}")
    values: dict[str, float | str] = {}
    for item in rest.split(",") if sep else []:
        key, eq, value = (x.strip() for x in item.partition("="))
        if not eq or not key or not value:
            raise PolicyError(f"policy {text!r}: expected key=value, got {item.strip()!r}")
        if key not in keys:
            raise PolicyError(f"policy {text!r}: unknown key {key!r}; {family} takes {', '.join(keys)}")
        if key in values:
            raise PolicyError(f"policy {text!r}: {key} is given twice")
        if key == "metric":
            if value not in METRICS:
                raise PolicyError(f"policy {text!r}: metric must be one of {', '.join(METRICS)}, got {value!r}")
            values[key] = value
            continue
        lowest, inclusive, what = _RANGES[key]
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if (not math.isfinite(number) or number < lowest or (number == lowest and not inclusive)
                or (key == "utilization" and number > 100)):
            raise PolicyError(f"policy {text!r}: {key} must be {what}, got {value!r}")
        values[key] = number
    if family in ("hpa", "keda") and ("metric" in values) != ("target" in values):
        raise PolicyError(f"policy {text!r}: metric and target go together (neither has an upstream default), "
                          f"e.g. {family}:metric=concurrency,target=48")
    return PolicySpec(family, tuple(sorted(values.items())), raw)


# The HPA does not scale to zero on a Pods metric (the HPAScaleToZero gate and an Object/External
# metric are needed); KEDA (activation, cooldownPeriod) and Knative (activator, grace period) do,
# and are modelled.
NO_SCALE_TO_ZERO = ("hpa",)


def check_min_replicas(names: Sequence[str | PolicySpec], spec: AutoscalingSpec) -> None:
    """minReplicas 0 runs only with policies whose scale to zero is modelled."""
    if spec.min_replicas > 0:
        return
    bad = [p.name for p in map(parse_policy, names) if p.family in NO_SCALE_TO_ZERO]
    if bad:
        raise PolicyError(f"minReplicas 0: {', '.join(bad)} cannot scale to zero (an HPA on a Pods metric "
                          "never goes below one replica); simulate it with minReplicas 1, or use keda or kpa")


def warm_start(requests: Sequence[Request], perf: Performance, settings: Settings) -> Settings:
    """Settings whose initial replicas serve the first minute's arrivals at 80 % of a replica's
    saturated throughput, as if the service had been running: every policy starts from the
    same, sensible place instead of from minReplicas under full load."""
    if settings.initial_replicas is not None or not requests:
        return settings
    capacity = saturated_throughput(requests, perf, settings)
    first = sum(1 for r in requests if r.arrival < 60.0) / 60.0
    initial = max(settings.min_replicas, min(settings.max_replicas, math.ceil(first / (capacity * 0.8))))
    return Settings(**{**settings.__dict__, "initial_replicas": initial})


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
               spec: AutoscalingSpec, settings: Settings, gpu_class: str = "",
               planner: LLMPerformance | None = None) -> Run:
    """Run one policy. `perf` is the simulated replica (the engine); `planner` is what ours is
    told about a replica: the planner's estimate from the InferenceService and its GPUClass
    (planning/serving.llm_performance), as the live loop computes it, never the engine itself."""
    p = parse_policy(name)
    check_min_replicas([p], spec)
    settings = warm_start(requests, perf, settings)
    if p.family == "oracle":
        return run_oracle(requests, perf, cold, settings, gpu_class)
    slots = float(perf.max_batch if isinstance(perf, LLMPerformance) else perf.slots)
    policy = build_policy(p, spec, cold, slots, planner)
    if p.family == "fixed":
        n = int(p.get("replicas"))  # type: ignore[arg-type]
        settings = Settings(**{**settings.__dict__, "initial_replicas": n,
                               "max_replicas": max(n, settings.max_replicas),
                               "min_replicas": min(n, settings.min_replicas)})
    return simulate(requests, perf, cold, policy, settings, gpu_class)  # type: ignore[arg-type]
