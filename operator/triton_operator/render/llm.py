"""What a tensorrt-llm service runs (pure): a preparation Job, and serving pods on NVIDIA's stock
image with the model repository written beside it.

Serving needs no image of ours. The Triton container is `settings.llm_image`
(nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3) running plain `tritonserver`; an init
container of the operator's own image (which holds triton-runtime) writes the model repository
into an emptyDir: the `llm` model (runtime/triton_runtime/serving: a Python-backend model over
TensorRT-LLM's LLM API), its config.pbtxt and a model.yaml naming the prepared checkpoint, which
the pods mount read-only from the model cache. The doctor then runs in the stock image with the
pod's GPUs.

The model is prepared once per (source, revision, precision, TensorRT-LLM version) by a Job:
download only what the checkpoint needs, quantize with NVIDIA Model Optimizer when the precision
asks for it, publish into the shared cache (runtime/triton_runtime/prepare.py). Only a
quantization needs a GPU: that Job downloads in the operator's image (an init container: every
source scheme's client) and quantizes in the stock image on a node of the service's preferred
class; a Job that only downloads runs the operator's image on any node.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from ..api import CALIBRATED_PRECISIONS, EngineSpec, GPUClass, GPUClassSpec, InferenceService
from ..settings import Settings
from . import runtime

MODEL_CACHE_ROOT = "/models/cache"
REPOSITORY_ROOT = "/models/repository"
RUNTIME_ROOT = "/opt/triton-runtime"     # triton-runtime copied for containers of the stock image
PVC_ROOT = "/mnt/pvc"                    # runtime/ finds pvc://CLAIM/PATH at PVC_ROOT/CLAIM/PATH
LLM_MODEL = "llm"                        # runtime/triton_runtime/serving/contract.py MODEL_NAME
PYTHON_MODULE = ["python3", "-m", "triton_runtime.cli"]
RUNTIME_ENV = {"name": "PYTHONPATH", "value": RUNTIME_ROOT}


def engine(isvc: InferenceService) -> EngineSpec:
    return isvc.spec.engine or EngineSpec()


def cache_claim(isvc: InferenceService, settings: Settings) -> str:
    return engine(isvc).cache_claim or settings.model_cache_claim


def quantizes(isvc: InferenceService) -> bool:
    """Whether preparation may quantize (and so needs a GPU): the precision is one Model Optimizer
    produces. A checkpoint already quantized to it is only copied, but which one is cannot be
    known before it is downloaded."""
    return isvc.spec.model.precision in CALIBRATED_PRECISIONS


def model_args(isvc: InferenceService, settings: Settings) -> list[str]:
    """The flags that name a prepared model, shared by prepare, make-repository and doctor so that
    all of them compute the same cache key."""
    m = isvc.spec.model
    args = ["--source", m.source, "--precision", m.precision, "--trtllm-version", settings.trtllm_version,
            "--cache", MODEL_CACHE_ROOT]
    if m.revision:
        args += ["--revision", m.revision]
    calibration = engine(isvc).calibration_dataset
    if calibration and quantizes(isvc):
        args += ["--calibration-dataset", calibration]
    return args


def _claim(source: str | None) -> str | None:
    return source[len("pvc://"):].partition("/")[0] if source and source.startswith("pvc://") else None


def claim_volume(claim: str) -> str:
    """The preparation Job's volume for a PersistentVolumeClaim: "claim-" and its name, or its
    digest when that is longer than a volume name may be (a DNS label, 63 characters; a claim's
    name may have 253, and a Job with a longer volume name is refused)."""
    name = f"claim-{claim}"
    return name if len(name) <= 63 else "claim-" + hashlib.sha256(claim.encode()).hexdigest()[:16]


def pull_secrets(isvc: InferenceService, settings: Settings) -> list[dict[str, str]]:
    names = list(dict.fromkeys([*settings.image_pull_secrets, *isvc.spec.image_pull_secrets]))
    return [{"name": n} for n in names]


def container(image: str, program: list[str], args: list[str], settings: Settings) -> dict[str, Any]:
    """A container running triton-runtime: in the operator's image through its `command` (its
    entrypoint is triton-operator), in the stock image as args after NGC's entrypoint
    (nvidia_entrypoint.sh: driver checks, CUDA forward compatibility), from the copy on PYTHONPATH."""
    if image == settings.runtime_image:
        return {"image": image, "command": ["triton-runtime"], "args": args}
    return {"image": image, "args": [*program, *args]}


# -- preparation -------------------------------------------------------------------------------------

def preparation_class(isvc: InferenceService, usable: list[str]) -> str | None:
    """The class whose node quantizes (the preferred usable one), None when no GPU is needed."""
    return usable[0] if quantizes(isvc) and usable else None


def preparation_job(isvc: InferenceService, classes: Mapping[str, GPUClass], usable: list[str], settings: Settings,
                    labels: dict[str, str], owner: dict[str, Any] | None, scheduling: Any,
                    env_template: Any) -> dict[str, Any]:
    """The Job that prepares the model (one per service spec; its name hashes what it does, so a
    change makes a new Job, never an edit)."""
    gpu_class = preparation_class(isvc, usable)
    cls: GPUClassSpec | None = classes[gpu_class].spec if gpu_class else None
    image = settings.llm_image if cls is not None else settings.runtime_image
    count = isvc.spec.gpu.count
    scratch_limit = runtime.build_resources(isvc)["requests"].get("ephemeral-storage")
    resources = runtime.build_resources(isvc)
    if cls is not None:
        resources = {"requests": {**resources["requests"], cls.resource_name: str(count)},
                     "limits": {**resources["limits"], cls.resource_name: str(count)}}
    margs = model_args(isvc, settings)
    doctor = ["doctor", "--for", "prepare", *margs, "--gpus", str(count if cls else 0),
              "--scratch", runtime.SCRATCH_ROOT, "--min-driver", settings.min_driver]
    if scratch_limit:
        doctor += ["--scratch-size", scratch_limit]
    work = ["prepare", *margs, "--scratch", runtime.SCRATCH_ROOT]
    download = None
    if cls is not None:
        folder = f"{runtime.SCRATCH_ROOT}/download"
        download = container(settings.runtime_image, [], [*work, "--download-to", folder,
                                                          *(["--scratch-size", scratch_limit] if scratch_limit else [])],
                             settings)
        work = [*work, "--downloaded", folder]
    m = isvc.spec.model
    claims = sorted({c for c in (_claim(m.source), _claim(engine(isvc).calibration_dataset)) if c})
    identity = json.dumps([image, settings.runtime_image, gpu_class, work, doctor, download, resources,
                           pull_secrets(isvc, settings), isvc.spec.service_account_name])
    name = f"{isvc.name}-{hashlib.sha256(identity.encode()).hexdigest()[:10]}"  # 63 characters at most
    context = {
        "name": name, "namespace": isvc.namespace, "labels": labels, "owner": owner,
        "install": container(settings.runtime_image, [], ["install", "--into", RUNTIME_ROOT], settings),
        "doctor": container(image, PYTHON_MODULE, doctor, settings),
        "work": container(image, PYTHON_MODULE, work, settings),
        "download": download,
        # The download step's own share: no GPU, the Job's CPU and memory requests.
        "download_resources": {k: kept for k, v in resources.items()
                               if (kept := {r: q for r, q in v.items() if not cls or r != cls.resource_name})},
        "env": [*runtime.cache_environment(runtime.BUILD_HOME), RUNTIME_ENV],
        "resources": resources, "scratch_limit": scratch_limit,
        "no_retry_exit_codes": runtime.NO_RETRY_EXIT_CODES,
        "credentials_secret": m.credentials_secret, "cache_claim": cache_claim(isvc, settings),
        "claims": [{"name": c, "volume": claim_volume(c)} for c in claims],
        "pvc_root": PVC_ROOT, "cache_root": MODEL_CACHE_ROOT, "scratch_root": runtime.SCRATCH_ROOT,
        "runtime_root": RUNTIME_ROOT, "uid": runtime.TRITON_UID,
        "image_pull_secrets": pull_secrets(isvc, settings),
        "service_account_name": isvc.spec.service_account_name,
        **(scheduling(cls) if cls is not None else {"node_selector": {}, "affinity": None, "tolerations": []}),
    }
    job = env_template("prepare.yaml.j2", context)
    job["metadata"]["labels"] = {**labels, **({"serving.triton-operator.io/gpu-class": gpu_class} if gpu_class else {})}
    job["spec"]["template"]["metadata"]["labels"] = dict(job["metadata"]["labels"])
    return job


# -- serving -------------------------------------------------------------------------------------------

def delivery(isvc: InferenceService, settings: Settings, pipeline: int = 1) -> dict[str, Any]:
    """The serving pod's volumes and init containers, and the repository Triton serves
    (`pipeline` stages across nodes, each on gpu.count GPUs)."""
    e = engine(isvc)
    margs = model_args(isvc, settings)
    repo = ["make-repository", "--engine", "trtllm", *margs, "--repository", REPOSITORY_ROOT,
            "--install-into", RUNTIME_ROOT, "--tensor-parallelism", str(isvc.spec.gpu.count),
            "--max-batch-size", str(e.max_batch_size), "--max-num-tokens", str(e.max_num_tokens),
            "--max-seq-len", str(e.max_seq_len),
            "--kv-cache-free-gpu-memory-fraction", f"{e.kv_cache_free_gpu_memory_fraction:g}"]
    openai = isvc.spec.openai
    if openai and openai.default_max_tokens:
        repo += ["--default-max-tokens", str(openai.default_max_tokens)]
    doctor = ["doctor", "--for", "serve", *margs, "--gpus", str(isvc.spec.gpu.count), "--min-driver",
              settings.min_driver]
    if pipeline > 1:
        repo += ["--pipeline-parallelism", str(pipeline)]
        doctor += ["--nodes", str(pipeline)]
    home = runtime.cache_environment(runtime.SERVING_HOME)
    template_env = ([{"name": "LLM_CHAT_TEMPLATE", "value": openai.chat_template}]
                    if openai and openai.chat_template else [])
    volumes = [
        {"name": "model-cache", "persistentVolumeClaim": {"claimName": cache_claim(isvc, settings), "readOnly": True}},
        {"name": "model-repository", "emptyDir": {}},
        {"name": "triton-runtime", "emptyDir": {"sizeLimit": "64Mi"}},
        {"name": "home", "emptyDir": {"sizeLimit": runtime.SERVING_HOME_SIZE}},
    ]
    cache_mount = {"name": "model-cache", "mountPath": MODEL_CACHE_ROOT, "readOnly": True}
    return {
        "path": REPOSITORY_ROOT,
        "volumes": volumes,
        "init": [
            {"name": "model-repository", **container(settings.runtime_image, [], repo, settings),
             "env": [*home, *template_env], "gpu": False, "secret": False,
             "volumeMounts": [cache_mount, {"name": "model-repository", "mountPath": REPOSITORY_ROOT},
                              {"name": "triton-runtime", "mountPath": RUNTIME_ROOT},
                              {"name": "home", "mountPath": runtime.SERVING_HOME}]},
            # The doctor runs in the serving image with the pod's GPUs, so that a node without them,
            # an old driver or an image of another TensorRT-LLM version fails in seconds, named.
            {"name": "doctor", **container(settings.llm_image, PYTHON_MODULE, doctor, settings),
             "env": [*home, RUNTIME_ENV], "gpu": True, "secret": False,
             "volumeMounts": [cache_mount, {"name": "triton-runtime", "mountPath": RUNTIME_ROOT, "readOnly": True},
                              {"name": "home", "mountPath": runtime.SERVING_HOME}]},
        ],
        "server_mounts": [cache_mount, {"name": "model-repository", "mountPath": REPOSITORY_ROOT, "readOnly": True},
                          {"name": "home", "mountPath": runtime.SERVING_HOME}],
        "server_env": home,
        "secret_on_server": False,
    }
