"""triton-runtime prepare, make-repository, install and doctor as the pods run them, on CPU, in a
subprocess with a pod's folders and environment.

One stand-in, because TensorRT-LLM needs a GPU: the `tensorrt_llm` distribution is only its
metadata (for its version), and importing the package fails as it does in a container without
libcuda.so.1. Model Optimizer's quantization cannot run here at all: the tests stop before it
(a checkpoint already quantized is used as it is; the GPU smoke procedure in runtime/README.md
covers the rest). Everything else is the real runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from triton_runtime import image
from triton_runtime.prepare import Preparation

LLAMA = {"config.json": json.dumps({"model_type": "llama"}), "tokenizer.json": "{}",
         "tokenizer_config.json": json.dumps({"chat_template": "{{ messages[0]['content'] }}",
                                              "eos_token": "<|eot_id|>"}),
         "generation_config.json": json.dumps({"eos_token_id": [128001, 128009]}),
         "model.safetensors": "weights", "original/consolidated.00.pth": "meta's copy"}


@pytest.fixture
def pod(tmp_path):
    """Folders and environment of a preparation Job's or serving pod's container."""
    site = tmp_path / "site"
    dist = site / "tensorrt_llm-1.2.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 1.2.1\n")
    (site / "tensorrt_llm").mkdir()
    (site / "tensorrt_llm" / "__init__.py").write_text(
        'raise ImportError("libcuda.so.1: cannot open shared object file: No such file or directory")\n')
    model = tmp_path / "pvc" / "models" / "llama"
    for name, text in LLAMA.items():
        (model / name).parent.mkdir(parents=True, exist_ok=True)
        (model / name).write_text(text)
    home = tmp_path / "scratch" / "home"
    env = {**os.environ, "PYTHONPATH": str(site), "TRITON_RUNTIME_PVC_ROOT": str(tmp_path / "pvc"),
           "TRITON_RUNTIME_TERMINATION_LOG": str(tmp_path / "termination-log"),
           **image.cache_environment(str(home))}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "termination-log").write_text("")
    return {"tmp": tmp_path, "env": env, "cwd": elsewhere, "cache": tmp_path / "models",
            "scratch": tmp_path / "scratch", "model": model}


def run(pod, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "triton_runtime.cli", *args], cwd=pod["cwd"], env=pod["env"],
                          capture_output=True, text=True, timeout=120)


def model_args(pod, source="pvc://models/llama", precision="bf16", *extra: str) -> list[str]:
    return ["--source", source, "--precision", precision, "--trtllm-version", "1.2.1", "--cache", str(pod["cache"]),
            *extra]


def test_prepare_publishes_the_checkpoint_once_and_the_repository_serves_it(pod):
    out = run(pod, "prepare", *model_args(pod), "--scratch", str(pod["scratch"]))
    assert out.returncode == 0, out.stderr
    key = Preparation("pvc://models/llama", "bf16", "main", "1.2.1").key()
    published = pod["cache"] / key
    assert json.loads((published / "manifest.json").read_text())["action"] == "use"
    assert sorted(p.name for p in published.iterdir() if p.name != "manifest.json") == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    again = run(pod, "prepare", *model_args(pod), "--scratch", str(pod["scratch"]))
    assert again.returncode == 0 and "is in the cache: nothing to build" in again.stdout

    # make-repository, as the serving pod's first init container (the operator's image) runs it
    repo, runtime = pod["tmp"] / "repository", pod["tmp"] / "runtime"
    out = run(pod, "make-repository", "--engine", "trtllm", *model_args(pod), "--repository", str(repo),
              "--install-into", str(runtime), "--tensor-parallelism", "2", "--max-seq-len", "4096")
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load((repo / "llm" / "1" / "model.yaml").read_text())
    assert doc["model"] == str(published) and doc["llm_args"]["tensor_parallel_size"] == 2
    assert doc["llm_args"]["dtype"] == "bfloat16"   # what LLM(dtype=...) loads unquantized weights in
    assert "pipeline_parallel_size" not in doc["llm_args"]
    # across two nodes of 8 GPUs: 8-way tensor parallelism within each, a pipeline stage on each
    out = run(pod, "make-repository", "--engine", "trtllm", *model_args(pod), "--repository", str(repo),
              "--install-into", str(runtime), "--tensor-parallelism", "8", "--pipeline-parallelism", "2")
    assert out.returncode == 0, out.stderr
    args = yaml.safe_load((repo / "llm" / "1" / "model.yaml").read_text())["llm_args"]
    assert (args["tensor_parallel_size"], args["pipeline_parallel_size"], args["gpus_per_node"]) == (8, 2, 8)
    assert doc["chat_template"] == "{{ messages[0]['content'] }}" and doc["stop_token_ids"] == [128001, 128009]
    # the doctor's copy of triton-runtime, with the pure-Python libraries a stock image may lack
    assert (runtime / "triton_runtime" / "cli.py").is_file()
    assert {"yaml", "jinja2", "markupsafe"} <= {p.name for p in runtime.iterdir()}


def test_a_checkpoint_quantized_otherwise_stops_preparation_as_a_spec_error(pod):
    (pod["model"] / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    out = run(pod, "prepare", *model_args(pod, precision="fp8"), "--scratch", str(pod["scratch"]))
    assert out.returncode == 2 and "Traceback" not in out.stderr  # 2: the Job fails without retries
    assert "already quantized to nvfp4; set model.precision: nvfp4" in out.stderr
    assert not any(pod["cache"].glob("llama-*"))


def test_a_checkpoint_quantized_as_asked_is_used_as_it_is(pod):
    (pod["model"] / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    out = run(pod, "prepare", *model_args(pod, precision="fp8"), "--scratch", str(pod["scratch"]))
    assert out.returncode == 0, out.stderr
    (published,) = [p for p in pod["cache"].iterdir() if p.name.startswith("llama-fp8-")]
    assert (published / "hf_quant_config.json").is_file()


def test_make_repository_before_the_preparation_says_so(pod):
    out = run(pod, "make-repository", "--engine", "trtllm", *model_args(pod), "--repository", str(pod["tmp"] / "r"))
    assert out.returncode == 1 and "its preparation Job has not finished" in out.stderr and "Traceback" not in out.stderr


def test_doctor_on_this_cpu_machine_reports_no_gpu(pod):
    """The real GPU probe (NVML) on a machine without a GPU: a clear failure, exit 3, one line per
    problem, and the same lines in the termination message the kubelet keeps."""
    out = run(pod, "doctor", "--for", "prepare", *model_args(pod, precision="fp8"), "--gpus", "1",
              "--scratch", str(pod["scratch"]), "--scratch-size", "10Gi")
    assert out.returncode == 3, out.stderr
    problems = [line for line in out.stderr.splitlines() if line.startswith("doctor: ")]
    assert len(problems) == 1 and "no GPU visible" in problems[0] and "1 expected" in problems[0]
    assert "ok: TensorRT-LLM 1.2.1" in out.stdout and "ok: home and cache folders writable" in out.stdout
    assert (pod["tmp"] / "termination-log").read_text() == problems[0][len("doctor: "):]


def test_doctor_for_serving_names_a_model_not_yet_prepared_and_the_missing_gpus(pod):
    out = run(pod, "doctor", "--for", "serve", *model_args(pod), "--gpus", "2")
    assert out.returncode == 3
    lines = out.stderr.splitlines()
    assert any("no prepared model llama-bf16-" in line for line in lines), lines
    assert any("no GPU visible" in line and "2 expected" in line for line in lines)


def test_doctor_for_serving_an_image_of_another_tensorrt_llm_version(pod):
    out = run(pod, "doctor", "--for", "serve", *model_args(pod), "--gpus", "1", "--installed-trtllm-version", "1.3.0")
    assert "this image has TensorRT-LLM 1.3.0 but the model was prepared for 1.2.1" in out.stderr


def test_doctor_reports_home_folders_it_cannot_use(pod):
    pod["env"].pop("HF_DATASETS_CACHE")
    pod["env"]["HOME"] = "/proc/no-home"  # cannot be created, as / is for uid 1000 in the NGC image
    out = run(pod, "doctor", "--for", "serve", *model_args(pod), "--gpus", "1")
    assert out.returncode == 3
    assert "doctor: HF_DATASETS_CACHE is not set" in out.stderr
    assert "doctor: HOME /proc/no-home is not writable" in out.stderr


def test_a_quantizing_preparation_in_an_image_of_another_version_stops_at_once(pod):
    pod["env"]["PYTHONPATH"] = ""   # no tensorrt_llm at all: a download is fine, a quantization is not
    out = run(pod, "doctor", "--for", "prepare", *model_args(pod, precision="fp8"), "--gpus", "0",
              "--scratch", str(pod["scratch"]))
    assert out.returncode == 3 and "TensorRT-LLM is not installed" in out.stderr
    plain = run(pod, "doctor", "--for", "prepare", *model_args(pod), "--gpus", "0", "--scratch", str(pod["scratch"]))
    assert plain.returncode == 0, plain.stderr


def test_a_quantizing_job_downloads_in_one_step_and_quantizes_from_it_in_the_next(pod):
    """The Job's download init container (the operator's image) and its prepare container
    (NVIDIA's image) share the scratch volume: the second reads what the first fetched. A
    checkpoint already quantized as asked stands in for the quantization (no GPU here)."""
    (pod["model"] / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    dl = pod["scratch"] / "download"
    first = run(pod, "prepare", *model_args(pod, precision="fp8"), "--scratch", str(pod["scratch"]),
                "--download-to", str(dl), "--scratch-size", "10Gi")
    assert first.returncode == 0, first.stderr
    assert "download: ok: disk: 0.0 GiB scratch" in first.stdout
    found = json.loads((dl / "download.json").read_text())
    assert found["checkpoint"] == str(pod["model"]) and found["calibration"] is None   # a claim is read in place
    second = run(pod, "prepare", *model_args(pod, precision="fp8"), "--scratch", str(pod["scratch"]),
                 "--downloaded", str(dl))
    assert second.returncode == 0, second.stderr
    (published,) = [p for p in pod["cache"].iterdir() if p.name.startswith("llama-fp8-")]
    assert json.loads((published / "manifest.json").read_text())["action"] == "use"
    again = run(pod, "prepare", *model_args(pod, precision="fp8"), "--scratch", str(pod["scratch"]),
                "--download-to", str(pod["scratch"] / "other"))
    assert again.returncode == 0 and "is in the cache: nothing to download" in again.stdout
    assert not (pod["scratch"] / "other").exists()


def test_the_quantize_step_refuses_a_download_of_another_model_or_none(pod):
    dl = pod["scratch"] / "download"
    out = run(pod, "prepare", *model_args(pod, precision="fp8"), "--downloaded", str(dl))
    assert out.returncode == 2 and "the download step has not run" in out.stderr and "Traceback" not in out.stderr
    run(pod, "prepare", *model_args(pod, precision="bf16"), "--download-to", str(dl))
    out = run(pod, "prepare", *model_args(pod, precision="fp8"), "--downloaded", str(dl))
    assert out.returncode == 2 and "is of another preparation (llama-bf16-" in out.stderr


def test_the_download_step_refuses_a_checkpoint_quantized_otherwise_before_the_calibration_set(pod):
    (pod["model"] / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    out = run(pod, "prepare", *model_args(pod, "pvc://models/llama", "fp8", "--calibration-dataset",
                                          "pvc://missing/texts"), "--download-to", str(pod["scratch"] / "dl"))
    assert out.returncode == 2 and "already quantized to nvfp4" in out.stderr, out.stderr


def test_the_download_step_checks_the_disk_first(pod, monkeypatch, capsys):
    """In process, with the source's listing and the free space as a 70B checkpoint on a small
    disk would give them: exit 3 (the Job fails without retries), one line, nothing fetched."""
    from triton_runtime import cli, doctor

    monkeypatch.setattr(cli, "fetch_listing", lambda *a: {"config.json": 1, "model.safetensors": 140 * doctor.GIB})
    monkeypatch.setattr(doctor, "free_bytes", lambda path: 500 * doctor.GIB)
    monkeypatch.setattr(doctor, "TERMINATION_LOG", pod["tmp"] / "termination-log")
    monkeypatch.setattr(cli.prepare, "download_inputs", lambda *a: pytest.fail("downloaded despite the problem"))
    code = cli.main(["prepare", "--source", "s3://bucket/llama-70b", "--precision", "fp8", "--cache",
                     str(pod["cache"]), "--download-to", str(pod["scratch"] / "dl"), "--scratch-size", "100Gi"])
    err = capsys.readouterr().err
    assert code == 3 and err.startswith("download: scratch ") and "140.0 GiB needed" in err
    assert "(volume limit 100.0 GiB)" in err and "Traceback" not in err
