"""InferenceService: a model served by Triton Inference Server on a class of GPUs. Its spec (the
model, the GPUs, autoscaling, the server container, the TensorRT-LLM engine, rollout and the
OpenAI routes) and the object itself; its status is in status.py."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ..quantity import exceeds
from .base import API_VERSION, Model
from .gpuclass import AUTO_CLASS
from .status import InferenceServiceStatus
from .syntax import (ANNOTATION_KEY, DNS_1035_LABEL, DNS_LABEL, DURATION_MAX_LENGTH, DURATION_PATTERN, IMAGE_PATTERN,
                     INT32_MAX, AnnotationKey, LabelKey, LabelValue, Quantity, cel, checked_metadata, duration_ns,
                     duration_rule, duration_within, keys_rule, labels_field, seconds)

# Most replicas spec.replicas and the autoscaler's bounds may ask for.
MAX_REPLICAS = 1000
# A Triton model name: a path segment on every Triton route, so never "." or ".." (it starts
# with a letter, digit or underscore). The gateway checks names it reads with the same rule.
TRITON_MODEL_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
TRITON_MODEL_NAME_MAX_LENGTH = 128

SERVICE_NAME_RULES = ("a lowercase letter, then lowercase letters, digits or '-', ending with a letter or "
                      "digit, at most 52 characters (it names the Service; other children add suffixes)")

# Where a model is: hf://ORG/NAME, s3://BUCKET[/PATH], gs://BUCKET[/PATH] or pvc://CLAIM[/PATH], no white space.
_NO_SPACE, _NO_SPACE_OR_SLASH = r"[^ \t\n\r\f\v]", r"[^/ \t\n\r\f\v]"
SOURCE_PATTERN = (rf"^(hf://{_NO_SPACE_OR_SLASH}+/{_NO_SPACE}+|s3://{_NO_SPACE_OR_SLASH}+(/{_NO_SPACE}*)?|"
                  rf"gs://{_NO_SPACE_OR_SLASH}+(/{_NO_SPACE}*)?|pvc://[a-z0-9]([-a-z0-9]{{0,251}}[a-z0-9])?(/{_NO_SPACE}*)?)$")
# A positive count: some digit other than 0 before or after the decimal point.
PARAMETERS_PATTERN = r"^([0-9]*[1-9][0-9]*([.][0-9]+)?|[0-9]+[.][0-9]*[1-9][0-9]*)[KMBT]$"

# The resources a user may request for the Triton container; GPUs come from spec.gpu, and
# hugepages or extended resources follow rules (request == limit) this API does not model.
RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage")

# Size budget. etcd refuses objects over 1.5 MiB, the API server requests over 3 MiB, and
# `kubectl apply` (client side) copies the object into an annotation of at most 256 KiB. Every
# string and collection of InferenceServiceSpec is bounded so that the largest spec stays well
# under all of them. In code points (what maxLength counts):
#   model      source 2,048 + name 128 + revision 128 + parameters 16 + credentialsSecret 253  =   2,573
#   gpu        class 63 + fallbackClasses 8 x 63 + spill.after 32 + spill.returnAfter 32       =     631
#   server     image 512 + shmSize 32 + resources 2 x 3 x (name 17 + quantity 32)              =     838
#              args 64 x 512                                                                   =  32,768
#              env names and values together (ENV_TOTAL)                                       =  32,768
#   engine     cacheClaim 253 + calibrationDataset 2,048 + buildResources 2 x 3 x 49           =   2,595
#   podLabels  64 x (key 317 + value 63)                                                       =  24,320
#   podAnnotations keys and values together (ANNOTATIONS_TOTAL)                                =  32,768
#   openai     model 128 + chatTemplate 65,536                                                 =  65,664
#   serviceAccountName                                                                         =     253
#   imagePullSecrets 16 x 253                                                                  =   4,048
#   total                                                                                      = 199,226
# JSON spends at most 6 bytes on a code point (a \u00XX escape; UTF-8 needs at most 4), and the
# keys, numbers and punctuation around them take under 16 KB (64 env items, 64 + 64 map entries,
# 64 args, 16 pull secrets, 47 scalars): at most 6 x 199,226 + 16,384 = 1,211,740 bytes (1.16 MiB)
# in the worst case, about 216 KB for ASCII text, so even kubectl's client-side apply annotation
# (256 KiB) fits.
ARGS_MAX_ITEMS, ARG_MAX_LENGTH = 64, 512
ENV_MAX_ITEMS, ENV_TOTAL = 64, 32768
LABELS_MAX = 64
ANNOTATIONS_MAX, ANNOTATIONS_TOTAL = 64, 32768

ModelFormat = Literal["tensorrt-llm", "onnx", "pytorch", "tensorrt", "python", "triton"]
Precision = Literal["fp32", "fp16", "bf16", "fp8", "nvfp4", "int8", "int4-awq"]

# NVFP4 and INT4-AWQ hold 4-bit weights with one 8-bit scale per 16 (NVFP4) or 128 (AWQ) values.
BYTES_PER_PARAMETER: dict[str, float] = {
    "fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "nvfp4": 0.5625, "int8": 1, "int4-awq": 0.5,
}
# FP8 kernels need Ada Lovelace or newer (L4 8.9, H100/H200 9.0); A100 (8.0) has none. NVFP4 needs
# Blackwell (B200/GB200, 10.0).
MIN_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {"fp8": (8, 9), "nvfp4": (10, 0), "bf16": (8, 0)}
# Precisions the preparation Job quantizes to with NVIDIA Model Optimizer, calibrating on sample
# text, when the checkpoint is not quantized already (runtime/triton_runtime/prepare.py).
CALIBRATED_PRECISIONS = ("fp8", "nvfp4", "int4-awq")
# Checkpoint families format tensorrt-llm refuses by name: ChatGLM/GLM-4 and Baichuan tokenizers
# are Python code in the checkpoint, which runs only with trust_remote_code, and the llm model
# always passes the LLM API trust_remote_code=False (runtime/triton_runtime/serving/trtllm.py):
# refused here rather than failing every serving pod at load. RE2 and Python agree on
# this pattern (CEL's matches() searches like re.search).
UNBUILT_LLM_FAMILIES = r"(?i)(chatglm|glm-4|baichuan)"
UNBUILT_LLM_MESSAGE = (
    "model.source names a ChatGLM/GLM-4 or Baichuan checkpoint, whose tokenizer is Python code in the "
    "checkpoint (trust_remote_code), which the operator does not run: serve it with format triton and a "
    "model repository of your own")
INT8_LLM_MESSAGE = (
    "precision int8 is not served by TensorRT-LLM's PyTorch backend (its INT8 SmoothQuant path was part of the "
    "removed engine workflow): use fp8 (compute capability 8.9+), int4-awq, or bf16")
CALIBRATION_MESSAGE = "engine.calibrationDataset applies only to precisions fp8, nvfp4 and int4-awq"


def admitted_precisions(model_format: str) -> tuple[str, ...]:
    """The precisions admission accepts for a model format, in Precision's order: every one but int8
    for tensorrt-llm (INT8_LLM_MESSAGE; the CRD's CEL rule says the same). Whatever suggests a
    precision (the planner's messages) picks from these."""
    return tuple(p for p in get_args(Precision) if not (model_format == "tensorrt-llm" and p == "int8"))
# Names Triton's HTTP API matches before its model routes (src/http_server.cc, HTTPAPIServer::Handle):
# GET /v2/models/stats answers every model's statistics, so a model called "stats" has no metadata
# route and its name would reach another API. The gateway refuses to serve such a name too.
RESERVED_MODEL_NAMES = ("stats",)
RESERVED_MODEL_MESSAGE = ("the Triton model name 'stats' is kept by Triton's HTTP API (GET /v2/models/stats "
                          "answers every model's statistics): choose another")
RESERVED_SERVICE_MESSAGE = ("metadata.name 'stats' would also be the Triton model's name (model.name defaults to "
                            "it), which Triton's HTTP API keeps for every model's statistics: set model.name")


class ModelSpec(Model):
    """Which model to serve, where it is, and how it is stored."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel(f"self.format != 'tensorrt-llm' || !self.source.matches('{UNBUILT_LLM_FAMILIES}')",
            UNBUILT_LLM_MESSAGE, "source"),
        cel("self.format != 'tensorrt-llm' || !has(self.precision) || self.precision != 'int8'",
            INT8_LLM_MESSAGE, "precision"),
        cel(f"!has(self.name) || !(self.name in {list(RESERVED_MODEL_NAMES)})", RESERVED_MODEL_MESSAGE, "name"),
    ]})

    source: str = Field(
        ..., pattern=SOURCE_PATTERN, max_length=2048,
        description="Where the model is: hf://ORG/NAME (Hugging Face), s3://BUCKET/PATH, gs://BUCKET/PATH, or pvc://CLAIM/PATH (a PersistentVolumeClaim in the same namespace).")
    format: ModelFormat = Field(
        ..., description="What the source holds: tensorrt-llm (a Hugging Face LLM checkpoint, served by TensorRT-LLM's LLM API on its PyTorch backend), onnx, pytorch, tensorrt, python, or triton (a ready Triton model repository).")
    name: str | None = Field(
        None, pattern=TRITON_MODEL_NAME, max_length=TRITON_MODEL_NAME_MAX_LENGTH,
        description="Name of the model inside Triton, used for metrics. Defaults to 'llm' for tensorrt-llm and to the InferenceService name otherwise.")
    revision: str | None = Field(None, max_length=128, description="Revision (branch, tag or commit) of an hf:// source. A branch or tag is resolved "
                                      "to a commit once, when the model is first prepared, and everything is downloaded "
                                      "from that commit (status.preparation[].commit); the cache keeps it until this "
                                      "field changes, so name a commit to say which one is served.")
    parameters: str | None = Field(
        None, pattern=PARAMETERS_PATTERN, max_length=16,
        description="Model size as a positive count of parameters, e.g. 8B or 70B or 350M; used to plan GPU memory.")
    precision: Precision = Field(
        "fp16", description="Numeric precision of the served weights: fp32, fp16, bf16, fp8 (compute capability 8.9+), "
                            "nvfp4 (Blackwell, 10.0+), int8 (not for tensorrt-llm) or int4-awq. For tensorrt-llm "
                            "a checkpoint not already quantized to fp8, nvfp4 or int4-awq is quantized once by "
                            "the preparation Job.")
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
        if self.precision not in admitted_precisions(self.format):
            raise ValueError(INT8_LLM_MESSAGE)
        if self.name in RESERVED_MODEL_NAMES:
            raise ValueError(RESERVED_MODEL_MESSAGE)
        return self

    def parameter_count(self) -> float | None:
        if not self.parameters:
            return None
        scale = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[self.parameters[-1]]
        return float(self.parameters[:-1]) * scale


SPILL_MIN_AFTER, SPILL_MAX_AFTER = "5s", "1h"
SPILL_MIN_RETURN, SPILL_MAX_RETURN = "10s", "24h"
RETURN_AFTER_MESSAGE = ("returnAfter must be at least after, so that replicas do not move back before a shortage "
                        "could move them again")


class SpillSpec(Model):
    """Spill-over: when replicas cannot be scheduled on the preferred GPU class, run them on the
    next class that has room, and bring them back when the preferred class has room again."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("duration(self.returnAfter) >= duration(self.after)", RETURN_AFTER_MESSAGE, "returnAfter"),
    ]})

    after: str = Field(
        "120s", pattern=DURATION_PATTERN, max_length=DURATION_MAX_LENGTH,
        json_schema_extra={"x-kubernetes-validations": [duration_rule("after", SPILL_MIN_AFTER, SPILL_MAX_AFTER)]},
        description="How long replicas of the preferred class must have been unschedulable before they are "
                    f"started on the next class with room (a duration such as 90s, 2m or 1h30m, {SPILL_MIN_AFTER} "
                    f"to {SPILL_MAX_AFTER}). Replicas that run stay where they are.")
    return_after: str = Field(
        "600s", pattern=DURATION_PATTERN, max_length=DURATION_MAX_LENGTH, validate_default=True,
        json_schema_extra={"x-kubernetes-validations": [
            duration_rule("returnAfter", SPILL_MIN_RETURN, SPILL_MAX_RETURN)]},
        description="How long the preferred class must have had room for one more replica before replicas move "
                    "back, one at a time, each started on the preferred class and ready before one elsewhere "
                    f"stops ({SPILL_MIN_RETURN} to {SPILL_MAX_RETURN}, at least after). Capacity that comes and "
                    "goes within this time moves nothing.")

    @field_validator("after")
    @classmethod
    def _after_bounds(cls, v: str) -> str:
        return duration_within("after", v, SPILL_MIN_AFTER, SPILL_MAX_AFTER)

    @field_validator("return_after")
    @classmethod
    def _return_after_bounds(cls, v: str, info: ValidationInfo) -> str:
        duration_within("returnAfter", v, SPILL_MIN_RETURN, SPILL_MAX_RETURN)
        if "after" in info.data and duration_ns(v) < duration_ns(info.data["after"]):
            raise ValueError(RETURN_AFTER_MESSAGE)
        return v

    @property
    def after_seconds(self) -> float:
        return seconds(self.after)

    @property
    def return_after_seconds(self) -> float:
        return seconds(self.return_after)


# GPUClass.pricePerHour is at most 1,000,000 per GPU, and a replica holds at most 64 GPUs.
MAX_PRICE_PER_REPLICA = 64_000_000
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
        default_factory=list, max_length=8, json_schema_extra={"x-kubernetes-list-type": "set"},
        description="GPUClasses to use, in order, when class does not exist in the cluster; with spill, also "
                    "where replicas go when class is full.")
    spill: SpillSpec | None = Field(
        None,
        description="Spill over to the next class (fallbackClasses in order, or the planner's ranking with class "
                    "auto) when replicas of the preferred class cannot be scheduled, and move back when it has "
                    "room. Classes whose precision or memory rule the model out are skipped; status.placement "
                    "says why. Unset: replicas wait for the preferred class.")
    max_price_per_hour: float | None = Field(
        None, gt=0, le=MAX_PRICE_PER_REPLICA,
        description="Most a replica may cost per hour (pricePerHour of the GPUClass x GPUs per replica). Bounds "
                    "the choice of class auto and the classes a spill may use; classes without a price are not "
                    "used when it is set.")
    max_time_per_output_token_ms: float | None = Field(
        None, gt=0, le=3_600_000,
        description="Latency target for LLMs: milliseconds per generated token of one stream. A class whose decode "
                    "speed bound (memory bandwidth x GPUs / weight bytes) cannot meet it is not chosen by class "
                    "auto nor used by a spill.")

    @field_validator("fallback_classes")
    @classmethod
    def _unique(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("fallbackClasses must not repeat a class")
        if info.data.get("class_") in v:
            raise ValueError("fallbackClasses must not repeat class")
        if info.data.get("class_") == AUTO_CLASS and v:
            raise ValueError(AUTO_FALLBACK_MESSAGE)
        return v

    # Cross-field checks run on the later field (see AutoscalingSpec), naming it as the CRD does.
    @field_validator("count")
    @classmethod
    def _count_zero(cls, v: int, info: ValidationInfo) -> int:
        if v == 0 and "class_" in info.data and info.data["class_"] != AUTO_CLASS:
            raise ValueError(COUNT_ZERO_MESSAGE)
        return v

    @field_validator("spill")
    @classmethod
    def _spill_target(cls, v: SpillSpec | None, info: ValidationInfo) -> SpillSpec | None:
        if v is not None and "class_" in info.data and info.data["class_"] != AUTO_CLASS \
                and not info.data.get("fallback_classes"):
            raise ValueError(SPILL_TARGET_MESSAGE)
        return v

    @property
    def auto(self) -> bool:
        return self.class_ == AUTO_CLASS

    def candidates(self) -> list[str]:
        return [self.class_, *self.fallback_classes]


SLO_LATENCIES = ("endToEnd", "timeToFirstToken", "interToken")
SLO_BOTH_MESSAGE = ("set slo or targetP99LatencyMs, not both (targetP99LatencyMs is slo with latency endToEnd and "
                    "attainment 0.99)")


class SLOSpec(Model):
    """The service level the autoscaler keeps: the share of requests whose latency meets a target.
    It trades GPU-hours for that share: a higher attainment keeps more replicas warm between bursts."""

    latency_ms: float = Field(..., ge=1, le=3_600_000, description="The latency target, in milliseconds.")
    latency: Literal["endToEnd", "timeToFirstToken", "interToken"] = Field(
        "endToEnd", description="Which latency: endToEnd (request to the end of its answer), timeToFirstToken "
                                "(request to the first streamed token), or interToken (the mean time between the "
                                "tokens of a streamed answer).")
    attainment: float = Field(
        0.99, ge=0.5, lt=1, description="The share of requests that must meet latencyMs (0.99: 99 %). The "
                                             "status shows the share met over the last 10 minutes.")


class AutoscalingSpec(Model):
    """Scale replicas from Triton's own queue depth and latency, to a service level."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("self.minReplicas <= self.maxReplicas", "minReplicas must be less than or equal to maxReplicas", "maxReplicas"),
        cel("!has(self.slo) || !has(self.targetP99LatencyMs)", SLO_BOTH_MESSAGE, "slo"),
    ]})

    min_replicas: int = Field(
        1, ge=0, le=MAX_REPLICAS,
        description="Fewest replicas, also while metrics are missing. 0 scales the service to zero after "
                    "scaleToZeroAfterSeconds without requests; the gateway then holds the first request, which "
                    "wakes it (the autoscaler reads the gateway's held requests as demand).")
    max_replicas: int = Field(..., ge=1, le=MAX_REPLICAS, description="Most replicas the autoscaler may ask for.")
    target_queue_depth: float = Field(
        4, ge=0.01, le=1_000_000, description="Requests waiting in Triton's queue per ready replica that the autoscaler aims for.")
    target_p99_latency_ms: float | None = Field(
        None, ge=1, le=3_600_000, description="p99 end-to-end request latency the autoscaler aims to stay under, in "
                                              "milliseconds: the same as slo {latencyMs, attainment: 0.99}.")
    slo: SLOSpec | None = Field(
        None, description="The service level to keep: a latency target (end to end, to the first token, or between "
                          "tokens) and the share of requests that must meet it.")
    scale_down_stabilization_seconds: int = Field(
        300, ge=0, le=3600,
        description="Scale down only to the highest replica count recommended within this many seconds.")
    scale_down_max_step: int = Field(1, ge=1, le=MAX_REPLICAS, description="At most this many replicas removed per decision.")
    tolerance: float = Field(
        0.1, ge=0, le=1, description="Relative deviation from a target ignored as noise (0.1 = 10 %).")
    scale_to_zero_after_seconds: int = Field(
        900, ge=30, le=86400,
        description="With minReplicas 0: the idle window. The service scales to zero once no request was queued, "
                    "running or held at the gateway for this many seconds.")

    # Cross-field checks run on the later field, which sees the earlier ones in info.data, so that
    # an error names a field as the CRD's rule does (its fieldPath), not the object holding both.
    @field_validator("max_replicas")
    @classmethod
    def _bounds(cls, v: int, info: ValidationInfo) -> int:
        if info.data.get("min_replicas", 1) > v:
            raise ValueError("minReplicas must be less than or equal to maxReplicas")
        return v

    @field_validator("slo")
    @classmethod
    def _one_target(cls, v: SLOSpec | None, info: ValidationInfo) -> SLOSpec | None:
        if v is not None and info.data.get("target_p99_latency_ms") is not None:
            raise ValueError(SLO_BOTH_MESSAGE)
        return v

    def service_level(self) -> SLOSpec | None:
        """The service level to keep: `slo`, or targetP99LatencyMs as one (end to end, 99 %)."""
        if self.slo is not None:
            return self.slo
        if self.target_p99_latency_ms is not None:
            return SLOSpec(latency_ms=self.target_p99_latency_ms)
        return None

    def end_to_end_target_ms(self) -> float | None:
        """The end-to-end latency target, when the service level is one (what Triton's p99 is read against)."""
        level = self.service_level()
        return level.latency_ms if level is not None and level.latency == "endToEnd" else None


ResourceList = dict[Literal[RESOURCE_NAMES], Quantity]
_RESOURCE_NAMES_RULE = f"self.all(k, k in {list(RESOURCE_NAMES)})"
_RESOURCE_NAMES_MESSAGE = "only cpu, memory and ephemeral-storage may be set here; GPUs are set by spec.gpu"


class ContainerResources(Model):
    """Requests and limits of a container, as in a Pod spec (without GPUs, which spec.gpu sets)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        # Kubernetes refuses a container whose request exceeds its limit (ValidateResourceRequirements).
        cel("!has(self.requests) || !has(self.limits) || self.requests.all(k, !(k in self.limits) || "
            "quantity(self.requests[k]).compareTo(quantity(self.limits[k])) <= 0)",
            "each request must be less than or equal to its limit", "limits"),
    ]})

    requests: ResourceList | None = Field(
        None, max_length=len(RESOURCE_NAMES),
        json_schema_extra={"x-kubernetes-validations": [cel(_RESOURCE_NAMES_RULE, _RESOURCE_NAMES_MESSAGE)]},
        description="Resource requests (cpu, memory, ephemeral-storage), e.g. {cpu: '8', memory: 64Gi}; keys left "
                    "out keep the operator's defaults, lowered to the limit where a lower limit is set (as "
                    "Kubernetes defaults a missing request to its limit).")
    limits: ResourceList | None = Field(
        None, max_length=len(RESOURCE_NAMES),
        json_schema_extra={"x-kubernetes-validations": [cel(_RESOURCE_NAMES_RULE, _RESOURCE_NAMES_MESSAGE)]},
        description="Resource limits (cpu, memory, ephemeral-storage), e.g. {memory: 96Gi}. None by default.")

    @field_validator("requests", "limits", mode="before")
    @classmethod
    def _no_gpus(cls, v: Any) -> Any:
        if isinstance(v, dict) and any(k not in RESOURCE_NAMES for k in v):
            raise ValueError(_RESOURCE_NAMES_MESSAGE)
        return v

    @field_validator("limits")
    @classmethod
    def _request_within_limit(cls, limits: dict[str, str] | None, info: ValidationInfo) -> dict[str, str] | None:
        for name, request in (info.data.get("requests") or {}).items():
            limit = (limits or {}).get(name)
            if limit is not None and exceeds(request, limit):
                raise ValueError(f"requests.{name} {request} must be less than or equal to its limit {limit}")
        return limits


class EnvVar(Model):
    """A plain environment variable for the Triton container (use model.credentialsSecret for secrets)."""

    name: str = Field(..., pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$", max_length=128, description="Variable name.")
    value: str = Field("", max_length=8192, description="Variable value.")


class ServerSpec(Model):
    """The Triton server container."""

    image: str | None = Field(
        None, max_length=512, pattern=IMAGE_PATTERN,
        description="Triton image. Defaults to the operator's configured images: NVIDIA's tritonserver for most "
                    "formats, its trtllm-python-py3 variant for tensorrt-llm (an image given here for tensorrt-llm "
                    "must hold the TensorRT-LLM version the operator prepares models for; the serving pod's doctor "
                    "checks it).")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None, description="Image pull policy.")
    resources: ContainerResources | None = Field(
        None, description="CPU and memory requests and limits of the Triton container. Requests default to cpu 2 "
                          "and memory 8Gi (or to a lower limit); no limits unless set.")
    args: list[Annotated[str, Field(max_length=ARG_MAX_LENGTH)]] = Field(
        default_factory=list, max_length=ARGS_MAX_ITEMS,
        description="Extra tritonserver flags appended after the operator's, e.g. --log-verbose=1.")
    env: list[EnvVar] = Field(
        default_factory=list, max_length=ENV_MAX_ITEMS,
        json_schema_extra={
            # A list keyed by name, as in a Pod: the API server refuses a name given twice.
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": [cel(
                f"self.map(e, size(e.name) + (has(e.value) ? size(e.value) : 0)).sum() <= {ENV_TOTAL}",
                f"env names and values together must be at most {ENV_TOTAL} characters")],
        },
        description=f"Extra environment variables, each name at most once; names and values together at most {ENV_TOTAL} characters.")
    shm_size: Quantity = Field(
        "2Gi", description="Size of /dev/shm (memory-backed); the Python backend and NCCL need a large one.")
    startup_timeout_seconds: int = Field(
        1800, ge=60, le=86400,
        description="How long a replica may take to load its model before it is restarted. Large models need many minutes.")

    @field_validator("env")
    @classmethod
    def _env_names_once(cls, v: list[EnvVar]) -> list[EnvVar]:
        seen: set[str] = set()
        for e in v:
            if e.name in seen:
                raise ValueError(f"env name {e.name} appears more than once")
            seen.add(e.name)
        if sum(len(e.name) + len(e.value) for e in v) > ENV_TOTAL:
            raise ValueError(f"env names and values together must be at most {ENV_TOTAL} characters")
        return v


class EngineSpec(Model):
    """How TensorRT-LLM runs the model (format tensorrt-llm only): its LLM API arguments, and the
    once-per-model preparation (download, quantization) into a shared cache."""

    cache_claim: str | None = Field(
        None, pattern=DNS_LABEL, max_length=253,
        description="PersistentVolumeClaim in this namespace holding prepared models (ReadWriteMany where several "
                    "nodes share it). Defaults to the operator's configured claim (triton-models).")
    max_batch_size: int = Field(64, ge=1, le=4096, description="Most requests in a batch (LLM API max_batch_size).")
    max_input_len: int = Field(
        2048, ge=1, le=INT32_MAX,
        description="Longest prompt in tokens for the planner's sizing. The LLM API bounds a prompt by maxSeqLen "
                    "less the tokens asked for.")
    max_seq_len: int = Field(4096, ge=2, le=INT32_MAX, validate_default=True,
                             description="Longest prompt plus output in tokens (LLM API max_seq_len).")
    max_num_tokens: int = Field(8192, ge=1, le=INT32_MAX,
                                description="Most tokens in one engine step, prompts and generations together "
                                            "(LLM API max_num_tokens).")
    kv_cache_free_gpu_memory_fraction: float = Field(
        0.9, gt=0, le=1, description="Share of the GPU memory left after the weights that the KV cache takes "
                                     "(LLM API kv_cache_config.free_gpu_memory_fraction).")
    streaming: bool = Field(
        True, description="Kept for older specs: the served model always streams (generate_stream) and answers "
                          "whole (generate).")
    calibration_dataset: str | None = Field(
        None, pattern=SOURCE_PATTERN, max_length=2048,
        description="Calibration text for quantizing to fp8, nvfp4 or int4-awq, for clusters without access to the "
                    "Hugging Face Hub: hf://ORG/NAME (a dataset repository), s3://, gs:// or pvc://CLAIM/PATH "
                    "holding a Hugging Face datasets folder with a train split and a text column (512 rows are "
                    "used). The preparation Job fetches it with the model's credentials. When unset, "
                    "cnn_dailymail is downloaded from the Hub. Unused when the checkpoint is already quantized.")
    build_resources: ContainerResources | None = Field(
        None, description="CPU, memory and ephemeral-storage of the preparation Job, independent of the serving "
                          "pods'. Defaults, with P = model.parameters in billions and N = gpu.count: requests cpu "
                          "2+2N; memory 2.5 GB per billion parameters (the 16-bit checkpoint in host memory while "
                          "quantizing, plus a quarter), at least 16Gi; ephemeral-storage 2 x P GB plus a fifth plus "
                          "10Gi for the download, which also sizes the scratch volume. A default above a limit set "
                          "here is lowered to the limit. No limits unless set here. "
                          "Without model.parameters: memory 32Gi and an unbounded scratch volume.")

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("self.maxInputLen < self.maxSeqLen", "maxInputLen must be less than maxSeqLen (which counts input and output)",
            "maxSeqLen"),
    ]})

    @field_validator("max_seq_len")
    @classmethod
    def _lengths(cls, v: int, info: ValidationInfo) -> int:
        if info.data.get("max_input_len", 0) >= v:
            raise ValueError("maxInputLen must be less than maxSeqLen (which counts input and output)")
        return v


class RolloutSpec(Model):
    """How a spec change rolls out."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("!has(self.maxSurge) || self.maxSurge > 0 || self.maxUnavailable > 0",
            "maxSurge and maxUnavailable cannot both be 0", "maxUnavailable"),
    ]})

    max_surge: int | None = Field(
        None, ge=0, le=INT32_MAX, description="Extra replicas during a rollout. Defaults to 1 when the GPUClass has spareGPUs, else 0 so a rollout on a GPU-scarce cluster never deadlocks.")
    max_unavailable: int = Field(
        1, ge=0, le=INT32_MAX, description="Replicas that may be down during a rollout. Must be at least 1 when maxSurge is 0.")

    @field_validator("max_unavailable")
    @classmethod
    def _progress(cls, v: int, info: ValidationInfo) -> int:
        if info.data.get("max_surge") == 0 and v == 0:
            raise ValueError("maxSurge and maxUnavailable cannot both be 0")
        return v


INFERENCE_POOL_ENGINE = "triton-tensorrt-llm"   # the endpoint picker's built-in metric names our llm model exports
INFERENCE_POOL_FORMAT_MESSAGE = ("routing.inferencePool needs model.format tensorrt-llm (the endpoint picker scores "
                                 "pods by the LLM engine's queue and KV cache)")

KV_EVENTS_FORMAT_MESSAGE = ("routing.policy kvEvents needs model.format tensorrt-llm (the LLM engine reports what its "
                            "cache holds)")


class EndpointPickerRef(Model):
    """The endpoint picker (EPP) of the Gateway API Inference Extension that scores this pool's pods."""

    name: str = Field(..., pattern=DNS_1035_LABEL, max_length=63,
                      description="The endpoint picker's Service, in the InferenceService's namespace.")
    port: int = Field(9002, ge=1, le=65535, description="The endpoint picker Service's gRPC (ext-proc) port.")
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        "FailClose", description="What the gateway does when the endpoint picker does not answer: FailClose refuses "
                                 "the request, FailOpen sends it to a pod of its own choice.")


class InferencePoolSpec(Model):
    """An InferencePool (inference.networking.k8s.io/v1) for gateways that implement the Gateway API
    Inference Extension: the pool selects the service's serving pods on Triton's HTTP port, and
    the pods carry the engine label whose built-in metric names the endpoint picker reads."""

    endpoint_picker: EndpointPickerRef = Field(..., description="The endpoint picker that scores the pool's pods.")


class RoutingSpec(Model):
    """How the gateway picks a replica for each request of this service."""

    policy: Literal["leastInFlight", "prefix", "kvEvents"] | None = Field(
        None,
        description="Unset: kvEvents for model.format tensorrt-llm served on the operator's own LLM model (no "
                    "openai.model of another name), leastInFlight otherwise. "
                    "leastInFlight: the replica with the fewest requests in flight. prefix: the replica where the "
                    "request's first token comes soonest, as the gateway can tell: the part of the prompt the "
                    "replica does not hold yet (from the prompts the gateway sent it, in blocks of 64 "
                    "characters), its answer, and what is left of the work ahead when the replica's batch is full; a replica "
                    "takes a request while it has under 1.25x its share of the requests in flight, plus one, so "
                    "a hot prompt cannot pile onto one replica; a prompt no replica holds goes where its "
                    "beginning hashes, so every gateway replica sends it to the same place without sharing state. "
                    "kvEvents (model.format tensorrt-llm): as prefix, and each answer also brings what the "
                    "replica's engine stored and evicted and how many requests it holds, so every gateway "
                    "replica knows what the others' requests left there, and none counts on a prompt a replica "
                    "evicted.")
    inference_pool: InferencePoolSpec | None = Field(
        None, description="Also render an InferencePool (Gateway API Inference Extension, "
                          "inference.networking.k8s.io/v1) selecting this service's serving pods, for a gateway "
                          "that implements the extension (format tensorrt-llm). The pods then carry the label "
                          f"inference.networking.k8s.io/engine-type: {INFERENCE_POOL_ENGINE}.")


class OpenAISpec(Model):
    """How the gateway serves this model on its OpenAI-compatible routes (/v1/chat/completions,
    /v1/completions, /v1/responses, or /v1/embeddings): through Triton's generate endpoint of one
    model."""

    enabled: bool | None = Field(
        None, description="List the service in /v1/models and accept OpenAI requests for it. Defaults to true for "
                          "format tensorrt-llm and when this block is set, false otherwise.")
    model: str | None = Field(
        None, pattern=TRITON_MODEL_NAME, max_length=TRITON_MODEL_NAME_MAX_LENGTH,
        description="The Triton model whose generate endpoints answer (inputs text_input, max_tokens, stream, ... "
                    "-> text_output). Defaults to 'ensemble' for tensorrt-llm, else to model.name.")
    chat_template: str | None = Field(
        None, max_length=65536,
        description="Jinja chat template that turns messages into the prompt, as in a Hugging Face "
                    "tokenizer_config.json. Defaults to the chat_template parameter of the Triton model's config, "
                    "else a plain 'role: content' layout.")
    default_max_tokens: int | None = Field(
        None, ge=1, le=1_000_000, description="max_tokens when a request sets none (default 256).")
    task: Literal["generate", "embeddings"] | None = Field(
        None, description="What the model does for the OpenAI routes: generate (text, the default) or embeddings "
                          "(/v1/embeddings: the model takes text_input, a batch of strings, and answers embedding, "
                          "one vector per string, and prompt_tokens). format tensorrt-llm generates.")


class InferenceServiceSpec(Model):
    """The desired state of an InferenceService."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("!has(self.engine) || self.model.format == 'tensorrt-llm'",
            "engine applies only to model.format tensorrt-llm", "engine"),
        cel("!has(self.openai) || !has(self.openai.task) || self.openai.task != 'embeddings' || "
            "self.model.format != 'tensorrt-llm'",
            "openai.task embeddings needs a model of another format (tensorrt-llm services generate)", "openai.task"),
        cel("!has(self.engine) || !has(self.engine.calibrationDataset) || "
            f"self.model.precision in {list(CALIBRATED_PRECISIONS)}",
            CALIBRATION_MESSAGE, "engine.calibrationDataset"),
        cel(f"self.gpu.class != '{AUTO_CLASS}' || has(self.model.parameters)", AUTO_PARAMETERS_MESSAGE,
            "gpu.class"),
        cel("!has(self.routing) || !has(self.routing.inferencePool) || self.model.format == 'tensorrt-llm'",
            INFERENCE_POOL_FORMAT_MESSAGE, "routing.inferencePool"),
        cel("!has(self.routing) || !has(self.routing.policy) || self.routing.policy != 'kvEvents' || "
            "self.model.format == 'tensorrt-llm'", KV_EVENTS_FORMAT_MESSAGE, "routing.policy"),
    ]})

    model: ModelSpec = Field(..., description="The model to serve.")
    gpu: GPUSpec = Field(..., description="The GPUs each replica runs on.")
    replicas: int = Field(
        1, ge=0, le=MAX_REPLICAS, description="Number of replicas when autoscaling is not set. `kubectl scale` sets it.")
    autoscaling: AutoscalingSpec | None = Field(
        None, description="Scale from Triton's queue depth and p99 latency. When set, replicas is ignored.")
    server: ServerSpec = Field(default_factory=ServerSpec, description="The Triton server container.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="How spec changes roll out.")
    openai: OpenAISpec | None = Field(
        None, description="The gateway's OpenAI-compatible routes for this service (see the documentation's gateway guide).")
    routing: RoutingSpec | None = Field(
        None, description="How the gateway spreads this service's requests over its replicas.")
    engine: EngineSpec | None = Field(
        None, description="TensorRT-LLM engine build settings (format tensorrt-llm); defaults apply when unset.")
    service_account_name: str | None = Field(
        None, pattern=DNS_LABEL, max_length=253,
        description="ServiceAccount the serving pods and the model's preparation Job run as (its token is not "
                    "mounted: Triton never talks to the Kubernetes API; it serves image pull secrets, workload "
                    "identity and the like).")
    image_pull_secrets: list[Annotated[str, Field(pattern=DNS_LABEL, max_length=253)]] = Field(
        default_factory=list, max_length=16,
        description="Secrets in this namespace for pulling the images of the serving pods and the preparation Job "
                    "(e.g. NGC's nvcr.io), beside the operator's own.")
    pod_labels: dict[LabelKey, LabelValue] = labels_field(
        f"Extra labels on serving pods (at most {LABELS_MAX}), as Kubernetes checks labels.", LABELS_MAX)
    pod_annotations: dict[AnnotationKey, Annotated[str, Field(max_length=ANNOTATIONS_TOTAL)]] = Field(
        default_factory=dict, max_length=ANNOTATIONS_MAX,
        json_schema_extra={"x-kubernetes-validations": [
            keys_rule(ANNOTATION_KEY, "annotation"),
            cel(f"self.map(k, size(k) + size(self[k])).sum() <= {ANNOTATIONS_TOTAL}",
                f"annotation keys and values together must be at most {ANNOTATIONS_TOTAL} characters"),
        ]},
        description=f"Extra annotations on serving pods (at most {ANNOTATIONS_MAX}; keys and values together at "
                    f"most {ANNOTATIONS_TOTAL} characters).")

    def serves_openai(self) -> bool:
        """Whether the gateway serves this model on its OpenAI routes (gateway/routing.py reads the
        same rule from the raw object)."""
        if self.openai is not None and self.openai.enabled is not None:
            return self.openai.enabled
        return self.model.format == "tensorrt-llm" or self.openai is not None

    @field_validator("pod_annotations")
    @classmethod
    def _annotations_size(cls, v: dict[str, str]) -> dict[str, str]:
        if sum(len(k) + len(val) for k, val in v.items()) > ANNOTATIONS_TOTAL:
            raise ValueError(f"annotation keys and values together must be at most {ANNOTATIONS_TOTAL} characters")
        return v

    @field_validator("engine")
    @classmethod
    def _engine_format(cls, v: EngineSpec | None, info: ValidationInfo) -> EngineSpec | None:
        model = info.data.get("model")
        if v is None or model is None:
            return v
        if model.format != "tensorrt-llm":
            raise ValueError("engine applies only to model.format tensorrt-llm")
        if v.calibration_dataset and model.precision not in CALIBRATED_PRECISIONS:
            raise ValueError(CALIBRATION_MESSAGE)
        return v

    @field_validator("openai")
    @classmethod
    def _embeddings_format(cls, v: OpenAISpec | None, info: ValidationInfo) -> OpenAISpec | None:
        model = info.data.get("model")
        if v is not None and v.task == "embeddings" and model is not None and model.format == "tensorrt-llm":
            raise ValueError("openai.task embeddings needs a model of another format (tensorrt-llm services generate)")
        return v

    @field_validator("routing")
    @classmethod
    def _pool_format(cls, v: RoutingSpec | None, info: ValidationInfo) -> RoutingSpec | None:
        model = info.data.get("model")
        if v is not None and model is not None and model.format != "tensorrt-llm":
            if v.inference_pool is not None:
                raise ValueError(INFERENCE_POOL_FORMAT_MESSAGE)
            if v.policy == "kvEvents":
                raise ValueError(KV_EVENTS_FORMAT_MESSAGE)
        return v

    @field_validator("gpu")
    @classmethod
    def _auto_plans(cls, v: GPUSpec, info: ValidationInfo) -> GPUSpec:
        model = info.data.get("model")
        if v.auto and model is not None and not model.parameters:
            raise ValueError(AUTO_PARAMETERS_MESSAGE)
        return v



# The CRD's rule for InferenceService._model_name_free (crdgen puts it on the object, where
# metadata.name is).
MODEL_NAME_RULE = (f"has(self.spec.model.name) || self.spec.model.format == 'tensorrt-llm' || "
                   f"!(self.metadata.name in {list(RESERVED_MODEL_NAMES)})")


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
        return checked_metadata(v, DNS_1035_LABEL, 52, SERVICE_NAME_RULES)

    @model_validator(mode="after")
    def _model_name_free(self) -> InferenceService:
        model = self.spec.model
        if model.name is None and model.format != "tensorrt-llm" and self.name in RESERVED_MODEL_NAMES:
            raise ValueError(RESERVED_SERVICE_MESSAGE)
        return self

