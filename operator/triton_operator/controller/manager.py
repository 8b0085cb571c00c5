"""The controller's moving parts, wired: informers fill the cache and name the InferenceServices
an event concerns; a work queue coalesces those names; a pool of workers reconciles them from
the cache; a rare periodic pass re-queues everything (a check over the cache, not API calls); the
autoscaler ticks beside them and queues the services whose report changed."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .. import telemetry
from ..api.kinds import GPU_CLASS, INFERENCE_SERVICE, OWN_KINDS
from ..autoscaling.loop import Autoscaler
from ..autoscaling.prometheus import source_for
from ..kube.client import ApiError, Kube, describe_api_error, namespace_terminating
from ..kube.failures import FailureLog
from ..kube.informer import Informer
from ..kube.reach import Reachability
from ..kube.kinds import DEPLOYMENT, INFERENCE_POOL, JOB, LEADER_WORKER_SET, NETWORK_POLICY, NODE, PDB, POD, SERVICE, Kind
from ..kube.queue import WorkQueue
from ..kube.store import Key, Store, key_of
from ..labels import LABEL_SERVICE, MANAGED_BY, MANAGED_BY_LABEL
from ..settings import Settings
from .reconcile import Reconciler
from .trim import concerns_owner, owner_of, trim_child, trim_gpu_pod, trim_node, trim_pod
from .views import GPU_POD_KIND, Views

log = logging.getLogger(__name__)
CHILDREN_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
PODS_SELECTOR = f"{LABEL_SERVICE},{CHILDREN_SELECTOR}"  # serving pods and model-preparation pods
# Every pod that may hold GPUs: the API server drops ended pods (as kube-scheduler's own pod
# informer does); trim_gpu_pod keeps only bound pods that request an extended resource.
GPU_PODS_FIELDS = "status.phase!=Succeeded,status.phase!=Failed"
ADDON_CHECK_SECONDS = 60.0
# What the controller applies beyond the built-in kinds: its own, LeaderWorkerSets and InferencePools.
APPLIED_KINDS = OWN_KINDS + (LEADER_WORKER_SET, INFERENCE_POOL)


class AddOn:
    """A kind the cluster serves only where an add-on installed it (LeaderWorkerSet, InferencePool):
    watched from the start when it is served, else looked for again (at most every
    ADDON_CHECK_SECONDS, when a service needs it) and watched from when it appears."""

    def __init__(self, kube: Kube, kind: Kind, informers: list[Informer], failures: FailureLog):
        self.kube, self.kind, self.informers, self.failures = kube, kind, informers, failures
        self._lock = threading.Lock()
        self._checked = -ADDON_CHECK_SECONDS
        self.started = False

    def served(self) -> bool:
        self._checked = time.monotonic()
        try:
            return self.kube.available(self.kind)
        except ApiError as e:
            self.failures.failure(f"discovering {self.kind.kind}", describe_api_error(e))
            return False

    def ready(self) -> bool:
        """Whether the kind is served and its cache is filled."""
        with self._lock:
            if not self.started:
                if time.monotonic() - self._checked < ADDON_CHECK_SECONDS or not self.served():
                    return False
                self.started = True
                for informer in self.informers:
                    informer.start()
                log.info("%s is served: watching it", self.kind.kind)
        return all(i.synced.is_set() for i in self.informers)


class Manager:
    def __init__(self, settings: Settings, kube: Kube | None = None):
        self.settings = settings
        self.kube = kube or Kube(settings.field_manager, qps=settings.api_qps, burst=settings.api_burst,
                                 kinds=APPLIED_KINDS)
        self.store = Store(owner=owner_of)
        self.capacity_informers: list[Informer] = []
        self.views = Views(self.store, capacity_synced=lambda: bool(self.capacity_informers) and all(
            i.synced.is_set() for i in self.capacity_informers))
        self.queue = WorkQueue()
        self.failures = FailureLog(log)
        self._observe_lock, self._requests_counted = threading.Lock(), 0
        self.autoscaler = Autoscaler(self.views, self.queue.add, self.kube, settings, source_for(settings))
        self.reconciler = Reconciler(self.kube, self.store, self.views, settings, self.autoscaler.report,
                                     self.queue.add_after, groups_ready=lambda: self.groups.ready(),
                                     pools_ready=lambda: self.pools.ready())
        self.informers: list[Informer] = []
        namespaces: list[str | None] = list(settings.namespaces) or [None]
        kinds = [(INFERENCE_SERVICE, None, None), (DEPLOYMENT, CHILDREN_SELECTOR, trim_child),
                 (SERVICE, CHILDREN_SELECTOR, trim_child), (PDB, CHILDREN_SELECTOR, trim_child),
                 (JOB, CHILDREN_SELECTOR, trim_child), (POD, PODS_SELECTOR, trim_pod)]
        if settings.network_policy.enabled:
            kinds.append((NETWORK_POLICY, CHILDREN_SELECTOR, trim_child))
        # One probe of the API server for every watch while it cannot be reached: they reopen as
        # soon as it answers (kube/reach.py).
        self.reach = Reachability(self.kube.ready)
        for kind, selector, project in kinds:
            for ns in namespaces:
                kwargs: dict[str, Any] = {"label_selector": selector, "reach": self.reach,
                                          "on_listed": self.on_listed}
                if project is not None:
                    kwargs["project"] = project
                if kind is INFERENCE_SERVICE:
                    # children are written for these: after a gap they are listed again first
                    kwargs["relist_after_gap"] = True
                self.informers.append(Informer(self.kube, self.store, kind, ns, self.on_change, self.failures, **kwargs))
        self.informers.append(Informer(self.kube, self.store, GPU_CLASS, None, self.on_change, self.failures,
                                       reach=self.reach))
        # LeaderWorkerSets (replicas across nodes) and InferencePools where the cluster serves them.
        self.addons = [AddOn(self.kube, kind, [
            Informer(self.kube, self.store, kind, ns, self.on_change, self.failures, label_selector=CHILDREN_SELECTOR,
                     project=trim_child, reach=self.reach, on_listed=self.on_listed) for ns in namespaces],
            self.failures) for kind in (LEADER_WORKER_SET, INFERENCE_POOL)]
        self.groups, self.pools = self.addons
        if settings.watch_gpu_capacity:
            # The free-GPU view for spill-over: Nodes (GPU nodes only, trimmed) and every pod's GPU
            # requests (cluster-wide; a pod without GPUs is a watch event and nothing more). They do
            # not hold back the start: until they are listed, placement treats room as unknown.
            self.capacity_informers = [
                Informer(self.kube, self.store, NODE, None, self.on_capacity_change, self.failures, project=trim_node,
                         reach=self.reach),
                Informer(self.kube, self.store, POD, None, self.on_capacity_change, self.failures,
                         project=trim_gpu_pod, field_selector=GPU_PODS_FIELDS, store_kind=GPU_POD_KIND,
                         reach=self.reach)]
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.reconciles = 0

    # -- events -> keys ---------------------------------------------------------------------------

    def on_change(self, kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new if new is not None else old
        if obj is None:
            return
        if kind == INFERENCE_SERVICE.kind:
            self.queue.add(key_of(obj))
        elif kind == GPU_CLASS.kind:
            name = obj["metadata"]["name"]
            for isvc in self.store.list(INFERENCE_SERVICE.kind):
                gpu = (isvc.get("spec") or {}).get("gpu") or {}
                # class auto ranks every GPUClass: any change may change its choice.
                if name == gpu.get("class") or name in (gpu.get("fallbackClasses") or []) or gpu.get("class") == "auto":
                    self.queue.add(key_of(isvc))
        else:
            owner = owner_of(obj)
            if owner is not None and concerns_owner(kind, old, new):
                self.queue.add(owner)

    def on_listed(self, kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        """A change a listing found (after a start, an expired watch or an outage): a re-check, served
        after created and changed services, unless the InferenceService changed since it last
        converged (a generation its status has not observed, or no status yet)."""
        obj = new if new is not None else old
        if obj is None:
            return
        if kind == INFERENCE_SERVICE.kind:
            self.queue.add(key_of(obj), low=new is not None and _converged(new) and (
                old is None or old["metadata"].get("generation") == new["metadata"].get("generation")))
        elif kind == GPU_CLASS.kind:
            self.on_change(kind, old, new)
        else:
            owner = owner_of(obj)
            if owner is not None:
                self.queue.add(owner, low=True)

    def on_capacity_change(self, kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        """Free GPUs changed somewhere: the services whose placement could change look again
        (queued once however many pod events arrive meanwhile)."""
        for key in self.reconciler.spill_active():
            self.queue.add(key)

    # -- running ----------------------------------------------------------------------------------

    def start(self) -> None:
        for addon in self.addons:
            if addon.served():
                # Part of the cache the reconciles wait for: a child not yet listed is not absent.
                self.informers += addon.informers
                addon.started = True
        for informer in self.informers + self.capacity_informers:
            informer.start()
        self._spawn(self._start_when_synced, "controller start")

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _start_when_synced(self) -> None:
        # "Not in the cache" may only mean "does not exist" once every kind has been listed:
        # until then nothing is reconciled (keys queue up, coalesced).
        for informer in self.informers:
            while not informer.synced.wait(1.0):
                if self._stop.is_set():
                    return
        self.synced.set()
        log.info("cache synced: %s", ", ".join(f"{i.name} {self.store.count(i.store_kind)}" for i in self.informers
                                               if i.namespace in (None, self.informers[0].namespace)))
        for i in range(self.settings.workers):
            self._spawn(self._work, f"worker-{i}")
        self._spawn(self._resync, "resync")
        self.autoscaler.start()

    def _work(self) -> None:
        while not self._stop.is_set():
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            try:
                self._reconcile_one(key)
            finally:
                self.queue.done(key)

    def _reconcile_one(self, key: Key) -> None:
        started = time.perf_counter()
        outcome = self._outcome(key)
        telemetry.RECONCILES.labels(outcome).inc()
        telemetry.RECONCILE_SECONDS.labels(outcome).observe(time.perf_counter() - started)

    def _outcome(self, key: Key) -> str:
        """One pass for `key`, and how it ended: ok, retry (the API server), error (a bug) or
        namespace_terminating."""
        try:
            self.reconciler.reconcile(key)
        except ApiError as e:
            if namespace_terminating(e):
                self.queue.forget(key)
                return "namespace_terminating"
            delay = self.queue.add_rate_limited(key)
            self.failures.failure("reconcile", f"{key[0]}/{key[1]}: {describe_api_error(e)} (retrying in {delay:.0f}s)")
            return "retry"
        except Exception as e:  # noqa: BLE001 - a bug in one object's pass must not stop the others
            delay = self.queue.add_rate_limited(key)
            log.debug("reconcile of %s/%s failed", key[0], key[1], exc_info=True)
            self.failures.failure("reconcile", f"{key[0]}/{key[1]}: {type(e).__name__}: {e} (retrying in {delay:.0f}s)")
            return "error"
        self.queue.forget(key)
        self.reconciles += 1
        return "ok"

    def _resync(self) -> None:
        while not self._stop.wait(self.settings.resync_seconds):
            for key in self.store.keys(INFERENCE_SERVICE.kind):
                self.queue.add(key, low=True)
            self.observe()

    def observe(self) -> None:
        """Refresh the operator's own gauges."""
        with self._observe_lock:   # health() and the resync both call this
            made = self.kube.requests
            telemetry.API_REQUESTS.inc(max(0, made - self._requests_counted))
            self._requests_counted = made
        telemetry.QUEUE_DEPTH.set(len(self.queue))
        for kind in ("InferenceService", "GPUClass", "Deployment", "LeaderWorkerSet", "Service", "PodDisruptionBudget", "Job", "Pod",
                     "NetworkPolicy", "Node", GPU_POD_KIND):
            telemetry.CACHE_OBJECTS.labels(kind).set(self.store.count(kind))

    def health(self) -> dict[str, Any]:
        self.observe()
        return {"synced": self.synced.is_set(), "queued": len(self.queue), "reconciles": self.reconciles,
                "skipped": self.reconciler.skipped, "apiRequests": self.kube.requests}

    def stop(self) -> None:
        self._stop.set()
        self.queue.shutdown()
        self.autoscaler.stop()
        for informer in {id(i): i for i in self.informers + self.capacity_informers + [i for a in self.addons for i in a.informers]}.values():
            informer.stop()
        for thread in self._threads:
            thread.join(timeout=10)


def _converged(obj: dict[str, Any]) -> bool:
    """The operator observed this generation of the object (its status says so)."""
    observed = (obj.get("status") or {}).get("observedGeneration")
    return observed is not None and observed == obj["metadata"].get("generation")
