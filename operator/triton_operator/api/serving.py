"""How an InferenceService's pods serve: the Triton container (spec.server), TensorRT-LLM
(spec.engine), the rollout, routing (an InferencePool, kvEvents) and the OpenAI routes
(spec.openai)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from ..quantity import exceeds
from .base import Model
from .model import SOURCE_PATTERN, TRITON_MODEL_NAME, TRITON_MODEL_NAME_MAX_LENGTH
from .syntax import DNS_1035_LABEL, DNS_LABEL, IMAGE_PATTERN, INT32_MAX, NO_NUL_PATTERN, Quantity, cel

# The resources a user may request for the Triton container; GPUs come from spec.gpu, and
# hugepages or extended resources follow rules (request == limit) this API does not model.
RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage")

ARGS_MAX_ITEMS, ARG_MAX_LENGTH = 64, 512
ENV_MAX_ITEMS, ENV_TOTAL = 64, 32768

# tritonserver options the operator sets, which spec.server.args must not set again: given twice,
# the later wins (a port the probes do not watch, a repository that is not the model's, the
# admin APIs opened). tritonserver reads its options with getopt_long, which takes any unambiguous
# abbreviation (--http-po=9000 is --http-port), so every prefix of one of them is refused too.
RESERVED_OPTIONS = ("model-repository", "http-port", "grpc-port", "metrics-port", "allow-http", "allow-grpc",
                    "allow-metrics", "strict-readiness", "exit-timeout-secs", "http-restricted-api",
                    "grpc-restricted-protocol")
RESERVED_ARG = "^--(" + "|".join(sorted({o[:n] for o in RESERVED_OPTIONS for n in range(1, len(o) + 1)})) + ")(=.*)?$"
RESERVED_ARG_MESSAGE = ("server.args must not set the options the operator sets, or an abbreviation of one: --"
                        + ", --".join(RESERVED_OPTIONS))
# Linux passes each environment string (NAME=value) of at most 128 KiB to a program.
CHAT_TEMPLATE_MAX_BYTES = 128000


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
    value: str = Field("", max_length=8192, pattern=NO_NUL_PATTERN, description="Variable value.")


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
    args: list[Annotated[str, Field(max_length=ARG_MAX_LENGTH, pattern=NO_NUL_PATTERN)]] = Field(
        default_factory=list, max_length=ARGS_MAX_ITEMS,
        json_schema_extra={"x-kubernetes-validations": [cel(f"self.all(a, !a.matches('{RESERVED_ARG}'))",
                                                            RESERVED_ARG_MESSAGE)]},
        description="Extra tritonserver flags appended after the operator's, e.g. --log-verbose=1. Not the "
                    "options the operator sets (ports, model repository, readiness, protocols, restricted APIs).")
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

    @field_validator("args")
    @classmethod
    def _not_reserved(cls, v: list[str]) -> list[str]:
        if any(re.fullmatch(RESERVED_ARG, a) for a in v):
            raise ValueError(RESERVED_ARG_MESSAGE)
        return v

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
        json_schema_extra={"x-kubernetes-validations": [cel(
            f"size(bytes(self)) <= {CHAT_TEMPLATE_MAX_BYTES}",
            f"chatTemplate must be at most {CHAT_TEMPLATE_MAX_BYTES} bytes in UTF-8 (it reaches the pods as an "
            "environment variable)")]},
        description="Jinja chat template that turns messages into the prompt, as in a Hugging Face "
                    "tokenizer_config.json. Defaults to the chat_template parameter of the Triton model's config, "
                    "else a plain 'role: content' layout.")
    default_max_tokens: int | None = Field(
        None, ge=1, le=1_000_000, description="max_tokens when a request sets none (default 256).")
    task: Literal["generate", "embeddings"] | None = Field(
        None, description="What the model does for the OpenAI routes: generate (text, the default) or embeddings "
                          "(/v1/embeddings: the model takes text_input, a batch of strings, and answers embedding, "
                          "one vector per string, and prompt_tokens). format tensorrt-llm generates.")

    @field_validator("chat_template")
    @classmethod
    def _template_bytes(cls, v: str | None) -> str | None:
        if v is not None and len(v.encode("utf-8", "surrogatepass")) > CHAT_TEMPLATE_MAX_BYTES:
            raise ValueError(f"chatTemplate must be at most {CHAT_TEMPLATE_MAX_BYTES} bytes in UTF-8 (it reaches the "
                             "pods as an environment variable)")
        return v
