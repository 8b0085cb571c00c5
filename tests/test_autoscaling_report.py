"""What the autoscaler shows in status, and when it writes: only when the desired replicas, the
availability of metrics or a figure at two significant digits change."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from triton_operator.api import AutoscalingSpec
from triton_operator.autoscaling.history import seed
from triton_operator.autoscaling.policy import decide
from triton_operator.autoscaling.signals import Signals
from triton_operator.autoscaling.report import Report, report, significant

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
SPEC = AutoscalingSpec(min_replicas=1, max_replicas=10, target_queue_depth=4, target_p99_latency_ms=500)


def q(queue: float, ready: int, p99: float | None = None) -> Signals:
    return Signals(queue_depth=queue, p99_ms=p99, ready=ready)


def test_significant_digits():
    assert [significant(x) for x in (3.14159, 0.01234, 812.0, 1234.0, 0.0, None)] == [3.1, 0.012, 810.0, 1200.0, 0.0, None]
    assert significant(float("nan")) is None


def test_a_scale_up_shows_and_announces_itself_once():
    up = decide(SPEC, 2, q(40, 2, p99=900), seed(T0, 2), T0)
    r, events = report(up, 2, None, T0)
    status = r.status()
    assert status["autoscaling"] == {"desiredReplicas": up.desired, "lastDecision": up.reason,
                                     "lastScaleTime": "2026-11-21T12:00:00Z"}
    assert status["metrics"] == {"queueDepth": 20.0, "p99LatencyMs": 900.0, "observedAt": "2026-11-21T12:00:00Z"}
    assert [e[1] for e in events] == ["ScaledUp"]
    # The Deployment has not caught up yet: the same request is no new scale, no new write.
    again = decide(SPEC, 2, q(40, 2, p99=900), up.history, T0 + timedelta(seconds=10))
    r2, events2 = report(again, 2, r, T0 + timedelta(seconds=10))
    assert r2 is r and events2 == []


def test_noise_in_the_figures_writes_nothing_and_a_real_change_does():
    first = decide(SPEC, 3, q(3.14 * 3, 3, p99=412), seed(T0, 3), T0)
    r, _ = report(first, 3, None, T0)
    noisy = decide(SPEC, 3, q(3.12 * 3, 3, p99=414), first.history, T0 + timedelta(seconds=10))
    r2, events = report(noisy, 3, r, T0 + timedelta(seconds=10))
    assert r2 is r and events == [], "3.14 vs 3.12 per replica and 412 vs 414 ms round alike"
    moved = decide(SPEC, 3, q(2.5 * 3, 3, p99=412), first.history, T0 + timedelta(seconds=20))
    r3, _ = report(moved, 3, r, T0 + timedelta(seconds=20))
    assert r3 is not r and r3.queue_depth == 2.5 and r3.last_scale_time is None


def test_an_outage_keeps_the_last_figures_and_says_why_once():
    up = decide(SPEC, 2, q(40, 2), seed(T0, 2), T0)
    r, _ = report(up, 2, None, T0)
    down = decide(SPEC, 6, Signals(ready=6, error="Prometheus unreachable"), up.history, T0)
    r2, events = report(down, 6, r, T0 + timedelta(seconds=10))
    assert "metrics" not in r2.status(), "the last good figures stay as they were"
    ok, reason, message = r2.condition()
    assert not ok and reason == "MetricsUnavailable" and "Prometheus unreachable" in message
    assert [e[1] for e in events] == ["MetricsUnavailable"]
    still = decide(SPEC, 6, Signals(ready=6, error="Prometheus unreachable"), down.history, T0 + timedelta(seconds=20))
    r3, events3 = report(still, 6, r2, T0 + timedelta(seconds=20))
    assert r3 is r2 and events3 == []
    back = decide(SPEC, 6, q(24, 6), down.history, T0 + timedelta(seconds=30))
    _, events4 = report(back, 6, r3, T0 + timedelta(seconds=30))
    assert [e[1] for e in events4] == ["MetricsAvailable"]


def test_a_restart_picks_up_the_report_status_shows():
    steady = decide(SPEC, 3, q(9, 3), seed(T0, 3), T0)
    r, _ = report(steady, 3, None, T0)
    assert r.desired == 3 and r.queue_depth == 3.0
    status = {**r.status(), "conditions": [{"type": "MetricsAvailable", "status": "True"}]}
    restored = Report.from_status(status)
    assert restored.same_as(r)
    later = decide(SPEC, 3, q(9.1, 3), seed(T0, 3), T0 + timedelta(minutes=5))
    r2, events = report(later, 3, restored, T0 + timedelta(minutes=5))
    assert r2 is restored and events == [], "a restart rewrites nothing"
    assert Report.from_status({}) is None


def test_a_target_out_of_reach_is_written_and_announced_when_it_becomes_so():
    """The figures alone would not rewrite status; the verdict does, once, with a Warning."""
    reachable = decide(SPEC, 2, q(0, 2, p99=400), seed(T0, 2), T0)
    r, _ = report(reachable, 2, None, T0)
    out = decide(SPEC, 2, q(0, 2, p99=4000), reachable.history, T0 + timedelta(seconds=10))
    assert out.unattainable and out.desired == 2
    r2, events = report(out, 2, r, T0 + timedelta(seconds=10))
    assert r2 is not r and "service time" in r2.status()["autoscaling"]["lastDecision"]
    assert [e[1] for e in events] == ["TargetUnattainable"]
    still = decide(SPEC, 2, q(0, 2, p99=4000), out.history, T0 + timedelta(seconds=20))
    r3, events3 = report(still, 2, r2, T0 + timedelta(seconds=20))
    assert r3 is r2 and events3 == []


def test_the_share_of_requests_within_the_target_is_shown_and_rewritten_only_when_it_moves():
    """status.metrics.sloAttainment: met / counted over the last 10 minutes, from the gateway's
    counter (signals.attainment), at three decimals: 0.9996 is not shown as all."""
    from dataclasses import replace as evolve
    from triton_operator.autoscaling.report import attainment_shown
    from triton_operator.autoscaling.signals import attainment

    assert attainment(973, 1000) == 0.973 and attainment(5, 0) is None and attainment(None, 10) is None
    assert attainment(float("nan"), 10) is None
    assert [attainment_shown(x) for x in (0.9996, 1.0, 0.97349, None)] == [0.999, 1.0, 0.973, None]
    first = decide(SPEC, 3, evolve(q(0, 3, p99=412), attainment=0.9731), seed(T0, 3), T0)
    r, _ = report(first, 3, None, T0)
    assert r.status()["metrics"]["sloAttainment"] == 0.973
    same = decide(SPEC, 3, evolve(q(0, 3, p99=412), attainment=0.9738), first.history, T0 + timedelta(seconds=10))
    assert report(same, 3, r, T0 + timedelta(seconds=10))[0] is r
    moved = decide(SPEC, 3, evolve(q(0, 3, p99=412), attainment=0.951), first.history, T0 + timedelta(seconds=20))
    r3, _ = report(moved, 3, r, T0 + timedelta(seconds=20))
    assert r3 is not r and r3.status()["metrics"]["sloAttainment"] == 0.951
    assert Report.from_status(r3.status() | {"conditions": [{"type": "MetricsAvailable", "status": "True"}]}
                              ).slo_attainment == 0.951
