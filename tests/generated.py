"""The files generated from the code, written and checked in one place.

- ``tests/golden/<example>.yaml``: what ``render`` makes of each InferenceService in
  ``examples/`` (uid fixed), reviewed by a human. ``make golden`` rewrites them.
- ``crds/*.yaml`` and the chart's copy in ``charts/triton-operator/files/crds/``, from the API
  models through ``triton-operator crds``. ``make crds`` rewrites them.
- ``charts/triton-operator/dashboards/*.json``: the Grafana dashboards, from ``hack/dashboards.py``.
  ``make dashboards`` rewrites them.
- ``docs/reference/*.md``: the site's reference pages (CRD fields, commands and flags, metrics, chart
  values, condition and Event reasons), from the code through ``tests/reference.py``. ``make
  reference`` rewrites them.

Usage (from the repository root)::

    python -m tests.generated write golden|crds|dashboards|reference   rewrite one group; refused when CI is set
    python -m tests.generated check               write every group into a temporary folder and
                                                  compare it with the work tree; exit 1 naming
                                                  each stale, missing or extra file

The unit tests compare against these files and never write them, whatever the environment says:
the only writer is ``write``, which the Makefile's ``golden`` and ``crds`` targets call. ``make
test`` runs ``check`` first, so a clean CI clone fails when a generated file was not regenerated.
"""

from __future__ import annotations

import difflib
import os
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
FIXED_UID = "00000000-0000-0000-0000-000000000000"

#: group -> the folders it owns (relative to the repository root). Each folder holds exactly the
#: files its generator writes: anything else in it is reported as extra.
GROUPS: dict[str, tuple[str, ...]] = {
    "golden": ("tests/golden",),
    "crds": ("crds", "charts/triton-operator/files/crds"),
    "dashboards": ("charts/triton-operator/dashboards",),
    "reference": ("docs/reference",),
}


class Refused(RuntimeError):
    pass


def _load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def isvc_examples(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in (root / "examples").glob("*.yaml") if p.name != "gpuclasses.yaml")


def render_example(path: Path, root: Path = ROOT) -> str:
    """The manifests of every InferenceService in ``path``, as the golden file holds them."""
    from triton_operator.api import GPUClass, InferenceService
    from triton_operator.planning.assign import assign
    from triton_operator.render import dump, render
    from triton_operator.settings import Settings

    classes = {c.name: c for c in (GPUClass.model_validate(d) for d in _load(root / "examples" / "gpuclasses.yaml"))}
    manifests = []
    for doc in _load(path):
        obj = InferenceService.model_validate(doc)
        obj.metadata["uid"] = FIXED_UID  # renders are compared byte for byte: no random uid
        manifests.extend(render(obj, classes, Settings(), assign(obj, classes)).manifests)
    return dump(manifests)


def _generate(group: str, root: Path) -> dict[str, str]:
    """relative path -> text, for every file of ``group``."""
    if group == "golden":
        return {f"tests/golden/{p.stem}.yaml": render_example(p, root) for p in isvc_examples(root)}
    if group == "crds":
        from triton_operator import cli

        with tempfile.TemporaryDirectory() as tmp:
            # The user's command, so `make crds` and the check cannot disagree with it.
            if cli.main(["crds", "--output-dir", tmp]) != 0:
                raise RuntimeError("triton-operator crds failed")
            texts = {p.name: p.read_text() for p in sorted(Path(tmp).glob("*.yaml"))}
        return {f"{folder}/{name}": text for folder in GROUPS["crds"] for name, text in texts.items()}
    if group == "dashboards":
        import importlib.util

        spec = importlib.util.spec_from_file_location("dashboards", root / "hack" / "dashboards.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return {f"{GROUPS['dashboards'][0]}/{name}": text for name, text in module.render().items()}
    if group == "reference":
        from tests import reference

        return {f"{GROUPS['reference'][0]}/{name}": text for name, text in reference.pages(root).items()}
    raise KeyError(f"unknown group {group!r}; one of {', '.join(GROUPS)}")


def _write_tree(group: str, source_root: Path, target_root: Path) -> list[str]:
    """Generates ``group`` from ``source_root`` into ``target_root``: each owned folder ends up
    holding exactly the generated files. Returns the relative paths written."""
    files = _generate(group, source_root)
    for folder in GROUPS[group]:
        target = target_root / folder
        target.mkdir(parents=True, exist_ok=True)
        for stale in target.iterdir():
            if stale.is_file() and f"{folder}/{stale.name}" not in files:
                stale.unlink()
    for rel, text in files.items():
        (target_root / rel).write_text(text)
    return sorted(files)


def in_ci(environ: dict[str, str] | None = None) -> bool:
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() not in ("", "0", "false", "no")


def write(group: str, root: Path = ROOT) -> list[str]:
    """Rewrites one group in the work tree (``make golden`` / ``make crds``)."""
    if in_ci():
        raise Refused(f"refusing to rewrite generated files ({group}) with CI={os.environ['CI']!r}: "
                      "CI compares them, it never writes them")
    return _write_tree(group, root, root)


def check(root: Path = ROOT) -> list[str]:
    """Every generated file regenerated into a temporary folder and compared with ``root``.
    Returns one message per difference (empty: all current)."""
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="generated-") as tmp:
        fresh_root = Path(tmp)
        for group, folders in GROUPS.items():
            _write_tree(group, root, fresh_root)
            fix = f"make {group}"
            for folder in folders:
                fresh = {p.name: p for p in (fresh_root / folder).iterdir() if p.is_file()}
                tree_dir = root / folder
                present = {p.name: p for p in tree_dir.iterdir() if p.is_file()} if tree_dir.is_dir() else {}
                for name in sorted(fresh.keys() - present.keys()):
                    problems.append(f"{folder}/{name} is missing: run {fix}")
                for name in sorted(present.keys() - fresh.keys()):
                    problems.append(f"{folder}/{name} is not generated by anything: remove it (or run {fix})")
                for name in sorted(fresh.keys() & present.keys()):
                    want, have = fresh[name].read_text(), present[name].read_text(errors="replace")
                    if want != have:
                        diff = list(difflib.unified_diff(have.splitlines(), want.splitlines(),
                                                         f"{folder}/{name} (work tree)",
                                                         f"{folder}/{name} (regenerated)", lineterm="", n=1))
                        shown = "\n".join(diff[:40]) + ("\n..." if len(diff) > 40 else "")
                        problems.append(f"{folder}/{name} is stale: run {fix} and review the diff\n{shown}")
    return problems


def main(argv: list[str]) -> int:
    usage = "usage: python -m tests.generated write golden|crds|dashboards|reference | check"
    try:
        if argv[:1] == ["check"] and len(argv) == 1:
            problems = check()
            for p in problems:
                print(p, file=sys.stderr)
            if problems:
                print(f"generated files: {len(problems)} out of date", file=sys.stderr)
                return 1
            print("generated files: golden, CRDs, dashboards and reference pages are current")
            return 0
        if argv[:1] == ["write"] and len(argv) == 2 and argv[1] in GROUPS:
            for rel in write(argv[1]):
                print(f"wrote {rel}")
            return 0
    except Refused as e:
        print(f"tests.generated: {e}", file=sys.stderr)
        return 3
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
