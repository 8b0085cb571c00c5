"""What one replica can do (pure): Triton + TensorRT-LLM in-flight batching for LLMs, a plain
service-time distribution with parallel slots for everything else, and the cold start.

LLM step model (one in-flight-batching iteration of TensorRT-LLM):
- decode is memory-bandwidth bound: every iteration reads all weights once plus the KV cache of
  every sequence in the batch; time = bytes / (bandwidth x MBU);
- prefill is compute bound: 2 x parameters FLOPs per prompt token plus causal attention
  (2 x layers x hidden x n^2), at the GPU's dense tensor throughput x MFU;
- an iteration also pays a fixed launch/scheduling overhead.
Weights and bandwidth come from the planning module and the GPUClass (planning.plan). Dense
tensor TFLOPS are not in the GPUClass: they follow from the bandwidth with the FLOP/byte ratio of
the compute capability's datacenter part (H100 SXM 989 TFLOPS / 3.35 TB/s, capped at 989 for
Hopper so an H200 keeps H100 compute; L4 121 / 0.3; A10 125 / 0.6; A100 312 / 2.0: NVIDIA
datasheets); FP8 and INT8 double it.

Calibration: MBU = 0.6, MFU = 0.55 and 0.3 ms per iteration reproduce TensorRT-LLM's published
maximum-throughput figures for Llama 3.1 8B FP8 on one H100 SXM (perf-overview, TensorRT-LLM
1.0 docs/source/performance/perf-overview.md: ISL/OSL 128/2048: 22,714 output tok/s; 1000/1000:
15,220; 2048/128: 3,450; 5000/500: 3,459) and Llama 3.3 70B FP8 on two H100 (128/2048: 6,651;
1000/1000: 4,205; 2048/128: 762; 5000/500: 898) within 20 % (tests/test_simulator.py).

KV cache per token assumes the Llama 3 family's grouped-query shape (8 KV heads x 128 dims;
layers 16/28/32/80/126 at 1/3/8/70/405 B, interpolated in log size): 2 x layers x 8 x 128 x
bytes, FP8 when the weights are FP8 (the runtime quantizes with --kv_cache_dtype fp8), FP16
otherwise. KV capacity is kv_cache_free_gpu_mem_fraction (0.9, the runtime's default) of the
memory left after weights and a 5 % activation reserve. Admission reserves prompt + output
tokens (TensorRT-LLM's GUARANTEED_NO_EVICT behaviour; MAX_UTILIZATION, the runtime's policy,
admits more and pauses on pressure, which only matters where KV cache binds).

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

from ...api import BYTES_PER_PARAMETER, GPUClassSpec, InferenceServiceSpec
from ...planning import GIB, plan

MBU = 0.6                 # achieved share of peak memory bandwidth in decode
MFU = 0.55                # achieved share of dense tensor FLOPs in prefill
ITERATION_OVERHEAD_S = 0.0003
TP_EFFICIENCY = 0.9       # all-reduce cost per iteration when a replica spans several GPUs
KV_FREE_FRACTION = 0.9    # kv_cache_free_gpu_mem_fraction (runtime/triton_runtime/repository.py)
ACTIVATION_RESERVE = 0.05
LOAD_BYTES_PER_S = 1.7e9
LOAD_FIXED_S = 10.0

# FLOP per byte of memory bandwidth (dense FP16 tensor) by compute capability, and caps.
_FLOP_PER_BYTE = {(9, 0): 295.0, (8, 9): 403.0, (8, 6): 208.0, (8, 0): 156.0, (7, 0): 139.0}
_TFLOPS_CAP = {(9, 0): 989.0}
_LLAMA_LAYERS = ((1e9, 16), (3e9, 28), (8e9, 32), (70e9, 80), (405e9, 126))


def dense_tflops(gpu: GPUClassSpec, precision: str) -> float:
    cap = gpu.capability
    ratio = _FLOP_PER_BYTE.get(cap) or _FLOP_PER_BYTE.get((cap[0], 0)) or (
        295.0 if cap >= (9, 0) else 156.0)
    fp16 = min(ratio * gpu.memory_bandwidth_tbps, _TFLOPS_CAP.get(cap, math.inf))
    if precision in ("fp8", "int8"):
        return fp16 * 2
    if precision == "fp32":
        return fp16 / 2
    return fp16


def llama_layers(params: float) -> float:
    pts = _LLAMA_LAYERS
    if params <= pts[0][0]:
        return pts[0][1] * params / pts[0][0] if params > 0 else 1
    for (p0, l0), (p1, l1) in zip(pts, pts[1:]):
        if params <= p1:
            w = (math.log(params) - math.log(p0)) / (math.log(p1) - math.log(p0))
            return l0 + w * (l1 - l0)
    return pts[-1][1] * (params / pts[-1][0]) ** (1 / 3)


@dataclass(frozen=True)
class LLMPerformance:
    """Per-replica figures of a TensorRT-LLM engine on `gpus` GPUs of one class."""

    params: float
    weight_bytes: float
    kv_bytes_per_token: float
    kv_capacity_tokens: float
    bandwidth: float           # effective bytes/s (all GPUs, x MBU, x TP efficiency)
    flops: float               # effective FLOP/s for prefill
    layers: float
    hidden: float
    max_batch: int
    max_input_len: int
    max_seq_len: int

    def decode_step_s(self, batch: int, kv_tokens: float) -> float:
        memory = (self.weight_bytes + kv_tokens * self.kv_bytes_per_token) / self.bandwidth
        compute = 2 * self.params * batch / self.flops
        return max(memory, compute) + ITERATION_OVERHEAD_S

    def prefill_s(self, tokens: int) -> float:
        linear = 2 * self.params * tokens
        attention = 2 * self.layers * self.hidden * tokens * tokens
        return (linear + attention) / self.flops

    def fits(self, prompt: int, output: int) -> bool:
        return prompt <= self.max_input_len and prompt + output <= self.max_seq_len

    @property
    def kind(self) -> str:
        return "llm"


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


def llm_performance(spec: InferenceServiceSpec, gpu: GPUClassSpec, max_batch: int | None = None) -> LLMPerformance:
    params = spec.model.parameter_count()
    if params is None:
        raise ValueError("spec.model.parameters is needed to model a TensorRT-LLM replica")
    count = spec.gpu.count
    figures = plan(spec.model, gpu, count)
    weight_bytes = (figures.weights_gib or 0) * GIB
    layers = llama_layers(params)
    hidden = math.sqrt(params / (12 * layers))
    kv_bytes = 2 * layers * 8 * 128 * (1 if spec.model.precision == "fp8" else 2)
    memory = gpu.memory_gib * GIB * count
    kv_capacity = max(0.0, (memory * (1 - ACTIVATION_RESERVE) - weight_bytes) * KV_FREE_FRACTION) / kv_bytes
    tp = 1.0 if count == 1 else TP_EFFICIENCY
    engine = spec.engine
    return LLMPerformance(
        params=params, weight_bytes=weight_bytes, kv_bytes_per_token=kv_bytes,
        kv_capacity_tokens=kv_capacity,
        bandwidth=gpu.memory_bandwidth_tbps * 1e12 * count * MBU * tp,
        flops=dense_tflops(gpu, spec.model.precision) * 1e12 * count * MFU * tp,
        layers=layers, hidden=hidden,
        max_batch=max_batch or (engine.max_batch_size if engine else 64),
        max_input_len=engine.max_input_len if engine else 2048,
        max_seq_len=engine.max_seq_len if engine else 4096,
    )


# ----------------------------------------------------------------------------------------------
# Replica state machines used by the engine
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
    iteration takes the same time, so the engine jumps from change to change instead of
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
