"""Bounded logging of repeated failures: during an API or Prometheus outage every object fails
every few seconds; the log gets the first failure of a kind at once, then one summary line per
interval with the count and the latest message, and one line when the failures stop. The log
grows with time, not with the fleet."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable


class FailureLog:
    def __init__(self, logger: logging.Logger, interval: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        self.logger, self.interval, self.clock = logger, interval, clock
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[int, str]] = {}   # topic -> (failures since last line, latest message)
        self._last: dict[str, float] = {}                 # topic -> when its last line was written

    def failure(self, topic: str, message: str) -> None:
        now = self.clock()
        with self._lock:
            count, _ = self._pending.get(topic, (0, ""))
            last = self._last.get(topic)
            if last is None:
                self._last[topic] = now
                self._pending[topic] = (0, message)
                line = f"{topic}: {message}"
            elif now - last >= self.interval:
                self._last[topic] = now
                self._pending[topic] = (0, message)
                line = f"{topic}: {count + 1} failures in the last {now - last:.0f}s; latest: {message}"
            else:
                self._pending[topic] = (count + 1, message)
                return
        self.logger.warning("%s", line)

    def success(self, topic: str) -> None:
        """The failures of `topic` stopped: say so once."""
        with self._lock:
            if topic not in self._last:
                return
            count, _ = self._pending.pop(topic, (0, ""))
            del self._last[topic]
        self.logger.warning("%s: recovered%s", topic, f" after {count} more failures" if count else "")
