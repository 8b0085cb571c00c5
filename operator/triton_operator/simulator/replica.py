"""What one replica can do (pure): Triton + TensorRT-LLM in-flight batching for LLMs, a plain
service-time distribution with parallel slots for everything else, and the cold start.

LLM replicas run the step model of planning/llm_performance.py (decode bandwidth bound, prefill compute
bound, calibrated against TensorRT-LLM's published throughput).

Cold start (pods count as capacity only when ready): scheduling 5 s, image pull 30 s (a cached
multi-GB Triton TensorRT-LLM image still costs seconds to unpack; an uncached one minutes),
model load 10 s + weights / 1.7 GB/s (ServerlessLLM, OSDI'24: LLaMA-2-70B ~84 s, OPT-30B ~34 s
from local SSD), then the readiness probe's next 5 s tick (render/templates/deployment.yaml.j2).
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass
from typing import Protocol

from ..api import BYTES_PER_PARAMETER, InferenceServiceSpec
from ..planning.llm_performance import LLMPerformance, llm_performance

__all__ = ["ColdStart", "CurvedLLMPerformance", "LLMPerformance", "LLMReplica", "Performance", "REPLICA_MODELS",
           "ServiceReplica", "ServiceTime", "default_cold_start", "llm_performance", "replica_model"]

LOAD_BYTES_PER_S = 1.7e9
LOAD_FIXED_S = 10.0


@dataclass(frozen=True)
class ServiceTime:
    """Non-LLM model: `slots` requests served at once (Triton's max batch), each taking a time
    drawn from `dist` (exponential, deterministic, lognormal with CV 0.5) of mean `mean_s`."""

    mean_s: float
    slots: int = 1
    dist: str = "exponential"

    def sample(self, rng: random.Random) -> float:
        if self.dist == "deterministic":
            return self.mean_s
        if self.dist == "lognormal":
            sigma = math.sqrt(math.log(1 + 0.25))
            return rng.lognormvariate(math.log(self.mean_s) - sigma * sigma / 2, sigma)
        return rng.expovariate(1 / self.mean_s)

    @property
    def kind(self) -> str:
        return "service"


Performance = LLMPerformance | ServiceTime

SERVICE_DISTRIBUTIONS = ("exponential", "deterministic", "lognormal")


@dataclass(frozen=True)
class CurvedLLMPerformance(LLMPerformance):
    """A replica shaped unlike the planner's line, to check that ours does not depend on the
    simulated engine matching what its planner assumes (`--replica-model curved`):
    - the decode step grows super-linearly with the batch: x (1 + curve x (batch / max batch)^2)
      (sampling, scheduling and attention kernels cost more per sequence in a full batch; the
      planner's step is flat in the batch while bandwidth bound);
    - prefill is `prefill_factor` slower than planned, plus a fixed cost per request
      (tokenization, scheduling);
    - KV-cache pressure: only `kv_share` of the planned KV cache is there (a smaller
      kv_cache_free_gpu_mem_fraction, other buffers), so long sequences fill it before the batch.
    The shape is synthetic (no GPU runs here to measure one); its figures are chosen to be off the
    plan by 20-50 % in ways that depend on the token mix and the load, which a single efficiency
    factor cannot describe."""

    curve: float = 0.6
    prefill_factor: float = 1.3
    prefill_fixed_s: float = 0.005
    kv_share: float = 0.35

    def decode_step_s(self, batch: int, kv_tokens: float) -> float:
        return super().decode_step_s(batch, kv_tokens) * (1 + self.curve * (batch / self.max_batch) ** 2)

    def prefill_s(self, tokens: float) -> float:
        return super().prefill_s(tokens) * self.prefill_factor + self.prefill_fixed_s


REPLICA_MODELS = ("planner", "curved")


def replica_model(name: str, planned: LLMPerformance) -> LLMPerformance:
    """The simulated engine: `planner` runs the planner's own step model; `curved` a different
    shape (CurvedLLMPerformance)."""
    if name == "planner":
        return planned
    if name == "curved":
        fields = {k: getattr(planned, k) for k in LLMPerformance.__dataclass_fields__}
        fields["kv_capacity_tokens"] = planned.kv_capacity_tokens * CurvedLLMPerformance.kv_share
        return CurvedLLMPerformance(**fields)
    raise ValueError(f"--replica-model must be one of {', '.join(REPLICA_MODELS)}, got {name!r}")


@dataclass(frozen=True)
class ColdStart:
    schedule_s: float = 5.0
    pull_s: float = 30.0
    load_s: float = 20.0
    readiness_period_s: float = 5.0

    def ready_after(self) -> float:
        """Seconds from pod creation to Ready: the readiness probe ticks every period from the
        container start, so Ready lands on the first tick after the model is loaded."""
        started = self.schedule_s + self.pull_s
        ticks = math.ceil(self.load_s / self.readiness_period_s) if self.readiness_period_s > 0 else 0
        return started + ticks * self.readiness_period_s

    @property
    def total_s(self) -> float:
        return self.ready_after()


def default_cold_start(spec: InferenceServiceSpec) -> ColdStart:
    params = spec.model.parameter_count()
    weight_bytes = params * BYTES_PER_PARAMETER[spec.model.precision] if params else 1e9
    return ColdStart(load_s=round(LOAD_FIXED_S + weight_bytes / LOAD_BYTES_PER_S, 1))


# ----------------------------------------------------------------------------------------------
# Replica state machines used by the simulation
# ----------------------------------------------------------------------------------------------

class Replica(Protocol):
    rid: int
    state: str

    def can_admit(self, prompt: int, output: int) -> bool: ...
    def admit(self, req: int, prompt: int, output: int, now: float, rng: random.Random) -> float: ...
    def next_completion(self) -> float | None: ...
    def pop_finished(self, now: float) -> list[int]: ...
    def active(self) -> int: ...


class LLMReplica:
    """In-flight batching with a fluid step clock: between two changes of the batch every
    iteration takes the same time, so the simulation jumps from change to change instead of
    simulating each iteration (O(requests) events, not O(tokens)). A newly admitted request
    stalls the batch for its prefill (the context phase of the iteration it joins) and gets its
    first token at the end of it; it then needs output - 1 decode iterations."""

    __slots__ = ("rid", "state", "perf", "created", "ready_at", "gone_at", "s_ref", "t_ref",
                 "stall_until", "tau", "slope", "heap", "kv_reserved", "sum_prompt", "sum_join", "version")

    def __init__(self, rid: int, perf: LLMPerformance, created: float, ready_at: float):
        self.rid, self.perf, self.created, self.ready_at = rid, perf, created, ready_at
        self.state, self.gone_at = "loading", math.inf
        self.s_ref = self.t_ref = self.stall_until = 0.0
        self.tau = math.inf
        self.slope = 0.0
        self.heap: list[tuple[float, int, int, int, float]] = []  # (finish step, req, prompt, output, join step)
        self.kv_reserved = 0.0
        self.sum_prompt = 0.0
        self.sum_join = 0.0
        self.version = 0

    def _steps(self, now: float) -> float:
        """Iterations done by `now`. The KV cache grows by one token per sequence per iteration,
        so the iteration time grows linearly: t(k) = tau k + slope k^2 / 2, solved for k."""
        start = max(self.t_ref, self.stall_until)
        if now <= start or not self.heap:
            return self.s_ref
        dt = now - start
        if self.slope <= 0:
            return self.s_ref + dt / self.tau
        a, b = self.tau, self.slope
        return self.s_ref + 2 * dt / (a + math.sqrt(a * a + 2 * b * dt))

    def _advance(self, now: float) -> None:
        self.s_ref = self._steps(now)
        self.t_ref = now

    def _retime(self) -> None:
        batch = len(self.heap)
        if batch == 0:
            self.tau, self.slope = math.inf, 0.0
        else:
            perf = self.perf
            kv = self.sum_prompt + batch * self.s_ref - self.sum_join
            self.tau = perf.decode_step_s(batch, kv)
            # KV reads grow by one token per sequence per iteration (an upper bound while the
            # step is still compute bound)
            self.slope = batch * perf.kv_bytes_per_token / perf.bandwidth
        self.version += 1

    def can_admit(self, prompt: int, output: int) -> bool:
        return (len(self.heap) < self.perf.max_batch
                and self.kv_reserved + prompt + output <= self.perf.kv_capacity_tokens)

    def admit(self, req: int, prompt: int, output: int, now: float, rng: random.Random) -> float:
        self._advance(now)
        start = max(now, self.stall_until)
        self.stall_until = start + self.perf.prefill_s(prompt)
        join = self.s_ref
        heapq.heappush(self.heap, (join + output - 1, req, prompt, output, join))
        self.kv_reserved += prompt + output
        self.sum_prompt += prompt
        self.sum_join += join
        self._retime()
        return self.stall_until

    def next_completion(self) -> float | None:
        if not self.heap:
            return None
        start = max(self.t_ref, self.stall_until)
        k = max(0.0, self.heap[0][0] - self.s_ref)
        return start + self.tau * k + self.slope * k * k / 2

    def pop_finished(self, now: float) -> list[int]:
        self._advance(now)
        done = []
        while self.heap and self.heap[0][0] <= self.s_ref + 1e-6:
            _, req, prompt, output, join = heapq.heappop(self.heap)
            self.kv_reserved -= prompt + output
            self.sum_prompt -= prompt
            self.sum_join -= join
            done.append(req)
        if done:
            self._retime()
        return done

    def active(self) -> int:
        return len(self.heap)


class ServiceReplica:
    __slots__ = ("rid", "state", "perf", "created", "ready_at", "gone_at", "heap", "version")

    def __init__(self, rid: int, perf: ServiceTime, created: float, ready_at: float):
        self.rid, self.perf, self.created, self.ready_at = rid, perf, created, ready_at
        self.state, self.gone_at = "loading", math.inf
        self.heap: list[tuple[float, int]] = []
        self.version = 0

    def can_admit(self, prompt: int, output: int) -> bool:
        return len(self.heap) < self.perf.slots

    def admit(self, req: int, prompt: int, output: int, now: float, rng: random.Random) -> float:
        done = now + self.perf.sample(rng)
        heapq.heappush(self.heap, (done, req))
        self.version += 1
        return done

    def next_completion(self) -> float | None:
        return self.heap[0][0] if self.heap else None

    def pop_finished(self, now: float) -> list[int]:
        done = []
        while self.heap and self.heap[0][0] <= now + 1e-12:
            done.append(heapq.heappop(self.heap)[1])
        if done:
            self.version += 1
        return done

    def active(self) -> int:
        return len(self.heap)
