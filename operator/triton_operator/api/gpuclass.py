"""GPUClass: the cluster-scoped catalog that maps a class name (h100, l4, ...) to the nodes its
pods land on and the figures the planner needs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from .base import API_VERSION, Model
from .syntax import (DNS_LABEL, EXTENDED_RESOURCE_NAME, INT32_MAX, LABEL_VALUE, LabelKey, LabelValue, QualifiedName,
                     cel, checked_metadata, labels_field)

# gpu.class auto asks the planner to choose; no GPUClass may take that name.
AUTO_CLASS = "auto"
AUTO_RESERVED_MESSAGE = "metadata.name auto is reserved: gpu.class auto asks the planner to choose a class"

EXTENDED_RESOURCE_MESSAGE = ("an extended resource name does not start with requests. and its prefix (before /) has at "
                             "most 244 characters: Kubernetes refuses containers that request it otherwise")


class Toleration(Model):
    """A toleration added to serving pods of this class, as in a Pod spec."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        # The rules Kubernetes applies to a Pod's tolerations (pkg/apis/core/validation, ValidateTolerations).
        cel("(has(self.key) && self.key != '') || self.operator == 'Exists'",
            "operator must be Exists when key is empty (which tolerates every taint)", "operator"),
        cel("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "effect must be NoExecute when tolerationSeconds is set", "effect"),
        cel("self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "value must be empty when operator is Exists", "value"),
    ]})

    key: QualifiedName | None = Field(
        None, description="Taint key to tolerate; empty with operator Exists matches all keys.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: str | None = Field(
        None, max_length=63, pattern=LABEL_VALUE, description="Taint value to match when operator is Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all effects.")
    toleration_seconds: int | None = Field(
        None, ge=0, le=INT32_MAX, description="For NoExecute: how long the pod stays bound after the taint appears.")

    @model_validator(mode="after")
    def _as_kubernetes_checks(self) -> Toleration:
        if not self.key and self.operator != "Exists":
            raise ValueError("operator must be Exists when key is empty (which tolerates every taint)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("effect must be NoExecute when tolerationSeconds is set")
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty when operator is Exists")
        return self


class GPUClassSpec(Model):
    """What a class of GPUs is and how pods land on it."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("(has(self.productNames) && size(self.productNames) > 0) || (has(self.nodeSelector) && size(self.nodeSelector) > 0)",
            "set productNames or nodeSelector, or pods of this class could land on any node"),
    ]})

    display_name: str | None = Field(None, max_length=256, description="Human-readable name, e.g. 'NVIDIA H100 SXM 80GB'.")
    resource_name: str = Field(
        "nvidia.com/gpu", max_length=253, pattern=EXTENDED_RESOURCE_NAME,
        json_schema_extra={"x-kubernetes-validations": [
            cel("!self.contains('kubernetes.io')", "an extended resource is not in a kubernetes.io domain"),
            # Kubernetes' IsExtendedResourceName: "requests." + the name must be a qualified name too.
            cel("!self.startsWith('requests.') && !self.matches('^[^/]{245,}/')", EXTENDED_RESOURCE_MESSAGE)]},
        description="Extended resource requested per GPU, e.g. nvidia.com/gpu or a MIG resource such as nvidia.com/mig-1g.10gb.")
    product_label: QualifiedName = Field(
        "nvidia.com/gpu.product",
        description="Node label that names the GPU product (set by GPU Feature Discovery).")
    product_names: list[LabelValue] = Field(
        default_factory=list, max_length=32,
        description="Accepted values of productLabel; a node matches if its value is any of them. Values vary by form factor (SXM, PCIe, NVL), so list them all.")
    node_selector: dict[LabelKey, LabelValue] = labels_field(
        "Extra node labels every serving pod of this class requires.", max_items=32)
    tolerations: list[Toleration] = Field(
        default_factory=lambda: [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
        max_length=16,
        description="Tolerations for the taints GPU nodes of this class carry. Defaults to tolerating nvidia.com/gpu:NoSchedule.")
    memory_gib: float = Field(
        ..., alias="memoryGiB", ge=1, le=65536, description="GPU memory per device in GiB, used to plan whether a model fits.")
    memory_bandwidth_tbps: float = Field(
        ..., alias="memoryBandwidthTBps", ge=0.01, le=1000, description="Memory bandwidth per device in TB/s; bounds LLM decode speed.")
    compute_capability: str = Field(
        ..., max_length=8, pattern=r"^[0-9]+[.][0-9]+$", description="CUDA compute capability, e.g. '9.0'. TensorRT-LLM engines are built per capability; FP8 needs 8.9 or higher.")
    gpus_per_node: int = Field(8, ge=1, le=64, description="GPUs on one node of this class; bounds tensor parallelism on one node, and a replica of more GPUs takes whole nodes.")
    group_topology_key: QualifiedName | None = Field(
        None, description="Node label whose value names a network domain (a rack, an NVLink domain such as "
                          "nvidia.com/gpu.clique, a zone): a replica that spans nodes keeps all its pods within one "
                          "domain, one group a domain (LeaderWorkerSet's exclusive topology). Unset: any nodes of the class.")
    price_per_hour: float | None = Field(None, ge=0, le=1_000_000, description="Price of one GPU per hour in your currency, for cost estimates.")
    spare_gpus: bool = Field(
        False, alias="spareGPUs", description="Whether the cluster keeps spare GPUs of this class. When false, rolling updates replace pods one at a time without surging (maxSurge 0), so a rollout never waits for GPUs that do not exist.")

    @field_validator("resource_name")
    @classmethod
    def _extended(cls, v: str) -> str:
        if "kubernetes.io" in v:
            raise ValueError("an extended resource is not in a kubernetes.io domain")
        if v.startswith("requests.") or len(v.partition("/")[0]) > 244:
            raise ValueError(EXTENDED_RESOURCE_MESSAGE)
        return v

    @model_validator(mode="after")
    def _somewhere(self) -> GPUClassSpec:
        if not self.product_names and not self.node_selector:
            raise ValueError("set productNames or nodeSelector, or pods of this class could land on any node")
        return self

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
    def _named(cls, v: dict[str, Any]) -> dict[str, Any]:
        # gpu.class refers to it, and that is a DNS label; auto is gpu.class's own word.
        v = checked_metadata(v, DNS_LABEL, 63, "a DNS label (lowercase letters, digits, '-') of at most 63 characters")
        if v["name"] == AUTO_CLASS:
            raise ValueError(AUTO_RESERVED_MESSAGE)
        return v
