"""The list-then-watch protocol both informer faces follow (kube/watching.py): the queries they
send, how each watch event moves the resourceVersion, when a kind is listed again, the pauses
after failures."""

from __future__ import annotations

import pytest

from triton_operator.kube.watching import (RETRY_MAX, Retry, WatchFailed, list_query, page_end, read_event,
                                           watch_query)


def test_queries_leave_out_what_is_not_given():
    assert list_query(None, None, None) == {"limit": "500"}
    assert list_query("a=b", "status.phase!=Failed", "tok", 50) == {
        "limit": "50", "labelSelector": "a=b", "fieldSelector": "status.phase!=Failed", "continue": "tok"}
    assert watch_query("42", None, None) == {"watch": "true", "resourceVersion": "42", "allowWatchBookmarks": "true",
                                             "timeoutSeconds": "300"}
    assert watch_query("42", "a=b", None, 10)["labelSelector"] == "a=b"


def test_a_page_says_whether_more_follow_and_where_to_watch_from():
    assert page_end({"metadata": {"continue": "next", "resourceVersion": "7"}}) == ("next", "7")
    assert page_end({"metadata": {"continue": "", "resourceVersion": "9"}}) == (None, "9")
    assert page_end({}) == (None, "")


@pytest.mark.parametrize("event, resumed, change", [
    ({"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "11"}}}, "11", "ADDED"),
    ({"type": "DELETED", "object": {"metadata": {"name": "a", "resourceVersion": "12"}}}, "12", "DELETED"),
    ({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}}, "20", None),
    ({"type": "MODIFIED", "object": {"metadata": {"name": "a"}}}, "10", "MODIFIED"),   # keeps the last version
    ({"type": "ERROR", "object": {"code": 410, "reason": "Expired"}}, None, None),    # list again
])
def test_each_event_moves_the_resource_version(event, resumed, change):
    assert read_event(event, "10")[:2] == (resumed, change)


def test_an_error_event_other_than_expiry_is_a_failure_with_the_servers_words():
    with pytest.raises(WatchFailed) as e:
        read_event({"type": "ERROR", "object": {"code": 500, "reason": "InternalError", "message": "etcd down"}}, "1")
    assert (e.value.status, str(e.value)) == (500, "500 InternalError: etcd down")


def test_pauses_double_up_to_the_cap_and_start_over_after_a_success():
    retry = Retry()
    assert [retry.failed() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, RETRY_MAX, RETRY_MAX]
    retry.succeeded()
    assert retry.failed() == 1.0


# -- waiting for the API server to answer again ---------------------------------------------------------

def test_every_watch_waiting_for_the_api_server_reopens_on_the_first_probe_it_answers():
    """One probe loop for all waiters; each returns as soon as a probe succeeds after it began to
    wait (not after a doubling pause), and the loop stops once they are served."""
    import threading
    import time

    from triton_operator.kube.reach import Reachability, unreachable

    assert [unreachable(s) for s in (0, 503, 502, 504, 403, 429, 500)] == [True] * 4 + [False] * 3
    up = threading.Event()
    reach = Reachability(lambda: up.is_set(), interval=0.02, jitter=0.01)
    stopped = threading.Event()
    results: list[tuple[bool, float]] = []

    def waiter() -> None:
        t0 = time.monotonic()
        results.append((reach.wait(stopped, cap=10.0), time.monotonic() - t0))

    threads = [threading.Thread(target=waiter) for _ in range(5)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert results == [] and reach.probes >= 5   # still probing: nobody is served before the server answers
    up.set()
    for t in threads:
        t.join(5)
    assert len(results) == 5 and all(ok for ok, _ in results)
    assert max(waited for _, waited in results) < 1.0
    probes = reach.probes
    time.sleep(0.1)
    assert reach.probes == probes, "the loop stopped once the waiters were served"
    up.clear()
    assert reach.wait(stopped, cap=0.1) is False   # a server that stays away: the cap
    stopped.set()
    assert reach.wait(stopped, cap=10.0) is False  # a stopped watch returns at once


def test_a_parent_kinds_cache_is_not_fresh_from_a_broken_watch_until_it_is_listed_again():
    """The InferenceServices' informer (relist_after_gap) marks the kind stale when its watch
    breaks, lists it again rather than resuming, and marks it fresh once listed."""
    import threading

    from triton_operator.kube.client import ApiError
    from triton_operator.kube.failures import FailureLog
    from triton_operator.kube.informer import Informer
    from triton_operator.kube.kinds import Kind
    from triton_operator.kube.store import Store

    kind = Kind("serving.triton-operator.io/v1alpha1", "InferenceService", "inferenceservices")
    store = Store()
    listed = threading.Event()
    calls: list[str] = []

    class Api:
        def __init__(self) -> None:
            self.watches = 0

        def list(self, kind, namespace, selector, field_selector=None, project=None):
            calls.append("list")
            if calls.count("list") == 2:
                assert not store.fresh("InferenceService"), "stale until listed again"
                listed.set()
            return [{"metadata": {"name": "a", "namespace": "ml", "resourceVersion": "1"}}], "1"

        def watch(self, *args, **kwargs):
            calls.append("watch")
            self.watches += 1
            if self.watches == 1:
                raise ApiError(0, "Unreachable", "API server unreachable: ConnectionResetError")
            informer.stopped.wait(5)
            return iter(())

        def ready(self) -> bool:
            return True

    import logging

    from triton_operator.kube.reach import Reachability

    api = Api()
    informer = Informer(api, store, kind, None, lambda *a: None, FailureLog(logging.getLogger("t")),  # type: ignore[arg-type]
                        reach=Reachability(api.ready, interval=0.01, jitter=0.0), relist_after_gap=True)
    informer.start()
    assert listed.wait(5)
    for _ in range(100):
        if store.fresh("InferenceService") and calls[-1] == "watch":
            break
        threading.Event().wait(0.01)
    informer.stop()
    assert calls[:4] == ["list", "watch", "list", "watch"] and store.fresh("InferenceService")


def test_a_watch_that_opens_and_fails_at_once_backs_off_and_logs_a_summary(caplog):
    """The API server answers, and every watch it opens ends at once with an ERROR event (a 500:
    the server's own trouble, which waiting for it to answer does not cure). The informer counted
    the opening as a success: the pause never doubled, the probe (which the server answers) let it
    list and watch again within a probe interval, and each round logged "recovered" and the error
    again. Now the pause doubles from a second and the log keeps to its first line and summaries."""
    import logging
    import time

    from triton_operator.kube.failures import FailureLog
    from triton_operator.kube.informer import Informer
    from triton_operator.kube.kinds import Kind
    from triton_operator.kube.reach import Reachability
    from triton_operator.kube.store import Store

    kind = Kind("serving.triton-operator.io/v1alpha1", "InferenceService", "inferenceservices")
    calls: list[str] = []

    class Api:
        def list(self, kind, namespace, selector, field_selector=None, project=None):
            calls.append("list")
            return [{"metadata": {"name": "a", "namespace": "ml", "resourceVersion": "1"}}], "1"

        def watch(self, *args, **kwargs):
            calls.append("watch")
            return iter([{"type": "ERROR", "object": {"code": 500, "reason": "InternalError",
                                                      "message": "etcdserver: request timed out"}}])

        def ready(self) -> bool:
            return True

    api = Api()
    log = logging.getLogger("test.informer")
    informer = Informer(api, Store(), kind, None, lambda *a: None, FailureLog(log),  # type: ignore[arg-type]
                        reach=Reachability(api.ready, interval=0.01, jitter=0.0), relist_after_gap=True)
    with caplog.at_level(logging.WARNING, logger="test.informer"):
        informer.start()
        time.sleep(1.5)   # the first pause is a second: two rounds at most
        informer.stop()
    assert 1 <= calls.count("watch") <= 2 and calls.count("list") <= 2, calls
    lines = [r.getMessage() for r in caplog.records if r.name == "test.informer"]
    assert lines and not any("recovered" in line for line in lines), lines
    assert "500 InternalError: etcdserver: request timed out" in lines[0]


def test_keys_added_low_wait_behind_every_other_key_and_move_up_when_added_again():
    from triton_operator.kube.queue import WorkQueue

    q = WorkQueue()
    for i in range(3):
        q.add(("ml", f"old-{i}"), low=True)
    q.add(("ml", "new"))
    q.add(("ml", "old-2"))            # changed meanwhile: it moves up, once
    q.add(("ml", "old-0"), low=True)  # already waiting low: no second entry
    assert len(q) == 4
    order = []
    while (key := q.get(timeout=0.01)) is not None:
        order.append(key[1])
        q.done(key)
    assert order == ["new", "old-2", "old-0", "old-1"] and q.idle()
    # a low key added while it is processed comes back, low, after the others
    q.add(("ml", "a"), low=True)
    k = q.get(timeout=0.01)
    q.add(("ml", "a"), low=True)
    q.add(("ml", "b"))
    q.done(k)
    assert [q.get(timeout=0.01)[1], q.get(timeout=0.01)[1]] == ["b", "a"]
