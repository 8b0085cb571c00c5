#!/usr/bin/env python3
"""Recompute a simulation's figures from its files alone: `simulate --requests-out R.csv
--replicas-out P.csv` (one pair per policy), then

    python bench/recompute.py --requests R.csv --replicas P.csv --slo-ms 8000

prints requests, SLO attainment and violations (a request meets the SLO when finish - arrival <=
the SLO; a dropped request, with no finish, does not), GPU-hours (every pod from created to
stopped, times its GPUs) and scale events (each scale-up creates pods and each scale-down deletes
pods at the moment of the decision, so the distinct creation times of the pods the run did not
start with, plus the distinct deletion times, are the decisions that changed the replica count).
No simulator code is imported: the figures come from the CSVs."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path


def slo_figures(requests_csv: Path, slo_ms: float) -> dict[str, float]:
    n = within = 0
    with requests_csv.open(newline="") as f:
        for row in csv.DictReader(f):
            n += 1
            if row["finish"] and (float(row["finish"]) - float(row["arrival"])) * 1000.0 <= slo_ms:
                within += 1
    return {"requests": n, "slo_attainment": within / n if n else 1.0, "slo_violations": n - within}


def replica_figures(replicas_csv: Path) -> dict[str, float]:
    gpu_seconds = 0.0
    changes: set[float] = set()
    with replicas_csv.open(newline="") as f:
        for row in csv.DictReader(f):
            created, stopped = float(row["created"]), float(row["stopped"])
            gpu_seconds += (stopped - created) * int(row["gpus"])
            initial = created == 0.0 and row["ready"] != "" and float(row["ready"]) == 0.0
            if not initial:
                changes.add(created)
            if row["deleted"]:
                changes.add(float(row["deleted"]))
    return {"gpu_hours": gpu_seconds / 3600.0, "scale_events": len(changes)}


def recompute(requests_csv: Path, replicas_csv: Path, slo_ms: float) -> dict[str, float]:
    return {**slo_figures(requests_csv, slo_ms), **replica_figures(replicas_csv)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", required=True, help="a --requests-out CSV")
    p.add_argument("--replicas", required=True, help="the --replicas-out CSV of the same run")
    p.add_argument("--slo-ms", type=float, required=True, help="the SLO the run was measured against")
    args = p.parse_args(argv)
    try:
        figures = recompute(Path(args.requests), Path(args.replicas), args.slo_ms)
    except (OSError, KeyError, ValueError) as e:
        print(f"recompute: {e}", file=sys.stderr)
        return 2
    json.dump(figures, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
