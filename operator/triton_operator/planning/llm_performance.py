"""What one TensorRT-LLM replica can serve (pure): the in-flight-batching step model shared by the
autoscaler (a replica's capacity before any has been measured) and the simulator (how a replica
runs, request by request).

Step model (one in-flight-batching iteration of TensorRT-LLM):
- decode is memory-bandwidth bound: every iteration reads all weights once plus the KV cache of
  every sequence in the batch; time = bytes / (bandwidth x MBU);
- prefill is compute bound: 2 x parameters FLOPs per prompt token plus causal attention
  (2 x layers x hidden x n^2), at the GPU's dense tensor throughput x MFU;
- an iteration also pays a fixed launch/scheduling overhead.
Weights and bandwidth come from `fit` and the GPUClass. Dense tensor TFLOPS are not in the
GPUClass: they follow from the bandwidth with the FLOP/byte ratio of the compute capability's
datacenter part (H100 SXM 989 TFLOPS / 3.35 TB/s, capped at 989 for Hopper so an H200 keeps H100
compute; L4 121 / 0.3; A10 125 / 0.6; A100 312 / 2.0: NVIDIA datasheets); FP8 and INT8 double it.

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..api import GPUClassSpec, InferenceServiceSpec
from .fit import GIB, fit

MBU = 0.6                 # achieved share of peak memory bandwidth in decode
MFU = 0.55                # achieved share of dense tensor FLOPs in prefill
ITERATION_OVERHEAD_S = 0.0003
TP_EFFICIENCY = 0.9       # all-reduce cost per iteration when a replica spans several GPUs
KV_FREE_FRACTION = 0.9    # kv_cache_free_gpu_mem_fraction (runtime/triton_runtime/repository.py)
ACTIVATION_RESERVE = 0.05

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
class Sizing:
    """A replica under in-flight batching, for one token mix: a request spends `solo_s` in an
    otherwise empty batch, and `slots / rate` when every slot is busy (linear in between)."""

    rate: float        # requests/s completed with every slot busy
    solo_s: float      # seconds one request spends alone in the batch
    slots: float       # requests the batch holds
    prefill_s: float = 0.0  # seconds the batch stalls for one request's prefill (serial per replica)


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

    def prefill_s(self, tokens: float) -> float:
        linear = 2 * self.params * tokens
        attention = 2 * self.layers * self.hidden * tokens * tokens
        return (linear + attention) / self.flops

    def fits(self, prompt: int, output: int) -> bool:
        """Whether the engine takes a request of these token counts: within its input and sequence
        limits, and within the KV cache even alone (a longer one is never admitted)."""
        return (prompt <= self.max_input_len and prompt + output <= self.max_seq_len
                and prompt + output <= self.kv_capacity_tokens)

    def sizing(self, prompt_tokens: float, output_tokens: float, cached_tokens: float = 0.0) -> Sizing | None:
        """One replica serving requests of these mean token counts (None if one cannot fit), of
        whose prompt tokens `cached_tokens` come from the engine's prefix cache (KV blocks reused
        from an earlier request: their prefill is skipped, but the sequence still holds their KV).

        Every admission stalls the batch for its prefill (P); a request then holds a slot for
        `output` decode iterations (tau(B) each, B requests in the batch). With B slots busy,
        per second X x P + X x output x tau(B) / B = 1, so a request spends
        S(B) = B / X = B x P + output x tau(B) in the batch: linear in B while decode is
        bandwidth bound (the KV reads grow with B). The batch is the engine's maximum, or fewer
        when the KV cache cannot hold that many sequences."""
        prompt, output = max(1.0, prompt_tokens), max(1.0, output_tokens)
        slots = min(float(self.max_batch), self.kv_capacity_tokens / (prompt + output))
        if slots < 1:
            return None
        context = prompt + output / 2
        # A cached beginning of c tokens leaves the other tokens to prefill, each still attending
        # to the whole prefix: the prefill of the full prompt less that of the beginning (at
        # least the last token is always computed).
        cached = min(max(0.0, cached_tokens), prompt - 1.0)
        prefill = self.prefill_s(prompt) - self.prefill_s(cached)
        full = slots * prefill + output * self.decode_step_s(math.ceil(slots), slots * context)
        solo = prefill + output * self.decode_step_s(1, context)
        return Sizing(rate=slots / full, solo_s=solo, slots=slots, prefill_s=prefill)

    def saturated_rate(self, prompt_tokens: float, output_tokens: float) -> float:
        """Requests/s one replica completes with every batch slot busy (0 if none fits)."""
        sized = self.sizing(prompt_tokens, output_tokens)
        return 0.0 if sized is None else sized.rate

    @property
    def kind(self) -> str:
        return "llm"


def llm_performance(spec: InferenceServiceSpec, gpu: GPUClassSpec, max_batch: int | None = None) -> LLMPerformance:
    params = spec.model.parameter_count()
    if params is None:
        raise ValueError("spec.model.parameters is needed to model a TensorRT-LLM replica")
    count = spec.gpu.count
    figures = fit(spec.model, gpu, count)
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
