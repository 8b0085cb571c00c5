"""The discrete-event simulation (pure, seeded, deterministic): requests arrive, wait in the
service's queue, run on ready replicas, and an autoscaling policy changes the replica count
through the same metrics path the live system has.

Modelling choices (the sources are in replica.py and metrics_path.py):
- Routing: one FIFO queue per service, served by the least-busy ready replica that can admit the
  head request (a gateway or activator in front, and the best case for every policy alike).
  While no replica is ready the queue is what the gateway holds (metrics_path.py).
  Requests are never routed to a pod that is not ready or is terminating.
- Scaling: a Deployment. New pods load for the cold start, then serve. Scale-down removes pods
  as a ReplicaSet does (not-ready before ready, the newest first); a removed ready pod stops
  receiving requests and terminates once its batch is done (graceful termination).
- GPU time is charged from pod creation to termination: loading, ready and draining pods.
- A request the engine cannot take (prompt longer than maxInputLen, prompt + output longer than
  maxSeqLen) is rejected at once, counted as dropped; so is anything still waiting when the
  simulation stops (`horizon_s` after the last arrival).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from .metrics_path import ENGINE_DURATION_BUCKETS, GatewaySample, Prometheus, Sample, WindowQuantiles
from .replica import ColdStart, LLMPerformance, LLMReplica, Performance, ServiceReplica
from .workload import Request


@dataclass(frozen=True)
class SimulationSettings:
    min_replicas: int = 1
    max_replicas: int = 10
    initial_replicas: int | None = None
    gpus_per_replica: int = 1
    price_per_gpu_hour: float | None = None
    slo_s: float = 1.0
    slo_target: float = 0.99
    slo_latency: str = "endToEnd"      # which latency slo_s bounds: endToEnd | timeToFirstToken | interToken
    seed: int = 0
    scrape_interval: float = 5.0
    outage: tuple[float, float] | None = None
    outage_kind: str = "scrape"
    horizon_s: float = 3600.0
    duration: float | None = None      # the workload's length (default: the last arrival)


def slo_latency(kind: str, arrival: float, first_token: float, finish: float, output_tokens: int) -> float:
    """The latency an SLO of `kind` bounds, in seconds: to the end of the answer, to its first
    token, or the mean time between its tokens (0 for an answer of one token)."""
    if kind == "timeToFirstToken":
        return first_token - arrival
    if kind == "interToken":
        return (finish - first_token) / (output_tokens - 1) if output_tokens > 1 else 0.0
    return finish - arrival


@dataclass(frozen=True)
class Pod:
    rid: int
    state: str                 # loading | ready | draining
    created: float
    ready_at: float
    active: int


@dataclass
class View:
    """What a policy may look at during a tick. Policies must read metrics only through
    `prometheus` (or, for Knative, `concurrency`, which the queue-proxies report directly)."""

    now: float
    desired: int               # the Deployment's replicas (spec)
    pods: list[Pod]
    prometheus: Prometheus
    concurrency: float         # requests in flight or waiting, whole service (queue-proxy view)

    @property
    def ready(self) -> int:
        return sum(1 for p in self.pods if p.state == "ready")

    @property
    def loading(self) -> int:
        return sum(1 for p in self.pods if p.state == "loading")


class Policy(Protocol):
    name: str
    interval: float            # seconds between decisions
    sample_interval: float     # seconds between `sample` calls (0: never)

    def decide(self, view: View) -> tuple[int, str]: ...
    def sample(self, view: View) -> None: ...


@dataclass
class Run:
    policy: str
    requests: Sequence[Request]
    start: list[float]
    first_token: list[float]
    finish: list[float]
    replica: list[int]
    dropped: list[bool]
    timeline: list[tuple[float, int, int, int, int]]   # (t, desired, loading, ready, draining)
    pods: list[tuple[int, float, float, float, float]]  # (rid, created, ready_at, gone_at, deleted_at)
    decisions: list[tuple[float, int, int, str]]      # (t, from, to, reason) for every change
    reasons: list[tuple[float, str]]                  # the last reason of every tick (sampled)
    end: float
    settings: SimulationSettings
    gpu_class: str = ""
    pod_classes: dict[int, str] = field(default_factory=dict)   # rid -> GPU class (a shortage spreads them)


# event kinds, in the order they run when simultaneous
_READY, _COMPLETE, _ARRIVAL, _SCRAPE, _SAMPLE, _TICK = range(6)


class Simulation:
    def __init__(self, requests: Sequence[Request], perf: Performance, cold: ColdStart,
                 policy: Policy, settings: SimulationSettings, gpu_class: str = ""):
        self.requests, self.perf, self.cold, self.policy, self.cfg = requests, perf, cold, policy, settings
        self.gpu_class = gpu_class
        self.rng = random.Random(settings.seed)
        n = len(requests)
        nan = math.nan
        self.start, self.first, self.finish = [nan] * n, [nan] * n, [nan] * n
        self.where, self.dropped = [-1] * n, [False] * n
        self.queue: deque[int] = deque()
        self.replicas: dict[int, LLMReplica | ServiceReplica] = {}
        # Per ready pod, the latency its p99 is read from: for an LLM the engine's request-duration
        # histogram (completed requests by ENGINE_DURATION_BUCKETS bucket, +Inf last, not cumulative),
        # otherwise Triton's summary (the LLM model's summary is read by no query: settings.p99_query).
        self.summaries: dict[int, WindowQuantiles] = {}
        self.durations: dict[int, list[int]] = {}
        self.llm = isinstance(perf, LLMPerformance)
        self.success: dict[int, int] = {}
        self.tokens: dict[int, list[int]] = {}     # per pod: [prompt, output] tokens of completed requests
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.next_rid = 0
        self.desired = 0
        self.timeline: list[tuple[float, int, int, int, int]] = []
        self.pods_log: dict[int, list[float]] = {}
        self.decisions: list[tuple[float, int, int, str]] = []
        self.reasons: list[tuple[float, str]] = []
        self.prom = Prometheus(settings.scrape_interval,
                               None if settings.outage is None else (settings.outage[0], settings.outage[0] + settings.outage[1]),
                               settings.outage_kind)
        self.done = 0
        self.slo_met = 0          # the gateway's counter of requests within the SLO (and of all it counted)
        self.slo_counted = 0

    # -- events ------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, a, b))

    def _schedule_completion(self, rep: LLMReplica | ServiceReplica) -> None:
        t = rep.next_completion()
        if t is not None:
            self._push(t, _COMPLETE, rep.rid, rep.version)

    # -- replicas ------------------------------------------------------------------------------
    def _new_replica(self, now: float) -> None:
        rid = self.next_rid
        self.next_rid += 1
        ready_at = now + self.cold.ready_after()
        if isinstance(self.perf, LLMPerformance):
            rep: LLMReplica | ServiceReplica = LLMReplica(rid, self.perf, now, ready_at)
        else:
            rep = ServiceReplica(rid, self.perf, now, ready_at)
        self.replicas[rid] = rep
        self.pods_log[rid] = [now, math.inf, math.inf, math.inf]   # created, ready, gone, deleted
        self._push(ready_at, _READY, rid)

    def _remove(self, rep: LLMReplica | ServiceReplica, now: float) -> None:
        self.pods_log[rep.rid][3] = now
        if rep.state == "loading" or rep.active() == 0:
            rep.state = "gone"
            self.pods_log[rep.rid][2] = now
            del self.replicas[rep.rid]
        else:
            rep.state = "draining"

    def scale_to(self, n: int, now: float, reason: str) -> None:
        n = max(self.cfg.min_replicas, min(self.cfg.max_replicas, n))
        if n == self.desired:
            return
        self.decisions.append((now, self.desired, n, reason))
        live = [r for r in self.replicas.values() if r.state in ("loading", "ready")]
        if n > len(live):
            for _ in range(n - len(live)):
                self._new_replica(now)
        elif n < len(live):
            # ReplicaSet order: not-ready pods first, then the most recently ready; newest first.
            victims = sorted(live, key=lambda r: (r.state == "ready", -r.ready_at, -r.rid))[:len(live) - n]
            for rep in victims:
                self._remove(rep, now)
        self.desired = n
        self._record(now)

    def _record(self, now: float) -> None:
        loading = ready = draining = 0
        for r in self.replicas.values():
            if r.state == "loading":
                loading += 1
            elif r.state == "ready":
                ready += 1
            elif r.state == "draining":
                draining += 1
        row = (now, self.desired, loading, ready, draining)
        if self.timeline and self.timeline[-1][0] == now:
            self.timeline[-1] = row
        else:
            self.timeline.append(row)

    # -- requests ------------------------------------------------------------------------------
    def _dispatch(self, now: float) -> None:
        reqs = self.requests
        while self.queue:
            i = self.queue[0]
            r = reqs[i]
            best = None
            for rep in self.replicas.values():
                if rep.state == "ready" and rep.can_admit(r.prompt_tokens, r.output_tokens):
                    if best is None or rep.active() < best.active():
                        best = rep
            if best is None:
                return
            self.queue.popleft()
            self.start[i] = now
            self.where[i] = best.rid
            self.first[i] = best.admit(i, r.prompt_tokens, r.output_tokens, now, self.rng)
            self._schedule_completion(best)

    def _complete(self, rep: LLMReplica | ServiceReplica, now: float) -> None:
        finished = rep.pop_finished(now)
        summary, buckets = self.summaries.get(rep.rid), self.durations.get(rep.rid)
        for i in finished:
            self.finish[i] = now
            if isinstance(rep, ServiceReplica):
                self.first[i] = now
            self.done += 1
            self.success[rep.rid] = self.success.get(rep.rid, 0) + 1
            counts = self.tokens.setdefault(rep.rid, [0, 0])
            counts[0] += self.requests[i].prompt_tokens
            counts[1] += self.requests[i].output_tokens
            latency = now - self.requests[i].arrival
            if buckets is not None:
                buckets[bisect.bisect_left(ENGINE_DURATION_BUCKETS, latency)] += 1
            elif summary is not None:
                summary.observe(now, latency * 1000.0)
            r = self.requests[i]
            self.slo_counted += 1
            self.slo_met += slo_latency(self.cfg.slo_latency, r.arrival, self.first[i], now,
                                        r.output_tokens) <= self.cfg.slo_s
        if rep.state == "draining" and rep.active() == 0:
            rep.state = "gone"
            self.pods_log[rep.rid][2] = now
            del self.replicas[rep.rid]
            self._record(now)
        else:
            self._schedule_completion(rep)

    # -- metrics -------------------------------------------------------------------------------
    def _scrape(self, now: float) -> None:
        ready = [r for r in self.replicas.values() if r.state == "ready"]
        share = len(self.queue) / len(ready) if ready else 0.0
        samples = {r.rid: self._sample(r, now, share) for r in ready}
        gone = [rid for rid in self.prom.latest if rid not in samples]
        # The gateway holds what waits while no replica is ready; otherwise it has sent it on.
        held = 0 if ready else len(self.queue)
        running = sum(r.active() for r in self.replicas.values())
        gateway = GatewaySample(now, float(held), float(running + len(self.queue) - held), self.slo_met,
                                self.slo_counted)
        self.prom.scrape(now, samples, gone, gateway)

    def _sample(self, rep: LLMReplica | ServiceReplica, now: float, pending: float) -> Sample:
        """One scrape of a ready pod: for an LLM its duration buckets' counters (at or below each
        bound, then +Inf) and no summary p99; otherwise its summary's p99."""
        buckets = self.durations.get(rep.rid)
        summary = self.summaries.get(rep.rid)
        return Sample(now, pending, math.nan if summary is None else summary.quantile(now, 0.99),
                      self.success.get(rep.rid, 0), rep.active(), *self.tokens.get(rep.rid, (0, 0)),
                      durations=() if buckets is None else tuple(itertools.accumulate(buckets)))

    def _start_metrics(self, rid: int, now: float) -> None:
        """A pod ready at `now` starts exporting what its p99 is read from."""
        if self.llm:
            self.durations[rid] = [0] * (len(ENGINE_DURATION_BUCKETS) + 1)
        else:
            self.summaries[rid] = WindowQuantiles(now)

    def view(self, now: float) -> View:
        pods = [Pod(r.rid, r.state, r.created, r.ready_at, r.active()) for r in self.replicas.values()]
        inflight = sum(p.active for p in pods if p.state != "loading")
        return View(now, self.desired, pods, self.prom, float(inflight + len(self.queue)))

    # -- main loop -----------------------------------------------------------------------------
    def run(self) -> Run:
        cfg, reqs, policy = self.cfg, self.requests, self.policy
        n = len(reqs)
        duration = cfg.duration if cfg.duration is not None else (reqs[-1].arrival if reqs else 0.0)
        stop = duration + cfg.horizon_s
        initial = cfg.initial_replicas if cfg.initial_replicas is not None else cfg.min_replicas
        initial = max(cfg.min_replicas, min(cfg.max_replicas, initial))
        # the initial replicas are up and warm at t = 0
        for _ in range(initial):
            self._new_replica(-self.cold.ready_after())
        self.desired = initial
        self.events = []
        for rid, rep in self.replicas.items():
            rep.state, rep.ready_at = "ready", 0.0
            self._start_metrics(rid, 0.0)
            self.pods_log[rid] = [0.0, 0.0, math.inf, math.inf]
        self._record(0.0)
        if hasattr(policy, "start"):
            policy.start(self)  # type: ignore[attr-defined]
        self._push(0.0, _SCRAPE)
        self._push(policy.interval, _TICK)
        if policy.sample_interval > 0:
            self._push(0.0, _SAMPLE)
        nxt = 0
        now = 0.0
        events = self.events
        while True:
            t_arr = reqs[nxt].arrival if nxt < n else math.inf
            if events and events[0][0] <= t_arr:
                t, kind, _, a, b = heapq.heappop(events)
            elif nxt < n:
                t, kind, a, b = t_arr, _ARRIVAL, nxt, 0
                nxt += 1
            else:
                break
            if t > stop:
                break
            now = t
            if kind == _COMPLETE:
                rep = self.replicas.get(a)
                if rep is not None and rep.version == b:
                    self._complete(rep, now)
                    self._dispatch(now)
            elif kind == _ARRIVAL:
                r = reqs[a]
                fits = self.perf.fits(r.prompt_tokens, r.output_tokens) if isinstance(self.perf, LLMPerformance) else True
                if not fits:
                    self.dropped[a] = True
                    self.done += 1
                else:
                    self.queue.append(a)
                    self._dispatch(now)
            elif kind == _READY:
                rep = self.replicas.get(a)
                if rep is not None and rep.state == "loading" and rep.ready_at == now:
                    rep.state = "ready"
                    self.pods_log[a][1] = now
                    self._start_metrics(a, now)
                    self._record(now)
                    self._dispatch(now)
            elif kind == _SCRAPE:
                self._scrape(now)
                if not self._finished(nxt, n, now, duration):
                    self._push(now + cfg.scrape_interval, _SCRAPE)
            elif kind == _SAMPLE:
                policy.sample(self.view(now))
                if not self._finished(nxt, n, now, duration):
                    self._push(now + policy.sample_interval, _SAMPLE)
            elif kind == _TICK:
                target, reason = policy.decide(self.view(now))
                self.reasons.append((now, reason))
                self.scale_to(target, now, reason)
                if not self._finished(nxt, n, now, duration):
                    self._push(now + policy.interval, _TICK)
            if self._finished(nxt, n, now, duration) and not any(e[1] in (_COMPLETE, _READY) for e in events):
                break
        end = max(now, duration)
        for i in self.queue:
            self.dropped[i] = True
        for rep in self.replicas.values():
            for i in _in_flight(rep):
                self.dropped[i] = True
        for rid, log in self.pods_log.items():
            if log[2] == math.inf:
                log[2] = end
        self._record(end)
        return Run(policy.name, reqs, self.start, self.first, self.finish, self.where, self.dropped,
                   self.timeline, [(rid, *log) for rid, log in sorted(self.pods_log.items())],  # type: ignore[misc]
                   self.decisions, self.reasons, end, cfg, self.gpu_class,
                   {rid: self.class_of_pod(rid) for rid in self.pods_log})

    def class_of_pod(self, rid: int) -> str:
        return self.gpu_class

    def _finished(self, nxt: int, n: int, now: float, duration: float) -> bool:
        return nxt >= n and self.done >= n and now >= duration


def _in_flight(rep: LLMReplica | ServiceReplica) -> list[int]:
    return [entry[1] for entry in rep.heap]


def simulate(requests: Sequence[Request], perf: Performance, cold: ColdStart, policy: Policy,
             settings: SimulationSettings, gpu_class: str = "") -> Run:
    return Simulation(requests, perf, cold, policy, settings, gpu_class).run()
