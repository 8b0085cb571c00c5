"""A GPU shortage in the simulation (pure, seeded): several GPU classes, each with room for a
limited number of replicas, and the operator's own spill-over placement (planning.placement.place,
the function the controller calls) deciding on every autoscaler tick where replicas run.

What it adds to simulation.Simulation:
- A replica is created on a class only while the class has room; otherwise it is a pending pod
  (it counts in the Deployment's replicas, serves nothing and costs no GPU time), as a pod the
  scheduler cannot place.
- Each class has its own replica performance (a replica on an H200 decodes faster than one on an
  H100: bandwidth), from the GPUClass, as replica.llm_performance computes it.
- Every policy tick, the placement is recomputed from the classes' replicas, pending pods (and
  since when), ready counts and room, with the service's spill durations; replicas are started or
  removed per class to match (pending pods go first, then loading, then the newest ready), as the
  Deployments' ReplicaSets would. Without spill everything stays on the preferred class.

Not modelled: capacity changing during the run (the room is fixed: the shortage lasts the whole
run), other tenants competing for the room, and the API and scheduler latencies (a tick is the
operator's reaction time).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Sequence

from ..planning import placement as placing
from .simulation import Policy, Run, SimulationSettings, Simulation
from .replica import ColdStart, LLMPerformance, LLMReplica, Performance, ServiceReplica
from .workload import Request

EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class ClassSlot:
    name: str
    perf: Performance
    room: int          # replicas that fit on the class's free GPUs


class ShortageSimulation(Simulation):
    def __init__(self, requests: Sequence[Request], slots: Sequence[ClassSlot], cold: ColdStart, policy: Policy,
                 settings: SimulationSettings, spill: placing.Spill | None):
        super().__init__(requests, slots[0].perf, cold, policy, settings, slots[0].name)
        self.slots = {s.name: s for s in slots}
        self.order = [s.name for s in slots]
        self.spill = spill
        self.class_of: dict[int, str] = {}
        self.pending: list[tuple[str, float]] = []      # (class, since): pods the scheduler cannot place
        self.remembered: dict[str, placing.Remembered] = {}
        self.moves: list[tuple[float, str, str, str, int]] = []   # (t, kind, from, to, replicas)
        self.peak: dict[str, int] = {c: 0 for c in self.order}    # most replicas running per class

    # -- replicas per class ----------------------------------------------------------------------
    def _live(self, c: str) -> list[LLMReplica | ServiceReplica]:
        return [r for r in self.replicas.values() if self.class_of.get(r.rid) == c and r.state in ("loading", "ready")]

    def _on_node(self, c: str) -> int:
        return sum(1 for r in self.replicas.values() if self.class_of.get(r.rid) == c)  # draining pods hold GPUs

    def _new_replica(self, now: float, gpu_class: str | None = None) -> None:  # type: ignore[override]
        c = gpu_class or self.order[0]
        if self._on_node(c) >= self.slots[c].room:
            self.pending.append((c, now))
            return
        self.perf = self.slots[c].perf
        rid = self.next_rid
        super()._new_replica(now)
        self.perf = self.slots[self.order[0]].perf
        self.class_of[rid] = c
        self.peak[c] = max(self.peak[c], len(self._live(c)))

    def class_of_pod(self, rid: int) -> str:
        return self.class_of.get(rid, self.order[0])

    def _bind_pending(self, now: float) -> None:
        still = []
        for c, since in self.pending:
            if self._on_node(c) < self.slots[c].room:
                self._new_replica(now, c)
            else:
                still.append((c, since))
        self.pending = still

    def _remove_one(self, c: str, now: float) -> None:
        for i, (pc, _) in enumerate(self.pending):
            if pc == c:
                del self.pending[i]
                return
        live = sorted(self._live(c), key=lambda r: (r.state == "ready", -r.ready_at, -r.rid))
        if live:
            self._remove(live[0], now)

    def _count(self, c: str) -> int:
        return len(self._live(c)) + sum(1 for pc, _ in self.pending if pc == c)

    # -- the operator's placement, every tick -------------------------------------------------------
    def scale_to(self, n: int, now: float, reason: str) -> None:
        n = max(self.cfg.min_replicas, min(self.cfg.max_replicas, n))
        if n != self.desired:
            self.decisions.append((now, self.desired, n, reason))
            self.desired = n
        self._bind_pending(now)
        wanted = self._placement(now)
        for c in self.order:
            have = self._count(c)
            for _ in range(wanted.get(c, 0) - have):
                self._new_replica(now, c)
            for _ in range(have - wanted.get(c, 0)):
                self._remove_one(c, now)
        self._record(now)

    def _placement(self, now: float) -> dict[str, int]:
        if self.spill is None:
            return {self.order[0]: self.desired}
        clock = EPOCH + timedelta(seconds=now)
        state = {}
        for c in self.order:
            live = self._live(c)
            state[c] = placing.ClassState(
                replicas=self._count(c), bound=len(live), ready=sum(1 for r in live if r.state == "ready"),
                unschedulable=tuple(EPOCH + timedelta(seconds=t) for pc, t in self.pending if pc == c))
        room = {c: max(0, self.slots[c].room - self._on_node(c)) for c in self.order}
        p = placing.place(self.desired, self.order, {c: 1 for c in self.order}, state, room, None, self.spill,
                          self.remembered, clock)
        self.remembered = {d.gpu_class: placing.Remembered(d.reason, d.since) for d in p.classes}
        self.moves += [(now, m.kind, m.source, m.target, m.replicas) for m in p.moves]
        return p.replicas()


def simulate_shortage(requests: Sequence[Request], slots: Sequence[ClassSlot], cold: ColdStart, policy: Policy,
                      settings: SimulationSettings, spill: placing.Spill | None) -> tuple[Run, ShortageSimulation]:
    sim = ShortageSimulation(requests, slots, cold, policy, settings, spill)
    return sim.run(), sim


def llm_slots(perfs: dict[str, LLMPerformance], rooms: dict[str, int], order: Sequence[str]) -> list[ClassSlot]:
    return [ClassSlot(c, perfs[c], rooms[c]) for c in order]
