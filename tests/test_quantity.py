"""Quantities compare as Kubernetes compares them (k8s.io/apimachinery resource.ParseQuantity);
tests/admission_cases.yaml holds the API server's own answers for the request <= limit rule."""

from __future__ import annotations

from decimal import Decimal

import pytest

from triton_operator.quantity import QuantityError, exceeds, parse_quantity, within_limits


@pytest.mark.parametrize("text, value", [
    ("2", Decimal(2)), ("1000m", Decimal(1)), ("1.5Gi", Decimal(1.5 * 2**30)), ("8G", Decimal(8e9)),
    ("1e3", Decimal(1000)), ("+1", Decimal(1)), ("1.", Decimal(1)), (".5", Decimal("0.5")),
    ("0.0000000005", Decimal("1e-9")),  # a non-zero value rounds up to a whole nano
    ("16Ei", Decimal(2**63 - 1)),        # binary values are capped at 2^63-1
])
def test_values(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["-1", "1e1.5", "1e100", "four", "", "1Ki1", "1\n"])
def test_what_kubernetes_would_refuse_or_mangle_is_no_quantity(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_comparisons_and_defaults_within_limits():
    assert exceeds("2", "1") and not exceeds("1", "1000m") and not exceeds("16Ei", "10Ei")
    assert within_limits({"cpu": "2", "memory": "8Gi"}, {"cpu": "1", "memory": "16Gi"}) == {"cpu": "1", "memory": "8Gi"}
    assert within_limits({"cpu": "2"}, None) == {"cpu": "2"}
