"""Drive a real cluster from tests: kubectl, the operator process, polling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from .harness import free_port

ROOT = Path(__file__).resolve().parent.parent


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 60, interval: float = 0.5) -> Any:
    """Poll until probe() returns something truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def model_cache(namespace: str, size: str = "100Gi") -> list[dict[str, Any]]:
    """The model cache a tensorrt-llm service's pods mount (the PVC `triton-models`), bound to a
    hostPath PersistentVolume that nothing on the kwok nodes mounts."""
    return [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"models-{namespace}"},
         "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "hostPath": {"path": f"/tmp/{namespace}"}, "claimRef": {"namespace": namespace, "name": "triton-models"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "triton-models", "namespace": namespace},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"models-{namespace}",
                  "resources": {"requests": {"storage": size}}}},
    ]


@dataclass
class Cluster:
    kubeconfig: str
    bin_dir: str | None

    @property
    def env(self) -> dict[str, str]:
        env = {**os.environ, "KUBECONFIG": self.kubeconfig}
        if self.bin_dir:
            env["PATH"] = f"{self.bin_dir}:{env['PATH']}"
        return env

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 90) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True,
                             env=self.env, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
        return out

    def established(self, *crds: str, seconds: float = 60.0) -> None:
        """Wait (bounded) until CRDs just applied are Established. `kubectl wait` fails at once,
        instead of waiting, while a CRD has no conditions yet ("<nil> is of the type <nil>"), so it
        is asked again."""
        deadline = time.monotonic() + seconds
        while True:
            done = self.kubectl("wait", "--for=condition=Established", "--timeout=10s", *crds, check=False, timeout=30)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{', '.join(crds)} not Established within {seconds:.0f}s: {done.stderr.strip()}")
            time.sleep(0.5)

    def apply(self, docs: dict[str, Any] | Iterable[dict[str, Any]], *args: str,
              check: bool = True) -> subprocess.CompletedProcess[str]:
        docs = [docs] if isinstance(docs, dict) else list(docs)
        return self.kubectl("apply", "-f", "-", *args, input=yaml.safe_dump_all(docs), check=check)

    def get(self, kind: str, name: str | None = None, namespace: str | None = None,
            selector: str | None = None, all_namespaces: bool = False) -> Any:
        args = ["get", kind, "-o", "json"]
        if name:
            args.insert(2, name)
        if namespace:
            args += ["-n", namespace]
        if all_namespaces:
            args.append("-A")
        if selector:
            args += ["-l", selector]
        out = self.kubectl(*args, check=False)
        if out.returncode != 0:
            if "NotFound" in out.stderr:
                return None
            raise AssertionError(out.stderr)
        data = json.loads(out.stdout)
        return data["items"] if not name else data

    def wait_ready(self, name: str, namespace: str, timeout: int = 120) -> None:
        """`kubectl wait --for=condition=Ready` on an InferenceService (see wait_condition)."""
        self.wait_condition(name, namespace, "Ready", timeout)

    def wait_condition(self, name: str, namespace: str, type_: str, timeout: int = 120) -> None:
        """`kubectl wait --for=condition=<type_>` on an InferenceService; when it times out, the
        failure says why: the service's conditions, its pods and Jobs, the namespace's events."""
        out = self.kubectl("wait", f"--for=condition={type_}", f"infsvc/{name}", "-n", namespace,
                           f"--timeout={timeout}s", timeout=timeout + 30, check=False)
        if out.returncode != 0:
            raise AssertionError(f"infsvc/{name} in {namespace} not {type_} within {timeout}s: {out.stderr.strip()}\n"
                                 f"{self.describe(name, namespace)}")

    def describe(self, name: str, namespace: str) -> str:
        """What a person would look at first when a service is stuck, as text."""
        isvc = self.get("infsvc", name, namespace) or {}
        lines = ["conditions:"] + [f"  {c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
                                   for c in (isvc.get("status") or {}).get("conditions") or []]
        lines.append("pods:")
        for pod in self.get("pods", namespace=namespace) or []:
            st = pod.get("status") or {}
            conds = ",".join(f"{c['type']}={c['status']}" for c in st.get("conditions") or [])
            states = ",".join(f"{c['name']}:{next(iter(c.get('state') or {'?': 0}))}"
                              for c in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []))
            lines.append(f"  {pod['metadata']['name']} {st.get('phase')} node={pod['spec'].get('nodeName')} "
                         f"created={pod['metadata'].get('creationTimestamp')} {conds} {states}")
        lines.append("jobs:")
        for job in self.get("jobs", namespace=namespace) or []:
            lines.append(f"  {job['metadata']['name']} created={job['metadata'].get('creationTimestamp')} "
                         f"{json.dumps(job.get('status') or {})}")
        events = self.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False).stdout
        lines.append("events:\n" + "\n".join(events.splitlines()[-25:]))
        return "\n".join(lines) + "\nGPUs used/allocatable per node:\n" + self.gpu_use()

    def gpu_use(self) -> str:
        """Each GPU node's `nvidia.com/gpu` held by pods that have not finished, of its allocatable."""
        used: dict[str, int] = {}
        for pod in self.get("pods", namespace=None, all_namespaces=True) or []:
            node = pod["spec"].get("nodeName")
            if node and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                used[node] = used.get(node, 0) + sum(
                    int(((c.get("resources") or {}).get("requests") or {}).get("nvidia.com/gpu", 0))
                    for c in pod["spec"]["containers"])
        return "\n".join(f"  {n['metadata']['name']} {used.get(n['metadata']['name'], 0)}/{gpus}"
                         for n in self.get("nodes") or []
                         if (gpus := (n.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu")))

    def condition(self, kind: str, name: str, namespace: str, type_: str) -> dict[str, Any] | None:
        obj = self.get(kind, name, namespace) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


class ChildProcess:
    """A command of ours run as a child process, as a user would run it (the operator, the
    gateway): an HTTP probe that fails loudly once the process has exited, a clean stop, its log."""

    name = "process"
    proc: subprocess.Popen[bytes] | None
    log_path: Path

    def answers(self, url: str) -> bool:
        """Whether `url` answers 200 (False while it does not answer); raises with the log when the
        process has exited."""
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited; log:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> bool:
        """SIGTERM, as the kubelet sends it, then SIGKILL after 20 s (within a pod's default 30 s
        grace period). Returns False when it took the SIGKILL: a defect, and its coverage data is
        lost."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                return False
        return True

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"


class Operator(ChildProcess):
    """`triton-operator run` as a child process, as a user would run it."""

    name = "operator"

    def __init__(self, cluster: Cluster, log_dir: Path, extra_env: dict[str, str] | None = None,
                 kubeconfig: str | None = None, args: list[str] | None = None):
        self.cluster = cluster
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.args = args or []
        self.port = free_port()
        self.metrics_port = free_port()
        self.log_path = log_dir / "operator.log"
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_offset = 0

    def start(self, wait: bool = True) -> None:
        """Start the process; with `wait`, until it works: its liveness endpoint answers and, when
        it is leader-elected, it leads (a standby answers the probe too, before it leads; a lease
        left by a process that died unclean is waited out)."""
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "triton_operator", "run", "--liveness",
             f"http://127.0.0.1:{self.port}/healthz", *self.args],
            env={**self.cluster.env, "KUBECONFIG": self.kubeconfig, "TRITON_OPERATOR_RESYNC_SECONDS": "3600",
                 "TRITON_OPERATOR_METRICS_ADDRESS": "127.0.0.1",
                 "TRITON_OPERATOR_METRICS_PORT": str(self.metrics_port), **self.extra_env},
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        if wait:
            if "--leader-elect" in self.args:
                wait_for("the operator to lead", self.leads, timeout=90)
            wait_for("operator liveness endpoint", self.healthy, timeout=60)

    def log_since_start(self) -> str:
        """What the current process wrote (the log file is appended to across restarts)."""
        with open(self.log_path, "rb") as f:
            f.seek(self.log_offset)
            return f.read().decode(errors="replace")

    def leads(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited; log:\n{self.log_tail()}")
        return "leading as" in self.log_since_start()

    def healthy(self) -> bool:
        return self.answers(f"http://127.0.0.1:{self.port}/healthz")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

