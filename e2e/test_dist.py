"""make dist's artifacts, built once by hack/dist.py (what `make dist` runs) and used as a user
would: the chart installed from its package into the suite's cluster, the wheels installed into a
clean virtualenv, the SBOMs read against the locks, the image's build context against the
Dockerfile; and the release workflow that publishes them, under actionlint.

Downloads (each once, then cached under ~/.cache/triton-operator): helm and actionlint from the Go
module proxy (hack/install-tools.sh), and the operator image's locked wheels from PyPI (a wheelhouse
keyed by the lock's hash and this Python), from which the clean venv installs with --no-index."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name

from .cluster import ROOT, Cluster

_spec = importlib.util.spec_from_file_location("dist", ROOT / "hack" / "dist.py")
dist = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dist)

VERSION = dist.version()
CACHE = Path(os.environ.get("TRITON_OPERATOR_CACHE") or
             Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "triton-operator")
EXPECTED = ["SHA256SUMS", f"triton-operator-{VERSION}-image-context.tar.gz", f"triton-operator-{VERSION}.cdx.json",
            f"triton-operator-{VERSION}.tgz", f"triton-runtime-{VERSION}.cdx.json",
            f"triton_operator-{VERSION}-py3-none-any.whl", f"triton_operator-{VERSION}.tar.gz",
            f"triton_runtime-{VERSION}-py3-none-any.whl", f"triton_runtime-{VERSION}.tar.gz"]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist") / "dist"
    started = time.monotonic()
    built = subprocess.run([sys.executable, str(ROOT / "hack" / "dist.py"), "--out", str(out)],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    print(f"hack/dist.py built {len(list(out.iterdir()))} files in {time.monotonic() - started:.1f} s")
    return out


def test_make_dist_builds_every_artifact_with_its_checksum(artifacts: Path):
    assert sorted(p.name for p in artifacts.iterdir()) == EXPECTED
    sums = dict(reversed(line.split("  ")) for line in (artifacts / "SHA256SUMS").read_text().splitlines())
    assert sorted(sums) == [n for n in EXPECTED if n != "SHA256SUMS"]
    for name, digest in sums.items():
        assert hashlib.sha256((artifacts / name).read_bytes()).hexdigest() == digest, name
    for wheel in artifacts.glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        assert f"\nVersion: {VERSION}\n" in meta, wheel.name
    with tarfile.open(artifacts / f"triton_operator-{VERSION}.tar.gz") as sdist:
        names = sdist.getnames()
    assert [n for n in names if "/operator/triton_operator/render/templates/" in n], "the templates are in the sdist"
    assert not [n for n in names if "/tests/" in n or "__pycache__" in n], "the sdist holds the package, not the tests"


def test_the_chart_installs_from_its_package(artifacts: Path, installed: Cluster, tmp_path: Path):
    """The packaged chart beside the suite's release (installed from charts/triton-operator): a
    second release in its own namespace, the CRDs left to the first (one owner each)."""
    package = artifacts / f"triton-operator-{VERSION}.tgz"

    def helm(*args: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(["helm", *args], capture_output=True, text=True, env=installed.env, timeout=300)
        assert out.returncode == 0, f"helm {' '.join(args)}: {out.stderr}"
        return out

    meta = yaml.safe_load(helm("show", "chart", str(package)).stdout)
    assert (meta["name"], meta["version"], meta["appVersion"]) == ("triton-operator", VERSION, VERSION)
    # the package renders exactly what the chart folder renders
    args = ["-n", "dist-pkg", "--kube-version", "1.36.0", "--set", "gateway.enabled=true"]
    assert helm("template", "triton-operator-pkg", str(package), *args).stdout == \
        helm("template", "triton-operator-pkg", str(ROOT / "charts" / "triton-operator"), *args).stdout
    release, ns = "triton-operator-pkg", f"dist-pkg-{os.getpid()}"
    try:
        helm("install", release, str(package), "-n", ns, "--create-namespace", "--set", "crds.enabled=false",
             "--wait", "--timeout", "120s")
        [listed] = json.loads(helm("list", "-n", ns, "-o", "json").stdout)
        assert (listed["status"], listed["chart"], listed["app_version"]) == \
            ("deployed", f"triton-operator-{VERSION}", VERSION)
        dep = installed.get("deployment", release, ns)
        assert dep["status"]["readyReplicas"] == 1
        assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == \
            f"ghcr.io/triton-operator/triton-operator:{VERSION}"
        assert installed.get("clusterrole", release) is not None
        helm("uninstall", release, "-n", ns, "--wait")
        assert installed.get("clusterrole", release) is None
    finally:
        subprocess.run(["helm", "uninstall", release, "-n", ns, "--ignore-not-found"], capture_output=True,
                       env=installed.env, timeout=120)
        installed.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def wheelhouse() -> Path:
    """The operator image's locked wheels for this Python, downloaded from PyPI once (hash-checked)."""
    lock = ROOT / "requirements" / "operator-image.lock"
    key = hashlib.sha256(lock.read_bytes()).hexdigest()[:16]
    home = CACHE / f"wheelhouse-{key}-{sys.implementation.cache_tag}-{sysconfig.get_platform()}"
    if (home / "complete").exists():
        return home
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=CACHE, prefix=".wheelhouse-"))
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--require-hashes", "--no-deps",
                          "--only-binary=:all:", "-r", str(lock), "-d", str(partial)],
                         capture_output=True, text=True, timeout=600)
    if got.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise AssertionError(f"pip download of {lock.name} from PyPI failed:\n{got.stderr[-3000:]}")
    (partial / "complete").touch()
    shutil.rmtree(home, ignore_errors=True)
    partial.rename(home)
    return home


def test_the_wheels_install_into_a_clean_venv_and_run(artifacts: Path, tmp_path: Path):
    """The image's way: the locked dependencies hash-checked, then both wheels without resolving
    anything; no index, no source tree on the path, run from a folder outside the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME") and not k.startswith("PIP_")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, cwd=tmp_path,
                             timeout=600)
        assert out.returncode == 0, f"{' '.join(map(str, args))}:\n{out.stdout}{out.stderr}"
        return out

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    run(*pip, "--find-links", wheelhouse(), "--require-hashes", "-r", ROOT / "requirements" / "operator-image.lock")
    run(*pip, *sorted(artifacts.glob("*.whl")))
    run(venv / "bin" / "python", "-m", "pip", "check")   # the lock satisfies both wheels' requirements
    assert "usage: triton-operator" in run(venv / "bin" / "triton-operator", "--help").stdout
    assert run(venv / "bin" / "triton-operator", "--version").stdout.strip() == f"triton-operator {VERSION}"
    assert "usage: triton-runtime" in run(venv / "bin" / "triton-runtime", "--help").stdout
    # the package data travels: the catalog and the templates render an example
    rendered = run(venv / "bin" / "triton-operator", "render", "-f", ROOT / "examples" / "resnet50-onnx.yaml").stdout
    assert {d["kind"] for d in yaml.safe_load_all(rendered) if d} >= {"Deployment", "Service"}
    where = run(venv / "bin" / "python", "-c", "import triton_operator, triton_runtime; "
                "print(triton_operator.__file__); print(triton_runtime.__file__)").stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in where), where


def _pins(lock: Path) -> dict[str, tuple[str, set[str]]]:
    pins: dict[str, tuple[str, set[str]]] = {}
    for entry in re.split(r"\n(?=\S)", lock.read_text()):
        if m := re.match(r"([A-Za-z0-9_.\-]+)==([^\s;\\]+)", entry):
            pins[canonicalize_name(m.group(1))] = (m.group(2), set(re.findall(r"--hash=sha256:([0-9a-f]{64})", entry)))
    return pins


@pytest.mark.parametrize("sbom, lock, root", [
    ("triton-operator", "operator-image.lock", "triton-operator"),
    ("triton-runtime", "runtime-image.lock", "triton-runtime"),
])
def test_the_sboms_list_every_locked_package_with_its_hashes(artifacts: Path, sbom, lock, root):
    doc = json.loads((artifacts / f"{sbom}-{VERSION}.cdx.json").read_text())
    assert (doc["bomFormat"], doc["specVersion"]) == ("CycloneDX", "1.6")
    assert (doc["metadata"]["component"]["name"], doc["metadata"]["component"]["version"]) == (root, VERSION)
    listed = {}
    for c in doc["components"]:
        hashes = {h["content"] for ref in c.get("externalReferences", []) for h in ref.get("hashes", [])}
        listed[canonicalize_name(c["name"])] = (c["version"], hashes)
        assert c["purl"] == f"pkg:pypi/{c['name'].lower()}@{c['version']}", c["purl"]
    assert listed == _pins(ROOT / "requirements" / lock)


def test_the_image_context_is_what_the_dockerfile_copies(artifacts: Path):
    with tarfile.open(artifacts / f"triton-operator-{VERSION}-image-context.tar.gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        files = sorted(n for n, m in members.items() if m.isfile())
        assert files == dist.context_files()
        for name in files:
            assert tar.extractfile(members[name]).read() == (ROOT / name).read_bytes(), name
    for src in dist.dockerfile_copy_sources((ROOT / "Dockerfile").read_text()):
        assert src in members, f"COPY {src}: not in the context"
    assert all(m.uid == 0 and m.gid == 0 and not m.issym() for m in members.values())


def test_the_release_workflow_passes_actionlint(tmp_path: Path):
    if shutil.which("go") is None:
        pytest.skip("Go is not installed: hack/install-tools.sh builds actionlint from the Go module proxy")
    bin_dir = subprocess.run([ROOT / "hack" / "install-tools.sh", "actionlint"], check=True, capture_output=True,
                             text=True, timeout=900).stdout.strip()
    actionlint = f"{bin_dir}/actionlint"
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert workflows
    out = subprocess.run([actionlint, "-no-color", *map(str, workflows)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    # the linter is awake: a job that needs one that does not exist fails it
    broken = tmp_path / ".github" / "workflows" / "release.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text((ROOT / ".github" / "workflows" / "release.yml").read_text().replace(
        "needs: dist", "needs: build", 1))
    out = subprocess.run([actionlint, "-no-color", str(broken)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1 and '"build"' in out.stdout, out.stdout + out.stderr
