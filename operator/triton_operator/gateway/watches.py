"""The watches that keep the router current: InferenceServices and EndpointSlices in each served
namespace (`kube.aio.Watch`), their listings and events applied to the `Router`, and the held
requests of every service whose replicas or state changed woken (`holding.Wakeups`)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from . import telemetry as m
from .config import GatewaySettings
from ..api.kinds import INFERENCE_SERVICE
from ..kube.aio import ApiServer, Watch
from ..kube.kinds import ENDPOINT_SLICE
from .holding import Wakeups
from .routing import Router, ServiceKey


class Watches:
    def __init__(self, settings: GatewaySettings, api: ApiServer | None, router: Router, wakeups: Wakeups):
        self.settings = settings
        self.api = api
        self.router = router
        self.wakeups = wakeups
        self.started: list[Watch] = []

    def start_watches(self) -> list[asyncio.Task[Any]]:
        assert self.api is not None
        namespaces: list[str | None] = list(self.settings.namespaces) or [None]
        for ns in namespaces:
            self.started.append(Watch(self.api, INFERENCE_SERVICE, ns, self._services_listed(ns), self._service_event))
            self.started.append(Watch(self.api, ENDPOINT_SLICE, ns, self._slices_listed(ns), self._slice_event,
                                      selector=self.settings.endpoint_slice_selector or None))
        return [asyncio.create_task(w.run(), name=f"watch {w.name}") for w in self.started]

    def _services_listed(self, namespace: str | None) -> Callable[[list[dict[str, Any]]], None]:
        def listed(items: list[dict[str, Any]]) -> None:
            before = [k for k in self.router.services if namespace is None or k[0] == namespace]
            for key in before:
                del self.router.services[key]
            for obj in items:
                self.router.set_service(obj)
            m.SERVICES.set(len(self.router.services))
            # held requests look again, as on an event: a service gone while the watch was down
            # answers them 404 now, not a 503 "still starting" after the whole hold timeout
            self._wake_up(set(before) | {((o.get("metadata") or {}).get("namespace") or "default",
                                          (o.get("metadata") or {}).get("name") or "") for o in items})
        return listed

    def _service_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.router.set_service(None if kind == "DELETED" else obj, obj)
        m.SERVICES.set(len(self.router.services))
        meta = obj.get("metadata") or {}
        # held requests look again: the service may be gone, failing, or no longer starting
        self._wake_up({(meta.get("namespace") or "default", meta.get("name") or "")})

    def _slices_listed(self, namespace: str | None) -> Callable[[list[dict[str, Any]]], None]:
        def listed(items: list[dict[str, Any]]) -> None:
            stale = [k for k in self.router.slices if namespace is None or k[0] == namespace]
            changed: set[ServiceKey] = set()
            for k in stale:
                changed |= self.router.set_slice(None, {"metadata": {"namespace": k[0], "name": k[1], "labels": {
                    "kubernetes.io/service-name": self.router.slices[k][0][1]}}})
            for obj in items:
                changed |= self.router.set_slice(obj)
            self._wake_up(changed)
        return listed

    def _slice_event(self, kind: str, obj: dict[str, Any]) -> None:
        changed = self.router.set_slice(None if kind == "DELETED" else obj, obj)
        self._wake_up(changed)

    def _wake_up(self, services: set[ServiceKey]) -> None:
        self.wakeups.wake(services)

    @property
    def synced(self) -> bool:
        """Every watch has listed once (none started: true)."""
        return all(w.synced.is_set() for w in self.started)

    def status(self) -> dict[str, dict[str, Any]]:
        """For /readyz: each watch, synced or not, failing or not."""
        return {w.name: {"synced": w.synced.is_set(), "failing": w.failing} for w in self.started}
