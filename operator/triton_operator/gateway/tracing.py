"""OpenTelemetry traces of the gateway: optional, off unless asked for.

On when the `tracing` extra is installed (`pip install 'triton-operator[tracing]'`; the image has
it) and an OTLP endpoint is set in the standard variables, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
OTEL_EXPORTER_OTLP_ENDPOINT (OTLP over HTTP, http/protobuf, the collector's port 4318). The
OpenTelemetry SDK reads the rest of the standard variables itself: OTEL_SERVICE_NAME (default here
triton-gateway), OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
(default parentbased_always_on: a client's sampled flag is followed), OTEL_EXPORTER_OTLP_HEADERS,
OTEL_BSP_*. OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it off. Off, nothing of
OpenTelemetry is imported, no middleware is installed and each hook below is an empty call.

The spans of one API request, all in the client's trace when it sent a W3C `traceparent` (its
`tracestate` is kept):

    POST /v1/chat/completions   SERVER  the whole request, the client's span its parent
    ├── gateway.route           INTERNAL  which InferenceService serves the model
    ├── gateway.hold            INTERNAL  waiting for a ready replica (scale from zero, capacity);
    │                                     only when the request had to wait
    ├── GET                     CLIENT  reading a text model's chat template from its config
    │                                   (when it is not cached)
    └── POST                    CLIENT  the call to Triton, to the end of its answer (a stream's
                                        last byte); one per attempt. Its context goes to Triton as
                                        `traceparent` (and `tracestate`), so Triton's own spans
                                        (--trace-config mode=opentelemetry) join the trace below it.

Attributes are the HTTP semantic conventions' (method, route, path, status code, server address)
and the InferenceService's namespace and name; never a header, a body or an API key (only the
key's name from the key file, as in the metrics). Probes (/healthz, /readyz, /metrics) are not
traced. Only `traceparent` and `tracestate` are read from a client and passed on (no baggage).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterator, Mapping

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

TRACESTATE_LOGGER = "opentelemetry.trace.span"   # where OpenTelemetry's TraceState parsing logs

DEFAULT_SERVICE_NAME = "triton-gateway"
UNTRACED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")
# Attribute names (OpenTelemetry semantic conventions where one exists).
NAMESPACE = "triton.inferenceservice.namespace"
NAME = "triton.inferenceservice.name"
KEY_NAME = "triton.gateway.api_key.name"


class TracingError(Exception):
    """OTEL_* settings the gateway cannot use: one line naming the variable."""


class NoSpan:
    """What the hooks hand out while tracing is off: every method does nothing."""

    __slots__ = ()

    def set(self, key: str, value: Any) -> None:
        pass

    def status_code(self, code: int) -> None:
        pass

    def fail(self, error: BaseException) -> None:
        pass

    def end(self) -> None:
        pass


NO_SPAN = NoSpan()
_NO_SPAN_CONTEXT = contextlib.nullcontext(NO_SPAN)   # stateless, so one serves every request


class Off:
    """Tracing off: the gateway calls these on every request, at the cost of a method call."""

    enabled = False

    def middleware(self) -> Any:
        return None

    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
        return _NO_SPAN_CONTEXT

    def annotate(self, key: str, value: Any) -> None:
        pass

    def upstream(self, method: str, host: str, port: int, path: str, headers: dict[str, str]) -> Any:
        return NO_SPAN

    def shutdown(self) -> None:
        pass


OFF = Off()


def _failure(error: BaseException) -> str:
    """A failure's description on a span: the gateway's error code or the exception's type, never
    its text (which may quote a model's or a client's words)."""
    return str(getattr(error, "code", None) or type(error).__name__)


class _Span:
    """An OpenTelemetry span behind the NoSpan interface."""

    __slots__ = ("span",)

    def __init__(self, span: Any):
        self.span = span

    def set(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, value)

    def status_code(self, code: int) -> None:
        from opentelemetry.trace import StatusCode

        self.span.set_attribute("http.response.status_code", code)
        if code >= 400:   # client spans: every 4xx and 5xx is an error (semantic conventions)
            self.span.set_status(StatusCode.ERROR, f"HTTP {code}")

    def fail(self, error: BaseException) -> None:
        from opentelemetry.trace import StatusCode

        self.span.set_attribute("error.type", _failure(error))
        self.span.set_status(StatusCode.ERROR, _failure(error))

    def end(self) -> None:
        self.span.end()


class On:
    """Tracing on, with spans made by `provider` (an SDK TracerProvider; tests give one with an
    in-memory exporter)."""

    enabled = True

    def __init__(self, provider: Any):
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("triton_operator.gateway")
        self.propagator = TraceContextTextMapPropagator()   # traceparent and tracestate, nothing else
        self._trace, self._kind, self._code = trace, SpanKind, StatusCode
        # OpenTelemetry warns, quoting it, about every client tracestate it discards (past 32 members,
        # or one member malformed): a line per request, of the client's text, from clients without a
        # key too (100 requests wrote 0.8 MB). Such a tracestate is dropped as the W3C says, quietly.
        logging.getLogger(TRACESTATE_LOGGER).setLevel(logging.ERROR)

    def middleware(self) -> Callable[..., Awaitable[Any]]:
        """The SERVER span of each API request, child of the client's traceparent when it sent
        one; outermost, so it sees the answer the errors middleware made of any failure."""
        from aiohttp import web

        @web.middleware
        async def traced(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
            if request.path in UNTRACED_PATHS:
                return await handler(request)
            route = _route(request)
            parent = self.propagator.extract(request.headers)
            attributes = {"http.request.method": request.method, "url.path": request.path, "url.scheme": request.scheme}
            if route:
                attributes["http.route"] = route
            with self.tracer.start_as_current_span(
                    f"{request.method} {route}" if route else request.method, context=parent, kind=self._kind.SERVER,
                    record_exception=False, set_status_on_exception=False, attributes=attributes) as span:
                try:
                    response = await handler(request)
                except BaseException as e:   # a cancelled request (the client went away)
                    _Span(span).fail(e)
                    raise
                span.set_attribute("http.response.status_code", response.status)
                if response.status >= 500:   # server spans: only 5xx are errors (semantic conventions)
                    span.set_status(self._code.ERROR, f"HTTP {response.status}")
                return response

        return traced

    @contextlib.contextmanager
    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[_Span]:
        """An INTERNAL span, current while the block runs; an exception marks it failed (by its
        code or type) and goes on."""
        with self.tracer.start_as_current_span(name, attributes=attributes, record_exception=False,
                                               set_status_on_exception=False) as span:
            wrapped = _Span(span)
            try:
                yield wrapped
            except BaseException as e:
                wrapped.fail(e)
                raise

    def annotate(self, key: str, value: Any) -> None:
        """An attribute on the current span (the request's)."""
        self._trace.get_current_span().set_attribute(key, value)

    def upstream(self, method: str, host: str, port: int, path: str, headers: dict[str, str]) -> _Span:
        """A CLIENT span for one request to a replica, started now and ended by the caller when
        the answer is over; its traceparent (and the client's tracestate) added to `headers`."""
        span = self.tracer.start_span(method, kind=self._kind.CLIENT, attributes={
            "http.request.method": method, "server.address": host, "server.port": port, "url.path": path})
        self.propagator.inject(headers, context=self._trace.set_span_in_context(span))
        return _Span(span)

    def shutdown(self, timeout: float = 3.0) -> None:
        """Send what is buffered and stop the exporter, within `timeout` seconds: the SDK's own
        shutdown may wait out the exporter's retries (10 s and more) when the collector is down,
        so it runs on a thread of its own that the gateway stops waiting for."""
        def stop() -> None:
            try:
                self.provider.shutdown()
            except Exception as e:  # noqa: BLE001 - an exporter that fails must not stop the shutdown
                log.warning("tracing: could not flush the last spans: %s", type(e).__name__)

        worker = threading.Thread(target=stop, name="tracing shutdown", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            log.warning("tracing: the last spans were not sent within %.0fs (is the collector reachable?)", timeout)


def _route(request: web.Request) -> str | None:
    """The matched route as the app declares it ("/v1/models/{model}"; the KServe v2 catch-all as
    /v2/{path}), or None for a path no route matches (the span is then named by the method alone,
    so that scanners' paths do not become span names)."""
    resource = request.match_info.route.resource
    return resource.canonical.replace("{tail}", "/{path}") if resource is not None else None


def from_env(environ: Mapping[str, str] | None = None) -> Off | On:
    """The gateway's tracing from the standard OTEL_* variables (see the module docstring).
    Raises TracingError for settings that cannot work; logs a warning and stays off when an
    endpoint is set but the tracing extra is not installed."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return OFF
    exporter = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter == "none":
        return OFF
    variable = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") \
        else "OTEL_EXPORTER_OTLP_ENDPOINT"
    endpoint = env.get(variable, "").strip()
    if not endpoint:
        return OFF
    if exporter != "otlp":
        raise TracingError(f"OTEL_TRACES_EXPORTER={exporter}: the gateway exports traces with otlp (or none)")
    url = urllib.parse.urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise TracingError(f"{variable}: expected an http:// or https:// URL of an OTLP receiver, e.g. "
                           f"http://otel-collector.monitoring:4318")
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip()
    if protocol != "http/protobuf":
        raise TracingError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: the gateway sends OTLP over HTTP "
                           f"(http/protobuf); point the endpoint at the collector's HTTP port (4318)")
    sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if sampler and sampler not in SAMPLERS:
        raise TracingError(f"OTEL_TRACES_SAMPLER={sampler}: expected one of {', '.join(SAMPLERS)}")
    if sampler.endswith("traceidratio") and env.get("OTEL_TRACES_SAMPLER_ARG", "").strip():
        try:
            ratio = float(env["OTEL_TRACES_SAMPLER_ARG"])
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise TracingError(f"OTEL_TRACES_SAMPLER_ARG={env['OTEL_TRACES_SAMPLER_ARG']}: expected a ratio "
                               f"between 0 and 1")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("%s is set but the tracing extra is not installed (pip install 'triton-operator[tracing]'): "
                    "the gateway sends no traces", variable)
        return OFF
    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    # The SDK reads OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and the sampler from os.environ.
    resource = Resource.create({} if named else {SERVICE_NAME: DEFAULT_SERVICE_NAME})
    provider = TracerProvider(resource=resource)
    # The URL given to the exporter is the one checked above, read from `env` (the exporter alone
    # would read os.environ, and send to localhost:4318 when the two differ).
    target = endpoint if variable == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" \
        else f"{endpoint.removesuffix('/')}/v1/traces"
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=target)))
    log.info("tracing: OTLP spans to %s://%s:%s (service %s)", url.scheme, url.hostname, url.port or "default",
             resource.attributes.get(SERVICE_NAME))
    return On(provider)
