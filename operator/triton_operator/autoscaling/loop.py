"""The autoscaler tick (shell): one Prometheus query per signal for all services, the pure policy
per service over what the cache holds, and a work-queue entry for each service whose report
changed. It writes nothing itself: the reconcile of that service renders the Deployment with the
new replica count and writes the report into status, so each object has one writer.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from .. import telemetry
from ..api import InferenceService
from ..controller.cache import Key
from ..controller.k8s import Kube, describe
from ..controller.logsummary import FailureLog
from ..controller.status import Event
from ..settings import Settings
from . import policy
from .prometheus import Snapshot
from .report import Report, report

log = logging.getLogger(__name__)


class Source(Protocol):
    def snapshot(self) -> Snapshot: ...


class Services(Protocol):
    """What the autoscaler reads: the cache's parsed InferenceServices and their Deployments."""

    def autoscaled(self) -> list[tuple[Key, InferenceService, dict[str, Any]]]: ...
    def deployment(self, key: Key) -> dict[str, Any] | None: ...


def signals_for(key: Key, snapshot: Snapshot, ready: int, current: int = 1) -> policy.Signals:
    if "queue" in snapshot.errors:
        return policy.Signals(ready=ready, error=snapshot.errors["queue"])
    gateway = {"held": snapshot.held.get(key), "gateway_in_flight": snapshot.gateway_in_flight.get(key)}
    if key not in snapshot.queue:
        if current == 0:
            # Scaled to zero: no replica reports, so no series is no demand, unless the gateway
            # holds requests for it.
            return policy.Signals(queue_depth=0.0, ready=0, **gateway)
        why = "no Triton metrics for this service in Prometheus"
        why += " yet: no replica is ready" if ready == 0 else " (is it scraped, with the service label?)"
        return policy.Signals(ready=ready, error=why)
    p99 = None if "p99" in snapshot.errors else snapshot.p99.get(key)
    return policy.Signals(queue_depth=snapshot.queue[key], p99_ms=p99, ready=ready,
                          throughput=snapshot.throughput.get(key), **gateway)


class Autoscaler:
    def __init__(self, services: Services, enqueue: Callable[[Key], None], kube: Kube | None, settings: Settings,
                 source: Source, clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)):
        self.services, self.enqueue, self.kube, self.settings = services, enqueue, kube, settings
        self.source, self.clock = source, clock
        self._lock = threading.Lock()
        self._histories: dict[Key, policy.History] = {}
        self._reports: dict[Key, Report] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = FailureLog(log)
        self.last_decision_cpu_seconds = 0.0
        self.last_changed = 0

    def report(self, key: Key) -> Report | None:
        """The latest report for `key` (read by the reconcile that writes status)."""
        with self._lock:
            return self._reports.get(key)

    def tick(self) -> dict[Key, policy.Decision]:
        services = self.services.autoscaled()
        telemetry.AUTOSCALED_SERVICES.set(len(services))
        live = {key for key, _, _ in services}
        with self._lock:
            self._histories = {k: v for k, v in self._histories.items() if k in live}
            self._reports = {k: v for k, v in self._reports.items() if k in live}
        if not services:
            return {}
        snapshot = self.source.snapshot()
        now = self.clock()
        started = time.thread_time()
        decisions: dict[Key, policy.Decision] = {}
        changed: list[Key] = []
        events: list[tuple[dict[str, Any], Event]] = []
        for key, obj, raw in services:
            dep = self.services.deployment(key)
            if dep is None:
                continue  # not rendered yet (or its GPUClass is missing): nothing to scale
            current = int(dep["spec"].get("replicas") or 0)
            ready = int((dep.get("status") or {}).get("readyReplicas") or 0)
            with self._lock:
                history = self._histories.get(key) or policy.seed(now, current)
                previous = self._reports.get(key)
            if previous is None:
                previous = Report.from_status(raw.get("status") or {})
            decision = policy.decide(obj.spec.autoscaling, current, signals_for(key, snapshot, ready, current), history, now)
            new, evs = report(decision, current, previous, now)
            with self._lock:
                self._histories[key] = decision.history
                self._reports[key] = new
            decisions[key] = decision
            direction = "up" if decision.desired > current else "down" if decision.desired < current else (
                "hold" if decision.metrics_available else "hold_no_metrics")
            telemetry.DECISIONS.labels(direction).inc()
            if new is not previous:
                changed.append(key)
                if new.desired != (previous.desired if previous else current):
                    log.info("%s/%s: %s", key[0], key[1], decision.reason)
            events.extend((raw, Event(t, r, m)) for t, r, m in evs)
        self.last_decision_cpu_seconds = time.thread_time() - started
        self.last_changed = len(changed)
        telemetry.DECISION_CPU_SECONDS.set(self.last_decision_cpu_seconds)
        telemetry.DECISION_CPU_SECONDS_TOTAL.inc(self.last_decision_cpu_seconds)
        telemetry.TICKS.inc()
        telemetry.REPORTS_CHANGED.set(len(changed))
        for key in changed:
            self.enqueue(key)
        if self.kube is not None:
            for raw, event in events:
                self.kube.post_event(raw, event)
        return decisions

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
                self.failures.success("autoscaler tick")
            except Exception as e:  # noqa: BLE001 - try again next tick, never stop scaling
                self.failures.failure("autoscaler tick", describe(e))
            self._stop.wait(self.settings.autoscale_interval_seconds)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="autoscaler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)

