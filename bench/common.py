"""What the benchmarks share: a fresh local cluster with the chart installed, the operator run as
the chart's ServiceAccount, and a description of the machine for the results."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2e.harness import free_port  # noqa: E402
from triton_operator.api.kinds import OWN_KINDS  # noqa: E402
from triton_operator.kube.client import Kube  # noqa: E402

RELEASE, RELEASE_NS, SA = "triton-operator", "triton-system", "triton-operator"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(*args: str, env: dict[str, str] | None = None, input: str | None = None, check: bool = True) -> str:
    out = subprocess.run(list(args), capture_output=True, text=True, env=env, input=input, timeout=900)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} failed: {out.stderr[-2000:]}")
    return out.stdout


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1)]


class Cluster:
    """hack/cluster.sh's cluster, fresh, with the chart (CRDs, RBAC, ServiceAccount; no operator
    pod: replicaCount 0) and the example GPUClasses."""

    def __init__(self, name: str):
        self.name = name
        bin_dir = sh(str(ROOT / "hack" / "install-tools.sh")).strip()
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        sh(str(ROOT / "hack" / "cluster.sh"), "down", name, env=self.env, check=False)
        log(f"starting cluster {name}")
        self.kubeconfig = sh(str(ROOT / "hack" / "cluster.sh"), "up", name, env=self.env).strip().splitlines()[-1]
        self.env["KUBECONFIG"] = self.kubeconfig
        self.work = Path(self.kubeconfig).parent
        self.audit_log = Path(sh(str(ROOT / "hack" / "cluster.sh"), "audit-log", name, env=self.env).strip())

    def install(self) -> None:
        sh("helm", "upgrade", "--install", RELEASE, str(ROOT / "charts" / "triton-operator"), "-n", RELEASE_NS,
           "--create-namespace", "--set", "replicaCount=0", "--wait", "--timeout", "120s", env=self.env)
        sh("kubectl", "apply", "--server-side", "-f", str(ROOT / "examples" / "gpuclasses.yaml"), env=self.env)

    def kubectl(self, *args: str, input: str | None = None) -> str:
        return sh("kubectl", *args, env=self.env, input=input)

    def admin(self, field_manager: str = "bench") -> Kube:
        cfg = client.Configuration()
        config.load_kube_config(config_file=self.kubeconfig, client_configuration=cfg)
        return Kube(field_manager, cfg, qps=10_000, burst=10_000, pool_size=64, kinds=OWN_KINDS)

    def service_account_kubeconfig(self) -> str:
        token = self.kubectl("create", "token", SA, "-n", RELEASE_NS, "--duration=6h").strip()
        view = yaml.safe_load(self.kubectl("config", "view", "--minify", "--raw", "-o", "yaml"))
        path = self.work / "operator.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "op",
            "clusters": [{"name": "local", "cluster": view["clusters"][0]["cluster"]}],
            "users": [{"name": "op", "user": {"token": token}}],
            "contexts": [{"name": "op", "context": {"cluster": "local", "user": "op"}}]}))
        path.chmod(0o600)
        return str(path)

    def operator(self) -> "OperatorProcess":
        return OperatorProcess(self.env, self.service_account_kubeconfig(), self.work / "operator.log")

    def down(self) -> None:
        sh(str(ROOT / "hack" / "cluster.sh"), "down", self.name, env=self.env, check=False)


class OperatorProcess:
    def __init__(self, env: dict[str, str], kubeconfig: str, log_path: Path):
        self.env, self.kubeconfig, self.log_path = env, kubeconfig, log_path
        self.port, self.metrics_port = free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    def start(self, **extra: str) -> None:
        env = {**self.env, "KUBECONFIG": self.kubeconfig, "TRITON_OPERATOR_METRICS_ADDRESS": "127.0.0.1",
               "TRITON_OPERATOR_METRICS_PORT": str(self.metrics_port), **extra}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "triton_operator", "run", "--liveness", f"http://127.0.0.1:{self.port}/healthz",
             "--leader-elect", "--leader-elect-namespace", RELEASE_NS],
            env=env, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited: {self.log_path.read_text()[-3000:]}")
            health = self.health()
            if health.get("synced"):
                return
            time.sleep(0.5)
        raise TimeoutError("operator did not sync its cache in 120 s")

    def health(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as r:
                return json.loads(r.read()).get("controller") or {}
        except (OSError, ValueError):
            return {}

    def metrics(self) -> dict[str, float]:
        """The operator's own metrics, summed over label sets by name+labels as text keys."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            out = {}
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    key, _, value = line.rpartition(" ")
                    out[key] = float(value)
            return out

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory_mib(self) -> tuple[float, float]:
        """(RSS, peak RSS) in MiB."""
        assert self.proc is not None
        status = {k: v for k, _, v in (line.partition(":") for line in
                                       Path(f"/proc/{self.proc.pid}/status").read_text().splitlines())}
        return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))) / 1024 / 1024
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, Python {platform.python_version()}, {platform.system()}"


