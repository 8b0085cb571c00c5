"""triton-runtime: the commands the operator's Jobs and pods run inside the serving image."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import cache, doctor, image, repository, trtllm
from .fetch import FetchError, checkpoint_files, fetch
from .spec import EngineSpec, SpecError
from .stage import StageError, stage

EXIT_SPEC = 2  # a spec that cannot be built: retrying cannot help (the build Job fails at once)


class RuntimeFailure(Exception):
    pass


def _version(a: argparse.Namespace) -> str:
    version = a.trtllm_version or image.trtllm_version()
    if version is None:
        raise RuntimeFailure(f"TensorRT-LLM is not installed (no {image.TRTLLM_DISTRIBUTION} distribution): "
                             f"run this in the runtime image built from runtime/Dockerfile")
    return version


def _engine_spec(a: argparse.Namespace) -> EngineSpec:
    return EngineSpec(
        source=a.source, precision=a.precision, compute_capability=a.compute_capability,
        revision=a.revision or "main", tensor_parallelism=a.tensor_parallelism,
        max_batch_size=a.max_batch_size, max_input_len=a.max_input_len, max_seq_len=a.max_seq_len,
        max_num_tokens=a.max_num_tokens, calibration_dataset=a.calibration_dataset).validate()


def _prepare_home() -> None:
    """Create the per-user cache folders the environment names (the doctor reports if it cannot)."""
    for name in image.CACHE_VARIABLES:
        if os.environ.get(name):
            try:
                Path(os.environ[name]).mkdir(parents=True, exist_ok=True)
            except OSError:
                pass  # the doctor, which ran first, names it; the tool that needs it will fail clearly


def _run(cmd: list[str], cwd: Path) -> None:
    """Run a build step inside the scratch folder: TensorRT-LLM writes relative paths, e.g.
    trtllm-build's timing cache (NVIDIA/TensorRT-LLM v0.17.0 tensorrt_llm/builder.py:
    BuildConfig.output_timing_cache = 'model.cache'), and the pod's working folder is not
    writable by uid 1000."""
    print(f"+ (cd {cwd}) " + " ".join(cmd), flush=True)
    try:
        result = subprocess.run(cmd, cwd=cwd)
    except FileNotFoundError:
        raise RuntimeFailure(f"{cmd[0]} is not on PATH: this is not a TensorRT-LLM image") from None
    if result.returncode != 0:
        raise RuntimeFailure(f"{cmd[0]} exited with {result.returncode}")


def _is_tokenizer_file(name: str) -> bool:
    """What the pre/postprocessing models load with AutoTokenizer, and nothing heavier."""
    return (name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "added_tokens"))
            or name.endswith(".tiktoken") or name in ("config.json", "generation_config.json"))


def cmd_build_engine(a: argparse.Namespace) -> int:
    spec = _engine_spec(a)
    version = _version(a)
    key = spec.key(version)
    examples = image.examples_dir()
    if not examples.is_dir():
        raise RuntimeFailure(f"TensorRT-LLM examples not found at {examples}: the converters live there "
                             f"(set {image.EXAMPLES_ENV} if this image keeps them elsewhere)")
    _prepare_home()

    def build(out: Path) -> dict:
        with tempfile.TemporaryDirectory(dir=a.scratch) as tmp:
            work = Path(tmp)
            model_dir = fetch(spec.source, work / "hf", spec.revision, select=checkpoint_files)
            model_type = json.loads((model_dir / "config.json").read_text()).get("model_type", "")
            script = trtllm.converter(spec, model_type, examples)
            if not script.is_file():
                raise RuntimeFailure(f"{script} not found: this image's TensorRT-LLM examples lack the converter "
                                     f"for model_type {model_type!r}")
            calibration = None
            if spec.calibration_dataset:
                # A fixed folder name: quantize.py treats any path containing "cnn_dailymail" as that dataset.
                calibration = fetch(spec.calibration_dataset, work / "calibration", repo_type="dataset")
            ckpt = work / "checkpoint"
            _run(trtllm.checkpoint_command(spec, model_type, model_dir, ckpt, examples,
                                           calibration_dataset=calibration), cwd=work)
            _run(trtllm.build_command(spec, ckpt, out / "engine"), cwd=work)
            tokenizer = out / "tokenizer"
            tokenizer.mkdir()
            for f in sorted(model_dir.iterdir()):  # the tokenizer travels with the engine
                if f.is_file() and _is_tokenizer_file(f.name):
                    shutil.copyfile(f, tokenizer / f.name)
        return {"source": spec.source, "revision": spec.revision, "precision": spec.precision,
                "spec": spec.fields(), "trtllm_version": version}

    path = cache.publish(Path(a.cache), key, build)
    print(f"engine ready: {path}")
    return 0


def cmd_make_repository(a: argparse.Namespace) -> int:
    spec = _engine_spec(a)
    key = spec.key(_version(a))
    found = cache.lookup(Path(a.cache), key)
    if not found:
        raise RuntimeFailure(f"no engine {key} in {a.cache}: the build Job for this GPU class has not finished")
    repository.write(repository.RepositorySpec(
        engine_dir=str(found / "engine"), tokenizer_dir=str(found / "tokenizer"),
        max_batch_size=spec.max_batch_size, decoupled=a.streaming), Path(a.repository))
    print(f"repository written to {a.repository} for engine {key}")
    return 0


def cmd_doctor(a: argparse.Namespace) -> int:
    limit = None
    if a.scratch_size:
        try:
            limit = doctor.parse_quantity(a.scratch_size)
        except ValueError as e:
            raise SpecError(f"--scratch-size: {e}") from None
    req = doctor.Request(mode=a.mode, spec=_engine_spec(a), cache_dir=Path(a.cache), gpus=a.gpus,
                         scratch=Path(a.scratch) if a.scratch else None, scratch_limit=limit,
                         trtllm_version=a.trtllm_version)
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


def cmd_serve(a: argparse.Namespace) -> int:
    cmd = trtllm.serve_command(Path(a.repository), a.world_size, a.http_port, a.grpc_port, a.metrics_port,
                               a.extra)
    print("+ " + " ".join(cmd), flush=True)
    os.execvp(cmd[0], cmd)
    return 0  # not reached


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", required=True)
    p.add_argument("--revision")
    p.add_argument("--precision", required=True)
    p.add_argument("--compute-capability", required=True)
    p.add_argument("--tensor-parallelism", type=int, default=1)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-input-len", type=int, default=2048)
    p.add_argument("--max-seq-len", type=int, default=4096)
    p.add_argument("--max-num-tokens", type=int, default=8192)
    p.add_argument("--calibration-dataset", help="hf://, s3://, gs:// or pvc:// datasets folder for quantize.py")
    p.add_argument("--cache", required=True, help="the shared engine cache folder")
    p.add_argument("--trtllm-version", help="override the detected TensorRT-LLM version (tests)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="triton-runtime", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build-engine", help="build (or reuse) the engine for this GPU")
    _engine_args(b)
    b.add_argument("--scratch", default=None, help="where checkpoints are downloaded and converted")
    b.set_defaults(func=cmd_build_engine)
    m = sub.add_parser("make-repository", help="write the in-flight batching repository for a cached engine")
    _engine_args(m)
    m.add_argument("--repository", required=True)
    m.add_argument("--streaming", action="store_true", help="decoupled tensorrt_llm for token streaming")
    m.set_defaults(func=cmd_make_repository)
    d = sub.add_parser("doctor", help="check that this pod can build (--for build) or serve (--for serve) the engine")
    d.add_argument("--for", dest="mode", choices=("build", "serve"), required=True)
    _engine_args(d)
    d.add_argument("--gpus", type=int, required=True, help="GPUs the pod was given (gpu.count)")
    d.add_argument("--scratch", help="build: where the checkpoint is downloaded and converted")
    d.add_argument("--scratch-size", help="build: the scratch volume's size limit, e.g. 40Gi")
    d.set_defaults(func=cmd_doctor)
    s = sub.add_parser("stage", help="fetch a non-LLM model into a model repository")
    s.add_argument("--source", required=True)
    s.add_argument("--revision")
    s.add_argument("--format", required=True)
    s.add_argument("--model-name", required=True)
    s.add_argument("--repository", required=True)
    s.add_argument("--scratch", default=None)
    s.set_defaults(func=cmd_stage)
    v = sub.add_parser("serve", help="exec tritonserver (mpirun with one rank per GPU when parallel)")
    v.add_argument("--repository", required=True)
    v.add_argument("--world-size", type=int, default=1)
    v.add_argument("--http-port", type=int, default=8000)
    v.add_argument("--grpc-port", type=int, default=8001)
    v.add_argument("--metrics-port", type=int, default=8002)
    v.add_argument("extra", nargs="*", help="more tritonserver flags, after --")
    v.set_defaults(func=cmd_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (SpecError, StageError, FetchError, RuntimeFailure, cache.CacheError, TimeoutError) as e:
        print(f"triton-runtime {args.command}: {e}", file=sys.stderr)
        return EXIT_SPEC if isinstance(e, SpecError) else 1


if __name__ == "__main__":
    raise SystemExit(main())
