"""spec.routing.inferencePool: the InferencePool (Gateway API Inference Extension) rendered for a
service, the engine label on its pods, the pool deleted when the field is taken out, and a
cluster without the pool's CRD told so once while the service is rendered without it. The pool
on the real API server, with the upstream CRD, is in e2e/test_inference_pool.py.

Stands in for the API server (no cluster in the unit suite): tests/test_controller_core.py's
_ApiServer, through _reconciler_for."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from triton_operator.controller.desired import Children, desired_state, stamped
from triton_operator.planning.assign import assign
from triton_operator.render import render
from triton_operator.settings import Settings

from .conftest import isvc, isvc_doc
from .test_controller_core import _reconciler_for

LLM = {"source": "hf://a/b", "format": "tensorrt-llm", "parameters": "8B", "precision": "fp8"}
POOL = {"endpointPicker": {"name": "chat-epp"}}


def test_the_pool_selects_the_serving_pods_on_tritons_http_port_and_names_its_endpoint_picker(classes):
    svc = isvc(model=LLM, routing={"policy": "prefix", "inferencePool": {
        "endpointPicker": {"name": "chat-epp", "port": 9003, "failureMode": "FailOpen"}}})
    out = render(svc, classes, Settings(), assign(svc, classes))
    pool = out.by_kind("InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["metadata"]["name"] == "demo" and pool["metadata"]["namespace"] == "ml"
    assert pool["metadata"]["ownerReferences"][0]["uid"] == "1234-abcd"
    assert pool["spec"] == {
        "selector": {"matchLabels": out.by_kind("Service")["spec"]["selector"]},
        "targetPorts": [{"number": 8000}], "appProtocol": "http",
        "endpointPickerRef": {"group": "", "kind": "Service", "name": "chat-epp", "port": {"number": 9003},
                              "failureMode": "FailOpen"}}
    pod_labels = out.by_kind("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["inference.networking.k8s.io/engine-type"] == "triton-tensorrt-llm"
    # selected by the pool: every label it asks for is on the pods
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_defaults_and_no_pool_without_the_field(classes):
    svc = isvc(model=LLM, routing={"inferencePool": POOL})
    ref = render(svc, classes, Settings(), assign(svc, classes)).by_kind("InferencePool")["spec"]["endpointPickerRef"]
    assert ref["port"] == {"number": 9002} and ref["failureMode"] == "FailClose"
    service = isvc(model=LLM, routing={"policy": "prefix"})
    plain = render(service, classes, Settings(), assign(service, classes))
    assert not [m for m in plain.manifests if m["kind"] == "InferencePool"]
    labels = plain.by_kind("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert "inference.networking.k8s.io/engine-type" not in labels


def test_a_pool_for_a_model_that_is_not_an_llm_is_refused():
    with pytest.raises(ValidationError, match="routing.inferencePool needs model.format tensorrt-llm"):
        isvc(routing={"inferencePool": POOL})
    with pytest.raises(ValidationError, match="name"):
        isvc(model=LLM, routing={"inferencePool": {"endpointPicker": {"name": "Not_A_Service"}}})


def test_a_pool_no_longer_asked_for_is_deleted(classes):
    service = isvc(model=LLM, routing={"inferencePool": POOL})
    with_pool = stamped(render(service, classes, Settings(), assign(service, classes))
                        .by_kind("InferencePool"))
    live = {**with_pool, "metadata": {**with_pool["metadata"], "uid": "p1", "resourceVersion": "7"}}
    p = desired_state(isvc(model=LLM), classes, Settings(), Children(inference_pool=live), replicas=1)
    assert ("inference.networking.k8s.io/v1", "InferencePool", "demo") in p.delete
    kept = desired_state(isvc(model=LLM, routing={"inferencePool": POOL}), classes, Settings(),
                Children(inference_pool=live), replicas=1)
    assert not [d for d in kept.delete if d[1] == "InferencePool"]
    assert not [m for m in kept.apply if m["kind"] == "InferencePool"], "in place: not written again"


def _pool_service(classes, pools_ready):
    return _reconciler_for(classes, isvc_doc(model=LLM, routing={"inferencePool": POOL}),
                           pools_ready=lambda: pools_ready[0])


def test_without_the_pools_crd_the_service_is_rendered_without_it_and_told_once(classes):
    ready = [False]
    api, r, later = _pool_service(classes, ready)
    r.reconcile(("ml", "demo"))
    assert ("Deployment", "demo") in api.applied and ("Service", "demo") in api.applied
    assert not [a for a in api.applied if a[0] == "InferencePool"]
    (warning,) = [e for e in api.events if e.reason == "InferencePoolNotInstalled"]
    assert warning.type == "Warning" and "install the Gateway API Inference Extension's CRDs" in warning.message
    assert (("ml", "demo"), 60.0) in later
    r.reconcile(("ml", "demo"))                       # the next look: still missing, said once
    assert len([e for e in api.events if e.reason == "InferencePoolNotInstalled"]) == 1
    ready[0] = True                                   # the CRD installed: the pool is written ...
    r.reconcile(("ml", "demo"))
    assert not [a for a in api.applied if a[0] == "InferencePool"], "... at the look a minute after, not before"
    key = ("ml", "demo")
    r._converged[key] = replace(r._converged[key], retry_at=0.0)      # that minute has passed
    r.reconcile(key)
    assert ("InferencePool", "demo") in api.applied
