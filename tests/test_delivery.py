"""Sends and cancellation checks off the engine's token path (runtime/triton_runtime/serving/
delivery.py). The senders here stand in for python_backend's response senders, whose calls go
to the Triton server process; the real ones are driven by e2e/test_llm.py."""

from __future__ import annotations

import threading
import time

from triton_runtime.serving.delivery import CancelWatch, Outbox


class SlowSender:
    """A response sender whose calls take `cost` seconds each (a round trip to the server)."""

    def __init__(self, cost: float, cancelled: bool = False) -> None:
        self.cost, self.cancelled = cost, cancelled
        self.sent: list[str] = []
        self.asked = 0

    def send(self, text: str) -> None:
        time.sleep(self.cost)
        self.sent.append(text)

    def is_cancelled(self) -> bool:
        self.asked += 1
        time.sleep(self.cost)
        return self.cancelled


def test_the_outbox_keeps_order_and_never_makes_the_caller_wait():
    outbox = Outbox()
    sender = SlowSender(0.02)
    t0 = time.perf_counter()
    for i in range(10):
        outbox.put(lambda i=i: sender.send(f"token {i}"))
    handed = time.perf_counter() - t0
    outbox.close()
    assert sender.sent == [f"token {i}" for i in range(10)]
    assert handed < 0.02, f"handing over 10 sends of 20 ms took {handed * 1000:.1f} ms"


def test_one_failed_send_stops_nothing_else():
    outbox = Outbox()
    done: list[int] = []

    def broken() -> None:
        raise RuntimeError("the client is gone")

    outbox.put(lambda: done.append(1))
    outbox.put(broken)
    outbox.put(lambda: done.append(2))
    outbox.close()
    assert done == [1, 2]


def test_a_client_that_went_away_is_seen_within_a_period_and_the_check_costs_nothing():
    watch = CancelWatch(period_s=0.02)
    try:
        staying, leaving = SlowSender(0.005), SlowSender(0.005, cancelled=True)
        stays, leaves = watch.watch(staying), watch.watch(leaving)
        assert not stays() and not leaves()
        deadline = time.monotonic() + 5
        while not leaves() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert leaves() and not stays()
        # the engine's check is a flag read: no call reaches the sender
        asked = staying.asked
        t0 = time.perf_counter()
        for _ in range(1000):
            stays()
        assert time.perf_counter() - t0 < 0.05 and staying.asked - asked <= 2
        watch.forget(leaves)
        watch.forget(stays)
        assert watch.live() == 0
        asked = staying.asked
        time.sleep(0.1)
        assert staying.asked == asked, "a finished request's sender is not asked again"
    finally:
        watch.close()


def test_a_sender_that_cannot_answer_is_not_a_cancellation():
    class Broken:
        def is_cancelled(self) -> bool:
            raise RuntimeError("stub gone")

    watch = CancelWatch(period_s=0.01)
    try:
        check = watch.watch(Broken())
        time.sleep(0.1)
        assert check() is False
    finally:
        watch.close()


def test_closing_runs_what_was_handed_over_first():
    outbox = Outbox()
    gate = threading.Event()
    done: list[str] = []
    outbox.put(gate.wait)
    outbox.put(lambda: done.append("last response"))
    gate.set()
    outbox.close()
    assert done == ["last response"]
