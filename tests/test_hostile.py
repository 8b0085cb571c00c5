"""Property suite: hostile specs (tests/hostile.py) through the models, the generated CRD (its
OpenAPI schema and CEL rules, as tests/crd_admission.py evaluates them), `render`, `plan` and the CLI.

- The models and the CRD agree: one accepts exactly what the other accepts.
- Nothing raises but our own errors (ValidationError, RenderError), and the CLI answers in one line.
- Whatever is accepted renders children Kubernetes accepts (label and annotation syntax and sizes,
  int32 fields, request <= limit, unique env names) and of bounded size.

The examples are the same on every run (derandomized), so `make unit` is reproducible; run
`HYPOTHESIS_PROFILE=explore make unit` to search with fresh random examples for longer.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
from typing import Any

from hypothesis import HealthCheck, given, settings
from pydantic import ValidationError

from triton_operator import cli, crdgen, kubeyaml
from triton_operator.planning import fit
from triton_operator.planning.assign import assign
from triton_operator.api import DURATION_MAX_LENGTH, GPUClass, InferenceService, describe_validation_error
from triton_operator.quantity import parse_quantity
from triton_operator.render import group
from triton_operator.render import RenderError, dump, render
from triton_operator.settings import Settings

from .conftest import EXAMPLES, load
from .crd_admission import Admission
from .hostile import gpu_classes, inference_services

settings.register_profile("unit", max_examples=1000, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("explore", max_examples=20000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "unit"))

ISVC_ADMISSION = Admission(crdgen.inference_service_crd())
GPUCLASS_ADMISSION = Admission(crdgen.gpu_class_crd())
CLASSES = {c.name: c for c in (GPUClass.model_validate(d) for d in load(EXAMPLES / "gpuclasses.yaml"))}
SETTINGS = Settings()
# etcd refuses objects over 1.5 MiB; rendered children stay well under it.
MAX_CHILD_BYTES = 1024 * 1024
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


# --- what Kubernetes refuses in a child, written from its validation code (v1.36) -----------

_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _is_qualified_name(key: str) -> bool:  # validation.IsQualifiedName
    parts = key.split("/")
    if len(parts) > 2:
        return False
    if len(parts) == 2 and not (0 < len(parts[0]) <= 253 and _SUBDOMAIN.fullmatch(parts[0])):
        return False
    return 0 < len(parts[-1]) <= 63 and bool(_NAME.fullmatch(parts[-1]))


def _check_labels(labels: dict[str, str], where: str) -> None:
    for k, v in labels.items():
        assert _is_qualified_name(k), f"{where}: label key {k!r}"
        assert len(v) <= 63 and (v == "" or _NAME.fullmatch(v)), f"{where}: label value {v!r}"


def _check_annotations(annotations: dict[str, str], where: str) -> None:
    for k in annotations:
        assert _is_qualified_name(k.lower()), f"{where}: annotation key {k!r}"
    total = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    assert total <= 256 * 1024, f"{where}: annotations of {total} bytes"


def _check_ints(node: Any, where: str) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k not in ("tolerationSeconds", "activeDeadlineSeconds"):  # int64 fields
                _check_ints(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_ints(v, f"{where}[{i}]")
    elif isinstance(node, int) and not isinstance(node, bool):
        assert INT32_MIN <= node <= INT32_MAX, f"{where}: {node} is not an int32"


def _check_pod(pod: dict[str, Any], where: str) -> None:
    _check_labels(pod["metadata"].get("labels") or {}, f"{where}.metadata.labels")
    _check_annotations(pod["metadata"].get("annotations") or {}, f"{where}.metadata.annotations")
    spec = pod["spec"]
    _check_labels(spec.get("nodeSelector") or {}, f"{where}.spec.nodeSelector")
    for container in spec.get("initContainers", []) + spec["containers"]:
        image = container["image"]
        assert image and image == image.strip(), f"{where}: image {image!r}"
        names = [e["name"] for e in container.get("env", [])]
        assert len(names) == len(set(names)), f"{where}: env names {names}"
        requests = container.get("resources", {}).get("requests", {})
        limits = container.get("resources", {}).get("limits", {})
        for name, request in requests.items():
            assert parse_quantity(request) >= 0
            if name in limits:
                assert parse_quantity(request) <= parse_quantity(limits[name]), f"{where}: {name} {request} > {limits[name]}"


def check_children(manifests: list[dict[str, Any]]) -> None:
    for m in manifests:
        where = f"{m['kind']} {m['metadata']['name']}"
        assert len(m["metadata"]["name"]) <= 63, where
        _check_labels(m["metadata"].get("labels") or {}, f"{where}.metadata.labels")
        _check_ints(m, where)
        size = len(json.dumps(m).encode())
        assert size <= MAX_CHILD_BYTES, f"{where} is {size} bytes"
        if m["kind"] in ("Deployment", "Job"):
            _check_labels(m["spec"].get("selector", {}).get("matchLabels") or {}, f"{where}.spec.selector")
            _check_pod(m["spec"]["template"], f"{where}.spec.template")
        if m["kind"] == "LeaderWorkerSet":
            # its groups' StatefulSets are named <name>-<group>, and a StatefulSet's name must leave
            # room in 63 characters for its revision hash label (52 at most)
            assert len(m["metadata"]["name"]) <= group.MAX_NAME, where
            for role in ("leaderTemplate", "workerTemplate"):
                _check_pod(m["spec"]["leaderWorkerTemplate"][role], f"{where}.spec.leaderWorkerTemplate.{role}")


# --- the properties ----------------------------------------------------------------------

def _validate(model: type[InferenceService] | type[GPUClass], doc: dict[str, Any]) -> tuple[Any, list[str]]:
    try:
        return model.model_validate(doc), []
    except ValidationError as e:
        messages = [describe_validation_error(err) for err in e.errors()]
        assert all("\n" not in m for m in messages), messages
        return None, messages


@given(inference_services())
def test_inference_services_models_crd_and_render_agree(doc):
    obj, errors = _validate(InferenceService, doc)
    refusals = ISVC_ADMISSION.refusals(doc)
    assert (obj is not None) == (not refusals), f"models: {errors or 'accepted'}; CRD: {refusals or 'accepted'}"
    if obj is None:
        return
    for name, gpu_class in CLASSES.items():  # plan on every class: no division by zero, no overflow
        fit.fit(obj.spec.model, gpu_class.spec, obj.spec.gpu.count)
        fit.problems(obj.spec.model, name, gpu_class.spec, obj.spec.gpu.count)
    try:
        rendered = render(obj, CLASSES, SETTINGS, assign(obj, CLASSES))
    except RenderError:
        return
    check_children(rendered.manifests)
    check_values_arrive_intact(obj, next(m for m in rendered.manifests if m["kind"] in ("Deployment", "LeaderWorkerSet")))


def check_values_arrive_intact(obj: InferenceService, workload: dict[str, Any]) -> None:
    """What the user wrote reaches the pod unchanged (no mangled emoji, no lost character); across
    nodes, the leader's (Triton's) pod."""
    spec = workload["spec"]
    template = spec["template"] if "template" in spec else spec["leaderWorkerTemplate"]["leaderTemplate"]
    triton = template["spec"]["containers"][0]
    ours = {"prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path", "serving.triton-operator.io/model"}
    for key, value in obj.spec.pod_annotations.items():
        if key not in ours:
            assert template["metadata"]["annotations"][key] == value, key
    for e in obj.spec.server.env:
        assert {"name": e.name, "value": e.value} in triton.get("env", []), e.name
    assert triton["args"][len(triton["args"]) - len(obj.spec.server.args):] == obj.spec.server.args


@given(gpu_classes())
def test_gpu_classes_models_crd_and_render_agree(doc):
    obj, errors = _validate(GPUClass, doc)
    refusals = GPUCLASS_ADMISSION.refusals(doc)
    assert (obj is not None) == (not refusals), f"models: {errors or 'accepted'}; CRD: {refusals or 'accepted'}"
    if obj is None:
        return
    isvc = InferenceService.model_validate({
        "metadata": {"name": "probe", "namespace": "ml"},
        "spec": {"model": {"source": "hf://org/model", "format": "tensorrt-llm", "parameters": "8B"},
                 "gpu": {"class": obj.name}}})
    try:
        rendered = render(isvc, {obj.name: obj}, SETTINGS, assign(isvc, {obj.name: obj}))
    except RenderError:
        return
    check_children(rendered.manifests)


def run_cli(args: list[str], stdin: bytes) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    real_stdin = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(args)
    finally:
        sys.stdin = real_stdin
    return code, out.getvalue(), err.getvalue()


@settings(max_examples=150)
@given(inference_services())
def test_render_and_plan_answer_in_one_line(doc):
    """The CLI reads the file as kubectl would (integral floats become integers, ...) and then
    agrees with the models; a refusal is one line on stderr and nothing on stdout."""
    text = json.dumps(doc, ensure_ascii=False)
    try:
        sent = kubeyaml.load_all(text)[0]  # what kubectl would send
    except kubeyaml.KubeYAMLError:  # nested too deeply (how deep depends on the stack left here)
        sent = None
    obj = _validate(InferenceService, sent)[0] if sent is not None else None
    for command in ("render", "plan"):
        code, out, err = run_cli([command, "-f", "-"], text.encode())
        assert "Traceback" not in err and code in (0, 1, 2), err
        if code:
            assert out == "" and len(err.strip().splitlines()) == 1, err
        if obj is None:
            assert code == 2, (command, err)
        elif command == "render" and code == 0:
            assert [m["kind"] for m in kubeyaml.load_all(out)][:3] == ["Deployment", "Service", "PodDisruptionBudget"]


def test_the_largest_spec_fits_the_budget():
    """Every bound of InferenceServiceSpec at its maximum, in the characters JSON escapes most
    (api/spec.py states the arithmetic): admitted by both, under 1.16 MiB, and its children fit etcd."""
    esc = "\x01"  # JSON writes it as \\u0001: 6 bytes for one character
    spec = {
        "model": {"source": "s3://b/" + esc * 2041, "format": "tensorrt-llm", "name": "n" * 128, "revision": esc * 128,
                  "parameters": "1." + "0" * 13 + "K", "precision": "fp8", "credentialsSecret": "s" * 253},
        "gpu": {"class": "h100", "fallbackClasses": [f"{i}" + "c" * 62 for i in range(8)],
                "spill": {"after": "0.001h" * 5 + "9s", "returnAfter": "1.001h" * 5 + "9m"},  # 27 s, 5.155 h
                "maxPricePerHour": 2.2250738585072014e-308, "maxTimePerOutputTokenMs": 2.2250738585072014e-308},
        "server": {
            "shmSize": "9" * 30 + "Mi",  # (no image: tensorrt-llm runs the runtime image, and has an engine)
            "resources": {"requests": {"cpu": "1", "memory": "1", "ephemeral-storage": "1"},
                          "limits": {"cpu": "9" * 32, "memory": "9" * 32, "ephemeral-storage": "9" * 32}},
            "args": [esc * 512] * 64,
            "env": [{"name": f"E{i:03d}" + "E" * 124, "value": esc * 384} for i in range(64)],
        },
        "engine": {"cacheClaim": "e" * 253, "calibrationDataset": "s3://b/" + esc * 2041,
                   "buildResources": {"requests": {"cpu": "1", "memory": "1", "ephemeral-storage": "1"},
                                      "limits": {"cpu": "9" * 32, "memory": "9" * 32, "ephemeral-storage": "9" * 32}}},
        "openai": {"enabled": True, "model": "m" * 128, "chatTemplate": esc * 65536, "defaultMaxTokens": 1_000_000},
        "serviceAccountName": "a" * 253,
        "imagePullSecrets": [f"{i:02d}" + "s" * 251 for i in range(16)],
        "podLabels": {f"{'p' * 63}.{'p' * 63}.{'p' * 63}.{'p' * 59}{i:02d}/{'n' * 63}": "v" * 63 for i in range(64)},
        "podAnnotations": {f"a{i:02d}": esc * 509 for i in range(64)},
    }
    doc = {"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x" * 52, "namespace": "ml"}, "spec": spec}
    assert all(len(v) == DURATION_MAX_LENGTH for v in spec["gpu"]["spill"].values())
    obj = InferenceService.model_validate(doc)
    assert ISVC_ADMISSION.refusals(doc) == []
    size = len(json.dumps(spec).encode())
    assert 900_000 < size <= 1_211_740, size  # the bound api/spec.py states; fields with a pattern stay ASCII
    check_children(render(obj, CLASSES, SETTINGS, assign(obj, CLASSES)).manifests)
    assert len(dump(render(obj, CLASSES, SETTINGS, assign(obj, CLASSES)).manifests)) < 1536 * 1024
