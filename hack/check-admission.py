#!/usr/bin/env python3
"""The property suite's claims, checked against a real API server instead of its Python stand-in.

    KUBECONFIG=... hack/check-admission.py [-n 300]   # the CRDs in crds/ installed, namespace ml present

Generates InferenceServices with the property suite's strategies (tests/hostile.py) and, for each:
1. creates it as a server-side dry run (JSON, fieldValidation=Strict) and compares the answer with
   the models' (accepted by both or refused by both; a refusal names a field);
2. if accepted, renders it and creates every child (Deployment, Service, PodDisruptionBudget,
   engine-build Jobs) as a dry run: Kubernetes' own validation must accept them all.
Prints the counts and every disagreement; exits 1 if there is one. Nothing is stored.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import kubernetes
import urllib3
from hypothesis import HealthCheck, given, settings
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import EXAMPLES, load  # noqa: E402
from tests.hostile import inference_services  # noqa: E402
from triton_operator.api import GROUP, VERSION, GPUClass, InferenceService, describe_validation_error  # noqa: E402
from triton_operator.planning.assign import assign  # noqa: E402
from triton_operator.render import RenderError, render  # noqa: E402
from triton_operator.settings import Settings  # noqa: E402

NAMESPACE = "ml"
DRY_RUN = {"dry_run": "All", "field_validation": "Strict"}


def _creator(kind: str) -> Any:
    c = kubernetes.client
    return {
        "InferenceService": lambda body: c.CustomObjectsApi().create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, "inferenceservices", body, **DRY_RUN),
        "Deployment": lambda body: c.AppsV1Api().create_namespaced_deployment(NAMESPACE, body, **DRY_RUN),
        "Service": lambda body: c.CoreV1Api().create_namespaced_service(NAMESPACE, body, **DRY_RUN),
        "PodDisruptionBudget": lambda body: c.PolicyV1Api().create_namespaced_pod_disruption_budget(
            NAMESPACE, body, **DRY_RUN),
        "Job": lambda body: c.BatchV1Api().create_namespaced_job(NAMESPACE, body, **DRY_RUN),
    }[kind]


def _create(body: dict[str, Any]) -> str | None:
    """None when the API server accepts the object (dry run), else its message."""
    try:
        _creator(body["kind"])(body)
        return None
    except ApiException as e:
        if e.status in (400, 409, 422):
            return json.loads(e.body).get("message", e.body)
        raise


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=300, help="how many InferenceServices to generate")
    args = p.parse_args()
    kubernetes.config.load_kube_config()
    urllib3.disable_warnings()
    classes = {c.name: c for c in (GPUClass.model_validate(d) for d in load(EXAMPLES / "gpuclasses.yaml"))}
    counts = {"generated": 0, "refused by both": 0, "accepted by both": 0, "rendered": 0, "children created": 0}
    problems: list[str] = []

    @settings(max_examples=args.n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(inference_services())
    def check(doc: dict[str, Any]) -> None:
        counts["generated"] += 1
        doc = {**doc, "metadata": {**doc["metadata"], "namespace": NAMESPACE}}
        try:
            obj, model_error = InferenceService.model_validate(doc), None
        except ValidationError as e:
            obj, model_error = None, describe_validation_error(e.errors()[0])
        server_error = _create(doc)
        if (obj is None) != (server_error is not None):
            problems.append(f"models: {model_error or 'accepted'} | API server: {server_error or 'accepted'} | "
                            f"spec: {json.dumps(doc['spec'])[:300]}")
            return
        if obj is None:
            counts["refused by both"] += 1
            return
        counts["accepted by both"] += 1
        try:
            manifests = render(obj, classes, Settings(), assign(obj, classes)).manifests
        except RenderError:
            return
        counts["rendered"] += 1
        for m in manifests:
            message = _create(m)
            if message:
                problems.append(f"{m['kind']} refused: {message[:400]} | spec: {json.dumps(doc['spec'])[:300]}")
            else:
                counts["children created"] += 1

    check()
    for problem in problems:
        print(problem)
    print(json.dumps({**counts, "disagreements": len(problems)}))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
