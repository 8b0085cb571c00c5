"""The CLI: correct output for good input; one line and a non-zero exit for bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from .conftest import EXAMPLES


def run(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "triton_operator", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_render_prints_manifests_for_an_example():
    out = run("render", "-f", str(EXAMPLES / "llama3-8b.yaml"))
    assert out.returncode == 0, out.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(out.stdout) if d]
    assert kinds == ["Deployment", "Service", "PodDisruptionBudget", "Job", "Job"]  # engines: h100, h200


def test_render_uses_a_gpu_class_file(tmp_path):
    classes = tmp_path / "classes.yaml"
    classes.write_text(yaml.safe_dump({
        "apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "h100"},
        "spec": {"nodeSelector": {"pool": "gpu-a"}, "memoryGiB": 80, "memoryBandwidthTBps": 3.35,
                 "computeCapability": "9.0", "resourceName": "nvidia.com/mig-3g.40gb"}}))
    out = run("render", "-f", str(EXAMPLES / "llama3-8b.yaml"), "--gpu-class-file", str(classes))
    assert out.returncode == 0, out.stderr
    dep = next(yaml.safe_load_all(out.stdout))
    pod = dep["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu-a"} and "affinity" not in pod
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": "1"}


BAD = {
    "count 0": ("spec: {model: {source: 'hf://a/b', format: onnx}, gpu: {class: h100, count: 0}}",
                "spec.gpu.count: Input should be greater than or equal to 1"),
    "min > max": ("spec: {model: {source: 'hf://a/b', format: onnx}, gpu: {class: h100},"
                  " autoscaling: {minReplicas: 4, maxReplicas: 2}}", "minReplicas must be less than or equal"),
    "missing class": ("spec: {model: {source: 'hf://a/b', format: onnx}, gpu: {class: b200}}",
                      "GPUClassNotFound: GPUClass b200 does not exist"),
    "image on an llm": ("spec: {model: {source: 'hf://a/b', format: tensorrt-llm}, gpu: {class: h100},"
                        " server: {image: 'nvcr.io/nvidia/tritonserver:25.02-trtllm-python-py3'}}",
                        "server.image cannot be set for model.format tensorrt-llm"),
    "gemma engine": ("spec: {model: {source: 'hf://google/gemma-2-9b', format: tensorrt-llm}, gpu: {class: h100}}",
                     "serve them with format triton"),
    "fp8 on a100": ("spec: {model: {source: 'hf://a/b', format: onnx, precision: fp8}, gpu: {class: a100-80gb}}",
                    "PrecisionUnsupported"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_specs_exit_non_zero_with_one_line(name):
    body, words = BAD[name]
    doc = "apiVersion: serving.triton-operator.io/v1alpha1\nkind: InferenceService\nmetadata: {name: x}\n" + body
    out = run("render", "-f", "-", stdin=doc)
    assert out.returncode != 0
    assert out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert words in out.stderr


@pytest.mark.parametrize("args, stdin, words", [
    (["render", "-f", "/nonexistent.yaml"], None, "No such file"),
    (["render", "-f", "-"], "a: [unclosed", "is not valid YAML"),
    (["render", "-f", "-"], "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", "expected apiVersion"),
    (["render", "-f", "-"], "- just\n- a list\n", "must be a mapping"),
    (["render", "-f", "-"], "", "no InferenceService or GPUClass"),
    (["render", "-f", str(EXAMPLES / "llama3-8b.yaml"), "--replicas", "-2"], None, "--replicas"),
])
def test_bad_input_exits_non_zero_with_one_line(args, stdin, words):
    out = run(*args, stdin=stdin)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_bad_settings_are_reported_in_one_line():
    import os
    env = {**os.environ, "TRITON_OPERATOR_RESYNC_SECONDS": "soon"}
    out = subprocess.run([sys.executable, "-m", "triton_operator", "render", "-f", str(EXAMPLES / "llama3-8b.yaml")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and "TRITON_OPERATOR_RESYNC_SECONDS" in out.stderr and "Traceback" not in out.stderr


def test_crds_and_plan_commands():
    crds = [d for d in yaml.safe_load_all(run("crds").stdout) if d]
    assert [d["metadata"]["name"] for d in crds] == [
        "inferenceservices.serving.triton-operator.io", "gpuclasses.serving.triton-operator.io"]
    plan = run("plan", "-f", str(EXAMPLES / "llama3-70b.yaml"))
    assert plan.returncode == 0
    assert any(line.split()[:2] == ["llama3-70b", "a100-80gb"] and "PrecisionUnsupported" in line
               for line in plan.stdout.splitlines())


def test_import_contract_keeps_the_core_pure():
    import shutil
    exe = shutil.which("lint-imports", path=str(__import__("pathlib").Path(sys.executable).parent))
    out = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


HEAD = "apiVersion: serving.triton-operator.io/v1alpha1\nkind: InferenceService\nmetadata: {name: x}\n"
OK_SPEC = "spec: {model: {source: 'hf://a/b', format: onnx, parameters: 8B}, gpu: {class: h100}"


@pytest.mark.parametrize("command", ["render", "plan"])
@pytest.mark.parametrize("stdin, words", [
    (HEAD + OK_SPEC.replace("8B", "0B") + "}", "spec.model.parameters"),
    (HEAD + OK_SPEC + ", rollout: {maxSurge: 18446744073709551616}}", "spec.rollout.maxSurge"),
    (HEAD + OK_SPEC + ", gpu: {class: h100, count: true}}", "spec.gpu.count"),
    (HEAD + OK_SPEC + ", autoscaling: {minReplicas: '1', maxReplicas: 2}}", "spec.autoscaling.minReplicas"),
    (HEAD + OK_SPEC + ", podLabels: {team: ml platform}}", "spec.podLabels.team"),
    (HEAD + OK_SPEC + ", server: {resources: {limits: {cpu: '1'}, requests: {cpu: '2'}}}}", "spec.server.resources.limits"),
    (HEAD + OK_SPEC + ", podAnnotations: {\"a\\nb\": x}}", "spec.podAnnotations[a\\nb]"),
    (b"\xff\xfe" + HEAD.encode(), "is not UTF-8"),
    ("a: " + "[" * 300 + "]" * 300, "nests deeper"),
    ("apiVersion: serving.triton-operator.io/v1alpha1\nkind: InferenceService\nmetadata: [x]\nspec: {}", "<unnamed>"),
    ("apiVersion: [1]\nkind: {a: 1}\n", "expected apiVersion"),
])
def test_hostile_input_is_one_line_never_a_traceback(command, stdin, words):
    out = subprocess.run([sys.executable, "-m", "triton_operator", command, "-f", "-"],
                         input=stdin if isinstance(stdin, bytes) else stdin.encode(), capture_output=True, timeout=60)
    err = out.stderr.decode()
    assert out.returncode == 2 and out.stdout == b"" and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and words in err, err


@pytest.mark.parametrize("spec", [
    "replicas: 1.0",                  # kubectl sends 1
    "model: {source: 'hf://a/b', format: onnx, revision: 2024-01-01}",  # a string, as kubectl reads it
    "gpu: {class: h100, fallbackClasses: null}",  # the API server drops the null
])
def test_render_accepts_what_kubectl_apply_sends(spec):
    doc = HEAD + "spec:\n  model: {source: 'hf://a/b', format: onnx}\n  gpu: {class: h100}\n  " + spec + "\n"
    out = run("render", "-f", "-", stdin=doc)
    assert out.returncode == 0, out.stderr


def test_render_reads_json_and_lists_as_kubectl_does():
    item = {"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "j"},
            "spec": {"model": {"source": "hf://a/b", "format": "onnx"}, "gpu": {"class": "h100"}, "replicas": 2.0,
                     "podAnnotations": {"example.com/note": "ready \U0001F680"}}}
    import json
    out = run("render", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [item]}))
    assert out.returncode == 0, out.stderr
    dep = next(yaml.safe_load_all(out.stdout))
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["template"]["metadata"]["annotations"]["example.com/note"] == "ready \U0001F680"


def test_replicas_flag_is_bounded_as_spec_replicas():
    out = run("render", "-f", str(EXAMPLES / "llama3-8b.yaml"), "--replicas", "2147483648")
    assert out.returncode == 2 and "between 0 and 1000" in out.stderr
