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


@pytest.mark.parametrize("model_type, why", [
    # NVIDIA/TensorRT-LLM v0.17.0 examples/gemma/convert_checkpoint.py takes --ckpt-type hf --model-dir
    # --output-model-dir --world-size, none of the common converter flags.
    ("gemma", "takes other flags"), ("gemma2", "takes other flags"),
    # Tokenizers shipped as Python in the checkpoint (AutoTokenizer needs trust_remote_code=True).
    ("chatglm", "trust_remote_code"), ("baichuan", "trust_remote_code"), ("qwen", "trust_remote_code"),
])
def test_architectures_this_runtime_cannot_build_are_refused_with_a_way_out(model_type, why):
    with pytest.raises(SpecError, match=why) as refused:
        trtllm.architecture(model_type)
    assert "serve them with model.format triton" in str(refused.value)
    spec = EngineSpec(source="hf://a/b", precision="fp8", compute_capability="9.0")
    with pytest.raises(SpecError):  # quantize.py could read it, but it could not be served
        trtllm.converter(spec, model_type, Path("/app/examples"))


def test_the_examples_are_where_the_ngc_image_keeps_them():
    """tensorrtllm_backend v0.17.0 dockerfile/Dockerfile.triton.trt_llm_backend: WORKDIR /app,
    COPY tensorrt_llm/examples examples (and its README: cd /app/examples/gpt)."""
    from triton_runtime import image
    assert image.DEFAULT_EXAMPLES_DIR == "/app/examples"
    assert image.examples_dir({}) == Path("/app/examples")
    spec = EngineSpec(source="hf://a/b", precision="fp16", compute_capability="9.0")
    assert trtllm.checkpoint_command(spec, "llama", Path("/m"), Path("/c"), image.examples_dir({}))[1] == \
        "/app/examples/llama/convert_checkpoint.py"
    fp8 = EngineSpec(source="hf://a/b", precision="fp8", compute_capability="9.0")
    assert trtllm.checkpoint_command(fp8, "llama", Path("/m"), Path("/c"), image.examples_dir({}))[1] == \
        "/app/examples/quantization/quantize.py"


def test_calibration_dataset_reaches_quantize_and_the_cache_key():
    """quantize.py --calib_dataset (NVIDIA/TensorRT-LLM v0.17.0 examples/quantization/quantize.py):
    a local folder is loaded with datasets.load_dataset(folder, split="train")["text"]."""
    fp8 = EngineSpec(source="hf://a/b", precision="fp8", compute_capability="9.0")
    cmd = trtllm.checkpoint_command(fp8, "llama", Path("/m"), Path("/c"), Path("/ex"),
                                    calibration_dataset=Path("/scratch/tmp1/calibration"))
    assert cmd[cmd.index("--calib_dataset") + 1] == "/scratch/tmp1/calibration"
    assert cmd[cmd.index("--calib_size") + 1] == "512"
    assert "--calib_dataset" not in trtllm.checkpoint_command(fp8, "llama", Path("/m"), Path("/c"), Path("/ex"))
    calibrated = EngineSpec(**{**fp8.__dict__, "calibration_dataset": "pvc://data/calib"})
    assert calibrated.key("0.17.0") != fp8.key("0.17.0")
    # An unset calibration dataset leaves the key as it was before the field existed.
    assert "calibration_dataset" not in fp8.fields()
    with pytest.raises(SpecError, match="calibration dataset applies only to precisions fp8, int4-awq"):
        EngineSpec(source="hf://a/b", precision="fp16", compute_capability="9.0",
                   calibration_dataset="pvc://data/calib").validate()


def test_the_dockerfile_keeps_the_ngc_entrypoint():
    """No ENTRYPOINT override: nvidia_entrypoint.sh sets up CUDA forward compatibility, then execs
    the container args (Triton server v2.54.0 docker/ and deploy/k8s-onprem, which passes
    `args: [tritonserver, ...]`)."""
    from .conftest import ROOT
    lines = [line.strip() for line in (ROOT / "runtime" / "Dockerfile").read_text().splitlines()]
    directives = [line.split()[0] for line in lines if line and not line.startswith("#")]
    assert "ENTRYPOINT" not in directives and "CMD" not in directives
    assert any("/app/examples/quantization/quantize.py" in line for line in lines if line.startswith("RUN"))


def test_serve_uses_mpirun_with_one_rank_per_gpu():
    assert trtllm.serve_command(Path("/models"), 1)[0] == "tritonserver"
    cmd = trtllm.serve_command(Path("/models"), 4)
    assert cmd[:2] == ["mpirun", "--allow-run-as-root"] and cmd.count("tritonserver") == 4
    assert cmd.count(":") == 3 and cmd.count("--http-port=8000") == 1
    assert "--backend-config=python,shm-region-prefix-name=prefix3_" in cmd


def _parse(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


# triton-inference-server/tensorrtllm_backend v0.17.0
# all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt: the declarations of the inputs this
# repository uses, (data type, dims, reshaped to a scalar, optional, allow_ragged_batch).
# Upstream's input_ids is optional only for encoder-decoder models; decoder-only ones always send it.
UPSTREAM_TENSORRT_LLM_INPUTS = {
    "input_ids": ("TYPE_INT32", [-1], False, False, True),
    "input_lengths": ("TYPE_INT32", [1], True, False, False),
    "request_output_len": ("TYPE_INT32", [1], True, False, False),
    "end_id": ("TYPE_INT32", [1], True, True, False),
    "pad_id": ("TYPE_INT32", [1], True, True, False),
    "streaming": ("TYPE_BOOL", [1], True, True, False),
    "exclude_input_in_output": ("TYPE_BOOL", [1], True, True, False),
    "temperature": ("TYPE_FP32", [1], True, True, False),
    "runtime_top_k": ("TYPE_INT32", [1], True, True, False),
    "runtime_top_p": ("TYPE_FP32", [1], True, True, False),
}
# .../ensemble/config.pbtxt: what clients send, and the tensorrt_llm input each one feeds.
UPSTREAM_ENSEMBLE_WIRING = {
    ("tensorrt_llm", "end_id"): "_PREPROCESSOR_END_ID", ("tensorrt_llm", "pad_id"): "_PREPROCESSOR_PAD_ID",
    ("tensorrt_llm", "streaming"): "stream", ("tensorrt_llm", "exclude_input_in_output"): "exclude_input_in_output",
    ("tensorrt_llm", "runtime_top_k"): "top_k", ("tensorrt_llm", "runtime_top_p"): "top_p",
    ("tensorrt_llm", "temperature"): "temperature",
    ("preprocessing", "QUERY"): "text_input", ("preprocessing", "REQUEST_OUTPUT_LEN"): "max_tokens",
    ("preprocessing", "END_ID"): "end_id", ("preprocessing", "PAD_ID"): "pad_id",
}


def test_tensorrt_llm_model_declares_its_inputs_as_upstream_does():
    trt = _parse(repository.tensorrt_llm_config(repository.RepositorySpec(engine_dir="/e", tokenizer_dir="/t")))
    declared = {i.name: i for i in trt.input}
    assert set(declared) == set(UPSTREAM_TENSORRT_LLM_INPUTS)
    for name, (dtype, dims, scalar, optional, ragged) in UPSTREAM_TENSORRT_LLM_INPUTS.items():
        i = declared[name]
        assert (model_config_pb2.DataType.Name(i.data_type), list(i.dims), i.HasField("reshape"), i.optional,
                i.allow_ragged_batch) == (dtype, dims, scalar, optional, ragged), name
    # The prompt is not echoed back: the backend's default when the parameter is unset is false
    # (inflight_batcher_llm/src/model_instance_state.cc).
    assert trt.parameters["exclude_input_in_output"].string_value == "true"


def test_ensemble_feeds_stop_and_streaming_inputs_as_upstream_does():
    ensemble = _parse(repository.ensemble_config(repository.RepositorySpec(engine_dir="/e", tokenizer_dir="/t")))
    wiring = {(step.model_name, key): value for step in ensemble.ensemble_scheduling.step
              for key, value in step.input_map.items()}
    for where, value in UPSTREAM_ENSEMBLE_WIRING.items():
        assert wiring.get(where) == value, where
    preprocessing = next(s for s in ensemble.ensemble_scheduling.step if s.model_name == "preprocessing")
    assert preprocessing.output_map["OUT_END_ID"] == "_PREPROCESSOR_END_ID"
    optional = {i.name for i in ensemble.input if i.optional}
    assert optional == {"end_id", "pad_id", "stream", "exclude_input_in_output", "temperature", "top_k", "top_p"}


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


def test_ensemble_tensors_agree_in_type_with_what_they_feed():
    spec = repository.RepositorySpec(engine_dir="/e", tokenizer_dir="/t")
    parsed = {name: _parse(text) for name, text in repository.configs(spec).items()}
    ensemble = parsed["ensemble"]
    types = {i.name: i.data_type for i in ensemble.input}
    for step in ensemble.ensemble_scheduling.step:
        model = parsed[step.model_name]
        wanted = {i.name: i.data_type for i in model.input}
        for key, value in step.input_map.items():
            assert types[value] == wanted[key], f"{value} -> {step.model_name}.{key}"
        produced = {o.name: o.data_type for o in model.output}
        types.update({value: produced[key] for key, value in step.output_map.items()})


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


def test_concurrent_builders_of_one_key_build_once(tmp_path, monkeypatch):
    """Two builders at once: the second waits on the lock and reuses the first one's engine.

    The first builder holds the lock until the second has said that it is waiting for it (its
    log line, written when its flock attempt is refused), so the wait is observed, not hoped for."""
    monkeypatch.setattr(cache, "LOCK_POLL_SECONDS", 0.05)
    second_waits = threading.Event()
    builds, logs, results = [], {"first": [], "second": []}, {}

    def build(out: Path) -> dict:
        builds.append(out)
        assert second_waits.wait(timeout=60), "the second builder never reached the lock"
        (out / "engine").mkdir()
        return {}

    def builder(name: str) -> None:
        def log(line: str) -> None:
            logs[name].append(line)
            if name == "second" and "waiting" in line:
                second_waits.set()
        results[name] = cache.publish(tmp_path, "k", build, log=log)

    first = threading.Thread(target=builder, args=("first",))
    first.start()
    deadline = time.monotonic() + 60
    while not builds:  # the first builder holds the lock once its build has started
        assert time.monotonic() < deadline and first.is_alive(), "the first builder never started building"
        time.sleep(0.01)
    second = threading.Thread(target=builder, args=("second",))
    second.start()
    for t in (first, second):
        t.join(timeout=60)
        assert not t.is_alive()
    assert len(builds) == 1 and results["first"] == results["second"] == tmp_path / "k"
    assert logs["first"] == ["engine k published"]
    assert logs["second"] == ["another builder holds the lock of k: waiting for it",
                              "engine k was published by another builder while this one waited: reusing it"]


def _without_coverage(environ) -> dict[str, str]:
    """A child running as another user cannot write the coverage data file of `make unit`, and
    coverage would say so on stderr: that child runs unmeasured."""
    return {k: v for k, v in environ.items() if not k.startswith("COVERAGE_")}


def test_an_unwritable_cache_is_one_line_not_a_traceback(tmp_path):
    """A real permission denial: the cache folder belongs to root and the build runs as nobody, as
    an NFS export that squashes uid 1000 looks to the build Job."""
    import os
    import subprocess
    import sys
    import tempfile
    shared = Path(tempfile.mkdtemp(prefix="engine-cache-"))  # /tmp/..., 0700 -> opened to others below
    try:
        shared.chmod(0o755)
        examples = shared / "examples"
        examples.mkdir()
        args = ["build-engine", "--source", "hf://a/b", "--precision", "fp16", "--compute-capability", "9.0",
                "--trtllm-version", "0.17.0", "--cache", str(shared / "engines"), "--scratch", "/tmp"]
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              sys.executable, "-m", "triton_runtime.cli", *args], cwd="/",
                             capture_output=True, text=True, env={**_without_coverage(os.environ),
                                                                   "TRTLLM_EXAMPLES_DIR": str(examples)})
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert line.startswith(f"triton-runtime build-engine: engine cache {shared / 'engines'} is not writable by "
                               f"uid 65534 (Permission denied at {shared / 'engines' / '.locks'}/")
        assert "fsGroup does not change ownership on NFS" in line
    finally:
        import shutil
        shutil.rmtree(shared)


def test_a_cache_without_file_locks_builds_without_one(tmp_path, monkeypatch):
    """NFS without a lock manager answers flock with ENOLCK: the atomic rename still protects."""
    import errno

    def no_locks(handle, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(cache.fcntl, "flock", no_locks)
    said = []
    path = cache.publish(tmp_path, "k", lambda out: {"x": 1}, log=said.append)
    assert path == tmp_path / "k" and "no file locks (No locks available): building without one" in said[0]
    assert cache.lookup(tmp_path, "k") == path


def test_failed_build_leaves_nothing_behind(tmp_path):
    def build(out: Path) -> dict:
        (out / "partial").write_text("half")
        raise RuntimeError("trtllm-build exited with 1")

    with pytest.raises(RuntimeError):
        cache.publish(tmp_path, "k", build, log=lambda _: None)
    assert cache.lookup(tmp_path, "k") is None and not (tmp_path / "k").exists()
    assert not list((tmp_path / ".tmp").iterdir())


class _Tensor:
    def __init__(self, name, array):
        self.name, self.array = name, array

    def as_numpy(self):
        return self.array


class _Response:
    def __init__(self, output_tensors):
        self.outputs = {t.name: t.array for t in output_tensors}


class _Tokenizer:
    """Llama 3's special ids: <|begin_of_text|> 128000, <|eot_id|> 128009, no pad token."""
    eos_token, eos_token_id, pad_token_id = "<|eot_id|>", 128009, None

    def encode(self, text, add_special_tokens=True):
        return [128000] + [len(w) for w in text.split()]


@pytest.fixture
def preprocessing(monkeypatch):
    """The shipped preprocessing model with stand-ins for what only exists inside Triton's Python
    backend (triton_python_backend_utils) and for a real tokenizer (transformers is not installed
    here)."""
    import sys
    import types

    import numpy as np

    backend = types.ModuleType("triton_python_backend_utils")
    backend.Tensor = _Tensor
    backend.InferenceResponse = _Response
    backend.get_input_tensor_by_name = lambda request, name: request.get(name)
    transformers = types.ModuleType("transformers")
    transformers.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda *a, **k: _Tokenizer())
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", backend)
    monkeypatch.setitem(sys.modules, "transformers", transformers)
    import importlib.util
    from importlib import resources as res
    path = res.files("triton_runtime").joinpath("models/preprocessing.py")
    spec = importlib.util.spec_from_file_location("shipped_preprocessing", str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    model.initialize({"model_config": '{"parameters": {"tokenizer_dir": {"string_value": "/t"}}}'})
    return model, np


def test_preprocessing_sends_the_tokenizer_end_id_unless_the_request_names_one(preprocessing):
    """As upstream's preprocessing/1/model.py: OUT_END_ID is the request's END_ID, else the EOS
    token's id; OUT_PAD_ID the pad token's, else EOS. Without it generation never stops at EOS."""
    model, np = preprocessing
    queries = np.array([[b"hello there world"], [b"hi"]], dtype=object)
    (out,) = model.execute([{"QUERY": _Tensor("QUERY", queries),
                             "REQUEST_OUTPUT_LEN": _Tensor("REQUEST_OUTPUT_LEN", np.array([[16], [16]]))}])
    assert out.outputs["OUT_END_ID"].tolist() == [[128009], [128009]]
    assert out.outputs["OUT_PAD_ID"].tolist() == [[128009], [128009]]
    assert out.outputs["REQUEST_INPUT_LEN"].tolist() == [[4], [2]]
    assert out.outputs["INPUT_ID"].tolist() == [[128000, 5, 5, 5], [128000, 2, 128009, 128009]]
    assert out.outputs["INPUT_ID"].dtype == np.int32
    (out,) = model.execute([{"QUERY": _Tensor("QUERY", queries[:1]),
                             "REQUEST_OUTPUT_LEN": _Tensor("REQUEST_OUTPUT_LEN", np.array([[8]])),
                             "END_ID": _Tensor("END_ID", np.array([[2]], dtype=np.int32))}])
    assert out.outputs["OUT_END_ID"].tolist() == [[2]] and out.outputs["REQUEST_OUTPUT_LEN"].tolist() == [[8]]


def test_checkpoint_download_leaves_out_second_copies_of_the_weights():
    """Meta's repositories hold original/*.pth beside the safetensors; older ones hold PyTorch,
    TensorFlow, Flax and ONNX copies. Only the transformers checkpoint is fetched."""
    from triton_runtime.fetch import FetchError, checkpoint_files
    llama = ["LICENSE", "README.md", "config.json", "generation_config.json", "model-00001-of-00004.safetensors",
             "model-00002-of-00004.safetensors", "model.safetensors.index.json", "original/consolidated.00.pth",
             "original/params.json", "original/tokenizer.model", "special_tokens_map.json", "tokenizer.json",
             "tokenizer_config.json"]
    assert checkpoint_files(llama) == [
        "config.json", "generation_config.json", "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
        "model.safetensors.index.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    gpt2 = ["config.json", "merges.txt", "vocab.json", "model.safetensors", "pytorch_model.bin", "tf_model.h5",
            "flax_model.msgpack", "rust_model.ot", "onnx/decoder_model.onnx", "64-8bits.tflite"]
    assert checkpoint_files(gpt2) == ["config.json", "merges.txt", "model.safetensors", "vocab.json"]
    assert checkpoint_files(["config.json", "pytorch_model.bin", "tokenizer.model"]) == [
        "config.json", "pytorch_model.bin", "tokenizer.model"]
    with pytest.raises(FetchError, match="no \\*.safetensors or \\*.bin weights"):
        checkpoint_files(["config.json", "model.gguf"])


def test_hf_download_asks_only_for_the_selected_files(tmp_path, monkeypatch):
    """huggingface_hub is not installed here and there is no network: a stand-in records what
    snapshot_download is asked for."""
    import sys
    import types

    from triton_runtime import fetch as fetching
    asked = {}
    hub = types.ModuleType("huggingface_hub")

    class HfApi:
        def __init__(self, token=None):
            pass

        def repo_info(self, repo_id, revision, repo_type, files_metadata):
            asked["info"] = (repo_id, revision, repo_type, files_metadata)
            names = ["config.json", "model.safetensors", "original/consolidated.00.pth", "tokenizer.json",
                     "special[1].json"]
            return types.SimpleNamespace(siblings=[types.SimpleNamespace(rfilename=n, size=1) for n in names])

    hub.HfApi = HfApi
    hub.snapshot_download = lambda **kw: asked.update(download=kw)
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    fetching.fetch("hf://meta-llama/Llama-3.2-1B", tmp_path, "main", select=fetching.checkpoint_files)
    assert asked["info"] == ("meta-llama/Llama-3.2-1B", "main", "model", True)
    patterns = asked["download"]["allow_patterns"]
    assert patterns == ["config.json", "model.safetensors", "special[[]1].json", "tokenizer.json"]
    import fnmatch
    assert [p for p in patterns if fnmatch.fnmatch("original/consolidated.00.pth", p)] == []
    assert fnmatch.fnmatch("special[1].json", "special[[]1].json")


@pytest.mark.parametrize("status, kind, words", [
    (401, "FetchError", "access refused (401"), (403, "FetchError", "credentialsSecret"),
    (404, "FetchError", "not found"), (503, "SourceUnavailable", "HTTPError"), (None, "SourceUnavailable", "timed out"),
])
def test_client_errors_become_one_line_definite_or_transient(status, kind, words):
    import types

    from triton_runtime import fetch as fetching

    class HTTPError(Exception):
        pass

    e = HTTPError("timed out\nmore detail") if status is None else HTTPError(f"{status} Client Error\nurl")
    if status is not None:
        e.response = types.SimpleNamespace(status_code=status)
    explained = fetching._explain("hf://a/b", e)
    assert type(explained).__name__ == kind and words in str(explained) and "\n" not in str(explained)


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
