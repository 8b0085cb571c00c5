"""Trace CSV parsing (pure: lines in, requests out; the caller opens the file).

The format is the Azure LLM inference trace 2023's: a header `TIMESTAMP,ContextTokens,
GeneratedTokens`, one row per request in arrival order. TIMESTAMP is a date-time
(`2023-11-16 18:15:46.6805900`, more than 6 fractional digits allowed) or a number of seconds.
Arrivals are returned in seconds from the first row.
"""

from __future__ import annotations

import csv
import math
import re
from datetime import datetime
from typing import Iterable

from .workload import Request, WorkloadError

TIME_COLUMN, PROMPT_COLUMN, OUTPUT_COLUMN = "TIMESTAMP", "ContextTokens", "GeneratedTokens"
_FRACTION = re.compile(r"(\.\d{6})\d+")


def _seconds(raw: str) -> float | datetime:
    text = raw.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ValueError(text)
        return value
    return datetime.fromisoformat(_FRACTION.sub(r"\1", text))


def _count(raw: str, column: str, where: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise WorkloadError(f"{where}: {column} {raw!r} is not a whole number") from None
    if value < 0:
        raise WorkloadError(f"{where}: {column} must be 0 or more, got {value}")
    return value


def parse_trace(lines: Iterable[str], name: str = "trace", need_tokens: bool = True) -> list[Request]:
    """Requests from CSV lines. `need_tokens` False accepts a trace with TIMESTAMP only (for
    models that are not LLMs). Raises WorkloadError with a one-line message on bad input."""
    reader = csv.DictReader(lines)
    header = [h.strip() for h in (reader.fieldnames or [])]
    if not header:
        raise WorkloadError(f"{name}: empty trace (expected a header {TIME_COLUMN},{PROMPT_COLUMN},{OUTPUT_COLUMN})")
    needed = [TIME_COLUMN] + ([PROMPT_COLUMN, OUTPUT_COLUMN] if need_tokens else [])
    missing = [c for c in needed if c not in header]
    if missing:
        raise WorkloadError(f"{name}: missing column(s) {', '.join(missing)}; found {', '.join(header)}")
    reader.fieldnames = header
    has_tokens = PROMPT_COLUMN in header and OUTPUT_COLUMN in header
    out: list[Request] = []
    first: float | datetime | None = None
    previous = -math.inf
    for row in reader:
        where = f"{name} line {reader.line_num}"
        raw_time = row.get(TIME_COLUMN)
        if raw_time is None or raw_time.strip() == "":
            raise WorkloadError(f"{where}: empty {TIME_COLUMN}")
        try:
            stamp = _seconds(raw_time)
        except ValueError:
            raise WorkloadError(f"{where}: {TIME_COLUMN} {raw_time!r} is neither a date-time nor a number of seconds") from None
        if first is None:
            first = stamp
        if type(stamp) is not type(first):
            raise WorkloadError(f"{where}: {TIME_COLUMN} mixes date-times and numbers")
        if isinstance(stamp, datetime) and (stamp.tzinfo is None) != (first.tzinfo is None):  # type: ignore[union-attr]
            raise WorkloadError(f"{where}: {TIME_COLUMN} mixes date-times with and without a time zone")
        offset = (stamp - first).total_seconds() if isinstance(stamp, datetime) else stamp - first  # type: ignore[operator]
        if offset < previous:
            raise WorkloadError(f"{where}: trace is not sorted by {TIME_COLUMN} ({raw_time.strip()} comes after a later row)")
        previous = offset
        if has_tokens:
            prompt = _count(row.get(PROMPT_COLUMN) or "", PROMPT_COLUMN, where)
            output = _count(row.get(OUTPUT_COLUMN) or "", OUTPUT_COLUMN, where)
            out.append(Request(offset, prompt, max(1, output)))
        else:
            out.append(Request(offset))
    if not out:
        raise WorkloadError(f"{name}: the trace has a header but no requests")
    return out
