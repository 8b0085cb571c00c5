"""`keda[:metric=M,target=N,activation=A,polling=S,cooldown=S]` (pure): KEDA's Prometheus scaler
feeding the HPA an External metric; scales to zero and back with minReplicas 0. M is one of
common.METRICS; bare `keda` scales on the queue per pod with targetQueueDepth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...api import AutoscalingSpec
from ..simulation import View
from .common import pod_metric
from .hpa import HPA_DOWN_WINDOW_S, HPA_SYNC_S, HPA_TOLERANCE, HPABehavior

KEDA_POLLING_S = 30.0     # ScaledObject pollingInterval default
KEDA_COOLDOWN_S = 300.0   # ScaledObject cooldownPeriod default


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
