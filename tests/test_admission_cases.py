"""The models agree with what the real API server said about each hostile spec (recorded by
hack/record-admission.py against the CRDs in crds/), and both name the field they refuse."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from triton_operator import crdgen
from triton_operator.crdgen import INTEGER_RULE
from triton_operator.api import GPUClass, InferenceService, describe_validation_error

from .admission_cases import RECORDED, case_document, load_cases
from .crd_admission import Admission, _to_cel

CASES = load_cases()
RECORDS = json.loads(RECORDED.read_text())
ADMISSION = {"InferenceService": Admission(crdgen.inference_service_crd()),
             "GPUClass": Admission(crdgen.gpu_class_crd())}
MODELS = {"InferenceService": InferenceService, "GPUClass": GPUClass}


def test_every_case_is_recorded():
    """Fails when a case was added or renamed without running hack/record-admission.py."""
    assert {c["name"] for c in CASES} == set(RECORDS)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_models_agree_with_the_api_server(case):
    record = RECORDS[case["name"]]
    doc = case_document(case)
    try:
        MODELS[doc["kind"]].model_validate(doc)
        errors = None
    except ValidationError as e:
        errors = e.errors()
    assert (errors is None) == record["admitted"], (record, errors)
    if errors is None:
        assert "field" not in case, "an admitted case names no field"
        return
    field = case["field"]
    assert field in record["message"], record["message"]
    assert any(_names(describe_validation_error(e), field) for e in errors), [describe_validation_error(e) for e in errors]


def _names(error: str, field: str) -> bool:
    """Whether "path: message" names the field: on its path, or on its parent's path with the
    rest of the field in the message (a rule across fields sits on the object that holds them)."""
    path, _, message = error.partition(": ")
    if path.startswith(field) or f"{field} " in error:
        return True
    return field.startswith(path + ".") and field[len(path) + 1:] in message


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_python_admission_model_agrees_with_the_api_server(case):
    """tests/crd_admission.py stands in for the API server in the property suite: it must say
    what the real one said."""
    record = RECORDS[case["name"]]
    doc = case_document(case)
    refusals = ADMISSION[doc["kind"]].refusals(doc)
    assert (not refusals) == record["admitted"], (record, refusals)
    if refusals:
        assert any(case["field"] in str(r) for r in refusals), refusals


@pytest.mark.parametrize("value, integer", [(1, True), (0, True), (-5, True), (1.0, False), (2.5, False)])
def test_the_integer_guard_is_answered_as_cel_answers_it(value, integer):
    """crd_admission answers crdgen.INTEGER_RULE without cel-python (for speed): the same answer."""
    from .crd_admission import _evaluate, _program
    schema = {"type": "integer"}
    cel_answer = _program(INTEGER_RULE["rule"]).evaluate({"self": _to_cel(value, schema)})
    assert bool(cel_answer) is integer and _evaluate(INTEGER_RULE["rule"], value, schema) is integer
