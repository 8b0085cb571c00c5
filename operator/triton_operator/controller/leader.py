"""Leader election on a coordination.k8s.io Lease, so several operator replicas can run and only
one acts. Losing the lease stops the operator; the pod restarts and becomes a follower."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from .k8s import load_config

log = logging.getLogger(__name__)


def elect(namespace: str, name: str = "triton-operator") -> threading.Event:
    """Block until this process leads; return an Event that is set when leadership is lost."""
    load_config()
    identity = f"{os.environ.get('HOSTNAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    leading, lost = threading.Event(), threading.Event()
    config = electionconfig.Config(
        LeaseLock(name, namespace, identity), lease_duration=15, renew_deadline=10, retry_period=2,
        onstarted_leading=leading.set, onstopped_leading=lost.set)
    election = leaderelection.LeaderElection(config)

    def campaign() -> None:
        try:
            election.run()
        finally:
            lost.set()

    threading.Thread(target=campaign, name="leader-election", daemon=True).start()
    log.info("waiting to lead (lease %s/%s, identity %s)", namespace, name, identity)
    while not leading.wait(1):
        if lost.is_set():
            raise RuntimeError("leader election stopped before this process could lead")
    log.info("leading as %s", identity)
    return lost
