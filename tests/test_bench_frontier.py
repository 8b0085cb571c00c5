"""The bench's comparison with the frontier (bench/frontier.py) on hand-made points, the fluid
lower bound on a workload whose answer is known, and the bench's reduced sweep (`--fast`) end
to end: it writes the report with one row per configuration, and its verdict is what the
figures in that report give."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import frontier as fr  # noqa: E402


POINTS = [fr.Point("a", 4.0, 1000), fr.Point("b", 5.0, 200), fr.Point("c", 6.0, 200), fr.Point("d", 7.0, 0),
          fr.Point("e", 5.5, 900)]


def test_the_frontier_keeps_only_points_nothing_beats():
    assert [p.name for p in fr.frontier(POINTS)] == ["a", "b", "d"]


def test_equal_attainment_and_equal_gpu_hours_interpolate_on_the_frontier():
    front = fr.frontier(POINTS)
    assert fr.gpu_at_violations(front, 600) == pytest.approx(4.5)      # halfway from a to b
    assert fr.gpu_at_violations(front, 5000) == 4.0                    # worse than the cheapest point
    assert fr.violations_at_gpu(front, 6.0) == pytest.approx(100)      # halfway from b to d
    assert fr.violations_at_gpu(front, 3.0) is None
    assert fr.gpu_at_violations([fr.Point("x", 1.0, 10)], 5) is None   # ours beats every swept point


def test_compare_reports_dominance_ratio_fewer_and_the_goal():
    win = fr.compare(POINTS, fr.Point("ours", 4.5, 200), fluid_gpu_hours=4.2)
    assert win.ratio == pytest.approx(0.9) and win.fewer == pytest.approx(1 - 200 / 600)
    assert win.dominated == () and win.beats_baselines() and win.fluid_ratio == pytest.approx(4.5 / 4.2)
    assert win.goal_met(), "no plan with foresight given: nothing cheaper at ours' attainment"
    lose = fr.compare(POINTS, fr.Point("ours", 5.5, 300), fluid_gpu_hours=5.0)
    assert lose.dominated == ("b",) and not lose.beats_baselines() and not lose.goal_met()
    far = fr.compare(POINTS, fr.Point("ours", 4.5, 200), fluid_gpu_hours=3.0,
                     foresight=[fr.Point("oracle:headroom=0", 3.5, 200)])
    assert far.beats_baselines() and not far.near_foresight() and not far.goal_met(), "1.29x the plans"
    near = fr.compare(POINTS, fr.Point("ours", 4.5, 200), fluid_gpu_hours=3.0,
                      foresight=[fr.Point("oracle:headroom=0", 4.0, 200)])
    assert near.near_foresight() and near.goal_met(), "1.125x the plans"
    # the frontier at ours' 200 violations needs 5.0 GPU-h (4.5 / 0.9): 5.0 / 3.0 of the bound
    assert far.frontier_fluid_ratio == pytest.approx(5.0 / 3.0)
    alone = fr.compare([fr.Point("x", 1.0, 1000)], fr.Point("ours", 2.0, 10), fluid_gpu_hours=1.5)
    assert alone.ratio is None and alone.frontier_fluid_ratio is None   # nothing reaches ours' attainment


def test_foresight_plans_are_compared_on_their_own_frontier_not_as_baselines():
    plans = [fr.Point("oracle:headroom=0", 3.0, 400), fr.Point("oracle:headroom=0.2", 4.0, 0),
             fr.Point("oracle:headroom=0.1", 4.5, 300)]   # the last is beaten by headroom=0.2
    seen = fr.compare(POINTS, fr.Point("ours", 4.5, 200), fluid_gpu_hours=3.0, foresight=plans)
    # the plans at 200 violations: halfway from 3.0 to 4.0 GPU-h; the bound is 3.0
    assert seen.foresight_ratio == pytest.approx(4.5 / 3.5)
    assert seen.foresight_fluid_ratio == pytest.approx(3.5 / 3.0)
    assert seen.dominated == () and seen.ratio == pytest.approx(0.9), "plans cheaper than ours dominate nothing"
    none = fr.compare(POINTS, fr.Point("ours", 4.5, 200), fluid_gpu_hours=3.0)
    assert none.foresight_ratio is None and none.foresight_fluid_ratio is None
    short = fr.compare(POINTS, fr.Point("ours", 6.0, 0), fluid_gpu_hours=3.0, foresight=plans[:1])
    assert short.foresight_ratio is None, "no plan reaches ours' attainment"


def test_plans_with_foresight_are_judged_against_the_baselines_like_ours():
    plans = [fr.Point("oracle:headroom=0", 4.0, 900),     # cheaper than the frontier but 900 vs 1000: fewer 10 %
             fr.Point("oracle:headroom=0.1", 4.2, 300),   # 4.2 vs 4.875 at 300: 0.86x; 64 % fewer at 4.2 GPU-h
             fr.Point("oracle:headroom=0.2", 5.5, 250)]   # dominated by b (5.0 GPU-h, 200)
    assert fr.plans_meeting_goal(POINTS, plans) == ["oracle:headroom=0.1"]


def test_fluid_bound_provisions_whole_replicas_per_bucket_with_the_cold_start():
    # 2 buckets of 60 s: 60 then 180 arrivals at 1 req/s per replica -> 1 then 3 replicas; two
    # replicas added, each charged a 50 s cold start; one warm replica at the start.
    arrivals = [i for i in range(60)] + [60 + i / 3 for i in range(180)]
    full = fr.fluid_bound(arrivals, 1.0, 120.0, 50.0, initial=1, min_replicas=1, allowed_violations=0)
    assert full == pytest.approx((60 + 180 + 2 * 50) / 3600)
    # allowed to leave 60 requests unserved: the third replica of bucket 2 goes
    part = fr.fluid_bound(arrivals, 1.0, 120.0, 50.0, initial=1, min_replicas=1, allowed_violations=60)
    assert part == pytest.approx((60 + 120 + 50) / 3600)


def test_fluid_bound_holds_a_replica_through_a_gap_shorter_than_a_cold_start():
    # 1, 2, 1, 2 replicas a bucket at 1 req/s each: the second replica is started once (50 s),
    # then either held through its 60 s gap or started again (50 s): the start is cheaper.
    # With a 300 s cold start, holding it (60 s) is.
    arrivals = [b * 60 + i / n for b, n in enumerate((1, 2, 1, 2)) for i in range(60 * n)]
    assert fr.fluid_bound(arrivals, 1.0, 240.0, 50.0, initial=1, min_replicas=1,
                          allowed_violations=0) == pytest.approx((6 * 60 + 50 + 50) / 3600)
    assert fr.fluid_bound(arrivals, 1.0, 240.0, 300.0, initial=1, min_replicas=1,
                          allowed_violations=0) == pytest.approx((6 * 60 + 300 + 60) / 3600)
    # a warm replica not needed in the first bucket is held (60 s), not started again
    assert fr.fluid_bound(arrivals, 1.0, 240.0, 300.0, initial=2, min_replicas=1,
                          allowed_violations=0) == pytest.approx((6 * 60 + 60 + 60) / 3600)


def test_the_reduced_bench_writes_a_report_whose_verdict_follows_from_its_figures(tmp_path):
    import autoscaling as bench

    assert bench.main(["--fast", "--jobs", "1", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "autoscaling.md").read_text()
    assert "Command: `python bench/autoscaling.py --fast --jobs 1 --out " in text and "Machine: " in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and " | " in line]
    configs = [r for r in rows if r.split(" | ")[0].lstrip("| ") in ("**ours**", *bench.FAST_SWEEP)
               or r.startswith("| fixed:")]
    assert len(configs) >= 1 + len(bench.FAST_SWEEP) + 1
    figures = {}
    for r in configs:
        cells = [c.strip() for c in r.strip("|").split("|")]
        figures[cells[0]] = (float(cells[3]), int(cells[2]))
    ours = fr.Point("ours", *figures.pop("**ours**"))
    points = [fr.Point(n, g, v) for n, (g, v) in figures.items()]
    dominated = bool(fr.dominated_by(points, ours))
    summary = next(r for r in rows if r.startswith("| spike (fast) | cold start 50 s |"))
    cells = [c.strip() for c in summary.strip("|").split("|")]
    assert len(cells) == 13
    assert cells[11] == "no" or not dominated, "a dominated run never beats the baselines"
    # 'goal met by a plan with foresight' follows from the plans' own figures and the goal
    plan_figures = dict((h.strip(), g) for h, g in
                        (part.split(":") for part in plans_line(text).split("GPU-h): ")[1].split(";")))
    reach = next(line for line in text.splitlines() if line.startswith("- seed 1: ours"))
    by_plans = reach.rpartition("(plans with foresight that beat the baselines: ")[2].rstrip(")")
    assert cells[10] == ("no" if by_plans == "none" else f"yes ({len(by_plans.split(', '))} of 2 headrooms)")
    assert by_plans == "none" or set(by_plans.removeprefix("at headroom ").split(", ")) <= set(plan_figures)
    # the foresight plans are reported on their own line, never among the swept configurations
    assert not any(r.startswith("| oracle") for r in rows)
    assert [part.split(":")[0].strip() for part in plans_line(text).split("GPU-h): ")[1].split(";")] == ["-0.2", "0.2"]
    assert (tmp_path / "frontier-spike-fast-cold-start-50-s.png").stat().st_size > 1000


def test_plans_chosen_a_minute_at_a_time_add_replicas_over_the_fluid_need_until_each_minute_meets_its_share(tmp_path):
    """bench/foresight.py on the reduced bench's workload: the search only adds to each minute's
    fluid need, asking no misses at all costs the most and meets every request, and the report's
    row says what its own figures give."""
    import autoscaling as bench
    import foresight
    from triton_operator.simulator import results
    from triton_operator.simulator.policies import oracle

    w, c = bench.FAST_WORKLOAD, bench.FAST_CONDITIONS[0]
    reqs, perf, _, cold, _, cfg = bench.setup(w, c, 1)
    need = oracle.oracle_schedule(reqs, oracle.saturated_throughput(reqs, perf, cfg), 0.0, w.duration, 60.0,
                                  cfg.min_replicas, cfg.max_replicas)
    plans = {share: foresight.per_bucket_plan(reqs, perf, cold, cfg, w.duration, share) for share in (0.0, 0.05)}
    for counts, _, sims in plans.values():
        assert all(n >= m for n, m in zip(counts, need)) and sims >= len(need)
    strict, loose = (results.summarize(plans[s][1]) for s in (0.0, 0.05))
    assert strict.slo_violations == 0 and strict.gpu_hours > loose.gpu_hours
    assert plans[0.0][0] != need, "at 87 % of a replica's throughput one replica a minute misses some"

    out = tmp_path / "foresight.md"
    assert foresight.main(["--row", f"{w.label}|{c.label}", "--share", "0.05", "--jobs", "1", "--no-steady",
                           "--out", str(out)]) == 0
    row = next(line for line in out.read_text().splitlines() if line.startswith(f"| {w.label} | {c.label} | 0.05 |"))
    cells = [x.strip() for x in row.strip("|").split("|")]
    assert cells[3] == f"{loose.slo_attainment:.2%}" and cells[4] == f"{loose.gpu_hours:.2f}"
    info = bench.fluid_info(w, c, 1)
    bound = fr.fluid_bound(info["arrivals"], info["capacity"], w.duration, info["cold"], info["initial"],
                           info["min_replicas"], loose.slo_violations)
    assert cells[5] == f"{bound:.2f}" and cells[6] == f"{loose.gpu_hours / bound:.2f}x"
    with pytest.raises(SystemExit, match="--share must be in"):
        foresight.main(["--share", "1", "--out", str(out)])
    with pytest.raises(SystemExit, match=r"^--row 'azure\|cold start 9 s': expected WORKLOAD\|CONDITION"):
        foresight.main(["--row", "azure|cold start 9 s", "--out", str(out)])


def test_the_steady_load_table_reports_each_load_from_its_own_run():
    """Code completion's 4 s SLO at 70 % and 95 % of two replicas' saturated throughput: the
    heavier load meets it less often and has the longer p99."""
    import foresight

    (row,) = foresight.steady_load((("code", "code", 4.0),), (0.7, 0.95), replicas=2, duration=300.0)
    cells = [x.strip() for x in row.strip("|").split("|")]
    assert cells[:2] == ["code", "4"] and float(cells[2]) > 0
    (light, light_p99), (heavy, heavy_p99) = (
        (float(c.split("%")[0]), float(c.split("p99 ")[1].split(" s")[0])) for c in cells[3:])
    assert heavy < light and heavy_p99 > light_p99


def plans_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("Plans with foresight (seed 1;"))


def test_a_two_hour_row_plays_its_trace_twice_back_to_back():
    """The two-hour rows: the same requests, the second copy one period later (the first hour's
    tokens and arrivals, every one)."""
    import autoscaling as bench

    two = next(w for w in bench.WORKLOADS if w.repeat == 2 and "code" in w.trace)
    one = next(w for w in bench.WORKLOADS if w.repeat == 1 and w.trace == two.trace)
    first, both = bench.requests_for(one, 1), bench.requests_for(two, 1)
    assert two.duration == 2 * one.duration and len(both) == 2 * len(first)
    period = two.duration / 2
    assert both[:len(first)] == first
    assert [(r.arrival - period, r.prompt_tokens, r.output_tokens) for r in both[len(first):]] == [
        (pytest.approx(r.arrival), r.prompt_tokens, r.output_tokens) for r in first]
    assert max(r.arrival for r in first) < period


def test_the_rates_bench_replays_the_real_traces_at_their_own_rates_and_claims_nothing_about_foresight(tmp_path):
    """`--rates` (make bench-autoscaling-rates) on one of its rows: the trace at the row's rate (the
    request count scales with it), a report of its own (the main report and the autoscaling page's table untouched), and no
    verdict on plans with foresight, which it does not run."""
    import autoscaling as bench

    slow, fast = (next(w for w in bench.RATE_WORKLOADS if w.label == f"Azure code trace x{r} (real)") for r in (1, 2))
    assert len(bench.requests_for(fast, 1)) == pytest.approx(2 * len(bench.requests_for(slow, 1)), rel=0.02)
    assert all(w.trace and (ROOT / "bench" / "data" / w.trace).exists() for w in bench.RATE_WORKLOADS)
    assert bench.main(["--rates", "--workload", slow.label, "--seeds", "1", "--jobs", "1", "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "autoscaling.md").exists()
    text = (tmp_path / "autoscaling-rates.md").read_text()
    assert text.startswith("# Autoscaling benchmark at other rates")
    verdict = [line for line in text.splitlines() if line.startswith(("Ours beats", "- cold start 50 s:", "- seed 1:"))]
    assert len(verdict) == 3 and "no plans with foresight are run here" in verdict[0]
    assert not any("foresight" in line for line in verdict[1:]), verdict
    summary = next(line for line in text.splitlines() if line.startswith(f"| {slow.label} | cold start 50 s |"))
    cells = [c.strip() for c in summary.strip("|").split("|")]
    assert cells[12] == "-" and cells[11] in ("no", "**yes**")
    assert not any(line.startswith("| oracle") for line in text.splitlines())
