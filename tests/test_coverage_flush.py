"""`make test` counts the coverage of the operator process e2e runs: it must write its data file
when it is stopped with SIGTERM, as the e2e harness stops it.

The operator runs for real against an API server address where nothing listens (loopback):
kopf keeps retrying its startup, which is enough to have its signal handling in place."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import coverage

from .conftest import ROOT

KUBECONFIG = """\
apiVersion: v1
kind: Config
current-context: nowhere
clusters: [{name: nowhere, cluster: {server: "https://127.0.0.1:%d"}}]
users: [{name: nobody, user: {token: none}}]
contexts: [{name: nowhere, context: {cluster: nowhere, user: nobody}}]
"""


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: connecting is refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_operator_stopped_with_sigterm_writes_its_coverage_data(tmp_path):
    (tmp_path / "kubeconfig").write_text(KUBECONFIG % _closed_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_")}
    env.update({
        "KUBECONFIG": str(tmp_path / "kubeconfig"),
        # What `make test` hands to every child: the project's coverage configuration.
        "COVERAGE_PROCESS_START": str(ROOT / "pyproject.toml"),
        "COVERAGE_FILE": str(tmp_path / ".coverage"),
        "TRITON_OPERATOR_METRICS_PORT": "0",
    })
    log = tmp_path / "operator.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "triton_operator", "run"], env=env, cwd=tmp_path,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        # kopf's own log lines start once its reactor runs, and its SIGTERM handler with it.
        deadline = time.monotonic() + 60
        while not re.search(r"\] kopf\.", log.read_text(errors="replace")):
            assert proc.poll() is None, f"the operator exited early:\n{log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"no kopf log line in 60s:\n{log.read_text()[-2000:]}"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    (data_file,) = [p for p in tmp_path.glob(".coverage.*") if f".pid{proc.pid}." in p.name]
    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    measured = {os.path.relpath(f, ROOT): len(data.lines(f) or []) for f in data.measured_files()}
    assert measured.get(os.path.join("operator", "triton_operator", "cli.py"), 0) > 0, measured
    assert "Signal SIGTERM is received" in log.read_text()
