"""A real-process test harness for the end-to-end suites.

- :mod:`.triton` runs the real ``tritonserver`` bundled in the ``nvidia-pytriton`` wheel on
  loopback ports, serving a generated Python-backend model whose service time can be changed
  while it runs (so requests queue in Triton on demand).
- :mod:`.prometheus` runs a real Prometheus (Debian's build, fetched by
  ``hack/install-prometheus.sh``) scraping those servers every second, and can be stopped and
  started again on the same port and data to simulate an outage.
- :mod:`.loadgen` keeps N requests in flight through ``tritonclient``, bounded in time and count.

Every process is started on 127.0.0.1 only and stopped by ``stop()`` / the context manager.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

#: The repository root (``e2e/harness/__init__.py`` is two levels below it).
REPO_ROOT = Path(__file__).resolve().parents[2]


_handed: set[int] = set()
_pick = random.SystemRandom()


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago, below the kernel's ephemeral range and
    never handed out before by this process.

    Below the ephemeral range because between this call and the server binding the port, any
    process's outgoing connection may take a port from that range as its local port (the kernel's
    pick for port 0 is in it too): a ``make test`` run lost a gateway to "address already in use"
    that way. Picked at random, so processes of other runs rarely try the same port first."""
    top = _ephemeral_start()
    bottom = 15000 if top > 20000 else 1024
    for _ in range(500):
        port = _pick.randrange(bottom, top)
        if port in _handed:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:   # the low range is full: the kernel's pick
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """GET `url` answers 200 (an error status, a refused or reset connection: False)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:   # URLError and HTTPError among them
        return False


def group_members(pgid: int) -> list[int]:
    """Pids of the live processes in process group ``pgid`` (read from /proc)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # Field 2 (comm) is parenthesised and may hold spaces: split after its closing paren.
        fields = stat[stat.rfind(")") + 2 :].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def stop_process_group(proc: subprocess.Popen, timeout: float = 10.0, *, kill: bool = False) -> None:
    """Stops ``proc``, started with ``start_new_session=True``, and every process in its group.

    SIGTERM first (SIGKILL right away when ``kill``), SIGKILL to whatever is left after
    ``timeout`` seconds, and the leader is reaped. Only this group is signalled.
    """
    pgid = proc.pid
    sig = signal.SIGKILL if kill else signal.SIGTERM
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
    # Children (e.g. Triton's Python-backend stubs) may outlive the leader for a moment.
    deadline = time.monotonic() + timeout
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 5
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, for error messages."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


_installed: dict[str, dict[str, str]] = {}
_install_lock = threading.Lock()


def installed(script: Path, timeout: float) -> dict[str, str]:
    """What a hack/install-*.sh script prints as KEY=VALUE lines, the script run once per process
    (it installs what is missing and prints where things are)."""
    with _install_lock:
        if str(script) not in _installed:
            out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=timeout)
            if out.returncode != 0:
                raise RuntimeError(f"{script} failed ({out.returncode}):\n{out.stderr[-3000:]}")
            _installed[str(script)] = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        return _installed[str(script)]
