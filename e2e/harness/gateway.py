"""`triton-operator gateway` as a child process, and the EndpointSlices that point a service at a
local Triton (see e2e/test_gateway.py's module docstring for why they are needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from ..cluster import ROOT, ChildProcess, Cluster, wait_for
from . import free_port

SLICE_MANAGER = "e2e.triton-operator.io"
TRITON_HOST = "triton.e2e.invalid"   # a local Triton's name in the EndpointSlices


class GatewayProcess(ChildProcess):
    """`triton-operator gateway` as a child process, as a user would run it."""

    name = "gateway"

    def __init__(self, kubeconfig: str, keys: Path, log_dir: Path, namespace: str, args: list[str] | None = None,
                 env: dict[str, str] | None = None):
        self.kubeconfig, self.keys, self.namespace, self.args = kubeconfig, keys, namespace, list(args or [])
        self.env = env   # added to this process's environment (OTEL_* for the tracing test)
        self.port, self.metrics_port = free_port(), free_port()
        self.log_path = Path(os.environ.get("E2E_LOG_DIR") or log_dir) / f"gateway-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "triton_operator", "gateway", "--kubeconfig", self.kubeconfig,
             "--address", "127.0.0.1", "--port", str(self.port), "--metrics-port", str(self.metrics_port),
             "--key-file", str(self.keys), "--namespace", self.namespace, "--resolve", f"{TRITON_HOST}=127.0.0.1", "--hold-timeout", "90", "--shutdown-timeout", "2",
             "--endpoint-slice-selector", f"endpointslice.kubernetes.io/managed-by={SLICE_MANAGER}", *self.args],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **self.env} if self.env else None)
        try:
            wait_for("gateway ready", self.ready, timeout=60)
        except AssertionError as e:
            self.stop()  # never leave a process behind
            raise AssertionError(f"{e}; gateway log:\n{self.log_tail()}") from None

    def ready(self) -> bool:
        return self.answers(f"http://127.0.0.1:{self.metrics_port}/readyz")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                if all(f'{k}="{v}"' in line for k, v in labels.items()):
                    total += float(line.rsplit(" ", 1)[1])
        return total


class SliceMirror:
    """Stands in for the endpoint controller with pods that could serve (see the module): one
    EndpointSlice per service, one endpoint per ready replica, at that service's local Triton."""

    def __init__(self, cluster: Cluster, ports: dict[str, int], namespace: str):
        self.cluster, self.ports, self.namespace = cluster, ports, namespace
        self.stop_flag = threading.Event()
        self.applied: dict[str, int] = {}
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def stop(self) -> None:
        """Stop mirroring (the slices stay)."""
        self.stop_flag.set()
        if self.thread.is_alive():
            self.thread.join(10)

    def run(self) -> None:
        while not self.stop_flag.wait(0.3):
            try:
                self.sync()
            except (AssertionError, subprocess.TimeoutExpired) as e:  # the API server was busy: next round
                self.errors.append(str(e))

    def sync(self) -> None:
        for name, port in self.ports.items():
            dep = self.cluster.get("deployment", name, self.namespace)
            ready = int(((dep or {}).get("status") or {}).get("readyReplicas") or 0)
            if self.applied.get(name) == ready:
                continue
            self.cluster.apply({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": f"{name}-e2e", "namespace": self.namespace, "labels": {
                    "kubernetes.io/service-name": name, "endpointslice.kubernetes.io/managed-by": SLICE_MANAGER}},
                "addressType": "FQDN",
                "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
                "endpoints": [{"addresses": [TRITON_HOST], "conditions": {"ready": True}}] if ready else []})
            self.applied[name] = ready


