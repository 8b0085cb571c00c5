"""The autoscaler's Prometheus source against a stand-in HTTP server answering what a URL that is
not a Prometheus (or a broken proxy in front of one) may answer with 200: every such answer is a
failed query with a reason, so the policy holds replicas, never a tick that raises. A real
Prometheus is driven by e2e/test_autoscaling_queries.py; this one answers with bytes chosen here."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from triton_operator.autoscaling.prometheus import NOT_PROMETHEUS, SIGNAL_LABEL, PrometheusSource
from triton_operator.settings import Settings

ANSWER: dict[str, bytes] = {}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:   # noqa: N802 - http.server's name
        body = ANSWER["body"]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def source() -> Iterator[PrometheusSource]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield PrometheusSource(Settings(prometheus_url=f"http://127.0.0.1:{server.server_address[1]}",
                                        prometheus_timeout_seconds=2))
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("answer", [
    {"status": "ok"},                                   # some other JSON API
    {"data": {"resultType": "vector"}},                 # no result
    {"data": "result"},                                 # data not an object
    {"status": "success", "data": {"result": "x"}},     # a result that is not a list
    ["a", "list"],
])
def test_a_200_that_is_not_a_query_result_is_a_failed_query_with_its_reason(source, answer):
    ANSWER["body"] = json.dumps(answer).encode()
    snap = source.snapshot()
    assert snap.error == NOT_PROMETHEUS
    assert snap.errors["queue"] == NOT_PROMETHEUS and snap.queries == 1


def test_a_200_that_is_not_json_is_a_failed_query(source):
    ANSWER["body"] = b"<html>sign in</html>"
    snap = source.snapshot()
    assert snap.error is not None and snap.error != NOT_PROMETHEUS and snap.queries == 1


def test_series_of_the_wrong_shape_are_skipped_and_the_rest_read():
    from triton_operator.autoscaling.prometheus import parse

    good = {"metric": {SIGNAL_LABEL: "queue", "namespace": "ml", "inferenceservice": "llama"}, "value": [0, "3"]}
    snap = parse(["x", {"metric": "y"}, {"value": [0, "1"]}, good], Settings())
    assert snap.queue == {("ml", "llama"): 3.0}


def test_a_query_result_is_read(source):
    good = {"metric": {SIGNAL_LABEL: "queue", "namespace": "ml", "inferenceservice": "llama"}, "value": [0, "2"]}
    ANSWER["body"] = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [good]}}).encode()
    snap = source.snapshot()
    assert snap.error is None and snap.queue == {("ml", "llama"): 2.0}
