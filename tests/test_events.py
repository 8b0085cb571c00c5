"""Events aggregated as client-go's recorder does: a repeat within the window raises the count of
the event already posted (a merge patch of count and lastTimestamp), a different message or
object is an event of its own, an expired one is posted anew; memory is bounded."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from triton_operator.kube import events
from triton_operator.kube.client import ApiError, Kube
from triton_operator.kube.events import Event, EventSeries


class Recording(Kube):
    def __init__(self) -> None:
        super().__init__("triton-operator", configuration=client.Configuration())
        self.calls: list[tuple[str, str, Any]] = []
        self.gone: set[str] = set()

    def request(self, method: str, path: str, query: Any = None, body: Any = None, content_type: Any = None) -> dict:
        self.calls.append((method, path, body))
        if method == "PATCH" and path.rsplit("/", 1)[1] in self.gone:
            raise ApiError(404, "NotFound", "events \"x\" not found", {})
        if method == "POST":
            return {"metadata": {"name": f"svc.{len(self.calls)}"}}
        return {}


SVC = {"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
       "metadata": {"name": "svc", "namespace": "ml", "uid": "u-1"}}


def test_a_repeated_event_raises_the_count_of_the_first():
    kube = Recording()
    degraded = Event("Warning", "GPUClassNotFound", "GPUClass x100 does not exist")
    for _ in range(3):
        kube.post_event(SVC, degraded)
    (post, body), patches = (kube.calls[0][0], kube.calls[0][2]), kube.calls[1:]
    assert post == "POST" and body["count"] == 1 and body["firstTimestamp"] == body["lastTimestamp"]
    assert [(m, p, b["count"]) for m, p, b in patches] == [
        ("PATCH", "/api/v1/namespaces/ml/events/svc.1", 2), ("PATCH", "/api/v1/namespaces/ml/events/svc.1", 3)]
    assert set(patches[0][2]) == {"count", "lastTimestamp"}


def test_another_message_or_object_is_an_event_of_its_own():
    kube = Recording()
    kube.post_event(SVC, Event("Normal", "Scaled", "replicas 1 -> 2"))
    kube.post_event(SVC, Event("Normal", "Scaled", "replicas 2 -> 3"))
    other = {**SVC, "metadata": {**SVC["metadata"], "name": "other", "uid": "u-2"}}
    kube.post_event(other, Event("Normal", "Scaled", "replicas 1 -> 2"))
    assert [m for m, _, _ in kube.calls] == ["POST", "POST", "POST"]


def test_an_event_the_api_server_expired_is_posted_anew():
    kube = Recording()
    e = Event("Warning", "Unschedulable", "0/4 nodes")
    kube.post_event(SVC, e)
    kube.gone.add("svc.1")
    kube.post_event(SVC, e)
    assert [m for m, _, _ in kube.calls] == ["POST", "PATCH", "POST"]
    assert kube.calls[-1][2]["count"] == 1


def test_the_window_and_the_bound():
    series = EventSeries(window=600, capacity=2)
    series.posted(("a",), "a.1", 0)
    assert series.seen(("a",), 599) == ("a.1", 2)
    assert series.seen(("a",), 599 + 601) is None, "past the window from its last occurrence: a new series"
    series.posted(("a",), "a.2", 0)
    series.posted(("b",), "b.1", 1)
    series.posted(("c",), "c.1", 2)
    assert series.seen(("a",), 3) is None and series.seen(("c",), 3) == ("c.1", 2), "the oldest is forgotten"
    assert events.EVENT_SERIES_MAX == 4096
