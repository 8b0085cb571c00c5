"""`kpa[:target=N,utilization=U,window=S]` (pure): Knative's autoscaler (the KPA) on the
queue-proxies' concurrency, stable and panic windows; scales to zero and back with minReplicas 0.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from ...api import AutoscalingSpec
from ..simulation import View

KPA_TARGET = 100.0        # config-autoscaler container-concurrency-target-default
KPA_UTILIZATION = 0.7     # container-concurrency-target-percentage (70)
KPA_WINDOW_S = 60.0       # stable-window
KPA_GRACE_S = 30.0        # scale-to-zero-grace-period


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
