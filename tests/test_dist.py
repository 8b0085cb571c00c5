"""make dist's choices that need no build (hack/dist.py): one version, the image's build context as
Docker would read it, and a release workflow that publishes what make dist builds. The artifacts
themselves are built and installed by e2e/test_dist.py."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("dist", ROOT / "hack" / "dist.py")
dist = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dist)


def test_every_copy_of_the_version_is_pyprojects(tmp_path: Path):
    assert dist.version_mismatches() == [], "make dist refuses to build: set each of these to pyproject.toml's version"
    assert set(dist.version_copies().values()) == {dist.version()}
    # a copy that drifts is named
    for rel in ["pyproject.toml", *{p.split(" ")[0] for p in dist.version_copies()}]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    chart = tmp_path / "charts" / "triton-operator" / "Chart.yaml"
    chart.write_text(re.sub(r"(?m)^appVersion: .*$", 'appVersion: "9.9.9"', chart.read_text()))
    assert dist.version_mismatches(tmp_path) == [
        f"charts/triton-operator/Chart.yaml (appVersion) says 9.9.9, pyproject.toml says {dist.version()}"]


@pytest.mark.parametrize("patterns, path, ignored", [
    ("**/__pycache__", "operator/triton_operator/__pycache__/cli.cpython-313.pyc", True),
    ("**/__pycache__", "__pycache__/x.pyc", True),
    ("tests", "tests/test_api.py", True),
    ("tests", "operator/tests/test_api.py", False),          # a bare name is the context's root only
    ("/.venv", ".venv/bin/python", True),                     # a leading slash changes nothing
    ("docs/*.md", "docs/design.md", True),
    ("docs/*.md", "docs/deep/design.md", False),              # * stays within one folder
    ("docs/**/*.md", "docs/deep/er/design.md", True),
    ("docs/**/*.md", "docs/design.md", True),                 # ** is zero folders too
    ("file?.txt", "file1.txt", True),
    ("file?.txt", "file10.txt", False),
    ("*.md\n!README.md", "README.md", False),                 # the last pattern that matches wins
    ("*.md\n!README.md", "NOTES.md", True),
    ("# a comment\n\n.git", "README.md", False),
    ("**/*.egg-info", "operator/triton_operator.egg-info/PKG-INFO", True),
])
def test_dockerignore_is_read_as_docker_reads_it(patterns, path, ignored):
    assert dist.dockerignored(path, dist.dockerignore_patterns(patterns)) is ignored


def test_copy_sources_are_read_from_the_dockerfile():
    assert dist.dockerfile_copy_sources((ROOT / "Dockerfile").read_text()) == [
        "requirements/operator-image.lock", "requirements/runtime-image.lock", "pyproject.toml", "README.md",
        "operator", "runtime"]
    assert dist.dockerfile_copy_sources(
        "FROM x AS build\nCOPY --chown=1:1 a b \\\n  c/ ./dest/\nCOPY --from=build /opt /opt\n"
        'ADD ["d", "e", "/srv/"]\nRUN cp f g\n') == ["a", "b", "c/", "d", "e"]


def test_the_image_context_is_every_copy_source_less_dockerignore():
    files = dist.context_files()
    sources = dist.dockerfile_copy_sources((ROOT / "Dockerfile").read_text())
    for src in sources:
        assert any(f == src or f.startswith(src + "/") for f in files), f"the context lacks {src}, which COPY reads"
    patterns = dist.dockerignore_patterns((ROOT / ".dockerignore").read_text())
    assert not [f for f in files if dist.dockerignored(f, patterns)]
    outside = [f for f in files if not any(f == s or f.startswith(s + "/") for s in sources)]
    assert outside == [".dockerignore", "Dockerfile"]
    known = dist.source_files()
    assert {f for f in known if f.startswith(("operator/", "runtime/")) and not dist.dockerignored(f, patterns)} \
        <= set(files), "a file of the packages is missing"
    assert "operator/triton_operator/render/templates" in "\n".join(files)   # package data travels too


def _workflow() -> dict:
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    doc["on"] = doc.pop(True, doc.get("on"))   # YAML 1.1 reads the key `on` as true
    return doc


def _runs(job: dict) -> str:
    return "\n".join(s.get("run", "") for s in job["steps"])


def test_the_release_workflow_publishes_what_make_dist_builds():
    wf = _workflow()
    assert wf["on"] == {"push": {"tags": ["v*"]}}
    assert wf["permissions"] == {}, "each job asks for the permissions it needs, no more"
    jobs = wf["jobs"]
    build = jobs["dist"]
    assert "make dist" in _runs(build) and 'if [ "$GITHUB_REF_NAME" != "v$version" ]' in _runs(build)
    upload = next(s for s in build["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["with"]["path"] == "dist/" and build["permissions"] == {"contents": "read"}
    for name in ("github-release", "chart", "pypi"):
        assert jobs[name]["needs"] == "dist"
    assert "gh release create" in _runs(jobs["github-release"]) and "dist/*" in _runs(jobs["github-release"])
    assert jobs["github-release"]["permissions"] == {"contents": "write"}
    assert re.search(r'helm push "\$chart" "oci://ghcr\.io/', _runs(jobs["chart"]))
    assert jobs["chart"]["permissions"] == {"contents": "read", "packages": "write"}
    pypi = jobs["pypi"]
    assert pypi["permissions"] == {"id-token": "write"}, "trusted publishing: an OIDC token, no secret"
    publish = next(s for s in pypi["steps"] if s.get("uses", "").startswith("pypa/gh-action-pypi-publish@"))
    assert set(publish["with"]) == {"packages-dir"} and "cp dist/triton_operator-* dist/triton_runtime-* pypi/" in _runs(pypi)
    # third-party code runs at a reviewed commit (PyPA's publisher on its documented release branch)
    for job in jobs.values():
        for step in job["steps"]:
            if "uses" in step and not step["uses"].startswith("pypa/"):
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
