"""The Triton server of a serving pod: its ports, its arguments (with the admin APIs restricted),
and how the model reaches it (a PVC, Triton's own s3/gs reader, or runtime/'s staging or LLM
preparation in init containers)."""

from __future__ import annotations

from typing import Any

from ..api import InferenceService
from ..settings import Settings
from . import llm, runtime
from .names import model_name

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
MODEL_ROOT = "/models"
PVC_ROOT = llm.PVC_ROOT  # runtime/ finds pvc://CLAIM/PATH at PVC_ROOT/CLAIM/PATH
QUANTILES = "0.5:0.05,0.9:0.01,0.95:0.005,0.99:0.001"


def model_delivery(isvc: InferenceService, settings: Settings, pipeline: int = 1) -> dict[str, Any]:
    """How the model reaches Triton: the repository path, an init container that prepares it,
    and the volumes both need. `pipeline`: the pipeline stages of a replica across nodes (its
    tensor parallelism is gpu.count, the GPUs of each)."""
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
        return llm.delivery(isvc, settings, pipeline)
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


MPI_LAUNCHER = ["mpirun", "--allow-run-as-root", "-n", "1"]

# A replica that goes (scaled down, replaced in a rollout, evicted) drains: on SIGTERM Triton is no
# longer ready (its endpoint leaves the EndpointSlice, so the gateway sends it nothing new), refuses
# new requests, and exits once the requests in flight have finished, or after this many seconds
# (Triton's own default is 30). An LLM answer streams for as long as it generates, minutes for a
# long one: cut at 30 s it would end mid-sentence. Other models answer within seconds. The pod's
# grace period is a little longer, so the kubelet's SIGKILL never comes first.
DRAIN_S = {"tensorrt-llm": 300}
DEFAULT_DRAIN_S = 30
GRACE_MARGIN_S = 15
MIN_GRACE_S = 60


def drain_seconds(isvc: InferenceService) -> int:
    """Longest Triton waits on SIGTERM for the requests in flight."""
    return DRAIN_S.get(isvc.spec.model.format, DEFAULT_DRAIN_S)


def termination_grace_seconds(isvc: InferenceService) -> int:
    """The pod's terminationGracePeriodSeconds: the drain and a margin."""
    return max(MIN_GRACE_S, drain_seconds(isvc) + GRACE_MARGIN_S)


def server_args(isvc: InferenceService, repository: str) -> list[str]:
    """The serving container's args, program first. No `command`: the NGC images' entrypoint
    (/opt/nvidia/nvidia_entrypoint.sh: CUDA forward compatibility, driver checks) runs and then
    execs them, as in Triton server v2.54.0 deploy/k8s-onprem/templates/deployment.yaml
    (`args: [tritonserver, ...]`)."""
    # One tritonserver also for tensor parallelism: TensorRT-LLM's LLM API starts its own worker
    # per GPU from the model's process with MPI spawn, which needs the server to run under an MPI
    # launcher: upstream's launcher (TensorRT-LLM triton_backend/scripts/launch_triton_server.py)
    # runs `mpirun --allow-run-as-root -n 1 tritonserver ...` unless told --no-mpi, which it
    # allows for a world of one only. A single GPU needs no MPI.
    launcher = MPI_LAUNCHER if isvc.spec.model.format == "tensorrt-llm" and isvc.spec.gpu.count > 1 else []
    return [
        *launcher,
        "tritonserver",
        f"--model-repository={repository}",
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        f"--metrics-port={METRICS_PORT}",
        "--strict-readiness=true",
        "--allow-metrics=true",
        "--metrics-config=summary_latencies=true",
        "--metrics-config=summary_quantiles=" + QUANTILES,
        f"--exit-timeout-secs={drain_seconds(isvc)}",
        *RESTRICTED_ARGS,
        *isvc.spec.server.args,
    ]
