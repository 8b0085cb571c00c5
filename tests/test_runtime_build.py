"""triton-runtime build-engine, make-repository and doctor as the pods run them, on CPU.

Stand-ins, because TensorRT-LLM needs a GPU: the `tensorrt_llm` distribution is only its
metadata, and importing the package fails the way it does in a container without libcuda.so.1;
the converters (convert_checkpoint.py, quantize.py) and trtllm-build are small scripts that record
their arguments and working folder and write what the real ones write, including trtllm-build's
relative timing cache (BuildConfig.output_timing_cache = 'model.cache' in NVIDIA/TensorRT-LLM
v0.17.0 tensorrt_llm/builder.py). Everything else is the real runtime in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from triton_runtime import image
from triton_runtime.spec import EngineSpec

RECORDER = textwrap.dedent('''
    import json, os, sys
    with open(os.environ["FAKE_TRTLLM_LOG"], "a") as log:
        log.write(json.dumps({"argv": sys.argv, "cwd": os.getcwd()}) + "\\n")
    out = sys.argv[sys.argv.index("--output_dir") + 1]
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, "config.json"), "w").write("{}")
    open("model.cache", "w").write("timing cache")  # relative, as trtllm-build's default
''')
LLAMA = {"config.json": json.dumps({"model_type": "llama"}), "tokenizer.json": "{}",
         "tokenizer_config.json": "{}", "special_tokens_map.json": "{}", "generation_config.json": "{}",
         "model.safetensors": "weights", "original/consolidated.00.pth": "meta's copy"}


@pytest.fixture
def pod(tmp_path):
    """Folders and environment of a build Job's container, with the stand-ins above."""
    site = tmp_path / "site"
    dist = site / "tensorrt_llm-0.17.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 0.17.0\n")
    (site / "tensorrt_llm").mkdir()
    (site / "tensorrt_llm" / "__init__.py").write_text(
        'raise ImportError("libcuda.so.1: cannot open shared object file: No such file or directory")\n')
    examples = tmp_path / "app" / "examples"
    for rel in ("llama/convert_checkpoint.py", "quantization/quantize.py"):
        (examples / rel).parent.mkdir(parents=True)
        (examples / rel).write_text(RECORDER)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "trtllm-build").write_text(f"#!{sys.executable}\n" + RECORDER)
    (bin_dir / "trtllm-build").chmod(0o755)
    model = tmp_path / "pvc" / "models" / "llama"
    for name, text in LLAMA.items():
        (model / name).parent.mkdir(parents=True, exist_ok=True)
        (model / name).write_text(text)
    home = tmp_path / "scratch" / "home"
    env = {**os.environ, "PYTHONPATH": str(site), image.EXAMPLES_ENV: str(examples),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TRITON_RUNTIME_PVC_ROOT": str(tmp_path / "pvc"),
           "FAKE_TRTLLM_LOG": str(tmp_path / "calls.jsonl"),
           "TRITON_RUNTIME_TERMINATION_LOG": str(tmp_path / "termination-log"),
           **image.cache_environment(str(home))}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "termination-log").write_text("")
    return {"tmp": tmp_path, "env": env, "cwd": elsewhere, "cache": tmp_path / "engines",
            "scratch": tmp_path / "scratch", "examples": examples}


def run(pod, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "triton_runtime.cli", *args], cwd=pod["cwd"], env=pod["env"],
                          capture_output=True, text=True, timeout=120)


def engine_args(pod, source="pvc://models/llama", precision="fp16", *extra: str) -> list[str]:
    return ["--source", source, "--precision", precision, "--compute-capability", "9.0",
            "--cache", str(pod["cache"]), *extra]


def calls(pod) -> list[dict]:
    return [json.loads(line) for line in (pod["tmp"] / "calls.jsonl").read_text().splitlines()]


def test_build_runs_in_scratch_and_publishes_an_engine_named_by_the_installed_version(pod):
    out = run(pod, "build-engine", *engine_args(pod), "--scratch", str(pod["scratch"]))
    assert out.returncode == 0, out.stderr
    convert, build = calls(pod)
    assert convert["argv"][0] == str(pod["examples"] / "llama" / "convert_checkpoint.py")
    assert convert["argv"][convert["argv"].index("--model_dir") + 1] == str(pod["tmp"] / "pvc" / "models" / "llama")
    assert Path(build["argv"][0]).name == "trtllm-build"
    for step in (convert, build):  # every step in the build's own scratch folder ...
        assert Path(step["cwd"]).parent == pod["scratch"], step
    assert not (pod["cwd"] / "model.cache").exists()  # ... so nothing lands where the pod started
    key = EngineSpec(source="pvc://models/llama", precision="fp16", compute_capability="9.0").key("0.17.0")
    published = pod["cache"] / key
    manifest = json.loads((published / "manifest.json").read_text())
    assert manifest["trtllm_version"] == "0.17.0" and manifest["spec"]["precision"] == "fp16"
    assert sorted(p.name for p in (published / "tokenizer").iterdir()) == [
        "config.json", "generation_config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    assert list(pod["scratch"].glob("tmp*")) == []  # the scratch folder is cleaned up

    # make-repository, as the init container without a GPU runs it: the version comes from the
    # package metadata; importing tensorrt_llm would fail here as it does without libcuda.
    repo = pod["tmp"] / "models"
    out = run(pod, "make-repository", *engine_args(pod), "--repository", str(repo))
    assert out.returncode == 0, out.stderr
    assert f"gpt_model_path\" value: {{ string_value: \"{published / 'engine'}\"" in \
        (repo / "tensorrt_llm" / "config.pbtxt").read_text()


def test_quantized_build_calibrates_on_the_given_dataset(pod):
    dataset = pod["tmp"] / "pvc" / "datasets" / "calib"
    dataset.mkdir(parents=True)
    (dataset / "train.jsonl").write_text('{"text": "hello"}\n')
    out = run(pod, "build-engine", *engine_args(pod, "pvc://models/llama", "fp8", "--calibration-dataset",
                                                "pvc://datasets/calib"), "--scratch", str(pod["scratch"]))
    assert out.returncode == 0, out.stderr
    quantize = calls(pod)[0]["argv"]
    assert quantize[0] == str(pod["examples"] / "quantization" / "quantize.py")
    assert quantize[quantize.index("--calib_dataset") + 1] == str(dataset)
    assert quantize[quantize.index("--qformat") + 1] == "fp8"


@pytest.mark.parametrize("change, words, code", [
    ({image.EXAMPLES_ENV: "/nonexistent/examples"}, "TensorRT-LLM examples not found at /nonexistent/examples", 1),
    ({"PYTHONPATH": ""}, "TensorRT-LLM is not installed", 1),
])
def test_an_image_without_tensorrt_llm_fails_at_start_in_one_line(pod, change, words, code):
    pod["env"].update(change)
    out = run(pod, "build-engine", *engine_args(pod), "--scratch", str(pod["scratch"]))
    assert out.returncode == code and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and words in out.stderr
    assert not (pod["tmp"] / "calls.jsonl").exists(), "nothing ran before the check"


def test_a_refused_architecture_stops_the_build_as_a_spec_error(pod):
    config = pod["tmp"] / "pvc" / "models" / "llama" / "config.json"
    config.write_text(json.dumps({"model_type": "gemma"}))
    out = run(pod, "build-engine", *engine_args(pod), "--scratch", str(pod["scratch"]))
    assert out.returncode == 2 and "Traceback" not in out.stderr  # 2: the Job fails without retries
    assert "model_type 'gemma' is not built here" in out.stderr and "format triton" in out.stderr


def test_doctor_on_this_cpu_machine_reports_no_gpu(pod):
    """The real GPU probe (NVML) on a machine without a GPU: a clear failure, exit 3, one line per
    problem, and the same lines in the termination message the kubelet keeps."""
    out = run(pod, "doctor", "--for", "build", *engine_args(pod), "--gpus", "1",
              "--scratch", str(pod["scratch"]), "--scratch-size", "10Gi")
    assert out.returncode == 3, out.stderr
    problems = [line for line in out.stderr.splitlines() if line.startswith("doctor: ")]
    assert len(problems) == 1 and "no GPU visible" in problems[0] and "1 expected" in problems[0]
    assert "ok: TensorRT-LLM 0.17.0" in out.stdout and "ok: home and cache folders writable" in out.stdout
    assert (pod["tmp"] / "termination-log").read_text() == problems[0][len("doctor: "):]


def test_doctor_for_serving_names_an_engine_of_another_version(pod):
    older = EngineSpec(source="pvc://models/llama", precision="fp16", compute_capability="9.0")
    folder = pod["cache"] / older.key("0.16.0")
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"spec": older.fields(), "trtllm_version": "0.16.0"}))
    out = run(pod, "doctor", "--for", "serve", *engine_args(pod), "--gpus", "2")
    assert out.returncode == 3
    lines = out.stderr.splitlines()
    assert any("built with TensorRT-LLM 0.16.0 but this image has 0.17.0" in line for line in lines), lines
    assert any("no GPU visible" in line and "2 expected" in line for line in lines)


def test_doctor_reports_home_folders_it_cannot_use(pod):
    pod["env"].pop("HF_DATASETS_CACHE")
    pod["env"]["HOME"] = "/proc/no-home"  # cannot be created, as / is for uid 1000 in the NGC image
    out = run(pod, "doctor", "--for", "serve", *engine_args(pod), "--gpus", "1")
    assert out.returncode == 3
    assert "doctor: HF_DATASETS_CACHE is not set" in out.stderr
    assert "doctor: HOME /proc/no-home is not writable" in out.stderr
