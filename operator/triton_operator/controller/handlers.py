"""kopf handlers: decorators only. Each one finds which InferenceService to reconcile and calls
`reconcile`; the work and the decisions live elsewhere."""

from __future__ import annotations

import logging
import time
from typing import Any

import kopf
import prometheus_client

from .. import telemetry
from ..api import GROUP, VERSION
from ..autoscaling.loop import Autoscaler
from ..autoscaling.prometheus import source_for
from ..labels import LABEL_SERVICE, MANAGED_BY
from ..settings import from_env
from . import catalog
from . import reconcile as rec
from .k8s import Kube, describe, namespace_terminating

log = logging.getLogger(__name__)
ISVC = (GROUP, VERSION, "inferenceservices")
CHILD_LABELS = {"app.kubernetes.io/managed-by": MANAGED_BY}


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ours = from_env()
    memo.settings = ours
    memo.kube = Kube(ours.field_manager)
    # Keep kopf's bookkeeping in annotations under our own prefix: status belongs to the API.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # kopf's own "handler succeeded" events are noise for users; ours say what changed.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    settings.execution.max_workers = 8
    if ours.catalog_file:
        try:
            log.info("GPUClass catalog applied: %s", ", ".join(catalog.sync(memo.kube, ours.catalog_file)))
        except catalog.CatalogError as e:
            # A broken catalog must not stop the operator from serving what already works.
            log.error("GPUClass catalog not applied: %s", e)
    if ours.metrics_port:
        prometheus_client.start_http_server(ours.metrics_port, addr=ours.metrics_address)
    memo.autoscaler = Autoscaler(memo.kube, ours, source_for(ours))
    memo.autoscaler.start()


@kopf.on.cleanup()
def stop_autoscaler(memo: kopf.Memo, **_: Any) -> None:
    if getattr(memo, "autoscaler", None):
        memo.autoscaler.stop()


def _run(memo: kopf.Memo, namespace: str, name: str) -> None:
    started = time.monotonic()
    try:
        rec.reconcile(memo.kube, memo.settings, namespace, name)
    except Exception as e:  # the API server or network failed: retry later, never crash
        telemetry.RECONCILE_SECONDS.labels("error").observe(time.monotonic() - started)
        if namespace_terminating(e):
            return
        raise kopf.TemporaryError(f"reconcile of {namespace}/{name} failed: {describe(e)}", delay=5) from e
    telemetry.RECONCILE_SECONDS.labels("ok").observe(time.monotonic() - started)


@kopf.on.resume(*ISVC)
@kopf.on.create(*ISVC)
@kopf.on.update(*ISVC)
def isvc_changed(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    _run(memo, namespace, name)


@kopf.timer(*ISVC, interval=30.0, initial_delay=5.0, sharp=False)
def isvc_resync(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    _run(memo, namespace, name)


@kopf.index(*ISVC)
def isvc_by_gpu_class(namespace: str, name: str, spec: kopf.Spec, **_: Any) -> dict[str, tuple[str, str]]:
    gpu = spec.get("gpu") or {}
    return {c: (namespace, name) for c in [gpu.get("class"), *(gpu.get("fallbackClasses") or [])] if c}


def _owner_event(event: dict[str, Any], labels: dict[str, str], namespace: str, memo: kopf.Memo) -> None:
    owner = labels.get(LABEL_SERVICE)
    if owner and event.get("type") in ("MODIFIED", "DELETED", "ADDED"):
        try:
            _run(memo, namespace, owner)
        except kopf.TemporaryError as e:
            log.warning("%s", e)


@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
@kopf.on.event("", "v1", "services", labels=CHILD_LABELS)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=CHILD_LABELS)
@kopf.on.event("batch", "v1", "jobs", labels=CHILD_LABELS)
def child_event(event: dict[str, Any], labels: dict[str, str], namespace: str, memo: kopf.Memo, **_: Any) -> None:
    """A child changed or vanished: restore it and refresh the owner's status."""
    _owner_event(event, labels, namespace, memo)


@kopf.on.event("", "v1", "pods", labels={LABEL_SERVICE: kopf.PRESENT, **CHILD_LABELS})
def pod_event(event: dict[str, Any], labels: dict[str, str], namespace: str, memo: kopf.Memo, **_: Any) -> None:
    """Pods going Pending/Unschedulable/crash-looping show up in the owner's conditions at once."""
    if event.get("type") != "ADDED":
        _owner_event(event, labels, namespace, memo)


@kopf.on.event(GROUP, VERSION, "gpuclasses")
def gpu_class_event(name: str, memo: kopf.Memo, isvc_by_gpu_class: kopf.Index, **_: Any) -> None:
    """A GPUClass appeared, changed or vanished: re-render every service that may use it."""
    for namespace, isvc in isvc_by_gpu_class.get(name, []):
        try:
            _run(memo, namespace, isvc)
        except kopf.TemporaryError as e:
            log.warning("%s", e)
