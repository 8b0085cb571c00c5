"""Every condition reason and Event reason the operator can emit has an entry in
docs/troubleshooting.md with its cause and fix, and every entry names a reason the code emits.
The reasons are read from the code (tests/reference.py walks the modules that decide them), so a
reason added without an entry, or an entry removed, fails here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import reference

from .conftest import ROOT


def test_every_reason_has_a_troubleshooting_entry_and_every_entry_a_reason():
    assert reference.reason_problems(ROOT) == []


def test_the_walk_finds_the_reasons_of_each_kind_of_place():
    """Conditions, Events, planner refusals, placement reasons, Kubernetes' pass-through reasons and
    the refused-child family are all read (a walk that found none of a kind would pass vacuously)."""
    found = reference.reasons(ROOT).reasons
    for reason in ("Serving", "Loading", "GroupRestarted", "InferencePoolNotInstalled", "PrecisionUnsupported",
                   "GPUClassNotFound", "NameTooLongForGroups", "NoPrice", "SpilledOver", "ReturnAbandoned",
                   "CrashLoopBackOff", "KindRejected", "MetricsUnavailable", "TargetUnattainable",
                   "LeaderWorkerSetNotInstalled", "InvalidSpec"):
        assert reason in found, reason
    assert not found.keys() & reference.NOT_REASONS


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the operator's code and the troubleshooting page."""
    shutil.copytree(ROOT / reference.PACKAGE, tmp_path / reference.PACKAGE,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / reference.TROUBLESHOOTING, tmp_path / reference.TROUBLESHOOTING)
    return tmp_path


def test_removing_an_entry_fails(tree):
    page = tree / reference.TROUBLESHOOTING
    text = page.read_text()
    start = text.index("### `GPUClassesFull`")
    page.write_text(text[:start] + text[text.index("### ", start + 4):])
    problems = reference.reason_problems(tree)
    assert len(problems) == 1 and problems[0].startswith("reason GPUClassesFull (controller/status.py) has no entry")


def test_a_new_reason_without_an_entry_fails(tree):
    status = tree / reference.PACKAGE / "controller" / "status.py"
    status.write_text(status.read_text().replace('return False, "AsExpected", ""',
                                                 'return False, "NothingToReport", ""', 1))
    problems = reference.reason_problems(tree)
    assert problems[0].startswith("reason NothingToReport (controller/status.py) has no entry")
    # AsExpected is no longer emitted: its entry now names nothing.
    assert any("the entry for AsExpected names no reason the operator emits" in p for p in problems)


def test_an_event_made_outside_the_walked_modules_fails(tree):
    """A reason cannot hide in a module the walk does not read: any call that makes an Event, a
    condition or a refusal elsewhere names its place."""
    module = tree / reference.PACKAGE / "kube" / "leader.py"
    module.write_text(module.read_text() + '\n\ndef _lost():\n    return Event("Warning", "LeaseLost", "x")\n')
    problems = reference.reason_problems(tree)
    assert len(problems) == 1 and problems[0].startswith(f"{reference.PACKAGE}/kube/leader.py:")


def test_an_entry_without_a_fix_fails(tree):
    page = tree / reference.TROUBLESHOOTING
    text = page.read_text()
    start = text.index("### `TooSlow`")
    fix = text.index("**Fix:**", start)
    page.write_text(text[:fix] + text[text.index("\n\n", fix):])
    assert reference.reason_problems(tree) == [f"{reference.TROUBLESHOOTING}: the entry for TooSlow has no Fix"]


def test_reasons_the_operator_emits_are_named_as_the_code_names_them():
    """The e2e suite and the alerts match these exact strings."""
    found = reference.reasons(ROOT).reasons
    assert {"Unschedulable", "NoNodeMatchesGPUClass", "GPUClassesFull", "PreparationFailed"} <= found.keys()
