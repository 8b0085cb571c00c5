"""Figures of a run (pure): SLO attainment, latency and time-to-first-token quantiles,
GPU-hours, cost, scale events, drops."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .simulation import Run, slo_latency


def quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of sorted values (NaN when empty)."""
    if not sorted_values:
        return math.nan
    rank = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[rank]


@dataclass(frozen=True)
class Summary:
    policy: str
    requests: int
    completed: int
    dropped: int
    slo_ms: float
    slo_attainment: float           # share of all requests (dropped ones fail) within the SLO
    slo_violations: int
    latency_p50_ms: float
    latency_p95_ms: float
    latency_p99_ms: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    ttft_p99_ms: float
    gpu_hours: float
    cost: float | None
    scale_events: int
    max_replicas: int
    duration_s: float

    def as_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def gpu_seconds(run: Run) -> float:
    """Pod lifetimes (creation to termination) x GPUs per replica."""
    return sum(pod[3] - pod[1] for pod in run.pods) * run.settings.gpus_per_replica


def timeline_gpu_seconds(run: Run) -> float:
    """The same from the replica timeline: the integral of loading + ready + draining pods."""
    total = 0.0
    for (t0, _, loading, ready, draining), (t1, *_rest) in zip(run.timeline, run.timeline[1:]):
        total += (t1 - t0) * (loading + ready + draining)
    return total * run.settings.gpus_per_replica


def summarize(run: Run) -> Summary:
    slo_s = run.settings.slo_s
    kind = run.settings.slo_latency
    latencies, ttfts = [], []
    within = 0
    for r, f, ft, dropped in zip(run.requests, run.finish, run.first_token, run.dropped):
        if dropped or math.isnan(f):
            continue
        latency = f - r.arrival
        latencies.append(latency * 1000.0)
        ttfts.append((ft - r.arrival) * 1000.0)
        if slo_latency(kind, r.arrival, ft, f, r.output_tokens) <= slo_s:
            within += 1
    latencies.sort()
    ttfts.sort()
    n = len(run.requests)
    hours = gpu_seconds(run) / 3600.0
    price = run.settings.price_per_gpu_hour
    return Summary(
        policy=run.policy, requests=n, completed=len(latencies), dropped=sum(run.dropped),
        slo_ms=slo_s * 1000.0, slo_attainment=within / n if n else 1.0, slo_violations=n - within,
        latency_p50_ms=quantile(latencies, 0.5), latency_p95_ms=quantile(latencies, 0.95),
        latency_p99_ms=quantile(latencies, 0.99), ttft_p50_ms=quantile(ttfts, 0.5),
        ttft_p95_ms=quantile(ttfts, 0.95), ttft_p99_ms=quantile(ttfts, 0.99),
        gpu_hours=hours, cost=None if price is None else hours * price,
        scale_events=len(run.decisions), max_replicas=max((row[1] for row in run.timeline), default=0),
        duration_s=run.end)


def littles_law(run: Run) -> tuple[float, float]:
    """(time-average number in system, arrival rate x mean time in system) over completed
    requests: the two sides of L = lambda W, measured independently."""
    done = [(r.arrival, f) for r, f, d in zip(run.requests, run.finish, run.dropped)
            if not d and not math.isnan(f)]
    if not done:
        return 0.0, 0.0
    start = min(a for a, _ in done)
    end = max(f for _, f in done)
    span = end - start
    # L: integrate the number in system with an event sweep
    events = sorted([(a, 1) for a, _ in done] + [(f, -1) for _, f in done])
    area, level, last = 0.0, 0, start
    for t, delta in events:
        area += level * (t - last)
        level += delta
        last = t
    mean_in_system = area / span
    rate = len(done) / span
    mean_time = sum(f - a for a, f in done) / len(done)
    return mean_in_system, rate * mean_time


COLUMNS = [
    ("policy", "policy", "{}"), ("slo_attainment", "SLO met", "{:.2%}"),
    ("slo_violations", "violations", "{}"), ("latency_p50_ms", "p50 ms", "{:.0f}"),
    ("latency_p95_ms", "p95 ms", "{:.0f}"), ("latency_p99_ms", "p99 ms", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50", "{:.0f}"), ("ttft_p99_ms", "TTFT p99", "{:.0f}"),
    ("gpu_hours", "GPU-h", "{:.2f}"), ("cost", "cost", "{:.2f}"),
    ("scale_events", "scales", "{}"), ("dropped", "dropped", "{}"),
]


def table_rows(summaries: list[Summary]) -> tuple[list[str], list[list[str]]]:
    header = [title for _, title, _ in COLUMNS]
    rows = []
    for s in summaries:
        row = []
        for key, _, fmt in COLUMNS:
            v = getattr(s, key)
            row.append("-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v))
        rows.append(row)
    return header, rows


def text_table(summaries: list[Summary]) -> str:
    header, rows = table_rows(summaries)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)


def markdown_table(summaries: list[Summary]) -> str:
    header, rows = table_rows(summaries)
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)
