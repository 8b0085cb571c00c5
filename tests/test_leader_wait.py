"""Waiting for the lease: it ends when this process leads, when it is told to stop (SIGTERM/SIGINT
set a flag, so the hand-over is never cut by an exception), or when the campaign died."""

from __future__ import annotations

import threading

import pytest
import urllib3

from triton_operator.kube.leader import Leadership, wait_to_lead


def events() -> tuple[Leadership, threading.Event, threading.Event]:
    return Leadership("triton-system", "triton-operator", "me"), threading.Event(), threading.Event()


def test_it_returns_true_once_this_process_leads():
    leadership, leading, stopping = events()
    threading.Timer(0.3, leading.set).start()
    assert wait_to_lead(leadership, leading, stopping) is True


def test_a_stop_while_waiting_returns_false_without_raising():
    leadership, leading, stopping = events()
    threading.Timer(0.3, stopping.set).start()
    assert wait_to_lead(leadership, leading, stopping) is False


def test_the_lease_won_in_the_instant_of_a_stop_still_counts_as_leading():
    """The caller then runs kopf with the stop flag set: kopf stops at once and the lease is released."""
    leadership, leading, stopping = events()
    leading.set()
    stopping.set()
    assert wait_to_lead(leadership, leading, stopping) is True


def test_a_campaign_that_died_before_leading_is_an_error():
    leadership, leading, stopping = events()
    leadership.lost.set()
    with pytest.raises(RuntimeError, match="leader election stopped before this process could lead"):
        wait_to_lead(leadership, leading, stopping)


# -- the lease's calls, bounded ------------------------------------------------------------------

class _LeaseCalls:
    """Stands in for the generated CoordinationV1Api (the e2e suite drives the real one through a
    fault proxy): records each call's keyword arguments and fails as it is told."""

    def __init__(self, fail: BaseException | None = None):
        self.fail, self.calls = fail, []

    def read_namespaced_lease(self, name, namespace, **kwargs):
        self.calls.append(("read", kwargs))
        if self.fail is not None:
            raise self.fail
        return {"name": name}

    def replace_namespaced_lease(self, name, namespace, body, **kwargs):
        self.calls.append(("replace", kwargs))
        if self.fail is not None:
            raise self.fail
        return body


def test_every_lease_call_is_bounded_and_a_write_that_succeeds_is_remembered():
    from triton_operator.kube.leader import REQUEST_TIMEOUT_SECONDS, BoundedLeaseApi
    calls = _LeaseCalls()
    api = BoundedLeaseApi(api=calls)
    assert api.read_namespaced_lease("l", "ns") == {"name": "l"} and api.written is None, "a read renews nothing"
    assert api.replace_namespaced_lease("l", "ns", body="b") == "b" and api.written is not None
    assert calls.calls == [("read", {"_request_timeout": REQUEST_TIMEOUT_SECONDS}),
                           ("replace", {"_request_timeout": REQUEST_TIMEOUT_SECONDS})]


@pytest.mark.parametrize("error", [
    urllib3.exceptions.ReadTimeoutError(None, "/apis", "read timed out"),
    urllib3.exceptions.MaxRetryError(None, "/apis"),
    ConnectionResetError(104, "Connection reset by peer"),
])
def test_a_call_that_fails_on_the_way_is_a_failed_attempt_not_a_dead_election(error):
    """The election catches ApiException only: anything else ended its thread, and the leader
    exited on one refused connection."""
    from kubernetes.client.exceptions import ApiException

    from triton_operator.kube.leader import BoundedLeaseApi
    api = BoundedLeaseApi(api=_LeaseCalls(fail=error))
    with pytest.raises(ApiException) as raised:
        api.replace_namespaced_lease("l", "ns", body="b")
    assert raised.value.status == 0 and raised.value.reason == f"API server unreachable: {type(error).__name__}"
    assert api.written is None


def test_a_leader_steps_down_once_the_renew_deadline_passed_since_its_last_renewal():
    from triton_operator.kube.leader import LEASE_SECONDS, RENEW_DEADLINE_SECONDS, renewal_overdue
    assert RENEW_DEADLINE_SECONDS + 2 <= LEASE_SECONDS, "it has stopped before a follower may take the lease"
    assert not renewal_overdue(100.0, 100.0 + RENEW_DEADLINE_SECONDS)
    assert renewal_overdue(100.0, 100.0 + RENEW_DEADLINE_SECONDS + 0.1)
    assert renewal_overdue(None, 0.0), "never renewed: not leading"
