"""The API of triton-operator: InferenceService and GPUClass, as pydantic models.

These models are the one source of truth: the CRDs in crds/ are generated from them
(`triton-operator crds`), and the operator parses every object it reads through them.
Field descriptions become `kubectl explain` text, so they are written for users.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

GROUP = "serving.triton-operator.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# DNS-1123 label / subdomain, as Kubernetes validates object names.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
QUANTITY = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
SOURCE_SCHEMES = ("hf", "s3", "gs", "pvc")
SOURCE_PATTERN = r"^(hf://[^/\s]+/[^\s]+|s3://[^/\s]+(/[^\s]*)?|gs://[^/\s]+(/[^\s]*)?|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^\s]*)?)$"
PARAMETERS_PATTERN = r"^[0-9]+(\.[0-9]+)?[KMBT]$"
# A Go duration (what CEL's duration() parses) in the units people write: 90s, 2m, 1h30m, 1.5h, 500ms.
# No backslashes: the pattern also goes into CEL string literals, where "\." is no valid escape.
DURATION_PATTERN = r"^([0-9]+([.][0-9]+)?(ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_DURATION_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# gpu.class auto asks the planner to choose; no GPUClass may take that name.
AUTO_CLASS = "auto"
AUTO_RESERVED_MESSAGE = "GPUClass name auto is reserved: gpu.class auto asks the planner to choose a class"

ModelFormat = Literal["tensorrt-llm", "onnx", "pytorch", "tensorrt", "python", "triton"]
Precision = Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4-awq"]

BYTES_PER_PARAMETER: dict[str, float] = {
    "fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4-awq": 0.5,
}
# FP8 kernels need Ada Lovelace or newer (L4 8.9, H100/H200 9.0); A100 (8.0) has none.
MIN_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {"fp8": (8, 9), "bf16": (8, 0)}
# Precisions quantize.py builds by calibrating on sample text (runtime/triton_runtime/spec.py).
CALIBRATED_PRECISIONS = ("fp8", "int4-awq")
# Checkpoint families format tensorrt-llm refuses by name (the runtime refuses them again by
# config.json model_type, runtime/triton_runtime/trtllm.py UNSUPPORTED): NVIDIA/TensorRT-LLM
# v0.17.0 examples/gemma/convert_checkpoint.py takes other flags (--ckpt-type --model-dir
# --output-model-dir --world-size), and ChatGLM/GLM-4 and Baichuan tokenizers are Python code in
# the checkpoint (trust_remote_code), which the tokenizer models refuse to run. RE2 and Python
# agree on this pattern (CEL's matches() searches like re.search).
UNBUILT_LLM_FAMILIES = r"(?i)(gemma|chatglm|glm-4|baichuan)"
UNBUILT_LLM_MESSAGE = (
    "model.source names a Gemma, ChatGLM/GLM-4 or Baichuan checkpoint, which format tensorrt-llm does not "
    "build (Gemma's converter takes other flags; ChatGLM and Baichuan tokenizers are remote code): build the "
    "engine and the model repository yourself and serve them with format triton")
SERVER_IMAGE_MESSAGE = (
    "server.image cannot be set for model.format tensorrt-llm: the engine is built and served by the "
    "operator's runtime image, whose TensorRT-LLM version the engine's cache key names; set the operator's "
    "runtime image (chart value triton.runtimeImage) instead")
CALIBRATION_MESSAGE = "engine.calibrationDataset applies only to precisions fp8 and int4-awq"


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """A CEL validation rule for the CRD (x-kubernetes-validations)."""
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = "." + field_path.lstrip(".")
    return out


def seconds(duration: str) -> float:
    """Seconds in a duration matching DURATION_PATTERN ("1h30m" -> 5400.0)."""
    return sum(float(n) * _DURATION_UNIT[unit] for n, unit in _DURATION_PART.findall(duration))


def _duration_rule(field: str, low: str, high: str) -> dict[str, str]:
    """CEL: a duration field within [low, high]. Guarded by the pattern so a malformed value gets
    the pattern's message, never a CEL evaluation error."""
    return cel(f"!self.{field}.matches('{DURATION_PATTERN}') || "
               f"(duration(self.{field}) >= duration('{low}') && duration(self.{field}) <= duration('{high}'))",
               f"{field} must be between {low} and {high}", field)


def first_error(e: ValidationError) -> str:
    """The first validation error as "field.path: message" (the wire names, as users write them)."""
    first = e.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"]


class Model(BaseModel):
    """Base: camelCase on the wire, unknown fields refused, values validated on assignment."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_assignment=True,
    )

    def wire(self) -> dict[str, Any]:
        """The object as the API server holds it: camelCase, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# --------------------------------------------------------------------------------------------
# GPUClass
# --------------------------------------------------------------------------------------------

class Toleration(Model):
    """A toleration added to serving pods of this class, as in a Pod spec."""

    key: str | None = Field(None, description="Taint key to tolerate; empty with operator Exists matches all keys.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: str | None = Field(None, description="Taint value to match when operator is Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all effects.")
    toleration_seconds: int | None = Field(
        None, description="For NoExecute: how long the pod stays bound after the taint appears.")


class GPUClassSpec(Model):
    """What a class of GPUs is and how pods land on it."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("(has(self.productNames) && size(self.productNames) > 0) || (has(self.nodeSelector) && size(self.nodeSelector) > 0)",
            "set productNames or nodeSelector, or pods of this class could land on any node"),
    ]})

    display_name: str | None = Field(None, description="Human-readable name, e.g. 'NVIDIA H100 SXM 80GB'.")
    resource_name: str = Field(
        "nvidia.com/gpu", pattern=r"^[a-z0-9.-]+/[a-z0-9._-]+$",
        description="Extended resource requested per GPU, e.g. nvidia.com/gpu or a MIG resource such as nvidia.com/mig-1g.10gb.")
    product_label: str = Field(
        "nvidia.com/gpu.product",
        description="Node label that names the GPU product (set by GPU Feature Discovery).")
    product_names: list[str] = Field(
        default_factory=list, max_length=32,
        description="Accepted values of productLabel; a node matches if its value is any of them. Values vary by form factor (SXM, PCIe, NVL), so list them all.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Extra node labels every serving pod of this class requires.")
    tolerations: list[Toleration] = Field(
        default_factory=lambda: [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
        description="Tolerations for the taints GPU nodes of this class carry. Defaults to tolerating nvidia.com/gpu:NoSchedule.")
    memory_gib: float = Field(..., alias="memoryGiB", gt=0, description="GPU memory per device in GiB, used to plan whether a model fits.")
    memory_bandwidth_tbps: float = Field(..., alias="memoryBandwidthTBps", gt=0, description="Memory bandwidth per device in TB/s; bounds LLM decode speed.")
    compute_capability: str = Field(
        ..., pattern=r"^[0-9]+\.[0-9]+$", description="CUDA compute capability, e.g. '9.0'. TensorRT-LLM engines are built per capability; FP8 needs 8.9 or higher.")
    gpus_per_node: int = Field(8, ge=1, le=64, description="GPUs on one node of this class; bounds tensor parallelism on one node.")
    price_per_hour: float | None = Field(None, ge=0, description="Price of one GPU per hour in your currency, for cost estimates.")
    spare_gpus: bool = Field(
        False, alias="spareGPUs", description="Whether the cluster keeps spare GPUs of this class. When false, rolling updates replace pods one at a time without surging (maxSurge 0), so a rollout never waits for GPUs that do not exist.")

    @property
    def capability(self) -> tuple[int, int]:
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)


class GPUClass(Model):
    """A cluster-scoped catalog entry mapping a GPU class name to nodes and planning figures."""

    api_version: Literal["serving.triton-operator.io/v1alpha1"] = API_VERSION
    kind: Literal["GPUClass"] = "GPUClass"
    metadata: dict[str, Any]
    spec: GPUClassSpec

    @property
    def name(self) -> str:
        return self.metadata["name"]

    @field_validator("metadata")
    @classmethod
    def _not_auto(cls, v: dict[str, Any]) -> dict[str, Any]:
        if v.get("name") == AUTO_CLASS:
            raise ValueError(AUTO_RESERVED_MESSAGE)
        return v


# --------------------------------------------------------------------------------------------
# InferenceService spec
# --------------------------------------------------------------------------------------------

class ModelSpec(Model):
    """Which model to serve, where it is, and how it is stored."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel(f"self.format != 'tensorrt-llm' || !self.source.matches('{UNBUILT_LLM_FAMILIES}')",
            UNBUILT_LLM_MESSAGE, "source"),
    ]})

    source: str = Field(
        ..., pattern=SOURCE_PATTERN, max_length=2048,
        description="Where the model is: hf://ORG/NAME (Hugging Face), s3://BUCKET/PATH, gs://BUCKET/PATH, or pvc://CLAIM/PATH (a PersistentVolumeClaim in the same namespace).")
    format: ModelFormat = Field(
        ..., description="What the source holds: tensorrt-llm (a checkpoint to build engines from), onnx, pytorch, tensorrt, python, or triton (a ready Triton model repository).")
    name: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+$", max_length=128,
        description="Name of the model inside Triton, used for metrics. Defaults to 'tensorrt_llm' for tensorrt-llm and to the InferenceService name otherwise.")
    revision: str | None = Field(None, max_length=128, description="Revision (branch, tag or commit) of an hf:// source.")
    parameters: str | None = Field(
        None, pattern=PARAMETERS_PATTERN,
        description="Model size as a count of parameters, e.g. 8B or 70B or 350M; used to plan GPU memory.")
    precision: Precision = Field(
        "fp16", description="Numeric precision of the served weights: fp32, fp16, bf16, fp8 (compute capability 8.9+), int8 or int4-awq.")
    credentials_secret: str | None = Field(
        None, pattern=DNS_LABEL, max_length=253,
        description="Name of a Secret in this namespace whose keys become environment variables of the container that fetches the model (e.g. HF_TOKEN, AWS_ACCESS_KEY_ID). The operator never reads it.")

    @property
    def scheme(self) -> str:
        return self.source.split("://", 1)[0]

    @model_validator(mode="after")
    def _buildable(self) -> ModelSpec:
        if self.format == "tensorrt-llm" and re.search(UNBUILT_LLM_FAMILIES, self.source):
            raise ValueError(UNBUILT_LLM_MESSAGE)
        return self

    def parameter_count(self) -> float | None:
        if not self.parameters:
            return None
        scale = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[self.parameters[-1]]
        return float(self.parameters[:-1]) * scale


SPILL_MIN_AFTER, SPILL_MAX_AFTER = "5s", "1h"
SPILL_MIN_RETURN, SPILL_MAX_RETURN = "10s", "24h"


class SpillSpec(Model):
    """Spill-over: when replicas cannot be scheduled on the preferred GPU class, run them on the
    next class that has room, and bring them back when the preferred class has room again."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _duration_rule("after", SPILL_MIN_AFTER, SPILL_MAX_AFTER),
        _duration_rule("returnAfter", SPILL_MIN_RETURN, SPILL_MAX_RETURN),
        cel(f"!self.after.matches('{DURATION_PATTERN}') || !self.returnAfter.matches('{DURATION_PATTERN}') || "
            "duration(self.returnAfter) >= duration(self.after)",
            "returnAfter must be at least after, so that replicas do not move back before a shortage could "
            "move them again", "returnAfter"),
    ]})

    after: str = Field(
        "120s", pattern=DURATION_PATTERN, max_length=32,
        description="How long replicas of the preferred class must have been unschedulable before they are "
                    f"started on the next class with room (a Go duration, {SPILL_MIN_AFTER} to {SPILL_MAX_AFTER}). "
                    "Replicas that run stay where they are.")
    return_after: str = Field(
        "600s", pattern=DURATION_PATTERN, max_length=32,
        description="How long the preferred class must have had room for one more replica before replicas move "
                    "back, one at a time, each started on the preferred class and ready before one elsewhere "
                    f"stops ({SPILL_MIN_RETURN} to {SPILL_MAX_RETURN}, at least after). Capacity that comes and "
                    "goes within this time moves nothing.")

    @model_validator(mode="after")
    def _bounds(self) -> SpillSpec:
        for name, low, high in (("after", SPILL_MIN_AFTER, SPILL_MAX_AFTER),
                                ("returnAfter", SPILL_MIN_RETURN, SPILL_MAX_RETURN)):
            value = self.after if name == "after" else self.return_after
            if not seconds(low) <= seconds(value) <= seconds(high):
                raise ValueError(f"{name} must be between {low} and {high}")
        if seconds(self.return_after) < seconds(self.after):
            raise ValueError("returnAfter must be at least after, so that replicas do not move back before a "
                             "shortage could move them again")
        return self

    @property
    def after_seconds(self) -> float:
        return seconds(self.after)

    @property
    def return_after_seconds(self) -> float:
        return seconds(self.return_after)


COUNT_ZERO_MESSAGE = "gpu.count 0 (let the planner choose) needs gpu.class auto"
AUTO_FALLBACK_MESSAGE = "fallbackClasses do not apply to gpu.class auto: the planner ranks every GPUClass"
SPILL_TARGET_MESSAGE = "gpu.spill needs fallbackClasses (or gpu.class auto) to spill over to"
AUTO_PARAMETERS_MESSAGE = "gpu.class auto needs model.parameters, to plan which GPUs the model fits"


class GPUSpec(Model):
    """Which GPUs each replica gets."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("!has(self.fallbackClasses) || !(self.class in self.fallbackClasses)", "fallbackClasses must not repeat class", "fallbackClasses"),
        cel(f"self.count >= 1 || self.class == '{AUTO_CLASS}'", COUNT_ZERO_MESSAGE, "count"),
        cel(f"self.class != '{AUTO_CLASS}' || !has(self.fallbackClasses) || size(self.fallbackClasses) == 0",
            AUTO_FALLBACK_MESSAGE, "fallbackClasses"),
        cel(f"!has(self.spill) || self.class == '{AUTO_CLASS}' || (has(self.fallbackClasses) && size(self.fallbackClasses) > 0)",
            SPILL_TARGET_MESSAGE, "spill"),
    ]})

    class_: str = Field(
        ..., alias="class", pattern=DNS_LABEL, max_length=63,
        description="Name of the GPUClass to run on, e.g. h100. Or auto: the planner picks the cheapest GPUClass "
                    "in the cluster (and with count 0 the GPU count) where the model fits, within maxPricePerHour "
                    "and maxTimePerOutputTokenMs; `triton-operator plan` shows its ranking.")
    count: int = Field(
        1, ge=0, le=64,
        description="GPUs per replica; more than one enables tensor parallelism inside the pod. 0 lets the planner "
                    "choose (class auto only): the fewest GPUs that hold the model and meet maxTimePerOutputTokenMs.")
    fallback_classes: list[Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]] = Field(
        default_factory=list, max_length=8,
        description="GPUClasses to use, in order, when class does not exist in the cluster; with spill, also "
                    "where replicas go when class is full.")
    spill: SpillSpec | None = Field(
        None,
        description="Spill over to the next class (fallbackClasses in order, or the planner's ranking with class "
                    "auto) when replicas of the preferred class cannot be scheduled, and move back when it has "
                    "room. Classes whose precision or memory rule the model out are skipped; status.placement "
                    "says why. Unset: replicas wait for the preferred class.")
    max_price_per_hour: float | None = Field(
        None, gt=0,
        description="Most a replica may cost per hour (pricePerHour of the GPUClass x GPUs per replica). Bounds "
                    "the choice of class auto and the classes a spill may use; classes without a price are not "
                    "used when it is set.")
    max_time_per_output_token_ms: float | None = Field(
        None, gt=0,
        description="Latency target for LLMs: milliseconds per generated token of one stream. A class whose decode "
                    "speed bound (memory bandwidth x GPUs / weight bytes) cannot meet it is not chosen by class "
                    "auto nor used by a spill.")

    @field_validator("fallback_classes")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("fallbackClasses must not repeat a class")
        return v

    @model_validator(mode="after")
    def _no_self_fallback(self) -> GPUSpec:
        if self.class_ in self.fallback_classes:
            raise ValueError("fallbackClasses must not repeat class")
        if self.count == 0 and not self.auto:
            raise ValueError(COUNT_ZERO_MESSAGE)
        if self.auto and self.fallback_classes:
            raise ValueError(AUTO_FALLBACK_MESSAGE)
        if self.spill is not None and not self.auto and not self.fallback_classes:
            raise ValueError(SPILL_TARGET_MESSAGE)
        return self

    @property
    def auto(self) -> bool:
        return self.class_ == AUTO_CLASS

    def candidates(self) -> list[str]:
        return [self.class_, *self.fallback_classes]


class AutoscalingSpec(Model):
    """Scale replicas from Triton's own queue depth and p99 latency."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("self.minReplicas <= self.maxReplicas", "minReplicas must be less than or equal to maxReplicas"),
    ]})

    min_replicas: int = Field(1, ge=1, le=1000, description="Fewest replicas, also while metrics are missing.")
    max_replicas: int = Field(..., ge=1, le=1000, description="Most replicas the autoscaler may ask for.")
    target_queue_depth: float = Field(
        4, gt=0, description="Requests waiting in Triton's queue per ready replica that the autoscaler aims for.")
    target_p99_latency_ms: float | None = Field(
        None, gt=0, description="p99 end-to-end request latency the autoscaler aims to stay under, in milliseconds.")
    scale_down_stabilization_seconds: int = Field(
        300, ge=0, le=3600,
        description="Scale down only to the highest replica count recommended within this many seconds.")
    scale_down_max_step: int = Field(1, ge=1, description="At most this many replicas removed per decision.")
    tolerance: float = Field(
        0.1, ge=0, le=1, description="Relative deviation from a target ignored as noise (0.1 = 10 %).")

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must be less than or equal to maxReplicas")
        return self


class ContainerResources(Model):
    """Requests and limits of a container, as in a Pod spec (without GPUs, which spec.gpu sets)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("!has(self.requests) || self.requests.all(k, !k.startsWith('nvidia.com/'))",
            "GPUs are set by spec.gpu, not by resources.requests"),
        cel("!has(self.limits) || self.limits.all(k, !k.startsWith('nvidia.com/'))",
            "GPUs are set by spec.gpu, not by resources.limits"),
    ]})

    requests: dict[str, Annotated[str, Field(pattern=QUANTITY)]] | None = Field(
        None, description="Resource requests, e.g. {cpu: '8', memory: 64Gi}; keys left out keep the operator's defaults.")
    limits: dict[str, Annotated[str, Field(pattern=QUANTITY)]] | None = Field(
        None, description="Resource limits, e.g. {memory: 96Gi}.")

    @model_validator(mode="after")
    def _no_gpus(self) -> ContainerResources:
        for part in (self.requests or {}, self.limits or {}):
            if any(k.startswith("nvidia.com/") for k in part):
                raise ValueError("GPUs are set by spec.gpu, not by resources")
        return self


class EnvVar(Model):
    """A plain environment variable for the Triton container (use model.credentialsSecret for secrets)."""

    name: str = Field(..., pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$", max_length=256, description="Variable name.")
    value: str = Field("", max_length=32768, description="Variable value.")


class ServerSpec(Model):
    """The Triton server container."""

    image: str | None = Field(
        None, max_length=512,
        description="Triton image for formats other than tensorrt-llm. Defaults to the operator's configured Triton "
                    "image. Not allowed with tensorrt-llm: those services run the operator's runtime image, which "
                    "holds triton-runtime and the TensorRT-LLM version their engines were built with.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None, description="Image pull policy.")
    resources: ContainerResources | None = Field(
        None, description="CPU and memory requests and limits of the Triton container. Requests default to cpu 2 "
                          "and memory 8Gi; no limits unless set.")
    args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list, max_length=64,
        description="Extra tritonserver flags appended after the operator's, e.g. --log-verbose=1.")
    env: list[EnvVar] = Field(default_factory=list, max_length=64, description="Extra environment variables.")
    shm_size: str = Field(
        "2Gi", pattern=QUANTITY, description="Size of /dev/shm (memory-backed); the Python backend and NCCL need a large one.")
    startup_timeout_seconds: int = Field(
        1800, ge=60, le=86400,
        description="How long a replica may take to load its model before it is restarted. Large models need many minutes.")


class EngineSpec(Model):
    """How TensorRT-LLM engines are built (format tensorrt-llm only). One engine is built per GPU
    class in use, on a node of that class, and kept in a shared cache."""

    cache_claim: str | None = Field(
        None, pattern=DNS_LABEL, max_length=253,
        description="PersistentVolumeClaim in this namespace holding the engine cache (ReadWriteMany where "
                    "several nodes share it). Defaults to the operator's configured claim (trtllm-engines).")
    max_batch_size: int = Field(64, ge=1, le=4096, description="Largest batch the engine runs.")
    max_input_len: int = Field(2048, ge=1, description="Longest prompt in tokens.")
    max_seq_len: int = Field(4096, ge=2, description="Longest prompt plus output in tokens.")
    max_num_tokens: int = Field(8192, ge=1, description="Most tokens in one engine step (batch of prompts and generations).")
    streaming: bool = Field(False, description="Serve tokens as they are generated (decoupled model, gRPC streaming).")
    calibration_dataset: str | None = Field(
        None, pattern=SOURCE_PATTERN, max_length=2048,
        description="Calibration text for precisions fp8 and int4-awq, for clusters without access to the Hugging "
                    "Face Hub: hf://ORG/NAME (a dataset repository), s3://, gs:// or pvc://CLAIM/PATH holding a "
                    "Hugging Face datasets folder with a train split and a text column (512 rows are used; "
                    "e.g. parquet or jsonl files). The build Job fetches it with the model's credentials. When "
                    "unset, TensorRT-LLM's quantize.py downloads cnn_dailymail from the Hub.")
    build_resources: ContainerResources | None = Field(
        None, description="CPU, memory and ephemeral-storage of the engine-build Job, independent of the serving "
                          "pods'. Defaults, with P = model.parameters in billions and N = gpu.count: requests cpu "
                          "2+2N; memory 2.5 GB per billion parameters (the 16-bit checkpoint held in host memory "
                          "while converting, plus a quarter), at least 16Gi; ephemeral-storage (2 + bytes per "
                          "parameter at the precision) x P GB plus a fifth plus 10Gi, for the download and the "
                          "converted checkpoint, which also sizes the scratch volume. No limits unless set here. "
                          "Without model.parameters: memory 32Gi and an unbounded scratch volume.")

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("self.maxInputLen < self.maxSeqLen", "maxInputLen must be less than maxSeqLen (which counts input and output)"),
    ]})

    @model_validator(mode="after")
    def _lengths(self) -> EngineSpec:
        if self.max_input_len >= self.max_seq_len:
            raise ValueError("maxInputLen must be less than maxSeqLen (which counts input and output)")
        return self


class RolloutSpec(Model):
    """How a spec change rolls out."""

    max_surge: int | None = Field(
        None, ge=0, description="Extra replicas during a rollout. Defaults to 1 when the GPUClass has spareGPUs, else 0 so a rollout on a GPU-scarce cluster never deadlocks.")
    max_unavailable: int = Field(
        1, ge=0, description="Replicas that may be down during a rollout. Must be at least 1 when maxSurge is 0.")


class InferenceServiceSpec(Model):
    """The desired state of an InferenceService."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("!has(self.rollout) || !has(self.rollout.maxSurge) || self.rollout.maxSurge > 0 || self.rollout.maxUnavailable > 0",
            "rollout.maxSurge and rollout.maxUnavailable cannot both be 0", "rollout"),
        cel("!has(self.engine) || self.model.format == 'tensorrt-llm'",
            "engine applies only to model.format tensorrt-llm", "engine"),
        cel("!has(self.server) || !has(self.server.image) || self.model.format != 'tensorrt-llm'",
            SERVER_IMAGE_MESSAGE, "server.image"),
        cel("!has(self.engine) || !has(self.engine.calibrationDataset) || "
            f"self.model.precision in {list(CALIBRATED_PRECISIONS)}",
            CALIBRATION_MESSAGE, "engine.calibrationDataset"),
        cel(f"self.gpu.class != '{AUTO_CLASS}' || has(self.model.parameters)", AUTO_PARAMETERS_MESSAGE,
            "model.parameters"),
    ]})

    model: ModelSpec = Field(..., description="The model to serve.")
    gpu: GPUSpec = Field(..., description="The GPUs each replica runs on.")
    replicas: int = Field(
        1, ge=0, le=1000, description="Number of replicas when autoscaling is not set. `kubectl scale` sets it.")
    autoscaling: AutoscalingSpec | None = Field(
        None, description="Scale from Triton's queue depth and p99 latency. When set, replicas is ignored.")
    server: ServerSpec = Field(default_factory=ServerSpec, description="The Triton server container.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="How spec changes roll out.")
    engine: EngineSpec | None = Field(
        None, description="TensorRT-LLM engine build settings (format tensorrt-llm); defaults apply when unset.")
    service_account_name: str | None = Field(
        None, pattern=DNS_LABEL, max_length=253, description="ServiceAccount the serving pods run as.")
    pod_labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on serving pods.")
    pod_annotations: dict[str, str] = Field(default_factory=dict, description="Extra annotations on serving pods.")

    @model_validator(mode="after")
    def _rollout(self) -> InferenceServiceSpec:
        if self.rollout.max_surge == 0 and self.rollout.max_unavailable == 0:
            raise ValueError("rollout.maxSurge and rollout.maxUnavailable cannot both be 0")
        if self.engine is not None and self.model.format != "tensorrt-llm":
            raise ValueError("engine applies only to model.format tensorrt-llm")
        if self.server.image is not None and self.model.format == "tensorrt-llm":
            raise ValueError(SERVER_IMAGE_MESSAGE)
        if self.engine and self.engine.calibration_dataset and self.model.precision not in CALIBRATED_PRECISIONS:
            raise ValueError(CALIBRATION_MESSAGE)
        if self.gpu.auto and not self.model.parameters:
            raise ValueError(AUTO_PARAMETERS_MESSAGE)
        return self


# --------------------------------------------------------------------------------------------
# InferenceService status
# --------------------------------------------------------------------------------------------

class Condition(Model):
    """A metav1.Condition."""

    type: str = Field(..., description="Condition type: Ready, Progressing, Degraded, ...")
    status: Literal["True", "False", "Unknown"] = Field(..., description="True, False or Unknown.")
    reason: str = Field(..., description="One-word CamelCase reason for the last transition.")
    message: str = Field("", description="Human-readable details.")
    last_transition_time: str = Field(..., description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="metadata.generation the condition was set for.")


class Endpoints(Model):
    """In-cluster addresses of the service."""

    http: str | None = Field(None, description="KServe v2 HTTP/REST endpoint.")
    grpc: str | None = Field(None, description="KServe v2 gRPC endpoint.")
    metrics: str | None = Field(None, description="Prometheus metrics endpoint.")


class LiveMetrics(Model):
    """The latest figures read from Triton's metrics."""

    queue_depth: float | None = Field(None, description="Requests waiting per ready replica.")
    p99_latency_ms: float | None = Field(None, description="p99 request latency in milliseconds.")
    observed_at: str | None = Field(None, description="When the figures were read (RFC 3339).")


class AutoscalingStatus(Model):
    """What the autoscaler last decided and why."""

    desired_replicas: int | None = Field(None, description="Replicas the autoscaler asks for.")
    last_scale_time: str | None = Field(None, description="When replicas last changed (RFC 3339).")
    last_decision: str | None = Field(None, description="Reason for the last decision.")


class EngineStatus(Model):
    """The TensorRT-LLM engine of one GPU class."""

    gpu_class: str = Field(..., description="GPUClass the engine is built for.")
    phase: Literal["Building", "Ready", "Failed"] = Field(..., description="Building, Ready or Failed.")
    job: str = Field(..., description="The build Job.")
    message: str = Field("", description="Details, e.g. the Job's failure reason.")


class ClassPlacement(Model):
    """Replicas on one GPU class, and why."""

    gpu_class: str = Field(..., description="The GPUClass.")
    deployment: str | None = Field(None, description="The Deployment running this class's replicas.")
    gpus_per_replica: int | None = Field(None, description="GPUs each replica gets on this class.")
    desired: int = Field(0, description="Replicas the operator asks for on this class.")
    ready: int = Field(0, description="Replicas ready to serve on this class.")
    reason: str = Field(..., description="Why (CamelCase): Preferred, Full, RoomToReturn, Returning, SpilledOver, "
                                         "Standby, EngineBuilding, or why the class is skipped.")
    message: str = Field("", description="Details.")
    since: str | None = Field(None, description="When this reason began (RFC 3339).")


class InferenceServiceStatus(Model):
    """The observed state of an InferenceService."""

    observed_generation: int | None = Field(None, description="metadata.generation last acted on.")
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Progressing and Degraded, with reasons.")
    replicas: int | None = Field(None, description="Replicas the operator asks for.")
    ready_replicas: int | None = Field(None, description="Replicas that are ready to serve.")
    selector: str | None = Field(None, description="Label selector of the serving pods (for the scale subresource).")
    gpu_class: str | None = Field(None, description="The preferred GPUClass in use: class, the first fallbackClass that exists, or the planner's choice for class auto.")
    endpoints: Endpoints | None = Field(None, description="In-cluster URLs.")
    metrics: LiveMetrics | None = Field(None, description="Live figures from Triton.")
    autoscaling: AutoscalingStatus | None = Field(None, description="Autoscaler state.")
    engines: list[EngineStatus] | None = Field(None, description="TensorRT-LLM engines per GPU class.")
    placement: list[ClassPlacement] | None = Field(
        None, description="Replicas per GPU class (the preferred class first), with spill-over reasons.")
    replicas_by_class: str | None = Field(
        None, description="Ready/desired replicas per GPU class in use, e.g. 'h100:1/1,h200:2/2'.")


class InferenceService(Model):
    """A model served by Triton Inference Server on a class of GPUs."""

    api_version: Literal["serving.triton-operator.io/v1alpha1"] = API_VERSION
    kind: Literal["InferenceService"] = "InferenceService"
    metadata: dict[str, Any]
    spec: InferenceServiceSpec
    status: InferenceServiceStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata["name"]

    @property
    def namespace(self) -> str:
        return self.metadata.get("namespace") or "default"

    @field_validator("metadata")
    @classmethod
    def _named(cls, v: dict[str, Any]) -> dict[str, Any]:
        name = v.get("name")
        if not name:
            raise ValueError("metadata.name is required")
        # Child names append suffixes such as "-headless"; Services need a DNS label of 63 chars.
        if not re.match(DNS_LABEL, name) or len(name) > 52:
            raise ValueError("metadata.name must be a DNS label (lowercase letters, digits, '-') of at most 52 characters")
        return v
