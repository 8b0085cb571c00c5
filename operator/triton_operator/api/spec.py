"""InferenceService: a model served by Triton Inference Server on a class of GPUs. Its spec (the
model, in model.py; the GPUs; autoscaling; how its pods serve, in serving.py: the server container,
the TensorRT-LLM engine, rollout, routing and the OpenAI routes) and the object itself; its status
is in status.py."""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .base import API_VERSION, Model
from .gpuclass import AUTO_CLASS
from .model import CALIBRATED_PRECISIONS, CALIBRATION_MESSAGE, RESERVED_MODEL_NAMES, ModelSpec
from .serving import (INFERENCE_POOL_FORMAT_MESSAGE, KV_EVENTS_FORMAT_MESSAGE, EngineSpec, OpenAISpec, RolloutSpec,
                      RoutingSpec, ServerSpec)
from .status import InferenceServiceStatus
from .syntax import (ANNOTATION_KEY, DNS_1035_LABEL, DNS_LABEL, DURATION_MAX_LENGTH, DURATION_PATTERN, AnnotationKey,
                     LabelKey, LabelValue, cel, checked_metadata, duration_ns, duration_rule, duration_within,
                     keys_rule, labels_field, seconds)

# Most replicas spec.replicas and the autoscaler's bounds may ask for.
MAX_REPLICAS = 1000

SERVICE_NAME_RULES = ("a lowercase letter, then lowercase letters, digits or '-', ending with a letter or "
                      "digit, at most 52 characters (it names the Service; other children add suffixes)")

# Size budget. etcd refuses objects over 1.5 MiB, the API server requests over 3 MiB, and
# `kubectl apply` (client side) copies the object into an annotation of at most 256 KiB. Every
# string and collection of InferenceServiceSpec is bounded so that the largest spec stays well
# under all of them. In code points (what maxLength counts):
#   model      source 2,048 + name 128 + revision 128 + parameters 16 + credentialsSecret 253  =   2,573
#   gpu        class 63 + fallbackClasses 8 x 63 + spill.after 32 + spill.returnAfter 32       =     631
#   server     image 512 + shmSize 32 + resources 2 x 3 x (name 17 + quantity 32)              =     838
#              args 64 x 512                                                                   =  32,768
#              env names and values together (serving.ENV_TOTAL)                               =  32,768
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
LABELS_MAX = 64
ANNOTATIONS_MAX, ANNOTATIONS_TOTAL = 64, 32768

RESERVED_SERVICE_MESSAGE = ("metadata.name 'stats' would also be the Triton model's name (model.name defaults to "
                            "it), which Triton's HTTP API keeps for every model's statistics: set model.name")

TOLERANCE_MESSAGE = "tolerance must be at most 0.5"


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
        description="Scale down only to the highest replica count recommended within this many seconds; an idle "
                    "replica the keep-alive holds for the next burst is held at most this long after it was last "
                    "needed.")
    scale_down_max_step: int = Field(1, ge=1, le=MAX_REPLICAS, description="At most this many replicas removed per decision.")
    # At most 0.5 by a rule, not a maximum: the API server words a fractional maximum as an integer
    # ("should be less than or equal to 0").
    tolerance: float = Field(
        0.1, ge=0, json_schema_extra={"x-kubernetes-validations": [cel("self <= 0.5", TOLERANCE_MESSAGE)]},
        description="Relative deviation from a target ignored as noise (0.1 = 10 %); at most 0.5 (at 1 every "
                    "count below the current one was noise, and nothing scaled down).")
    scale_to_zero_after_seconds: int = Field(
        900, ge=30, le=86400,
        description="With minReplicas 0: the idle window. The service scales to zero once no request was queued, "
                    "running or held at the gateway for this many seconds.")

    # Cross-field checks run on the later field, which sees the earlier ones in info.data, so that
    # an error names a field as the CRD's rule does (its fieldPath), not the object holding both.
    @field_validator("tolerance")
    @classmethod
    def _tolerance(cls, v: float) -> float:
        if v > 0.5:
            raise ValueError(TOLERANCE_MESSAGE)
        return v

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
            return _p99_level(self.target_p99_latency_ms)
        return None

    def end_to_end_target_ms(self) -> float | None:
        """The end-to-end latency target, when the service level is one (what Triton's p99 is read against)."""
        level = self.service_level()
        return level.latency_ms if level is not None and level.latency == "endToEnd" else None


def raw_service_level(autoscaling: Any) -> tuple[str, float, float] | None:
    """(latency, target in seconds, attainment) of spec.autoscaling as stored (a dict, admitted by
    the CRD), for readers that keep no model of the object (the gateway, the service's series):
    `slo`, or targetP99LatencyMs as an end-to-end 99 % one; None without either. A field out of
    shape reads as unset, never as an error."""
    if not isinstance(autoscaling, dict):
        return None

    def number(v: Any) -> float | None:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None

    slo = autoscaling.get("slo")
    if isinstance(slo, dict) and (target := number(slo.get("latencyMs"))) is not None:
        kind = slo.get("latency") if slo.get("latency") in SLO_LATENCIES else "endToEnd"
        share = number(slo.get("attainment"))
        return kind, target / 1000.0, share if share is not None and share < 1 else 0.99
    target = number(autoscaling.get("targetP99LatencyMs"))
    return ("endToEnd", target / 1000.0, 0.99) if target is not None else None


@lru_cache(maxsize=1024)
def _p99_level(latency_ms: float) -> SLOSpec:
    """targetP99LatencyMs as a service level, built once per value: the autoscaler asks for it
    several times a tick for every service, and building (validating) one cost a sixth of the
    decision. Shared: never assigned to."""
    return SLOSpec(latency_ms=latency_ms)


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

