"""Rendering (pure): (InferenceService, GPU classes, settings) -> the manifests to apply.

No I/O and no clock: the reconcile loop and `triton-operator render` call the same function, so
what a GitOps reviewer sees offline is what the operator applies.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping

import jinja2
import yaml

from .. import planning
from ..planning import choice
from ..api import API_VERSION, EngineSpec, GPUClass, GPUClassSpec, InferenceService
from ..labels import LABEL_GPU_CLASS, LABEL_SERVICE, MANAGED_BY, selector_labels
from ..quantity import within_limits
from ..settings import Settings
from . import runtime
from .runtime import PROGRAM, SCRATCH_ROOT

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
MODEL_ROOT = "/models"
ENGINE_ROOT = "/engines"
PVC_ROOT = "/mnt/pvc"  # runtime/ finds pvc://CLAIM/PATH at PVC_ROOT/CLAIM/PATH
# triton-runtime's exit codes that retrying cannot fix: 2 a spec it cannot build, 3 a pod the
# doctor found unfit (runtime/triton_runtime/cli.py EXIT_SPEC, doctor.py PROBLEMS_EXIT).
NO_RETRY_EXIT_CODES = [2, 3]
QUANTILES = "0.5:0.05,0.9:0.01,0.95:0.005,0.99:0.001"
DEFAULT_REQUESTS = {"cpu": "2", "memory": "8Gi"}
# Triton's NGC images run as the unprivileged user triton-server (uid 1000).
TRITON_UID = 1000

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
    return "tensorrt_llm" if m.format == "tensorrt-llm" else isvc.name


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


def engine_args(isvc: InferenceService, cls: GPUClassSpec) -> list[str]:
    """The flags that identify an engine, shared by build-engine and make-repository so that both
    compute the same cache key inside the runtime image."""
    m, e = isvc.spec.model, isvc.spec.engine or EngineSpec()
    args = ["--source", m.source, "--precision", m.precision, "--compute-capability", cls.compute_capability,
            "--tensor-parallelism", str(isvc.spec.gpu.count), "--max-batch-size", str(e.max_batch_size),
            "--max-input-len", str(e.max_input_len), "--max-seq-len", str(e.max_seq_len),
            "--max-num-tokens", str(e.max_num_tokens), "--cache", ENGINE_ROOT]
    if e.calibration_dataset:
        args += ["--calibration-dataset", e.calibration_dataset]
    return args + (["--revision", m.revision] if m.revision else [])


def engine_claim(isvc: InferenceService, settings: Settings) -> str:
    return (isvc.spec.engine and isvc.spec.engine.cache_claim) or settings.engine_cache_claim


def _model_delivery(isvc: InferenceService, cls: GPUClassSpec, settings: Settings) -> dict[str, Any]:
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
        return {"path": f"{MODEL_ROOT}/{path}".rstrip("/"), "init": None, "volumes": volumes,
                "server_mounts": server_mounts, "secret_on_server": False}
    if m.format == "triton" and m.scheme in ("s3", "gs"):
        # Triton reads s3:// and gs:// repositories natively, with the credentials in its env.
        return {"path": m.source, "init": None, "volumes": [], "server_mounts": [], "secret_on_server": True}
    volumes.append({"name": "model-repository", "emptyDir": {}})
    init_mounts.append({"name": "model-repository", "mountPath": MODEL_ROOT})
    server_mounts.append({"name": "model-repository", "mountPath": MODEL_ROOT})
    if m.format == "tensorrt-llm":
        # The engine was built by this class's build Job into the shared cache.
        volumes.append({"name": "engines", "persistentVolumeClaim": {"claimName": engine_claim(isvc, settings),
                                                                     "readOnly": True}})
        volumes.append({"name": "home", "emptyDir": {"sizeLimit": runtime.SERVING_HOME_SIZE}})
        for mounts in (init_mounts, server_mounts):
            mounts.append({"name": "engines", "mountPath": ENGINE_ROOT, "readOnly": True})
            mounts.append({"name": "home", "mountPath": runtime.SERVING_HOME})
        identity = engine_args(isvc, cls)
        args = [PROGRAM, "make-repository", *identity, "--repository", MODEL_ROOT]
        if isvc.spec.engine and isvc.spec.engine.streaming:
            args.append("--streaming")
        # The doctor runs first, with the pod's GPUs, so that a node without them, an engine of
        # another TensorRT-LLM version or an unwritable home fails in seconds with a reason.
        doctor = runtime.doctor_args("serve", identity, isvc.spec.gpu.count)
        home_env = runtime.cache_environment(runtime.SERVING_HOME)
        return {"path": MODEL_ROOT, "init": {"name": "make-repository", "args": args}, "doctor": doctor,
                "volumes": volumes, "init_mounts": init_mounts, "server_mounts": server_mounts,
                "secret_on_server": False, "init_env": home_env, "server_env": home_env}
    # The staging container runs the runtime image as uid 1000 too: it gets a writable home
    # (huggingface_hub and the cloud clients keep caches and credentials files there).
    volumes.append({"name": "home", "emptyDir": {"sizeLimit": runtime.SERVING_HOME_SIZE}})
    init_mounts.append({"name": "home", "mountPath": runtime.SERVING_HOME})
    if source_claim:
        volumes.append({"name": "model-source", "persistentVolumeClaim": {"claimName": source_claim, "readOnly": True}})
        init_mounts.append({"name": "model-source", "mountPath": f"{PVC_ROOT}/{source_claim}", "readOnly": True})
    # Everything else is fetched (and laid out) by runtime/'s staging command.
    args = [PROGRAM, "stage", "--source", m.source, "--format", m.format, "--model-name", model_name(isvc),
            "--repository", MODEL_ROOT]
    if m.revision:
        args += ["--revision", m.revision]
    return {"path": MODEL_ROOT, "init": {"name": "stage-model", "args": args}, "volumes": volumes,
            "init_mounts": init_mounts, "server_mounts": server_mounts, "secret_on_server": False,
            "init_env": runtime.cache_environment(runtime.SERVING_HOME)}


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
    if isvc.spec.model.format == "tensorrt-llm":
        # runtime/ runs one tritonserver rank per GPU under mpirun when tensor parallel.
        return [PROGRAM, "serve", "--repository", repository, "--world-size", str(isvc.spec.gpu.count),
                "--", "--metrics-config=summary_quantiles=" + QUANTILES, *RESTRICTED_ARGS, *isvc.spec.server.args]
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


def _scratch_limit(isvc: InferenceService) -> str | None:
    """The build's scratch volume size: its ephemeral-storage request (the user's, else the
    estimate, lowered to a lower limit)."""
    return runtime.build_resources(isvc)["requests"].get("ephemeral-storage")


def _build_resources(isvc: InferenceService, cls: GPUClassSpec) -> dict[str, Any]:
    """The build container's own resources (never the serving ones), plus the class's GPUs."""
    base = runtime.build_resources(isvc)
    gpu = {cls.resource_name: str(isvc.spec.gpu.count)}
    return {"requests": {**base["requests"], **gpu}, "limits": {**base["limits"], **gpu}}


def engine_jobs(isvc: InferenceService, classes: Mapping[str, GPUClass], settings: Settings) -> list[dict[str, Any]]:
    """One engine-build Job per GPU class the service may run on (class and fallbacks that exist
    and fit), so that falling back needs no build. Empty for formats other than tensorrt-llm.
    The Job's name hashes everything it does: a spec change makes a new Job, never an edit."""
    if isvc.spec.model.format != "tensorrt-llm":
        return []
    return [_engine_job(with_count(isvc, count), class_name, classes[class_name].spec, settings)
            for class_name, count in _build_targets(isvc, classes)]


def _engine_job(isvc: InferenceService, class_name: str, cls: GPUClassSpec, settings: Settings) -> dict[str, Any]:
    identity = engine_args(isvc, cls)
    scratch_limit = _scratch_limit(isvc)
    args = [PROGRAM, "build-engine", *identity, "--scratch", SCRATCH_ROOT]
    doctor = runtime.doctor_args("build", identity, isvc.spec.gpu.count, SCRATCH_ROOT, scratch_limit)
    resources = _build_resources(isvc, cls)
    digest = hashlib.sha256(json.dumps([class_name, settings.runtime_image, cls.resource_name, args, doctor,
                                        resources]).encode())
    m = isvc.spec.model
    source_claim = m.source[len("pvc://"):].partition("/")[0] if m.scheme == "pvc" else None
    calibration = isvc.spec.engine.calibration_dataset if isvc.spec.engine else None
    calibration_claim = (calibration[len("pvc://"):].partition("/")[0]
                         if calibration and calibration.startswith("pvc://") else None)
    context = {
        "name": f"{isvc.name}-{digest.hexdigest()[:10]}",
        "namespace": isvc.namespace,
        "labels": {**labels_for(isvc, "engine-build"), LABEL_GPU_CLASS: class_name},
        "owner": _owner(isvc),
        "image": settings.runtime_image,
        "args": args,
        "doctor_args": doctor,
        "env": runtime.cache_environment(runtime.BUILD_HOME),
        "resources": resources,
        "scratch_limit": scratch_limit,
        "no_retry_exit_codes": NO_RETRY_EXIT_CODES,
        "credentials_secret": m.credentials_secret,
        "engine_claim": engine_claim(isvc, settings),
        "claims": sorted({c for c in (source_claim, calibration_claim) if c}),
        "pvc_root": PVC_ROOT,
        "engine_root": ENGINE_ROOT,
        "scratch_root": SCRATCH_ROOT,
        "uid": TRITON_UID,
        **placement(cls),
    }
    return _load(_env.get_template("job.yaml.j2").render(**context))


def _build_targets(isvc: InferenceService, classes: Mapping[str, GPUClass]) -> list[tuple[str, int]]:
    """(class, GPUs per replica) to build engines for: class and every fallbackClass that exists and
    fits; for class auto, the planner's choice and, with spill, the classes it may spill to."""
    if isvc.spec.gpu.auto:
        return [(o.gpu_class, o.count) for o in choice.candidates(isvc.spec, classes).usable()]
    count = isvc.spec.gpu.count
    return [(name, count) for name in isvc.spec.gpu.candidates()
            if name in classes and not planning.problems(isvc.spec.model, name, classes[name].spec, count)]


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
    `engines_ready` names the GPU classes whose TensorRT-LLM engine is built; serving pods of a
    class without one are held at 0 replicas. None (offline) renders the steady state. `jobs` are
    the engine_jobs() a caller already computed (to learn engine states), so they are not rendered twice.
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
        engine_jobs(isvc, classes, settings) if jobs is None else jobs), notes=notes, deployments=names)


def _deployment(isvc: InferenceService, class_name: str, cls: GPUClassSpec, settings: Settings, count: int,
                name: str, spill: bool, engines_ready: Collection[str] | None) -> dict[str, Any]:
    spec = isvc.spec
    delivery = _model_delivery(isvc, cls, settings)
    llm = spec.model.format == "tensorrt-llm"
    # server.image is refused for tensorrt-llm (api.SERVER_IMAGE_MESSAGE): engine and server must
    # share the runtime image's TensorRT-LLM version.
    image = settings.runtime_image if llm else (spec.server.image or settings.triton_image)
    resources, init_resources = _resources(isvc, cls)
    init_env = delivery.get("init_env", [])
    init_containers = []
    if delivery.get("doctor"):
        # With the server's resources, GPUs included: the scheduler reserves max(init, app) per
        # resource, and the kubelet hands the init container's GPUs on to the server.
        init_containers.append({"name": "doctor", "args": delivery["doctor"], "resources": resources,
                                "env": init_env, "volumeMounts": delivery.get("init_mounts", []),
                                "secret": False})
    if delivery["init"] is not None:
        init_containers.append({**delivery["init"], "resources": init_resources, "env": init_env,
                                "volumeMounts": delivery.get("init_mounts", []),
                                "secret": not llm})  # only the container that fetches gets credentials
    max_surge = spec.rollout.max_surge
    if max_surge is None:
        max_surge = 1 if cls.spare_gpus else 0
    max_unavailable = spec.rollout.max_unavailable
    if max_surge == 0 and max_unavailable == 0:
        max_unavailable = 1
    if llm and engines_ready is not None and class_name not in engines_ready:
        count = 0  # held back until this class's engine is in the cache
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
        "init_image": settings.runtime_image,
        "init_containers": init_containers,
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
