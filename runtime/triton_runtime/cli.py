"""triton-runtime: the commands the operator's Jobs and pods run inside the serving image."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from . import cache, repository, trtllm
from .fetch import FetchError, fetch
from .spec import EngineSpec, SpecError
from .stage import StageError, stage

EXAMPLES_DIR = Path(os.environ.get("TRTLLM_EXAMPLES_DIR", "/app/tensorrt_llm/examples"))


class RuntimeFailure(Exception):
    pass


def _trtllm_version() -> str:
    try:
        import tensorrt_llm  # only inside the serving image, on a GPU node
    except ImportError:
        raise RuntimeFailure("tensorrt_llm is not installed: build-engine runs in the runtime image") from None
    return tensorrt_llm.__version__


def _engine_spec(a: argparse.Namespace) -> EngineSpec:
    return EngineSpec(
        source=a.source, precision=a.precision, compute_capability=a.compute_capability,
        revision=a.revision or "main", tensor_parallelism=a.tensor_parallelism,
        max_batch_size=a.max_batch_size, max_input_len=a.max_input_len, max_seq_len=a.max_seq_len,
        max_num_tokens=a.max_num_tokens).validate()


def _run(cmd: list[str]) -> None:
    print("+ " + " ".join(cmd), flush=True)
    result = subprocess.run(cmd)
    if result.returncode != 0:
        raise RuntimeFailure(f"{cmd[0]} exited with {result.returncode}")


def cmd_build_engine(a: argparse.Namespace) -> int:
    spec = _engine_spec(a)
    key = spec.key(a.trtllm_version or _trtllm_version())
    cache_dir = Path(a.cache)

    def build(out: Path) -> dict:
        with tempfile.TemporaryDirectory(dir=a.scratch) as tmp:
            model_dir = fetch(spec.source, Path(tmp) / "hf", spec.revision)
            model_type = json.loads((model_dir / "config.json").read_text()).get("model_type", "")
            ckpt = Path(tmp) / "checkpoint"
            _run(trtllm.checkpoint_command(spec, model_type, model_dir, ckpt, EXAMPLES_DIR))
            _run(trtllm.build_command(spec, ckpt, out / "engine"))
            tokenizer = out / "tokenizer"
            tokenizer.mkdir()
            for f in model_dir.iterdir():  # the tokenizer travels with the engine
                if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")) or f.name == "config.json":
                    (tokenizer / f.name).write_bytes(f.read_bytes())
        return {"source": spec.source, "revision": spec.revision, "precision": spec.precision}

    path = cache.publish(cache_dir, key, build)
    print(f"engine ready: {path}")
    return 0


def cmd_make_repository(a: argparse.Namespace) -> int:
    spec = _engine_spec(a)
    key = spec.key(a.trtllm_version or _trtllm_version())
    found = cache.lookup(Path(a.cache), key)
    if not found:
        raise RuntimeFailure(f"no engine {key} in {a.cache}: the build Job for this GPU class has not finished")
    repository.write(repository.RepositorySpec(
        engine_dir=str(found / "engine"), tokenizer_dir=str(found / "tokenizer"),
        max_batch_size=spec.max_batch_size, decoupled=a.streaming), Path(a.repository))
    print(f"repository written to {a.repository} for engine {key}")
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
    except (SpecError, StageError, FetchError, RuntimeFailure, TimeoutError) as e:
        print(f"triton-runtime {args.command}: {e}", file=sys.stderr)
        return 2 if isinstance(e, SpecError) else 1


if __name__ == "__main__":
    raise SystemExit(main())
