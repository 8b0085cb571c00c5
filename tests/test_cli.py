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
    assert kinds == ["Deployment", "Service", "PodDisruptionBudget", "Job"]  # the model's preparation


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
                "spec.gpu.count: gpu.count 0 (let the planner choose) needs gpu.class auto"),
    "min > max": ("spec: {model: {source: 'hf://a/b', format: onnx}, gpu: {class: h100},"
                  " autoscaling: {minReplicas: 4, maxReplicas: 2}}", "minReplicas must be less than or equal"),
    "missing class": ("spec: {model: {source: 'hf://a/b', format: onnx}, gpu: {class: x100}}",
                      "GPUClassNotFound: GPUClass x100 does not exist"),
    "int8 llm": ("spec: {model: {source: 'hf://a/b', format: tensorrt-llm, precision: int8}, gpu: {class: h100}}",
                 "precision int8 is not served by TensorRT-LLM's PyTorch backend"),
    "chatglm llm": ("spec: {model: {source: 'hf://THUDM/chatglm3-6b', format: tensorrt-llm}, gpu: {class: h100}}",
                    "serve it with format triton"),
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
    unwritable = run("crds", "--output-dir", "/proc/no-such-dir")
    assert unwritable.returncode == 2 and "Traceback" not in unwritable.stderr
    assert unwritable.stderr.strip() == "triton-operator: --output-dir /proc/no-such-dir: No such file or directory"


def test_import_contracts_hold_floors_and_a_pure_core():
    """lint-imports: the layers contract (each floor imports only from those below), the api
    package's own layers, no I/O library in the pure modules, and rendering importing none of the
    modules that decide (pyproject.toml)."""
    import shutil
    exe = shutil.which("lint-imports", path=str(__import__("pathlib").Path(sys.executable).parent))
    out = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


AUTO = """apiVersion: serving.triton-operator.io/v1alpha1
kind: InferenceService
metadata: {name: chat}
spec:
  model: {source: "hf://meta-llama/Llama-3.3-70B-Instruct", format: tensorrt-llm, parameters: 70B, precision: fp8}
  gpu: {class: auto, count: 0, maxPricePerHour: 10, maxTimePerOutputTokenMs: 30, spill: {}}
"""


def test_plan_shows_the_ranking_of_class_auto_and_why():
    out = run("plan", "-f", "-", stdin=AUTO)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[1]: line.split() for line in out.stdout.splitlines()[1:7]}
    assert rows["h100"][-1] == "chosen" and rows["h100"][2] == "1"
    assert rows["h200"][-3:] == ["5.5", "spill", "#1"]
    assert rows["l4"][8] == "TooSlow" and rows["a100-80gb"][8] == "PrecisionUnsupported"
    assert rows["b200"][8] == "OverPriceCap" and rows["gb200"][8] == "NoPrice" and rows["gb200"][-2] == "-"
    assert rows["l4"][2:5] == ["4", "1", "TP4"] and rows["h100"][7] == "6.8"   # KV_GIB/GPU: 72 - 65.2 GiB
    assert "gb200: GPUClass gb200 has no pricePerHour, so maxPricePerHour 10 cannot be checked" in out.stdout
    assert "class auto chooses 1 x h100: the cheapest where the model fits within 10.0/h and at most 30.0 ms" in out.stdout
    assert "l4: decode on 4 x l4 takes at least 58.48 ms per token" in out.stdout


def test_plan_uses_a_gpu_class_file(tmp_path):
    classes = tmp_path / "classes.yaml"
    classes.write_text(yaml.safe_dump({
        "apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "b200"},
        "spec": {"productNames": ["NVIDIA-B200"], "memoryGiB": 180, "memoryBandwidthTBps": 8,
                 "computeCapability": "10.0", "pricePerHour": 6}}))
    out = run("plan", "-f", "-", "--gpu-class-file", str(classes), stdin=AUTO)
    assert out.returncode == 0, out.stderr
    assert "class auto chooses 1 x b200" in out.stdout and "h100" not in out.stdout
    # As `kubectl get gpuclass -o yaml` writes them: one List.
    listed = tmp_path / "listed.yaml"
    listed.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [yaml.safe_load(classes.read_text())]}))
    out = run("plan", "-f", "-", "--gpu-class-file", str(listed), stdin=AUTO)
    assert out.returncode == 0 and "class auto chooses 1 x b200" in out.stdout, out.stderr
    missing = run("plan", "-f", "-", "--gpu-class-file", str(tmp_path / "nope.yaml"), stdin=AUTO)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_render_shows_one_deployment_per_class_of_a_placement():
    out = run("render", "-f", str(EXAMPLES / "llama3-8b.yaml"), "--placement", "h100=1,h200=2")
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    deps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert {n: d["spec"]["replicas"] for n, d in deps.items()} == {"llama3-8b": 1, "llama3-8b-spill-h200": 2}
    assert [d["kind"] for d in docs].count("Service") == 1 and [d["kind"] for d in docs].count("PodDisruptionBudget") == 1
    bad = run("render", "-f", str(EXAMPLES / "llama3-8b.yaml"), "--placement", "h100=one")
    assert bad.returncode == 2 and "CLASS=REPLICAS" in bad.stderr
    unusable = run("render", "-f", str(EXAMPLES / "llama3-8b.yaml"), "--placement", "a100-80gb=1")
    assert unusable.returncode == 2 and "cannot use GPU class a100-80gb (it may use h100, h200)" in unusable.stderr


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
