"""Hypothesis strategies for hostile InferenceService and GPUClass documents: mostly plausible specs
near every bound, then mutated with wrong types, negative and huge numbers, unknown fields, long
strings, unicode, nulls, deep nesting and bad names."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

INT32 = 2**31
EDGE_INTS = [0, 1, -1, 2, 52, 53, 63, 64, 65, 512, 513, 1000, 1001, 4096, INT32 - 1, INT32, 2**53, 2**63 - 1,
             2**63, 2**64, -(2**63) - 1]
EDGE_FLOATS = [0.0, 1.0, 2.0, 1.5, -1.0, 0.001, 0.01, 1e6, 1e6 + 1, 3.6e6, 1e300, 2.0**64, 5e-324]
WEIRD_TEXT = ["", " ", "ml platform", "ready \U0001F680", "\u00a0", "a\nb", "<&>", "\u2028", "Ä", "x" * 64,
              "x" * 513, "x" * 8193, "\x00", "-", "a/b/c", "Example.com/x", "tab\there",
              "team\n", "8Gi\n", "h100\n"]


def _sized(n: int) -> st.SearchStrategy[str]:
    return st.sampled_from(["x", "é", "<", "\U0001F680"]).map(lambda c: c * n)


# Text a user may write anywhere free-form: unicode (emoji included), markup, line breaks.
free_text = st.one_of(
    st.text(max_size=24),
    st.sampled_from(["ready \U0001F680", "<&>", "\u2028", "a\nb", "Ä", "\x00", "\x7f", "tab\there", "\U0001F680" * 3]),
)
texts = st.one_of(  # anything, including what no bound admits
    free_text,
    st.sampled_from(WEIRD_TEXT),
    st.integers(0, 9000).flatmap(_sized),
)
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,8}[A-Za-z0-9])?"
valid_label_keys = st.one_of(
    st.from_regex(rf"\A([a-z0-9]([-a-z0-9]{{0,6}}[a-z0-9])?(\.[a-z0-9]{{1,5}}){{0,2}}/)?{_LABEL_NAME}\Z"),
    st.sampled_from(["a" * 63, "x/" + "a" * 63, "x" * 253 + "/a", "example.com/team"]),
)
valid_label_values = st.one_of(st.from_regex(rf"\A({_LABEL_NAME})?\Z"), st.sampled_from(["a" * 63, "v1.2.3"]))
valid_quantities = st.one_of(
    st.sampled_from(["1", "2", "500m", "1000m", "0.5", "8Gi", "16Gi", "64Gi", "1e3", "1E-2", "16Ei", "10Ei", "9Ei",
                     "+1", "1.", ".5", "0", "0.0000000005"]),
    st.from_regex(r"\A[0-9]{1,4}(\.[0-9]{1,3})?(m|k|M|G|Ki|Mi|Gi|Ti|e[0-9])?\Z"),
)


def _optional(strategies: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=strategies)


def _consistent(spec: dict[str, Any]) -> dict[str, Any]:
    """A valid spec whose gpu section needs other fields gets them: class auto plans from
    model.parameters; spill needs a class to spill to; count 0 is class auto's."""
    gpu = spec["gpu"]
    if gpu["class"] == "auto":
        spec["model"].setdefault("parameters", "8B")
    elif gpu.get("count") == 0:
        gpu["count"] = 1
    if "spill" in gpu and gpu["class"] != "auto" and not gpu.get("fallbackClasses"):
        gpu["fallbackClasses"] = [c for c in ("h200", "l4") if c != gpu["class"]][:1]
    return spec


def _strategies(hostile: bool) -> dict[str, st.SearchStrategy[Any]]:
    """Strategies for the fields of a spec: valid values only, or (hostile) valid and invalid ones
    alike. A document is one or the other, so that plenty of whole specs are accepted and rendered."""

    def mostly(valid: st.SearchStrategy[Any], invalid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(valid, invalid) if hostile else valid

    label_keys = mostly(valid_label_keys, st.one_of(
        st.sampled_from(["a" * 64, "x" * 254 + "/a", "Example.com/team", "-bad", "a b", "a/b/c", "team\n", ""]), texts))
    label_values = mostly(valid_label_values, st.one_of(st.sampled_from(["a" * 64, "ml platform", "-x", "x-"]), texts))
    quantities = mostly(valid_quantities, st.sampled_from(["-1", "1e1.5", "1e100", "four", "", "1Ki1", "8Gi\n"]))
    resource_names = mostly(st.sampled_from(["cpu", "memory", "ephemeral-storage"]),
                            st.sampled_from(["nvidia.com/gpu", "hugepages-2Mi", "pods"]))


    def ints(lo: int, hi: int) -> st.SearchStrategy[int]:
        """Within [lo, hi] mostly, at the edges often, and past them sometimes."""
        return mostly(st.one_of(st.integers(lo, min(hi, lo + 70)), st.sampled_from([lo, hi])),
                      st.one_of(st.sampled_from(EDGE_INTS), st.sampled_from([lo - 1, hi + 1])))


    def numbers(lo: float, hi: float) -> st.SearchStrategy[float]:
        return mostly(st.one_of(st.floats(lo, hi), st.integers(int(lo) + 1, int(min(hi, 100)))),
                      st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(allow_nan=False)))


    class_names = mostly(st.sampled_from(["h100", "h200", "a100-80gb", "l4", "x100"]),
                         st.sampled_from(["H100", "h100!", "x" * 64, "h100\n"]))


    models = st.fixed_dictionaries(
        {
            "source": mostly(
                st.sampled_from(["hf://org/model", "hf://meta-llama/Meta-Llama-3-8B-Instruct", "s3://bucket/models/llama",
                                 "gs://b/p", "pvc://models/llama", "pvc://models", "s3://bucket/modèles/llama"]),
                st.one_of(st.sampled_from(["hf://only-org", "ftp://x/y", "hf://a/b c", "pvc://Bad/x", "s3://b/" + "x" * 2050]),
                          texts)),
            "format": mostly(st.sampled_from(["onnx", "tensorrt-llm", "pytorch", "tensorrt", "python", "triton"]),
                             st.just("gguf")),
        },
        optional={
            "parameters": mostly(
                st.one_of(st.sampled_from(["8B", "70B", "0.5B", "1.5B", "350M", "405B", "1T", "999999999999999T", "0.001K"]),
                          st.from_regex(r"\A[1-9][0-9]{0,4}(\.[0-9]{1,3})?[KMBT]\Z")),
                st.sampled_from(["0B", "0.0B", "00B", "1000000000000000B", "8 billion"])),
            "precision": mostly(st.sampled_from(["fp32", "fp16", "bf16", "fp8", "int8", "int4-awq"]), st.just("fp4")),
            "name": mostly(st.from_regex(r"\A[A-Za-z0-9_.-]{1,10}\Z"), texts),
            "revision": mostly(free_text, texts),
            "credentialsSecret": mostly(st.sampled_from(["hf-token", "s3-creds"]), st.sampled_from(["Bad_Secret", "x" * 254])),
        },
    )
    # Spill-over durations: Go durations within the bounds (after 5s-1h, returnAfter 10s-24h), at
    # the edges in other units, and what the pattern or the bounds refuse.
    durations = mostly(
        st.one_of(st.sampled_from(["5s", "5000ms", "120s", "2m", "10m", "1h", "59m60s", "0.1h", "1h30m", "1.5h",
                                   "600s", "24h", "86400s", "23h59m60s"]),
                  st.from_regex(r"\A[1-9][0-9]{1,2}(\.[0-9]{1,3})?(s|m)\Z")),
        st.one_of(st.sampled_from(["4999ms", "0.001h", "1h0.001s", "24h1ms", "25h", "2 minutes", "", "1d", "-1s",
                                   "1e3s", "123456s", "1.0001h", "h", "10", "5s\n", "1.h", ".5h", "1H", "99999h" * 6]),
                  texts))
    spills = _optional({"after": durations, "returnAfter": durations})
    limits = {"maxPricePerHour": numbers(0.01, 64_000_000), "maxTimePerOutputTokenMs": numbers(0.01, 3_600_000)}
    fixed_gpus = st.fixed_dictionaries(
        {"class": class_names},
        optional={"count": ints(1, 8), "fallbackClasses": st.lists(class_names, max_size=3, unique=True),
                  "spill": spills, **limits},
    )
    # gpu.class auto: the planner chooses the class (and with count 0 the GPU count).
    auto_gpus = st.fixed_dictionaries(
        {"class": st.just("auto")},
        optional={"count": ints(0, 8), "spill": spills, **limits,
                  **({"fallbackClasses": st.lists(class_names, min_size=1, max_size=2, unique=True)} if hostile else {})},
    )
    gpus = st.one_of(fixed_gpus, auto_gpus)
    env_vars = st.fixed_dictionaries(
        {"name": mostly(st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,5}\Z"), st.sampled_from(["1BAD", "x" * 129, "A B"]))},
        optional={"value": mostly(free_text, texts)},
    )
    servers = _optional({
        "image": mostly(st.sampled_from(["nvcr.io/nvidia/tritonserver:25.01-py3", "registry:5000/a/b@sha256:" + "a" * 64]),
                        st.one_of(st.sampled_from(["img ", "img\u00a0", "x" * 513]), texts)),
        "imagePullPolicy": mostly(st.sampled_from(["Always", "IfNotPresent", "Never"]), st.just("Sometimes")),
        "resources": _optional({
            "requests": st.dictionaries(resource_names, quantities, max_size=3),
            "limits": st.dictionaries(resource_names, quantities, max_size=3),
        }),
        "args": mostly(st.lists(free_text, max_size=6), st.lists(texts, max_size=66)),
        "env": mostly(st.lists(env_vars, max_size=6, unique_by=lambda e: e["name"]), st.lists(env_vars, max_size=66)),
        "shmSize": quantities,
        "startupTimeoutSeconds": ints(60, 86400),
    })
    engines = _optional({
        "cacheClaim": mostly(st.just("trtllm-engines"), st.sampled_from(["Bad", "x" * 254])),
        "maxBatchSize": ints(1, 4096), "maxInputLen": ints(1, 2**31 - 1), "maxSeqLen": ints(2, 2**31 - 1),
        "maxNumTokens": ints(1, 2**31 - 1), "streaming": st.booleans(),
    })
    specs = st.fixed_dictionaries(
        {"model": models, "gpu": gpus},
        optional={
            "replicas": ints(0, 1000),
            "autoscaling": st.fixed_dictionaries({"maxReplicas": ints(1, 1000)}, optional={
                "minReplicas": ints(0, 1000), "targetQueueDepth": numbers(0.01, 1e6),
                "targetP99LatencyMs": numbers(1, 3.6e6), "scaleDownStabilizationSeconds": ints(0, 3600),
                "scaleDownMaxStep": ints(1, 1000), "tolerance": numbers(0, 1),
                "scaleToZeroAfterSeconds": ints(30, 86400)}),
            "openai": _optional({"enabled": st.booleans(), "defaultMaxTokens": ints(1, 1_000_000),
                                 "model": mostly(st.just("ensemble"), st.sampled_from(["bad name", "x" * 129])),
                                 "chatTemplate": free_text}),
            "server": servers,
            "rollout": _optional({"maxSurge": ints(0, 2**31 - 1), "maxUnavailable": ints(0, 2**31 - 1)}),
            "engine": engines,
            "serviceAccountName": mostly(st.just("default"), st.sampled_from(["Bad", "x" * 254])),
            "podLabels": mostly(st.dictionaries(label_keys, label_values, max_size=6),
                                st.dictionaries(label_keys, label_values, min_size=60, max_size=66)),
            "podAnnotations": mostly(st.dictionaries(label_keys, free_text, max_size=6),
                                     st.dictionaries(label_keys, texts, max_size=66)),
        },
    )
    if not hostile:
        specs = specs.map(_consistent)
    names = mostly(
        st.one_of(st.sampled_from(["demo", "llama3-8b", "a" * 52, "auto"]), st.from_regex(r"\A[a-z]([-a-z0-9]{0,10}[a-z0-9])?\Z")),
        st.sampled_from(["a" * 53, "8b-llama", "llama.v3", "Demo", "-x", "x-", "demo\n", ""]),
    )

    return {"specs": specs, "names": names, "label_keys": label_keys, "label_values": label_values}


VALID, HOSTILE = _strategies(False), _strategies(True)
label_keys, label_values = HOSTILE["label_keys"], HOSTILE["label_values"]


# --- hostile values, and mutations that put them anywhere ---------------------------------

def _nested(depth: int) -> Any:
    value: Any = "deep"
    for i in range(depth):
        value = [value] if i % 2 else {"n": value}
    return value


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from(EDGE_INTS), st.floats(allow_nan=False),
    st.sampled_from(EDGE_FLOATS + [float("inf"), float("nan")]), texts,
)
hostile_values = st.one_of(
    st.recursive(scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
                 max_leaves=8),
    st.integers(20, 90).map(_nested),
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with 1-3 hostile changes: replace a value, add an unknown field, drop a field."""
    spec = copy.deepcopy(spec)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(spec) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = spec
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "replace", "unknown", "drop"]))
        if action == "replace":
            parent[path[-1]] = draw(hostile_values)
        elif action == "unknown" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "Replicas", "gpuClass", "x-y"]))] = draw(hostile_values)
        elif isinstance(parent, dict):
            del parent[path[-1]]
    return spec


@st.composite
def inference_services(draw: st.DrawFn) -> dict[str, Any]:
    chosen = HOSTILE if draw(st.integers(0, 2)) == 0 else VALID
    spec = draw(chosen["specs"])
    if chosen is HOSTILE and draw(st.booleans()):
        spec = draw(mutated(spec))
    return {"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": draw(chosen["names"]), "namespace": "ml"}, "spec": spec}


small_ints = st.one_of(st.integers(-2, 70), st.sampled_from(EDGE_INTS))
positive_floats = st.one_of(st.floats(0, 2e6, allow_nan=False), st.sampled_from(EDGE_FLOATS), st.integers(0, 10))
tolerations = _optional({
    "key": st.sampled_from(["nvidia.com/gpu", "", "a b", "x" * 254 + "/k"]),
    "operator": st.sampled_from(["Exists", "Equal", "Gt"]),
    "value": st.sampled_from(["present", "", "a b", "x" * 64]),
    "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute", "Never"]),
    "tolerationSeconds": small_ints,
})
gpu_class_specs = st.fixed_dictionaries(
    {"memoryGiB": positive_floats, "memoryBandwidthTBps": positive_floats,
     "computeCapability": st.sampled_from(["9.0", "8.9", "8.0", "9", "x.y", "10.10"])},
    optional={
        "displayName": texts,
        "resourceName": st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "gpu", "kubernetes.io/gpu",
                                         "a./b", "example.com/" + "x" * 64]),
        "productLabel": label_keys,
        "productNames": st.lists(label_values, max_size=33),
        "nodeSelector": st.dictionaries(label_keys, label_values, max_size=33),
        "tolerations": st.lists(tolerations, max_size=17),
        "gpusPerNode": small_ints,
        "pricePerHour": positive_floats,
        "spareGPUs": st.booleans(),
    },
)


@st.composite
def gpu_classes(draw: st.DrawFn) -> dict[str, Any]:
    spec = draw(gpu_class_specs)
    if draw(st.booleans()):
        spec = draw(mutated(spec))
    return {"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "GPUClass",
            "metadata": {"name": draw(HOSTILE["names"])}, "spec": spec}
