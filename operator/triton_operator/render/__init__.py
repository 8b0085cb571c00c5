"""Rendering (pure): (InferenceService, GPU classes, settings) -> the manifests to apply.

No I/O and no clock: the reconcile loop and `triton-operator render` call the same function, so
what a GitOps reviewer sees offline is what the operator applies.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping

import jinja2
import yaml

from .. import planning
from ..planning import choice
from ..api import API_VERSION, GPUClass, GPUClassSpec, InferenceService
from ..labels import LABEL_GPU_CLASS, LABEL_SERVICE, MANAGED_BY, selector_labels
from ..quantity import within_limits
from ..settings import Settings
from . import llm, runtime
from .runtime import NO_RETRY_EXIT_CODES, PROGRAM, TRITON_UID

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
MODEL_ROOT = "/models"
PVC_ROOT = llm.PVC_ROOT  # runtime/ finds pvc://CLAIM/PATH at PVC_ROOT/CLAIM/PATH
QUANTILES = "0.5:0.05,0.9:0.01,0.95:0.005,0.99:0.001"
DEFAULT_REQUESTS = {"cpu": "2", "memory": "8Gi"}
__all__ = ["NO_RETRY_EXIT_CODES", "TRITON_UID", "PROGRAM"]

_env = jinja2.Environment(
    loader=jinja2.PackageLoader("triton_operator.render", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
    # The templates ship with the package and never change while it runs: no stat of the file on
    # every get_template (a sixth of a reconcile's CPU in a bulk, profiled with py-spy).
    auto_reload=False,
)
# libyaml's loader parses a rendered manifest ~20x faster than the pure-Python one; rendering runs
# on every reconcile that cannot be skipped, so this is most of its cost.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load(text: str) -> dict[str, Any]:
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 (a safe loader)


# JSON is YAML: every value goes through tojson, so no value can break the document's structure.
_env.policies["json.dumps_kwargs"] = {"sort_keys": False}
# ...nearly: JSON writes a character beyond U+FFFF (an emoji) as a UTF-16 surrogate pair, which a
# YAML parser reads as two lone surrogates (libyaml refuses them), and the API would get a mangled
# string. YAML's own 8-digit escape says the character in one piece; a lone surrogate becomes
# U+FFFD, as Go's JSON decoder makes it. (An escaped backslash before \u is left alone.)
_SURROGATES = re.compile(r"(?<!\\)((?:\\\\)*)\\u(d[89ab][0-9a-f]{2})(?:\\u(d[c-f][0-9a-f]{2}))?|"
                         r"(?<!\\)((?:\\\\)*)\\u(d[c-f][0-9a-f]{2})")


def _json_for_yaml(value: Any, **kwargs: Any) -> str:
    def whole(m: re.Match[str]) -> str:
        if m.group(2) and m.group(3):
            high, low = int(m.group(2), 16), int(m.group(3), 16)
            return f"{m.group(1)}\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08x}"
        return f"{m.group(1) or m.group(4) or ''}\\ufffd"
    return _SURROGATES.sub(whole, json.dumps(value, **kwargs))


_env.policies["json.dumps_function"] = _json_for_yaml


class RenderError(Exception):
    """The spec cannot be rendered; reason is CamelCase, message tells the user what to do."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Rendered:
    gpu_class: str                                  # the preferred class
    manifests: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    deployments: dict[str, str] = field(default_factory=dict)  # GPU class -> its Deployment's name

    def by_kind(self, kind: str) -> dict[str, Any]:
        return next(m for m in self.manifests if m["kind"] == kind)


def model_name(isvc: InferenceService) -> str:
    """The model Triton serves and reports metrics for (the composing model for TRT-LLM)."""
    m = isvc.spec.model
    if m.name:
        return m.name
    return llm.LLM_MODEL if m.format == "tensorrt-llm" else isvc.name


def endpoints(name: str, namespace: str, settings: Settings, openai: bool = False) -> dict[str, str]:
    host = f"{name}.{namespace}.svc.{settings.cluster_domain}"
    out = {
        "http": f"http://{host}:{HTTP_PORT}",
        "grpc": f"grpc://{host}:{GRPC_PORT}",
        "metrics": f"http://{host}:{METRICS_PORT}/metrics",
    }
    if openai and settings.gateway_url:
        out["openai"] = settings.gateway_url.rstrip("/") + "/v1"
    return out


def _model_delivery(isvc: InferenceService, settings: Settings) -> dict[str, Any]:
    """How the model reaches Triton: the repository path, an init container that prepares it,
    and the volumes both need."""
    m = isvc.spec.model
    volumes: list[dict[str, Any]] = []
    init_mounts: list[dict[str, Any]] = []
    server_mounts: list[dict[str, Any]] = []
    source_claim = m.source[len("pvc://"):].partition("/")[0] if m.scheme == "pvc" else None
    if m.format == "triton" and source_claim:
        path = m.source[len("pvc://"):].partition("/")[2]
        volumes.append({"name": "model-repository", "persistentVolumeClaim": {"claimName": source_claim, "readOnly": True}})
        server_mounts.append({"name": "model-repository", "mountPath": MODEL_ROOT, "readOnly": True})
        return {"path": f"{MODEL_ROOT}/{path}".rstrip("/"), "init": [], "volumes": volumes,
                "server_mounts": server_mounts, "secret_on_server": False}
    if m.format == "triton" and m.scheme in ("s3", "gs"):
        # Triton reads s3:// and gs:// repositories natively, with the credentials in its env.
        return {"path": m.source, "init": [], "volumes": [], "server_mounts": [], "secret_on_server": True}
    volumes.append({"name": "model-repository", "emptyDir": {}})
    init_mounts.append({"name": "model-repository", "mountPath": MODEL_ROOT})
    server_mounts.append({"name": "model-repository", "mountPath": MODEL_ROOT})
    if m.format == "tensorrt-llm":
        return llm.delivery(isvc, settings)
    # The staging container runs the runtime image as uid 1000 too: it gets a writable home
    # (huggingface_hub and the cloud clients keep caches and credentials files there).
    volumes.append({"name": "home", "emptyDir": {"sizeLimit": runtime.SERVING_HOME_SIZE}})
    init_mounts.append({"name": "home", "mountPath": runtime.SERVING_HOME})
    if source_claim:
        volumes.append({"name": "model-source", "persistentVolumeClaim": {"claimName": source_claim, "readOnly": True}})
        init_mounts.append({"name": "model-source", "mountPath": f"{PVC_ROOT}/{source_claim}", "readOnly": True})
    # Everything else is fetched (and laid out) by runtime/'s staging command.
    args = ["stage", "--source", m.source, "--format", m.format, "--model-name", model_name(isvc),
            "--repository", MODEL_ROOT]
    if m.revision:
        args += ["--revision", m.revision]
    stage = {"name": "stage-model", **llm.container(settings.runtime_image, [], args, settings),
             "env": runtime.cache_environment(runtime.SERVING_HOME), "volumeMounts": init_mounts, "gpu": False,
             "secret": True}
    return {"path": MODEL_ROOT, "init": [stage], "volumes": volumes, "server_mounts": server_mounts,
            "secret_on_server": False}


# Triton's APIs that change or reveal the server beyond one model's inference (model load/unload,
# shared-memory registration, statistics, trace and log settings) answer only requests carrying
# this header with the pod's own UID (Kubernetes expands $(VAR) in args; the variable comes from
# the downward API). Nothing the operator or the gateway does needs them, a client that reaches
# only the network cannot know the UID, and someone who may read the pod can still use them
# through a port-forward. A user who wants a fixed key sets TRITON_ADMIN_KEY in spec.server.env,
# which replaces ours.
# The pod ports a NetworkPolicy opens to inference clients: Triton's HTTP and gRPC, and "https",
# the port a TLS terminator beside Triton would name (gateway upstreamTLS); a named port the pod
# does not have matches nothing.
CLIENT_PORTS = ("http", "grpc", "https")
ADMIN_HEADER = "x-triton-operator-admin"
ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
RESTRICTED_APIS = "model-repository,shared-memory,statistics,trace,logging"
RESTRICTED_ARGS = [f"--http-restricted-api={RESTRICTED_APIS}:{ADMIN_HEADER}=$({ADMIN_KEY_ENV})",
                   f"--grpc-restricted-protocol={RESTRICTED_APIS}:{ADMIN_HEADER}=$({ADMIN_KEY_ENV})"]
ADMIN_KEY_FROM_POD = {"name": ADMIN_KEY_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}


def _server_args(isvc: InferenceService, repository: str) -> list[str]:
    """The serving container's args, program first. No `command`: the NGC images' entrypoint
    (/opt/nvidia/nvidia_entrypoint.sh: CUDA forward compatibility, driver checks) runs and then
    execs them, as in Triton server v2.54.0 deploy/k8s-onprem/templates/deployment.yaml
    (`args: [tritonserver, ...]`)."""
    # One tritonserver also for tensor parallelism: TensorRT-LLM's LLM API starts its own worker
    # per GPU (MPI) from the model's process.
    return [
        "tritonserver",
        f"--model-repository={repository}",
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        f"--metrics-port={METRICS_PORT}",
        "--strict-readiness=true",
        "--allow-metrics=true",
        "--metrics-config=summary_latencies=true",
        "--metrics-config=summary_quantiles=" + QUANTILES,
        *RESTRICTED_ARGS,
        *isvc.spec.server.args,
    ]


def placement(cls: GPUClassSpec) -> dict[str, Any]:
    """Node selector, affinity and tolerations that put a pod on a node of the class."""
    affinity = None
    if cls.product_names:
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": cls.product_label, "operator": "In", "values": cls.product_names}]},
        ]}}}
    return {"node_selector": cls.node_selector, "affinity": affinity,
            "tolerations": [t.wire() for t in cls.tolerations]}


def labels_for(isvc: InferenceService, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "triton",
        "app.kubernetes.io/instance": isvc.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": isvc.name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_SERVICE: isvc.name,
    }


def _resources(isvc: InferenceService, cls: GPUClassSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """(GPU container resources, CPU-only init container resources)."""
    gpu = {cls.resource_name: str(isvc.spec.gpu.count)}
    user_res = isvc.spec.server.resources
    resources = {
        # Requests so the scheduler reserves host CPU and memory for the server; no default limits:
        # a model's host-memory peak while loading is unknown here, and a wrong limit OOM-kills it.
        "requests": {**within_limits(DEFAULT_REQUESTS, user_res.limits if user_res else None),
                     **((user_res.requests if user_res else None) or {}), **gpu},
        "limits": {**((user_res.limits if user_res else None) or {}), **gpu},
    }
    # The scheduler reserves max(init, app) per resource, so the same requests cost nothing extra.
    return resources, {"requests": {k: v for k, v in resources["requests"].items() if k not in gpu}}


def preparation_jobs(isvc: InferenceService, classes: Mapping[str, GPUClass], settings: Settings) -> list[dict[str, Any]]:
    """The Job that prepares a tensorrt-llm service's model (empty for other formats, and while
    no GPU class can run it)."""
    if isvc.spec.model.format != "tensorrt-llm":
        return []
    usable = choice.candidates(isvc.spec, classes).usable()
    if not usable:
        return []
    first = usable[0]
    isvc_for = with_count(isvc, first.count)
    return [llm.preparation_job(isvc_for, classes, [o.gpu_class for o in usable], settings,
                                labels_for(isvc, "model-prepare"), _owner(isvc), placement,
                                lambda name, ctx: _load(_env.get_template(name).render(**ctx)))]


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


SPILL_INFIX = "-spill-"


def deployment_name(isvc_name: str, gpu_class: str, preferred: str) -> str:
    """The preferred class keeps the service's own name (so an upgrade restarts nothing); a
    spill-over class gets `<name>-spill-<class>`, stable for as long as it is used."""
    return isvc_name if gpu_class == preferred else f"{isvc_name}{SPILL_INFIX}{gpu_class}"


def with_count(isvc: InferenceService, count: int) -> InferenceService:
    """The service as if gpu.count were `count` (the planner's count for class auto, per class)."""
    if isvc.spec.gpu.count == count:
        return isvc
    gpu = isvc.spec.gpu.model_copy(update={"count": count})
    return isvc.model_copy(update={"spec": isvc.spec.model_copy(update={"gpu": gpu})})


def render(isvc: InferenceService, classes: Mapping[str, GPUClass], settings: Settings,
           replicas: int | None = None, engines_ready: Collection[str] | None = None,
           jobs: list[dict[str, Any]] | None = None, placement: Mapping[str, int] | None = None) -> Rendered:
    """Manifests for one InferenceService. `replicas` overrides the count from desired_replicas.
    `engines_ready` names the GPU classes that may serve a tensorrt-llm model now (all of them once
    its preparation is done); serving pods of the others are held at 0 replicas. None (offline)
    renders the steady state. `jobs` are the preparation_jobs() a caller already computed (to learn
    their state), so they are not rendered twice.
    `placement` maps GPU classes to replicas (spill-over): one Deployment per class in it, the
    preferred class always; None puts every replica on the preferred class."""
    cands = choice.candidates(isvc.spec, classes)
    if cands.error is not None or cands.preferred is None:
        problem = cands.error or planning.Problem("GPUClassNotFound", "no GPU class")
        raise RenderError(problem.reason, problem.message)
    preferred = cands.preferred.gpu_class
    count = desired_replicas(isvc) if replicas is None else replicas
    wanted = dict(placement) if placement is not None else {preferred: count}
    wanted.setdefault(preferred, 0)
    notes = list(cands.notes)
    deployments: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for option in cands.usable():
        if option.gpu_class not in wanted:
            continue
        name = deployment_name(isvc.name, option.gpu_class, preferred)
        names[option.gpu_class] = name
        deployments.append(_deployment(with_count(isvc, option.count), option.gpu_class,
                                       classes[option.gpu_class].spec, settings, wanted[option.gpu_class], name,
                                       spill=option.gpu_class != preferred, engines_ready=engines_ready))
    notes += [f"placement names GPU class {c}, which this service cannot use; ignored" for c in wanted if c not in names]
    labels = labels_for(isvc, "server")
    context = {"name": isvc.name, "namespace": isvc.namespace, "labels": labels,
               "selector": selector_labels(isvc.name), "owner": _owner(isvc),
               "ports": {"http": HTTP_PORT, "grpc": GRPC_PORT, "metrics": METRICS_PORT}}
    # One Service and one PodDisruptionBudget (and NetworkPolicy) select the pods of every class.
    shared = [_load(_env.get_template(t).render(**context)) for t in ("service.yaml.j2", "pdb.yaml.j2")]
    policy = settings.network_policy
    if policy.enabled:
        ingress = [{"from": peers, "ports": [{"port": port, "protocol": "TCP"} for port in ports]}
                   for peers, ports in ((policy.clients, CLIENT_PORTS), (policy.metrics, ("metrics",))) if peers]
        shared.append(_load(_env.get_template("networkpolicy.yaml.j2").render(**context, ingress=ingress)))
    return Rendered(gpu_class=preferred, manifests=deployments + shared + (
        preparation_jobs(isvc, classes, settings) if jobs is None else jobs), notes=notes, deployments=names)


def _deployment(isvc: InferenceService, class_name: str, cls: GPUClassSpec, settings: Settings, count: int,
                name: str, spill: bool, engines_ready: Collection[str] | None) -> dict[str, Any]:
    spec = isvc.spec
    delivery = _model_delivery(isvc, settings)
    is_llm = spec.model.format == "tensorrt-llm"
    image = spec.server.image or (settings.llm_image if is_llm else settings.triton_image)
    if is_llm and spec.server.image:
        # The doctor checks the TensorRT-LLM version of the image that serves.
        delivery["init"] = [{**i, "image": image} if i["name"] == "doctor" else i for i in delivery["init"]]
    resources, init_resources = _resources(isvc, cls)
    # An init container with the pod's GPUs (the doctor) gets the server's resources: the scheduler
    # reserves max(init, app) per resource, and the kubelet hands its GPUs on to the server.
    # Only the container that fetches gets the credentials Secret.
    init_containers = [{**i, "resources": resources if i.pop("gpu") else init_resources} for i in delivery["init"]]
    max_surge = spec.rollout.max_surge
    if max_surge is None:
        max_surge = 1 if cls.spare_gpus else 0
    max_unavailable = spec.rollout.max_unavailable
    if max_surge == 0 and max_unavailable == 0:
        max_unavailable = 1
    if is_llm and engines_ready is not None and class_name not in engines_ready:
        count = 0  # held back until the model is prepared
    labels = labels_for(isvc, "server")
    selector = selector_labels(isvc.name)
    if spill:
        # The preferred class's Deployment keeps the selector it always had (immutable; an upgrade
        # must not replace it), and it also matches these pods: harmless, as controllers adopt
        # only pods and ReplicaSets no other controller owns (ControllerRef; kubernetes
        # pkg/controller/controller_ref_manager.go). This Deployment selects its own class only.
        selector = {**selector, LABEL_GPU_CLASS: class_name}
        labels = {**labels, LABEL_GPU_CLASS: class_name}
    context = {
        "name": name,
        "namespace": isvc.namespace,
        "labels": labels,
        "pod_labels": {**spec.pod_labels, **labels_for(isvc, "server"), LABEL_GPU_CLASS: class_name},
        "pod_annotations": {
            **spec.pod_annotations,
            "prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
            "prometheus.io/path": "/metrics",
            "serving.triton-operator.io/model": model_name(isvc),
        },
        "selector": selector,
        "owner": _owner(isvc),
        "replicas": count,
        "max_surge": max_surge,
        "max_unavailable": max_unavailable,
        "image": image,
        "image_pull_policy": spec.server.image_pull_policy,
        "args": _server_args(isvc, delivery["path"]),
        "env": runtime.merge_env([*delivery.get("server_env", []), ADMIN_KEY_FROM_POD],
                                 [e.wire() for e in spec.server.env]),
        "resources": resources,
        "init_containers": init_containers,
        "image_pull_secrets": llm.pull_secrets(isvc, settings),
        "volumes": delivery["volumes"],
        "server_mounts": delivery["server_mounts"],
        "secret_on_server": delivery["secret_on_server"],
        "service_account_name": spec.service_account_name,
        "credentials_secret": spec.model.credentials_secret,
        "shm_size": spec.server.shm_size,
        "startup_failure_threshold": -(-spec.server.startup_timeout_seconds // 10),
        "uid": TRITON_UID,
        "ports": {"http": HTTP_PORT, "grpc": GRPC_PORT, "metrics": METRICS_PORT},
        **placement(cls),
    }
    return _load(_env.get_template("deployment.yaml.j2").render(**context))


def dump(manifests: list[dict[str, Any]]) -> str:
    """Manifests as one YAML stream, keys in the order rendered."""
    return "".join("---\n" + yaml.safe_dump(m, sort_keys=False) for m in manifests)
