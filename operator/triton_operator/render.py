"""Rendering (pure): (InferenceService, GPU classes, settings) -> the manifests to apply.

No I/O and no clock: the reconcile loop and `triton-operator render` call the same function, so
what a GitOps reviewer sees offline is what the operator applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import jinja2
import yaml

from . import planning
from .api import API_VERSION, GPUClass, InferenceService
from .settings import Settings

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
MODEL_ROOT = "/models"
LABEL_SERVICE = "serving.triton-operator.io/inferenceservice"
LABEL_GPU_CLASS = "serving.triton-operator.io/gpu-class"
MANAGED_BY = "triton-operator"
DEFAULT_REQUESTS = {"cpu": "2", "memory": "8Gi"}
# Triton's NGC images run as the unprivileged user triton-server (uid 1000).
TRITON_UID = 1000

_env = jinja2.Environment(
    loader=jinja2.PackageLoader("triton_operator", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
)
# JSON is YAML: every value goes through tojson, so no value can break the document's structure.
_env.policies["json.dumps_kwargs"] = {"sort_keys": False}


class RenderError(Exception):
    """The spec cannot be rendered; reason is CamelCase, message tells the user what to do."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Rendered:
    gpu_class: str
    manifests: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def by_kind(self, kind: str) -> dict[str, Any]:
        return next(m for m in self.manifests if m["kind"] == kind)


def resolve_gpu_class(isvc: InferenceService, classes: Mapping[str, GPUClass]) -> tuple[str, GPUClass, list[str]]:
    """The first of class + fallbackClasses that exists, and notes on the ones skipped."""
    missing: list[str] = []
    for name in isvc.spec.gpu.candidates():
        if name in classes:
            notes = [f"GPUClass {m} does not exist; using fallback {name}" for m in missing[:1]]
            return name, classes[name], notes
        missing.append(name)
    known = ", ".join(sorted(classes)) or "none"
    wanted = " or ".join(missing)
    raise RenderError(
        "GPUClassNotFound",
        f"GPUClass {wanted} does not exist (existing classes: {known}); create it or change spec.gpu.class.")


def selector_labels(name: str) -> dict[str, str]:
    return {LABEL_SERVICE: name, "app.kubernetes.io/component": "server"}


def model_name(isvc: InferenceService) -> str:
    """The model Triton serves and reports metrics for (the composing model for TRT-LLM)."""
    m = isvc.spec.model
    if m.name:
        return m.name
    return "tensorrt_llm" if m.format == "tensorrt-llm" else isvc.name


def endpoints(name: str, namespace: str, settings: Settings) -> dict[str, str]:
    host = f"{name}.{namespace}.svc.{settings.cluster_domain}"
    return {
        "http": f"http://{host}:{HTTP_PORT}",
        "grpc": f"grpc://{host}:{GRPC_PORT}",
        "metrics": f"http://{host}:{METRICS_PORT}/metrics",
    }


def _model_repository(isvc: InferenceService) -> dict[str, Any]:
    """How the model reaches Triton: a volume, a cloud URL Triton reads itself, or a staging step."""
    m = isvc.spec.model
    if m.format == "triton" and m.scheme == "pvc":
        claim, _, path = m.source[len("pvc://"):].partition("/")
        return {"kind": "pvc", "claim": claim, "path": f"{MODEL_ROOT}/{path}".rstrip("/")}
    if m.format == "triton" and m.scheme in ("s3", "gs"):
        # Triton reads s3:// and gs:// repositories natively.
        return {"kind": "remote", "path": m.source}
    # Everything else is fetched (and converted if needed) by runtime/'s staging command.
    args = ["stage", "--source", m.source, "--format", m.format, "--precision", m.precision,
            "--model-name", model_name(isvc), "--repository", MODEL_ROOT,
            "--tensor-parallelism", str(isvc.spec.gpu.count)]
    if m.revision:
        args += ["--revision", m.revision]
    return {"kind": "staged", "path": MODEL_ROOT, "stage_args": args}


def _tritonserver_args(isvc: InferenceService, repository: str) -> list[str]:
    return [
        f"--model-repository={repository}",
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        f"--metrics-port={METRICS_PORT}",
        "--strict-readiness=true",
        "--allow-metrics=true",
        "--metrics-config=summary_latencies=true",
        "--metrics-config=summary_quantiles=0.5:0.05,0.9:0.01,0.95:0.005,0.99:0.001",
        *isvc.spec.server.args,
    ]


def _owner(isvc: InferenceService) -> dict[str, Any] | None:
    """The controller reference; None offline, where the object has no uid yet."""
    if not isvc.metadata.get("uid"):
        return None
    return {
        "apiVersion": API_VERSION, "kind": "InferenceService", "name": isvc.name,
        "uid": isvc.metadata["uid"], "controller": True, "blockOwnerDeletion": True,
    }


def desired_replicas(isvc: InferenceService, current: int | None = None) -> int:
    """spec.replicas; with autoscaling, the autoscaler's last decision, else the running count
    (else minReplicas), clamped to [minReplicas, maxReplicas]."""
    a = isvc.spec.autoscaling
    if a is None:
        return isvc.spec.replicas
    decided = isvc.status.autoscaling.desired_replicas if isvc.status and isvc.status.autoscaling else None
    base = decided if decided is not None else (current if current is not None else a.min_replicas)
    return max(a.min_replicas, min(a.max_replicas, base))


def render(isvc: InferenceService, classes: Mapping[str, GPUClass], settings: Settings,
           replicas: int | None = None) -> Rendered:
    """Manifests for one InferenceService. `replicas` overrides the count from desired_replicas."""
    class_name, gpu_class, notes = resolve_gpu_class(isvc, classes)
    spec = isvc.spec
    found = planning.problems(spec.model, class_name, gpu_class.spec, spec.gpu.count)
    if found:
        raise RenderError(found[0].reason, " ".join(p.message for p in found))

    cls = gpu_class.spec
    default_image = settings.triton_trtllm_image if spec.model.format == "tensorrt-llm" else settings.triton_image
    image = spec.server.image or default_image
    labels = {
        "app.kubernetes.io/name": "triton",
        "app.kubernetes.io/instance": isvc.name,
        "app.kubernetes.io/component": "server",
        "app.kubernetes.io/part-of": isvc.name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_SERVICE: isvc.name,
    }
    repo = _model_repository(isvc)
    gpu = {cls.resource_name: str(spec.gpu.count)}
    user_res = spec.server.resources
    resources = {
        # Requests so the scheduler reserves host CPU and memory for the server; no default limits:
        # a model's host-memory peak while loading is unknown here, and a wrong limit OOM-kills it.
        "requests": {**DEFAULT_REQUESTS, **((user_res.requests if user_res else None) or {}), **gpu},
        "limits": {**((user_res.limits if user_res else None) or {}), **gpu},
    }
    # The scheduler reserves max(init, app) per resource, so the same requests cost nothing extra.
    stage_resources = {"requests": {k: v for k, v in resources["requests"].items() if k not in gpu}}
    max_surge = spec.rollout.max_surge
    if max_surge is None:
        max_surge = 1 if cls.spare_gpus else 0
    max_unavailable = spec.rollout.max_unavailable
    if max_surge == 0 and max_unavailable == 0:
        max_unavailable = 1
    affinity = None
    if cls.product_names:
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": cls.product_label, "operator": "In", "values": cls.product_names}]},
        ]}}}
    context = {
        "name": isvc.name,
        "namespace": isvc.namespace,
        "labels": labels,
        "pod_labels": {**spec.pod_labels, **labels, LABEL_GPU_CLASS: class_name},
        "pod_annotations": {
            **spec.pod_annotations,
            "prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
            "prometheus.io/path": "/metrics",
            "serving.triton-operator.io/model": model_name(isvc),
        },
        "selector": selector_labels(isvc.name),
        "owner": _owner(isvc),
        "replicas": desired_replicas(isvc) if replicas is None else replicas,
        "max_surge": max_surge,
        "max_unavailable": max_unavailable,
        "image": image,
        "image_pull_policy": spec.server.image_pull_policy,
        "runtime_image": settings.runtime_image,
        "args": _tritonserver_args(isvc, repo["path"]),
        "env": [e.wire() for e in spec.server.env],
        "resources": resources,
        "stage_resources": stage_resources,
        "node_selector": cls.node_selector,
        "affinity": affinity,
        "tolerations": [t.wire() for t in cls.tolerations],
        "service_account_name": spec.service_account_name,
        "credentials_secret": spec.model.credentials_secret,
        "repo": repo,
        "shm_size": spec.server.shm_size,
        "startup_failure_threshold": -(-spec.server.startup_timeout_seconds // 10),
        "uid": TRITON_UID,
        "ports": {"http": HTTP_PORT, "grpc": GRPC_PORT, "metrics": METRICS_PORT},
    }
    manifests = [
        yaml.safe_load(_env.get_template(t).render(**context))
        for t in ("deployment.yaml.j2", "service.yaml.j2", "pdb.yaml.j2")
    ]
    return Rendered(gpu_class=class_name, manifests=manifests, notes=notes)


def dump(manifests: list[dict[str, Any]]) -> str:
    """Manifests as one YAML stream, keys in the order rendered."""
    return "".join("---\n" + yaml.safe_dump(m, sort_keys=False) for m in manifests)
