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
SPILLED, STANDBY, NO_ROOM, PREPARING = "SpilledOver", "Standby", "NoRoom", "Preparing"
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
          room: Mapping[str, int] | None, prepared: Collection[str] | None, spill: Spill | None,
          previous: Mapping[str, Remembered], now: datetime,
          skipped: Sequence[tuple[str, str]] = ()) -> Placement:
    """Replicas per class for `total` replicas over `order` (the preferred class first).

    The steps follow the rules above, in this order: finish a return in progress, follow a changed
    total, spill what is stuck, start a return; then say why per class and what is missing."""
    preferred = order[0]
    if spill is None or len(order) == 1:
        since = _since(previous, now, preferred, PREFERRED)
        return Placement((ClassDecision(preferred, total, PREFERRED, f"{total} replica(s)", since),))

    draft = _Draft(order, state, room, prepared, spill, previous, now)
    returning = _finish_return(draft, total)
    _follow_total(draft, total + (1 if returning else 0))
    unplaced = _spill_stuck(draft)
    room_since: datetime | None = None
    if not returning:
        returning, room_since = _start_return(draft, unplaced.short)

    decisions = [_preferred_decision(draft, returning, room_since, unplaced.short)]
    decisions += [_spill_class_decision(draft, gpu_class) for gpu_class in order[1:]]
    shortfall = _shortfall(draft, unplaced, gpus, skipped) if unplaced.short else None
    wake_after = min(draft.wake) if draft.wake else None
    return Placement(tuple(decisions), tuple(draft.moves), shortfall, "; ".join(unplaced.waiting) or None,
                     None if wake_after is None else max(0.0, wake_after), returning)


def _since(previous: Mapping[str, Remembered], now: datetime, gpu_class: str, reason: str,
           carry: Collection[str] = ()) -> datetime:
    """Since when `gpu_class` has had `reason`: as status remembered it if it had that reason (or
    one in `carry`, a reason it continues), else now."""
    prev = previous.get(gpu_class)
    if prev is not None and prev.since is not None and (prev.reason == reason or prev.reason in carry):
        return prev.since
    return now


class _Draft:
    """The replicas per class as the steps move them, the moves made and the timers seen, with
    the questions the steps ask about a class."""

    def __init__(self, order: Sequence[str], state: Mapping[str, ClassState], room: Mapping[str, int] | None,
                 prepared: Collection[str] | None, spill: Spill, previous: Mapping[str, Remembered],
                 now: datetime) -> None:
        self.order, self.preferred = order, order[0]
        empty = ClassState()
        self.state = {gpu_class: state.get(gpu_class, empty) for gpu_class in order}
        self.replicas = {gpu_class: self.state[gpu_class].replicas for gpu_class in order}
        self.room, self.prepared, self.spill = room, prepared, spill
        self.previous, self.now = previous, now
        self.moves: list[Move] = []
        self.wake: list[float] = []      # seconds until a timer may change the answer

    def since(self, gpu_class: str, reason: str, carry: Collection[str] = ()) -> datetime:
        return _since(self.previous, self.now, gpu_class, reason, carry)

    def serves(self, gpu_class: str) -> bool:
        """Whether the class may take replicas (a tensorrt-llm model is prepared for it)."""
        return self.prepared is None or gpu_class in self.prepared

    def avail(self, gpu_class: str) -> int:
        """Replicas the class can still take: room on free GPUs less its replicas not yet on a node."""
        if self.room is None:
            return UNLIMITED
        return max(0, self.room.get(gpu_class, 0) - max(0, self.replicas[gpu_class] - self.state[gpu_class].bound))

    def stuck(self, gpu_class: str) -> int:
        """Replicas of the class the scheduler has not placed for `after`, that the ReplicaSet keeps
        (a Deployment scaled down removes unscheduled pods first)."""
        old = sum(1 for t in self.state[gpu_class].unschedulable if _age(self.now, t) >= self.spill.after_s)
        return min(old, max(0, self.replicas[gpu_class] - self.state[gpu_class].bound))

    def spilled(self) -> bool:
        """Whether any replica runs on a class other than the preferred one."""
        return any(self.replicas[gpu_class] > 0 for gpu_class in self.order[1:])

    def last_spilled_class(self) -> str:
        """The least preferred class with replicas, the one a return takes a replica from."""
        return next(gpu_class for gpu_class in reversed(self.order)
                    if gpu_class != self.preferred and self.replicas[gpu_class] > 0)


def _finish_return(draft: _Draft, total: int) -> bool:
    """Step 1, a return in progress (one replica above the total, started on the preferred class):
    whether it is still under way. It is given up if that replica cannot be scheduled after all;
    once it is ready, one replica stops on the least preferred class and the return is done."""
    preferred, a = draft.preferred, draft.replicas
    prev_p = draft.previous.get(preferred)
    if not (prev_p is not None and prev_p.reason == RETURNING and sum(a.values()) == total + 1
            and a[preferred] >= 1 and draft.spilled()):
        return False
    if draft.state[preferred].unschedulable:
        a[preferred] -= 1
        draft.moves.append(Move(RETURN_ABANDONED, preferred, preferred, 1,
                                f"the replica started on {preferred} to move one back cannot be scheduled "
                                f"after all; replicas stay where they are"))
        return False
    if draft.state[preferred].ready >= a[preferred]:
        source = draft.last_spilled_class()
        a[source] -= 1
        draft.moves.append(Move(MOVED_BACK, source, preferred, 1,
                                f"one replica moved back from {source} to {preferred}: its replacement on "
                                f"{preferred} is ready"))
        return False
    return True


def _follow_total(draft: _Draft, target: int) -> None:
    """Step 2, the total (the user's replicas or the autoscaler's) changed: add or remove the
    difference."""
    diff = target - sum(draft.replicas.values())
    if diff > 0:
        _add_replicas(draft, diff)
    elif diff < 0:
        _remove_replicas(draft, -diff)


def _add_replicas(draft: _Draft, n: int) -> None:
    """A scale-up goes to the preferred class; while replicas are spilled, each class in order
    (that may serve) takes what it has room for and the preferred class the rest (the shortage is
    known: no new wait of `after`)."""
    a = draft.replicas
    if draft.spilled():
        for gpu_class in draft.order:
            if n == 0:
                break
            if gpu_class != draft.preferred and not draft.serves(gpu_class):
                continue
            k = min(n, draft.avail(gpu_class))
            a[gpu_class] += k
            n -= k
    a[draft.preferred] += n


def _remove_replicas(draft: _Draft, n: int) -> None:
    """A scale-down removes replicas from the least preferred class first."""
    for gpu_class in reversed(draft.order):
        k = min(n, draft.replicas[gpu_class])
        draft.replicas[gpu_class] -= k
        n -= k


@dataclass(frozen=True)
class _Unplaced:
    """What step 3 leaves: why replicas wait, per class the replicas no class below could take,
    and the classes that could not take any because the model is not prepared for them yet."""

    waiting: list[str]
    short: dict[str, int]
    preparation_wait: set[str]


def _spill_stuck(draft: _Draft) -> _Unplaced:
    """Step 3, spill: replicas the scheduler could not place for `after` go down the order."""
    waiting: list[str] = []
    short: dict[str, int] = {}
    preparation_wait: set[str] = set()
    for i, gpu_class in enumerate(draft.order):
        note = _note_unschedulable(draft, gpu_class)
        if note:
            waiting.append(note)
        n = draft.stuck(gpu_class)
        if n == 0:
            continue
        n = _move_down(draft, gpu_class, draft.order[i + 1:], n, preparation_wait)
        if n > 0:
            short[gpu_class] = n
            if preparation_wait:
                waiting.append(f"{n} replica(s) of {gpu_class} wait for the model to be prepared before they "
                               f"move to {', '.join(sorted(preparation_wait))}")
    return _Unplaced(waiting, short, preparation_wait)


def _note_unschedulable(draft: _Draft, gpu_class: str) -> str | None:
    """Replicas unschedulable on the class for less than `after`: why they wait, and a timer for
    when they may move."""
    young = [t for t in draft.state[gpu_class].unschedulable if _age(draft.now, t) < draft.spill.after_s]
    if not young or draft.replicas[gpu_class] <= draft.state[gpu_class].bound:
        return None
    after_s = draft.spill.after_s
    # Worded without a countdown: the message goes into status, which is written only when it changes.
    draft.wake.append(min(after_s - _age(draft.now, t) for t in young))
    return (f"{len(young)} replica(s) unschedulable on {gpu_class} since {_clock(min(young))}; they move to "
            f"another class once unschedulable for {_fmt_s(after_s)}")


def _move_down(draft: _Draft, source: str, below: Sequence[str], n: int, preparation_wait: set[str]) -> int:
    """Moves `n` stuck replicas of `source` to the classes `below` it, in order, as far as each has
    room and may serve (those that may not yet join `preparation_wait`); returns how many found no class."""
    for target in below:
        if not draft.serves(target):
            preparation_wait.add(target)
            continue
        k = min(n, draft.avail(target))
        if k <= 0:
            continue
        draft.replicas[source] -= k
        draft.replicas[target] += k
        n -= k
        words = _first_clause(draft.state[source].scheduler_message)
        draft.moves.append(Move(SPILL_MOVE, source, target, k,
                                f"{k} replica(s) moved from {source} to {target}: unschedulable on {source} "
                                f"for over {_fmt_s(draft.spill.after_s)}" + (f" ({words})" if words else "")))
        if n == 0:
            break
    return n


def _start_return(draft: _Draft, short: Mapping[str, int]) -> tuple[bool, datetime | None]:
    """Step 4, return: whether a return starts now (one replica above the total on the preferred
    class), and since when the preferred class has had room for one more replica (None: no room,
    or none to take back)."""
    preferred = draft.preferred
    if not (draft.spilled() and not draft.state[preferred].unschedulable and preferred not in short):
        return False, None
    if draft.avail(preferred) < 1:
        return False, None
    room_since = draft.since(preferred, ROOM_TO_RETURN, carry=(RETURNING,))
    left = draft.spill.return_after_s - _age(draft.now, room_since)
    if left > 0:
        draft.wake.append(left)
        return False, room_since
    draft.replicas[preferred] += 1
    source = draft.last_spilled_class()
    draft.moves.append(Move(RETURN_START, source, preferred, 1,
                            f"{preferred} has had room for {_fmt_s(draft.spill.return_after_s)}: starting one "
                            f"replica there to replace one on {source}"))
    return True, room_since


def _preferred_decision(draft: _Draft, returning: bool, room_since: datetime | None,
                        short: Mapping[str, int]) -> ClassDecision:
    """The preferred class's replicas and why: a return under way, room to return, full, or all is well."""
    preferred, state = draft.preferred, draft.state[draft.preferred]
    if returning:
        reason = RETURNING
        msg = f"a replica is starting on {preferred} to replace one on a spill class"
        since = room_since or draft.since(preferred, RETURNING, carry=(ROOM_TO_RETURN,))
    elif room_since is not None:
        reason = ROOM_TO_RETURN
        msg = (f"room for a replica since {_clock(room_since)}; one moves back once the room has lasted "
               f"{_fmt_s(draft.spill.return_after_s)}")
        since = room_since
    elif draft.spilled() or state.unschedulable or preferred in short:
        reason = FULL
        words = state.scheduler_message
        msg = f"no room on {preferred}" + (f": {_first_clause(words)}" if words else "")
        since = draft.since(preferred, FULL)
    else:
        reason, msg, since = PREFERRED, f"{draft.replicas[preferred]} replica(s)", draft.since(preferred, PREFERRED)
    return ClassDecision(preferred, draft.replicas[preferred], reason, msg, since)


def _spill_class_decision(draft: _Draft, gpu_class: str) -> ClassDecision:
    """A spill class's replicas and why: spilled to (some maybe unschedulable there too), waiting
    for the model's preparation, without room, or standing by."""
    n = draft.replicas[gpu_class]
    if n > 0:
        reason, msg = SPILLED, f"{n} replica(s) while {draft.preferred} is full"
        if draft.state[gpu_class].unschedulable:
            words = _first_clause(draft.state[gpu_class].scheduler_message)
            reason, msg = FULL, f"{n} replica(s), some unschedulable: {words}"
    elif not draft.serves(gpu_class):
        reason, msg = PREPARING, "takes replicas once the model is prepared"
    elif draft.room is not None and draft.avail(gpu_class) == 0:
        reason, msg = NO_ROOM, "no free GPUs for a replica"
    else:
        reason, msg = STANDBY, f"takes replicas when {draft.preferred} is full"
    return ClassDecision(gpu_class, n, reason, msg, draft.since(gpu_class, reason))


def _shortfall(draft: _Draft, unplaced: _Unplaced, gpus: Mapping[str, int],
               skipped: Sequence[tuple[str, str]]) -> str:
    """Every class is full: how many replicas cannot be placed, and what is missing per class."""
    parts = []
    for gpu_class in draft.order:
        k = unplaced.short.get(gpu_class, 0)
        if k:
            parts.append(f"{gpu_class}: {k} replica(s) x {gpus.get(gpu_class, 1)} GPU(s) unschedulable")
        elif gpu_class in unplaced.preparation_wait:
            parts.append(f"{gpu_class}: model not prepared yet")
        else:
            parts.append(f"{gpu_class}: no room" if draft.room is not None else f"{gpu_class}: no room known")
    parts += [f"{gpu_class}: skipped ({why})" for gpu_class, why in skipped]
    return f"{sum(unplaced.short.values())} replica(s) cannot be placed on any GPU class: " + "; ".join(parts)


def _clock(t: datetime) -> str:
    return t.strftime("%H:%M:%SZ")


def _first_clause(message: str, limit: int = 160) -> str:
    """The scheduler's summary ('0/9 nodes are available: 2 Insufficient nvidia.com/gpu, ...'),
    shortened for an Event."""
    text = " ".join(message.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
