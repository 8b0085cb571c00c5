"""The gateway's wiring: its parts built from the settings and handed what they need, the aiohttp
applications (the API port; probes and metrics on their own port or the API's), their runners
and sites, start and stop, and the health routes.

The parts, each in its module: `auth` (API keys, who is calling, what a key used), `admission`
(a request's body within its key's share), `resolution` (which service a model id names),
`holding` (waiting for a ready replica), `watches` (the cluster's services and replicas),
`upstream` (calls to the replicas), `openai_proxy` and `passthrough_proxy` (the two families of
routes).

Every answer that is not the model's own is OpenAI-shaped JSON (`openai_schema.OpenAIError`); an
unexpected exception is logged with its type only and answered 500 without a traceback.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from typing import Any, Awaitable, Callable

from aiohttp import HttpVersion11, web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import guard
from . import limits
from . import openai_schema as oai
from . import telemetry as m
from . import tracing as tr
from .admission import Admission
from .auth import Auth
from .config import GatewaySettings
from ..kube.aio import ApiServer
from .holding import Holding, Wakeups
from .openai_proxy import OpenAIProxy
from .passthrough_proxy import PassthroughProxy
from .resolution import Resolver
from .routing import Router
from .upstream import Upstream
from .watches import Watches

log = logging.getLogger(__name__)

SERVER_HEADER = guard.SERVER_HEADER
MAX_HEADER_LINES = 64   # OpenAI and Triton clients send about ten
HEALTH_MAX_CONNECTIONS = 32    # the health and metrics port: the kubelet's probes and a few scrapers
HEALTH_MAX_HEAD_BYTES = 8192   # their requests' heads are a few hundred bytes
HEALTH_MAX_PER_ADDRESS = 8     # ... from one address (the kubelet's probes come from its node, each scraper from its pod)
# A body's bytes that arrive before its handler reads them wait in aiohttp's reader, up to twice
# this (then the socket is paused) plus one read from the socket (up to 256 KiB): per connection,
# uncounted. 16 KiB instead of aiohttp's 64 KiB keeps that small on a full pool.
READ_BUFSIZE = 16 * 1024
# The unread rest of a refused body is read and dropped for at most this long, then the
# connection is closed: a refused 1 MiB upload must not keep a connection reading for 10 s.
LINGERING_SECONDS = 2.0


def _error_response(err: oai.OpenAIError) -> web.Response:
    headers = {}
    if err.retry_after is not None:
        headers["Retry-After"] = str(max(1, int(err.retry_after + 0.999)))
    if err.allow:
        headers["Allow"] = ", ".join(err.allow)
    return web.json_response(err.body(), status=err.status, headers=headers)


class Gateway:
    """The wiring object: it builds the shared state (the router, the per-key limits, the
    connection guard) and the parts that use it, and serves their routes."""

    def __init__(self, settings: GatewaySettings, api: ApiServer | None,
                 clock: Callable[[], float] = time.monotonic, tracing: tr.Off | tr.On = tr.OFF):
        self.settings = settings
        self.tracing = tracing   # OpenTelemetry spans (tracing.py); off by default
        self._rendering = asyncio.Lock()   # one /metrics render at a time
        self.api = api
        self.router = Router(port_name=settings.upstream_port_name)
        self.bodies = limits.BodyBudget(settings.body_budget_bytes,
                                        limits.share(settings.body_budget_bytes, settings.key_share))
        self.holds = limits.Holds(settings.max_held_per_service,
                                  limits.share(settings.max_held_per_service, settings.key_share),
                                  settings.max_held_total, limits.share(settings.max_held_total, settings.key_share))
        self.in_flight = limits.InFlight()
        self.connections = guard.Limits(settings.max_connections, settings.header_timeout_seconds,
                                        settings.max_header_bytes, settings.max_connections_per_address,
                                        self.auth_proxies(settings), clock, settings.upstream_idle_timeout_seconds)
        # The probes' and metrics' own port (metrics_port), reachable by Prometheus and the kubelet:
        # a few connections, small heads, the same deadlines (unguarded, 300 connections that never
        # ended a head of 120 lines of 8 KiB took the gateway from 90 MB to 667 MB), a few from each
        # address, and, when they are nearly all taken, any idle one reaped for a new one (its
        # answers take microseconds, so a connection is idle between requests nearly all the time:
        # 32 connections, from one address or four, each asking /healthz every half second, were
        # never idle the second the API port waits for, and the kubelet's probes got 503), and when
        # all are, the oldest of the address holding the most closed for it (a connection kept busy,
        # pipelining or with a body announced and never sent, is never idle).
        self.health_connections = guard.Limits(HEALTH_MAX_CONNECTIONS, settings.header_timeout_seconds,
                                               HEALTH_MAX_HEAD_BYTES, HEALTH_MAX_PER_ADDRESS, clock=clock,
                                               write_timeout=settings.upstream_idle_timeout_seconds,
                                               reap_idle_seconds=0.0, evict=True)
        wakeups = Wakeups()
        self.auth = Auth(settings, clock, tracing)
        self.auth.keys_changed = wakeups.wake_all
        self.admission = Admission(settings, self.bodies, self.in_flight)
        self.resolver = Resolver(self.router, tracing)
        self.holding = Holding(settings, self.router, self.holds, wakeups, clock, tracing,
                               grant_of=lambda digest: self.auth.grants.get(digest))
        self.watches = Watches(settings, api, self.router, wakeups)
        self.upstream = Upstream(settings, self.router, self.holding, clock, tracing)
        self.openai_proxy = OpenAIProxy(self.router, self.auth, self.admission, self.resolver, self.holding,
                                        self.upstream, clock)
        self.passthrough_proxy = PassthroughProxy(self.auth, self.admission, self.resolver, self.upstream)
        self._tasks: list[asyncio.Task[Any]] = []

    @staticmethod
    def auth_proxies(settings: GatewaySettings) -> tuple[Any, ...]:
        return tuple(ipaddress.ip_network(c, strict=False) for c in settings.trusted_proxies)

    @property
    def ready(self) -> bool:
        return self.auth.keys_loaded and self.watches.synced and not self.holding.draining

    # -- health and metrics ------------------------------------------------------------------------------

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(self, _request: web.Request) -> web.Response:
        body = {"ready": self.ready, "keys": len(self.auth.grants), "keysError": self.auth.keys_error,
                "services": len(self.router.services), "watches": self.watches.status(),
                "held": self.holds.count, "heldBytes": self.bodies.used, "connections": self.connections.open}
        return web.json_response(body, status=200 if self.ready else 503)

    async def metrics(self, _request: web.Request) -> web.Response:
        """The metrics, rendered off the event loop that answers the API, one render at a time: a
        render takes 118 ms with 100 services, and four clients asking in a loop took an API
        request's median latency from 0.3 ms to 226 ms."""
        async with self._rendering:
            body = await asyncio.get_running_loop().run_in_executor(None, generate_latest)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- wiring ----------------------------------------------------------------------------------------

    def api_app(self, with_health: bool) -> web.Application:
        traced = self.tracing.middleware()   # None while tracing is off
        app = web.Application(client_max_size=self.settings.max_body_bytes,
                              middlewares=[self.connections.middleware, *([traced] if traced else []), errors])
        router, e = app.router, {"expect_handler": expect}
        router.add_get("/v1/models", self.openai_proxy.list_models, **e)
        router.add_get("/v1/models/{model:.+}", self.openai_proxy.get_model, **e)
        router.add_post("/v1/chat/completions", self.openai_proxy.chat_completions, **e)
        router.add_post("/v1/completions", self.openai_proxy.completions, **e)
        router.add_post("/v1/responses", self.openai_proxy.responses, **e)
        router.add_post("/v1/embeddings", self.openai_proxy.embeddings, **e)
        # Every /v2 path reaches the handler, which checks the path as sent (raw_path) against
        # the pass-through's allow-list before anything else: the router matches the normalised
        # path, in which "/v2/models/x/../../repository" is already "/v2/repository".
        router.add_route("*", r"/v2{tail:.*}", self.passthrough_proxy.v2, **e)
        app.on_response_prepare.append(_server_header)
        if with_health:
            self._add_health(app)
        app.on_shutdown.append(self.on_shutdown)
        app.on_cleanup.append(self.cleanup)
        return app

    def health_app(self) -> web.Application:
        """Probes and metrics on their own port (metrics_port), guarded as the API port is."""
        app = web.Application(middlewares=[self.health_connections.middleware, errors])
        app.on_response_prepare.append(_server_header)
        self._add_health(app)
        return app

    def health_runner(self) -> web.AppRunner:
        s = self.settings
        return web.AppRunner(self.health_app(), access_log=None, shutdown_timeout=1,
                             keepalive_timeout=s.idle_timeout_seconds, max_headers=MAX_HEADER_LINES,
                             lingering_time=LINGERING_SECONDS)

    def health_site(self, runner: web.AppRunner, host: str, port: int) -> web.TCPSite:
        return guard.GuardedSite(runner, host, port, self.health_connections)

    def _add_health(self, app: web.Application) -> None:
        app.router.add_get("/healthz", self.healthz, expect_handler=expect)
        app.router.add_get("/readyz", self.readyz, expect_handler=expect)
        app.router.add_get("/metrics", self.metrics, expect_handler=expect)

    def api_runner(self, with_health: bool) -> web.AppRunner:
        """The API port's runner: idle connections closed after idle_timeout_seconds (aiohttp's
        keepalive_timeout also bounds a connection that never sends a whole request), bodies
        passed on as they came (a v2 client's compressed body stays compressed for Triton)."""
        s = self.settings
        return web.AppRunner(self.api_app(with_health), handler_cancellation=True,
                             shutdown_timeout=s.shutdown_timeout_seconds, access_log=None,
                             keepalive_timeout=s.idle_timeout_seconds, auto_decompress=False,
                             max_headers=MAX_HEADER_LINES, read_bufsize=READ_BUFSIZE,
                             lingering_time=LINGERING_SECONDS)

    def api_site(self, runner: web.AppRunner, host: str, port: int) -> web.TCPSite:
        return guard.GuardedSite(runner, host, port, self.connections)

    async def start(self) -> None:
        reload_keys = self.auth.start()
        if reload_keys is not None:
            self._tasks.append(reload_keys)
        if self.api is not None:
            self._tasks.extend(self.watches.start_watches())

    async def on_shutdown(self, _app: web.Application) -> None:
        self.holding.drain()

    async def cleanup(self, _app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.upstream.close()
        if self.api is not None:
            await self.api.close()
        self.tracing.shutdown()


async def expect(request: web.Request) -> None:
    """The `Expect` header, read before any middleware: `100-continue` on HTTP/1.1 is answered 100
    Continue (as aiohttp does), and any other expectation is ignored (RFC 9110 allows a server to),
    so that the request still goes through the middlewares. aiohttp's own handler answers those 417
    in plain text, quoting the header, before the middlewares: the connection guard's bookkeeping
    never ran, so ten such requests held every connection slot, and a chunked one left its
    connection open to a next request past the head-size limit."""
    if request.version == HttpVersion11 and request.headers.get("Expect", "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        # The answer has not begun (as aiohttp's own handler does): counted as begun, an error
        # answer after it (a wrong key, a bad body) cut the connection instead of being sent.
        request.writer.output_size = 0


async def _server_header(_request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = SERVER_HEADER


@web.middleware
async def errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                 ) -> web.StreamResponse:
    try:
        return await handler(request)
    except oai.OpenAIError as e:
        _begun(request, e)
        answer = _error_response(e)
        if e.code == "too_many_failed_attempts":
            # An address past its failed key attempts has its connection closed after the answer
            # (the requests pipelined behind it are not answered): kept open, one address without
            # a key drew 8,700 answers a second over 32 connections, pipelining, the gateway's
            # whole CPU, and a keyed client's median went from 2 to 30 ms. The answer is not
            # delayed: a delayed one holds its connection's place in the pool, never reaped.
            answer.force_close()
        return answer
    except web.HTTPRequestEntityTooLarge as e:
        m.REJECTED.labels("too_large").inc()
        return _error_response(oai.OpenAIError(413, e.text or "request body too large", code="request_too_large"))
    except web.HTTPMethodNotAllowed as e:
        m.REJECTED.labels("not_found").inc()
        return _error_response(oai.OpenAIError(405, f"{e.method} is not allowed here; use "
                                                  f"{', '.join(sorted(e.allowed_methods))}",
                                             code="method_not_allowed", allow=tuple(sorted(e.allowed_methods))))
    except web.HTTPException as e:
        if e.status < 400:
            raise
        reason = "not_found" if e.status == 404 else "bad_request"
        m.REJECTED.labels(reason).inc()
        return _error_response(oai.OpenAIError(e.status, e.reason, code=reason))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as e:  # noqa: BLE001 - a bug answers 500, never a traceback to the client
        log.error("unexpected %s on %s %s", type(e).__name__, request.method, request.path)
        log.debug("unexpected error", exc_info=True)
        err = oai.OpenAIError(500, "internal error in the gateway", "server_error", code="internal_error")
        _begun(request, err)
        return _error_response(err)


def _begun(request: web.Request, err: oai.OpenAIError) -> None:
    """An error after the answer began (its head and part of its body are on the wire, e.g. a
    replica that stalls or breaks in the middle of a passed-through answer): a second answer cannot
    follow the first on the connection, so the connection is cut, which the client sees as an
    answer cut short (streamed OpenAI answers end with an error event before this)."""
    if request.writer is None or request.writer.output_size == 0:
        return
    log.warning("%s %s failed after its answer began (%s, %s): the connection is closed", request.method,
                request.path, err.status, err.code)
    if request.transport is not None:
        request.transport.abort()
    raise asyncio.CancelledError("the answer had begun")
