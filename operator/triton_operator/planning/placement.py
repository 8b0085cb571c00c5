"""Spill-over placement (pure): how many replicas run on each GPU class, and why.

Inputs are what the cache shows (each class's Deployment and pods, the free GPUs on its nodes,
whether a tensorrt-llm model is prepared), what status remembered (each class's reason and since when), the spec's
durations and the clock. The output is the replicas per class, a reason per class, the moves
made (for Events) and when to look again.

The rules (issue 12):
- Replicas go to the preferred class (the first in `order`). Replicas that cannot be scheduled
  there for `after` move to the next class, in order, that has room and may serve (a tensorrt-llm
  model is prepared once for every class); replicas that run stay where they are. While the model
  is being prepared no class gets any (they move once it is ready).
- While replicas are spilled, a scale-up places what the preferred class has room for there and
  the rest straight on the spill classes (the shortage is known; no new wait of `after`). A
  scale-down removes replicas from the least preferred class first.
- Return: when the preferred class has had room for one more replica for `returnAfter`, one replica
  is started there (a surge of one); once it is ready, one replica stops on the least preferred
  class, so ready replicas never drop. Then the next, while the room lasts. A surge that turns out
  unschedulable is given up at once and the room clock starts over.
- No ping-pong: stuck replicas only move down the order, replicas only come back to the preferred
  class and only after `returnAfter` of continuous room (returnAfter >= after is enforced by the
  API), and capacity that comes and goes within returnAfter moves nothing.
- Every class full: the replicas stay pending on the preferred class and `shortfall` names, per
  class, what is missing.

Room is "replicas that fit on free GPUs now" per class (capacity.room); None means unknown (the
operator does not watch nodes): then spill tries the next class anyway, and a return is tried
every returnAfter and given up if it cannot be scheduled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Collection, Mapping, Sequence

PREFERRED, FULL, ROOM_TO_RETURN, RETURNING = "Preferred", "Full", "RoomToReturn", "Returning"
SPILLED, STANDBY, NO_ROOM, ENGINE_BUILDING = "SpilledOver", "Standby", "NoRoom", "Preparing"
# Move kinds (Event reasons)
SPILL_MOVE, RETURN_START, MOVED_BACK, RETURN_ABANDONED = "SpilledOver", "ReturnStarted", "MovedBack", "ReturnAbandoned"
UNLIMITED = 10**9
# A pod the scheduler cannot place because of a volume is not short of GPUs: another class would
# not help, so it never spills (status reports it as Unschedulable).
_NOT_CAPACITY = re.compile(r"volume|persistentvolumeclaim", re.IGNORECASE)


def capacity_shortage(scheduler_message: str) -> bool:
    """Whether an Unschedulable pod lacks room (GPUs, CPU, memory, a node of its class) rather
    than something no other class has either."""
    return not _NOT_CAPACITY.search(scheduler_message or "")


@dataclass(frozen=True)
class ClassState:
    """What runs on one class now."""

    replicas: int = 0                             # the Deployment's spec.replicas (0: no Deployment)
    bound: int = 0                                # its pods that are on a node
    ready: int = 0                                # its pods that are ready
    unschedulable: tuple[datetime, ...] = ()      # since when each pod the scheduler cannot place for lack of room
    scheduler_message: str = ""                   # the scheduler's words for one of them


@dataclass(frozen=True)
class Remembered:
    """A class's reason and since when, as status last showed them."""

    reason: str
    since: datetime | None = None


@dataclass(frozen=True)
class Spill:
    after_s: float
    return_after_s: float


@dataclass(frozen=True)
class Move:
    kind: str          # SPILL_MOVE | RETURN_START | MOVED_BACK | RETURN_ABANDONED
    source: str
    target: str
    replicas: int
    why: str


@dataclass(frozen=True)
class ClassDecision:
    gpu_class: str
    replicas: int
    reason: str
    message: str
    since: datetime


@dataclass(frozen=True)
class Placement:
    classes: tuple[ClassDecision, ...]             # every usable class, the preferred first
    moves: tuple[Move, ...] = ()
    shortfall: str | None = None                   # every class is full: what is missing, per class
    waiting: str | None = None                     # replicas wait for `after` or for the model's preparation
    wake_after: float | None = None                # seconds until a timer here may change the answer
    returning: bool = False                        # one replica above the total is being started on the preferred class

    def replicas(self) -> dict[str, int]:
        return {d.gpu_class: d.replicas for d in self.classes}

    def decision(self, gpu_class: str) -> ClassDecision | None:
        return next((d for d in self.classes if d.gpu_class == gpu_class), None)


def _age(now: datetime, since: datetime) -> float:
    return (now - since).total_seconds()


def _fmt_s(x: float) -> str:
    return f"{x:.0f}s" if x >= 1 else f"{x:.1f}s"


def place(total: int, order: Sequence[str], gpus: Mapping[str, int], state: Mapping[str, ClassState],
          room: Mapping[str, int] | None, engines_ready: Collection[str] | None, spill: Spill | None,
          previous: Mapping[str, Remembered], now: datetime,
          skipped: Sequence[tuple[str, str]] = ()) -> Placement:
    """Replicas per class for `total` replicas over `order` (the preferred class first)."""
    preferred = order[0]
    empty = ClassState()
    st = {c: state.get(c, empty) for c in order}

    def since(c: str, reason: str, carry: Collection[str] = ()) -> datetime:
        prev = previous.get(c)
        if prev is not None and prev.since is not None and (prev.reason == reason or prev.reason in carry):
            return prev.since
        return now

    if spill is None or len(order) == 1:
        msg = f"{total} replica(s)"
        return Placement((ClassDecision(preferred, total, PREFERRED, msg, since(preferred, PREFERRED)),))

    a = {c: st[c].replicas for c in order}
    moves: list[Move] = []
    wake: list[float] = []
    engine_ok = (lambda c: True) if engines_ready is None else (lambda c: c in engines_ready)

    def avail(c: str) -> int:
        """Replicas class c can still take: room on free GPUs less its replicas not yet on a node."""
        if room is None:
            return UNLIMITED
        return max(0, room.get(c, 0) - max(0, a[c] - st[c].bound))

    def stuck(c: str) -> int:
        """Replicas of c the scheduler has not placed for `after`, that the ReplicaSet keeps
        (a Deployment scaled down removes unscheduled pods first)."""
        old = sum(1 for t in st[c].unschedulable if _age(now, t) >= spill.after_s)
        return min(old, max(0, a[c] - st[c].bound))

    spilled = lambda: any(a[c] > 0 for c in order[1:])  # noqa: E731

    # 1. A return in progress: one replica above the total, started on the preferred class.
    prev_p = previous.get(preferred)
    returning = (prev_p is not None and prev_p.reason == RETURNING and sum(a.values()) == total + 1
                 and a[preferred] >= 1 and spilled())
    if returning:
        if st[preferred].unschedulable:
            a[preferred] -= 1
            returning = False
            moves.append(Move(RETURN_ABANDONED, preferred, preferred, 1,
                              f"the replica started on {preferred} to move one back cannot be scheduled "
                              f"after all; replicas stay where they are"))
        elif st[preferred].ready >= a[preferred]:
            source = next(c for c in reversed(order) if c != preferred and a[c] > 0)
            a[source] -= 1
            returning = False
            moves.append(Move(MOVED_BACK, source, preferred, 1,
                              f"one replica moved back from {source} to {preferred}: its replacement on "
                              f"{preferred} is ready"))

    # 2. The total (the user's replicas or the autoscaler's) changed.
    target = total + (1 if returning else 0)
    diff = target - sum(a.values())
    if diff > 0:
        if spilled():
            for c in order:
                if diff == 0:
                    break
                if c != preferred and not engine_ok(c):
                    continue
                k = min(diff, avail(c))
                a[c] += k
                diff -= k
        a[preferred] += diff
    elif diff < 0:
        for c in reversed(order):
            k = min(-diff, a[c])
            a[c] -= k
            diff += k

    # 3. Spill: replicas the scheduler could not place for `after` go down the order.
    waiting: list[str] = []
    short: dict[str, int] = {}
    engine_wait: set[str] = set()
    for i, c in enumerate(order):
        young = [t for t in st[c].unschedulable if _age(now, t) < spill.after_s]
        if young and a[c] > st[c].bound:
            # Worded without a countdown: the message goes into status, which is written only when it changes.
            wake.append(min(spill.after_s - _age(now, t) for t in young))
            waiting.append(f"{len(young)} replica(s) unschedulable on {c} since {_clock(min(young))}; they move to "
                           f"another class once unschedulable for {_fmt_s(spill.after_s)}")
        n = stuck(c)
        if n == 0:
            continue
        for d in order[i + 1:]:
            if not engine_ok(d):
                engine_wait.add(d)
                continue
            k = min(n, avail(d))
            if k <= 0:
                continue
            a[c] -= k
            a[d] += k
            n -= k
            words = _first_clause(st[c].scheduler_message)
            moves.append(Move(SPILL_MOVE, c, d, k,
                              f"{k} replica(s) moved from {c} to {d}: unschedulable on {c} for over "
                              f"{_fmt_s(spill.after_s)}" + (f" ({words})" if words else "")))
            if n == 0:
                break
        if n > 0:
            short[c] = n
            if engine_wait:
                waiting.append(f"{n} replica(s) of {c} wait for the model to be prepared before they move to "
                               f"{', '.join(sorted(engine_wait))}")

    # 4. Return: the preferred class has had room for one more replica for `returnAfter`.
    p_room_since: datetime | None = None
    if not returning and spilled() and not st[preferred].unschedulable and preferred not in short:
        if avail(preferred) >= 1:
            p_room_since = since(preferred, ROOM_TO_RETURN, carry=(RETURNING,))
            left = spill.return_after_s - _age(now, p_room_since)
            if left <= 0:
                a[preferred] += 1
                returning = True
                source = next(c for c in reversed(order) if c != preferred and a[c] > 0)
                moves.append(Move(RETURN_START, source, preferred, 1,
                                  f"{preferred} has had room for {_fmt_s(spill.return_after_s)}: starting one "
                                  f"replica there to replace one on {source}"))
            else:
                wake.append(left)

    # Reasons per class.
    decisions: list[ClassDecision] = []
    p_state = st[preferred]
    if returning:
        reason = RETURNING
        msg = f"a replica is starting on {preferred} to replace one on a spill class"
        p_since = p_room_since or since(preferred, RETURNING, carry=(ROOM_TO_RETURN,))
    elif p_room_since is not None:
        reason = ROOM_TO_RETURN
        msg = (f"room for a replica since {_clock(p_room_since)}; one moves back once the room has lasted "
               f"{_fmt_s(spill.return_after_s)}")
        p_since = p_room_since
    elif spilled() or p_state.unschedulable or preferred in short:
        reason = FULL
        msg = f"no room on {preferred}" + (f": {_first_clause(p_state.scheduler_message)}" if p_state.scheduler_message else "")
        p_since = since(preferred, FULL)
    else:
        reason, msg, p_since = PREFERRED, f"{a[preferred]} replica(s)", since(preferred, PREFERRED)
    decisions.append(ClassDecision(preferred, a[preferred], reason, msg, p_since))
    for c in order[1:]:
        if a[c] > 0:
            reason, msg = SPILLED, f"{a[c]} replica(s) while {preferred} is full"
            if st[c].unschedulable:
                reason, msg = FULL, f"{a[c]} replica(s), some unschedulable: {_first_clause(st[c].scheduler_message)}"
        elif not engine_ok(c):
            reason, msg = ENGINE_BUILDING, "takes replicas once the model is prepared"
        elif room is not None and avail(c) == 0:
            reason, msg = NO_ROOM, "no free GPUs for a replica"
        else:
            reason, msg = STANDBY, f"takes replicas when {preferred} is full"
        decisions.append(ClassDecision(c, a[c], reason, msg, since(c, reason)))

    shortfall = None
    if short:
        missing = sum(short.values())
        parts = []
        for c in order:
            k = short.get(c, 0)
            if k:
                parts.append(f"{c}: {k} replica(s) x {gpus.get(c, 1)} GPU(s) unschedulable")
            elif c in engine_wait:
                parts.append(f"{c}: model not prepared yet")
            else:
                parts.append(f"{c}: no room" if room is not None else f"{c}: no room known")
        parts += [f"{c}: skipped ({why})" for c, why in skipped]
        shortfall = f"{missing} replica(s) cannot be placed on any GPU class: " + "; ".join(parts)
    wake_after = min(wake) if wake else None
    return Placement(tuple(decisions), tuple(moves), shortfall, "; ".join(waiting) or None,
                     None if wake_after is None else max(0.0, wake_after), returning)


def _clock(t: datetime) -> str:
    return t.strftime("%H:%M:%SZ")


def _first_clause(message: str, limit: int = 160) -> str:
    """The scheduler's summary ('0/9 nodes are available: 2 Insufficient nvidia.com/gpu, ...'),
    shortened for an Event."""
    text = " ".join(message.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
