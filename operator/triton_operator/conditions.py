"""metav1.Condition helpers (pure): set a condition, keeping lastTransitionTime when unchanged."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

READY, PROGRESSING, DEGRADED, MODEL_READY = "Ready", "Progressing", "Degraded", "ModelReady"
# Messages are for people: the API server's answers can list every field of a rejected object.
MAX_MESSAGE = 2048
SCALED_TO_ZERO = "ScaledToZero"  # only on services with autoscaling.minReplicas 0


def bounded(message: str) -> str:
    """A message cut to MAX_MESSAGE characters."""
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE - 1] + "…"


def timestamp(now: datetime) -> str:
    return now.astimezone(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: Any) -> datetime | None:
    """A Kubernetes timestamp ("2026-11-26T12:00:00Z", RFC 3339) as an aware datetime; None when
    absent or not one."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def find(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def set_condition(conditions: list[dict[str, Any]], type_: str, status: bool | str, reason: str,
                  message: str, generation: int | None, now: datetime) -> list[dict[str, Any]]:
    """A new list with `type_` set; lastTransitionTime moves only when status changes."""
    value = status if isinstance(status, str) else ("True" if status else "False")
    old = find(conditions, type_)
    changed = old is None or old.get("status") != value
    cond = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": bounded(message),
        "lastTransitionTime": timestamp(now) if changed else old["lastTransitionTime"],
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    out = [c for c in conditions if c.get("type") != type_]
    out.append(cond)
    order = {READY: 0, PROGRESSING: 1, DEGRADED: 2, MODEL_READY: 3}
    return sorted(out, key=lambda c: (order.get(c["type"], 9), c["type"]))


def is_true(conditions: list[dict[str, Any]], type_: str) -> bool:
    c = find(conditions, type_)
    return bool(c and c.get("status") == "True")
