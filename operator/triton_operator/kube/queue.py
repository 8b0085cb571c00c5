"""A work queue of object keys, as client-go's: a key waiting to be processed is held
once however many events name it (ten child events during a creation become one reconcile); a
key being processed is never handed to a second worker, and if it is added meanwhile it is
processed once more afterwards; failures come back after an exponential backoff per key.

Two levels: keys added `low` (a periodic re-check, the listing after a restart or an outage of
objects that had converged) wait behind every other key, so a service created or changed while a
thousand others are re-checked is served first; a low key added again normally moves up."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from typing import Callable, Hashable


class WorkQueue:
    def __init__(self, base_delay: float = 0.5, max_delay: float = 300.0,
                 clock: Callable[[], float] = time.monotonic):
        self.base_delay, self.max_delay, self.clock = base_delay, max_delay, clock
        self._cond = threading.Condition()
        self._queue: deque[Hashable] = deque()
        self._dirty: set[Hashable] = set()
        self._low: deque[Hashable] = deque()       # served when _queue is empty
        self._low_dirty: set[Hashable] = set()
        self._processing: set[Hashable] = set()
        self._delayed: list[tuple[float, int, Hashable]] = []
        self._seq = itertools.count()
        self._failures: dict[Hashable, int] = {}
        self._closed = False
        self.adds = 0        # keys added (before coalescing), for the operator's metrics
        self.processed = 0   # keys handed to workers

    def add(self, key: Hashable, low: bool = False) -> None:
        with self._cond:
            if low:
                self._add_low(key)
            else:
                self._add(key)

    def _add(self, key: Hashable) -> None:
        self.adds += 1
        if self._closed or key in self._dirty:
            return
        self._dirty.add(key)
        self._low_dirty.discard(key)   # waiting low, it moves up (its low entry is skipped)
        if key not in self._processing:
            self._queue.append(key)
            self._cond.notify()

    def _add_low(self, key: Hashable) -> None:
        self.adds += 1
        if self._closed or key in self._dirty or key in self._low_dirty:
            return
        self._low_dirty.add(key)
        if key not in self._processing:
            self._low.append(key)
            self._cond.notify()

    def add_after(self, key: Hashable, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            heapq.heappush(self._delayed, (self.clock() + delay, next(self._seq), key))
            self._cond.notify()

    def add_rate_limited(self, key: Hashable) -> float:
        """Add after this key's next backoff step (base x 2^failures, capped); returns the delay."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        delay = min(self.max_delay, self.base_delay * (2 ** failures))
        self.add_after(key, delay)
        return delay

    def forget(self, key: Hashable) -> None:
        """The key succeeded: its next failure starts the backoff again."""
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: Hashable) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def get(self, timeout: float | None = None) -> Hashable | None:
        """The next key to process (mark it done with `done`), or None on timeout or shutdown."""
        deadline = None if timeout is None else self.clock() + timeout
        with self._cond:
            while True:
                now = self.clock()
                while self._delayed and self._delayed[0][0] <= now:
                    self._add(heapq.heappop(self._delayed)[2])
                if self._queue:
                    key = self._queue.popleft()
                    self._dirty.discard(key)
                    self._processing.add(key)
                    self.processed += 1
                    return key
                while self._low:
                    key = self._low.popleft()
                    if key not in self._low_dirty or key in self._processing:
                        continue   # moved up since, or handed out already: its entry is stale
                    self._low_dirty.discard(key)
                    self._processing.add(key)
                    self.processed += 1
                    return key
                if self._closed:
                    return None
                waits = [t - now for t in ([deadline] if deadline is not None else [])]
                if self._delayed:
                    waits.append(self._delayed[0][0] - now)
                if deadline is not None and now >= deadline:
                    return None
                self._cond.wait(min(waits) if waits else None)

    def done(self, key: Hashable) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()
            elif key in self._low_dirty:
                self._low.append(key)
                self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue) + len(self._low_dirty) + len(self._delayed)

    def idle(self) -> bool:
        """Nothing waiting (delayed retries aside) and nothing being processed."""
        with self._cond:
            return not self._queue and not self._low_dirty and not self._processing
