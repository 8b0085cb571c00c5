"""Holding: a request for a service whose replicas are starting (scaled to zero, new, scaling up)
waits for one, bounded by the hold queues (`limits.Holds`) and hold_timeout_seconds, and is woken
when the watches see the service's replicas or state change, or when the gateway stops. A service
whose replicas are up but unusable is answered at once, saying why."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from . import limits
from . import openai_schema as oai
from . import telemetry as m
from . import tracing as tr
from .auth import Caller
from .config import GatewaySettings
from .routing import Address, Beginning, Router, Service, ServiceKey

log = logging.getLogger(__name__)

UNUSABLE_GRACE_SECONDS = 5.0   # a service with ready replicas the gateway cannot use: answered 503 after this
EJECT_SECONDS = 30.0           # a replica that failed to connect sits out this long
LOG_EVERY_SECONDS = 60.0       # one line per service about replicas it cannot use, at most this often


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


@dataclass(eq=False)
class Holding:
    """Holds a request only while it will be answered: while the service's replicas are starting
    (it scales from zero, is new, or has fewer ready replicas than it asked for). A service that says
    it has its replicas but none the gateway can use gets a 503 saying why within
    UNUSABLE_GRACE_SECONDS (the EndpointSlices may lag the status by a moment), with a log line
    (once a minute per service) and triton_gateway_rejected_requests_total{reason="no_usable_replica"}."""

    settings: GatewaySettings
    router: Router
    holds: limits.Holds
    wakeups: Wakeups
    clock: Callable[[], float]
    tracing: tr.Off | tr.On
    # the key's grant as the gateway holds it now (None: revoked): a held request is looked at again
    # before it goes to a replica (a key revoked or narrowed while its request waited was answered 200)
    grant_of: Callable[[str], Any] | None = None
    draining: bool = field(default=False, init=False)
    # service -> when its last no-usable-replica line was logged
    _said: dict[ServiceKey, float] = field(default_factory=dict, init=False)

    async def endpoint(self, svc: Service, caller: Caller, begins: Beginning | None = None) -> Address:
        """A usable replica for `svc` (by its Beginning when the request has one: routing.Router.pick),
        waiting for one (bounded, and within the caller's share of the service's hold queue) while
        its replicas are starting."""
        now = self.clock()
        address = self.router.pick(svc.key, now, begins)
        if address is not None:
            return address
        self._check_servable(svc)
        self._check_reachable(svc, now)
        full = self.holds.admit(svc.key, caller.digest)
        if full is not None:
            m.REJECTED.labels("hold_full").inc()
            if full in ("key", "key_total"):
                waiting = (f"{self.holds.per_key} requests waiting for it" if full == "key" else
                           f"{self.holds.per_key_total} requests waiting for models that are starting")
                raise oai.OpenAIError(429, f"model {svc.key[1]} is starting and API key {caller.grant.name} has "
                                         f"{waiting} already (its share); retry later", "rate_limit_error",
                                    code="hold_share_full", retry_after=self.settings.retry_after_seconds)
            waiting = (f"{self.holds.held(svc.key)} requests already wait for it" if full == "service" else
                       f"the gateway holds as many requests for starting models as it takes ({self.holds.total})")
            raise oai.OpenAIError(503, f"model {svc.key[1]} is starting and {waiting}; retry later",
                                "service_unavailable", code="model_starting",
                                retry_after=self.settings.retry_after_seconds)
        gauge = m.HELD.labels(*svc.key)
        gauge.inc()
        # one deadline for the request, whatever number of waits it takes (for a replica, then its
        # chat template, then again to send): each wait began its own, and 1 s held 1.8 s
        if caller.held_since is None:
            caller.held_since = now
        try:
            with self.tracing.span("gateway.hold", {tr.NAMESPACE: svc.key[0], tr.NAME: svc.key[1]}):
                return await self._wait_for_replica(svc, now, caller.held_since, begins, caller)
        finally:
            self.holds.leave(svc.key, caller.digest)
            gauge.dec()

    async def _wait_for_replica(self, svc: Service, started: float, first: float, begins: Beginning | None = None,
                                caller: Caller | None = None) -> Address:
        """The wait of endpoint(), begun at `started` (the request's first wait at `first`): until a
        replica is usable, the service goes away or fails, its caller's key is revoked or may no
        longer use it, or the wait's deadline passes: hold_timeout_seconds from the request's first
        wait, and UNUSABLE_GRACE_SECONDS once its replicas are no longer starting (counted from
        then: a service whose status said ready a moment before its EndpointSlice came was a 503 at
        once). Which one passed says the answer: a hold that ran out is model_starting whatever the
        replicas say by then, where no_usable_replica is for replicas ready and out of reach."""
        settled: float | None = None   # since when its replicas are not starting (ready, or none asked for)
        while True:
            event = self.wakeups.event(svc.key)
            starting = svc.starting()
            now = self.clock()
            settled = None if starting else (settled if settled is not None else now)
            held_until = first + self.settings.hold_timeout_seconds
            deadline = held_until if settled is None else min(held_until, settled + UNUSABLE_GRACE_SECONDS)
            remaining = deadline - now
            if remaining <= 0:
                if settled is not None and now < held_until:
                    raise self._unusable(svc)
                m.REJECTED.labels("hold_timeout").inc()
                raise oai.OpenAIError(
                    503, f"model {svc.key[1]} has no ready replica after "
                         f"{self.settings.hold_timeout_seconds:.0f}s; it may still be starting: retry later",
                    "service_unavailable", code="model_starting", retry_after=self.settings.retry_after_seconds)
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                continue
            current = self.router.services.get(svc.key)
            if current is None:
                raise oai.OpenAIError(404, f"model {svc.key[1]} was deleted", code="model_not_found")
            svc = current
            if caller is not None and self.grant_of is not None:
                self._check_still_allowed(caller, svc)
            self._check_servable(svc)
            now = self.clock()
            address = self.router.pick(svc.key, now, begins)
            if address is not None:
                m.HOLD_SECONDS.labels(*svc.key).observe(now - started)
                return address
            self._check_reachable(svc, now)

    def _check_still_allowed(self, caller: Caller, svc: Service) -> None:
        """401 when the caller's key was revoked while its request was held, 403 when it may no
        longer use the service (as a new request with it would be answered); else the caller holds
        the key's grant as it is now (its limits, changed meanwhile, apply to what follows), unless
        it reserved tokens already (a wait to send: they settle under the grant that took them)."""
        assert self.grant_of is not None
        grant = self.grant_of(caller.digest)
        if grant is None:
            m.REJECTED.labels("unauthorized").inc()
            raise oai.OpenAIError(401, "invalid API key", code="invalid_api_key")
        if not caller.reserved:
            caller.grant = grant   # a reservation taken is settled under the grant it was taken under
        if not grant.allows(svc.key):
            m.REJECTED.labels("forbidden").inc()
            raise oai.OpenAIError(403, f"this API key may not use model {svc.key[1]!r}", "permission_error",
                                code="model_not_allowed", param="model")

    def _unusable(self, svc: Service) -> oai.OpenAIError:
        """The 503 (and the log line and metric) for a service that has its replicas, none usable."""
        m.REJECTED.labels("no_usable_replica").inc()
        if svc.desired == 0:
            why = f"model {svc.key[1]} has no replicas (it is scaled to 0 and does not scale from zero)"
        else:
            why = (f"model {svc.key[1]} reports {svc.ready} ready replica(s) but the gateway can reach none: "
                   f"{self.router.why_no_endpoint(svc.key)}")
        self._say(svc.key, why)
        return oai.OpenAIError(503, why, "service_unavailable", code="no_usable_replica",
                             retry_after=self.settings.retry_after_seconds)

    def _check_reachable(self, svc: Service, now: float) -> None:
        """Every ready replica failed to connect a moment ago (outlier ejection): a 503 at once."""
        if not self.router.endpoints(svc.key) or self.router.usable(svc.key, now):
            return
        m.REJECTED.labels("replicas_unreachable").inc()
        until = min(self.router.ejected.get(a, now) for a in self.router.endpoints(svc.key))
        why = (f"model {svc.key[1]}: every ready replica refused the connection or timed out in the last "
               f"{EJECT_SECONDS:.0f}s")
        self._say(svc.key, why)
        raise oai.OpenAIError(503, why + "; retry later", "service_unavailable", code="upstream_unreachable",
                            retry_after=max(1.0, until - now))

    def _say(self, key: ServiceKey, why: str) -> None:
        now = self.clock()
        if now - self._said.get(key, -LOG_EVERY_SECONDS) >= LOG_EVERY_SECONDS:
            self._said[key] = now
            log.warning("%s/%s: %s", key[0], key[1], why)

    def _check_servable(self, svc: Service) -> None:
        if self.draining:
            m.REJECTED.labels("unavailable").inc()
            raise oai.OpenAIError(503, "the gateway is shutting down; retry", "service_unavailable",
                                code="gateway_stopping", retry_after=1)
        if svc.degraded and not self.router.endpoints(svc.key):
            m.REJECTED.labels("unavailable").inc()
            raise oai.OpenAIError(503, f"model {svc.key[1]} cannot serve: {svc.degraded}", "service_unavailable",
                                code="model_unavailable", retry_after=self.settings.retry_after_seconds)

    def drain(self) -> None:
        """The gateway stops: no new holds, and the held requests are answered 503 at once."""
        self.draining = True
        self.wakeups.wake_all()
