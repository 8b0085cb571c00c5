"""Generate the CustomResourceDefinitions from the pydantic models in `api`.

Pydantic emits JSON Schema with $refs, titles and anyOf-null for optionals; Kubernetes wants a
structural OpenAPI v3 schema: everything inlined, one type per node, no nulls. This module does
that translation and adds what only Kubernetes knows about (CEL rules, list types, subresources,
printer columns).
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from . import api

KEEP = {
    "description", "default", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "pattern", "enum", "maxLength", "minLength", "maxItems", "minItems", "maxProperties", "format",
    "x-kubernetes-validations", "x-kubernetes-int-or-string", "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
}

# The API server's schema check takes 1.0 for an integer and stores it as 1, but a CEL rule that
# reads the field then fails with "invalid data, expected int, got float64" reported on the
# object holding the rule, which names no field. A rule on every integer field itself reads it
# first, so such a value is refused everywhere alike, on the field's own path (and kubectl, which
# sends 1.0 in YAML as 1, is never affected). The models refuse floats in integer fields too.
INTEGER_RULE = api.cel("type(self) == int", "must be an integer (a whole number written without a decimal point)")


def _structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = dict(defs[node["$ref"].split("/")[-1]])
        # A field's own description and default win over the referenced model's.
        for key in ("description", "default"):
            if key in node:
                target[key] = node[key]
        return _structural(target, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {node['anyOf']} structurally")
        merged = {**options[0], **{k: v for k, v in node.items() if k not in ("anyOf", "default")}}
        if node.get("default") is not None:
            merged["default"] = node["default"]
        return _structural(merged, defs)

    # Deep copies: pydantic shares rule dicts between fields, and YAML would print them as aliases.
    out: dict[str, Any] = {k: copy.deepcopy(v) for k, v in node.items() if k in KEEP}
    # JSON Schema 2020-12 (pydantic) puts the bound in exclusiveMinimum; OpenAPI v3.0 (Kubernetes)
    # wants minimum plus a boolean.
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), (int, float)) and not isinstance(out[bound], bool):
            out[plain], out[bound] = out[bound], True
    if "const" in node:
        out["enum"] = [node["const"]]
    kind = node.get("type")
    if kind is not None:
        out["type"] = kind
    if kind == "object" or "properties" in node:
        out["type"] = "object"
        props = node.get("properties", {})
        if props:
            out["properties"] = {k: _structural(v, defs) for k, v in props.items()}
            required = [r for r in node.get("required", []) if r in props]
            if required:
                out["required"] = required
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            out["additionalProperties"] = _structural(extra, defs)
        elif not props:
            out["x-kubernetes-preserve-unknown-fields"] = True
    if kind == "array":
        out["items"] = _structural(node.get("items", {}), defs)
    if kind == "integer":
        out["x-kubernetes-validations"] = [dict(INTEGER_RULE), *out.get("x-kubernetes-validations", [])]
    if kind == "number" and out.get("default") is not None and float(out["default"]).is_integer():
        out["default"] = int(out["default"]) if isinstance(out["default"], float) else out["default"]
    return out


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}))


# A rule's fieldPath cannot point into metadata (the CRD schema does not describe it), so the
# name rules say the field in their message.
def _top_level(spec_model: type[BaseModel], status_model: type[BaseModel] | None,
               description: str, *name_rules: dict[str, str]) -> dict[str, Any]:
    spec = schema_of(spec_model)
    props: dict[str, Any] = {
        "apiVersion": {"type": "string", "description": "APIVersion of this object."},
        "kind": {"type": "string", "description": "Kind of this object."},
        "metadata": {"type": "object"},
        "spec": spec,
    }
    if status_model is not None:
        props["status"] = schema_of(status_model)
    return {
        "type": "object", "description": description, "required": ["spec"], "properties": props,
        "x-kubernetes-validations": list(name_rules),
    }


def _conditions_as_map(status: dict[str, Any]) -> None:
    conds = status["properties"]["conditions"]
    conds["x-kubernetes-list-type"] = "map"
    conds["x-kubernetes-list-map-keys"] = ["type"]
    item = conds["items"]
    item["properties"]["lastTransitionTime"]["format"] = "date-time"


def inference_service_crd() -> dict[str, Any]:
    schema = _top_level(
        api.InferenceServiceSpec, api.InferenceServiceStatus,
        "InferenceService serves a model with Triton Inference Server on a class of GPUs.",
        api.cel(f"size(self.metadata.name) <= 52 && self.metadata.name.matches('{api.DNS_1035_LABEL}')",
                f"metadata.name must be {api.SERVICE_NAME_RULES}"),
        api.cel(api.MODEL_NAME_RULE, api.RESERVED_SERVICE_MESSAGE),
    )
    _conditions_as_map(schema["properties"]["status"])
    columns = [
        {"name": "GPU", "type": "string", "jsonPath": ".status.gpuClass", "description": "GPUClass in use"},
        {"name": "Desired", "type": "integer", "jsonPath": ".status.replicas", "description": "Replicas asked for"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas", "description": "Replicas ready to serve"},
        {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodesPerReplica",
         "description": "Nodes each replica spans (more than 1: a LeaderWorkerSet group)"},
        {"name": "Classes", "type": "string", "jsonPath": ".status.replicasByClass",
         "description": "Ready/desired replicas per GPU class (spill-over)"},
        {"name": "Queue", "type": "number", "jsonPath": ".status.metrics.queueDepth", "description": "Queue depth per replica"},
        {"name": "P99ms", "type": "number", "jsonPath": ".status.metrics.p99LatencyMs", "description": "p99 latency (ms)"},
        {"name": "SLO", "type": "number", "jsonPath": ".status.metrics.sloAttainment",
         "description": "Share of the last 10 minutes' requests within the latency target"},
        {"name": "Status", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status", "description": "Ready condition"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason", "description": "Why: Serving, Loading, ScaledToZero, Waking, ..."},
        {"name": "Zero", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"ScaledToZero\")].status", "priority": 1, "description": "Scaled to zero (minReplicas 0 only)"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return _crd(
        kind="InferenceService", plural="inferenceservices", singular="inferenceservice",
        short=["infsvc"], scope="Namespaced", schema=schema, columns=columns,
        subresources={
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        },
    )


def gpu_class_crd() -> dict[str, Any]:
    schema = _top_level(
        api.GPUClassSpec, None,
        "GPUClass maps a class of GPUs (h100, l4, ...) to the nodes that carry it and the figures used to plan on it.",
        api.cel(f"size(self.metadata.name) <= 63 && self.metadata.name.matches('{api.DNS_LABEL}')",
                "metadata.name must be a DNS label (lowercase letters, digits, '-') of at most 63 characters, "
                "as spec.gpu.class refers to it"),
        api.cel(f"self.metadata.name != '{api.AUTO_CLASS}'", api.AUTO_RESERVED_MESSAGE),
    )
    columns = [
        {"name": "Display", "type": "string", "jsonPath": ".spec.displayName"},
        {"name": "Memory-GiB", "type": "number", "jsonPath": ".spec.memoryGiB"},
        {"name": "TB/s", "type": "number", "jsonPath": ".spec.memoryBandwidthTBps"},
        {"name": "CC", "type": "string", "jsonPath": ".spec.computeCapability"},
        {"name": "Price/h", "type": "number", "jsonPath": ".spec.pricePerHour"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return _crd(kind="GPUClass", plural="gpuclasses", singular="gpuclass", short=["gpuclass"],
                scope="Cluster", schema=schema, columns=columns, subresources=None)


def _crd(*, kind: str, plural: str, singular: str, short: list[str], scope: str,
         schema: dict[str, Any], columns: list[dict[str, Any]],
         subresources: dict[str, Any] | None) -> dict[str, Any]:
    version: dict[str, Any] = {
        "name": api.VERSION, "served": True, "storage": True,
        "schema": {"openAPIV3Schema": schema},
        "additionalPrinterColumns": columns,
    }
    if subresources:
        version["subresources"] = subresources
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{api.GROUP}",
            "labels": {"app.kubernetes.io/name": "triton-operator", "app.kubernetes.io/part-of": "triton-operator"},
        },
        "spec": {
            "group": api.GROUP,
            "scope": scope,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": singular,
                      "shortNames": short, "categories": ["inference"]},
            "versions": [version],
        },
    }


def all_crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD, as committed in crds/."""
    return {
        f"{api.GROUP}_inferenceservices.yaml": inference_service_crd(),
        f"{api.GROUP}_gpuclasses.yaml": gpu_class_crd(),
    }
