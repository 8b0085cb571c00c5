"""The break-even keep-alive (autoscaling.policy): which idle replica is kept, for how long, and
when none is. Table-driven on the pure functions, then the policy over recurring bursts."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from triton_operator.api import AutoscalingSpec
from triton_operator.autoscaling.history import History
from triton_operator.autoscaling.keepalive import RESTART_PENALTY, keep_alive, layer_gaps, restart_cost
from triton_operator.autoscaling.policy import NEED_SLACK, arrivals_need, decide, target_met
from triton_operator.autoscaling.signals import Signals

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("gaps, restart, idle, hold", [
    ([], 300.0, 0.0, 300.0),                   # no gap seen: held for a restart's cost (ski rental)
    ([120.0], 300.0, 0.0, 120.0),              # a gap shorter than a restart: hold through it
    ([900.0], 300.0, 0.0, 0.0),                # longer: releasing and starting again costs less
    ([60.0, 90.0, 2000.0], 300.0, 0.0, 90.0),  # hold through the short ones, restart after the long one
    # three gaps of 200 and one of 1000: holding 1000 costs 1600, holding 200 costs 600 + 300, releasing 1200
    ([200.0, 200.0, 200.0, 1000.0], 300.0, 0.0, 200.0),
    ([200.0, 200.0, 200.0, 1000.0], 1000.0, 0.0, 1000.0),   # a dearer restart: hold through all
    # idle 250 s already: the gaps of 200 are over, only the one of 1000 says how long this lasts
    # (750 s more, dearer than a restart of 300): release now
    ([200.0, 200.0, 200.0, 1000.0], 300.0, 250.0, 0.0),
    ([200.0, 200.0, 200.0, 1000.0], 1000.0, 250.0, 1000.0),  # ... unless a restart costs more
    ([60.0, 90.0], 300.0, 100.0, 300.0),       # quieter than any gap seen: held for a restart's cost
])
def test_keep_alive_minimizes_holding_plus_restarts_over_the_gaps_still_possible(gaps, restart, idle, hold):
    assert keep_alive(gaps, restart, idle) == hold


def test_a_restart_costs_its_start_up_and_a_start_up_short_priced_by_the_target():
    assert restart_cost(50.0, 0.99) == pytest.approx(50.0 * (1 + RESTART_PENALTY * 99))   # 1040 s
    assert restart_cost(50.0, 0.9) == pytest.approx(50.0 * (1 + RESTART_PENALTY * 9))     # 140 s
    assert restart_cost(50.0, 0.99) > restart_cost(50.0, 0.95) > restart_cost(50.0, 0.9) > 50.0
    assert restart_cost(325.0, 0.99) == pytest.approx(6.5 * restart_cost(50.0, 0.99))


def test_layer_gaps_reads_the_needs_a_tick_at_a_time():
    ticks = [T0 + timedelta(seconds=10 * i) for i in range(40)]
    # replica 3 asked for at ticks 0-5, then 20-22, then not again
    asked = {i: 3 for i in (*range(6), 20, 21, 22)}
    needs = tuple((t, asked.get(i, 1)) for i, t in enumerate(ticks))
    assert layer_gaps(needs, 3, ticks[-1]) == ([150.0], 170.0)   # tick 5 to tick 20; idle since tick 22
    assert layer_gaps(needs, 2, ticks[-1]) == ([150.0], 170.0)
    assert layer_gaps(needs, 1, ticks[-1]) == ([], 0.0)          # asked every tick: needed throughout
    assert layer_gaps(needs, 4, ticks[-1]) == ([], float("inf"))


def test_the_quiet_before_a_layers_first_need_counts_as_a_gap():
    """Replica 3 first asked for 300 s into the memory, then again 100 s later: the service did
    without it for 300 s before, so that is a gap too (at least that long); a replica asked for
    from the memory's first tick has no such gap."""
    ticks = [T0 + timedelta(seconds=10 * i) for i in range(60)]
    asked = {30: 3, 31: 3, 41: 3}
    needs = tuple((t, asked.get(i, 1)) for i, t in enumerate(ticks))
    assert layer_gaps(needs, 3, ticks[-1]) == ([300.0, 100.0], 180.0)
    assert layer_gaps(needs, 1, ticks[-1]) == ([], 0.0)
    late = tuple((t, 3 if i >= 2 else 1) for i, t in enumerate(ticks))   # 20 s in: under MIN_GAP_S
    assert layer_gaps(late, 3, ticks[-1]) == ([], 0.0)


SPEC = AutoscalingSpec(min_replicas=1, max_replicas=10, target_queue_depth=4, target_p99_latency_ms=4000)


def after_bursts(attainment: float | None, gap_s: int = 240) -> tuple[History, datetime, Signals]:
    """A service that needed 4 replicas for a minute every `gap_s` seconds (two bursts behind it,
    the last ended 100 s ago) and 1 in between, now at 4 replicas with a light load; its replicas
    start in 50 s."""
    needs = []
    t = T0
    for burst in range(2):
        for i in range(6):
            needs.append((t, 4))
            t += timedelta(seconds=10)
        for i in range(gap_s // 10 if burst == 0 else 10):
            needs.append((t, 1))
            t += timedelta(seconds=10)
    history = replace(History(((T0, 1, "restart"),)), capacity=20.0, startup=50.0, needs=tuple(needs))
    return history, t, Signals(queue_depth=0.0, p99_ms=500.0, ready=4, arrival_rate=10.0, throughput=10.0,
                               startup_s=50.0, attainment=attainment)


def test_a_replica_a_recurring_burst_needs_is_kept_while_the_target_is_missed():
    """One gap of 250 s seen between two bursts: a restart (its 50 s start-up, and a whole start-up
    run a replica short, priced at 0.99: 50 + 50 x RESTART_PENALTY x 99 = 1040 s) costs more than
    holding through such a gap, so replica 4 is kept, with the reason. Whether the bursts found
    requests waiting does not lower that price: a replica held through the gap met them warm,
    which says nothing about a restart (priced by the queue, the replica was released at once)."""
    history, now, signals = after_bursts(attainment=0.9)
    d = decide(SPEC, 4, signals, history, now)
    assert d.desired == 4
    assert ("replica 4 was needed 110s ago and is kept 250s (break-even over the 1 longer gap seen, a restart "
            f"costing {50 + 50 * RESTART_PENALTY * 99:.0f}s)") in d.reason


def test_a_need_seen_once_is_held_for_what_a_restart_costs():
    """A burst seen for the first time: nothing says whether it recurs, so replica 4 is held for a
    restart's cost (ski rental) and released after it, where the stabilization window allows a
    hold that long."""
    history, now, signals = after_bursts(attainment=0.9)
    first = tuple(n for n in history.needs if n[0] < T0 + timedelta(seconds=60 + 240))   # the first burst and its gap
    history = replace(history, needs=first)
    now = first[-1][0] + timedelta(seconds=10)
    long_window = SPEC.model_copy(update={"scale_down_stabilization_seconds": 1200})
    d = decide(long_window, 4, signals, history, now)
    assert d.desired == 4
    assert ("replica 4 was needed 250s ago and is kept 1040s (no longer gap seen: held for what a restart "
            "costs, a restart costing 1040s)") in d.reason
    later = decide(long_window, 4, signals, history, first[-1][0] + timedelta(seconds=1300))
    assert later.desired == 3 and "is kept" not in later.reason


def test_an_idle_replica_is_held_at_most_the_stabilization_window():
    """The same first burst at the default window (300 s): break-even would hold replica 4 for a
    restart's 1040 s, but the window bounds what is paid for idle capacity; the reason says so, and
    the replica goes once it has been unneeded for longer than the window."""
    history, now, signals = after_bursts(attainment=0.9)
    first = tuple(n for n in history.needs if n[0] < T0 + timedelta(seconds=60 + 240))
    history = replace(history, needs=first)
    last_need = first[5][0]                     # the burst's last tick
    d = decide(SPEC, 4, signals, history, last_need + timedelta(seconds=250))
    assert d.desired == 4
    assert ("replica 4 was needed 250s ago and is kept 300s (no longer gap seen: held for what a restart "
            "costs, a restart costing 1040s, at most scaleDownStabilizationSeconds)") in d.reason
    later = decide(SPEC, 4, signals, history, last_need + timedelta(seconds=310))
    assert later.desired == 3 and "is kept" not in later.reason
    none = decide(SPEC.model_copy(update={"scale_down_stabilization_seconds": 0}), 4, signals, history,
                  last_need + timedelta(seconds=250))
    assert none.desired == 3 and "is kept" not in none.reason


def test_a_replica_first_needed_after_a_long_quiet_is_not_held_for_a_restarts_cost():
    """The same first burst, but the service ran 3000 s on one replica before it: a gap of at
    least 3000 s costs more to hold through than a restart (1040 s), so replica 4 goes once the
    stabilization allows, where a service with no such past holds it (the test above)."""
    history, _, signals = after_bursts(attainment=0.9)
    first = tuple(n for n in history.needs if n[0] < T0 + timedelta(seconds=60 + 240))
    quiet = tuple((T0 - timedelta(seconds=3000 - 10 * i), 1) for i in range(300))
    history = replace(history, needs=quiet + first)
    d = decide(SPEC, 4, signals, history, first[-1][0] + timedelta(seconds=10))
    assert d.desired == 3 and "is kept" not in d.reason
    assert layer_gaps(history.needs, 4, first[-1][0]) == ([3000.0], 240.0)


def test_replicas_asked_only_to_drain_a_backlog_are_not_a_need_that_recurs():
    """A backlog asks for more replicas than the arrivals do; the needs remember the arrivals'."""
    history = replace(History(((T0, 2, "restart"),)), capacity=20.0, startup=50.0)
    now = T0
    for i in range(8):                          # 10 req/s arriving, 400 requests waiting
        now = T0 + timedelta(seconds=10 * i)
        d = decide(SPEC, 2, Signals(queue_depth=400.0, p99_ms=9000.0, ready=2, arrival_rate=10.0, throughput=10.0,
                                    startup_s=50.0, attainment=0.9), history, now)
        history = d.history
    assert d.wants["demand"] > 1                # the backlog asks for more ...
    assert {n for _, n in history.needs} == {1}   # ... the arrivals for one replica


@pytest.mark.parametrize("arrivals, need", [
    (0.2, 1), (1.0, 1), (1.05, 1), (1.0 + NEED_SLACK, 1), (1.11, 2), (1.5, 2), (2.0, 2),
    (2.08, 2), (2.2, 3), (5.1, 5), (5.3, 6),
])
def test_the_arrivals_need_rounds_away_a_tenth_of_a_replica(arrivals, need):
    """What the arrivals ask for (in replicas' worth, band included) counts as a need for one more
    replica only past a tenth of a replica over a whole count: a band a hair over five replicas'
    worth is the tick's noise, and remembered as a need for a sixth it kept one held for a
    restart's cost at a time."""
    assert arrivals_need(arrivals) == need


def test_a_gap_longer_than_a_restart_is_not_held_through():
    history, now, signals = after_bursts(attainment=0.9, gap_s=3000)
    d = decide(SPEC, 4, signals, history, now)
    assert d.desired == 3 and "is kept" not in d.reason


def test_a_service_that_meets_its_target_keeps_no_idle_replica_past_a_start_up():
    """Replicas are kept idle to buy attainment that is missing. At the target a restart costs its
    start-up alone (50 s): the 140 s left of the one gap seen cost more to hold through, so replica
    4 goes; with no measure of the attainment, the scale-down's own hold is all."""
    for attainment in (0.995, None):
        history, now, signals = after_bursts(attainment)
        d = decide(SPEC, 4, signals, history, now)
        assert d.desired == 3 and "is kept" not in d.reason


@pytest.mark.parametrize("share, requests, met", [
    (0.9924, 1575.0, False),    # a quiet window on the real code trace: 12 missed; the bound is 98.8 %
    (0.9924, 60000.0, True),    # the same share over a busy window: 99.18 %
    (0.999, 33000.0, True),     # 99.87 %
    (1.0, 10.0, False),         # ten requests, all met, say little (the bound is 78.7 %)
    (1.0, 1000.0, True),        # a thousand do (99.73 %)
    (0.989, 1e6, False),        # under the target however many requests say so
    (0.9924, None, True),       # no count: the share itself
])
def test_the_target_is_met_when_the_shares_lower_bound_meets_it(share, requests, met):
    assert target_met(share, requests, 0.99) is met


def test_a_quiet_window_that_met_the_target_by_its_share_prices_a_restart_in_full():
    """The service of `after_bursts` at 99.5 % of the last 10 minutes' requests: over 100,000
    requests that is the target met (replica 4 goes after its start-up's worth of holding); over
    400 (two missed) it is within the counting noise of a miss (the bound is 98.5 %), so a restart is
    priced by the target (1040 s) and replica 4 is kept through the gap seen."""
    history, now, signals = after_bursts(0.995)
    busy = decide(SPEC, 4, replace(signals, slo_requests=100_000.0), history, now)
    assert busy.desired == 3 and "is kept" not in busy.reason
    quiet = decide(SPEC, 4, replace(signals, slo_requests=400.0), history, now)
    assert quiet.desired == 4
    assert ("replica 4 was needed 110s ago and is kept 250s (break-even over the 1 longer gap seen, a restart "
            f"costing {50 + 50 * RESTART_PENALTY * 99:.0f}s)") in quiet.reason


def test_at_the_target_a_replica_is_held_for_its_start_up():
    """A service that meets its target, its replicas starting in 325 s: replica 4, first needed
    a minute ago (no gap seen), is held for what releasing and starting it again costs in GPU time
    alone, its start-up (where a missed target prices it at 0.99: 325 + 325 x RESTART_PENALTY x 99
    = 6760 s), and released after it (a window of 600 s allows that hold)."""
    spec = SPEC.model_copy(update={"scale_down_stabilization_seconds": 600})
    needs = tuple((T0 + timedelta(seconds=10 * i), 4 if i < 6 else 1) for i in range(12))
    history = replace(History(((T0, 1, "restart"),)), capacity=20.0, startup=325.0, needs=needs)
    signals = Signals(queue_depth=0.0, p99_ms=500.0, ready=4, arrival_rate=10.0, throughput=10.0,
                      startup_s=325.0, attainment=0.995)
    now = needs[-1][0] + timedelta(seconds=10)
    d = decide(spec, 4, signals, history, now)
    assert d.desired == 4
    assert ("replica 4 was needed 70s ago and is kept 325s (no longer gap seen: held for what a restart costs, "
            "a restart costing 325s)") in d.reason
    missed = decide(spec, 4, replace(signals, attainment=0.9), history, now)
    assert missed.desired == 4 and f"a restart costing {325 + 325 * RESTART_PENALTY * 99:.0f}s" in missed.reason
    later = decide(spec, 4, signals, history, needs[5][0] + timedelta(seconds=330))
    assert later.desired == 3 and "is kept" not in later.reason
