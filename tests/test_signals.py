"""autoscaling/signals.service_signals, the one set of rules the live loop and the simulator
share: table-driven over its cases, then one situation seen through both readers of it
(loop.signals_for over a Prometheus snapshot, the simulator's live_signals over its model of
Prometheus) must give the same Signals."""

from __future__ import annotations

import math

import pytest

from triton_operator.autoscaling.loop import signals_for
from triton_operator.autoscaling.prometheus import Snapshot
from triton_operator.autoscaling.signals import NO_SERIES, Signals, service_signals
from triton_operator.simulator import policies
from triton_operator.simulator.metrics_path import GatewaySample, Prometheus, Sample
from triton_operator.simulator.simulation import Pod, View
from triton_operator.planning.llm_performance import Sizing

KEY = ("prod", "chat")
SIZED = Sizing(rate=3.5, solo_s=2.0, slots=64.0, prefill_s=0.05)

CASES = [
    ("a failed query is an error, at zero too",
     dict(ready=0, current=0, error="Prometheus unreachable: ConnectionError", queue=3.0, held=2.0),
     Signals(ready=0, error="Prometheus unreachable: ConnectionError")),
    ("at zero no series is no demand, but what the gateway holds",
     dict(ready=0, current=0, held=2.0, gateway_in_flight=math.nan, throughput=4.0),
     Signals(queue_depth=0.0, ready=0, held=2.0)),
    ("no series with replicas none of which is ready",
     dict(ready=0, current=1, held=1.0),
     Signals(ready=0, error=NO_SERIES + " yet: no replica is ready")),
    ("no series with ready replicas",
     dict(ready=2, current=2, throughput=5.0, sizing=SIZED),
     Signals(ready=2, error=NO_SERIES + " (is it scraped, with the service label?)")),
    ("every figure, the sizing spread over its four fields",
     dict(ready=2, current=3, queue=6.0, p99_ms=900.0, throughput=4.5, in_flight=30.0, reporting=2.0, held=0.0,
          gateway_in_flight=36.0, startup_s=61.0, sizing=SIZED),
     Signals(queue_depth=6.0, p99_ms=900.0, ready=2, throughput=4.5, in_flight=30.0, reporting=2, held=0.0,
             gateway_in_flight=36.0, startup_s=61.0, capacity_hint=3.5, solo_latency_s=2.0, batch_slots=64.0,
             prefill_s=0.05)),
    ("an optional figure that is not finite is unknown, never 0",
     dict(ready=2, current=2, queue=0.0, throughput=math.inf, in_flight=math.nan, reporting=math.nan,
          held=math.nan),
     Signals(queue_depth=0.0, ready=2)),
    ("the gateway's attainment, with the count it is a share of",
     dict(ready=2, current=2, queue=0.0, slo_met=1188.0, slo_requests=1200.0),
     Signals(queue_depth=0.0, ready=2, attainment=0.99, slo_requests=1200.0)),
    ("no request counted: neither",
     dict(ready=2, current=2, queue=0.0, slo_met=0.0, slo_requests=0.0),
     Signals(queue_depth=0.0, ready=2)),
]


@pytest.mark.parametrize("kwargs, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_service_signals(kwargs, expected):
    assert service_signals(**kwargs) == expected


def test_a_p99_of_nan_no_traffic_in_the_window_is_passed_on_for_the_policy():
    s = service_signals(ready=1, current=1, queue=0.0, p99_ms=math.nan)
    assert math.isnan(s.p99_ms) and s.error is None


def prometheus(outage: tuple[float, float] | None = None, kind: str = "scrape") -> Prometheus:
    """Two pods and the gateway scraped at 0 s; with an outage from 1 s, scraped again in it."""
    prom = Prometheus(outage=outage, outage_kind=kind)
    for t in (0.0, 2.0) if outage else (0.0,):
        prom.scrape(t, {0: Sample(t, 3.0, 120.0, 10, 5), 1: Sample(t, 1.0, 250.0, 20, 7)}, [],
                    GatewaySample(t, 0.0, 12.0))
    return prom


def view(prom: Prometheus, desired: int = 2, ready: int = 2, now: float = 5.0) -> View:
    return View(now, desired, [Pod(i, "ready", 0.0, 0.0, 5) for i in range(ready)], prom, 0.0)


@pytest.mark.parametrize("sim, snapshot", [
    pytest.param(view(prometheus()), Snapshot(values={
        "queue": {KEY: 4.0}, "p99": {KEY: 250.0}, "reporting": {KEY: 2.0}, "held": {KEY: 0.0},
        "gateway_in_flight": {KEY: 12.0}}), id="two pods and the gateway scraped"),
    pytest.param(view(prometheus((1.0, 100.0))), Snapshot(values={}), id="a scrape outage: no series"),
    pytest.param(view(prometheus((1.0, 100.0), "prometheus")),
                 Snapshot(error="Prometheus unreachable: ConnectionError"), id="a Prometheus outage"),
    pytest.param(view(Prometheus(gateway=GatewaySample(0.0, 3.0, 0.0)), desired=0, ready=0),
                 Snapshot(values={"held": {KEY: 3.0}, "gateway_in_flight": {KEY: 0.0}}),
                 id="at zero, a request held at the gateway"),
])
def test_the_simulator_reads_what_the_live_loop_reads(sim, snapshot):
    live = signals_for(KEY, snapshot, ready=sim.ready, current=sim.desired)
    assert policies.live_signals(sim) == live
