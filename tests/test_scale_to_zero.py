"""Scale to zero and back (minReplicas 0): the policy on tables of ticks, and how the live loop
turns the one query's series into signals. The clock is the test's."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

from triton_operator.api import AutoscalingSpec
from triton_operator.autoscaling.history import seed
from triton_operator.autoscaling.loop import signals_for
from triton_operator.autoscaling.policy import decide
from triton_operator.autoscaling.signals import Signals
from triton_operator.autoscaling.prometheus import SIGNAL_LABEL, Snapshot, parse
from triton_operator.settings import Settings

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
SPEC = AutoscalingSpec(min_replicas=0, max_replicas=4, target_queue_depth=4, scale_down_stabilization_seconds=60,
                       scale_to_zero_after_seconds=120)
KEY = ("ml", "llama")


def run(start: int, ticks: list[tuple[int, Signals]]) -> list[tuple[int, str]]:
    current, history, out = start, seed(T0, start), []
    for seconds, signals in ticks:
        d = decide(SPEC, current, signals, history, T0 + timedelta(seconds=seconds))
        history, current = d.history, d.desired
        out.append((d.desired, d.reason))
    return out


def idle(ready: int) -> Signals:
    return Signals(queue_depth=0, ready=ready, held=0, gateway_in_flight=0, throughput=0)


def test_the_first_held_request_wakes_a_service_at_zero_on_the_next_tick():
    (desired, reason), = run(0, [(10, Signals(queue_depth=0, ready=0, held=1))])
    assert desired == 1 and "1 held at the gateway" in reason and reason.startswith("scale up 0->1")
    (desired, _), = run(0, [(10, Signals(queue_depth=0, ready=0, held=30))])
    assert desired == 4, "30 held / target 4 asks for 8, bounded by maxReplicas"


def test_zero_only_after_the_idle_window_and_at_once_then():
    ticks = [(t, idle(1)) for t in range(0, 130, 10)]
    out = run(1, ticks)
    assert [d for d, _ in out[:-1]] == [1] * 12, "the floor is one replica within the window"
    assert "zero in" in out[5][1]
    assert out[-1][0] == 0 and out[-1][1].startswith("scale to zero 1->0: no requests for 120s")
    # Two idle replicas: down to one within the stabilization window, to zero after the idle one.
    out = run(2, [(t, idle(2)) for t in range(0, 130, 10)])
    assert out[-1][0] == 0


def test_any_use_restarts_the_idle_window():
    """In-flight batching serves a full load with nothing queued: running requests (at the
    gateway) or completed ones (Triton's throughput) keep the service up."""
    busy = [Signals(queue_depth=0, ready=1, gateway_in_flight=2), Signals(queue_depth=0, ready=1, throughput=0.2),
            Signals(queue_depth=0, ready=1, held=1)]
    for signal in busy:
        out = run(1, [(0, idle(1)), (100, signal), (130, idle(1)), (200, idle(1)), (250, idle(1))])
        assert [d for d, _ in out] == [1, 1, 1, 1, 0], signal


def test_metrics_outage_holds_whatever_runs_including_zero():
    broken = Signals(error="Prometheus unreachable: ConnectionError")
    assert run(0, [(10, broken)])[0][0] == 0
    assert run(2, [(10, broken)])[0][0] == 2


def test_a_service_at_zero_stays_there_without_demand():
    assert [d for d, _ in run(0, [(t, idle(0)) for t in (10, 20, 500)])] == [0, 0, 0]


def test_services_with_a_floor_never_reach_zero():
    spec = AutoscalingSpec(min_replicas=1, max_replicas=4, scale_down_stabilization_seconds=0)
    history = seed(T0, 1)
    for t in range(0, 5000, 100):
        d = decide(spec, 1, idle(1), history, T0 + timedelta(seconds=t))
        history = d.history
        assert d.desired == 1


def series(signal: str, value: str) -> dict:
    return {"metric": {SIGNAL_LABEL: signal, "namespace": KEY[0], "inferenceservice": KEY[1]}, "value": [1.0, value]}


def test_loop_reads_held_requests_from_the_one_query():
    snap = parse([series("held", "3")], Settings())
    s = signals_for(KEY, snap, ready=0, current=0)
    assert s.error is None and s.held == 3 and s.queue_depth == 0
    (desired, reason), = run(0, [(10, s)])
    assert desired == 1 and "3 held at the gateway" in reason
    # At zero, no series at all is no demand; with replicas, it is missing metrics.
    empty = parse([], Settings())
    assert signals_for(KEY, empty, ready=0, current=0).error is None
    assert run(0, [(10, signals_for(KEY, empty, ready=0, current=0))])[0][0] == 0
    assert signals_for(KEY, empty, ready=0, current=1).error
    # A failed query is never "no load", at zero either.
    assert signals_for(KEY, Snapshot(error="down"), ready=0, current=0).error == "down"
    full = signals_for(KEY, parse([series("queue", "2"), series("gateway_in_flight", "5"), series("throughput", "1.5"),
                                   series("in_flight", "4")], Settings()), ready=1)
    assert (full.queue_depth, full.gateway_in_flight, full.throughput, full.held, full.in_flight) == (2.0, 5.0, 1.5, None, 4.0)
    assert math.isnan(parse([series("held", "NaN")], Settings()).get("held", KEY))
    assert signals_for(KEY, parse([series("held", "NaN")], Settings()), ready=0, current=0).held is None
