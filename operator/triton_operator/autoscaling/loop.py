"""The autoscaler tick (shell): one Prometheus query for all services and signals (the gateway's
held and in-flight requests among them), the pure policy per service over what the cache holds,
and a work-queue entry for each service whose report changed. It writes no object itself: the
reconcile of that service renders the Deployment with the new replica count and writes the report
into status, so each object has one writer. It only posts Events (ScaledUp/ScaledDown,
MetricsUnavailable/MetricsAvailable, TargetUnattainable), for `kubectl describe`.

Besides Prometheus, the policy gets from the cache the ready replicas, the pods' start-up time
(creation to Ready of the newest ready pod) and, for TensorRT-LLM services, the planner's
sizing of one replica (planning/llm_performance.py) for the measured token mix on the GPU class the
Deployment runs on, less the prefill of the prompt tokens the engines' prefix caches held (routing
by prefix raises that share, and a replica whose prompts are mostly cached serves more).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from .. import telemetry
from ..api import GPUClass, InferenceService
from ..conditions import parse_timestamp, timestamp
from ..kube.client import Kube, describe_api_error
from ..kube.events import Event
from ..kube.failures import FailureLog
from ..kube.store import Key
from ..labels import LABEL_GPU_CLASS
from ..planning.llm_performance import Sizing, llm_performance
from ..settings import Settings
from . import policy
from .history import RISE_MEMORY_S, History, seed
from .prometheus import Snapshot
from .report import Report, report
from .signals import Signals, service_signals

log = logging.getLogger(__name__)


class Source(Protocol):
    def snapshot(self) -> Snapshot: ...


class Services(Protocol):
    """What the autoscaler reads: the cache's parsed InferenceServices, their Deployments and
    pods, and the GPU classes."""

    def fresh(self) -> bool: ...   # no gap in the InferenceServices' cache
    def autoscaled(self) -> list[tuple[Key, InferenceService, dict[str, Any]]]: ...
    def scaling(self, key: Key) -> tuple[dict[str, Any] | None, tuple[dict[str, Any], ...]]: ...
    # (the Deployment, replicas totalled over every class, or None; the serving pods, trimmed)
    def gpu_classes(self) -> dict[str, GPUClass]: ...


# The planner's token mix when the engine does not report one (TensorRT-LLM backends before the
# nv_llm_*_token_len histograms): a chat request. The calibration against the measured
# throughput corrects the rest (history.History._sample).
ASSUMED_PROMPT_TOKENS, ASSUMED_OUTPUT_TOKENS = 1024.0, 256.0


def signals_for(key: Key, snapshot: Snapshot, ready: int, sizing: Sizing | None = None,
                startup_s: float | None = None, current: int = 1) -> Signals:
    """One service's Signals from the tick's snapshot, by the rules the simulator shares
    (signals.service_signals)."""
    def get(signal: str) -> float | None:
        return snapshot.get(signal, key)

    return service_signals(
        ready=ready, current=current, error=snapshot.error, queue=get("queue"), p99_ms=get("p99"),
        throughput=get("throughput"), recent_throughput=get("recent_throughput"), in_flight=get("in_flight"),
        reporting=get("reporting"), held=get("held"), gateway_in_flight=get("gateway_in_flight"), startup_s=startup_s,
        sizing=sizing, slo_met=get("slo_met"), slo_requests=get("slo_requests"))


def startup_seconds(pods: Any) -> float | None:
    """Seconds from creation to Ready of the most recently created ready pod, None without one.
    Creation, not scheduling: the wait for a node (a GPU node being added) is part of how long a
    scale-up takes to become capacity, and the simulator measures the same span. A pod whose
    containers restarted is skipped: its Ready time is its last recovery, not its start-up."""
    newest: tuple[datetime, float] | None = None
    for pod in pods or ():
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if meta.get("deletionTimestamp") or any(
                (c.get("restartCount") or 0) > 0 for c in status.get("containerStatuses") or []):
            continue
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        if not ready or ready.get("status") != "True":
            continue
        t0, t1 = parse_timestamp(meta.get("creationTimestamp")), parse_timestamp(ready.get("lastTransitionTime"))
        if t0 is None or t1 is None:
            continue
        if t1 >= t0 and (newest is None or t0 > newest[0]):
            newest = (t0, (t1 - t0).total_seconds())
    return None if newest is None else newest[1]


def is_new(raw: dict[str, Any], now: datetime) -> bool:
    """Whether the InferenceService was created within the policy's memory of bursts
    (history.RISE_MEMORY_S): first seen then, nothing is known of its bursts yet. An older one first
    seen by this process (an operator restart) has served before: it gets no headroom for being
    new, or every restart of the operator would add a replica to every service."""
    created = parse_timestamp((raw.get("metadata") or {}).get("creationTimestamp"))
    return created is not None and (now - created).total_seconds() < RISE_MEMORY_S


def sizing_for(obj: InferenceService, deployment: dict[str, Any], classes: dict[str, GPUClass],
               snapshot: Snapshot, key: Key) -> Sizing | None:
    """The planner's figures for one replica of a TensorRT-LLM service on the GPU class its
    Deployment runs on, for the token mix Prometheus measured (or an assumed one)."""
    spec = obj.spec
    if spec.model.format != "tensorrt-llm" or spec.model.parameter_count() is None:
        return None
    labels = ((deployment.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}
    gpu = classes.get(labels.get(LABEL_GPU_CLASS, ""))
    if gpu is None:
        return None
    prompt, output = snapshot.get("prompt_tokens", key), snapshot.get("output_tokens", key)
    cached = snapshot.get("cached_tokens", key)
    if prompt is None or output is None or not (math.isfinite(prompt) and math.isfinite(output)):
        prompt, output, cached = ASSUMED_PROMPT_TOKENS, ASSUMED_OUTPUT_TOKENS, None
    try:
        return llm_performance(spec, gpu.spec).sizing(
            prompt, output, cached if cached is not None and math.isfinite(cached) else 0.0)
    except (ValueError, ZeroDivisionError):
        return None


class Autoscaler:
    def __init__(self, services: Services, enqueue: Callable[[Key], None], kube: Kube | None, settings: Settings,
                 source: Source, clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)):
        self.services, self.enqueue, self.kube, self.settings = services, enqueue, kube, settings
        self.source, self.clock = source, clock
        self._lock = threading.Lock()
        self._histories: dict[Key, History] = {}
        self._reports: dict[Key, Report] = {}
        self._startups: dict[Key, tuple[tuple[tuple[str, str], ...], float | None]] = {}
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
        if not self.services.fresh():
            # The InferenceServices' cache has a gap (an API outage): a service in it may be gone.
            # Nothing is decided, reported or announced until the kind is listed again.
            return {}
        services = self.services.autoscaled()
        telemetry.AUTOSCALED_SERVICES.set(len(services))
        live = {key for key, _, _ in services}
        # Only this thread writes these: it fills new maps and swaps them in at the end, so a
        # reconcile reading a report never waits on a lock held through the tick.
        histories = {k: v for k, v in self._histories.items() if k in live}
        reports = {k: v for k, v in self._reports.items() if k in live}
        # Each service's pods' start-up time, kept while its pods are the same objects.
        startups = self._startups = {k: v for k, v in self._startups.items() if k in live}
        if not services:
            with self._lock:
                self._histories, self._reports = histories, reports
            return {}
        snapshot = self.source.snapshot()
        classes = self.services.gpu_classes()
        now = self.clock()
        started = time.thread_time()
        decisions: dict[Key, policy.Decision] = {}
        changed: list[Key] = []
        events: list[tuple[dict[str, Any], Event]] = []
        directions: dict[str, int] = {}
        stamp = timestamp(now)
        for key, obj, raw in services:
            dep, pods = self.services.scaling(key)
            if dep is None:
                continue  # not rendered yet (or its GPUClass is missing): nothing to scale
            current = int(dep["spec"].get("replicas") or 0)
            ready = int((dep.get("status") or {}).get("readyReplicas") or 0)
            history = histories.get(key) or seed(now, current, new=is_new(raw, now))
            previous = reports.get(key)
            if previous is None:
                previous = Report.from_status(raw.get("status") or {})
            seen = tuple((p["metadata"].get("name"), p["metadata"].get("resourceVersion")) for p in pods)
            memo = startups.get(key)
            if memo is None or memo[0] != seen:
                memo = startups[key] = (seen, startup_seconds(pods))
            signals = signals_for(key, snapshot, ready, sizing_for(obj, dep, classes, snapshot, key),
                                  memo[1], current)
            decision = policy.decide(obj.spec.autoscaling, current, signals, history, now)
            new, evs = report(decision, current, previous, now, stamp)
            histories[key] = decision.history
            reports[key] = new
            decisions[key] = decision
            direction = "up" if decision.desired > current else "down" if decision.desired < current else (
                "hold" if decision.metrics_available else "hold_no_metrics")
            directions[direction] = directions.get(direction, 0) + 1
            if new is not previous:
                changed.append(key)
                if new.desired != (previous.desired if previous else current):
                    log.info("%s/%s: %s", key[0], key[1], decision.reason,
                             extra={"namespace": key[0], "inferenceservice": key[1], "reason": "Autoscaled"})
            events.extend((raw, Event(t, r, m)) for t, r, m in evs)
        with self._lock:
            self._histories, self._reports = histories, reports
        for direction, n in directions.items():
            telemetry.DECISIONS.labels(direction).inc(n)
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
                self.failures.failure("autoscaler tick", describe_api_error(e))
            self._stop.wait(self.settings.autoscale_interval_seconds)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="autoscaler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)

