"""Off the per-token path: sending responses and asking whether a client went away.

Both are calls through Triton's Python backend into the server process (`response_sender.send`,
`response_sender.is_cancelled`), and the engine's thread that drains generated tokens must not
wait on them: on the GPU engine one asyncio thread drains every request's tokens, so two such
calls per token per request would stall all of them behind each one. As upstream's LLM API model
does (tensorrtllm_backend, its `llmapi` model: a cancellation thread polling every 100 ms and a
thread of its own for responses):

- `Outbox` runs sends on one thread of its own, in the order they were handed over (a request's
  tokens, then its final response, stay in order);
- `CancelWatch` asks each live request's sender every CANCEL_PERIOD_S on a thread of its own and
  keeps the answer in a flag, which the engine reads between tokens for nothing.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

log = logging.getLogger("triton_llm")

CANCEL_PERIOD_S = 0.1


class Outbox:
    """Calls handed over from any thread, run in order on one thread of their own."""

    def __init__(self, name: str = "llm-send") -> None:
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, call: Callable[[], None]) -> None:
        self._calls.put(call)

    def close(self, timeout: float = 10.0) -> None:
        """Run what was handed over, then stop."""
        self._calls.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                call()
            except Exception as e:  # noqa: BLE001 - one failed send (a client gone) stops nothing else
                log.debug("send failed: %s", e)


class CancelWatch:
    """Whether each live request's client has gone away, polled off the token path."""

    def __init__(self, period_s: float = CANCEL_PERIOD_S, name: str = "llm-cancel") -> None:
        self.period_s = period_s
        self._live: dict[int, tuple[Any, threading.Event]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def watch(self, sender: Any) -> Callable[[], bool]:
        """Start watching a request's sender; what the engine calls between tokens (a flag read)."""
        gone = threading.Event()
        with self._lock:
            self._live[id(gone)] = (sender, gone)
        return gone.is_set

    def forget(self, cancelled: Callable[[], bool]) -> None:
        """Stop watching the request whose check `watch` returned (it has finished)."""
        owner = getattr(cancelled, "__self__", None)
        with self._lock:
            self._live.pop(id(owner), None)

    def live(self) -> int:
        with self._lock:
            return len(self._live)

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(2 * self.period_s + 1.0)

    def _run(self) -> None:
        while not self._stopping.wait(self.period_s):
            with self._lock:
                live = list(self._live.values())
            for sender, gone in live:
                try:
                    if sender.is_cancelled():
                        gone.set()
                except Exception as e:  # noqa: BLE001 - a sender that cannot answer is not a cancellation
                    log.debug("is_cancelled failed: %s", e)
