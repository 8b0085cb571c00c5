"""One reconcile pass for one InferenceService: read, call the core, apply, report.

Called by the kopf handlers and directly by tests; it holds no state between calls but a lock
per object, so overlapping triggers (a spec change, a child event, the resync timer) serialize.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any, Callable

from pydantic import ValidationError

from .. import conditions as c
from ..api import GPUClass, InferenceService, first_error
from ..labels import LABEL_SERVICE, selector_labels
from ..planning import engines
from . import status as status_core
from .k8s import Kube
from ..render import Rendered, RenderError, desired_replicas, endpoints, engine_jobs, render
from ..settings import Settings

log = logging.getLogger(__name__)
_locks: defaultdict[tuple[str, str], threading.RLock] = defaultdict(threading.RLock)
_locks_guard = threading.Lock()


def object_lock(namespace: str, name: str) -> threading.RLock:
    """Serializes everything that writes one InferenceService's status (re-entrant)."""
    with _locks_guard:
        return _locks[(namespace, name)]


def gpu_classes(raw: list[dict[str, Any]]) -> dict[str, GPUClass]:
    out: dict[str, GPUClass] = {}
    for item in raw:
        try:
            cls = GPUClass.model_validate(item)
        except ValidationError as e:
            log.warning("ignoring GPUClass %s: %s", item.get("metadata", {}).get("name"), first_error(e))
            continue
        out[cls.name] = cls
    return out


def reconcile(kube: Kube, settings: Settings, namespace: str, name: str,
              now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> dict[str, Any] | None:
    """Bring one InferenceService's children to its spec and write its status. Returns the status."""
    with object_lock(namespace, name):
        raw = kube.get_inference_service(namespace, name)
        if raw is None or raw["metadata"].get("deletionTimestamp"):
            return None
        try:
            isvc = InferenceService.model_validate(raw)
        except ValidationError as e:
            # The CRD admits nothing the models refuse; this guards objects stored by an older CRD.
            msg = f"spec is invalid: {first_error(e)}"
            kube.patch_status(namespace, name, _invalid_status(raw, msg, now()))
            return None

        classes = gpu_classes(kube.list_gpu_classes())
        deployment = kube.get("apps/v1", "Deployment", name, namespace)
        current = deployment["spec"].get("replicas") if deployment else None
        desired = desired_replicas(isvc, current)
        error, gpu_class, notes, engine_states = None, None, [], None
        try:
            if isvc.spec.model.format == "tensorrt-llm":
                observed_jobs = kube.list("batch/v1", "Job", namespace, f"{LABEL_SERVICE}={name}")
                known = [e.wire() for e in isvc.status.engines or []] if isvc.status else []
                jobs = engine_jobs(isvc, classes, settings)
                engine_states = engines.states(jobs, observed_jobs, known)
                ready = engines.ready_classes(engine_states)
                rendered = render(isvc, classes, settings, replicas=desired, engines_ready=ready, jobs=jobs)
                if deployment is not None and rendered.gpu_class not in ready:
                    # A new engine is building: the running Deployment keeps serving the old one
                    # until it is in the cache, instead of being scaled to zero.
                    rendered = Rendered(rendered.gpu_class, [m for m in rendered.manifests if m["kind"] != "Deployment"],
                                        rendered.notes)
                wanted = {m["metadata"]["name"] for m in rendered.manifests if m["kind"] == "Job"}
                for job in observed_jobs:  # builds for an older spec or a class no longer used
                    if job["metadata"]["name"] not in wanted:
                        kube.delete("batch/v1", "Job", job["metadata"]["name"], namespace, propagation="Background")
            else:
                rendered = render(isvc, classes, settings, replicas=desired)
            gpu_class, notes = rendered.gpu_class, rendered.notes
            for manifest in rendered.manifests:
                kube.apply(manifest)
            deployment = kube.get("apps/v1", "Deployment", name, namespace)
        except RenderError as e:
            error = (e.reason, e.message)
        selector = ",".join(f"{k}={v}" for k, v in selector_labels(name).items())
        pods = kube.list("v1", "Pod", namespace, selector) if deployment else []
        cls = classes.get(gpu_class) if gpu_class else None
        observed = status_core.Observed(
            desired_replicas=desired, gpu_class=gpu_class, gpu_class_spec=cls.spec if cls else None,
            gpu_count=isvc.spec.gpu.count, error=error, notes=notes, deployment=deployment, pods=pods,
            endpoints=endpoints(name, namespace, settings), selector=selector, engines=engine_states)
        new_status, events = status_core.compute(isvc, observed, now())
        old_status = raw.get("status") or {}
        if any(old_status.get(k) != v for k, v in new_status.items()):
            kube.patch_status(namespace, name, new_status)
        for event in events:
            kube.post_event(raw, event)
        return new_status


def _invalid_status(raw: dict[str, Any], message: str, now: datetime) -> dict[str, Any]:
    gen = raw["metadata"].get("generation")
    conds = (raw.get("status") or {}).get("conditions") or []
    for type_, value in ((c.READY, False), (c.PROGRESSING, False), (c.DEGRADED, True)):
        conds = c.set_condition(conds, type_, value, "InvalidSpec", message, gen, now)
    return {"observedGeneration": gen, "conditions": conds}
