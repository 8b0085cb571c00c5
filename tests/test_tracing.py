"""The gateway's OpenTelemetry traces (gateway/tracing.py), in process: the real aiohttp app on a
loopback port, the real OpenTelemetry SDK recording into its in-memory exporter, and the recording
upstream of tests/gateway_http.py standing in for Triton, so the traceparent the gateway sends on
is checked byte for byte (the real Triton and a real OTLP collector are in e2e/test_tracing.py).
Off (no endpoint, or no extra) the gateway imports nothing of OpenTelemetry and answers as before."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from triton_operator.gateway import tracing

from .gateway_http import KEY_A, Rig, run, slice_for

CHAT = {"model": "ml/llama", "messages": [{"role": "user", "content": "hi"}]}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


def traced_rig(**settings) -> tuple[Rig, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rig = Rig(tracing=tracing.On(provider), **settings)
    return rig, exporter


def by_name(exporter: InMemorySpanExporter) -> dict:
    spans = exporter.get_finished_spans()
    named = {s.name: s for s in spans}
    assert len(named) == len(spans), [s.name for s in spans]
    return named


def every_attribute_value(exporter: InMemorySpanExporter) -> str:
    return json.dumps([{**dict(s.attributes or {}), "status": s.status.description,
                        "events": [dict(e.attributes or {}) for e in s.events]} for s in exporter.get_finished_spans()])


def test_a_request_is_a_server_span_in_the_clients_trace_and_triton_gets_its_traceparent():
    async def scenario():
        rig, exporter = traced_rig()
        async with rig:
            reply = await rig.call("POST", "/v1/chat/completions", body=CHAT, headers={
                "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01", "tracestate": "vendor=abc,other=1"})
            assert reply.status == 200
        spans = by_name(exporter)
        assert set(spans) == {"POST /v1/chat/completions", "gateway.route", "POST"}
        server, route, upstream = spans["POST /v1/chat/completions"], spans["gateway.route"], spans["POST"]
        for span in spans.values():
            assert format(span.context.trace_id, "032x") == TRACE_ID
        assert server.kind == SpanKind.SERVER and server.parent.is_remote
        assert format(server.parent.span_id, "016x") == CLIENT_SPAN
        assert route.parent.span_id == server.context.span_id and route.kind == SpanKind.INTERNAL
        assert upstream.parent.span_id == server.context.span_id and upstream.kind == SpanKind.CLIENT
        # Triton got the upstream span's context, exactly, and the client's tracestate.
        [seen] = rig.upstream.seen
        assert seen.headers["traceparent"] == f"00-{TRACE_ID}-{upstream.context.span_id:016x}-01"
        assert seen.headers["tracestate"] == "vendor=abc,other=1"
        assert dict(server.attributes) == {
            "http.request.method": "POST", "http.route": "/v1/chat/completions", "url.path": "/v1/chat/completions",
            "url.scheme": "http", "http.response.status_code": 200, "triton.gateway.api_key.name": "a",
            "triton.inferenceservice.namespace": "ml", "triton.inferenceservice.name": "llama"}
        assert dict(route.attributes) == {"triton.inferenceservice.namespace": "ml",
                                          "triton.inferenceservice.name": "llama"}
        assert dict(upstream.attributes) == {
            "http.request.method": "POST", "server.address": "127.0.0.1", "server.port": rig.upstream.port,
            "url.path": "/v2/models/llm/generate", "http.response.status_code": 200}
        assert server.status.status_code == upstream.status.status_code == StatusCode.UNSET
        assert server.start_time <= route.start_time <= route.end_time <= upstream.start_time
        assert upstream.end_time <= server.end_time
        assert KEY_A not in every_attribute_value(exporter) and "Bearer" not in every_attribute_value(exporter)
    run(scenario)


def test_a_held_request_has_a_hold_span_before_its_upstream_call_and_a_stream_is_traced_to_its_end():
    async def scenario():
        rig, exporter = traced_rig(hold_timeout_seconds=10)
        async with rig:
            rig.gw.router.set_slice({"metadata": {"name": "llama-x", "namespace": "ml",
                                                  "labels": {"kubernetes.io/service-name": "llama"}},
                                     "ports": [{"name": "http", "port": rig.upstream.port}], "endpoints": []})
            waiting = asyncio.create_task(rig.call("POST", "/v1/chat/completions", body={**CHAT, "stream": True},
                                                   headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}))
            for _ in range(200):
                if rig.gw.holds.count:
                    break
                await asyncio.sleep(0.01)
            assert rig.gw.holds.count == 1
            await asyncio.sleep(0.05)
            rig.gw.watches._slice_event("MODIFIED", slice_for("llama", rig.upstream.port, "ml"))
            reply = await asyncio.wait_for(waiting, 10)
            assert reply.status == 200
        spans = by_name(exporter)
        assert set(spans) == {"POST /v1/chat/completions", "gateway.route", "gateway.hold", "POST"}
        server, hold, upstream = spans["POST /v1/chat/completions"], spans["gateway.hold"], spans["POST"]
        assert hold.parent.span_id == server.context.span_id and upstream.parent.span_id == server.context.span_id
        assert (hold.end_time - hold.start_time) >= 50_000_000   # it waited at least the 50 ms above
        assert hold.end_time <= upstream.start_time
        assert dict(hold.attributes) == {"triton.inferenceservice.namespace": "ml",
                                         "triton.inferenceservice.name": "llama"}
        assert upstream.attributes["url.path"] == "/v2/models/llm/generate_stream"
        [seen] = rig.upstream.seen
        assert seen.headers["traceparent"] == f"00-{TRACE_ID}-{upstream.context.span_id:016x}-01"
        assert "tracestate" not in seen.headers
    run(scenario)


def test_failures_mark_the_spans_with_codes_not_texts():
    async def scenario():
        rig, exporter = traced_rig(hold_timeout_seconds=0.2)

        async def broken(_request):
            from aiohttp import web
            return web.Response(status=500, text="internal shared memory region 'secret-region' broke")

        rig.upstream.answer = broken
        async with rig:
            assert (await rig.call("POST", "/v1/chat/completions", body=CHAT)).status == 502
            spans = by_name(exporter)
            server, upstream = spans["POST /v1/chat/completions"], spans["POST"]
            assert server.parent is None   # no traceparent: a trace of its own
            assert (server.status.status_code, server.status.description) == (StatusCode.ERROR, "HTTP 502")
            assert (upstream.status.status_code, upstream.status.description) == (StatusCode.ERROR, "upstream_failed")
            assert upstream.attributes["http.response.status_code"] == 500
            assert upstream.attributes["error.type"] == "upstream_failed"
            assert "secret-region" not in every_attribute_value(exporter)
            exporter.clear()
            # a model that does not exist: the route span fails with the gateway's code; a 4xx is
            # not an error of the server span (semantic conventions)
            assert (await rig.call("POST", "/v1/chat/completions", body={**CHAT, "model": "ml/nope"})).status == 404
            spans = by_name(exporter)
            assert set(spans) == {"POST /v1/chat/completions", "gateway.route"}
            assert (spans["gateway.route"].status.status_code, spans["gateway.route"].status.description) == (
                StatusCode.ERROR, "model_not_found")
            assert spans["POST /v1/chat/completions"].status.status_code == StatusCode.UNSET
            assert spans["POST /v1/chat/completions"].attributes["http.response.status_code"] == 404
            exporter.clear()
            # a hold that times out
            rig.gw.router.set_slice({"metadata": {"name": "llama-x", "namespace": "ml",
                                                  "labels": {"kubernetes.io/service-name": "llama"}},
                                     "ports": [{"name": "http", "port": rig.upstream.port}], "endpoints": []})
            assert (await rig.call("POST", "/v1/chat/completions", body=CHAT)).status == 503
            hold = by_name(exporter)["gateway.hold"]
            assert (hold.status.status_code, hold.status.description) == (StatusCode.ERROR, "model_starting")
            exporter.clear()
            # probes are not traced; a refused key is (the server span only, no key in it)
            assert (await rig.call("GET", "/healthz", key=None)).status == 200
            assert (await rig.call("GET", "/v1/models", key="sk-wrong-" + "x" * 40)).status == 401
            [refused] = exporter.get_finished_spans()
            assert refused.name == "GET /v1/models" and refused.attributes["http.response.status_code"] == 401
            assert "sk-wrong-" not in every_attribute_value(exporter)
            exporter.clear()
            # a path no route matches: named by its method alone (no scanner's path as a span name)
            assert (await rig.call("GET", "/wp-admin/setup.php")).status == 404
            [unmatched] = exporter.get_finished_spans()
            assert unmatched.name == "GET" and "http.route" not in unmatched.attributes
            assert unmatched.attributes["url.path"] == "/wp-admin/setup.php"
    run(scenario)


def test_an_unsampled_client_trace_records_nothing_and_is_passed_on_unsampled():
    async def scenario():
        rig, exporter = traced_rig()
        async with rig:
            reply = await rig.call("POST", "/v2/models/resnet/infer", body=b"{}",
                                   headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-00"})
            assert reply.status == 200
        assert exporter.get_finished_spans() == ()
        [seen] = rig.upstream.seen
        version, trace_id, span_id, flags = seen.headers["traceparent"].split("-")
        assert (version, trace_id, flags) == ("00", TRACE_ID, "00") and span_id != CLIENT_SPAN
    run(scenario)


def test_a_v2_request_is_traced_under_its_route():
    async def scenario():
        rig, exporter = traced_rig()
        async with rig:
            assert (await rig.call("POST", "/v2/models/resnet/infer", body=b"{}")).status == 200
        spans = by_name(exporter)
        assert set(spans) == {"POST /v2/{path}", "gateway.route", "POST"}
        assert spans["POST /v2/{path}"].attributes["url.path"] == "/v2/models/resnet/infer"
        assert spans["POST"].attributes["url.path"] == "/v2/models/resnet/infer"
        [seen] = rig.upstream.seen
        ctx = spans["POST"].context   # a trace the gateway began: sampled, and its id random (flags 03, W3C level 2)
        assert seen.headers["traceparent"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
        assert int(ctx.trace_flags) & 1 == 1
    run(scenario)


# -- configuration ------------------------------------------------------------------------------------

@pytest.mark.parametrize("env", [
    {},
    {**ENDPOINT, "OTEL_SDK_DISABLED": "true"},
    {**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"},
])
def test_off_without_an_endpoint_or_when_disabled(env):
    assert tracing.from_env(env) is tracing.OFF


def test_off_costs_no_import_and_the_gateway_answers_as_before():
    """A fresh interpreter: the gateway and its tracing hooks loaded and a request served with
    tracing off, and no OpenTelemetry module imported."""
    script = textwrap.dedent("""
        import sys
        from tests.gateway_http import Rig, run
        from triton_operator.gateway import tracing
        assert tracing.from_env({}) is tracing.OFF

        async def scenario():
            async with Rig() as rig:
                reply = await rig.call("POST", "/v1/chat/completions",
                                       body={"model": "ml/llama", "messages": [{"role": "user", "content": "hi"}]},
                                       headers={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
                assert reply.status == 200, reply
                [seen] = rig.upstream.seen
                assert "traceparent" not in seen.headers   # off: nothing is added or passed on
        run(scenario)
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_without_the_extra_an_endpoint_warns_and_the_gateway_runs_untraced():
    """The extra uninstalled, as a fresh interpreter that cannot import opentelemetry sees it."""
    script = textwrap.dedent("""
        import logging, sys
        class NoOtel:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ModuleNotFoundError(f"No module named {name!r}")
        sys.meta_path.insert(0, NoOtel())
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", stream=sys.stdout)
        from tests.gateway_http import Rig, run
        from triton_operator.gateway import tracing
        off = tracing.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
        assert off is tracing.OFF

        async def scenario():
            rig = Rig(tracing=off)
            async with rig:
                reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})
                assert reply.status == 200 and reply.json()["choices"][0]["text"] == "hello", reply
        run(scenario)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("WARNING OTEL_EXPORTER_OTLP_ENDPOINT is set but the tracing extra is not installed "
                                  "(pip install 'triton-operator[tracing]'): the gateway sends no traces")


def test_on_with_an_endpoint_reads_the_standard_variables(monkeypatch):
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"):
        monkeypatch.delenv(name, raising=False)
    on = tracing.from_env(ENDPOINT)
    try:
        assert isinstance(on, tracing.On)
        assert on.provider.resource.attributes["service.name"] == "triton-gateway"
        assert on.provider.sampler.get_description().startswith("ParentBased{root:AlwaysOnSampler")
    finally:
        on.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "edge-gateway")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    env = {**ENDPOINT, "OTEL_SERVICE_NAME": "edge-gateway", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
           "OTEL_TRACES_SAMPLER_ARG": "0.25"}
    on = tracing.from_env(env)
    try:
        assert on.provider.resource.attributes["service.name"] == "edge-gateway"
        assert "TraceIdRatioBased{0.25}" in on.provider.sampler.get_description()
    finally:
        on.shutdown()


@pytest.mark.parametrize("env, message", [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
     "OTEL_EXPORTER_OTLP_ENDPOINT: expected an http:// or https:// URL of an OTLP receiver, e.g. "
     "http://otel-collector.monitoring:4318"),
    ({**ENDPOINT, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "grpc://x"},
     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: expected an http:// or https:// URL of an OTLP receiver, e.g. "
     "http://otel-collector.monitoring:4318"),
    ({**ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: the gateway sends OTLP over HTTP (http/protobuf); point the endpoint at "
     "the collector's HTTP port (4318)"),
    ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER=zipkin: the gateway exports traces with "
                                                      "otlp (or none)"),
    ({**ENDPOINT, "OTEL_TRACES_SAMPLER": "sometimes"},
     "OTEL_TRACES_SAMPLER=sometimes: expected one of always_on, always_off, traceidratio, parentbased_always_on, "
     "parentbased_always_off, parentbased_traceidratio"),
    ({**ENDPOINT, "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
     "OTEL_TRACES_SAMPLER_ARG=2: expected a ratio between 0 and 1"),
])
def test_settings_that_cannot_work_are_refused_in_one_line(env, message):
    with pytest.raises(tracing.TracingError) as e:
        tracing.from_env(env)
    assert str(e.value) == message


def test_the_gateway_command_refuses_bad_tracing_settings_without_a_traceback(tmp_path):
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}
    out = subprocess.run([sys.executable, "-m", "triton_operator", "gateway", "--kubeconfig", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "triton-operator: OTEL_EXPORTER_OTLP_ENDPOINT: expected an http:// or https:// URL of an OTLP receiver, "
        "e.g. http://otel-collector.monitoring:4318")
    assert "Traceback" not in out.stderr


def test_a_collector_that_is_down_does_not_hold_up_the_gateways_stop(caplog):
    """A real OTLP exporter pointed at a closed loopback port, with a span buffered: the stop
    gives up after its bound instead of waiting out the exporter's retries (6.1 s unbounded, here)."""
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    on = tracing.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed}"})
    assert isinstance(on, tracing.On)
    with on.span("gateway.hold"):
        pass
    started = time.monotonic()
    on.shutdown(timeout=1.0)
    assert time.monotonic() - started < 2.5
    # The exporter goes on retrying on the stop's thread; it is let finish here so that its
    # warnings are logged within this test and not into the next one's.
    workers = [t for t in threading.enumerate() if t.name == "tracing shutdown"]
    assert workers
    for worker in workers:
        worker.join(30)
        assert not worker.is_alive()


@pytest.mark.parametrize("variable, path, expected", [
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "", "/v1/traces"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "/otlp/", "/otlp/v1/traces"),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "/custom/traces", "/custom/traces"),
])
def test_spans_go_to_the_endpoint_of_the_settings_given(monkeypatch, variable, path, expected):
    """A real OTLP exporter and a loopback receiver: the URL the settings name is the one the
    spans are posted to, with the signal path added to a base endpoint as the OTLP spec says,
    even when the process's own environment names no endpoint (the exporter alone would then
    send to localhost:4318)."""
    import http.server

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    posted: list[str] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            posted.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        on = tracing.from_env({variable: f"http://127.0.0.1:{server.server_address[1]}{path}"})
        with on.span("gateway.hold"):
            pass
        on.shutdown(timeout=10.0)
    finally:
        server.shutdown()
        server.server_close()
    assert posted == [expected]


def test_a_stream_that_breaks_marks_the_upstream_span_failed():
    async def scenario():
        rig, exporter = traced_rig()

        async def breaks(request):
            from aiohttp import web
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            out.enable_chunked_encoding()
            await out.prepare(request)
            await out.write(b'data: {"text_output": "hel"}\n\n')
            request.transport.close()   # the replica goes away mid-answer
            return out

        rig.upstream.answer = breaks
        async with rig:
            reply = await rig.call("POST", "/v1/chat/completions", body={**CHAT, "stream": True})
            assert reply.status == 200 and b"upstream_failed" in reply.body
        upstream = by_name(exporter)["POST"]
        assert upstream.attributes["http.response.status_code"] == 200
        assert upstream.status.status_code == StatusCode.ERROR
        assert upstream.attributes["error.type"] == upstream.status.description == "ClientPayloadError"
    run(scenario)


def test_a_malformed_tracestate_costs_no_log_line_and_is_not_passed_on(caplog):
    """OpenTelemetry warned, quoting it, about every client tracestate it discarded (more than 32
    members, or one malformed): a WARNING a request, of the client's own text, from clients
    without a key too. Such a tracestate is dropped quietly (as the W3C says) and never reaches
    Triton; the client's traceparent still is the parent."""
    import logging

    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    async def scenario():
        rig, exporter = traced_rig()
        async with rig:
            with caplog.at_level(logging.DEBUG):
                for state in (",".join(f"k{i}=v{i}" for i in range(33)), "UPPER=x", "a=", "k=" + "v" * 8000):
                    assert (await rig.call("GET", "/v1/models", key=None,
                                           headers={"traceparent": parent, "tracestate": state})).status == 401
                    reply = await rig.call("POST", "/v2/models/llama/generate", body={"text_input": "x"},
                                           headers={"traceparent": parent, "tracestate": state,
                                                    "X-Inference-Namespace": "ml"})
                    assert reply.status == 200
                    assert "tracestate" not in {h.lower() for h in rig.upstream.seen[-1].headers}
            assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
            assert {s.context.trace_id for s in exporter.get_finished_spans()} == {0x4bf92f3577b34da6a3ce929d0e0e4736}
    run(scenario)
