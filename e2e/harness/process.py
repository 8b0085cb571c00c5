"""One process lifecycle for the harness's servers (Prometheus, tritonserver): the command
started in a process group of its own with its output appended to a log file, readiness polled
while the process lives, and a stop that ends the whole group and closes the log."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Callable

from . import stop_process_group, tail


class ServerProcess:
    """The process half of a harness server; the subclass says what the process is (`name`, for
    messages), which error it raises (`error`) and when it is ready (its `wait_ready`)."""

    name = "the process"
    error: type[Exception] = RuntimeError

    def __init__(self, log_dir: str | os.PathLike | None = None) -> None:
        log_dir = log_dir or os.environ.get("E2E_LOG_DIR")
        self._log_dir = Path(log_dir) if log_dir else None
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.startup_seconds: float | None = None
        self._log_file = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _spawn(self, cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        """Starts `cmd` in its own process group (stop ends its children too), appending its
        output to `self.log_path` after the command line."""
        assert self.log_path is not None
        self._log_file = open(self.log_path, "ab")
        self._log_file.write(f"$ {' '.join(cmd)}\n".encode())
        self._log_file.flush()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     env=env, cwd=cwd, start_new_session=True)

    def _start_and_wait(self, cmd: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> None:
        """_spawn, then wait_ready; the time it took is `startup_seconds`. A process that does not
        become ready is stopped and the error raised."""
        started = time.monotonic()
        self._spawn(cmd, cwd, env)
        try:
            self.wait_ready(timeout)
        except self.error:
            self._terminate()
            raise
        self.startup_seconds = time.monotonic() - started

    def wait_ready(self, timeout: float) -> None:
        raise NotImplementedError

    def _wait_until(self, ready: Callable[[], bool], timeout: float, log_lines: int = 40) -> None:
        """Polls `ready` every 0.1 s while the process lives; raises `error` with the log's tail
        when it exits first or `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None:
                raise self.error(f"{self.name} is not started")
            rc = self.proc.poll()
            if rc is not None:
                raise self.error(f"{self.name} exited with code {rc} before it was ready; log {self.log_path}:\n"
                                 + tail(self.log_path, log_lines))
            if ready():
                return
            if time.monotonic() > deadline:
                raise self.error(f"{self.name} not ready after {timeout:.0f}s; log {self.log_path}:\n"
                                 + tail(self.log_path, log_lines))
            time.sleep(0.1)

    def kill(self) -> None:
        """Kills the process abruptly (SIGKILL), like a crashed pod; start() brings it back."""
        self._terminate(kill=True)

    def _terminate(self, timeout: float = 15.0, kill: bool = False) -> None:
        """SIGTERM (SIGKILL with `kill`) to the process group, SIGKILL to what is left after
        `timeout`; the log is closed."""
        if self.proc is not None:
            stop_process_group(self.proc, timeout=timeout, kill=kill)
            self.proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __del__(self) -> None:  # last resort; tests should stop what they start
        try:
            if self.running():
                self._terminate(timeout=5)
        except Exception:
            pass
