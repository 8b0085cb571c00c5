"""A real Prometheus for the end-to-end tests.

``Prometheus`` runs the binary that ``hack/install-prometheus.sh`` caches (Debian's build) on a
free 127.0.0.1 port, scraping a list of targets every second (scrape and evaluation interval 1s).
Each target carries static labels, e.g. ``namespace``, ``service`` and ``pod``, so a Triton
server stands for one pod of one InferenceService exactly as the operator's queries expect.

The port and the TSDB folder are kept across ``stop()`` / ``start()``: a test can stop (or
``kill()``) Prometheus to simulate an outage and bring the same instance back with its data.
``close()`` (or leaving the context manager) stops it and removes its temporary folder. Its log
goes to ``log_dir`` (default ``$E2E_LOG_DIR``) when given, else into that temporary folder.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from . import REPO_ROOT, free_port, http_ok
from .process import ServerProcess

INSTALL_SCRIPT = REPO_ROOT / "hack" / "install-prometheus.sh"

_install_lock = threading.Lock()
_binary: str | None = None


def ensure_prometheus() -> str:
    """Runs hack/install-prometheus.sh once per process; returns the binary's path."""
    global _binary
    with _install_lock:
        if _binary is None:
            out = subprocess.run(
                ["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=600, check=False
            )
            path = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
            if out.returncode != 0 or not Path(path).is_file():
                raise RuntimeError(f"{INSTALL_SCRIPT} failed ({out.returncode}):\n{out.stderr}")
            _binary = path
        return _binary


@dataclass
class Target:
    """One scrape target: ``host:port`` (and metrics path) plus its static labels."""

    address: str
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics_path: str = "/metrics"


class PrometheusError(RuntimeError):
    pass


class Prometheus(ServerProcess):
    """A real Prometheus on 127.0.0.1 scraping ``targets`` every ``scrape_interval``.

    >>> prom = Prometheus([Target(triton.metrics_address,
    ...                           {"namespace": "default", "service": "slow", "pod": "slow-0"})])
    >>> with prom:
    ...     prom.query('nv_inference_pending_request_count{service="slow"}')

    ``targets`` are :class:`Target` objects, dicts with ``address`` and ``labels`` keys, or plain
    ``host:port`` strings. ``recording_rules`` maps a record name to its PromQL expression;
    ``rule_groups`` are further rule groups in Prometheus's own format (e.g. a PrometheusRule's
    ``spec.groups``: recording and alerting rules), kept as given.
    ``scrape_configs`` are further scrape configs in Prometheus's own format (dicts), kept as
    given, e.g. one with ``relabel_configs`` from :mod:`.podmonitor`.
    """

    name = "Prometheus"
    error = PrometheusError

    def __init__(
        self,
        targets: Iterable[Target | Mapping[str, Any] | str] = (),
        *,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        recording_rules: Mapping[str, str] | None = None,
        rule_groups: Iterable[Mapping[str, Any]] = (),
        scrape_configs: Iterable[Mapping[str, Any]] = (),
        job_name: str = "triton",
        log_dir: str | Path | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        self.targets = [_as_target(t) for t in targets]
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.recording_rules = dict(recording_rules or {})
        self.rule_groups = [dict(g) for g in rule_groups]
        self.extra_scrape_configs = [dict(c) for c in scrape_configs]
        self.job_name = job_name
        self.startup_timeout = startup_timeout
        self.host = "127.0.0.1"
        self.port = 0
        self.workdir: Path | None = None
        self.version: str | None = None
        super().__init__(log_dir)

    # ----------------------------------------------------------------------------- paths
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "prometheus.yml"

    @property
    def rules_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "rules.yml"

    @property
    def data_dir(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "data"

    # ----------------------------------------------------------------------------- config
    def render_config(self) -> str:
        """prometheus.yml (JSON is valid YAML, so no YAML library is needed)."""
        config: dict[str, Any] = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "scrape_configs": [
                {
                    "job_name": self.job_name,
                    "metrics_path": path,
                    "static_configs": [
                        {"targets": [t.address], "labels": dict(t.labels)}
                        for t in self.targets
                        if t.metrics_path == path
                    ],
                }
                for path in sorted({t.metrics_path for t in self.targets}) or ["/metrics"]
            ],
        }
        if len(config["scrape_configs"]) > 1:
            for i, sc in enumerate(config["scrape_configs"]):
                sc["job_name"] = f"{self.job_name}-{i}"
        config["scrape_configs"] += self.extra_scrape_configs
        if self.recording_rules or self.rule_groups:
            config["rule_files"] = [str(self.rules_path)]
        return json.dumps(config, indent=2) + "\n"

    def render_rules(self) -> str:
        rules = [{"record": name, "expr": expr} for name, expr in self.recording_rules.items()]
        groups = [{"name": "e2e", "interval": self.evaluation_interval, "rules": rules}] if rules else []
        return json.dumps({"groups": groups + self.rule_groups}, indent=2) + "\n"

    def _write_config(self) -> None:
        assert self.workdir is not None
        if self.recording_rules or self.rule_groups:
            _atomic_write(self.rules_path, self.render_rules())
        _atomic_write(self.config_path, self.render_config())

    def set_targets(self, targets: Iterable[Target | Mapping[str, Any] | str]) -> None:
        """Replaces the targets; a running Prometheus reloads its config (SIGHUP)."""
        self.targets = [_as_target(t) for t in targets]
        self._reload()

    def set_recording_rules(self, rules: Mapping[str, str]) -> None:
        self.recording_rules = dict(rules)
        self._reload()

    def _reload(self) -> None:
        if self.workdir is None:
            return
        self._write_config()
        if self.running():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGHUP)
            want = {t.address for t in self.targets}
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    got = {t["discoveredLabels"].get("__address__") for t in self.active_targets()}
                    if got == want:
                        return
                except (PrometheusError, OSError):
                    pass
                time.sleep(0.1)
            raise PrometheusError(f"Prometheus did not reload its targets to {sorted(want)}")

    # ----------------------------------------------------------------------------- lifecycle
    def start(self, wait: bool = True, timeout: float | None = None) -> "Prometheus":
        """Starts Prometheus (again): same port and data folder as any earlier start."""
        if self.running():
            return self
        binary = ensure_prometheus()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="prometheus-e2e-"))
            self.data_dir.mkdir()
        if self.version is None:
            v = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
            first = (v.stdout or v.stderr).splitlines()[0] if (v.stdout or v.stderr) else ""
            self.version = first.split("version", 1)[-1].split()[0] if "version" in first else first
        self._write_config()
        if not self.port:
            self.port = free_port(self.host)
        log_dir = self._log_dir or self.workdir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"prometheus-{self.port}.log"
        cmd = [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            "--storage.tsdb.retention.time=1d",
            f"--web.listen-address={self.address}",
            "--web.enable-lifecycle",
            "--log.level=info",
        ]
        if wait:
            self._start_and_wait(cmd, self.workdir, timeout or self.startup_timeout)
        else:
            self._spawn(cmd, self.workdir)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Waits until /-/ready answers 200 (the TSDB is open and the API serves)."""
        self._wait_until(lambda: http_ok(f"{self.url}/-/ready"), timeout)

    def stop(self, timeout: float = 15.0) -> None:
        """Stops Prometheus cleanly (SIGTERM, then SIGKILL); port and data stay for start()."""
        self._terminate(timeout)

    def close(self) -> None:
        """Stops Prometheus and removes its temporary folder (config and data)."""
        self._terminate()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> "Prometheus":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------------------- API
    def api(self, path: str, params: Mapping[str, Any] | None = None, timeout: float = 10.0) -> Any:
        """GET /api/v1/<path>; returns ``data`` of a successful answer, raises otherwise."""
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=timeout) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # 400/422/503 carry a JSON error body
            try:
                body = json.load(e)
            except Exception:
                raise PrometheusError(f"{path}: HTTP {e.code}") from e
        if body.get("status") != "success":
            raise PrometheusError(f"{path}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query: the result list, each ``{"metric": {...}, "value": [ts, "v"]}``.

        Raises :class:`PrometheusError` on a bad query and ``OSError`` (URLError) when
        Prometheus is down.
        """
        params: dict[str, Any] = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", params)
        if data.get("resultType") == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_values(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query as (labels, float value) pairs."""
        return [(r["metric"], float(r["value"][1])) for r in self.query(promql)]

    def query_range(self, promql: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        data = self.api("query_range", {"query": promql, "start": start, "end": end, "step": step})
        return data["result"]

    def active_targets(self) -> list[dict[str, Any]]:
        return self.api("targets", {"state": "active"})["activeTargets"]

    def wait_for(
        self,
        promql: str,
        predicate: Callable[[list[tuple[dict[str, str], float]]], bool] = bool,
        timeout: float = 30.0,
        interval: float = 0.5,
    ) -> list[tuple[dict[str, str], float]]:
        """Polls ``promql`` until ``predicate(query_values(...))`` holds; returns those values."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            try:
                last = self.query_values(promql)
                if predicate(last):
                    return last
            except (PrometheusError, OSError) as e:
                last = e
            if time.monotonic() > deadline:
                raise TimeoutError(f"{promql!r} did not satisfy the condition in {timeout:.0f}s; last: {last!r}")
            time.sleep(interval)

    def wait_targets_up(self, timeout: float = 30.0) -> None:
        """Waits until every target has been scraped successfully at least once."""
        n = len(self.targets)
        self.wait_for(f'up{{job=~"{self.job_name}.*"}} == 1', lambda v: len(v) >= n, timeout=timeout)


def _as_target(t: Target | Mapping[str, Any] | str) -> Target:
    if isinstance(t, Target):
        return t
    if isinstance(t, str):
        return Target(t)
    return Target(
        address=t["address"], labels=dict(t.get("labels", {})), metrics_path=t.get("metrics_path", "/metrics")
    )


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
