"""Writing a simulation report (I/O): report.md, replicas.png, latency.png, the per-request CSV.
Plots need matplotlib (`pip install 'triton-operator[sim]'`); without it the report says so."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Sequence

from .simulation import Run
from .results import Summary, markdown_table

PLOTS_HINT = "plots need matplotlib: pip install 'triton-operator[sim]'"


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_requests(run: Run, path: Path) -> None:
    """One row per request: seconds from the start; finish empty for a dropped request."""
    def cell(x: float) -> str:
        return "" if math.isnan(x) else f"{x:.6f}"

    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["arrival", "start", "first_token", "finish", "replica", "gpu_class"])
        for r, s, ft, fin, rep, dropped in zip(run.requests, run.start, run.first_token, run.finish,
                                               run.replica, run.dropped):
            out.writerow([f"{r.arrival:.6f}", cell(s), "" if dropped else cell(ft),
                          "" if dropped else cell(fin), "" if rep < 0 else rep, run.gpu_class])


REPLICA_COLUMNS = ["replica", "gpu_class", "gpus", "created", "ready", "deleted", "stopped"]


def write_replicas(run: Run, path: Path) -> None:
    """One row per pod, seconds from the start: created (the scale-up that made it; 0 for the pods
    the run starts with, already warm), ready (empty if it never was), deleted (the scale-down
    that removed it; empty if none did), stopped (its last request done, or the end of the run).
    GPU time is charged from created to stopped."""
    def cell(x: float) -> str:
        return "" if math.isinf(x) or math.isnan(x) else f"{x:.6f}"

    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(REPLICA_COLUMNS)
        for rid, created, ready, stopped, deleted in run.pods:
            out.writerow([rid, run.pod_classes.get(rid, run.gpu_class), run.settings.gpus_per_replica,
                          cell(created), cell(ready), cell(deleted), cell(stopped)])


def _arrival_rate(run: Run, bucket: float) -> tuple[list[float], list[float]]:
    if not run.requests:
        return [], []
    n = int(run.end // bucket) + 1
    counts = [0] * n
    for r in run.requests:
        counts[min(n - 1, int(r.arrival // bucket))] += 1
    return [i * bucket for i in range(n)], [c / bucket for c in counts]


def _figure() -> tuple[Any, Any]:
    """A new figure and its axes, drawn off screen (Agg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(10, 4.5))


def _save(fig: Any, ax: Any, title: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_replicas(runs: Sequence[Run], path: Path, title: str) -> None:
    fig, ax = _figure()
    for run in runs:
        xs, ys = [], []
        for (t, _desired, loading, ready, draining) in run.timeline:
            if xs:
                xs.append(t / 60)
                ys.append(ys[-1])
            xs.append(t / 60)
            ys.append(loading + ready + draining)
        ax.plot(xs, ys, label=run.policy, linewidth=1.2)
    ax.set_xlabel("minutes")
    ax.set_ylabel("replicas (loading + ready + draining)")
    if runs:
        twin = ax.twinx()
        xs, rate = _arrival_rate(runs[0], 60.0)
        twin.fill_between([x / 60 for x in xs], rate, step="post", alpha=0.15, color="grey", label="load")
        twin.set_ylabel("arrivals per second (grey)")
    _save(fig, ax, title, path)


def plot_latency(runs: Sequence[Run], path: Path, title: str, slo_ms: float) -> None:
    fig, ax = _figure()
    for run in runs:
        buckets: dict[int, list[float]] = {}
        for r, f, d in zip(run.requests, run.finish, run.dropped):
            if not d and not math.isnan(f):
                buckets.setdefault(int(r.arrival // 60), []).append((f - r.arrival) * 1000)
        xs = sorted(buckets)
        ys = []
        for b in xs:
            v = sorted(buckets[b])
            ys.append(v[max(0, math.ceil(0.99 * len(v)) - 1)])
        ax.plot(xs, ys, label=run.policy, linewidth=1.2)
    ax.axhline(slo_ms, color="black", linestyle="--", linewidth=0.8, label="SLO")
    ax.set_yscale("log")
    ax.set_xlabel("minutes (by arrival)")
    ax.set_ylabel("p99 latency per minute, ms")
    _save(fig, ax, title, path)


def write_report(directory: Path, runs: Sequence[Run], summaries: Sequence[Summary], title: str,
                 details: str) -> list[str]:
    """report.md and, with matplotlib, replicas.png and latency.png; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    plots = have_matplotlib()
    if plots:
        plot_replicas(runs, directory / "replicas.png", title)
        plot_latency(runs, directory / "latency.png", title, summaries[0].slo_ms if summaries else 0)
        written += ["replicas.png", "latency.png"]
    lines = [f"# {title}", "", details, "", markdown_table(list(summaries)), ""]
    if plots:
        lines += ["![replicas and load](replicas.png)", "", "![p99 latency per minute](latency.png)", ""]
    else:
        lines += [f"({PLOTS_HINT})", ""]
    (directory / "report.md").write_text("\n".join(lines))
    written.insert(0, "report.md")
    return written
