"""Kubernetes resource quantities (pure), read as the operator reads them: the sizes the runtime
is given (--scratch-size: the preparation's ephemeral-storage request, which may be any quantity
the InferenceService's CRD admits) are parsed with the operator's grammar and arithmetic
(triton_operator/quantity.py, which mirrors k8s.io/apimachinery's ParseQuantity). This package is
copied alone into NVIDIA's image and cannot import the operator, so the parser is the operator's
own, copied; tests/test_shared_tables.py holds the two equal over every quantity the CRD admits.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, localcontext

# The quantities users write: a non-negative decimal with an optional SI or binary suffix or a
# short decimal exponent. Stricter than Kubernetes' own regex in two ways that only refuse what a
# child would refuse or mangle: no sign '-' (requests, limits and sizeLimit must not be negative)
# and an exponent of at most two digits (ParseQuantity truncates longer exponents to int32).
QUANTITY = r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]{1,2}))?$"
QUANTITY_MAX_LENGTH = 32

_QUANTITY_RE = re.compile(QUANTITY)
_PARTS_RE = re.compile(r"^\+?([0-9.]+)(.*)$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_MAX_BINARY = Decimal(2**63 - 1)
_NANO = Decimal("1e-9")


class QuantityError(ValueError):
    pass


def parse_quantity(text: str) -> Decimal:
    """The exact value of a quantity as Kubernetes holds it."""
    if not isinstance(text, str) or not _QUANTITY_RE.fullmatch(text):
        raise QuantityError(f"{text!r} is not a quantity such as 500m, 2, 1.5Gi or 8G")
    number, suffix = _PARTS_RE.fullmatch(text).groups()
    with localcontext() as ctx:
        ctx.prec = 80  # exact for every value the pattern admits (at most 32 characters, e<=99)
        value = Decimal(number if not number.endswith(".") else number + "0")
        if suffix in _BINARY:
            value = min(value * _BINARY[suffix], _MAX_BINARY)
        elif suffix in _DECIMAL:
            value = value.scaleb(_DECIMAL[suffix])
        else:  # e/E exponent
            value = value.scaleb(int(suffix[1:]))
        if value:
            value = value.quantize(_NANO, rounding=ROUND_CEILING) if value.as_tuple().exponent < -9 else value
    return value


def quantity_bytes(text: str) -> int:
    """A size such as 40Gi or 500M in whole bytes (a fraction of a byte is dropped)."""
    return int(parse_quantity(text.strip()))
