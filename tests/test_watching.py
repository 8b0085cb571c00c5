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
