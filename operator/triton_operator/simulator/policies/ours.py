"""`ours`: the operator's own policy in the simulator (pure). It calls
triton_operator.autoscaling.policy.decide, the very function the live loop calls, with Signals
built by the function loop.signals_for calls (signals.service_signals) from what the PromQL
expressions in settings.py return (requests waiting, the p99 latency, requests in the batches,
completions per second, the token mix, pods reporting, the gateway's held and in-flight requests)
and the planner's sizing. With minReplicas 0 that is decide's scale-to-zero path: the service goes
to zero after scaleToZeroAfterSeconds idle and wakes on the requests the gateway holds. It is told
about a replica what the live loop is told: the planner's estimate from the InferenceService and
its GPUClass (`planner`), never the simulated engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from ...api import AutoscalingSpec
from ...autoscaling import policy as live_policy
from ...autoscaling.history import SHORT_WINDOW_S, History, seed
from ...autoscaling.signals import Signals, service_signals
from ...planning.llm_performance import Sizing
from ..replica import LLMPerformance, Performance
from ..simulation import View

EPOCH = datetime(2023, 11, 16, 18, 0, tzinfo=timezone.utc)
LIVE_TICK_S = 10.0        # settings.autoscale_interval_seconds default
TOKEN_WINDOW_S = 300.0    # the token-mix query: rate(..._sum[5m]) / rate(..._count[5m])


def live_signals(view: View, perf: Performance | None = None) -> Signals:
    """The Signals the live loop would build at this instant: what its queries
    (prometheus.PrometheusSource.snapshot) would return, read from the simulated Prometheus,
    through the rules the loop applies (signals.service_signals). A failed query returns no
    series; a service's figures are those of its fresh series: queue = the sum of pending
    requests, reporting = pods with a series, throughput = sum(rate(nv_inference_request_success[1m]))
    (and over SHORT_WINDOW_S, the recent throughput); p99 = for an LLM, histogram_quantile(0.99)
    over the service's request-duration buckets' rates over the last minute (Prometheus.
    duration_quantile), otherwise the max of the per-pod summary's p99 (NaN without traffic); for
    an LLM only, in_flight = the requests in the engines' batches and `sizing` = the planner's
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
        if llm:
            p99_s = prom.duration_quantile(now, 0.99)
            p99 = math.nan if p99_s is None else p99_s * 1000.0
        else:
            p99s = [s.p99_ms for s in fresh.values() if not math.isnan(s.p99_ms)]
            p99 = max(p99s) if p99s else math.nan
        figures = {"queue": sum(s.pending for s in fresh.values()), "p99_ms": p99,
                   "reporting": len(fresh), "throughput": prom.rate(now, 60.0),
                   "recent_throughput": prom.rate(now, SHORT_WINDOW_S),
                   "in_flight": float(sum(s.active for s in fresh.values())) if llm else None,
                   "sizing": _measured_sizing(view, perf) if llm else None, "startup_s": _startup_s(view)}
    slo = None if error is not None else prom.slo_increase(now)
    return service_signals(ready=view.ready, current=view.desired, error=error,
                           held=None if gw is None else gw.held,
                           gateway_in_flight=None if gw is None else gw.in_flight,
                           slo_met=None if slo is None else slo[0], slo_requests=None if slo is None else slo[1],
                           **figures)


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
    planner: Performance | None = None   # the planner's estimate (planning/llm_performance), not the engine
    signals: Callable[[View, Performance | None], Signals] = live_signals
    name: str = "ours"
    interval: float = LIVE_TICK_S
    sample_interval: float = 0.0
    history: History | None = None

    def decide(self, view: View) -> tuple[int, str]:
        now = EPOCH + timedelta(seconds=view.now)
        if self.history is None:
            self.history = seed(now, view.desired, new=True)
        d = live_policy.decide(self.spec, view.desired, self.signals(view, self.planner), self.history, now)
        self.history = d.history
        return d.desired, d.reason

    def sample(self, view: View) -> None:  # pragma: no cover - never sampled
        pass
