"""Spill-over placement: a table per rule of issue 12, and a small cluster model that replays
flapping capacity and a whole shortage-and-return to check the properties (no ping-pong, ready
replicas never drop by more than one below desired while moving)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from triton_operator.planning import placement as pl
from triton_operator.planning.placement import ClassState, Remembered, Spill, place

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
SPILL = Spill(after_s=120, return_after_s=600)
ORDER = ["h100", "h200", "a100-80gb"]
GPUS = {c: 1 for c in ORDER}


def ago(s: float) -> datetime:
    return T0 - timedelta(seconds=s)


def run(total, state, room, previous=None, engines=None, order=ORDER, spill=SPILL, skipped=()):
    return place(total, order, GPUS, state, room, engines, spill, previous or {}, T0, skipped)


def test_without_spill_everything_stays_on_the_preferred_class():
    p = run(3, {"h100": ClassState(3, 1, 1, (ago(900),) * 2)}, {"h200": 8}, spill=None)
    assert p.replicas() == {"h100": 3} and not p.moves and p.classes[0].reason == pl.PREFERRED


def test_full_preferred_class_spills_the_unschedulable_replicas_after_the_wait():
    state = {"h100": ClassState(3, 1, 1, (ago(130), ago(125)), "0/9 nodes are available: 2 Insufficient nvidia.com/gpu")}
    p = run(3, state, {"h100": 0, "h200": 5, "a100-80gb": 4})
    assert p.replicas() == {"h100": 1, "h200": 2, "a100-80gb": 0}
    (move,) = p.moves
    assert (move.kind, move.source, move.target, move.replicas) == (pl.SPILL_MOVE, "h100", "h200", 2)
    assert "Insufficient nvidia.com/gpu" in move.why and "over 120s" in move.why
    assert [d.reason for d in p.classes] == [pl.FULL, pl.SPILLED, pl.STANDBY]
    assert p.shortfall is None


def test_before_the_wait_nothing_moves_and_the_timer_is_set():
    state = {"h100": ClassState(3, 1, 1, (ago(60), ago(20)))}
    p = run(3, state, {"h100": 0, "h200": 5})
    assert p.replicas()["h100"] == 3 and not p.moves
    assert p.wake_after == pytest.approx(60) and "since 23:59:00Z" in p.waiting and "unschedulable for 120s" in p.waiting
    assert p.classes[0].reason == pl.FULL


def test_partial_room_fills_the_next_classes_in_order():
    state = {"h100": ClassState(4, 1, 1, (ago(200),) * 3)}
    p = run(4, state, {"h100": 0, "h200": 1, "a100-80gb": 5})
    assert p.replicas() == {"h100": 1, "h200": 1, "a100-80gb": 2}
    assert [(m.target, m.replicas) for m in p.moves] == [("h200", 1), ("a100-80gb", 2)]


def test_running_replicas_stay_and_a_pending_spill_replica_counts_against_room():
    """h200 was given 2 replicas last pass; they are not on a node yet: its room of 2 is theirs."""
    state = {"h100": ClassState(1, 1, 1), "h200": ClassState(2, 0, 0)}
    p = run(3, state, {"h100": 0, "h200": 2}, previous={"h100": Remembered(pl.FULL, ago(10))})
    assert p.replicas() == {"h100": 1, "h200": 2, "a100-80gb": 0} and not p.moves
    assert p.decision("h200").reason == pl.SPILLED


def test_no_class_takes_replicas_before_the_model_is_prepared_then_they_move():
    state = {"h100": ClassState(2, 0, 0, (ago(300),) * 2)}
    building = run(2, state, {"h100": 0, "h200": 8}, engines={"h100"}, order=["h100", "h200"])
    assert building.replicas() == {"h100": 2, "h200": 0} and not building.moves
    assert building.decision("h200").reason == pl.PREPARING
    assert "wait for the model to be prepared before they move to h200" in building.waiting
    assert "h200: model not prepared yet" in building.shortfall
    built = run(2, state, {"h100": 0, "h200": 8}, engines={"h100", "h200"}, order=["h100", "h200"])
    assert built.replicas() == {"h100": 0, "h200": 2}


def test_every_class_full_names_the_shortfall_per_class():
    state = {"h100": ClassState(3, 1, 1, (ago(500),) * 2)}
    p = run(3, state, {"h100": 0, "h200": 0, "a100-80gb": 0},
            skipped=[("l4", "ModelDoesNotFit")])
    assert p.replicas()["h100"] == 3 and not p.moves
    assert p.shortfall == ("2 replica(s) cannot be placed on any GPU class: h100: 2 replica(s) x 1 GPU(s) "
                           "unschedulable; h200: no room; a100-80gb: no room; l4: skipped (ModelDoesNotFit)")


def test_room_on_the_preferred_class_starts_the_return_clock():
    state = {"h100": ClassState(1, 1, 1), "h200": ClassState(2, 2, 2)}
    p = run(3, state, {"h100": 1, "h200": 0})
    assert p.replicas() == {"h100": 1, "h200": 2, "a100-80gb": 0} and not p.moves
    assert p.classes[0].reason == pl.ROOM_TO_RETURN and p.classes[0].since == T0
    assert p.wake_after == pytest.approx(600)


def test_return_moves_one_replica_at_a_time_and_never_below_the_ready_count():
    spilled = {"h100": ClassState(1, 1, 1), "h200": ClassState(2, 2, 2)}
    start = run(3, spilled, {"h100": 2, "h200": 0}, previous={"h100": Remembered(pl.ROOM_TO_RETURN, ago(601))})
    assert start.replicas() == {"h100": 2, "h200": 2, "a100-80gb": 0} and start.returning
    assert [m.kind for m in start.moves] == [pl.RETURN_START]
    remembered = {"h100": Remembered(pl.RETURNING, ago(601))}
    # The new h100 replica loads: nothing stops on h200 yet.
    loading = run(3, {"h100": ClassState(2, 2, 1), "h200": ClassState(2, 2, 2)}, {"h100": 1}, remembered)
    assert loading.replicas() == {"h100": 2, "h200": 2, "a100-80gb": 0} and not loading.moves
    # Ready: one stops on h200, and with room left and the clock carried over, the next starts.
    ready = run(3, {"h100": ClassState(2, 2, 2), "h200": ClassState(2, 2, 2)}, {"h100": 1}, remembered)
    assert [m.kind for m in ready.moves] == [pl.MOVED_BACK, pl.RETURN_START]
    assert ready.replicas() == {"h100": 3, "h200": 1, "a100-80gb": 0}


def test_a_return_that_cannot_be_scheduled_is_given_up_at_once():
    remembered = {"h100": Remembered(pl.RETURNING, ago(700))}
    state = {"h100": ClassState(2, 1, 1, (ago(3),)), "h200": ClassState(2, 2, 2)}
    p = run(3, state, {"h100": 0}, remembered)
    assert p.replicas() == {"h100": 1, "h200": 2, "a100-80gb": 0}
    assert [m.kind for m in p.moves] == [pl.RETURN_ABANDONED]
    assert p.classes[0].reason == pl.FULL and p.classes[0].since == T0, "the room clock starts over"


def test_scale_up_during_a_shortage_goes_straight_to_room_and_scale_down_takes_spill_first():
    state = {"h100": ClassState(1, 1, 1), "h200": ClassState(2, 2, 2)}
    up = run(6, state, {"h100": 1, "h200": 2, "a100-80gb": 8}, {"h100": Remembered(pl.FULL, ago(10))})
    assert up.replicas() == {"h100": 2, "h200": 4, "a100-80gb": 0}
    down = run(2, state, {"h100": 0}, {"h100": Remembered(pl.FULL, ago(10))})
    assert down.replicas() == {"h100": 1, "h200": 1, "a100-80gb": 0}


def test_unknown_room_spills_to_the_next_class_and_probes_the_return():
    state = {"h100": ClassState(2, 0, 0, (ago(200),) * 2)}
    p = run(2, state, None)
    assert p.replicas() == {"h100": 0, "h200": 2, "a100-80gb": 0}
    back = run(2, {"h100": ClassState(0), "h200": ClassState(2, 2, 2)}, None,
               {"h100": Remembered(pl.ROOM_TO_RETURN, ago(600))})
    assert back.returning and back.replicas()["h100"] == 1


# -- a small cluster: the scheduler places a pod where there is room, a placed pod is ready at the next step.

class Cluster:
    def __init__(self, capacity: dict[str, int]):
        self.capacity = dict(capacity)
        self.pods: dict[str, list[dict]] = {c: [] for c in capacity}

    def apply(self, replicas: dict[str, int], now: datetime) -> None:
        for c, want in replicas.items():
            pods = self.pods[c]
            while len(pods) > want:  # a ReplicaSet removes unscheduled, then unready, then newest
                pods.sort(key=lambda p: (p["node"], p["ready"]))
                pods.pop(0)
            while len(pods) < want:
                pods.append({"node": False, "ready": False, "since": None})
        for c, pods in self.pods.items():
            for p in pods:
                if p["node"]:
                    p["ready"] = True
            used = sum(1 for p in pods if p["node"])
            for p in pods:
                if not p["node"]:
                    if used < self.capacity[c]:
                        p["node"], used = True, used + 1
                    elif p["since"] is None:
                        p["since"] = now

    def state(self, replicas: dict[str, int]) -> dict[str, ClassState]:
        return {c: ClassState(replicas.get(c, 0), sum(p["node"] for p in pods), sum(p["ready"] for p in pods),
                              tuple(p["since"] for p in pods if not p["node"] and p["since"]))
                for c, pods in self.pods.items()}

    def room(self) -> dict[str, int]:
        return {c: self.capacity[c] - sum(p["node"] for p in pods) for c, pods in self.pods.items()}

    def ready(self) -> int:
        return sum(p["ready"] for pods in self.pods.values() for p in pods)


def replay(cluster: Cluster, total: int, steps: int, step_s: float, capacity_at=None):
    replicas: dict[str, int] = {"h100": 0, "h200": 0}
    previous: dict[str, Remembered] = {}
    history = []
    for i in range(steps):
        now = T0 + timedelta(seconds=i * step_s)
        if capacity_at:
            cluster.capacity.update(capacity_at(i * step_s))
        p = place(total, ["h100", "h200"], {"h100": 1, "h200": 1}, cluster.state(replicas), cluster.room(),
                  None, SPILL, previous, now)
        replicas = p.replicas()
        previous = {d.gpu_class: Remembered(d.reason, d.since) for d in p.classes}
        cluster.apply(replicas, now)
        history.append((i * step_s, dict(replicas), cluster.ready(), [m.kind for m in p.moves]))
    return history


def test_a_shortage_and_its_end_spill_and_return_without_losing_ready_replicas():
    cluster = Cluster({"h100": 1, "h200": 8})
    history = replay(cluster, 3, 200, 10, capacity_at=lambda t: {"h100": 1 if t < 600 else 8})
    kinds = [k for _, _, _, moves in history for k in moves]
    assert kinds.count(pl.SPILL_MOVE) == 1 and kinds.count(pl.MOVED_BACK) == 2
    assert history[-1][1] == {"h100": 3, "h200": 0}
    spilled_at = next(t for t, _, _, m in history if pl.SPILL_MOVE in m)
    assert 120 <= spilled_at <= 140, "after `after`"
    first_back = next(t for t, _, _, m in history if pl.RETURN_START in m)
    assert first_back >= 600 + 600, "after returnAfter of room"
    after_ready = [ready for t, _, ready, _ in history if t > spilled_at + 20]
    assert min(after_ready) >= 3, "a move never drops a ready replica before its replacement is ready"


def test_flapping_capacity_moves_nothing_back_and_forth():
    """h100 frees one GPU for 5 minutes out of every 8: never the 10 minutes a return needs."""
    cluster = Cluster({"h100": 1, "h200": 8})
    history = replay(cluster, 3, 400, 10, capacity_at=lambda t: {"h100": 2 if (t // 60) % 8 < 5 and t > 300 else 1})
    kinds = [k for _, _, _, moves in history for k in moves]
    assert kinds.count(pl.SPILL_MOVE) == 1, kinds
    assert pl.RETURN_START not in kinds and pl.MOVED_BACK not in kinds
