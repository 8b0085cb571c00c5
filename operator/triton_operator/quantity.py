"""Kubernetes resource quantities (pure): the syntax the CRD admits and the value Kubernetes
compares, so that `render` and the API server's CEL `quantity()` agree on request <= limit.

Mirrors k8s.io/apimachinery/pkg/api/resource (ParseQuantity, v0.36): values are exact decimals;
a non-zero value is rounded up to a whole nano (1n); binary-suffixed values (Ki, Mi, ...) are
capped at 2^63-1, so `16Ei` and `10Ei` compare equal there and here.
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
# The API server stores a quantity in its canonical form, whose exponent can have three digits
# ("1000e99" is stored as "1e102"): what it hands back is read with any exponent.
_STORED_RE = re.compile(QUANTITY.replace("[0-9]{1,2}", "[0-9]{1,3}"))
_PARTS_RE = re.compile(r"^\+?([0-9.]+)(.*)$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_MAX_BINARY = Decimal(2**63 - 1)
_NANO = Decimal("1e-9")


class QuantityError(ValueError):
    pass


def parse_quantity(text: str, stored: bool = False) -> Decimal:
    """The exact value of a quantity as Kubernetes holds it (`stored`: as the API server wrote it)."""
    if not isinstance(text, str) or not (_STORED_RE if stored else _QUANTITY_RE).fullmatch(text):
        raise QuantityError(f"{text!r} is not a quantity such as 500m, 2, 1.5Gi or 8G")
    number, suffix = _PARTS_RE.fullmatch(text).groups()
    with localcontext() as ctx:
        ctx.prec = 80  # exact for every value the patterns admit (at most 32 characters, e<=999)
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


def exceeds(request: str, limit: str) -> bool:
    """Whether a request is larger than its limit (Kubernetes refuses such a container)."""
    return parse_quantity(request) > parse_quantity(limit)


def within_limits(defaults: dict[str, str], limits: dict[str, str] | None) -> dict[str, str]:
    """Default requests, each lowered to its limit where the limit is lower: Kubernetes refuses a
    request above its limit, and itself defaults a missing request to the limit."""
    return {name: limit if (limit := (limits or {}).get(name)) is not None and exceeds(value, limit) else value
            for name, value in defaults.items()}
