"""runtime/: engine cache keys, TensorRT-LLM command lines, the in-flight batching repository
(validated against Triton's real ModelConfig protobuf from tritonclient), atomic publishing, and
staging of non-LLM models."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from triton_runtime import cache, repository, trtllm
from triton_runtime.spec import EngineSpec, SpecError
from triton_runtime.stage import StageError, stage

SPEC = EngineSpec(source="hf://meta-llama/Meta-Llama-3-8B-Instruct", precision="fp8", compute_capability="9.0")


def test_key_changes_with_everything_that_makes_engines_incompatible():
    base = SPEC.key("0.16.0")
    variants = [
        EngineSpec(**{**SPEC.__dict__, "precision": "fp16"}).key("0.16.0"),
        EngineSpec(**{**SPEC.__dict__, "compute_capability": "8.9"}).key("0.16.0"),
        EngineSpec(**{**SPEC.__dict__, "tensor_parallelism": 2}).key("0.16.0"),
        EngineSpec(**{**SPEC.__dict__, "max_seq_len": 8192}).key("0.16.0"),
        EngineSpec(**{**SPEC.__dict__, "revision": "v2"}).key("0.16.0"),
        EngineSpec(**{**SPEC.__dict__, "source": "hf://meta-llama/Meta-Llama-3-70B-Instruct"}).key("0.16.0"),
        SPEC.key("0.17.0"),
    ]
    assert len({base, *variants}) == len(variants) + 1
    assert base == SPEC.key("0.16.0")  # stable
    assert base.startswith("meta-llama-3-8b-instruct-fp8-tp1-sm90-")


@pytest.mark.parametrize("precision, cc, ok", [
    ("fp8", "8.0", False), ("fp8", "8.9", True), ("fp8", "9.0", True), ("bf16", "7.5", False),
    ("int4-awq", "8.0", True), ("fp16", "8.0", True),
])
def test_fp8_refused_below_ada(precision, cc, ok):
    spec = EngineSpec(source="hf://a/b", precision=precision, compute_capability=cc)
    if ok:
        spec.validate()
    else:
        with pytest.raises(SpecError, match=f"needs compute capability .* this GPU has {cc}"):
            spec.validate()


def test_build_command_carries_the_spec():
    spec = EngineSpec(source="hf://a/b", precision="fp16", compute_capability="9.0", tensor_parallelism=4,
                      max_batch_size=128, max_input_len=4096, max_seq_len=8192, max_num_tokens=16384)
    cmd = trtllm.build_command(spec, Path("/ck"), Path("/out"))
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    assert cmd[0] == "trtllm-build"
    assert flags["--max_batch_size"] == "128" and flags["--max_seq_len"] == "8192"
    assert flags["--max_num_tokens"] == "16384" and flags["--workers"] == "4"
    assert flags["--kv_cache_type"] == "paged" and flags["--use_paged_context_fmha"] == "enable"


@pytest.mark.parametrize("precision, expect", [
    ("fp16", ["llama/convert_checkpoint.py", "--dtype", "float16"]),
    ("bf16", ["llama/convert_checkpoint.py", "--dtype", "bfloat16"]),
    ("int8", ["--use_weight_only", "--weight_only_precision", "int8"]),
    ("fp8", ["quantization/quantize.py", "--qformat", "fp8", "--kv_cache_dtype", "fp8"]),
    ("int4-awq", ["quantization/quantize.py", "--qformat", "int4_awq", "--awq_block_size", "128"]),
])
def test_checkpoint_command_per_precision(precision, expect):
    spec = EngineSpec(source="hf://a/b", precision=precision, compute_capability="9.0", tensor_parallelism=2)
    cmd = " ".join(trtllm.checkpoint_command(spec, "mistral", Path("/m"), Path("/c"), Path("/ex")))
    assert all(part in cmd for part in expect), cmd
    assert "--tp_size 2" in cmd


def test_unknown_architecture_is_a_clear_error():
    with pytest.raises(SpecError, match="model_type 'mamba-x' has no TensorRT-LLM converter"):
        trtllm.architecture("mamba-x")


def test_serve_uses_mpirun_with_one_rank_per_gpu():
    assert trtllm.serve_command(Path("/models"), 1)[0] == "tritonserver"
    cmd = trtllm.serve_command(Path("/models"), 4)
    assert cmd[:2] == ["mpirun", "--allow-run-as-root"] and cmd.count("tritonserver") == 4
    assert cmd.count(":") == 3 and cmd.count("--http-port=8000") == 1
    assert "--backend-config=python,shm-region-prefix-name=prefix3_" in cmd


def _parse(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_repository_configs_parse_as_triton_model_config():
    spec = repository.RepositorySpec(engine_dir="/engines/k/engine", tokenizer_dir="/engines/k/tokenizer",
                                     max_batch_size=32, decoupled=True)
    parsed = {name: _parse(text) for name, text in repository.configs(spec).items()}
    trt = parsed["tensorrt_llm"]
    assert trt.backend == "tensorrtllm" and trt.max_batch_size == 32
    assert trt.model_transaction_policy.decoupled is True
    assert trt.parameters["gpt_model_type"].string_value == "inflight_fused_batching"
    assert trt.parameters["gpt_model_path"].string_value == "/engines/k/engine"
    assert parsed["preprocessing"].parameters["tokenizer_dir"].string_value == "/engines/k/tokenizer"
    assert parsed["ensemble"].platform == "ensemble"


def test_ensemble_wiring_is_consistent():
    """Every step reads tensors the composing model declares, from the ensemble's inputs or an
    earlier step; the ensemble's outputs are produced by some step."""
    spec = repository.RepositorySpec(engine_dir="/e", tokenizer_dir="/t")
    parsed = {name: _parse(text) for name, text in repository.configs(spec).items()}
    ensemble = parsed["ensemble"]
    available = {i.name for i in ensemble.input}
    for step in ensemble.ensemble_scheduling.step:
        model = parsed[step.model_name]
        declared_in = {i.name for i in model.input}
        declared_out = {o.name for o in model.output}
        assert set(step.input_map) <= declared_in, step.model_name
        required = {i.name for i in model.input if not i.optional}
        assert required <= set(step.input_map), f"{step.model_name} misses {required - set(step.input_map)}"
        assert set(step.input_map.values()) <= available, step.model_name
        assert set(step.output_map) <= declared_out, step.model_name
        available |= set(step.output_map.values())
    assert {o.name for o in ensemble.output} <= available


def test_write_lays_out_four_models(tmp_path):
    spec = repository.RepositorySpec(engine_dir="/e", tokenizer_dir="/t")
    repository.write(spec, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ensemble", "postprocessing", "preprocessing", "tensorrt_llm"]
    assert (tmp_path / "preprocessing" / "1" / "model.py").read_text().startswith('"""Triton Python model')
    assert (tmp_path / "tensorrt_llm" / "1").is_dir()


def test_publish_builds_once_and_reuses(tmp_path):
    calls = []

    def build(out: Path) -> dict:
        calls.append(out)
        (out / "engine").mkdir()
        (out / "engine" / "rank0.engine").write_text("x")
        return {"note": "test"}

    first = cache.publish(tmp_path, "k1", build, log=lambda _: None)
    second = cache.publish(tmp_path, "k1", build, log=lambda _: None)
    assert first == second == tmp_path / "k1" and len(calls) == 1
    assert (first / "engine" / "rank0.engine").read_text() == "x"
    assert not list((tmp_path / ".tmp").iterdir())


def test_concurrent_builders_of_one_key_build_once(tmp_path):
    """Two builders at once: the second waits on the lock and reuses the first one's engine."""
    calls, results = [], []

    def build(out: Path) -> dict:
        calls.append(out)
        time.sleep(0.5)
        (out / "engine").mkdir()
        return {}

    threads = [threading.Thread(target=lambda: results.append(cache.publish(tmp_path, "k", build, log=lambda _: None)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results[0] == results[1]


def test_failed_build_leaves_nothing_behind(tmp_path):
    def build(out: Path) -> dict:
        (out / "partial").write_text("half")
        raise RuntimeError("trtllm-build exited with 1")

    with pytest.raises(RuntimeError):
        cache.publish(tmp_path, "k", build, log=lambda _: None)
    assert cache.lookup(tmp_path, "k") is None and not (tmp_path / "k").exists()
    assert not list((tmp_path / ".tmp").iterdir())


@pytest.fixture
def pvc(tmp_path, monkeypatch):
    monkeypatch.setattr("triton_runtime.fetch.PVC_ROOT", tmp_path / "pvc")
    return tmp_path / "pvc"


def test_stage_onnx_from_a_claim(pvc, tmp_path):
    (pvc / "store" / "resnet").mkdir(parents=True)
    (pvc / "store" / "resnet" / "resnet50.onnx").write_bytes(b"onnx")
    repo = stage("pvc://store/resnet", "onnx", "resnet50", tmp_path / "repo", tmp_path / "scratch")
    assert (repo / "resnet50" / "1" / "model.onnx").read_bytes() == b"onnx"
    config = _parse((repo / "resnet50" / "config.pbtxt").read_text())
    assert config.name == "resnet50" and config.backend == "onnxruntime"


def test_stage_renames_a_shipped_config(pvc, tmp_path):
    (pvc / "c" / "m").mkdir(parents=True)
    (pvc / "c" / "m" / "model.py").write_text("x = 1\n")
    (pvc / "c" / "m" / "config.pbtxt").write_text('name: "old"\nbackend: "python"\n')
    repo = stage("pvc://c/m", "python", "new", tmp_path / "repo", tmp_path / "s")
    assert _parse((repo / "new" / "config.pbtxt").read_text()).name == "new"


@pytest.mark.parametrize("files, fmt, words", [
    ({"model.pt": b"x"}, "pytorch", "needs a config.pbtxt"),
    ({"a.onnx": b"x", "b.onnx": b"y"}, "onnx", "exactly one .onnx"),
    ({"readme.md": b"x"}, "triton", "not a Triton model repository"),
    ({"a.onnx": b"x"}, "tensorrt-llm", "build-engine"),
])
def test_stage_refuses_what_triton_could_not_load(pvc, tmp_path, files, fmt, words):
    (pvc / "c" / "m").mkdir(parents=True)
    for name, data in files.items():
        (pvc / "c" / "m" / name).write_bytes(data)
    with pytest.raises(StageError, match=words):
        stage("pvc://c/m", fmt, "m", tmp_path / "repo", tmp_path / "s")


def test_missing_claim_path_is_reported(pvc, tmp_path):
    with pytest.raises(StageError, match="does not exist in the mounted claim store"):
        stage("pvc://store/nothing", "onnx", "m", tmp_path / "repo", tmp_path / "s")
