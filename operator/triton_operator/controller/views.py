"""The read model over the watch-fed store: parsed InferenceServices and GPUClasses (pydantic runs
once per change, memoized by resourceVersion), a service's children, what the autoscaler reads of a
service, and the free GPUs per class. Used by the reconcile and the autoscaler alike; reads only
the store."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Mapping

from pydantic import ValidationError

from .. import telemetry
from ..api import GPUClass, InferenceService, first_error
from ..api.kinds import GPU_CLASS, INFERENCE_SERVICE
from ..kube.kinds import DEPLOYMENT, INFERENCE_POOL, JOB, LEADER_WORKER_SET, NETWORK_POLICY, NODE, PDB, POD, SERVICE
from ..render.group import WORKER_COMPONENT, group_name
from ..kube.store import Key, Store
from ..planning import capacity
from . import desired as desired_core

log = logging.getLogger(__name__)
# The store's kind for every pod's GPU requests (the Pod kind there holds the serving pods).
GPU_POD_KIND = "GPUPod"


class Views:
    """Parsed models over the raw cache, memoized by resourceVersion (pydantic runs once per change)."""

    def __init__(self, store: Store, capacity_synced: Callable[[], bool] | None = None):
        self.store = store
        self.capacity_synced = capacity_synced
        self._lock = threading.Lock()
        self._isvcs: dict[Key, tuple[str, InferenceService | None, str | None]] = {}
        self._classes: tuple[int, dict[str, GPUClass]] = (-1, {})
        self._free: tuple[Any, dict[str, list[int]]] = (None, {})

    def inference_service(self, key: Key) -> tuple[dict[str, Any] | None, InferenceService | None, str | None]:
        """(raw, parsed or None, why it does not parse)."""
        raw = self.store.get(INFERENCE_SERVICE.kind, key)
        if raw is None:
            with self._lock:
                self._isvcs.pop(key, None)
            return None, None, None
        version = raw["metadata"].get("resourceVersion") or ""
        with self._lock:
            hit = self._isvcs.get(key)
        if hit is not None and hit[0] == version:
            return raw, hit[1], hit[2]
        try:
            model, error = InferenceService.model_validate(raw), None
        except ValidationError as e:
            model, error = None, first_error(e)
        with self._lock:
            self._isvcs[key] = (version, model, error)
        return raw, model, error

    def gpu_classes(self) -> dict[str, GPUClass]:
        version = self.store.version(GPU_CLASS.kind)
        with self._lock:
            if self._classes[0] == version:
                return self._classes[1]
        out: dict[str, GPUClass] = {}
        for item in self.store.list("GPUClass"):
            try:
                cls = GPUClass.model_validate(item)
            except ValidationError as e:
                log.warning("ignoring GPUClass %s: %s", item["metadata"].get("name"), first_error(e))
                continue
            out[cls.name] = cls
        telemetry.GPU_CLASS_PRICE.clear()
        for name, cls in out.items():
            if cls.spec.price_per_hour is not None:
                telemetry.GPU_CLASS_PRICE.labels(name).set(cls.spec.price_per_hour)
        with self._lock:
            self._classes = (version, out)
        return out

    def fresh(self) -> bool:
        """The InferenceServices' cache follows the API server without a gap (kube/store.py)."""
        return self.store.fresh(INFERENCE_SERVICE.kind)

    def autoscaled(self) -> list[tuple[Key, InferenceService, dict[str, Any]]]:
        out = []
        for key in self.store.keys(INFERENCE_SERVICE.kind):
            raw, obj, _ = self.inference_service(key)
            if obj is not None and obj.spec.autoscaling is not None and not raw["metadata"].get("deletionTimestamp"):
                out.append((key, obj, raw))
        return out

    def main_workload(self, key: Key) -> dict[str, Any] | None:
        """The preferred class's workload: the Deployment named as the service, or for replicas
        across nodes its LeaderWorkerSet (whose replicas are groups)."""
        return self.store.get(DEPLOYMENT.kind, key) or self.store.get(LEADER_WORKER_SET.kind,
                                                                      (key[0], group_name(key[1])))

    def workloads(self, key: Key) -> tuple[dict[str, Any], ...]:
        """Every class's workload of the service (Deployments and LeaderWorkerSets), by name."""
        return tuple(sorted(self.store.owned(DEPLOYMENT.kind, key) + self.store.owned(LEADER_WORKER_SET.kind, key),
                            key=lambda d: d["metadata"]["name"]))

    def deployment(self, key: Key) -> dict[str, Any] | None:
        """The service's Deployment, as the autoscaler reads it. With replicas spilled over to other
        GPU classes, replicas and readyReplicas are the totals over every class (less the one
        being started to move a replica back), so the autoscaler scales the service, not a class."""
        main = self.main_workload(key)
        if main is None:
            return None
        children = self.children(key)
        if len(children.all_deployments()) <= 1:
            return main
        _, isvc, _ = self.inference_service(key)
        total = desired_core.serving_total(isvc, children) if isvc is not None else None
        ready = sum(int((d.get("status") or {}).get("readyReplicas") or 0) for d in children.all_deployments())
        return {"metadata": main["metadata"], "spec": {**main.get("spec", {}), "replicas": total or 0},
                "status": {**(main.get("status") or {}), "readyReplicas": ready}}

    def scaling(self, key: Key) -> tuple[dict[str, Any] | None, tuple[dict[str, Any], ...]]:
        """What the autoscaler reads of one service in one pass over the cache: its Deployment
        (the totals over every class when spilled, as `deployment`) and its serving pods."""
        main = self.main_workload(key)
        if main is None:
            return None, ()
        pods = tuple(p for p in self.store.owned(POD.kind, key)
                     if p["metadata"]["labels"].get("app.kubernetes.io/component") == "server")
        if len(self.workloads(key)) <= 1:
            return main, pods
        return self.deployment(key), pods

    def children(self, key: Key) -> desired_core.Children:
        s = self.store
        jobs = tuple(sorted(s.owned(JOB.kind, key), key=lambda j: j["metadata"]["name"]))
        deployments = self.workloads(key)
        pods = s.owned(POD.kind, key)
        component = "app.kubernetes.io/component"
        return desired_core.Children(
            deployment=self.main_workload(key), service=s.get(SERVICE.kind, key), pdb=s.get(PDB.kind, key),
            network_policy=s.get(NETWORK_POLICY.kind, key), inference_pool=s.get(INFERENCE_POOL.kind, key),
            jobs=jobs, pods=tuple(p for p in pods if p["metadata"]["labels"].get(component) == "server"),
            preparation_pods=tuple(p for p in pods if p["metadata"]["labels"].get(component) == "model-prepare"),
            deployments=deployments,
            worker_pods=tuple(p for p in pods if p["metadata"]["labels"].get(component) == WORKER_COMPONENT))

    def free_gpus(self, classes: Mapping[str, GPUClass]) -> dict[str, list[int]] | None:
        """Free GPUs per node of each class, from the Node and GPU-pod caches; None until both
        have been listed (or when the operator does not watch them). Memoized per change."""
        if not (self.capacity_synced and self.capacity_synced()):
            return None
        version = (self.store.version(NODE.kind), self.store.version(GPU_POD_KIND), self.store.version(GPU_CLASS.kind))
        with self._lock:
            if self._free[0] == version:
                return self._free[1]
        free = capacity.free_gpus(self.store.list(NODE.kind), self.store.list(GPU_POD_KIND), classes)
        with self._lock:
            self._free = (version, free)
        return free
