"""The pure helpers of bench/sim_vs_live.py: the time to the first token as measured (never falling
with the prompt), interpolation along it, the time per token at the simulated run's own mix of
busy replicas, each side's reason at a move, and the request-by-request comparison."""

from __future__ import annotations

import pytest

from dataclasses import dataclass

from bench.sim_vs_live import (Done, interpolate, overlap_share, reason_at, request_lines, ttft_curve,
                                with_contention)


def test_the_first_token_curve_groups_prompt_sizes_and_never_falls():
    samples = [Done(0.0, first=0.40, prompt_tokens=50), Done(0.0, first=0.44, prompt_tokens=55),
               Done(0.0, first=1.30, prompt_tokens=183), Done(0.0, first=1.20, prompt_tokens=230)]
    curve = ttft_curve(samples)
    assert curve == ((52.5, pytest.approx(0.42)), (183.0, 1.30), (230.0, 1.30))
    assert interpolate(curve, 26.25) == pytest.approx(0.21)          # below the first point: in proportion
    assert interpolate(curve, 117.75) == pytest.approx(0.86)         # halfway between the first two
    assert interpolate(curve, 300.0) == pytest.approx(1.30)          # beyond the last: along the last segment


def test_a_side_with_no_reason_yet_shows_a_dash():
    reasons = [(10.0, 1, "steady"), (70.0, 2, "scale up")]
    assert reason_at(reasons, 5.0) == "-"
    assert reason_at(reasons, 10.0) == "steady"
    assert reason_at(reasons, 69.9) == "steady"
    assert reason_at(reasons, 70.0) == "scale up"


def test_request_by_request_names_the_requests_met_on_one_side_only():
    # arrival, prompt, answer, live first, live finish, error, sim start, sim first, sim finish, replica
    r = {"args": {"slo_ms": 4000.0}, "per_request": [
        [0.0, 50, 24, 0.4, 1.0, None, 0.0, 0.4, 1.1, 0],        # at once in the simulation, live x0.909
        [1.0, 50, 24, 1.4, 5.5, None, 1.0, 1.4, 4.0, 1],        # at once, met in the simulation only (x1.5)
        [2.0, 300, 24, 4.0, 5.5, None, 3.0, 5.0, 6.5, 0],       # waited in the simulation: met live only
        [3.0, 50, 24, 9.0, 9.0, "HTTP 502", 3.0, 3.4, 4.0, 1],  # failed live: not compared
    ]}
    (blank, line) = request_lines(r)
    assert blank == ""
    assert line == ("Request by request (3 answered live): live and simulated latency 1.00 s apart at the median, "
                    "1.50 s at the 90th percentile (which replica, and in which order, differs between the sides). "
                    "The 2 requests the simulation served at once took live x1.205 the simulated latency at the "
                    "median (the replica model alone). Met the SLO on one side only: 1 live (live/simulated s: "
                    "3.50/4.50) and 1 simulated (4.50/3.00).")
    assert request_lines({"args": {"slo_ms": 4000.0}}) == []


def test_the_share_of_decoding_with_another_replica_busy():
    # replica 0: A decodes 1-3 s; replica 1: B is busy 2-5 s (decoding 2.5-5); replica 0 again: C busy 4-6 s.
    start, first, finish, replica = [0.0, 2.0, 4.0], [1.0, 2.5, 4.5], [3.0, 5.0, 6.0], [0, 1, 0]
    # A: 1 s of its 2 under B; B: 0.5 s under A and 1 s under C, of 2.5; C: 0.5 s under B, of 1.5.
    assert overlap_share(start, first, finish, replica) == pytest.approx((1.0 + 1.5 + 0.5) / (2.0 + 2.5 + 1.5))
    # Requests on one replica never overlap it; an unfinished request is left out.
    assert overlap_share([0.0, 1.0], [0.5, 1.5], [1.0, 2.0], [0, 0]) == 0.0
    assert overlap_share([0.0, 0.0], [0.5, 0.5], [1.0, float("nan")], [0, 1]) == 0.0


def test_the_time_per_token_settles_at_the_simulated_mix():
    @dataclass(frozen=True)
    class Model:
        token_s: float
        token_s_alone: float

    @dataclass
    class Run:
        start: list
        first_token: list
        finish: list
        replica: list
        model: Model

    def half_overlapped(m: Model) -> Run:   # another replica busy for half of every decode, whatever the speed
        return Run([0.0, 1.0], [0.0, 1.0], [2.0, 3.0], [0, 1], m)

    used, sim, share = with_contention(Model(0.014, 0.012), half_overlapped)
    assert share == pytest.approx(0.5) and used.token_s == pytest.approx(0.013) and sim.model is used

    def flips(m: Model) -> Run:   # never settles: slow decoding runs alone here, fast alongside another
        return Run([0.0], [0.0], [1.0], [0], m) if m.token_s > 0.013 else Run([0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0, 1], m)

    # 14 ms: alone -> 12 ms: alongside -> 14 -> 12, and the last model is simulated again: what is
    # returned is one run, with the model and the share it had.
    used, sim, share = with_contention(Model(0.014, 0.012), flips, rounds=3)
    assert used.token_s == pytest.approx(0.012) and sim.model is used and share == 1.0
