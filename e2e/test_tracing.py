"""Traces end to end, against a real OTLP receiver: the OpenTelemetry Collector (the minimal build
of hack/install-otelcol.sh, OTLP receiver -> file exporter) on loopback, `triton-operator gateway`
as a process with the standard OTEL_* variables pointing at it (the chart's gateway
ServiceAccount, discovery from the local cluster's watches), the real openai client sending a
W3C traceparent, and a real Triton (the CPU build from the nvidia-pytriton wheel, serving the
textgen model through generate/generate_stream) tracing in its own OpenTelemetry mode
(--trace-config mode=opentelemetry) to the same collector. So the trace the collector holds is
checked whole: the gateway's spans in the client's trace, and Triton's own spans below the
gateway's upstream call, which is what proves the traceparent reached Triton (the exact header
value is checked in tests/test_tracing.py, in process).

Stand-in, because no container runs here: the InferenceService's pods are not started (no
operator in this module); its EndpointSlice (label endpointslice.kubernetes.io/managed-by:
e2e.triton-operator.io, as in e2e/test_gateway.py, which says why) is written by the test,
first empty (a service scaled to zero: the gateway holds the request), then with the local
Triton as its endpoint.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.request
import uuid
from typing import Any, Iterator

import openai
import pytest

from .cluster import Cluster, wait_for
from .conftest import GATEWAY_SERVICE_ACCOUNT, service_account_kubeconfig
from .harness.gateway import SLICE_MANAGER, TRITON_HOST, GatewayProcess
from .harness.otelcol import Collector
from .harness.textgen import TextGenTriton

NS = f"tracing-e2e-{uuid.uuid4().hex[:5]}"
SERVICE = "traced"
KEY = "sk-e2e-t-" + secrets.token_urlsafe(32)
TRACE_ID = uuid.uuid4().hex                 # the client's trace
CLIENT_SPAN = secrets.token_hex(8)          # the client's span, the gateway's parent
SERVER, INTERNAL, CLIENT = 2, 1, 3          # OTLP's SpanKind numbers


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    c = Collector(tmp_path_factory.mktemp("otelcol"))
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def triton(collector: Collector, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TextGenTriton]:
    server = TextGenTriton(tmp_path_factory.mktemp("triton"), token_ms=5, extra_args=[
        "--trace-config", "mode=opentelemetry", "--trace-config", "rate=1", "--trace-config", "level=TIMESTAMPS",
        "--trace-config", f"opentelemetry,url={collector.endpoint}/v1/traces",
        "--trace-config", "opentelemetry,resource=service.name=triton",
        "--trace-config", "opentelemetry,bsp_schedule_delay=200"])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def endpoint_slice(port: int, ready: bool) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{SERVICE}-e2e", "namespace": NS, "labels": {
                "kubernetes.io/service-name": SERVICE, "endpointslice.kubernetes.io/managed-by": SLICE_MANAGER}},
            "addressType": "FQDN", "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [TRITON_HOST], "conditions": {"ready": True}}] if ready else []}


@pytest.fixture(scope="module")
def gateway(installed: Cluster, collector: Collector, triton: TextGenTriton,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("gateway")
    keys = work / "keys.yaml"
    keys.write_text(json.dumps({"keys": [{"name": "tracer", "key": KEY, "namespaces": [NS]}]}))
    installed.kubectl("create", "namespace", NS)
    installed.apply([
        {"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
         "metadata": {"name": SERVICE, "namespace": NS},
         "spec": {"model": {"source": "hf://org/textgen", "format": "python", "name": "textgen"},
                  "gpu": {"class": "l4"}, "replicas": 1, "openai": {"defaultMaxTokens": 4}}},
        endpoint_slice(triton.http_port, ready=False)])
    gw = GatewayProcess(service_account_kubeconfig(installed, work, GATEWAY_SERVICE_ACCOUNT), keys, work, NS,
                        env={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_SERVICE_NAME": "triton-gateway",
                             "OTEL_TRACES_SAMPLER": "parentbased_always_on", "OTEL_BSP_SCHEDULE_DELAY": "200"})
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()
        installed.kubectl("delete", "namespace", NS, "--wait=false", check=False)


def held(gw: GatewayProcess) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{gw.metrics_port}/readyz", timeout=5) as r:
        return json.loads(r.read())["held"]


def trace_of(collector: Collector, trace_id: str, gateway_spans: int, triton_requests: int) -> list[dict[str, Any]]:
    """The trace's spans once the gateway's and Triton's have all arrived (batches come apart)."""
    def complete() -> list[dict[str, Any]] | None:
        spans = [s for s in collector.spans() if s["traceId"] == trace_id]
        mine = [s for s in spans if s["service"] == "triton-gateway"]
        theirs = [s for s in spans if s["service"] == "triton" and s["name"] == "InferRequest"]
        return spans if len(mine) >= gateway_spans and len(theirs) >= triton_requests else None
    return wait_for(f"trace {trace_id} in the collector", complete, timeout=30)


def test_a_held_request_is_one_trace_from_the_client_through_the_gateway_into_triton(
        installed: Cluster, gateway: GatewayProcess, triton: TextGenTriton, collector: Collector):
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0, timeout=60)
    wait_for("the gateway sees the service", lambda: [m.id for m in client.models.list().data] == [SERVICE],
             timeout=30)
    answer: dict[str, Any] = {}

    def ask() -> None:
        try:
            answer["reply"] = client.chat.completions.create(
                model=SERVICE, messages=[{"role": "user", "content": "alpha beta"}],
                extra_headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01", "tracestate": "e2e=1"})
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            answer["error"] = e

    asking = threading.Thread(target=ask)
    asking.start()
    wait_for("the request held (no replica yet)", lambda: held(gateway) == 1, timeout=30)
    time.sleep(0.3)
    installed.apply(endpoint_slice(triton.http_port, ready=True))   # the service woke up
    asking.join(60)
    assert not asking.is_alive() and "error" not in answer, answer
    assert answer["reply"].choices[0].message.content

    spans = trace_of(collector, TRACE_ID, gateway_spans=5, triton_requests=1)
    mine = {s["name"]: s for s in spans if s["service"] == "triton-gateway"}
    assert sorted(mine) == ["GET", "POST", "POST /v1/chat/completions", "gateway.hold", "gateway.route"]
    server = mine["POST /v1/chat/completions"]
    assert (server["kind"], server["parentSpanId"]) == (SERVER, CLIENT_SPAN)
    for name, kind in (("gateway.route", INTERNAL), ("gateway.hold", INTERNAL), ("GET", CLIENT), ("POST", CLIENT)):
        assert (mine[name]["kind"], mine[name]["parentSpanId"]) == (kind, server["spanId"]), name
    # the hold came first and lasted at least as long as the service had no replica
    assert int(mine["gateway.hold"]["endTimeUnixNano"]) - int(mine["gateway.hold"]["startTimeUnixNano"]) >= 300e6
    assert int(mine["gateway.hold"]["endTimeUnixNano"]) <= int(mine["GET"]["startTimeUnixNano"])
    assert int(mine["GET"]["endTimeUnixNano"]) <= int(mine["POST"]["startTimeUnixNano"])
    assert server["attributes"] == {
        "http.request.method": "POST", "http.route": "/v1/chat/completions", "url.path": "/v1/chat/completions",
        "url.scheme": "http", "http.response.status_code": 200, "triton.gateway.api_key.name": "tracer",
        "triton.inferenceservice.namespace": NS, "triton.inferenceservice.name": SERVICE}
    assert mine["POST"]["attributes"] == {
        "http.request.method": "POST", "server.address": TRITON_HOST, "server.port": triton.http_port,
        "url.path": "/v2/models/textgen/generate", "http.response.status_code": 200}
    assert mine["GET"]["attributes"]["url.path"] == "/v2/models/textgen/config"
    assert mine["POST"].get("traceState", "") == "e2e=1"
    # Triton's own spans: its request is a child of the gateway's upstream call (it read the
    # traceparent the gateway sent), its model's spans below it
    theirs = [s for s in spans if s["service"] == "triton"]
    [request] = [s for s in theirs if s["name"] == "InferRequest"]
    assert request["parentSpanId"] == mine["POST"]["spanId"]
    [model] = [s for s in theirs if s["name"] == "textgen"]
    assert model["parentSpanId"] == request["spanId"]
    assert model["attributes"]["triton.model_name"] == "textgen"
    # no API key anywhere the collector got, from either process
    text = collector.text()
    assert KEY not in text and "Bearer" not in text


def test_a_streamed_request_without_a_traceparent_starts_a_trace_that_triton_joins(
        gateway: GatewayProcess, collector: Collector):
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0, timeout=60)
    before = {s["traceId"] for s in collector.spans()}
    stream = client.chat.completions.create(model=SERVICE, messages=[{"role": "user", "content": "gamma"}],
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    def new_trace() -> str | None:
        ids = {s["traceId"] for s in collector.spans() if s["service"] == "triton-gateway"
               and s["name"] == "POST /v1/chat/completions"} - before
        return ids.pop() if ids else None
    trace_id = wait_for("a new gateway trace", new_trace, timeout=30)
    spans = trace_of(collector, trace_id, gateway_spans=3, triton_requests=1)
    mine = {s["name"]: s for s in spans if s["service"] == "triton-gateway"}
    assert sorted(mine) == ["POST", "POST /v1/chat/completions", "gateway.route"]   # no hold, template cached
    assert mine["POST /v1/chat/completions"].get("parentSpanId", "") == ""          # a root span
    assert mine["POST"]["attributes"]["url.path"] == "/v2/models/textgen/generate_stream"
    # the upstream span lasts until the stream's end (Triton's request ends inside it)
    [request] = [s for s in spans if s["service"] == "triton" and s["name"] == "InferRequest"]
    assert request["parentSpanId"] == mine["POST"]["spanId"]
    assert int(request["endTimeUnixNano"]) <= int(mine["POST"]["endTimeUnixNano"])
    assert KEY not in collector.text()
