"""The autoscaling policy on tables of metric histories. The clock is the test's."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from triton_operator.api import AutoscalingSpec
from triton_operator.autoscaling.history import BAND_Z, LEARNING_RISES, RATE_WINDOW_S, TREND_Z, History, seed
from triton_operator.autoscaling.policy import DRAIN_S, MIN_HOLD_S, UTILIZATION, Decision, decide
from triton_operator.autoscaling.signals import Signals

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
SPEC = AutoscalingSpec(min_replicas=1, max_replicas=10, target_queue_depth=4, target_p99_latency_ms=800,
                       scale_down_stabilization_seconds=300)


def run(spec: AutoscalingSpec, start: int, ticks: list[tuple[int, Signals]],
        history: History | None = None) -> list[Decision]:
    """Feed (seconds, signals) in order; the Deployment does what each decision says."""
    current, out = start, []
    history = history or seed(T0, start)
    for seconds, signals in ticks:
        d = decide(spec, current, signals, history, T0 + timedelta(seconds=seconds))
        history, current = d.history, d.desired
        out.append(d)
    return out


def q(depth: float, ready: int, p99: float | None = None) -> Signals:
    return Signals(queue_depth=depth, p99_ms=p99, ready=ready)


def test_burst_scales_up_on_the_first_tick():
    (d,) = run(SPEC, 5, [(10, q(40, 5))])
    assert d.desired == 10 and d.reason.startswith("scale up 5->10")
    assert d.wants["queue"] == 10


def test_step_limit_on_the_way_up():
    spec = SPEC.model_copy(update={"max_replicas": 100})
    (d,) = run(spec, 1, [(10, q(400, 1))])
    assert d.desired == 5 and "step limited" in d.reason  # max(2x, +4)


def test_starting_pods_count_as_capacity_so_a_burst_does_not_compound():
    """Tick 1 asks for 6; while 4 of them load, the same queue asks for nothing more."""
    ds = run(SPEC, 2, [(10, q(24, 2)), (20, q(24, 2)), (30, q(26, 2)), (40, q(24, 6))])
    assert [d.desired for d in ds] == [6, 6, 6, 6]


def test_p99_above_target_with_a_short_queue_scales_up():
    """Once requests have waited on two ticks in a row."""
    first, second = run(SPEC, 2, [(10, q(1, 2, p99=1600)), (20, q(1, 2, p99=1600))])
    assert first.desired == 2 and "requests waited this tick only: p99 not chased yet" in first.reason
    assert second.desired == 4 and "p99 asks for 4" in second.reason


def test_a_one_tick_queue_from_a_single_client_does_not_chase_p99():
    """One client, one request at a time, 300 ms each against a 100 ms target: a scrape now and
    then catches its next request waiting (CI saw 1 -> 4 replicas from one such sample)."""
    spec = SPEC.model_copy(update={"target_p99_latency_ms": 100, "target_queue_depth": 1000})
    ds = run(spec, 1, [(10 * i, q(1 if i == 3 else 0, 1, p99=300)) for i in range(1, 10)])
    assert [d.desired for d in ds] == [1] * 9 and all("p99" not in d.wants for d in ds)


def test_p99_does_not_double_count_replicas_that_are_loading():
    """The naive current x ratio would ask for 4 x 2 = 8 on the third tick."""
    ds = run(SPEC, 2, [(10, q(1, 2, p99=1600)), (20, q(1, 2, p99=1600)), (30, q(1, 2, p99=1600))])
    assert [d.desired for d in ds] == [2, 4, 4]


def test_noise_inside_the_tolerance_band_changes_nothing():
    ticks = [(10 * i, q(depth, 4, p99=p)) for i, (depth, p) in
             enumerate([(16, 800), (17, 780), (15.2, 840), (16.5, 810), (15, 760)], start=1)]
    assert {d.desired for d in run(SPEC, 4, ticks)} == {4}


def test_scale_down_waits_for_the_window_then_steps():
    idle = [(s, q(0, 6)) for s in range(10, 400, 10)]
    ds = run(SPEC, 6, idle)
    first_down = next(i for i, d in enumerate(ds) if d.desired < 6)
    assert idle[first_down][0] >= 300  # nothing before the 5-minute window has passed
    assert all(ds[i].desired >= ds[i + 1].desired >= ds[i].desired - 1 for i in range(len(ds) - 1))
    assert ds[-1].desired < 6 and "highest recommendation within the last 300s" in ds[first_down].reason


def test_a_short_lull_does_not_scale_down():
    ticks = [(10, q(24, 6))] + [(s, q(0, 6)) for s in range(20, 200, 10)] + [(200, q(24, 6))]
    assert {d.desired for d in run(SPEC, 6, ticks)} == {6}


@pytest.mark.parametrize("signals, words", [
    (Signals(ready=3, error="Prometheus unreachable: ConnectionError"), "metrics unavailable"),
    (Signals(queue_depth=float("nan"), ready=3), "no queue-depth data"),
    (Signals(queue_depth=None, ready=3), "no queue-depth data"),
])
def test_missing_metrics_hold_replicas_never_scale_down(signals, words):
    ds = run(SPEC, 3, [(s, signals) for s in range(10, 1000, 10)])
    assert {d.desired for d in ds} == {3}
    assert not any(d.metrics_available for d in ds) and words in ds[0].reason


def test_missing_metrics_still_respect_the_bounds():
    (d,) = run(SPEC.model_copy(update={"min_replicas": 4}), 2, [(10, Signals(ready=2, error="down"))])
    assert d.desired == 4 and "moved into [4, 10]" in d.reason


def test_p99_nan_without_traffic_leaves_the_queue_in_charge():
    (d,) = run(SPEC, 2, [(10, q(0, 2, p99=float("nan")))])
    assert d.metrics_available and "p99" not in d.wants


def test_recovery_after_an_outage_resumes_scaling():
    ticks = [(10, Signals(ready=2, error="down")), (20, Signals(ready=2, error="down")), (30, q(40, 2))]
    assert [d.desired for d in run(SPEC, 2, ticks)] == [2, 2, 6]


def test_figures_after_an_outage_longer_than_the_window_do_not_scale_down_at_once():
    """Prometheus is down for ten minutes while 8 replicas serve, then back from its restart: the
    queue gauge is there on the first scrape (0: in-flight batching leaves nothing waiting), the
    rate is not yet. The held replicas count as recommended, so the empty queue scales down only
    after a whole window of it, as after an operator restart; the window had emptied during the
    outage, and the first tick after it took a replica away, then one more every tick."""
    down = [(s, Signals(ready=8, error="Prometheus unreachable: ConnectionError")) for s in range(10, 610, 10)]
    back = [(s, q(0, 8)) for s in range(610, 1000, 10)]
    ds = run(SPEC, 8, down + back)[len(down):]
    first_down = next(i for i, d in enumerate(ds) if d.desired < 8)
    assert back[first_down][0] >= 600 + SPEC.scale_down_stabilization_seconds
    assert "recommended within the last 300s" in ds[0].reason


def test_restart_seeds_history_so_nothing_drops_at_once():
    """A new operator process has no history; seeding with the current count holds a window."""
    history = seed(T0, 8)
    d = decide(SPEC, 8, q(0, 8), history, T0 + timedelta(seconds=10))
    assert d.desired == 8 and "recommended within the last 300s" in d.reason


def test_clamped_to_max():
    (d,) = run(SPEC.model_copy(update={"max_replicas": 3}), 2, [(10, q(400, 2))])
    assert d.desired == 3


def test_history_keeps_only_the_window():
    h = History()
    for s in (0, 100, 200, 400):
        h = h.add(T0 + timedelta(seconds=s), s, timedelta(seconds=300))
    assert [r for _, r, _ in h.recommendations] == [200, 400]


# -- the demand rule, the learned capacity and targets out of reach --------------------------

def rates(depth: float, ready: int, arrival: float, throughput: float, p99: float | None = None,
          startup: float | None = None) -> Signals:
    return Signals(queue_depth=depth, p99_ms=p99, ready=ready, arrival_rate=arrival,
                   throughput=throughput, startup_s=startup)


def test_capacity_is_learned_only_after_a_saturated_minute():
    ticks = [(s, rates(40, 4, 100, 80)) for s in range(10, 80, 10)]
    ds = run(SPEC.model_copy(update={"max_replicas": 40}), 4, ticks)
    assert ds[4].history.capacity is None            # saturated since 10 s: not yet a full minute
    assert ds[-1].history.capacity == pytest.approx(20.0)   # 80 req/s over 4 full replicas
    assert "demand" in ds[-1].wants and "queue" not in ds[-1].wants


def measured(capacity: float, current: int) -> History:
    """A history that has learned `capacity` req/s per replica (no plan to scale), over more
    than a minute (its rates are trended and judged from the first tick here on)."""
    return replace(seed(T0, current), capacity=capacity, since=T0 - timedelta(seconds=60))


def test_demand_sizes_for_the_arrival_rate_and_drains_the_queue():
    """Capacity 20 req/s/replica at 95 % utilization: 100 req/s need 5.26 replicas, plus a
    queue of 120 drained within 60 s (0.1 replica) -> 6."""
    d = decide(SPEC, 4, rates(120, 4, 100, 80), measured(20.0, 4), T0 + timedelta(seconds=10))
    assert UTILIZATION == 0.95 and DRAIN_S == 60
    assert d.wants["demand"] == 6 and d.desired == 6
    assert "demand 100 req/s" in d.reason and "capacity 20 req/s/replica (measured) at 95%" in d.reason
    assert "backlog 120 drained within 60s" in d.reason


def test_demand_does_not_scale_a_backlog_like_a_steady_load():
    """The queue rule would ask for 400 / 4 = 100 replicas; the demand rule asks for what the
    arrivals need plus what drains the backlog within a minute."""
    d = decide(SPEC.model_copy(update={"max_replicas": 200}), 4, rates(400, 4, 60, 80), measured(20.0, 4),
               T0 + timedelta(seconds=10))
    assert d.wants["demand"] == math.ceil(60 / 19 + 400 / 1200)


def test_demand_sees_load_an_empty_queue_hides():
    """In-flight batching: every slot busy, nothing queued; the queue rule would scale to min."""
    history, current, out = measured(20.0, 8), 8, []
    for s in range(10, 400, 10):
        d = decide(SPEC, current, rates(0, 8, 170, 170), history, T0 + timedelta(seconds=s))
        history, current = d.history, d.desired
        out.append(d)
    # 170 req/s plus the upper band (a minute's counting noise: 1.65 x sqrt(170 / 60)) / 19 -> 9.09
    # -> 10 (more than the 10 % tolerance over 8)
    assert {d.desired for d in out} == {math.ceil((170 + BAND_Z * math.sqrt(170 / 60)) / 19)} == {10}


def carried(slope: float, level: float, span: float) -> float:
    """The slope a noiseless ramp is carried at: less TREND_Z standard errors of a slope fitted on
    minute rates (one independent per RATE_WINDOW_S) with the counting noise of `level`."""
    return slope - TREND_Z * math.sqrt(12 * RATE_WINDOW_S * level / RATE_WINDOW_S) / span ** 1.5


def test_a_rising_rate_asks_for_capacity_one_start_up_ahead():
    """A trend over at least half the trend window (60 s) is extrapolated over the start-up; a
    shorter trail is not trusted with one (it is noise at a restart), and a trend is carried
    ahead at most as far as the trail it is fitted on spans."""
    history, current = measured(20.0, 5), 5
    ds = []
    for i, rate in enumerate(range(60, 121, 6)):    # +0.6 req/s per s
        d = decide(SPEC.model_copy(update={"max_replicas": 40}), current,
                   rates(0, current, rate, rate, startup=100), history, T0 + timedelta(seconds=10 * (i + 1)))
        history, current = d.history, d.desired
        ds.append(d)
    assert "rising" not in ds[5].reason                         # a 50 s trail
    d = ds[6]                                                   # a 60 s trail: carried 60 s, not 100
    assert carried(0.6, 96, 60) * 60 == pytest.approx(33.8, abs=0.05)
    assert d.wants["demand"] == math.ceil((96 + carried(0.6, 96, 60) * 60 + BAND_Z * math.sqrt(96 / 60)) / 19)
    assert "(+33.8 rising over 100s start-up, the trend of 60s carried no further)" in d.reason
    d = ds[10]                                                  # a 100 s trail: the whole start-up
    assert carried(0.6, 120, 100) * 100 == pytest.approx(58.1, abs=0.05)
    assert d.wants["demand"] == math.ceil((120 + carried(0.6, 120, 100) * 100 + BAND_Z * math.sqrt(120 / 60)) / 19)
    assert "(+58.1 rising over 100s start-up)" in d.reason


def test_the_trend_is_fitted_over_a_start_up_when_that_is_longer_than_the_trend_window():
    """Pods that take 240 s: a steady ramp (+0.1 req/s per s) is fitted over the last 240 s, not
    TREND_WINDOW_S (120 s), and so is carried over the whole start-up (a slow ramp from a quiet
    service, carried 120 s of 325, left one replica saturated until the second was up)."""
    from triton_operator.autoscaling.history import TREND_WINDOW_S
    spec = SPEC.model_copy(update={"max_replicas": 40})
    history, current = measured(20.0, 3), 3
    for s in range(10, 310, 10):
        rate = 30.0 + 0.1 * s
        d = decide(spec, current, rates(0, current, rate, rate, startup=240.0), history, T0 + timedelta(seconds=s))
        history, current = d.history, d.desired
    assert TREND_WINDOW_S == 120
    assert history.rates[-1][2] - history.rates[0][2] == pytest.approx(240)
    assert history.forecast()[0] == pytest.approx(0.1)
    assert carried(0.1, 60, 240) * 240 == pytest.approx(23.1, abs=0.05)
    assert "(+23.1 rising over 240s start-up)" in d.reason
    assert d.wants["demand"] == math.ceil((60 + carried(0.1, 60, 240) * 240 + BAND_Z * math.sqrt(60 / 60)) / 19)


def test_a_new_services_first_minute_is_neither_trended_nor_judged():
    """Every series of a new service is younger than the rate window for its first minute, so
    its rate reads low and climbs as they age (5 -> 45 req/s at a steady 45). Trended, that
    climb asked for +35 req/s over a long start-up; judged as a forecast, the first one stood as
    a 40 req/s rise in the upper band for half an hour. Only what comes after the first minute
    counts: no trend, no rise, the band is the counting noise alone."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    history, current = replace(seed(T0, 3), capacity=20.0), 3
    climb = [5.0, 10.0, 20.0, 30.0, 40.0, 45.0]                    # t = 10 .. 60 s
    ds = []
    for s, rate in zip(range(10, 400, 10), climb + [45.0] * 40):
        d = decide(spec, current, rates(0, current, rate, rate, startup=100), history, T0 + timedelta(seconds=s))
        history, current = d.history, d.desired
        ds.append(d)
    assert history.since == T0 + timedelta(seconds=10)
    assert all("rising" not in d.reason for d in ds)
    assert history.forecast() == (0.0, 0.0) and history.rise() == 0.0
    assert history.rises and len(history.minutes) >= 5                # later minutes were judged
    assert ds[-1].wants["demand"] == math.ceil((45 + BAND_Z * math.sqrt(45 / 60)) / 19) == 3
    # the same climb after the first minute is a real one: trended and, a start-up later, a rise
    later, current = replace(seed(T0, 3), capacity=20.0, since=T0 - timedelta(seconds=60)), 3
    for s, rate in zip(range(10, 400, 10), climb + [45.0] * 40):
        d = decide(spec, current, rates(0, current, rate, rate, startup=100), later, T0 + timedelta(seconds=s))
        later, current = d.history, d.desired
    assert later.rise() >= 35


def test_a_growing_queue_is_drained_as_it_will_be_when_new_pods_are_up():
    """A step: the queue grows by 100 req/s, on two ticks in a row. Sized for the queue alone
    (2,000 / 1,200 s) the rule would add 2 replicas; by the time new pods are up (60 s) it holds
    8,000. The arrivals are what the last tick took on (80 completed + 100 queued per second),
    not the last minute's 80. After one tick's growth, the backlog is the queue alone."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    ds = run(spec, 4, [(10, rates(0, 4, 80, 80, startup=60)), (20, rates(1000, 4, 80, 80, startup=60)),
                       (30, rates(2000, 4, 80, 80, startup=60))], measured(20.0, 4))
    upper = 180 + BAND_Z * math.sqrt(180 / 60)
    assert "growing" not in ds[1].reason and "backlog 1000 drained within 60s" in ds[1].reason
    assert ds[2].wants["demand"] == math.ceil(upper / 19 + (2000 + 100 * 60) / 1200)
    assert "demand 180 req/s" in ds[2].reason
    assert "queue growing 100/s until pods start" in ds[2].reason


def test_a_backlog_is_drained_within_a_start_up_when_that_is_longer_than_a_minute():
    """Pods that take 300 s: a replica asked for the backlog serves only 300 s later, so the
    backlog (1,000 now, growing 10/s for a start-up: 4,000) is sized to drain within 300 s, not
    within DRAIN_S (which asked for 4,000 / 1,200 = 4 replicas that spend five minutes loading
    for one minute of draining)."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    ds = run(spec, 4, [(10, rates(800, 4, 80, 80, startup=300)), (20, rates(900, 4, 80, 80, startup=300)),
                       (30, rates(1000, 4, 80, 80, startup=300))], measured(20.0, 4))
    upper = 90 + BAND_Z * math.sqrt(90 / 60)
    assert ds[2].wants["demand"] == math.ceil(upper / 19 + (1000 + 10 * 300) / (20 * 300)) == 6
    assert "backlog 4000 (queue growing 10/s until pods start) drained within 300s" in ds[2].reason


def test_one_ticks_growth_of_the_queue_is_not_carried_over_a_start_up():
    """325 s start-ups, 4 replicas of 25 req/s (23.75 usable) and a steady 94 req/s: with the band,
    4.05 replicas, which the tolerance holds while nothing waits. Half a request queued (a mean
    over the pods) on one tick, none before or after: carried over the start-up, that growth
    was a backlog of 17, a queue, and a fifth replica (taken back five minutes later, over and
    over on the step at 325 s). The queue has to grow on two ticks in a row to count as growing."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    history = replace(measured(25.0, 4), startup=325.0)
    ds = run(spec, 4, [(s, rates(0.5 if s == 30 else 0, 4, 94, 94, startup=325)) for s in range(10, 60, 10)],
             history)
    assert 4 < (94 + BAND_Z * math.sqrt(94 / 60)) / 23.75 < 4.1
    assert all("growing" not in d.reason for d in ds)
    assert [d.desired for d in ds] == [4] * 5



def test_batches_filling_with_nothing_queued_are_not_read_as_a_step():
    """After a scale-down the remaining replicas' batches fill (their share of the load grew):
    in flight 200 -> 300 within a tick while nothing waits. Arrivals did not jump: the last tick's
    growth over the minute's completions read 90 + 100 / 10 = 100 req/s and asked the replica
    back. Read as a step only while requests wait; otherwise the minute's rate (no arrival rate
    is given: the policy derives it from completions and what the service holds)."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    history = replace(measured(20.0, 5), startup=50.0)
    ds = run(spec, 5, [(s, Signals(queue_depth=0, ready=5, throughput=90, in_flight=200)) for s in range(10, 80, 10)]
             + [(80, Signals(queue_depth=0, ready=5, throughput=90, in_flight=300))], history)
    assert "demand 91.7 req/s" in ds[-1].reason      # 90 + 100 over the minute, not 100 over the tick
    ds = run(spec, 5, [(s, Signals(queue_depth=0, ready=5, throughput=90, in_flight=200)) for s in range(10, 80, 10)]
             + [(80, Signals(queue_depth=50, ready=5, throughput=90, in_flight=300))], history)
    assert "demand 105 req/s" in ds[-1].reason       # requests wait: (50 + 100) / 10 over the completions


def test_a_step_the_minute_rate_has_caught_up_with_is_not_carried_as_a_trend():
    """A step from 30 to 90 req/s on 2 replicas completing 50 req/s: the queue grows 40/s. The
    minute's rate climbs to 90 over one window, a slope of 1 req/s per s that, carried over a
    150 s start-up, asked for 150 req/s more. While requests wait the last tick shows the rate
    now; once the minute's rate has caught up with it, there is no rise left to carry. Before
    that, the slope is at most what the tick is ahead of the minute (half a window's lag)."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    history, current, queue, ds = replace(measured(25.0, 2), startup=150.0), 2, 0.0, []
    minute = [30.0] * 12 + [40.0, 50.0, 60.0, 70.0, 80.0, 90.0] + [90.0] * 3
    for i, rate in enumerate(minute):
        queue += 40.0 * 10 if i >= 12 else 0.0
        d = decide(spec, current, Signals(queue_depth=queue, ready=2, arrival_rate=rate, throughput=50.0,
                                          startup_s=150.0), history, T0 + timedelta(seconds=10 * (i + 1)))
        history, current = d.history, d.desired
        ds.append(d)
    assert "rising" not in ds[-1].reason and "demand 90 req/s" in ds[-1].reason
    slope, _ = ds[-1].history.forecast()
    assert slope > 0.3    # the minute's climb is still in the trail: it would have added 45+ req/s
    # mid-climb (minute at 60, the tick at 90): the slope is at most (90 - 60) / 30 s
    assert "(+" in ds[14].reason and "rising over 150s start-up" in ds[14].reason


def test_a_step_caught_up_with_nothing_queued_is_carried_no_further_than_the_last_window_rose():
    """A switch from 6 to 16 req/s with nothing queued (long prompts: requests wait inside
    batches stalled by prefill, so no tick shows the rate now). The minute's rate climbs to 16
    over one window and stays; the trail's fit, half climb and half level, kept rising and asked
    for 9 replicas where 5 served, at every switch (long-context RAG, 150 s start-up). Once the
    window has caught up the rate rose by nothing over it: the slope is capped at that rise plus
    its counting noise. A steady ramp is not capped (it rises over the window as over the trail)."""
    spec = SPEC.model_copy(update={"max_replicas": 40})

    def last(minute: list[float]) -> Decision:
        history, current = replace(measured(3.6, 2), startup=150.0), 2
        for i, rate in enumerate(minute):
            d = decide(spec, current, Signals(queue_depth=0, ready=current, arrival_rate=rate, throughput=rate,
                                              startup_s=150.0), history, T0 + timedelta(seconds=10 * (i + 1)))
            history, current = d.history, d.desired
        return d

    climb = [6.0 + 10.0 * k / 6 for k in range(1, 7)]
    d = last([6.0] * 12 + climb + [16.0] * 8)
    slope, _ = d.history.forecast()
    assert slope * 150 > 8                      # the fit alone would carry the climb on
    noise = math.sqrt(2 * 16 * RATE_WINDOW_S) / RATE_WINDOW_S
    assert d.history.still_rising(slope) == pytest.approx(BAND_Z * noise / RATE_WINDOW_S)
    assert d.wants["demand"] <= math.ceil((16 + BAND_Z * noise / RATE_WINDOW_S * 150 + BAND_Z * math.sqrt(16 / 60))
                                          / (3.6 * UTILIZATION)) == 6
    ramp = last([6.0 + 0.05 * 10 * i for i in range(26)])
    slope, _ = ramp.history.forecast()
    assert slope == pytest.approx(0.05) and ramp.history.still_rising(slope) == slope


def shown_band(x: float) -> str:
    return f"upper band +{x:.1f}".rstrip("0").rstrip(".") + " "


def test_a_tick_ahead_of_the_minute_by_its_counting_noise_carries_no_trend():
    """The same step, caught up: the minute reads 90 and the last tick 93 (the queue grew 43/s
    on 50 completed). At 93 req/s a 10 s tick's count is +-3 req/s: a lead of 3 is noise, and the
    minute's climb in the trail is not carried (carried over 150 s it asked for more replicas
    than the step needs; at 325 s a ninth, up after the backlog it was for had drained)."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    history, current, queue = replace(measured(25.0, 2), startup=150.0), 2, 0.0
    minute = [30.0] * 12 + [40.0, 50.0, 60.0, 70.0, 80.0, 90.0] + [90.0] * 3
    for i, rate in enumerate(minute):
        queue += (43.0 if i == len(minute) - 1 else 40.0) * 10 if i >= 12 else 0.0
        d = decide(spec, current, Signals(queue_depth=queue, ready=2, arrival_rate=rate, throughput=50.0,
                                          startup_s=150.0), history, T0 + timedelta(seconds=10 * (i + 1)))
        history, current = d.history, d.desired
    assert "demand 93 req/s" in d.reason and history.forecast()[0] > 0.3
    assert 93 - 90 < BAND_Z * math.sqrt(93 / 10)
    assert "rising" not in d.reason


def test_the_learned_band_does_not_lift_the_forecast_over_the_highest_rate_seen():
    """A step from 30 to 90 req/s teaches the band a rise of about 60 (the forecast a start-up
    before it said 30). At 90, the highest rate seen within the band's memory, another jump of
    that size was never seen: the band is the noise's only (on the step at 150 s a one-off step
    kept two replicas too many for 30 minutes). Back at 30 after the burst came a second time,
    it is the learned rise again: bursts that come and go are what the band is for."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    history, current = measured(25.0, 2), 2
    trace = [30.0] * 40 + [90.0] * 40 + [30.0] * 40 + [90.0] * 20 + [30.0] * 20
    for s, rate in zip(range(10, 10 * len(trace) + 10, 10), trace):
        d = decide(spec, current, rates(0, current, rate, rate), history, T0 + timedelta(seconds=s))
        history, current = d.history, d.desired
        if s == 790:
            at_the_top = d
    assert at_the_top.history.rise() > 40
    assert shown_band(BAND_Z * math.sqrt(90 / 60)) in at_the_top.reason
    assert d.history.rise() > 40 and shown_band(d.history.rise()) in d.reason


def test_a_burst_seen_once_is_not_hedged_once_it_has_passed():
    """30 req/s, one burst at 90 for 400 s, 30 again. The band learned a rise of about 60, but
    the only rates near 90 within its memory came in that one burst: past it (and a start-up
    after it), the band is the noise's, and 2 replicas serve 30 req/s. Hedged with the learned
    rise, a one-off spike at 325 s start-up held 6 replicas where 2 served for half an hour."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    history, current = measured(25.0, 2), 2
    trace = [30.0] * 40 + [90.0] * 40 + [30.0] * 40
    for s, rate in zip(range(10, 10 * len(trace) + 10, 10), trace):
        d = decide(spec, current, rates(0, current, rate, rate), history, T0 + timedelta(seconds=s))
        history, current = d.history, d.desired
    assert d.history.rise() > 40
    assert shown_band(BAND_Z * math.sqrt(30 / 60)) in d.reason
    assert d.wants["demand"] == 2 and d.history.recurring_peak(30.0, 60.0) == 30.0
    # the log's minutes are a minute apart: with a 20 s start-up they are still one burst
    assert d.history.recurring_peak(30.0, 20.0) == 30.0


def test_noise_within_the_tolerance_does_not_add_a_replica():
    """At 4 replicas of 20 req/s (19 usable), a steady 75 req/s asks for (75 + 1.65 x sqrt(75 / 60))
    / 19 = 4.04 replicas: held. Without a backlog or a trend beyond the band, needing up to 10 %
    more than runs is noise (a replica added for it was taken back a minute later, over and over);
    so is a request or two waiting at 4 replicas (each batch takes one in at its next step); with
    more requests waiting than replicas run it is not."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    need = (75 + BAND_Z * math.sqrt(75 / 60)) / 19
    assert 4 < need <= 4 * 1.1
    ds = run(spec, 4, [(s, rates(0, 4, 75, 75)) for s in range(10, 200, 10)], measured(20.0, 4))
    assert {d.desired for d in ds} == {4} and ds[-1].wants["demand"] == 4
    d = decide(spec, 4, rates(2, 4, 75, 75), ds[-1].history, T0 + timedelta(seconds=200))
    assert d.desired == 4 and "backlog 2 drained" in d.reason
    d = decide(spec, 4, rates(30, 4, 75, 75), ds[-1].history, T0 + timedelta(seconds=200))
    assert d.desired == 5


def test_a_slope_within_its_counting_noise_does_not_add_a_replica():
    """4 replicas of 20 req/s (19 usable) and 150 s start-ups; the rate drifts 70 -> 72.5 req/s
    over 150 s (+1 req/s a minute). Fitted on minute rates, that slope's standard error is about
    1 req/s a minute: noise. Carried whole over the start-up it added 2.5 req/s, more than the
    band, and asked for a fifth replica (the step at 150 s flapped 4 <-> 5); only the part beyond
    TREND_Z standard errors is carried, and 4 replicas hold."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    ticks = [(s, rates(0, 4, 70 + s / 60, 70 + s / 60, startup=150.0)) for s in range(0, 160, 10)]
    ds = run(spec, 4, ticks, measured(20.0, 4))
    last = ds[-1]
    slope, scatter = last.history.forecast()
    assert slope == pytest.approx(1 / 60) and scatter == pytest.approx(0, abs=1e-6)
    band = BAND_Z * math.sqrt(72.5 / 60)
    assert (72.5 + slope * 150 + band) / 19 > 4 and slope * 150 > band      # the whole slope asks for 5
    assert carried(slope, 72.5, 150) * 150 == pytest.approx(1.3, abs=0.05)
    assert {d.desired for d in ds} == {4} and last.wants["demand"] == 4
    assert "(+1.3 rising over 150s start-up)" in last.reason


# -- where a replica's capacity comes from ---------------------------------------------------------

def planned(depth: float, ready: int, throughput: float, in_flight: float, hint: float = 20.0,
            solo: float = 1.0, slots: float = 64) -> Signals:
    """What the live loop feeds for a TensorRT-LLM service: no arrival rate (the policy derives
    it), requests inside the batches, and the planner's figures for the token mix."""
    return Signals(queue_depth=depth, ready=ready, throughput=throughput, in_flight=in_flight,
                   capacity_hint=hint, solo_latency_s=solo, batch_slots=slots)


def test_the_plan_sizes_demand_before_anything_is_measured():
    """A first tick after a restart: no trail, so the arrivals are the completions; the planned
    capacity sizes them at once instead of the queue rule asking for 400 / 4 replicas."""
    (d,) = run(SPEC.model_copy(update={"max_replicas": 200}), 4, [(10, planned(400, 4, 76, 256))])
    assert d.wants["demand"] == math.ceil(76 / 19 + 400 / 1200) and "queue" not in d.wants
    assert "capacity 20 req/s/replica (planned)" in d.reason


def test_arrivals_are_completions_plus_what_the_service_took_on():
    """Without an arrival-rate signal: 80 req/s completed while the held requests (queued + in
    batches) grew from 100 to 700 within the minute -> 90 req/s arrived."""
    ticks = [(10, planned(0, 4, 80, 100))] + [(s, planned(0, 4, 80, 100 + 10 * (s - 10))) for s in range(20, 80, 10)]
    ds = run(SPEC.model_copy(update={"max_replicas": 40}), 4, ticks)
    assert ds[-1].history.rates[-1][1] == pytest.approx(80 + 600 / 60)


def test_an_engine_faster_than_planned_is_learned_without_saturating_it():
    """Plan: 1 s alone in the batch, 64 slots, 20 req/s when full (3.2 s each). Observed: 20
    req/s per replica with 20 requests per batch, i.e. 1 s each (Little's law), where the plan
    says 1.69 s: the engine is faster; the capacity estimate rises without any saturation."""
    ticks = [(s, planned(0, 4, 80, 80)) for s in range(10, 610, 10)]
    ds = run(SPEC.model_copy(update={"max_replicas": 40}), 4, ticks)
    assert ds[4].history.efficiency is None           # the replicas have not run a full minute yet
    efficiency = ds[-1].history.efficiency
    assert efficiency is not None and 1.2 < efficiency <= (1 + 0.6875)
    assert "as measured" in ds[-1].reason


def test_a_saturated_minute_measures_the_capacity_against_the_plan():
    """Requests wait for a whole minute: 4 replicas completing 60 req/s do 15 each, not the
    planned 20."""
    ticks = [(s, planned(40, 4, 60, 256)) for s in range(10, 200, 10)]
    ds = run(SPEC.model_copy(update={"max_replicas": 40}), 4, ticks)
    assert ds[-1].history.efficiency == pytest.approx(0.75, abs=0.03)
    assert "capacity 15 req/s/replica (planned x0.75 as measured)" in ds[-1].reason


def test_what_saturated_minutes_measured_bounds_what_half_full_batches_extrapolate():
    """Half-full batches that run fast extrapolate, along the plan's line, to a full-batch rate
    the engine does not reach: here they read 1.3x the plan, while a minute spent saturated
    measured 15 req/s a replica, 0.75x (a decode step that grows with the batch; on the curved
    replica the extrapolation read x0.69-0.94 where saturated minutes measured x0.61-0.65, and
    the service ran a replica short at every rise). The saturated figure stands after the load
    falls back, however fast the half-full batches look again."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    ticks = ([(s, planned(0, 4, 80, 80)) for s in range(10, 610, 10)]
             + [(s, planned(40, 4, 60, 256)) for s in range(610, 710, 10)]
             + [(s, planned(0, 4, 80, 80)) for s in range(710, 1310, 10)])
    ds = run(spec, 4, ticks)
    assert ds[59].history.efficiency > 1.2                       # before the saturated minute
    assert "capacity 15 req/s/replica (planned x0.75 as measured full)" in ds[-1].reason
    last = ds[-1].history
    assert last.efficiency > 1.2 and last.full_efficiency == pytest.approx(0.75)
    assert last.capacity_for(ticks[-1][1]) == (pytest.approx(15.0), "planned x0.75 as measured full")


def test_no_capacity_sample_while_the_ready_replicas_changed_within_the_minute():
    """A pod ready for 20 s has not completed a full minute: throughput / ready understates it."""
    ticks = [(s, planned(40, 4, 60, 256)) for s in range(10, 60, 10)] + [
        (s, planned(40, 6, 60, 384)) for s in range(60, 110, 10)]
    ds = run(SPEC.model_copy(update={"max_replicas": 40}), 6, ticks)
    assert all(d.history.efficiency is None for d in ds)


# -- scale-down hold ------------------------------------------------------------------------------

def test_a_measured_drop_scales_down_after_the_short_hold():
    """Every recommendation for a start-up time came from demand: the hold is the start-up time
    (at least MIN_HOLD_S; 60 s assumed here), not the 300 s window: demand forecasts one start-up
    ahead, so what it no longer asks for is not needed before a new pod could be up."""
    history, current, out = measured(20.0, 10), 10, []
    for s in range(10, 400, 10):
        d = decide(SPEC, current, rates(0, current, 60, 60), history, T0 + timedelta(seconds=s))
        history, current = d.history, d.desired
        out.append((s, d))
    first = next(s for s, d in out if d.desired < 10)
    assert MIN_HOLD_S <= first < 300 and current == math.ceil((60 + BAND_Z * math.sqrt(60 / 60)) / 19)
    assert f"within the last {int(MIN_HOLD_S)}s" in next(d.reason for s, d in out if s == first)


def test_queue_recommendations_keep_the_full_window():
    """Nothing sizes demand (no capacity known): the 300 s window holds as configured."""
    ds = run(SPEC, 6, [(s, q(0, 6)) for s in range(10, 300, 10)])
    assert {d.desired for d in ds} == {6}


# -- p99 ---------------------------------------------------------------------------------------------

def test_p99_over_target_without_a_queue_is_reported_not_chased():
    ds = run(SPEC, 2, [(s, q(0, 2, p99=5000)) for s in range(10, 100, 10)])
    assert {d.desired for d in ds} == {2}
    assert ds[0].unattainable and "service time" in ds[0].reason and "p99" not in ds[0].wants


def test_p99_left_over_from_a_drained_queue_is_neither_chased_nor_out_of_reach():
    """Triton's summary still holds the requests that waited a minute ago."""
    ds = run(SPEC, 4, [(10, q(40, 4, p99=700)), (20, q(0, 4, p99=3000)), (90, q(0, 4, p99=3000))])
    for d in ds[1:]:
        assert d.unattainable is None and "from a queue that has drained" in d.reason
        assert "p99" not in d.wants


def test_p99_over_target_with_full_batches_is_not_service_time():
    """More replicas would thin the batches; the planned demand sizes them, p99 is not out of reach."""
    d = decide(SPEC, 4, replace(planned(0, 4, 76, 200), p99_ms=5000),
               seed(T0, 4), T0 + timedelta(seconds=10))
    assert d.unattainable is None and "with full batches" in d.reason


def test_p99_over_target_with_about_one_request_a_replica_and_no_queue_is_out_of_reach():
    d = decide(SPEC, 4, replace(planned(0, 4, 20, 4), p99_ms=5000), seed(T0, 4), T0 + timedelta(seconds=10))
    assert d.unattainable and "service time" in d.reason and d.desired == 4


def test_p99_over_target_with_shared_batches_is_never_called_out_of_reach():
    """Five requests a replica share its batches: others' prefills stretch each of them, and
    spreading the load would cut latency. The rule used to call that service time (batches under
    half full) and refuse the scale-up that helps."""
    d = decide(SPEC, 4, replace(planned(0, 4, 20, 30), p99_ms=5000), seed(T0, 4), T0 + timedelta(seconds=10))
    assert d.unattainable is None and "with the batches shared" in d.reason


def test_new_fields_default_so_the_live_loop_keeps_working():
    d = decide(SPEC, 3, Signals(queue_depth=12, p99_ms=None, ready=3), seed(T0, 3), T0)
    assert d.history.capacity is None and d.unattainable is None and "queue" in d.wants


def test_figures_from_fewer_pods_than_ready_never_scale_down_but_still_scale_up():
    """One pod's scrape failed: its queue is missing, not zero (aibrix#1032: nor may it block a
    scale-up)."""
    idle = Signals(queue_depth=0, ready=4, reporting=3)
    ds = run(SPEC, 4, [(s, idle) for s in range(10, 600, 10)])
    assert {d.desired for d in ds} == {4} and "metrics from 3 of 4 ready replicas" in ds[-1].reason
    (up,) = run(SPEC, 4, [(10, Signals(queue_depth=40, ready=4, reporting=3))])
    assert up.desired == 8


def test_a_partial_minute_teaches_nothing_about_capacity():
    ticks = [(s, replace(planned(40, 4, 45, 256), reporting=3)) for s in range(10, 200, 10)]
    ds = run(SPEC.model_copy(update={"max_replicas": 40}), 4, ticks)
    assert ds[-1].history.efficiency is None


def test_a_batch_figure_that_comes_or_goes_does_not_fake_arrivals():
    """A minute ago the engine's active requests were unknown (a scrape without them); now 200
    are in the batches. They were not 200 arrivals: the rate falls back to the completions."""
    ticks = [(10, replace(planned(0, 4, 80, 0), in_flight=None))] + [
        (s, planned(0, 4, 80, 200)) for s in range(20, 80, 10)]
    ds = run(SPEC.model_copy(update={"max_replicas": 40}), 4, ticks)
    assert ds[-1].history.rates[-1][1] == pytest.approx(80)


# -- the forecast: start pods a start-up early, on the upper band ------------------------------------

def test_prefill_binds_before_the_batch_for_long_prompts():
    """Code completion: 4k-token prompts stall the batch ~60 ms each. At 95 % of the full-batch
    rate (15.5 req/s) prefill would stall it 93 % of the time and requests wait behind each
    other's prompts; demand plans PREFILL_UTILIZATION of the prefill time instead."""
    from triton_operator.autoscaling.policy import PREFILL_UTILIZATION
    sig = Signals(queue_depth=0, ready=4, throughput=40.0, in_flight=60, capacity_hint=15.5, solo_latency_s=0.2,
                  batch_slots=64, prefill_s=0.06)
    spec = SPEC.model_copy(update={"max_replicas": 40, "target_p99_latency_ms": 8000})
    d = decide(spec, 4, sig, seed(T0, 4), T0 + timedelta(seconds=10))
    usable = PREFILL_UTILIZATION / 0.06
    assert d.wants["demand"] == math.ceil((40 + BAND_Z * math.sqrt(40 / 60)) / usable) == 4
    assert "prefill (60ms a request) at 70% binds before the batch" in d.reason
    short = replace(sig, prefill_s=0.01)       # chat prompts: the batch binds first
    d = decide(spec, 4, short, seed(T0, 4), T0 + timedelta(seconds=10))
    assert d.wants["demand"] == math.ceil((40 + BAND_Z * math.sqrt(40 / 60)) / (15.5 * UTILIZATION))
    assert "at 95%" in d.reason and "binds" not in d.reason


def test_the_start_up_time_is_learned_and_sets_the_lead_and_the_hold():
    """Pods that take 240 s to be ready: the policy learns it from their creation-to-Ready, asks
    for the rising rate one start-up ahead, and holds what demand no longer asks for a start-up."""
    history, current = measured(20.0, 5), 5
    for s, rate in zip(range(10, 130, 10), range(60, 180, 10)):
        d = decide(SPEC.model_copy(update={"max_replicas": 40}), current,
                   rates(0, current, float(rate), float(rate), startup=240.0), history, T0 + timedelta(seconds=s))
        history, current = d.history, d.desired
    assert history.startup == pytest.approx(240.0)
    assert "rising over 240s start-up, the trend of 110s carried no further" in d.reason
    slope, scatter = history.forecast()
    assert slope == pytest.approx(1.0) and scatter == pytest.approx(0.0, abs=1e-9)
    assert d.wants["demand"] == math.ceil((170 + 110 + BAND_Z * math.sqrt(170 / 60)) / 19)
    # the planner's figure for a replica doubles (the load holds at 170 req/s, so nothing falls):
    # demand asks for fewer at once, but replicas go only after 240 s
    spec = SPEC.model_copy(update={"max_replicas": 40})
    peak, out = current, []
    for s in range(130, 600, 10):
        d = decide(spec, current, Signals(queue_depth=0, ready=current, arrival_rate=170.0, throughput=170.0,
                                          startup_s=240.0, capacity_hint=40.0), history, T0 + timedelta(seconds=s))
        history, current = d.history, d.desired
        out.append((s, d))
    assert out[0][1].wants["demand"] < peak and out[0][1].history.forecast()[0] >= 0
    first = next(s for s, d in out if d.desired < peak)
    assert 120 + 240 <= first < 120 + 300 and "within the last 240s" in next(d.reason for s, d in out if s == first)


def test_a_load_falling_beyond_the_band_is_not_held_for_a_start_up():
    """The same 240 s pods, the load falls from 170 to 60 req/s and stays there: its trend falls
    by more than the band over a start-up, so what a start-up-old level asked for is not needed
    again; replicas go after one rate window (MIN_HOLD_S), one per decision."""
    history, current = replace(measured(20.0, 10), startup=240.0), 10
    spec = SPEC.model_copy(update={"max_replicas": 40})
    out = []
    for s, rate in zip(range(10, 600, 10), [170.0] * 30 + [60.0] * 30):
        d = decide(spec, current, rates(0, current, rate, rate, startup=240.0), history, T0 + timedelta(seconds=s))
        history, current = d.history, d.desired
        out.append((s, d))
    first = next(s for s, d in out if d.desired < 10)
    assert 300 + MIN_HOLD_S <= first < 300 + 120 and "within the last 60s" in next(d.reason for s, d in out
                                                                                 if s == first)
    assert next(d for s, d in out if s == first).history.forecast()[0] < 0 and out[-1][1].desired < 10


def test_a_step_in_the_trail_does_not_widen_the_band():
    """60 req/s for a minute, then 120: the trail's scatter around its line is large (the line
    misses both levels), but that is no noise. At 120, the highest rate seen, the band is a
    minute's counting noise (it added 23 req/s after a spike had passed, 24 on top of its climb)."""
    history, current = measured(20.0, 5), 5
    for s, rate in zip(range(10, 130, 10), [60.0] * 6 + [120.0] * 6):
        d = decide(SPEC.model_copy(update={"max_replicas": 40}), current, rates(0, current, rate, rate),
                   history, T0 + timedelta(seconds=s))
        history, current = d.history, d.desired
    assert d.history.forecast()[1] > 10
    assert shown_band(BAND_Z * math.sqrt(120 / 60)) in d.reason


def test_a_fall_beyond_the_forecasts_band_is_held_a_rate_window():
    """150 s start-ups; a one-off burst to 90 req/s taught a rise of 60, then the rate falls from
    60 to 30 over 150 s. The fall (30 req/s over the hold) is beyond the forecast's upper band
    there (the learned rise, up to the 60 the rate came from: at most 30 - 30 = 0 at the bottom,
    24 on the way), so the hold is one rate window, not a start-up. Against the learned rise
    plus the scatter (60 and more) the fall never counted, and the replicas stayed 90 s longer."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    history, current = replace(measured(10.0, 4), startup=150.0), 4
    trace = [30.0] * 40 + [90.0] * 40 + [60.0] * 60 + [60.0 - 2.0 * i for i in range(16)] + [30.0] * 20
    downs = []
    for i, rate in enumerate(trace):
        s = 10 * (i + 1)
        d = decide(spec, current, rates(0, current, rate, rate, startup=150.0), history, T0 + timedelta(seconds=s))
        if s > 1400 and d.desired < current:
            downs.append((s, d))
        history, current = d.history, d.desired
    assert history.rise() == pytest.approx(60)
    s, first = downs[0]
    assert s <= 1620 and "highest recommendation within the last 60s" in first.reason
    assert current == 4


def test_p99_is_reported_not_chased_while_demand_sizes_the_service():
    """A draining backlog keeps p99 high after demand has sized it: ready x p99 / target would
    compound into max replicas."""
    d = decide(SPEC.model_copy(update={"max_replicas": 40}), 6, rates(300, 6, 100, 110, p99=9000),
               measured(20.0, 6), T0 + timedelta(seconds=10))
    assert "p99" not in d.wants and "p99 9000ms (target 800ms)" in d.reason
    assert d.desired == d.wants["demand"]


def test_a_p99_near_its_target_holds_replicas_only_when_demand_is_not_in_charge():
    """Within the tolerance of the target, the p99 holds the replicas that meet it when the queue
    rule sizes the service; with demand in charge, what stays is the keep-alive's to decide (a
    p99 read at 3,981 ms against 4 s held four replicas ten minutes after a burst)."""
    held = decide(SPEC, 6, q(0, 6, p99=820), seed(T0, 6), T0 + timedelta(seconds=10))
    assert held.wants["p99"] == 6 and held.desired == 6
    by_demand = decide(SPEC, 6, rates(0, 6, 40, 40, p99=820), measured(20.0, 6), T0 + timedelta(seconds=10))
    assert "p99" not in by_demand.wants and "p99 820ms (target 800ms)" in by_demand.reason
    assert by_demand.wants["demand"] < 6


def test_bursts_seen_within_a_start_up_widen_the_band_for_half_an_hour():
    """A rate that keeps jumping by 60 req/s within one start-up: the upper band keeps room for
    such a rise (RISE_QUANTILE of the rises seen within RISE_MEMORY_S, one a minute) while the
    trail is calm again; a single jump, rarer than that, does not."""
    from triton_operator.autoscaling.history import RISE_MEMORY_S
    history, current = measured(20.0, 4), 4
    spec = SPEC.model_copy(update={"max_replicas": 40})
    pattern = ([60.0] * 2 + [120.0] * 2) * 4 + [60.0] * 6     # one minute a point
    ds = []
    for i, rate in enumerate(pattern):
        for k in range(6):                                    # ticks of 10 s within the minute
            t = T0 + timedelta(seconds=60 * i + 10 * k + 10)
            d = decide(spec, current, rates(0, current, rate, rate), history, t)
            history, current = d.history, d.desired
        ds.append(d)
    assert history.rise() == pytest.approx(60.0)
    calm = ds[-1]                                             # 6 min after the last burst, at 60 req/s
    assert "upper band +60" in calm.reason
    assert calm.wants["demand"] == math.ceil(120 / 19)
    assert RISE_MEMORY_S == 1800
    once = measured(20.0, 4)
    for i, rate in enumerate([60.0] * 2 + [120.0] * 2 + [60.0] * 20):
        for k in range(6):
            d = decide(spec, 4, rates(0, 4, rate, rate), once, T0 + timedelta(seconds=60 * i + 10 * k + 10))
            once = d.history
    assert once.rise() == 0.0


def test_long_prompts_keep_batches_to_half_the_latency_target():
    """Long-context requests: a full batch of 64 takes 64 / 4 = 16 s a request, over a 10 s
    target. The plan's line (1.3 s alone, +0.23 s a busy slot) keeps batches to 16 requests
    (5 s, half the target): 3.2 req/s a replica rather than 95 % of 4."""
    spec = SPEC.model_copy(update={"max_replicas": 40, "target_p99_latency_ms": 10000})
    sig = Signals(queue_depth=0, ready=4, throughput=12.0, in_flight=40, capacity_hint=4.0, solo_latency_s=1.3,
                  batch_slots=64)
    d = decide(spec, 4, sig, seed(T0, 4), T0 + timedelta(seconds=10))
    per_slot = (64 / 4.0 - 1.3) / 64
    fill = (5.0 - 1.3) / per_slot
    usable = fill / (1.3 + per_slot * fill)
    assert usable == pytest.approx(fill / 5.0) and 3.0 < usable < 3.3
    assert d.wants["demand"] == math.ceil((12 + BAND_Z * math.sqrt(12 / 60)) / usable)
    assert "batches kept to 50% of the latency target" in d.reason
    loose = decide(spec.model_copy(update={"target_p99_latency_ms": 60000}), 4, sig, seed(T0, 4),
                   T0 + timedelta(seconds=10))
    assert "at 95%" in loose.reason                            # a full batch is within half of 60 s


def test_a_new_service_keeps_one_replica_of_headroom_until_its_bursts_are_learned():
    """Nothing is known of a new service's bursts: its upper band is at least one replica until
    LEARNING_RISES rises (one a minute) are logged, whose quantile is their maximum before that.
    On the real code-completion trace the first burst (40-44 req/s for a minute) came three
    minutes in, after two quiet ones, and met the one replica the first minute's 3 req/s asked for.
    The same service not new (first seen after an operator restart) asks for what its load does."""
    assert LEARNING_RISES == 10
    history = replace(measured(20.0, 1), new=True)
    d = decide(SPEC, 1, rates(0, 1, 3, 3), history, T0 + timedelta(seconds=10))
    assert d.wants["demand"] == 2 and d.desired == 2
    assert "upper band +19 (one replica: a new service, its bursts learned over 10 minutes)" in d.reason
    old = decide(SPEC, 1, rates(0, 1, 3, 3), measured(20.0, 1), T0 + timedelta(seconds=10))
    assert old.wants["demand"] == 1 and "a new service" not in old.reason

    # A steady 3 req/s: the tenth rise is logged at minute 11 (the first minute is not judged, and a
    # rise judges the forecast made one start-up, 60 s by default, before it); then the headroom goes.
    current, out = 2, []
    for s in range(20, 15 * 60, 10):
        d = decide(SPEC, current, rates(0, current, 3, 3), history, T0 + timedelta(seconds=s))
        history, current = d.history, d.desired
        out.append((s, d))
    learned = next(s for s, d in out if not d.history.new)
    assert len(next(d for s, d in out if s == learned).history.rises) == LEARNING_RISES
    assert 10 * 60 <= learned <= 12 * 60
    assert all(d.wants["demand"] == 2 for s, d in out if s < learned)
    assert all(d.wants["demand"] == 1 for s, d in out if s > learned)
    assert current == 1   # released once the hold after the last ask for 2 has passed


def _minutes_with_bursts(recent: float | None, level: float = 15.0, busy: tuple[int, ...] = (),
                         minutes: int = 14) -> History:
    """Minutes of `level` req/s (3x that in the minutes `busy`) whose 20 s rate reads `recent` on
    one tick a minute (a burst inside the minute; None: no recent throughput measured); pods
    start in 30 s (a rise is judged over the minute logged last alone)."""
    history, spec = measured(20.0, 2), SPEC.model_copy(update={"max_replicas": 40})
    for i in range(minutes):
        rate = 3 * level if i in busy else level
        for k in range(6):
            short = None if recent is None else max(recent, rate) if k == 2 else rate
            sig = Signals(queue_depth=0, ready=2, arrival_rate=rate, throughput=rate, recent_throughput=short,
                          startup_s=30.0)
            history = decide(spec, 2, sig, history, T0 + timedelta(seconds=60 * i + 10 * k + 10)).history
    return history


def test_bursts_inside_a_minute_widen_the_band():
    """Minutes of 15 req/s with 45 req/s over 20 s in each: latency is lost to the burst, which the
    minute's rate averages away. The forecast's rises are read on the 20 s rate too, less SURGE_Z
    standard deviations of its counting noise; read on minutes alone there are none."""
    from triton_operator.autoscaling.history import SHORT_WINDOW_S, SURGE_Z
    burst = 45.0 - SURGE_Z * math.sqrt(45.0 / SHORT_WINDOW_S)
    assert _minutes_with_bursts(45.0).rise() == pytest.approx(burst - 15.0)
    assert _minutes_with_bursts(None).rise() == 0.0
    # A 20 s rate within its counting noise of the minute's is no burst (at 15 req/s, +-0.9).
    assert _minutes_with_bursts(17.0).rise() == 0.0


def test_a_quiet_minute_keeps_room_for_the_bursts_up_to_the_busiest_minutes_that_recurred():
    """Half an hour of 5 req/s minutes with bursts of 30 req/s over 20 s in each, and two minutes
    of 15 req/s: the band at a quiet minute rises to the busy minutes' rate (the highest that
    recurred, its ceiling). Learned from minutes alone, two rises in thirty are under its
    quantile: no band."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    quiet = Signals(queue_depth=0, ready=2, arrival_rate=5.0, throughput=5.0, recent_throughput=5.0, startup_s=30.0)
    at = T0 + timedelta(seconds=60 * 32 + 10)
    bursty = decide(spec, 2, quiet, _minutes_with_bursts(30.0, 5.0, (8, 20), 32), at)
    calm = decide(spec, 2, quiet, _minutes_with_bursts(None, 5.0, (8, 20), 32), at)
    assert "upper band +10 /" in bursty.reason and bursty.wants["demand"] == 1   # 15 / 19
    assert f"upper band +{BAND_Z * math.sqrt(5 / 60):.1f} /" in calm.reason


def _surged(later: float, count: int = 4) -> History:
    """Minutes logged at 10 req/s and `later` req/s in turn; `count` surges of +30 req/s (a tick's
    arrivals while requests waited) at 10 req/s, two minutes apart, each followed a start-up (60 s)
    later by a minute at `later`."""
    base = measured(20.0, 2)
    minutes = tuple((T0 + timedelta(seconds=60 * i), 10.0 if i % 2 == 0 else later, 10.0) for i in range(2 * count + 2))
    surges = tuple((T0 + timedelta(seconds=120 * i + 90), 10.0, 30.0) for i in range(count))
    return replace(base, minutes=minutes, surges=surges)


def test_a_surge_counts_for_the_share_of_it_that_surges_kept_a_start_up_later():
    """Surges that were gone a start-up later count for nothing; ones that stayed, in full; a
    surge not yet seen through, or fewer than three, count in full (nothing known)."""
    end = T0 + timedelta(seconds=600)
    assert _surged(later=10.0).persistence(end, 60.0) == 0.0
    assert _surged(later=40.0).persistence(end, 60.0) == 1.0
    assert _surged(later=25.0).persistence(end, 60.0) == pytest.approx(0.5)
    assert _surged(later=10.0, count=2).persistence(end, 60.0) == 1.0
    # The three oldest (1.5, 3.5, 5.5 min) alone are a start-up old at 6 min 40 s; two at 5 min.
    assert _surged(later=10.0).persistence(T0 + timedelta(seconds=400), 60.0) == 0.0
    assert _surged(later=10.0).persistence(T0 + timedelta(seconds=300), 60.0) == 1.0


def test_demand_counts_a_surge_as_far_as_surges_lasted():
    """Requests wait and the last tick took on 40 req/s where the minute's rate is 10: a step
    would ask for three replicas, but this service's surges were gone within a start-up, so the
    forecast is the minute's rate (one replica) plus the backlog's drain."""
    spec = SPEC.model_copy(update={"max_replicas": 40})
    history = _surged(later=10.0)
    now = T0 + timedelta(seconds=600)
    history = replace(history, contents=((now - timedelta(seconds=10), 0.0, None),),
                      rates=((now - timedelta(seconds=10), 10.0, (now - timedelta(seconds=10)).timestamp()),))
    sig = Signals(queue_depth=300, ready=1, arrival_rate=10.0, throughput=10.0, startup_s=60.0)
    d = decide(spec, 1, sig, history, now)
    assert "a surge counted x0.00" in d.reason and "demand 10 req/s" in d.reason
    fresh = replace(history, surges=())
    d2 = decide(spec, 1, sig, fresh, now)
    assert "demand 40 req/s" in d2.reason and d2.wants["demand"] > d.wants["demand"]
