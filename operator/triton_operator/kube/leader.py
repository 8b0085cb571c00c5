"""Leader election on a coordination.k8s.io Lease, so several operator replicas can run and only
one acts. Losing the lease stops the operator; the pod restarts and becomes a follower. A leader
that stops cleanly gives the lease up (as client-go's ReleaseOnCancel), so a follower takes over
in seconds rather than after the lease expires."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from datetime import datetime, timezone

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


class Leadership:
    def __init__(self, namespace: str, name: str, identity: str):
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lost = threading.Event()

    def release(self) -> None:
        """Give the lease up if this process still holds it (best effort: it expires anyway)."""
        api = client.CoordinationV1Api()
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
        except (ApiException, OSError) as e:
            log.warning("could not release the lease %s/%s: %s", self.namespace, self.name, describe_api_error(e))


def campaign(namespace: str, name: str = "triton-operator") -> tuple[Leadership, threading.Event]:
    """Start campaigning for the lease (in a thread); returns the Leadership and the event set once
    this process leads. `lost` is set when it stops leading, or when the campaign ends before it
    could lead (its thread died)."""
    load_config()
    identity = f"{os.environ.get('HOSTNAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    leadership = Leadership(namespace, name, identity)
    leading = threading.Event()
    config = electionconfig.Config(
        LeaseLock(name, namespace, identity), lease_duration=LEASE_SECONDS, renew_deadline=RENEW_DEADLINE_SECONDS,
        retry_period=RETRY_SECONDS, onstarted_leading=leading.set, onstopped_leading=leadership.lost.set)
    election = leaderelection.LeaderElection(config)

    def run() -> None:
        try:
            election.run()
        finally:
            leadership.lost.set()

    threading.Thread(target=run, name="leader-election", daemon=True).start()
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
