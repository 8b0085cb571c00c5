"""runtime/: atomic publishing into the shared model cache, selective checkpoint downloads, and
staging of non-LLM models. (The LLM model and preparation decisions are in test_serving.py; the
commands as pods run them in test_runtime_build.py.)"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from triton_runtime import cache
from triton_runtime.stage import StageError, stage


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
    assert logs["first"] == ["k published"]
    assert logs["second"] == ["another builder holds the lock of k: waiting for it",
                              "k was published by another preparation while this one waited: reusing it"]


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
    shared = Path(tempfile.mkdtemp(prefix="model-cache-"))  # /tmp/..., 0700 -> opened to others below
    try:
        shared.chmod(0o755)
        args = ["prepare", "--source", "hf://a/b", "--precision", "bf16", "--trtllm-version", "1.2.1",
                "--cache", str(shared / "models"), "--scratch", "/tmp"]
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              sys.executable, "-m", "triton_runtime.cli", *args], cwd="/",
                             capture_output=True, text=True, env=_without_coverage(os.environ))
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert line.startswith(f"triton-runtime prepare: model cache {shared / 'models'} is not writable by "
                               f"uid 65534 (Permission denied at {shared / 'models' / '.locks'}/")
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
        raise RuntimeError("quantization exited with 1")

    with pytest.raises(RuntimeError):
        cache.publish(tmp_path, "k", build, log=lambda _: None)
    assert cache.lookup(tmp_path, "k") is None and not (tmp_path / "k").exists()
    assert not list((tmp_path / ".tmp").iterdir())


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


def _parse(text: str):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2
    return text_format.Parse(text, model_config_pb2.ModelConfig())


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
    ({"a.onnx": b"x"}, "tensorrt-llm", "prepare and make-repository"),
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


def test_a_preparation_downloads_one_commit_and_records_it(tmp_path, monkeypatch):
    """The revision ("main") is resolved to a commit once; both download steps (side files, then
    the weights the index names) ask for that commit, so a push to main between them cannot mix
    two versions; the manifest and the termination log carry the commit. A stand-in for
    huggingface_hub (not installed here, and no network) whose main moves after the first call."""
    import sys
    import types

    from triton_runtime import cli, prepare
    sha1, sha2 = "1" * 40, "2" * 40
    heads = [sha1, sha2]   # main moves after it is first resolved
    asked: list[tuple[str, str]] = []
    hub = types.ModuleType("huggingface_hub")

    class HfApi:
        def __init__(self, token=None):
            pass

        def repo_info(self, repo_id, revision, repo_type, files_metadata=False):
            asked.append(("info", revision))
            names = ["config.json", "model.safetensors", "tokenizer.json"]
            sha = heads.pop(0) if revision == "main" and len(heads) > 1 else (revision if len(revision) == 40 else sha2)
            return types.SimpleNamespace(sha=sha, siblings=[types.SimpleNamespace(rfilename=n, size=1) for n in names])

    def snapshot_download(repo_id, revision, local_dir, repo_type, token, allow_patterns):
        asked.append(("download", revision))
        for name in allow_patterns:
            (Path(local_dir) / name).write_text("{}" if name.endswith(".json") else "weights")

    hub.HfApi, hub.snapshot_download = HfApi, snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    termination = tmp_path / "termination-log"
    termination.write_text("")
    monkeypatch.setattr("triton_runtime.doctor.TERMINATION_LOG", termination)
    cache_dir = tmp_path / "cache"
    code = cli.main(["prepare", "--source", "hf://org/tiny", "--precision", "bf16", "--cache", str(cache_dir),
                     "--scratch", str(tmp_path)])
    assert code == 0
    assert asked[0] == ("info", "main")
    assert {r for kind, r in asked if kind == "download"} == {sha1}, asked
    req = prepare.Preparation(source="hf://org/tiny", precision="bf16", revision="main", trtllm_version="1.2.1")
    manifest = json.loads((cache_dir / req.key() / "manifest.json").read_text())
    assert manifest["commit"] == sha1 and manifest["revision"] == "main"
    assert termination.read_text() == f"prepared hf://org/tiny at commit {sha1}"
