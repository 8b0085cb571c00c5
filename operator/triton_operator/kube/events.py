"""Kubernetes Events as the recorder in client-go posts them: what one says, and the series of
recent ones, so that a repeat raises the count of the event already posted instead of adding an
object. Pure; `client.Kube.post_event` does the posting."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


# An event repeated within this window raises the count of the one posted (client-go's
# EventCorrelator keeps such a series while the event lives; the API server keeps events an hour).
EVENT_SERIES_SECONDS = 600.0
EVENT_SERIES_MAX = 4096    # events remembered (client-go's LRU holds 4096)


class EventSeries:
    """The events posted recently, by (namespace, object, type, reason, message): their names and
    counts, so a repeat patches the count instead of adding an object. Thread-safe, bounded."""

    def __init__(self, window: float = EVENT_SERIES_SECONDS, capacity: int = EVENT_SERIES_MAX):
        self.window, self.capacity = window, capacity
        self._lock = threading.Lock()
        self._series: dict[tuple[str, ...], tuple[str, int, float]] = {}   # key -> (name, count, last)

    def seen(self, key: tuple[str, ...], now: float) -> tuple[str, int] | None:
        """(event name, its new count) when `key` was posted within the window, counting this one."""
        with self._lock:
            found = self._series.pop(key, None)
            if found is None or now - found[2] > self.window:
                return None
            name, count, _ = found
            self._series[key] = (name, count + 1, now)    # re-inserted: the most recent last
            return name, count + 1

    def posted(self, key: tuple[str, ...], name: str, now: float) -> None:
        with self._lock:
            self._series.pop(key, None)
            self._series[key] = (name, 1, now)
            while len(self._series) > self.capacity:
                self._series.pop(next(iter(self._series)))
