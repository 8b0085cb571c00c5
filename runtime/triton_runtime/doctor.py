"""`triton-runtime doctor`: does this pod have what a model preparation or a serving replica needs?

The operator runs it as an init container of every preparation Job and every LLM serving pod,
with the same GPUs, volumes and environment as the work that follows, so that a misconfigured
node or cluster fails in seconds with a reason instead of after an hour of downloading. It prints
one line per problem, writes them to the container's termination message (shown by `kubectl
describe pod`), and exits with PROBLEMS_EXIT; the Job's podFailurePolicy fails it at once on that
code instead of retrying.

Each check is a function of plain values (what the probes read) so the tests can drive it; the
probes (NVML, statvfs, the package metadata, the source's file listing) are at the bottom.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from . import cache, image
from .fetch import FetchError, MissingLibrary, SourceUnavailable, checkpoint_files, listing
from .prepare import QUANTIZED, Preparation

PROBLEMS_EXIT = 3  # the build Job's podFailurePolicy fails the Job on it (no retries)
TERMINATION_LOG = Path(os.environ.get("TRITON_RUNTIME_TERMINATION_LOG", "/dev/termination-log"))
TERMINATION_LOG_LIMIT = 4096  # bytes the kubelet keeps of a termination message
# Bytes a weight takes at each precision, block scales included (4-bit weights: NVFP4 one FP8 scale
# per 16, INT4-AWQ one 16-bit scale per 128), and in the 16-bit source checkpoint. The operator
# plans with the same figures (api/model.py, render/runtime.py); it cannot be imported here (this
# package is copied alone into NVIDIA's image), so tests/test_shared_tables.py holds them equal.
BYTES_PER_PARAMETER = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "nvfp4": 0.5625, "int4-awq": 0.515625}
SOURCE_BYTES_PER_PARAMETER = 2  # Hugging Face LLM checkpoints are 16-bit
GIB = 1024**3


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)

    def extend(self, problems: list[str], passed: str) -> None:
        self.problems.extend(problems)
        if not problems:
            self.passed.append(passed)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# ---------------------------------------------------------------------------------------------
# Checks (pure but for the directory probes, which create and remove one file)
# ---------------------------------------------------------------------------------------------

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
        return [f"TensorRT-LLM is not installed (no {image.TRTLLM_DISTRIBUTION} distribution): LLM services are "
                f"served and quantized with {image.IMAGE} (the operator's llmImage)"]
    return []


def check_prepared(cache_dir: Path, prep: Preparation, version: str | None) -> list[str]:
    """The model this pod will serve is prepared in the cache, for the TensorRT-LLM version here."""
    if version is not None and prep.trtllm_version and not image.same_release(version, prep.trtllm_version):
        return [f"this image has TensorRT-LLM {version} but the model was prepared for {prep.trtllm_version}: set "
                f"the operator's trtllmVersion to the image's (chart triton.trtllmVersion) so that a preparation "
                f"for {version} runs"]
    try:
        if cache.lookup(cache_dir, prep.key()):
            return []
    except cache.CacheError as e:
        return [str(e)]
    return [f"no prepared model {prep.key()} in {cache_dir}: its preparation Job has not published it, or this "
            f"pod mounts another model cache claim than the Job did"]


def check_driver(driver: str | None, minimum: str) -> list[str]:
    """Warnings (not problems) about the driver: data-center GPUs run newer CUDA on older drivers
    through CUDA forward compatibility, which the NGC images carry, so an older driver may work."""
    if driver is None or not minimum:
        return []
    if image.version_tuple(driver) >= image.version_tuple(minimum):
        return []
    return [f"NVIDIA driver {driver} is older than the {minimum} this image's CUDA {image.CUDA_VERSION} needs: "
            f"data-center GPUs run it through CUDA forward compatibility on supported driver branches, other GPUs "
            f"will fail to start the engine; upgrade the node's driver, or pin an older llmImage"]


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
CACHE_ADVICE = "grow the model cache claim or delete prepared models no service uses"


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
    """(scratch bytes, cache bytes): the download and the calibration set in scratch; in the cache
    the checkpoint at the target precision (as downloaded when it is not quantized here)."""
    if precision in QUANTIZED:
        kept = s.weights * BYTES_PER_PARAMETER[precision] / SOURCE_BYTES_PER_PARAMETER
    else:
        kept = s.weights
    return s.download + calibration, kept


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


def driver_version() -> str | None:
    """The NVIDIA driver's version through NVML, None without a GPU."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        buf = ctypes.create_string_buffer(80)
        if nvml.nvmlSystemGetDriverVersion(buf, 80) != 0:
            return None
        return buf.value.decode()
    finally:
        nvml.nvmlShutdown()


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
class Checkup:
    """What the doctor examines: the pod's purpose, the model it prepares or serves, its cache and
    its GPUs."""

    mode: str                          # "prepare" or "serve"
    preparation: Preparation
    cache_dir: Path
    gpus: int                          # GPUs the pod was given (0: a preparation that only downloads)
    scratch: Path | None = None
    scratch_limit: int | None = None
    trtllm_version: str | None = None  # None: read from the package metadata
    min_driver: str = image.MIN_DRIVER
    nodes: int = 1                     # serve: the nodes of the replica's group (MPI over SSH when more than 1)


def check_disk(prep: Preparation, scratch: Path, scratch_limit: float | None, cache_dir: Path,
               list_source: Callable[..., dict[str, int]], free_space: Callable[[Path], float]) -> Report:
    """Room in scratch for the download (and calibration set) and in the cache for the prepared
    checkpoint, from the source's file listing. The preparation Job's download step runs it too,
    in the operator's image, which can list every scheme."""
    report = Report()
    try:
        remote = not prep.source.startswith("pvc://")
        s = sizes(list_source(prep.source, prep.revision), remote)
        calibration = 0
        if prep.calibration_dataset and not prep.calibration_dataset.startswith("pvc://"):
            calibration = sum(list_source(prep.calibration_dataset, None, "dataset").values())
        scratch_need, cache_need = needs(s, prep.precision, calibration)
        report.extend(check_space("scratch", scratch, scratch_need, free_space(scratch), SCRATCH_ADVICE, scratch_limit)
                      + check_space("model cache", cache_dir, cache_need, free_space(cache_dir), CACHE_ADVICE),
                      f"disk: {_gib(scratch_need)} scratch, {_gib(cache_need)} cache needed")
    except MissingLibrary as e:  # NVIDIA's image and s3:// or gs://: the download step checks it
        report.warnings.append(f"disk not checked here ({e}): the download step, in the operator's image, checks it")
    except SourceUnavailable as e:  # the network or the server: the Job retries it, so only warn
        report.warnings.append(f"could not size the checkpoint, disk not checked: {e}")
    except FetchError as e:  # a wrong name, no access, no weights: the preparation would fail the same way
        report.problems.append(str(e))
    return report


# What a replica across nodes runs (the operator's render/group.py): workers an SSH server, the
# leader mpirun over SSH around TensorRT-LLM's launcher.
GROUP_PROGRAMS = {"sshd": "/usr/sbin/sshd", "ssh": "ssh", "ssh-keygen": "ssh-keygen", "mpirun": "mpirun",
                  "trtllm-llmapi-launch": "trtllm-llmapi-launch"}
MIN_GROUP_SHM = 1 * GIB     # NCCL's buffers between the GPUs of a node live in /dev/shm


def check_group(which: Callable[[str], str | None], shm_bytes: float | None, infiniband: list[str]) -> Report:
    """What a pod of a group across nodes needs of its image and node: the programs of the launch
    (problems: the group cannot start without them), shared memory, and InfiniBand devices
    (warnings: NCCL runs without them, slower or with less room)."""
    report = Report()
    missing = [name for name, path in GROUP_PROGRAMS.items() if not which(path)]
    report.extend([f"the image lacks {', '.join(missing)}: a replica across nodes starts MPI over SSH "
                   f"(an SSH server on each worker, mpirun and TensorRT-LLM's trtllm-llmapi-launch on the leader); "
                   f"serve from an image that adds them (spec.server.image, e.g. the stock image with "
                   f"openssh-server installed)"] if missing else [], "SSH and MPI programs present")
    if shm_bytes is not None and shm_bytes < MIN_GROUP_SHM:
        report.warnings.append(f"/dev/shm holds {_gib(shm_bytes)}: NCCL needs more between a node's GPUs; raise "
                               f"spec.server.shmSize (at least 1Gi, 16Gi or more for large models)")
    if not infiniband:
        report.warnings.append("no InfiniBand device visible (/sys/class/infiniband): NCCL between the nodes falls "
                               "back to TCP sockets, which slows every token; give the pods the node's RDMA devices")
    else:
        report.passed.append(f"InfiniBand devices: {', '.join(infiniband)}")
    return report


def shm_size(path: Path = Path("/dev/shm")) -> float | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return float(st.f_blocks * st.f_frsize)


def infiniband_devices(root: Path = Path("/sys/class/infiniband")) -> list[str]:
    try:
        return sorted(p.name for p in root.iterdir())
    except OSError:
        return []


def run(req: Checkup, environ: Mapping[str, str] | None = None,
        gpu_probe: Callable[[Mapping[str, str]], tuple[int, str]] = visible_gpus,
        list_source: Callable[..., dict[str, int]] = listing,
        free_space: Callable[[Path], float] | None = None,
        driver_probe: Callable[[], str | None] = driver_version) -> Report:
    env = os.environ if environ is None else environ
    free_space = free_space or free_bytes
    report = Report()
    prep = req.preparation
    needs_trtllm = req.mode == "serve" or prep.precision in QUANTIZED
    version = req.trtllm_version or image.trtllm_version()
    if needs_trtllm:
        report.extend(check_trtllm(version), f"TensorRT-LLM {version}")

    folders, unset = cache_folders(env)
    report.extend(unset + check_writable(folders), "home and cache folders writable")

    if req.mode == "prepare":
        report.extend(check_writable({"model cache": req.cache_dir / cache.SCRATCH,
                                      "model cache lock folder": req.cache_dir / cache.LOCKS}),
                      "model cache writable")
        scratch = req.scratch or Path("/tmp")
        report.extend(check_writable({"scratch": scratch}), "scratch writable")
        disk = check_disk(prep, scratch, req.scratch_limit, req.cache_dir, list_source, free_space)
        report.problems.extend(disk.problems)
        report.warnings.extend(disk.warnings)
        report.passed.extend(disk.passed)
    else:
        report.extend(check_prepared(req.cache_dir, prep, version), "model prepared for this version")

    if req.mode == "serve" and req.nodes > 1:
        group = check_group(shutil.which, shm_size(), infiniband_devices())
        report.problems.extend(group.problems)
        report.warnings.extend(group.warnings)
        report.passed.extend(group.passed)

    if req.gpus:
        visible, why = gpu_probe(env)
        report.extend(check_gpus(req.gpus, visible, why), f"{visible} GPU(s) visible")
        if visible:
            report.warnings.extend(check_driver(driver_probe(), req.min_driver))
    return report
