"""make dist: the release artifacts, built from this checkout into dist/ (or --out DIR).

  triton-operator-V.tgz                       the Helm chart (helm lint --strict, then helm package)
  triton_operator-V-py3-none-any.whl, .tar.gz the operator's wheel and sdist
  triton_runtime-V-py3-none-any.whl, .tar.gz  the runtime's wheel and sdist
  triton-operator-V.cdx.json                  CycloneDX SBOM of the image's operator environment
                                              (requirements/operator-image.lock)
  triton-runtime-V.cdx.json                   the same of its runtime environment
                                              (requirements/runtime-image.lock)
  triton-operator-V-image-context.tar.gz      the Dockerfile and exactly the files its COPY lines
                                              read, less .dockerignore: `docker build - < it`
  SHA256SUMS                                  sha256sum -c reads it

V is pyproject.toml's version, the one place it is set: the chart is packaged with it as version
and appVersion, and the build stops when another copy of it differs (each is named). The sources
are the files git knows of (tracked, or untracked and not ignored), copied to a temporary folder
and built there without build isolation (the backend is the venv's locked setuptools), so the work
tree gets no build/ or egg-info and a stray file never ships. Timestamps come from
SOURCE_DATE_EPOCH (default: the last commit's time), so the same commit builds the same wheels,
SBOMs and image context (the sdists and the chart package still carry the time they were built).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "triton-operator"


def version(root: Path = ROOT) -> str:
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]


def version_copies(root: Path = ROOT) -> dict[str, str | None]:
    """Every other place that states the release version -> what it says there (None: not found)."""
    def first(path: str, pattern: str) -> str | None:
        m = re.search(pattern, (root / path).read_text(), re.M)
        return m.group(1) if m else None

    return {
        "runtime/pyproject.toml (version)": tomllib.loads((root / "runtime" / "pyproject.toml").read_text())
        ["project"]["version"],
        "operator/triton_operator/__init__.py (__version__)": first(
            "operator/triton_operator/__init__.py", r'^__version__ = "([^"]+)"'),
        "runtime/triton_runtime/__init__.py (__version__)": first(
            "runtime/triton_runtime/__init__.py", r'^__version__ = "([^"]+)"'),
        "charts/triton-operator/Chart.yaml (version)": first(
            "charts/triton-operator/Chart.yaml", r'^version:\s*"?([^"\s]+)"?'),
        "charts/triton-operator/Chart.yaml (appVersion)": first(
            "charts/triton-operator/Chart.yaml", r'^appVersion:\s*"?([^"\s]+)"?'),
        "operator/triton_operator/settings.py (runtime_image's tag)": first(
            "operator/triton_operator/settings.py", r'"ghcr\.io/triton-operator/triton-operator:([^"@]+)"'),
    }


def version_mismatches(root: Path = ROOT) -> list[str]:
    want = version(root)
    return [f"{place} says {got}, pyproject.toml says {want}"
            for place, got in version_copies(root).items() if got != want]


# -- the sources -------------------------------------------------------------------------------

def source_files(root: Path = ROOT) -> list[str]:
    """The files git knows of (tracked, or untracked and not ignored) that exist, sorted."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=root, capture_output=True, check=True)
    return sorted({p for p in out.stdout.decode().split("\0") if p and (root / p).is_file()})


def copy_sources(root: Path, dest: Path) -> None:
    for rel in source_files(root):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dest / rel)


# -- the image's build context -----------------------------------------------------------------

def dockerfile_copy_sources(dockerfile: str) -> list[str]:
    """The sources of the Dockerfile's COPY and ADD instructions that read the build context (not
    those copying --from a stage or an image), as written."""
    text = re.sub(r"\\\n", " ", dockerfile)
    sources: list[str] = []
    for line in text.splitlines():
        words = line.strip()
        m = re.match(r"(?i)(COPY|ADD)\s+(.*)$", words)
        if not m:
            continue
        rest = m.group(2).strip()
        args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        flags = [a for a in args if a.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        operands = [a for a in args if not a.startswith("--")]
        sources += operands[:-1]
    return sources


def dockerignore_patterns(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(exclude?, regex) per .dockerignore line, as Docker reads them: comments and blank lines
    skipped, a leading ! re-includes, paths are cleaned and relative to the context's root, ** is
    any number of folders, * and ? stay within one."""
    patterns = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        line = os.path.normpath(line[1:].strip() if include else line).lstrip("/")
        regex, i = "", 0
        while i < len(line):
            c = line[i]
            if line.startswith("**", i):
                i += 2
                if line.startswith("/", i):
                    regex, i = regex + "(?:.*/)?", i + 1
                else:
                    regex += ".*"
                continue
            regex += {"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c))
            i += 1
        patterns.append((not include, re.compile(f"^{regex}$")))
    return patterns


def dockerignored(path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether Docker leaves this file out: the last pattern matching it or a folder above it wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for exclude, regex in patterns:
        if any(regex.match(p) for p in prefixes):
            excluded = exclude
    return excluded


def context_files(root: Path = ROOT) -> list[str]:
    """The Dockerfile, .dockerignore and every source file under a COPY source, less .dockerignore."""
    ignore = root / ".dockerignore"
    patterns = dockerignore_patterns(ignore.read_text()) if ignore.exists() else []
    sources = [os.path.normpath(s).lstrip("/") for s in dockerfile_copy_sources((root / "Dockerfile").read_text())]
    known = source_files(root)
    wanted = {"Dockerfile"} | ({".dockerignore"} if ignore.exists() else set())
    for src in sources:
        matched = [f for f in known if f == src or f.startswith(src.rstrip("/") + "/")]
        if not matched:
            raise SystemExit(f"dist: the Dockerfile copies {src}, which is not in the checkout")
        wanted |= {f for f in matched if not dockerignored(f, patterns)}
    return sorted(wanted)


def write_context(root: Path, out: Path, epoch: int) -> None:
    files = context_files(root)
    dirs = sorted({"/".join(f.split("/")[:n]) for f in files for n in range(1, f.count("/") + 1)})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted([*dirs, *files]):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
            if name in dirs:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            data = (root / name).read_bytes()
            info.size, info.mode = len(data), 0o755 if os.access(root / name, os.X_OK) else 0o644
            tar.addfile(info, io.BytesIO(data))
    with open(out, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=epoch) as gz:
        gz.write(buf.getvalue())


# -- the build ---------------------------------------------------------------------------------

def run(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"dist: {' '.join(map(str, args))} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    return out.stdout


def helm_binary() -> str:
    return run(ROOT / "hack" / "install-tools.sh", "helm").strip() + "/helm"


def build(out: Path, root: Path = ROOT, helm: str | None = None) -> list[Path]:
    if wrong := version_mismatches(root):
        raise SystemExit("dist: the release version is pyproject.toml's; change these to match:\n  " + "\n  ".join(wrong))
    v = version(root)
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or run("git", "log", "-1", "--format=%ct", cwd=root).strip())
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    helm = helm or helm_binary()
    with tempfile.TemporaryDirectory(prefix="triton-dist-") as tmp:
        src = Path(tmp) / "src"
        copy_sources(root, src)

        chart = src / "charts" / "triton-operator"
        run(helm, "lint", "--strict", chart)
        run(helm, "package", chart, "--version", v, "--app-version", v, "--destination", out)
        package = out / f"triton-operator-{v}.tgz"
        run(helm, "lint", "--strict", package)   # what is published lints too

        for project in (src, src / "runtime"):
            run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, project, env=env)

        # A requirements file has no dependency graph, which the tool warns about on each run.
        quiet = {**env, "PYTHONWARNINGS": "ignore::UserWarning"}
        for name, lock, pyproject in (("triton-operator", "operator-image.lock", src / "pyproject.toml"),
                                      ("triton-runtime", "runtime-image.lock", src / "runtime" / "pyproject.toml")):
            run(sys.executable, "-m", "cyclonedx_py", "requirements", src / "requirements" / lock,
                "--pyproject", pyproject, "--output-reproducible", "--of", "JSON",
                "-o", out / f"{name}-{v}.cdx.json", env=quiet)

        write_context(root, out / f"triton-operator-{v}-image-context.tar.gz", epoch)

    artifacts = sorted(p for p in out.iterdir() if p.is_file())
    sums = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in artifacts)
    (out / "SHA256SUMS").write_text(sums)
    return [*artifacts, out / "SHA256SUMS"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="folder to write (emptied first)")
    args = parser.parse_args()
    for path in build(args.out.resolve()):
        print(f"{path.stat().st_size:>10,}  {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
