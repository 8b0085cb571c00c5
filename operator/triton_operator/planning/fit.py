"""Does a model fit a GPU class, and what will it cost (pure): the fit of `count` GPUs of a class
for a model, and every reason it cannot run there.

Figures follow the physics in the project's references: weights take parameters x bytes per
parameter; decode reads every weight once per generated token, so a single stream cannot go faster
than bandwidth / weight bytes. With tensor parallelism each of N GPUs reads 1/N of the weights at
once, so the bound is N x bandwidth / weight bytes (ideal: the all-reduce between GPUs costs some
of it, which is why it is a bound). Pipeline stages (below) do not add to it: each token passes
through them in turn.

A replica of more GPUs than a node of its class has spans nodes: it takes whole nodes, splits its
layers into one pipeline stage per node and each stage across the node's GPUs (tensor parallelism
where the GPUs share NVLink, pipeline parallelism across the slower network between nodes; the
layout NVIDIA's and KServe's multi-node guides use). Only TensorRT-LLM's LLM API runs one model
across processes on several nodes; such a replica is a LeaderWorkerSet group (render.group).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..api import BYTES_PER_PARAMETER, MIN_COMPUTE_CAPABILITY, GPUClassSpec, ModelSpec, admitted_precisions

GIB = 1024**3
# Leave room for activations, the KV cache and the CUDA context: weights may take at most this
# share of the GPUs' memory.
WEIGHTS_SHARE = 0.9


@dataclass(frozen=True)
class Fit:
    weights_gib: float | None
    available_gib: float
    fits: bool
    min_gpus: int | None
    decode_tokens_per_s_bound: float | None
    cost_per_hour: float | None


@dataclass(frozen=True)
class Layout:
    """How one replica uses its GPUs: on how many nodes, tensor parallelism within a node times
    pipeline stages across nodes, and per GPU the weights it holds and the memory left for the KV
    cache (within WEIGHTS_SHARE of the GPU: the rest is activations and the CUDA context;
    negative: the weights do not fit). None where the model's size is not known."""

    gpus: int
    nodes: int
    tensor: int
    pipeline: int
    weights_per_gpu_gib: float | None
    kv_cache_per_gpu_gib: float | None

    @property
    def parallelism(self) -> str:
        return f"TP{self.tensor}" + (f"xPP{self.pipeline}" if self.pipeline > 1 else "")

    @property
    def text(self) -> str:
        return self.parallelism + (f" on {self.nodes} nodes" if self.nodes > 1 else "")


@dataclass(frozen=True)
class Problem:
    """Why a spec cannot run on a class: a CamelCase reason and a message a user can act on."""

    reason: str
    message: str


# A MIG slice as its own resource (the device plugin's mixed strategy): nvidia.com/mig-<g>g.<mem>gb.
MIG_PREFIX = "nvidia.com/mig-"


def fit(model: ModelSpec, gpu_class: GPUClassSpec, count: int) -> Fit:
    params = model.parameter_count()
    per_gpu = gpu_class.memory_gib * WEIGHTS_SHARE
    available = per_gpu * count
    cost = None if gpu_class.price_per_hour is None else gpu_class.price_per_hour * count
    if params is None:
        return Fit(None, available, True, None, None, cost)
    weight_bytes = params * BYTES_PER_PARAMETER[model.precision]
    weights_gib = weight_bytes / GIB
    # The API bounds keep every figure finite and positive (parameters > 0, memoryGiB >= 1,
    # bandwidth >= 0.01 TB/s); the guards keep a plan from dividing by zero all the same.
    min_gpus = max(1, math.ceil(weights_gib / per_gpu)) if per_gpu > 0 else None
    # Pipeline stages take turns on each token: only the GPUs of one stage read at once.
    readers = count if count <= gpu_class.gpus_per_node else gpu_class.gpus_per_node
    bound = gpu_class.memory_bandwidth_tbps * 1e12 * readers / weight_bytes if weight_bytes > 0 else None
    return Fit(round(weights_gib, 1), round(available, 1), weights_gib <= available,
                min_gpus, None if bound is None else round(bound, 1), cost)


def layout(model: ModelSpec, gpu_class: GPUClassSpec, count: int) -> Layout:
    """The layout of `count` GPUs of the class (whole nodes when it spans several; `problems`
    refuses a count that does not divide into them)."""
    per_node = max(1, gpu_class.gpus_per_node)
    nodes = 1 if count <= per_node else -(-count // per_node)
    tensor = count if nodes == 1 else per_node
    pipeline = max(1, count // tensor) if nodes > 1 else 1
    params = model.parameter_count()
    if params is None or count < 1:
        return Layout(count, nodes, tensor, pipeline, None, None)
    per_gpu = params * BYTES_PER_PARAMETER[model.precision] / GIB / count
    left = gpu_class.memory_gib * WEIGHTS_SHARE - per_gpu
    return Layout(count, nodes, tensor, pipeline, round(per_gpu, 1), round(left, 1))


def whole_nodes(min_gpus: int, gpus_per_node: int) -> int:
    """The fewest GPUs in whole nodes that hold `min_gpus`."""
    return -(-min_gpus // gpus_per_node) * gpus_per_node


def runnable_precisions(model_format: str, gpu_class: GPUClassSpec, instead_of: str) -> list[str]:
    """The precisions to suggest instead of `instead_of` on the class: those admission accepts for the
    format and the class's compute capability runs, fp32 left out (it only doubles fp16's memory)."""
    return [p for p in admitted_precisions(model_format) if p not in ("fp32", instead_of)
            and gpu_class.capability >= MIN_COMPUTE_CAPABILITY.get(p, (0, 0))]


def _either(names: list[str]) -> str:
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def problems(model: ModelSpec, class_name: str, gpu_class: GPUClassSpec, count: int) -> list[Problem]:
    """Every reason the model cannot run on `count` GPUs of the class (empty when it can)."""
    found: list[Problem] = []
    need = MIN_COMPUTE_CAPABILITY.get(model.precision)
    if need and gpu_class.capability < need:
        found.append(Problem(
            "PrecisionUnsupported",
            f"precision {model.precision} needs compute capability {need[0]}.{need[1]} or higher; "
            f"GPU class {class_name} has {gpu_class.compute_capability}. "
            f"Choose {_either(runnable_precisions(model.format, gpu_class, model.precision))}, or a newer GPU class."))
    if gpu_class.resource_name.startswith(MIG_PREFIX) and count > 1:
        found.append(Problem(
            "MIGSlicesCannotCombine",
            f"gpu.count {count} on GPU class {class_name}, whose resource {gpu_class.resource_name} is one MIG "
            f"slice: slices cannot be combined for tensor parallelism. Use gpu.count 1 with a slice that holds "
            f"the model, or a class of whole GPUs."))
    per_node = gpu_class.gpus_per_node
    if count > per_node and not gpu_class.resource_name.startswith(MIG_PREFIX):
        nodes = -(-count // per_node)
        if count % per_node:
            found.append(Problem(
                "GPUCountNotWholeNodes",
                f"gpu.count {count} spans {nodes} {class_name} nodes of {per_node} GPUs but does not fill them: a "
                f"replica on more than one node takes whole nodes. Use gpu.count {whole_nodes(count, per_node)} "
                f"or at most {per_node}."))
        elif model.format != "tensorrt-llm":
            found.append(Problem(
                "MultiNodeNeedsLLMEngine",
                f"gpu.count {count} spans {nodes} {class_name} nodes of {per_node} GPUs; only format tensorrt-llm "
                f"(TensorRT-LLM's LLM API) runs one model across nodes. Use gpu.count {per_node} or fewer."))
    p = fit(model, gpu_class, count)
    if not p.fits:
        if p.min_gpus is not None and p.min_gpus <= per_node:
            hint = f"set gpu.count to at least {p.min_gpus}"
        elif p.min_gpus is not None and model.format == "tensorrt-llm" and not gpu_class.resource_name.startswith(MIG_PREFIX):
            need = whole_nodes(p.min_gpus, per_node)
            hint = f"set gpu.count to {need} ({need // per_node} nodes of {per_node} GPUs a replica)"
        else:
            hint = "use a lower precision or a GPU class with more memory"
        found.append(Problem(
            "ModelDoesNotFit",
            f"{model.parameters} parameters at {model.precision} need about {p.weights_gib} GiB for "
            f"weights, but {count} x {class_name} leave {p.available_gib} GiB; {hint}."))
    return found
