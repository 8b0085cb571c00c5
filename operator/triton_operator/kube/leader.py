"""Leader election on a coordination.k8s.io Lease, so several operator replicas can run and only
one acts. Losing the lease stops the operator; the pod restarts and becomes a follower. A leader
that stops cleanly gives the lease up (as client-go's ReleaseOnCancel), so a follower takes over
in seconds rather than after the lease expires.

Every call on the Lease is bounded in time and tried once, and a call that fails on the way
(refused, reset, no answer in time) is a failed attempt, as client-go counts it: the leader tries
again every RETRY_SECONDS. It stops leading once RENEW_DEADLINE_SECONDS pass since its last
renewal, whatever the election loop is doing, so it has stopped before the lease can expire for
a follower (LEASE_SECONDS after that renewal at the earliest). Unbounded, a request the API server
never answered held the renewal for good while the leader went on acting and a follower took the
expired lease; and one refused connection (an API server restarting) made the leader exit."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Callable

import urllib3

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from .client import describe_api_error, load_config

log = logging.getLogger(__name__)
# The leader renews every RETRY_SECONDS (a GET and an UPDATE of the Lease: 24 requests a minute,
# the operator's main cost at rest); a follower takes over at most LEASE_SECONDS after the leader
# stopped renewing.
LEASE_SECONDS, RENEW_DEADLINE_SECONDS, RETRY_SECONDS = 30, 20, 5
# One Lease request (connect, read), tried once.
REQUEST_TIMEOUT_SECONDS = (2.0, 2.0)
_WRITES = ("create_namespaced_lease", "replace_namespaced_lease")


class BoundedLeaseApi:
    """The Lease API with a time bound on each call and no retries below it; a failure on the
    way is an ApiException (status 0), which the election counts as a failed attempt instead of
    dying of it. `written` is the monotonic time of the last write that succeeded."""

    def __init__(self, timeout: tuple[float, float] = REQUEST_TIMEOUT_SECONDS, api: Any = None):
        if api is None:
            config = client.Configuration.get_default_copy()
            config.retries = False
            api = client.CoordinationV1Api(client.ApiClient(config))
        self._api, self._timeout = api, timeout
        self.written: float | None = None

    def __getattr__(self, name: str) -> Callable[..., Any]:
        call = getattr(self._api, name)

        def bounded(*args: Any, **kwargs: Any) -> Any:
            try:
                out = call(*args, _request_timeout=self._timeout, **kwargs)
            except (urllib3.exceptions.HTTPError, OSError) as e:
                raise ApiException(status=0, reason=describe_api_error(e)) from None
            if name in _WRITES:
                self.written = time.monotonic()
            return out

        return bounded


def renewal_overdue(written: float | None, now: float, deadline: float = RENEW_DEADLINE_SECONDS) -> bool:
    """Whether a leader whose last renewal was at `written` must stop leading at `now`."""
    return written is None or now - written > deadline


RELEASE_ATTEMPTS = 3   # a release that meets this process's own renewal (409) reads the lease again


class Leadership:
    def __init__(self, namespace: str, name: str, identity: str):
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lost = threading.Event()

    def release(self) -> None:
        """Give the lease up if this process still holds it (best effort: it expires anyway)."""
        api = BoundedLeaseApi()
        for attempt in range(RELEASE_ATTEMPTS):
            try:
                lease = api.read_namespaced_lease(self.name, self.namespace)
                if lease.spec.holder_identity != self.identity:
                    return
                # An update (the verb election already holds), guarded by the resourceVersion just read.
                now = datetime.now(timezone.utc)
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                lease.spec.renew_time = lease.spec.acquire_time = now
                api.replace_namespaced_lease(self.name, self.namespace, lease)
                log.info("released the lease %s/%s", self.namespace, self.name)
                return
            except ApiException as e:
                if e.status == 409 and attempt + 1 < RELEASE_ATTEMPTS:
                    continue   # this process's own last renewal came in between: read it again
                log.warning("could not release the lease %s/%s: %s", self.namespace, self.name,
                            describe_api_error(e))
                return


def campaign(namespace: str, name: str = "triton-operator") -> tuple[Leadership, threading.Event]:
    """Start campaigning for the lease (in a thread); returns the Leadership and the event set once
    this process leads. `lost` is set when it stops leading, or when the campaign ends before it
    could lead (its thread died)."""
    load_config()
    identity = f"{os.environ.get('HOSTNAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    leadership = Leadership(namespace, name, identity)
    leading = threading.Event()
    lock = LeaseLock(name, namespace, identity)
    api = lock.api_instance = BoundedLeaseApi()
    config = electionconfig.Config(
        lock, lease_duration=LEASE_SECONDS, renew_deadline=RENEW_DEADLINE_SECONDS,
        retry_period=RETRY_SECONDS, onstarted_leading=leading.set, onstopped_leading=leadership.lost.set)
    election = leaderelection.LeaderElection(config)

    def run() -> None:
        try:
            election.run()
        finally:
            leadership.lost.set()

    def watch() -> None:
        while not leading.wait(1.0):
            if leadership.lost.is_set():
                return
        while not leadership.lost.wait(1.0):
            if renewal_overdue(api.written, time.monotonic()):
                log.warning("the lease %s/%s was not renewed for %d s; stepping down", namespace, name,
                            RENEW_DEADLINE_SECONDS)
                leadership.lost.set()

    threading.Thread(target=run, name="leader-election", daemon=True).start()
    threading.Thread(target=watch, name="lease-watchdog", daemon=True).start()
    log.info("waiting to lead (lease %s/%s, identity %s)", namespace, name, identity)
    return leadership, leading


def wait_to_lead(leadership: Leadership, leading: threading.Event, stopping: threading.Event) -> bool:
    """Block until this process leads (True) or `stopping` is set (False)."""
    while not leading.wait(0.2):
        if stopping.is_set():
            return False
        if leadership.lost.is_set():
            raise RuntimeError("leader election stopped before this process could lead")
    log.info("leading as %s", leadership.identity)
    return True
