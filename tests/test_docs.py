"""The README is a front page into the documentation site (docs/, built strictly by `make docs`):
short, the two commands first, its links resolving; user-facing files carry no notes about the
project's own work; every chart value says what it does; the autoscaling bench rewrites its table
on the autoscaling page and nothing else."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import reference

from .conftest import ROOT

README = ROOT / "README.md"
#: What users read: the front page, the site, the chart, the examples.
USER_FACING = [README, *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "charts").rglob("*")),
               *sorted((ROOT / "examples").glob("*"))]
PROCESS_TALK = re.compile(r"\bissues? #?[0-9]{1,3}\b|session", re.IGNORECASE)


def test_the_readme_is_a_front_page_with_the_two_commands_first():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    first_block = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in first_block[:2]] == [["make", "dev"], ["make", "test"]]
    assert README.read_text().index("make dev") < README.read_text().index("## ")


def test_the_readmes_links_resolve():
    text = README.read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links, "the README links into the site"
    for link in links:
        if "://" in link:
            continue
        assert (ROOT / link).exists(), link
    site = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    linked = {link.removeprefix("docs/") for link in links if link.startswith("docs/")}
    assert {"quickstart.md", "install.md", "troubleshooting.md", "reference/index.md"} <= linked <= site


def test_no_user_facing_file_talks_about_the_projects_own_work():
    found = []
    for path in USER_FACING:
        if path.is_file():
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if PROCESS_TALK.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


def test_every_chart_value_says_what_it_does():
    assert reference.undocumented_values(ROOT) == []


def test_the_autoscaling_bench_rewrites_only_its_table_on_the_autoscaling_page(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import autoscaling as bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    page = ROOT / "docs" / "autoscaling.md"
    assert bench.PAGE == page
    text = page.read_text()
    assert text.count(bench.MARK_BEGIN) == 1 and text.count(bench.MARK_END) == 1
    copy = tmp_path / "autoscaling.md"
    shutil.copy(page, copy)
    monkeypatch.setattr(bench, "PAGE", copy)
    from datetime import datetime, timezone

    bench.update_autoscaling_page(["| a | b |", "| --- | --- |", "| 1 | 2 |"], 3, 4, 36,
                                  datetime(2027, 1, 2, tzinfo=timezone.utc), ["- one condition"])
    new = copy.read_text()
    a, b = text.index(bench.MARK_BEGIN), text.index(bench.MARK_END) + len(bench.MARK_END)
    assert new.startswith(text[:a]) and new.endswith(text[b:])
    assert "on 2027-01-02" in new and "| 1 | 2 |" in new and "beats the baselines on 3 of 36" in new


def test_the_site_has_a_page_for_each_topic():
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert {"quickstart.md", "install.md", "first-service.md", "models.md", "gpu.md", "gateway.md",
            "autoscaling.md", "spill-over.md", "operations.md", "troubleshooting.md"} <= pages
    nav = (ROOT / "mkdocs.yml").read_text()
    assert all(name in nav for name in pages), "mkdocs --strict fails on a page left out of the nav"
    assert "strict: true" in nav
    assert "--strict" in (ROOT / "Makefile").read_text()


def test_the_reference_is_generated_into_its_own_folder():
    from tests import generated

    assert generated.GROUPS["reference"] == (reference.FOLDER,)
    assert set(reference.pages(ROOT)) == {p.name for p in (ROOT / reference.FOLDER).glob("*.md")}


def test_the_commands_next_to_kserve_are_the_ones_the_e2e_suite_types():
    """e2e/test_lifecycle.py installs KServe's names beside ours and runs these; the page must keep
    telling users the same commands."""
    page = (ROOT / "docs" / "first-service.md").read_text()
    section = page[page.index("## Next to KServe"):]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].split() for line in block.splitlines() if line.strip()]
    assert commands == [["kubectl", "get", "infsvc", "-A"],
                        ["kubectl", "get", "inferenceservices.serving.triton-operator.io", "-A"],
                        ["kubectl", "get", "inference", "-A"],
                        ["kubectl", "get", "isvc", "-A"]]
    e2e = (ROOT / "e2e" / "test_lifecycle.py").read_text()
    for resource in ("infsvc", "inferenceservices.serving.triton-operator.io", "inference", "isvc"):
        assert f'names("{resource}")' in e2e, resource


def test_the_strict_build_fails_on_a_broken_anchor(tmp_path):
    """`make docs` as the Makefile runs it (its mkdocs flags) fails on an anchor no page has. (mkdocs'
    --quiet would hide the warnings --strict counts, and every build would pass.)"""
    pytest.importorskip("mkdocs")
    recipe = (ROOT / "Makefile").read_text().split("\ndocs:", 1)[1].split("\n\n", 1)[0]
    flags = recipe.split("mkdocs build", 1)[1].split("--site-dir", 1)[0].split()
    assert "--strict" in flags and "--quiet" not in flags and "-q" not in flags
    for rel in ("docs", "examples"):
        shutil.copytree(ROOT / rel, tmp_path / rel)
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "index.md"
    page.write_text(page.read_text().replace("(first-service.md#next-to-kserve)", "(first-service.md#no-such-anchor)"))
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", *flags, "--site-dir", str(tmp_path / "site")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode != 0 and "no-such-anchor" in out.stderr, out.stderr[-2000:]
