"""triton-runtime: the commands the operator's Jobs and init containers run.

  prepare          fetch a checkpoint (and quantize it when its precision asks) into the model cache
  make-repository  write the Triton model repository that serves a prepared model (or a GGUF file)
  install          copy this package into a folder, for containers of an image that does not have it
  doctor           check that a pod can prepare or serve (GPUs, driver, folders, disk, the prepared model)
  stage            fetch a non-LLM model (onnx, pytorch, tensorrt, python) or a Triton repository
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from . import cache, doctor, image, prepare, repository
from .fetch import FetchError, listing as fetch_listing
from .quantity import quantity_bytes
from .stage import StageError, stage

EXIT_SPEC = 2  # a request that cannot be done as asked: retrying cannot help (the Job fails at once)


class RuntimeFailure(Exception):
    pass


def _preparation(a: argparse.Namespace) -> prepare.Preparation:
    return prepare.Preparation(source=a.source, precision=a.precision, revision=a.revision or "main",
                           trtllm_version=a.trtllm_version or "", calibration_dataset=a.calibration_dataset)


def _prepare_home() -> None:
    """Create the per-user cache folders the environment names (the doctor reports if it cannot)."""
    for name in image.CACHE_VARIABLES:
        if os.environ.get(name):
            try:
                Path(os.environ[name]).mkdir(parents=True, exist_ok=True)
            except OSError:
                pass


def cmd_prepare(a: argparse.Namespace) -> int:
    req = _preparation(a)
    if a.download_to:
        return _download(req, a)
    if req.precision in prepare.QUANTIZED:
        installed = image.trtllm_version()
        if installed is not None and req.trtllm_version and not image.same_release(installed, req.trtllm_version):
            raise prepare.PrepareError(f"this image has TensorRT-LLM {installed}, the service expects "
                                       f"{req.trtllm_version}: set the operator's trtllmVersion to match its llmImage")
    _prepare_home()
    path = prepare.run(req, Path(a.cache), Path(a.scratch) if a.scratch else None,
                       Path(a.downloaded) if a.downloaded else None)
    commit = cache.manifest_of(path).get("commit")
    print(f"model prepared: {path}" + (f" (commit {commit})" if commit else ""))
    if commit:
        # The operator reads it from the Job's pod and shows it in the service's status.
        doctor.write_termination_message([f"prepared {req.source} at commit {commit}"])
    return 0


def _download(req: prepare.Preparation, a: argparse.Namespace) -> int:
    """The download step of a Job that quantizes: fetch here (every scheme's client is installed),
    after the same disk check as the doctor's; nothing when the model is already prepared."""
    found = cache.lookup(Path(a.cache), req.key())
    if found:
        print(f"{found} is in the cache: nothing to download")
        return 0
    dest = Path(a.download_to)
    disk = doctor.check_disk(req, dest, _quantity(a.scratch_size), Path(a.cache), fetch_listing, doctor.free_bytes)
    for line in disk.passed:
        print(f"download: ok: {line}")
    for line in disk.warnings:
        print(f"download: warning: {line}", file=sys.stderr)
    if disk.problems:
        for line in disk.problems:
            print(f"download: {line}", file=sys.stderr)
        doctor.write_termination_message(disk.problems)
        return doctor.PROBLEMS_EXIT
    _prepare_home()
    checkpoint, calibration, commit = prepare.download_inputs(req, dest)
    print(f"downloaded: {checkpoint}" + (f" at commit {commit}" if commit else "")
          + (f" and the calibration set {calibration}" if calibration else ""))
    return 0


def _quantity(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return quantity_bytes(text)
    except ValueError as e:
        raise prepare.PrepareError(f"--scratch-size: {e}") from None


def cmd_make_repository(a: argparse.Namespace) -> int:
    if a.engine == "trtllm":
        found = cache.lookup(Path(a.cache), _preparation(a).key())
        if not found:
            raise RuntimeFailure(f"no prepared model {_preparation(a).key()} in {a.cache}: its preparation Job "
                                 f"has not finished")
        model = str(found)
    else:
        model = a.model
    template = os.environ.get("LLM_CHAT_TEMPLATE") or None
    spec = repository.Spec(
        engine=a.engine, model=model, tensor_parallelism=a.tensor_parallelism,
        pipeline_parallelism=a.pipeline_parallelism, max_batch_size=a.max_batch_size,
        max_num_tokens=a.max_num_tokens, max_seq_len=a.max_seq_len,
        kv_cache_free_gpu_memory_fraction=a.kv_cache_free_gpu_memory_fraction,
        dtype=prepare.DTYPES.get(a.precision or ""), default_max_tokens=a.default_max_tokens, chat_template=template,
        n_ctx=a.n_ctx, n_threads=a.n_threads, site_dirs=tuple(a.site_dir or ()))
    folder = repository.write(spec, Path(a.repository))
    print(f"model {folder.name} written to {a.repository} ({a.engine}, {model})")
    if a.install_into:
        install(Path(a.install_into))
    return 0


def install(dest: Path) -> None:
    """This package into a folder a container of another image can put on PYTHONPATH (with the
    pure-Python libraries it needs that such an image may lack: PyYAML, jinja2, MarkupSafe)."""
    dest.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve().parent
    repository.copy_tree(here, dest / here.name)
    repository.copy_libraries(dest)
    print(f"triton_runtime installed into {dest}")


def cmd_install(a: argparse.Namespace) -> int:
    install(Path(a.into))
    return 0


def cmd_doctor(a: argparse.Namespace) -> int:
    limit = _quantity(a.scratch_size)
    req = doctor.Checkup(mode=a.mode, preparation=_preparation(a), cache_dir=Path(a.cache), gpus=a.gpus,
                         scratch=Path(a.scratch) if a.scratch else None, scratch_limit=limit,
                         trtllm_version=a.installed_trtllm_version, min_driver=a.min_driver, nodes=a.nodes)
    report = doctor.run(req)
    for line in report.passed:
        print(f"doctor: ok: {line}")
    for line in report.warnings:
        print(f"doctor: warning: {line}", file=sys.stderr)
    for line in report.problems:
        print(f"doctor: {line}", file=sys.stderr)
    if report.problems:
        doctor.write_termination_message(report.problems)
        return doctor.PROBLEMS_EXIT
    return 0


def cmd_stage(a: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(dir=a.scratch) as tmp:
        stage(a.source, a.format, a.model_name, Path(a.repository), Path(tmp), a.revision)
    print(f"{a.format} model {a.model_name} staged into {a.repository}")
    return 0


def _model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--source", required=required, help="hf://ORG/NAME, s3://, gs:// or pvc://CLAIM/PATH")
    p.add_argument("--revision")
    p.add_argument("--precision", required=required, choices=prepare.PRECISIONS)
    p.add_argument("--calibration-dataset", help="hf://, s3://, gs:// or pvc:// datasets folder for quantization")
    p.add_argument("--trtllm-version", default=image.TRTLLM_VERSION,
                   help=f"the TensorRT-LLM version the model is prepared for (default {image.TRTLLM_VERSION})")
    p.add_argument("--cache", required=required, help="the shared model cache folder")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="triton-runtime", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("prepare", help="fetch (and quantize) a checkpoint into the model cache, once per key")
    _model_args(b)
    b.add_argument("--scratch", default=None, help="where the checkpoint is downloaded and quantized")
    steps = b.add_mutually_exclusive_group()
    steps.add_argument("--download-to", help="only download the checkpoint (and calibration set) into this folder")
    steps.add_argument("--downloaded", help="use what --download-to fetched into this folder")
    b.add_argument("--scratch-size", help="--download-to: the folder's volume size limit, e.g. 40Gi")
    b.set_defaults(func=cmd_prepare)
    m = sub.add_parser("make-repository", help="write the Triton repository that serves an LLM")
    m.add_argument("--engine", choices=("trtllm", "llamacpp"), default="trtllm")
    _model_args(m, required=False)
    m.add_argument("--model", help="llamacpp: the GGUF file")
    m.add_argument("--repository", required=True)
    m.add_argument("--tensor-parallelism", type=int, default=1)
    m.add_argument("--pipeline-parallelism", type=int, default=1,
                   help="pipeline stages, one a node, for a model served across nodes (its GPUs a node: "
                        "--tensor-parallelism)")
    m.add_argument("--max-batch-size", type=int)
    m.add_argument("--max-num-tokens", type=int)
    m.add_argument("--max-seq-len", type=int)
    m.add_argument("--kv-cache-free-gpu-memory-fraction", type=float)
    m.add_argument("--default-max-tokens", type=int, default=256)
    m.add_argument("--n-ctx", type=int, default=4096, help="llamacpp: the context length")
    m.add_argument("--n-threads", type=int, help="llamacpp: CPU threads")
    m.add_argument("--site-dir", action="append", help="a Python path the model adds (a venv's site-packages)")
    m.add_argument("--install-into", help="also copy triton-runtime into this folder (for the doctor)")
    m.set_defaults(func=cmd_make_repository)
    i = sub.add_parser("install", help="copy this package into a folder (for PYTHONPATH in another image)")
    i.add_argument("--into", required=True)
    i.set_defaults(func=cmd_install)
    d = sub.add_parser("doctor", help="check that this pod can prepare (--for prepare) or serve (--for serve)")
    d.add_argument("--for", dest="mode", choices=("prepare", "serve"), required=True)
    _model_args(d)
    d.add_argument("--gpus", type=int, required=True, help="GPUs the pod was given (0: none)")
    d.add_argument("--nodes", type=int, default=1, help="serve: nodes of the replica's group (more than 1: "
                                                         "check SSH, MPI, shared memory and InfiniBand)")
    d.add_argument("--scratch", help="prepare: where the checkpoint is downloaded")
    d.add_argument("--scratch-size", help="prepare: the scratch volume's size limit, e.g. 40Gi")
    d.add_argument("--min-driver", default=image.MIN_DRIVER, help="the driver the image's CUDA needs")
    d.add_argument("--installed-trtllm-version", help="override the detected TensorRT-LLM version (tests)")
    d.set_defaults(func=cmd_doctor)
    s = sub.add_parser("stage", help="fetch a non-LLM model into a model repository")
    s.add_argument("--source", required=True)
    s.add_argument("--revision")
    s.add_argument("--format", required=True)
    s.add_argument("--model-name", required=True)
    s.add_argument("--repository", required=True)
    s.add_argument("--scratch", default=None)
    s.set_defaults(func=cmd_stage)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "make-repository" and args.engine == "trtllm" and not (args.source and args.precision
                                                                               and args.cache):
        print("triton-runtime make-repository: --engine trtllm needs --source, --precision and --cache",
              file=sys.stderr)
        return EXIT_SPEC
    if args.command == "make-repository" and args.engine == "llamacpp" and not args.model:
        print("triton-runtime make-repository: --engine llamacpp needs --model (a GGUF file)", file=sys.stderr)
        return EXIT_SPEC
    try:
        return args.func(args)
    except (prepare.PrepareError, repository.RepositoryError) as e:
        print(f"triton-runtime {args.command}: {e}", file=sys.stderr)
        return EXIT_SPEC
    except (StageError, FetchError, RuntimeFailure, cache.CacheError, TimeoutError, OSError) as e:
        print(f"triton-runtime {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
