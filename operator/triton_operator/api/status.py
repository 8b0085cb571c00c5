"""The status of an InferenceService: conditions, endpoints, live figures, the autoscaler's last
decision, the model's preparation and the placement of replicas per GPU class."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Model
from .syntax import INT32_MAX

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
    openai: str | None = Field(
        None, description="OpenAI-compatible base URL through the gateway (use the service name as the model).")


class LiveMetrics(Model):
    """The latest figures read from Triton's metrics."""

    queue_depth: float | None = Field(None, description="Requests waiting per ready replica.")
    p99_latency_ms: float | None = Field(None, description="p99 request latency in milliseconds.")
    slo_attainment: float | None = Field(
        None, description="The share of the last 10 minutes' requests that met the latency target of "
                          "spec.autoscaling.slo (or targetP99LatencyMs), as the gateway counted them: 0.973 is 97.3 %.")
    observed_at: str | None = Field(None, description="When the figures were read (RFC 3339).")


class AutoscalingStatus(Model):
    """What the autoscaler last decided and why."""

    desired_replicas: int | None = Field(None, description="Replicas the autoscaler asks for.")
    last_scale_time: str | None = Field(None, description="When replicas last changed (RFC 3339).")
    last_decision: str | None = Field(None, description="Reason for the last decision.")


class PreparationStatus(Model):
    """The model's preparation (download, quantization) for one precision."""

    precision: str = Field(..., description="The precision prepared.")
    gpu_class: str | None = Field(None, description="GPUClass whose node quantizes it (none when it only downloads).")
    phase: Literal["Preparing", "Ready", "Failed"] = Field(..., description="Preparing, Ready or Failed.")
    job: str = Field(..., description="The preparation Job.")
    key: str | None = Field(None, description="The prepared model's key in the cache.")
    commit: str | None = Field(None, pattern=r"^[0-9a-f]{40}$",
                               description="The commit of an hf:// source the model was prepared from (the "
                                           "revision resolved once, when the download started).")
    message: str = Field("", description="Details, e.g. the Job's failure reason.")


class ClassPlacement(Model):
    """Replicas on one GPU class, and why."""

    gpu_class: str = Field(..., description="The GPUClass.")
    deployment: str | None = Field(None, description="The Deployment running this class's replicas.")
    gpus_per_replica: int | None = Field(None, ge=0, le=64, description="GPUs each replica gets on this class.")
    desired: int = Field(0, ge=0, le=INT32_MAX, description="Replicas the operator asks for on this class.")
    ready: int = Field(0, ge=0, le=INT32_MAX, description="Replicas ready to serve on this class.")
    reason: str = Field(..., description="Why (CamelCase): Preferred, Full, RoomToReturn, Returning, SpilledOver, "
                                         "Standby, Preparing, or why the class is skipped.")
    message: str = Field("", description="Details.")
    since: str | None = Field(None, description="When this reason began (RFC 3339).")


class InferenceServiceStatus(Model):
    """The observed state of an InferenceService."""

    observed_generation: int | None = Field(None, description="metadata.generation last acted on.")
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Progressing and Degraded, with reasons.")
    replicas: int | None = Field(None, description="Replicas the operator asks for.")
    ready_replicas: int | None = Field(None, description="Replicas that are ready to serve.")
    nodes_per_replica: int | None = Field(
        None, description="Nodes each replica of the preferred class spans: 1, or more for a model bigger than a node "
                          "(each replica a LeaderWorkerSet group of that many pods, scaled and replaced whole).")
    selector: str | None = Field(None, description="Label selector of the serving pods (for the scale subresource).")
    gpu_class: str | None = Field(None, description="The preferred GPUClass in use: class, the first fallbackClass that exists, or the planner's choice for class auto.")
    endpoints: Endpoints | None = Field(None, description="In-cluster URLs.")
    metrics: LiveMetrics | None = Field(None, description="Live figures from Triton.")
    autoscaling: AutoscalingStatus | None = Field(None, description="Autoscaler state.")
    preparation: list[PreparationStatus] | None = Field(
        None, description="TensorRT-LLM: the model's preparation (downloaded and quantized once, cached).")
    placement: list[ClassPlacement] | None = Field(
        None, description="Replicas per GPU class (the preferred class first), with spill-over reasons.")
    replicas_by_class: str | None = Field(
        None, description="Ready/desired replicas per GPU class in use, e.g. 'h100:1/1,h200:2/2'.")
