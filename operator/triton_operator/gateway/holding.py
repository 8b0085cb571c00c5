"""Holding: a request for a service with no ready replica (scaled to zero, starting) waits for one,
bounded by the hold queues (`limits.Holds`) and hold_timeout_seconds, and is woken when the
watches see the service's replicas or state change, or when the gateway stops."""

from __future__ import annotations

import asyncio
from typing import Callable, Iterable

from . import limits
from . import telemetry as m
from . import tracing as tr
from . import translate as t
from .auth import Caller
from .config import GatewaySettings
from .routing import Address, Router, Service, ServiceKey


class Wakeups:
    """One event per service that held requests wait on; set (and dropped) when the service
    changes, so each waiter looks again."""

    def __init__(self) -> None:
        self._events: dict[ServiceKey, asyncio.Event] = {}

    def event(self, service: ServiceKey) -> asyncio.Event:
        return self._events.setdefault(service, asyncio.Event())

    def wake(self, services: Iterable[ServiceKey]) -> None:
        for key in services:
            event = self._events.pop(key, None)
            if event is not None:
                event.set()

    def wake_all(self) -> None:
        self.wake(set(self._events))


class Holding:
    def __init__(self, settings: GatewaySettings, router: Router, holds: limits.Holds, wakeups: Wakeups,
                 clock: Callable[[], float], tracing: tr.Off | tr.On):
        self.settings = settings
        self.router = router
        self.holds = holds
        self.wakeups = wakeups
        self.clock = clock
        self.tracing = tracing
        self.draining = False

    async def endpoint(self, svc: Service, caller: Caller) -> Address:
        """A ready replica for `svc`, waiting for one (bounded, and within the caller's share of
        the service's hold queue) while there is none."""
        address = self.router.pick(svc.key)
        if address is not None:
            return address
        self._check_servable(svc)
        full = self.holds.admit(svc.key, caller.digest)
        if full is not None:
            m.REJECTED.labels("hold_full").inc()
            if full == "key":
                raise t.OpenAIError(429, f"model {svc.key[1]} is starting and API key {caller.grant.name} has "
                                         f"{self.holds.per_key} requests waiting for it already (its share); retry "
                                         f"later", "rate_limit_error", code="hold_share_full",
                                    retry_after=self.settings.retry_after_seconds)
            raise t.OpenAIError(503, f"model {svc.key[1]} is starting and {self.holds.held(svc.key)} requests "
                                     f"already wait for it; retry later", "service_unavailable",
                                code="model_starting", retry_after=self.settings.retry_after_seconds)
        gauge = m.HELD.labels(*svc.key)
        gauge.inc()
        started = self.clock()
        deadline = started + self.settings.hold_timeout_seconds
        try:
            with self.tracing.span("gateway.hold", {tr.NAMESPACE: svc.key[0], tr.NAME: svc.key[1]}):
                return await self._wait_for_replica(svc, started, deadline)
        finally:
            self.holds.leave(svc.key, caller.digest)
            gauge.dec()

    async def _wait_for_replica(self, svc: Service, started: float, deadline: float) -> Address:
        """The wait of endpoint(): until a replica is ready, the service goes away or fails, or the
        deadline passes."""
        while True:
            event = self.wakeups.event(svc.key)
            remaining = deadline - self.clock()
            if remaining <= 0:
                m.REJECTED.labels("hold_timeout").inc()
                raise t.OpenAIError(
                    503, f"model {svc.key[1]} has no ready replica after "
                         f"{self.settings.hold_timeout_seconds:.0f}s; it may still be starting: retry later",
                    "service_unavailable", code="model_starting", retry_after=self.settings.retry_after_seconds)
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                continue
            current = self.router.services.get(svc.key)
            if current is None:
                raise t.OpenAIError(404, f"model {svc.key[1]} was deleted", code="model_not_found")
            self._check_servable(current)
            address = self.router.pick(svc.key)
            if address is not None:
                m.HOLD_SECONDS.labels(*svc.key).observe(self.clock() - started)
                return address

    def _check_servable(self, svc: Service) -> None:
        if self.draining:
            m.REJECTED.labels("unavailable").inc()
            raise t.OpenAIError(503, "the gateway is shutting down; retry", "service_unavailable",
                                code="gateway_stopping", retry_after=1)
        if svc.degraded and not self.router.endpoints(svc.key):
            m.REJECTED.labels("unavailable").inc()
            raise t.OpenAIError(503, f"model {svc.key[1]} cannot serve: {svc.degraded}", "service_unavailable",
                                code="model_unavailable", retry_after=self.settings.retry_after_seconds)

    def drain(self) -> None:
        """The gateway stops: no new holds, and the held requests are answered 503 at once."""
        self.draining = True
        self.wakeups.wake_all()
