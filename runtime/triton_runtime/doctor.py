"""`triton-runtime doctor`: does this pod have what a build or a serving replica needs?

The operator runs it as the first init container of every engine-build Job and every
TensorRT-LLM serving pod, with the same GPUs, volumes and environment as the work that follows,
so that a misconfigured node or cluster fails in seconds with a reason instead of after an hour
of downloading and building. It prints one line per problem, writes them to the container's
termination message (shown by `kubectl describe pod`), and exits with PROBLEMS_EXIT; the build
Job's podFailurePolicy fails the Job at once on that code instead of retrying.

Each check is a function of plain values (what the probes read) so the tests can drive it; the
probes (NVML, statvfs, the package metadata, the source's file listing) are at the bottom.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from . import cache, image
from .fetch import FetchError, SourceUnavailable, checkpoint_files, listing
from .spec import EngineSpec
from .trtllm import QFORMAT

PROBLEMS_EXIT = 3  # the build Job's podFailurePolicy fails the Job on it (no retries)
TERMINATION_LOG = Path(os.environ.get("TRITON_RUNTIME_TERMINATION_LOG", "/dev/termination-log"))
TERMINATION_LOG_LIMIT = 4096  # bytes the kubelet keeps of a termination message
BYTES_PER_PARAMETER = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4-awq": 0.5}
SOURCE_BYTES_PER_PARAMETER = 2  # Hugging Face LLM checkpoints are 16-bit
GIB = 1024**3
_QUANTITY = re.compile(r"^([0-9.]+)(Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P)?$")
_SCALE = {None: 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)

    def extend(self, problems: list[str], passed: str) -> None:
        self.problems.extend(problems)
        if not problems:
            self.passed.append(passed)


def parse_quantity(text: str) -> int:
    """A Kubernetes quantity such as 40Gi or 500M, in bytes."""
    match = _QUANTITY.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a quantity such as 40Gi")
    return int(float(match.group(1)) * _SCALE[match.group(2)])


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# ---------------------------------------------------------------------------------------------
# Checks (pure but for the directory probes, which create and remove one file)
# ---------------------------------------------------------------------------------------------

def check_examples(examples: Path, precision: str, on_path: Callable[[str], str | None] | None = None) -> list[str]:
    """The converters and trtllm-build a build runs."""
    on_path = on_path or shutil.which
    found = []
    if not examples.is_dir():
        found.append(f"TensorRT-LLM examples not found at {examples} (the converters live there; the "
                     f"NGC trtllm image has them at {image.DEFAULT_EXAMPLES_DIR}): use the runtime image "
                     f"built from runtime/Dockerfile or set {image.EXAMPLES_ENV}")
    elif precision in QFORMAT and not (examples / "quantization" / "quantize.py").is_file():
        found.append(f"{examples}/quantization/quantize.py not found: precision {precision} needs it")
    elif precision not in QFORMAT and not any(examples.glob("*/convert_checkpoint.py")):
        found.append(f"no */convert_checkpoint.py under {examples}: precision {precision} needs a converter")
    if on_path("trtllm-build") is None:
        found.append("trtllm-build is not on PATH: this is not a TensorRT-LLM image")
    return found


def check_writable(folders: Mapping[str, Path]) -> list[str]:
    """Each folder exists (created if missing) and takes a file."""
    found = []
    for name, folder in folders.items():
        probe = folder / f".doctor-{uuid.uuid4().hex[:8]}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            found.append(f"{name} {folder} is not writable by uid {os.getuid()} ({e.strerror or e})")
    return found


def cache_folders(environ: Mapping[str, str]) -> tuple[dict[str, Path], list[str]]:
    """The per-user cache folders from the environment, and a problem for each variable unset."""
    folders, found = {}, []
    for name in image.CACHE_VARIABLES:
        value = environ.get(name)
        if value:
            folders[name] = Path(value)
        else:
            found.append(f"{name} is not set: uid 1000 has no home directory in the NGC image; set "
                         f"{', '.join(image.CACHE_VARIABLES)} under a writable volume (the operator does)")
    return folders, found


def check_trtllm(version: str | None) -> list[str]:
    if version is None:
        return [f"TensorRT-LLM is not installed (no {image.TRTLLM_DISTRIBUTION} distribution): engines are "
                f"built and served with the runtime image built from runtime/Dockerfile"]
    return []


def check_engine(cache_dir: Path, spec: EngineSpec, version: str | None) -> list[str]:
    """The engine this pod will serve is published, built by the TensorRT-LLM version installed here."""
    if version is None:
        return []  # reported by check_trtllm
    key = spec.key(version)
    try:
        if cache.lookup(cache_dir, key):
            return []
    except cache.CacheError as e:
        return [str(e)]
    others = sorted({m.get("trtllm_version", "?") for m in cache.manifests(cache_dir)
                     if m.get("spec") == spec.fields() and m.get("trtllm_version") != version})
    if others:
        return [f"the engine for this spec in {cache_dir} was built with TensorRT-LLM {', '.join(others)} but "
                f"this image has {version}: an engine runs only with the version that built it; serve with the "
                f"operator's runtime image (the one the build Job used) or let a new build run"]
    return [f"no engine {key} in {cache_dir}: the build Job for this GPU class has not published it, or "
            f"this pod mounts another engine cache claim than the build did"]


def check_gpus(expected: int, visible: int, why: str) -> list[str]:
    if visible == 0:
        return [f"no GPU visible ({why}); {expected} expected: the pod must request nvidia.com/gpu on a node "
                f"with the NVIDIA device plugin and container runtime"]
    if visible < expected:
        return [f"{visible} GPU(s) visible, {expected} expected (gpu.count): tensor parallelism needs one GPU "
                f"per rank in this pod"]
    return []


def check_space(label: str, path: Path, need: float, free: float, advice: str, limit: float | None = None) -> list[str]:
    room = free if limit is None else min(free, limit)
    if need <= room:
        return []
    limit_text = f" (volume limit {_gib(limit)})" if limit is not None and limit < free else ""
    return [f"{label} {path} has {_gib(room)} free{limit_text}, about {_gib(need)} needed: {advice}"]


SCRATCH_ADVICE = "raise spec.engine.buildResources.requests.ephemeral-storage or free the node's disk"
CACHE_ADVICE = "grow the engine cache claim or delete engines no service uses"


@dataclass(frozen=True)
class Sizes:
    download: int      # bytes fetched into scratch (0 for pvc://, read in place)
    weights: int       # bytes of the checkpoint's weights


def sizes(files: Mapping[str, int], remote: bool) -> Sizes:
    """What the build fetches of a source listing, and how much of it is weights."""
    picked = checkpoint_files(files)
    weights = sum(files[f] for f in picked if f.endswith((".safetensors", ".bin")))
    return Sizes(download=sum(files[f] for f in picked) if remote else 0, weights=weights)


def needs(s: Sizes, precision: str, calibration: int = 0) -> tuple[float, float]:
    """(scratch bytes, cache bytes): the download, plus the converted checkpoint (weights at the
    target precision) in scratch, plus the calibration set; the engine is about the checkpoint."""
    converted = s.weights * BYTES_PER_PARAMETER[precision] / SOURCE_BYTES_PER_PARAMETER
    return s.download + converted + calibration, converted


# ---------------------------------------------------------------------------------------------
# Probes
# ---------------------------------------------------------------------------------------------

def visible_gpus(environ: Mapping[str, str]) -> tuple[int, str]:
    """(GPUs this process can use, how that was found) through NVML, which the NVIDIA container
    runtime injects (libnvidia-ml.so.1) with only the devices allocated to the container."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return 0, "libnvidia-ml.so.1 is not in this container, so no GPU was given to it"
    rc = nvml.nvmlInit_v2()
    if rc != 0:
        return 0, f"NVML did not initialise (error {rc})"
    try:
        count = ctypes.c_uint(0)
        rc = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
        if rc != 0:
            return 0, f"NVML could not count devices (error {rc})"
        n = count.value
    finally:
        nvml.nvmlShutdown()
    restricted = environ.get("CUDA_VISIBLE_DEVICES")
    if restricted is not None:
        n = min(n, len([d for d in restricted.split(",") if d.strip()]))
    return n, f"NVML counts {n}"


def free_bytes(path: Path) -> float:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def write_termination_message(lines: list[str], path: Path | None = None) -> bool:
    """The problems as the container's termination message, which the kubelet keeps in the pod's
    status (lastState.terminated.message; `kubectl describe pod`). Only where the kubelet mounted
    the file: outside a pod nothing is written."""
    path = path or TERMINATION_LOG
    if not path.is_file():
        return False
    try:
        path.write_bytes("\n".join(lines).encode()[:TERMINATION_LOG_LIMIT])
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Request:
    mode: str                          # "build" or "serve"
    spec: EngineSpec
    cache_dir: Path
    gpus: int
    scratch: Path | None = None
    scratch_limit: int | None = None
    trtllm_version: str | None = None  # None: read from the package metadata


def run(req: Request, environ: Mapping[str, str] | None = None,
        gpu_probe: Callable[[Mapping[str, str]], tuple[int, str]] = visible_gpus,
        list_source: Callable[..., dict[str, int]] = listing,
        free_space: Callable[[Path], float] | None = None) -> Report:
    env = os.environ if environ is None else environ
    free_space = free_space or free_bytes
    report = Report()
    version = req.trtllm_version or image.trtllm_version()
    report.extend(check_trtllm(version), f"TensorRT-LLM {version}")

    folders, unset = cache_folders(env)
    report.extend(unset + check_writable(folders), "home and cache folders writable")

    if req.mode == "build":
        examples = image.examples_dir(env)
        report.extend(check_examples(examples, req.spec.precision), f"converters in {examples}")
        report.extend(check_writable({"engine cache": req.cache_dir / cache.SCRATCH,
                                      "engine cache lock folder": req.cache_dir / cache.LOCKS}),
                      "engine cache writable")
        scratch = req.scratch or Path("/tmp")
        report.extend(check_writable({"scratch": scratch}), "scratch writable")
        try:
            remote = not req.spec.source.startswith("pvc://")
            s = sizes(list_source(req.spec.source, req.spec.revision), remote)
            calibration = 0
            if req.spec.calibration_dataset and not req.spec.calibration_dataset.startswith("pvc://"):
                calibration = sum(list_source(req.spec.calibration_dataset, None, "dataset").values())
            scratch_need, cache_need = needs(s, req.spec.precision, calibration)
            report.extend(check_space("scratch", scratch, scratch_need, free_space(scratch), SCRATCH_ADVICE,
                                      req.scratch_limit)
                          + check_space("engine cache", req.cache_dir, cache_need, free_space(req.cache_dir),
                                        CACHE_ADVICE),
                          f"disk: {_gib(scratch_need)} scratch, {_gib(cache_need)} cache needed")
        except SourceUnavailable as e:  # the network or the server: the build retries it, so only warn
            report.warnings.append(f"could not size the checkpoint, disk not checked: {e}")
        except FetchError as e:  # a wrong name, no access, no weights: the build would fail the same way
            report.problems.append(str(e))
    else:
        report.extend(check_engine(req.cache_dir, req.spec, version), "engine published for this version")

    visible, why = gpu_probe(env)
    report.extend(check_gpus(req.gpus, visible, why), f"{visible} GPU(s) visible")
    return report
