"""`hpa[:metric=M,target=N,stabilization=S]` (pure): Kubernetes autoscaling/v2 on a Pods metric
through prometheus-adapter, AverageValue target. Replica calculation follows
pkg/controller/podautoscaler/replica_calculator.go (calcPlainMetricReplicas, groupPods), the
behaviour horizontal.go (stabilizeRecommendationWithBehaviors, calculateScaleUpLimit...): scale up
window 0 s, max(100 %, 4 pods) per 15 s; scale down window S (300 s), 100 % per 15 s; tolerance
0.1; sync every 15 s. M is one of common.METRICS; bare `hpa` scales on the queue per pod with
targetQueueDepth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...api import AutoscalingSpec
from ..replica import ColdStart
from ..simulation import View
from .common import pod_metric

HPA_SYNC_S = 15.0         # --horizontal-pod-autoscaler-sync-period default
HPA_TOLERANCE = 0.1       # --horizontal-pod-autoscaler-tolerance default
HPA_DOWN_WINDOW_S = 300.0 # behavior.scaleDown.stabilizationWindowSeconds default
ADAPTER_RELIST_S = 60.0   # prometheus-adapter --metrics-relist-interval as kube-prometheus sets it


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
