"""The autoscaler loop (shell): every tick, one Prometheus query per signal for all services,
the pure policy per service, then status, Events and the Deployment's replicas.

It never writes replicas anywhere but status.autoscaling.desiredReplicas; the reconcile pass
renders the Deployment from there, so there is one writer of the Deployment.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone
from typing import Callable, Protocol

from pydantic import ValidationError

from .. import telemetry
from ..api import API_VERSION, InferenceService
from ..controller.k8s import Kube, describe, namespace_terminating
from ..controller.reconcile import object_lock, reconcile
from ..controller.status import Event
from ..labels import MANAGED_BY
from ..settings import Settings
from . import policy as autoscaling
from .policy import Decision, History, Signals
from .prometheus import Key, Snapshot

log = logging.getLogger(__name__)


class Source(Protocol):
    def snapshot(self) -> Snapshot: ...


def signals_for(key: Key, snapshot: Snapshot, ready: int) -> Signals:
    if "queue" in snapshot.errors:
        return Signals(ready=ready, error=snapshot.errors["queue"])
    if key not in snapshot.queue:
        why = "no Triton metrics for this service in Prometheus"
        why += " yet: no replica is ready" if ready == 0 else " (is it scraped, with the service label?)"
        return Signals(ready=ready, error=why)
    p99 = None if "p99" in snapshot.errors else snapshot.p99.get(key)
    return Signals(queue_depth=snapshot.queue[key], p99_ms=p99, ready=ready)


class Autoscaler:
    def __init__(self, kube: Kube, settings: Settings, source: Source,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)):
        self.kube, self.settings, self.source, self.clock = kube, settings, source, clock
        self.histories: dict[Key, History] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _list(self, api_version: str, kind: str, selector: str | None = None) -> list[dict]:
        if not self.settings.namespaces:
            return self.kube.list(api_version, kind, label_selector=selector)
        return [i for ns in self.settings.namespaces for i in self.kube.list(api_version, kind, ns, selector)]

    def tick(self) -> dict[Key, Decision]:
        services = []
        for raw in self._list(API_VERSION, "InferenceService"):
            try:
                obj = InferenceService.model_validate(raw)
            except ValidationError:
                continue  # the reconcile pass reports invalid specs
            if obj.spec.autoscaling is not None and not raw["metadata"].get("deletionTimestamp"):
                services.append(obj)
        telemetry.AUTOSCALED_SERVICES.set(len(services))
        live = {(s.namespace, s.name) for s in services}
        self.histories = {k: v for k, v in self.histories.items() if k in live}
        if not services:
            return {}
        snapshot = self.source.snapshot()
        deployments = {(d["metadata"]["namespace"], d["metadata"]["name"]): d
                       for d in self._list("apps/v1", "Deployment", f"app.kubernetes.io/managed-by={MANAGED_BY}")}
        decisions: dict[Key, Decision] = {}
        for obj in services:
            key = (obj.namespace, obj.name)
            dep = deployments.get(key)
            if dep is None:
                continue  # not rendered yet (or its GPUClass is missing): nothing to scale
            try:
                decisions[key] = self._scale(obj, dep, snapshot)
            except Exception as e:  # one service's API error must not stop the others
                if not namespace_terminating(e):
                    log.warning("autoscaling %s/%s failed: %s", key[0], key[1], describe(e))
        return decisions

    def _scale(self, obj: InferenceService, dep: dict, snapshot: Snapshot) -> Decision:
        key = (obj.namespace, obj.name)
        now = self.clock()
        with object_lock(*key):
            raw = self.kube.get_inference_service(*key)
            if raw is None:
                return Decision(0, "deleted", False, History())
            current = int(dep["spec"].get("replicas") or 0)
            ready = int((dep.get("status") or {}).get("readyReplicas") or 0)
            history = self.histories.get(key) or autoscaling.seed(now, current)
            decision = autoscaling.decide(obj.spec.autoscaling, current, signals_for(key, snapshot, ready),
                                          history, now)
            self.histories[key] = decision.history
            patch, events = autoscaling.status_patch(decision, current, raw.get("status") or {},
                                                     raw["metadata"].get("generation"), now)
            self.kube.patch_status(*key, patch)
            direction = "up" if decision.desired > current else "down" if decision.desired < current else (
                "hold" if decision.metrics_available else "hold_no_metrics")
            telemetry.DECISIONS.labels(direction).inc()
            if decision.desired != current:
                log.info("%s/%s: %s", key[0], key[1], decision.reason)
                reconcile(self.kube, self.settings, *key)
            for type_, reason, message in events:
                self.kube.post_event(raw, Event(type_, reason, message))
        return decision

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as e:  # the API server is down: try again next tick
                log.warning("autoscaler tick failed: %s", describe(e))
            self._stop.wait(self.settings.autoscale_interval_seconds)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="autoscaler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)
