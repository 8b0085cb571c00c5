"""The CRDs in crds/ are generated from the models and carry what kubectl and the API server need."""

from __future__ import annotations


import yaml

from triton_operator import crdgen
from triton_operator.render import dump

from .conftest import ROOT


def test_committed_crds_match_the_models():
    """Fails when someone edits the models without running `make crds` (or edits crds/ by hand)."""
    generated = crdgen.all_crds()
    committed = {p.name for p in (ROOT / "crds").glob("*.yaml")}
    assert committed == set(generated), "crds/ holds other files than the generator writes"
    for filename, crd in generated.items():
        assert (ROOT / "crds" / filename).read_text() == dump([crd]), f"crds/{filename} is stale: run make crds"


def _walk(node, path="$"):
    yield path, node
    for key, child in (node.get("properties") or {}).items():
        yield from _walk(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schemas_are_structural_and_documented():
    for crd in crdgen.all_crds().values():
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
            assert node.get("type") or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
            assert "default" not in node or node["default"] is not None, path
            if isinstance(node.get("exclusiveMinimum"), bool):
                assert "minimum" in node, path
        for path, node in _walk(schema["properties"]["spec"]):
            if path.endswith(("[]", "{}")):  # list items and map values are described by their field
                continue
            assert node.get("description"), f"{path} has no description for kubectl explain"


def test_inference_service_crd_has_subresources_columns_and_rules():
    crd = crdgen.inference_service_crd()
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["infsvc"] and names["categories"] == ["inference"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}
    assert "status" in version["subresources"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["GPU"] == ".status.gpuClass"
    assert columns["Queue"] == ".status.metrics.queueDepth"
    assert columns["P99ms"] == ".status.metrics.p99LatencyMs"
    assert columns["Status"].startswith(".status.conditions[?(@.type==\"Ready\")]")
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    rules = [r["rule"] for r in spec["autoscaling"]["x-kubernetes-validations"]]
    assert "self.minReplicas <= self.maxReplicas" in rules
    assert spec["gpu"]["properties"]["count"]["minimum"] == 0  # 0 = the planner chooses (class auto; CEL)
    assert columns["Classes"] == ".status.replicasByClass"
    conditions = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_gpu_class_crd_is_cluster_scoped():
    crd = crdgen.gpu_class_crd()
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["shortNames"] == ["gpuclass"]
    required = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["required"]
    assert set(required) == {"memoryGiB", "memoryBandwidthTBps", "computeCapability"}


def test_builtin_catalog_is_the_example_catalog():
    packaged = ROOT / "operator" / "triton_operator" / "catalog" / "gpuclasses.yaml"
    assert packaged.read_text() == (ROOT / "examples" / "gpuclasses.yaml").read_text()
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(packaged.read_text())] == \
        ["h100", "h200", "a100-80gb", "l4", "b200", "gb200"]


def test_bounds_are_integers_the_api_server_can_read():
    """The API server reads a schema's minimum and maximum as float64 and refuses every object
    once a bound on an integer field is beyond 2^53 ("Maximum boundary value must be of type
    integer"), as tolerationSeconds <= 2^63-1 once did. Every integer field also carries the
    rule that refuses 1.0 on its own path (crdgen.INTEGER_RULE)."""
    for crd in crdgen.all_crds().values():
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            for bound in ("minimum", "maximum"):
                if bound in node:
                    assert abs(node[bound]) <= 2**53, f"{path}.{bound}"
            if node.get("type") == "integer":
                assert crdgen.INTEGER_RULE in node["x-kubernetes-validations"], path


def test_inference_service_crd_refuses_what_children_would_refuse():
    spec = crdgen.inference_service_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    env = spec["properties"]["server"]["properties"]["env"]
    assert env["x-kubernetes-list-type"] == "map" and env["x-kubernetes-list-map-keys"] == ["name"]
    labels = spec["properties"]["podLabels"]
    assert labels["maxProperties"] == 64 and labels["additionalProperties"]["maxLength"] == 63
    assert any("matches" in r["rule"] for r in labels["x-kubernetes-validations"])
    annotations = spec["properties"]["podAnnotations"]
    assert any(".sum() <= 32768" in r["rule"] for r in annotations["x-kubernetes-validations"])
    assert spec["properties"]["rollout"]["properties"]["maxSurge"]["maximum"] == 2**31 - 1
    resources = spec["properties"]["server"]["properties"]["resources"]
    assert any("quantity(" in r["rule"] for r in resources["x-kubernetes-validations"])
