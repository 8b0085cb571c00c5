"""make bench-standby: a standby operator replica probed for 10 minutes while the leader holds the
lease, then the leader killed: with replicaCount 2 a standby stays Running without restarts for
10 minutes, and a killed leader is replaced within the lease time.

Runs e2e/test_leader.py::test_one_replica_leads_and_a_follower_takes_over_when_it_dies with
E2E_STANDBY_SECONDS=600 on a local kwok cluster: two operator processes with the chart's own
arguments, the chart's liveness/readiness probe applied to the standby every 2 s (the chart
probes every 10 s; a kubelet restarts a container after failureThreshold failures in a row).
Writes bench/results/standby.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from common import ROOT, machine

TEST = "e2e/test_leader.py::test_one_replica_leads_and_a_follower_takes_over_when_it_dies"


def main() -> int:
    seconds = int(os.environ.get("E2E_STANDBY_SECONDS", "600"))
    env = {**os.environ, "E2E_STANDBY_SECONDS": str(seconds),
           "E2E_CLUSTER_NAME": os.environ.get("E2E_CLUSTER_NAME", "bench-standby")}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()[0]
    out = subprocess.run([sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", TEST],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=seconds + 900)
    figures = list(dict.fromkeys(line.strip() for line in out.stdout.splitlines()
                                 if re.match(r"\s*(standby probed|failover after)", line)))
    verdict = "passed" if out.returncode == 0 else f"FAILED (pytest exit {out.returncode})"
    text = f"""# Standby soak

Command: `make bench-standby` (python bench/standby.py; E2E_STANDBY_SECONDS={seconds}).
Date: {started}. Machine: {machine()}; load average at start {load:.1f}, at the end {os.getloadavg()[0]:.1f}.

`{TEST}` {verdict}:

""" + "\n".join(f"- {f}" for f in figures) + "\n"
    if out.returncode != 0:
        text += f"\n```\n{out.stdout[-3000:]}\n```\n"
    (ROOT / "bench" / "results" / "standby.md").write_text(text)
    print(text)
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
