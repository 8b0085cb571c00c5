"""A real Triton Inference Server for the end-to-end tests.

``TritonServer`` runs the ``tritonserver`` bundled in the ``nvidia-pytriton`` wheel (prepared by
``hack/install-triton.sh``, which this module runs itself) on three free loopback ports, with a
generated model repository holding one Python-backend model (default name ``slow``):

- input ``INPUT0`` / output ``OUTPUT0``, FP32, shape ``[-1]``; the output echoes the input;
- every request sleeps ``delay_ms`` (a config.pbtxt parameter) before it answers; the model
  re-reads the delay from a file on each execute, so :meth:`TritonServer.set_delay_ms` makes it
  slower or faster while the server runs;
- ``max_batch_size: 0`` (no batching) and one CPU instance: concurrent requests wait in Triton's
  scheduler queue, so ``nv_inference_pending_request_count`` rises above 0 under load.

Triton is started with ``--metrics-config summary_latencies=true`` so the per-model
``nv_inference_request_summary_us{quantile="0.5"|"0.9"|"0.99"}`` summaries exist.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from . import REPO_ROOT, free_port, http_ok, port_open, tail
from .process import ServerProcess

INSTALL_SCRIPT = REPO_ROOT / "hack" / "install-triton.sh"

_install_lock = threading.Lock()
_install_env: dict[str, str] | None = None


def ensure_tritonserver() -> dict[str, str]:
    """Runs hack/install-triton.sh once per process; returns what it printed (KEY=VALUE)."""
    global _install_env
    with _install_lock:
        if _install_env is None:
            out = subprocess.run(
                ["bash", str(INSTALL_SCRIPT)],
                check=False,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if out.returncode != 0:
                raise RuntimeError(f"{INSTALL_SCRIPT} failed ({out.returncode}):\n{out.stderr}")
            env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
            missing = {"TRITONSERVER", "BACKEND_DIR", "LD_LIBRARY_PATH", "SITE_PACKAGES"} - env.keys()
            if missing:
                raise RuntimeError(f"{INSTALL_SCRIPT} did not print {sorted(missing)}:\n{out.stdout}")
            _install_env = env
        return dict(_install_env)


# The model. It reads its parameters once, then the delay file (when set) on every execute, so a
# test changes the service time by rewriting that file; a missing or unreadable file means the
# configured delay_ms. The stub embeds Python in isolated mode (PYTHONPATH is ignored), so the
# venv's site-packages, where numpy is, is added here; {site_dirs} is filled in by model_py().
MODEL_PY = '''\
import json
import site
import time

for _dir in {site_dirs}:
    site.addsitedir(_dir)

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.default_delay_ms = float(params.get("delay_ms") or 0)
        self.delay_file = params.get("delay_file") or ""

    def _delay_s(self):
        if self.delay_file:
            try:
                with open(self.delay_file) as f:
                    return max(0.0, float(f.read().strip())) / 1000.0
            except (OSError, ValueError):
                pass
        return self.default_delay_ms / 1000.0

    def execute(self, requests):
        responses = []
        for request in requests:
            delay = self._delay_s()
            if delay:
                time.sleep(delay)
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", data.astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses

    def finalize(self):
        pass
'''


def model_py(site_dirs: list[str]) -> str:
    return MODEL_PY.replace("{site_dirs}", repr(list(site_dirs)))


def model_config(name: str, delay_ms: float, delay_file: str | None, instances: int = 1) -> str:
    """config.pbtxt of the slow model (see the module docstring)."""
    params = [f'  {{ key: "delay_ms" value: {{ string_value: "{delay_ms:g}" }} }}']
    if delay_file:
        params.append(f'  {{ key: "delay_file" value: {{ string_value: {json.dumps(delay_file)} }} }}')
    return f"""\
name: "{name}"
backend: "python"
max_batch_size: 0
input [
  {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }}
]
output [
  {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }}
]
instance_group [
  {{ count: {instances}, kind: KIND_CPU }}
]
parameters [
{(","+chr(10)).join(params)}
]
"""


class TritonServer(ServerProcess):
    """A real tritonserver on 127.0.0.1, serving one slow Python-backend model.

    >>> with TritonServer(model_name="slow", delay_ms=200) as triton:
    ...     triton.grpc_address      # "127.0.0.1:PORT", what tritonclient.grpc wants
    ...     triton.set_delay_ms(500) # takes effect on the next request, no restart
    ...     triton.metrics_text()    # the Prometheus text from /metrics

    ``start()`` waits until the server and the model are ready unless ``wait=False``; a server
    that does not get ready is stopped and the error carries the tail of its log. Output
    (stdout and stderr) goes to ``log_path``: in ``log_dir`` (default ``$E2E_LOG_DIR``), where it
    stays, or else in the temporary folder that ``stop()`` removes.
    """

    name = "tritonserver"

    def __init__(
        self,
        model_name: str = "slow",
        delay_ms: float = 0,
        *,
        instances: int = 1,
        metrics_interval_ms: int = 250,
        log_dir: str | os.PathLike | None = None,
        extra_args: list[str] | tuple[str, ...] = (),
        startup_timeout: float = 120.0,
        repository: str | os.PathLike | None = None,
    ) -> None:
        self.model_name = model_name
        # A ready model repository to serve instead of the generated one (then delay_ms does nothing).
        self._repository = Path(repository) if repository else None
        self.delay_ms = delay_ms
        self.instances = instances
        self.metrics_interval_ms = metrics_interval_ms
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.host = "127.0.0.1"
        self.http_port = self.grpc_port = self.metrics_port = 0
        self.workdir: Path | None = None
        self._shm_prefix = ""
        super().__init__(log_dir)

    # ----------------------------------------------------------------------------- addresses
    @property
    def http_address(self) -> str:
        """host:port of the HTTP endpoint (what tritonclient.http wants as url)."""
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        """host:port of the gRPC endpoint (what tritonclient.grpc wants as url)."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_address(self) -> str:
        """host:port of the metrics endpoint (a Prometheus scrape target)."""
        return f"{self.host}:{self.metrics_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.http_address}"

    @property
    def grpc_url(self) -> str:
        return f"grpc://{self.grpc_address}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.metrics_address}/metrics"

    @property
    def model_repository(self) -> Path:
        if self._repository is not None:
            return self._repository
        assert self.workdir is not None, "not started"
        return self.workdir / "models"

    @property
    def delay_file(self) -> Path:
        assert self.workdir is not None, "not started"
        return self.workdir / "delay_ms"

    # ----------------------------------------------------------------------------- lifecycle
    def start(self, wait: bool = True, timeout: float | None = None) -> "TritonServer":
        if self.running():
            return self
        env_info = ensure_tritonserver()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="triton-e2e-"))
            if self._repository is None:
                self._write_repository([env_info["SITE_PACKAGES"]])
        log_dir = self._log_dir or self.workdir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"tritonserver-{self.model_name}-{os.getpid()}-{uuid.uuid4().hex[:6]}.log"

        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = ":".join(
            p for p in (env_info["LD_LIBRARY_PATH"], os.environ.get("LD_LIBRARY_PATH", "")) if p
        )
        # The stub embeds the libpython found through LD_LIBRARY_PATH; its stdlib must be that
        # interpreter's own.
        env.pop("PYTHONHOME", None)

        # Free ports are picked before tritonserver binds them: on the rare collision, pick
        # again. A restart (start() after kill()) keeps its ports, as a Prometheus target must:
        # there a collision is waited out instead.
        restart = bool(self.http_port)
        attempts = 10 if restart else 3
        for attempt in range(1, attempts + 1):
            if not restart:
                self.http_port, self.grpc_port, self.metrics_port = _three_free_ports()
            self._shm_prefix = f"triton_e2e_{uuid.uuid4().hex[:10]}_"
            cmd = [
                env_info["TRITONSERVER"],
                "--model-repository", str(self.model_repository),
                "--backend-directory", env_info["BACKEND_DIR"],
                "--http-address", self.host, "--http-port", str(self.http_port),
                "--grpc-address", self.host, "--grpc-port", str(self.grpc_port),
                "--metrics-address", self.host, "--metrics-port", str(self.metrics_port),
                "--allow-metrics", "true",
                "--allow-gpu-metrics", "false",
                "--metrics-interval-ms", str(self.metrics_interval_ms),
                "--metrics-config", "summary_latencies=true",
                "--strict-readiness", "true",
                "--exit-on-error", "true",
                "--exit-timeout-secs", "5",
                "--backend-config", f"python,shm-region-prefix-name={self._shm_prefix}",
                "--log-info", "true",
                *self.extra_args,
            ]
            if not wait:
                self._spawn(cmd, self.workdir, env)
                return self
            try:
                self._start_and_wait(cmd, self.workdir, timeout or self.startup_timeout, env)
            except RuntimeError:
                if attempt < attempts and _port_collision(tail(self.log_path, 400)):
                    if restart:
                        time.sleep(1)
                    continue
                self.stop()  # no stray process or temporary folder; the error has the log
                raise
            return self
        raise AssertionError("unreachable")

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Waits until /v2/health/ready and the model's ready endpoint both answer 200."""
        urls = [f"{self.http_url}/v2/health/ready", f"{self.http_url}/v2/models/{self.model_name}/ready"]
        self._wait_until(lambda: all(http_ok(u) for u in urls), timeout, log_lines=60)

    def stop(self, timeout: float = 15.0) -> None:
        """Terminates the server (then kills what is left) and removes its temporary files.

        A later start() is a new server: new ports, a fresh model repository."""
        self._terminate(timeout)
        self.http_port = self.grpc_port = self.metrics_port = 0
        if self.workdir is not None:
            if self._log_dir is None:
                # The log lived in the work dir; keep nothing.
                self.log_path = None
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def _terminate(self, timeout: float = 15.0, kill: bool = False) -> None:
        """As ServerProcess's, and the Python backend's shared memory is removed. After kill(),
        start() brings the server back on the same ports with the same model repository (and
        current delay)."""
        super()._terminate(timeout, kill)
        self._remove_shm()

    def _remove_shm(self) -> None:
        # A killed server leaves its Python-backend shared-memory regions in /dev/shm; ours are
        # recognisable by the unique prefix given to the backend.
        if not self._shm_prefix:
            return
        shm = Path("/dev/shm")
        if shm.is_dir():
            for p in shm.glob(self._shm_prefix + "*"):
                try:
                    p.unlink()
                except OSError:
                    pass

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ----------------------------------------------------------------------------- the model
    def _write_repository(self, site_dirs: list[str]) -> None:
        model_dir = self.model_repository / self.model_name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "1" / "model.py").write_text(model_py(site_dirs))
        (model_dir / "config.pbtxt").write_text(
            model_config(self.model_name, self.delay_ms, str(self.delay_file), self.instances)
        )
        self.set_delay_ms(self.delay_ms)

    def set_delay_ms(self, delay_ms: float) -> None:
        """Sets the model's per-request service time; the next execute uses it (no restart)."""
        self.delay_ms = delay_ms
        if self.workdir is None:
            return  # written into config.pbtxt and the delay file at start()
        tmp = self.delay_file.with_suffix(".tmp")
        tmp.write_text(f"{delay_ms:g}\n")
        os.replace(tmp, self.delay_file)  # atomic: the model never reads half a number

    # ----------------------------------------------------------------------------- metrics
    def metrics_text(self, timeout: float = 5.0) -> str:
        """The Prometheus exposition text of /metrics."""
        with urllib.request.urlopen(self.metrics_url, timeout=timeout) as r:
            return r.read().decode()

    def metric_samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """Samples of one metric from /metrics as (labels, value), e.g. 'nv_inference_count'."""
        return [(labels, value) for n, labels, value in parse_metrics(self.metrics_text()) if n == name]


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """A small parser for Triton's exposition text: (name, labels, value) per sample line."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            body, value = rest.rsplit("}", 1)
            labels = {}
            for part in _split_labels(body):
                k, v = part.split("=", 1)
                labels[k.strip()] = v.strip().strip('"')
        else:
            name, value = line.split(None, 1)
            labels = {}
        samples.append((name.strip(), labels, float(value.split()[0])))
    return samples


def _split_labels(body: str) -> list[str]:
    parts, cur, quoted = [], "", False
    for ch in body:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            if cur:
                parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def _port_collision(log: str) -> bool:
    log = log.lower()
    return "address already in use" in log or "already in use" in log or "failed to bind" in log


def _three_free_ports() -> tuple[int, int, int]:
    ports: set[int] = set()
    while len(ports) < 3:
        p = free_port()
        if not port_open("127.0.0.1", p):
            ports.add(p)
    a, b, c = sorted(ports)
    return a, b, c


