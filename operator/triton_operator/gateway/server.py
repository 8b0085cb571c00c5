"""The gateway's aiohttp application: authentication, routes, holding, proxying, metrics.

Every answer that is not the model's own is OpenAI-shaped JSON (`translate.OpenAIError`); an
unexpected exception is logged with its type only and answered 500 without a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
import aiohttp.abc
import aiohttp.resolver
import yarl
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import guard
from . import keys as keys_core
from . import limits
from . import metrics as m
from . import passthrough
from . import tracing as tr
from . import translate as t
from .config import GatewaySettings
from .discovery import ENDPOINT_SLICES, INFERENCE_SERVICES, ApiServer, Watch
from .routing import Address, ServiceKey, Router, Service, url

log = logging.getLogger(__name__)

# Request headers passed to a replica on the KServe v2 routes (binary tensors need
# Inference-Header-Content-Length; a compressed body its Content-Encoding). Accept-Encoding is the
# client's or identity: the client library would otherwise ask for gzip on the client's behalf.
V2_REQUEST_HEADERS = ("Content-Type", "Accept", "Inference-Header-Content-Length", "Content-Encoding")
V2_RESPONSE_HEADERS = ("Content-Type", "Inference-Header-Content-Length", "Content-Encoding")
SERVER_HEADER = "triton-operator-gateway"  # not aiohttp's default, which names its version
NAMESPACE_HEADER = "X-Inference-Namespace"
SMALL_BODY = 1 << 16  # answers up to this size are passed through whole, larger ones streamed
TEMPLATE_TTL = 600.0  # seconds a chat template read from a model's config is used before it is read again


def _error_response(err: t.OpenAIError) -> web.Response:
    headers = {}
    if err.retry_after is not None:
        headers["Retry-After"] = str(max(1, int(err.retry_after + 0.999)))
    if err.allow:
        headers["Allow"] = ", ".join(err.allow)
    return web.json_response(err.body(), status=err.status, headers=headers)


@dataclass(frozen=True)
class Caller:
    """An authenticated request's API key: its digest (the tenant's identity in every limit) and
    what it may do."""

    digest: str
    grant: keys_core.Grant


class Gateway:
    def __init__(self, settings: GatewaySettings, api: ApiServer | None,
                 clock: Callable[[], float] = time.monotonic, tracing: tr.Off | tr.On = tr.OFF):
        self.settings = settings
        self.tracing = tracing   # OpenTelemetry spans (tracing.py); off by default
        self.api = api
        self.clock = clock
        self.router = Router(port_name=settings.upstream_port_name)
        self.scheme = "https" if settings.upstream_tls_ca_file else "http"
        self.grants: dict[str, keys_core.Grant] = {}
        self.keys_loaded = False
        self.keys_error: str | None = None   # the key files could not be used: every request fails closed
        self._key_file_digest: str | None = None
        self.limiter = keys_core.RateLimiter(settings.requests_per_minute, settings.replicas)
        self.token_limiter = keys_core.TokenLimiter(settings.replicas)
        self.failures = keys_core.FailureLimiter(settings.failed_auth_per_minute)
        self.trusted_proxies = tuple(ipaddress.ip_network(c, strict=False) for c in settings.trusted_proxies)
        self.bodies = limits.BodyBudget(settings.body_budget_bytes,
                                        limits.share(settings.body_budget_bytes, settings.key_share))
        self.holds = limits.Holds(settings.max_held_per_service,
                                  limits.share(settings.max_held_per_service, settings.key_share),
                                  settings.max_held_total)
        self.in_flight = limits.InFlight()
        self.connections = guard.Limits(settings.max_connections, settings.header_timeout_seconds)
        self.watches: list[Watch] = []
        self._wake: dict[ServiceKey, asyncio.Event] = {}
        self.draining = False
        self.upstream: aiohttp.ClientSession | None = None
        self._children: dict[tuple[Any, ...], Any] = {}
        self._model_templates: dict[tuple[ServiceKey, str], tuple[float, str | None]] = {}
        self._tasks: list[asyncio.Task[Any]] = []

    def child(self, metric: Any, *labels: str) -> Any:
        """A labelled child of a metric, memoized (prometheus_client's labels() locks and hashes
        on every call; this is the gateway's hot path)."""
        key = (metric, *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    # -- cluster state ---------------------------------------------------------------------------

    def start_watches(self) -> None:
        assert self.api is not None
        namespaces: list[str | None] = list(self.settings.namespaces) or [None]
        for ns in namespaces:
            self.watches.append(Watch(self.api, *INFERENCE_SERVICES, ns, self._services_listed(ns), self._service_event))
            self.watches.append(Watch(self.api, *ENDPOINT_SLICES, ns, self._slices_listed(ns), self._slice_event,
                                      selector=self.settings.endpoint_slice_selector or None))
        for w in self.watches:
            self._tasks.append(asyncio.create_task(w.run(), name=f"watch {w.name}"))

    def _services_listed(self, namespace: str | None) -> Callable[[list[dict[str, Any]]], None]:
        def listed(items: list[dict[str, Any]]) -> None:
            for key in [k for k in self.router.services if namespace is None or k[0] == namespace]:
                del self.router.services[key]
            for obj in items:
                self.router.set_service(obj)
            m.SERVICES.set(len(self.router.services))
        return listed

    def _service_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.router.set_service(None if kind == "DELETED" else obj, obj)
        m.SERVICES.set(len(self.router.services))
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace") or "default", meta.get("name") or "")
        if kind == "DELETED" or (self.router.services.get(key) and self.router.services[key].degraded):
            self._wake_up({key})  # held requests learn the service is gone or failing

    def _slices_listed(self, namespace: str | None) -> Callable[[list[dict[str, Any]]], None]:
        def listed(items: list[dict[str, Any]]) -> None:
            stale = [k for k in self.router.slices if namespace is None or k[0] == namespace]
            changed: set[ServiceKey] = set()
            for k in stale:
                changed |= self.router.set_slice(None, {"metadata": {"namespace": k[0], "name": k[1], "labels": {
                    "kubernetes.io/service-name": self.router.slices[k][0][1]}}})
            for obj in items:
                changed |= self.router.set_slice(obj)
            self._wake_up(changed)
        return listed

    def _slice_event(self, kind: str, obj: dict[str, Any]) -> None:
        changed = self.router.set_slice(None if kind == "DELETED" else obj, obj)
        self._wake_up(changed)

    def _wake_up(self, keys: set[ServiceKey]) -> None:
        for key in keys:
            event = self._wake.pop(key, None)
            if event is not None:
                event.set()

    @property
    def ready(self) -> bool:
        return self.keys_loaded and all(w.synced.is_set() for w in self.watches) and not self.draining

    # -- API keys ----------------------------------------------------------------------------------

    def load_keys(self) -> bool:
        """(Re)read the key files; True when the keys changed. Raises OSError or KeyFileError for
        files that cannot be used (named, never quoted)."""
        texts = []
        for path in self.settings.key_files:
            with open(path, encoding="utf-8") as f:
                texts.append((path, f.read()))
        stamp = hashlib.sha256(json.dumps(texts).encode()).hexdigest()
        if stamp == self._key_file_digest and self.keys_error is None:
            return False
        grants = keys_core.merge((path, keys_core.parse(text, path)) for path, text in texts)
        self.grants = grants
        self._key_file_digest = stamp
        self.limiter.forget(grants)
        self.token_limiter.forget(grants)
        self.keys_loaded = True
        self.keys_error = None
        m.API_KEYS.set(len(grants))
        m.KEY_FILES_VALID.set(1)
        return True

    def refresh_keys(self) -> None:
        """load_keys, failing closed: key files that cannot be used drop every key (a revoked key
        must not keep working because its file broke), and say so in a metric, the readiness
        body and every answer, not only in a log line."""
        try:
            if self.load_keys():
                log.info("API keys loaded: %d key(s)", len(self.grants))
        except (OSError, keys_core.KeyFileError) as e:
            why = str(e) if isinstance(e, keys_core.KeyFileError) else f"cannot read {e.filename}: {e.strerror}"
            if self.keys_error != why:
                log.error("API keys unusable, refusing every request until the key files are fixed: %s", why)
            self.grants, self.keys_error, self.keys_loaded, self._key_file_digest = {}, why, True, None
            m.API_KEYS.set(0)
            m.KEY_FILES_VALID.set(0)

    async def _reload_keys(self) -> None:
        while True:
            await asyncio.sleep(self.settings.key_reload_seconds)
            self.refresh_keys()

    def authorize(self, request: web.Request) -> Caller:
        if self.keys_error is not None:
            m.REJECTED.labels("keys_unavailable").inc()
            raise t.OpenAIError(503, "the gateway cannot read its API keys; its operator has been told",
                                "service_unavailable", code="keys_unavailable",
                                retry_after=self.settings.key_reload_seconds)
        now = self.clock()
        address = keys_core.client_address(request.remote, request.headers.get("X-Forwarded-For"),
                                           self.trusted_proxies)
        blocked = self.failures.blocked(address, now)
        if blocked > 0:
            m.REJECTED.labels("auth_throttled").inc()
            raise t.OpenAIError(429, f"too many failed API key attempts from this address; retry in {blocked:.0f}s",
                                "rate_limit_error", code="too_many_failed_attempts", retry_after=blocked)
        presented = keys_core.bearer(request.headers.get("Authorization"))
        d = keys_core.digest(presented) if presented is not None else None
        grant = self.grants.get(d) if d is not None else None
        if grant is None or d is None:
            self.failures.failed(address, now)
            m.REJECTED.labels("unauthorized").inc()
            raise t.OpenAIError(401, "missing API key: send it as 'Authorization: Bearer KEY'" if presented is None
                                else "invalid API key", code="invalid_api_key")
        wait = max(self.limiter.take(d, grant, now), self.token_limiter.wait(d, grant, now))
        if wait > 0:
            m.REJECTED.labels("rate_limited").inc()
            raise t.OpenAIError(429, f"rate limit of API key {grant.name} reached; retry in {wait:.1f}s",
                                "rate_limit_error", code="rate_limit_exceeded", retry_after=wait)
        self.tracing.annotate(tr.KEY_NAME, grant.name)   # the key's name, never the key
        return Caller(d, grant)

    @contextlib.asynccontextmanager
    async def admitted(self, request: web.Request, caller: Caller) -> AsyncIterator[bytes | bytearray]:
        """The request's body, read within the key's share of the gateway (a place among its
        requests in flight, its body counted in the byte budget from before it is read until the
        answer ends, read within body_timeout_seconds); everything given back on the way out."""
        s = self.settings
        cap = caller.grant.max_in_flight or s.max_in_flight_per_key
        if not self.in_flight.acquire(caller.digest, cap):
            m.REJECTED.labels("too_many_in_flight").inc()
            raise t.OpenAIError(429, f"API key {caller.grant.name} has {cap} requests open already; retry when one "
                                     f"ends", "rate_limit_error", code="too_many_requests_in_flight", retry_after=1)
        reserved = 0
        try:
            length = request.content_length
            if length is not None and length > s.max_body_bytes:
                m.REJECTED.labels("too_large").inc()
                raise t.OpenAIError(413, f"request body of {length} bytes; the largest accepted is "
                                         f"{s.max_body_bytes}", code="request_too_large")
            reserved = s.max_body_bytes if length is None else length
            full = self.bodies.reserve(caller.digest, reserved)
            if full is not None:
                reserved = 0
                if full == "key":
                    m.REJECTED.labels("key_memory_share").inc()
                    raise t.OpenAIError(429, f"API key {caller.grant.name} has its share of the gateway's memory in "
                                             f"request bodies already; retry when one ends", "rate_limit_error",
                                        code="too_many_bytes_in_flight", retry_after=1)
                m.REJECTED.labels("memory_full").inc()
                raise t.OpenAIError(503, "the gateway holds as many request bodies as it can; retry",
                                    "service_unavailable", code="gateway_busy", retry_after=1)
            try:
                body = await asyncio.wait_for(read_body(request, length), s.body_timeout_seconds)
            except asyncio.TimeoutError:
                m.REJECTED.labels("body_timeout").inc()
                raise t.OpenAIError(408, f"the request body did not arrive within {s.body_timeout_seconds:g}s",
                                    code="request_timeout") from None
            if len(body) < reserved:  # a body of unknown length: keep counting only what it is
                self.bodies.release(caller.digest, reserved - len(body))
                reserved = len(body)
            yield body
        finally:
            if reserved:
                self.bodies.release(caller.digest, reserved)
            self.in_flight.release(caller.digest)

    def max_tokens_cap(self, caller: Caller) -> int:
        return caller.grant.max_tokens or self.settings.max_tokens_per_request

    def resolve(self, model: str, grant: keys_core.Grant, namespace: str | None = None,
                openai: bool = True) -> Service:
        """The service a model id names, for this key: "NAME" (among the services the key may
        use) or "NAMESPACE/NAME". 403 for what the key may not use, existing or not. Traced as
        the span gateway.route."""
        with self.tracing.span("gateway.route") as span:
            svc = self._resolve(model, grant, namespace, openai)
            span.set(tr.NAMESPACE, svc.key[0])
            span.set(tr.NAME, svc.key[1])
        self.tracing.annotate(tr.NAMESPACE, svc.key[0])
        self.tracing.annotate(tr.NAME, svc.key[1])
        return svc

    def _resolve(self, model: str, grant: keys_core.Grant, namespace: str | None, openai: bool) -> Service:
        ns, sep, name = model.partition("/")
        if sep:
            namespace = ns
        else:
            name = model
        forbidden = t.OpenAIError(403, f"this API key may not use model {model!r}", "permission_error",
                                  code="model_not_allowed", param="model")
        if namespace is not None:
            if not grant.allows((namespace, name)):
                m.REJECTED.labels("forbidden").inc()
                raise forbidden
            svc = self.router.services.get((namespace, name))
            candidates = [svc] if svc is not None else []
        else:
            candidates = [s for s in self.router.find(name) if grant.allows(s.key)]
            if not candidates and not grant.may_hold_name(name):
                m.REJECTED.labels("forbidden").inc()
                raise forbidden
        if openai:
            candidates = [s for s in candidates if s.openai]
        if not candidates:
            m.REJECTED.labels("not_found").inc()
            raise t.OpenAIError(404, f"model {model!r} does not exist" + (
                " or does not serve the OpenAI routes (spec.openai)" if openai else ""),
                code="model_not_found", param="model")
        if len(candidates) > 1:
            m.REJECTED.labels("bad_request").inc()
            where = ", ".join(sorted(s.key[0] for s in candidates))
            raise t.OpenAIError(400, f"model {model!r} exists in namespaces {where}: name it NAMESPACE/{name}",
                                code="model_ambiguous", param="model")
        return candidates[0]

    def model_id(self, svc: Service, grant: keys_core.Grant) -> str:
        """The id /v1/models shows: the bare name unless the key sees that name twice."""
        same = [s for s in self.router.find(svc.key[1]) if s.openai and grant.allows(s.key)]
        return svc.key[1] if len(same) == 1 else svc.id

    # -- holding -----------------------------------------------------------------------------------

    async def endpoint(self, svc: Service, caller: Caller) -> Address:
        """A ready replica for `svc`, waiting for one (bounded, and within the caller's share of
        the service's hold queue) while there is none."""
        address = self.router.pick(svc.key)
        if address is not None:
            return address
        self._check_servable(svc)
        full = self.holds.admit(svc.key, caller.digest)
        if full is not None:
            m.REJECTED.labels("hold_full").inc()
            if full == "key":
                raise t.OpenAIError(429, f"model {svc.key[1]} is starting and API key {caller.grant.name} has "
                                         f"{self.holds.per_key} requests waiting for it already (its share); retry "
                                         f"later", "rate_limit_error", code="hold_share_full",
                                    retry_after=self.settings.retry_after_seconds)
            raise t.OpenAIError(503, f"model {svc.key[1]} is starting and {self.holds.held(svc.key)} requests "
                                     f"already wait for it; retry later", "service_unavailable",
                                code="model_starting", retry_after=self.settings.retry_after_seconds)
        gauge = m.HELD.labels(*svc.key)
        gauge.inc()
        started = self.clock()
        deadline = started + self.settings.hold_timeout_seconds
        try:
            with self.tracing.span("gateway.hold", {tr.NAMESPACE: svc.key[0], tr.NAME: svc.key[1]}):
                return await self._wait_for_replica(svc, started, deadline)
        finally:
            self.holds.leave(svc.key, caller.digest)
            gauge.dec()

    async def _wait_for_replica(self, svc: Service, started: float, deadline: float) -> Address:
        """The wait of endpoint(): until a replica is ready, the service goes away or fails, or the
        deadline passes."""
        while True:
            event = self._wake.setdefault(svc.key, asyncio.Event())
            remaining = deadline - self.clock()
            if remaining <= 0:
                m.REJECTED.labels("hold_timeout").inc()
                raise t.OpenAIError(
                    503, f"model {svc.key[1]} has no ready replica after "
                         f"{self.settings.hold_timeout_seconds:.0f}s; it may still be starting: retry later",
                    "service_unavailable", code="model_starting", retry_after=self.settings.retry_after_seconds)
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                continue
            current = self.router.services.get(svc.key)
            if current is None:
                raise t.OpenAIError(404, f"model {svc.key[1]} was deleted", code="model_not_found")
            self._check_servable(current)
            address = self.router.pick(svc.key)
            if address is not None:
                m.HOLD_SECONDS.labels(*svc.key).observe(self.clock() - started)
                return address

    def _check_servable(self, svc: Service) -> None:
        if self.draining:
            m.REJECTED.labels("unavailable").inc()
            raise t.OpenAIError(503, "the gateway is shutting down; retry", "service_unavailable",
                                code="gateway_stopping", retry_after=1)
        if svc.degraded and not self.router.endpoints(svc.key):
            m.REJECTED.labels("unavailable").inc()
            raise t.OpenAIError(503, f"model {svc.key[1]} cannot serve: {svc.degraded}", "service_unavailable",
                                code="model_unavailable", retry_after=self.settings.retry_after_seconds)

    async def on_shutdown(self, _app: web.Application) -> None:
        self.draining = True
        self._wake_up(set(self._wake))

    # -- upstream ----------------------------------------------------------------------------------

    def session(self) -> aiohttp.ClientSession:
        if self.upstream is None:
            timeout = aiohttp.ClientTimeout(total=self.settings.upstream_timeout_seconds,
                                            sock_connect=self.settings.upstream_connect_timeout_seconds)
            resolver = PinnedResolver(self.settings.resolve) if self.settings.resolve else None
            self.upstream = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60, resolver=resolver,
                                               ssl=self.upstream_tls() or True),
                timeout=timeout, auto_decompress=False)
        return self.upstream

    def upstream_tls(self) -> ssl.SSLContext | None:
        """TLS to the replicas (upstream_tls_ca_file set): their certificates verified against the CA
        and the service's DNS name, optionally with a client certificate (mutual TLS)."""
        s = self.settings
        if not s.upstream_tls_ca_file:
            return None
        context = ssl.create_default_context(cafile=s.upstream_tls_ca_file)
        if s.upstream_tls_cert_file:
            context.load_cert_chain(s.upstream_tls_cert_file, s.upstream_tls_key_file)
        return context

    def tls_name(self, svc: Service) -> str | None:
        """The name a replica's certificate is checked against: its Service's, NAME.NAMESPACE.svc
        (the address dialled is a pod IP, which certificates rarely name)."""
        return f"{svc.key[1]}.{svc.key[0]}.svc" if self.scheme == "https" else None

    async def _send(self, svc: Service, caller: Caller, method: str, path: str, body: bytes | None,
                    headers: dict[str, str]) -> tuple[Address, aiohttp.ClientResponse, float, Any]:
        """A request to a ready replica; a replica that refuses the connection is tried once more
        on another (nothing reached the first one). Two refusals end it, on two replicas or on the
        only one. Returns the replica, its answer (headers read), when the request was sent, and
        the attempt's upstream span (tracing.py), which the caller ends when the answer is over."""
        tried: set[Address] = set()
        attempts = 0
        while True:
            address = await self.endpoint(svc, caller)
            if address in tried:
                address = next((a for a in self.router.endpoints(svc.key) if a not in tried), address)
            attempts += 1
            self.router.acquire(address)
            span = self.tracing.upstream(method, address[0], address[1], path, headers)
            try:
                # Already encoded: the path is built from checked names only, and must reach the
                # replica exactly as built (a plain string would be re-normalised by yarl).
                target = yarl.URL(url(address, self.scheme) + path, encoded=True)
                sent = self.clock()
                resp = await self.session().request(method, target, data=body, headers=headers,
                                                    server_hostname=self.tls_name(svc))
                span.status_code(resp.status)
                return address, resp, sent, span
            except aiohttp.ClientConnectorError as e:
                span.fail(e)
                span.end()
                self.router.release(address)
                tried.add(address)
                if attempts >= 2:
                    raise t.OpenAIError(502, f"model {svc.key[1]}: its replicas refused the connection",
                                        "upstream_error", code="upstream_unreachable") from None
            except BaseException as e:
                span.fail(e)
                span.end()
                self.router.release(address)
                raise

    async def model_template(self, svc: Service, caller: Caller) -> str | None:
        """The chat template in the Triton model's config (parameter chat_template, where the model
        repository carries its tokenizer's), read once from a replica and kept for TEMPLATE_TTL."""
        cache_key = (svc.key, svc.generate_model)
        hit = self._model_templates.get(cache_key)
        if hit is not None and self.clock() - hit[0] < TEMPLATE_TTL:
            return hit[1]
        address = await self.endpoint(svc, caller)
        template: str | None = None
        path = f"/v2/models/{svc.generate_model}/config"
        headers: dict[str, str] = {}
        span = self.tracing.upstream("GET", address[0], address[1], path, headers)
        try:
            async with self.session().get(yarl.URL(f"{url(address, self.scheme)}{path}", encoded=True),
                                          headers=headers, server_hostname=self.tls_name(svc),
                                          timeout=aiohttp.ClientTimeout(total=10)) as resp:
                span.status_code(resp.status)
                if resp.status == 200:
                    params = (await resp.json(content_type=None)).get("parameters") or {}
                    value = (params.get("chat_template") or {}).get("string_value")
                    template = value if isinstance(value, str) and value.strip() else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError) as e:
            span.fail(e)
            return None  # not cached: the next request asks again
        finally:
            span.end()
        self._model_templates[cache_key] = (self.clock(), template)
        return template

    # -- routes --------------------------------------------------------------------------------------

    async def list_models(self, request: web.Request) -> web.Response:
        grant = self.authorize(request).grant
        data = [{"id": self.model_id(s, grant), "object": "model", "created": 0, "owned_by": s.key[0]}
                for key, s in sorted(self.router.services.items()) if s.openai and grant.allows(key)]
        return web.json_response({"object": "list", "data": data})

    async def get_model(self, request: web.Request) -> web.Response:
        grant = self.authorize(request).grant
        svc = self.resolve(request.match_info["model"], grant)
        return web.json_response({"id": self.model_id(svc, grant), "object": "model", "created": 0,
                                  "owned_by": svc.key[0]})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, t.ChatRequest, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, t.CompletionRequest, "completions")

    async def _openai(self, request: web.Request, kind: type[t._Request], route: str) -> web.StreamResponse:
        caller = self.authorize(request)
        if request.headers.get("Content-Encoding", "identity").lower() != "identity":
            m.REJECTED.labels("bad_request").inc()
            raise t.OpenAIError(415, "compressed request bodies are not accepted on the OpenAI routes",
                                code="unsupported_content_encoding")
        async with self.admitted(request, caller) as raw:
            return await self._openai_admitted(request, caller, raw, kind, route)

    async def _openai_admitted(self, request: web.Request, caller: Caller, raw: bytes | bytearray, kind: type[t._Request],
                               route: str) -> web.StreamResponse:
        req = t.parse_body(raw, kind)
        svc = self.resolve(req.model, caller.grant)
        cap = self.max_tokens_cap(caller)
        asked = t.max_tokens_asked(req)
        if asked is not None and asked > cap:
            m.REJECTED.labels("bad_request").inc()
            raise t.OpenAIError(400, f"max_tokens: at most {cap} for this API key", param="max_tokens",
                                code="max_tokens_too_large")
        if not self.router.endpoints(svc.key):
            # Held with the body as it came and nothing else (the parsed request is dropped and
            # made again once a replica is ready): a held request costs one copy of its body.
            del req
            await self.endpoint(svc, caller)
            req = t.parse_body(raw, kind)
        prompt = None
        if not svc.llm:   # a text model: the gateway renders the chat (the llm model renders its own)
            if isinstance(req, t.ChatRequest):
                template = svc.chat_template or await self.model_template(svc, caller)
                prompt = t.render_chat(template, req.messages)
            else:
                prompt = req.text()  # type: ignore[attr-defined]
        gen = t.to_generate(req, min(svc.default_max_tokens, cap), svc.llm, prompt)
        started = self.clock()
        code = 500
        in_flight = self.child(m.IN_FLIGHT, *svc.key)
        try:
            path = f"/v2/models/{svc.generate_model}/" + ("generate_stream" if gen.stream else "generate")
            address, resp, sent, span = await self._send(
                svc, caller, "POST", path, json.dumps(gen.body).encode(),
                {"Content-Type": "application/json", "Accept-Encoding": "identity"})
            in_flight.inc()
            try:
                if resp.status != 200:
                    raise await _upstream_error(resp, svc)
                if gen.stream:
                    answer = await self._stream(request, resp, gen, svc, started, caller, span)
                else:
                    whole = t.answer_of(await resp.json(content_type=None))
                    self._spend(caller, svc, whole.prompt_tokens, whole.completion_tokens)
                    answer = web.json_response(t.completion(gen, whole))
                code = answer.status
                return answer
            except BaseException as e:   # the answer failed on its way (a broken stream, a cancel)
                span.fail(e)
                raise
            finally:
                span.end()
                resp.release()
                self.router.release(address)
                in_flight.dec()
                self._account(caller, svc, sent)
        except t.OpenAIError as e:
            code = e.status
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            code = 502
            raise t.OpenAIError(502, f"model {svc.key[1]}: the replica failed: {type(e).__name__}",
                                "upstream_error", code="upstream_failed") from None
        finally:
            self.child(m.REQUESTS, *svc.key, route, str(code)).inc()
            self.child(m.LATENCY, *svc.key, route).observe(self.clock() - started)

    def _spend(self, caller: Caller, svc: Service, prompt: int | None, completion: int | None) -> None:
        """Tokens a request used, as the model counted them: usage per key, and the key's
        tokens-per-minute budget."""
        if prompt is None or completion is None:
            return
        self.child(m.KEY_TOKENS, caller.grant.name, *svc.key, "prompt").inc(prompt)
        self.child(m.KEY_TOKENS, caller.grant.name, *svc.key, "completion").inc(completion)
        self.child(m.OUTPUT_TOKENS, *svc.key).inc(completion)
        self.token_limiter.spend(caller.digest, caller.grant, prompt + completion, self.clock())

    def _account(self, caller: Caller, svc: Service, sent: float) -> None:
        """One request of `caller` answered by a replica of `svc`: usage per key."""
        self.child(m.KEY_REQUESTS, caller.grant.name, *svc.key).inc()
        self.child(m.KEY_REQUEST_SECONDS, caller.grant.name, *svc.key).inc(max(0.0, self.clock() - sent))

    async def _stream(self, request: web.Request, resp: aiohttp.ClientResponse, gen: t.Generate,
                      svc: Service, started: float, caller: Caller, span: Any = tr.NO_SPAN) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                          "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await out.prepare(request)
        stream = t.Stream(gen)
        buffer = bytearray()
        first: float | None = None
        try:
            async for chunk in resp.content.iter_any():
                buffer += chunk
                for event in t.sse_events(buffer):
                    piece = t.answer_of(event)
                    if piece.text and first is None:
                        first = self.clock()
                        m.TTFT.labels(*svc.key).observe(first - started)
                    data = stream.delta(piece)
                    if data:
                        await out.write(data)
                    if stream.stopped:
                        break
                if stream.stopped:
                    break
            await out.write(stream.end())
        except t.OpenAIError as e:
            span.fail(e)
            await out.write(stream.error(e))
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            span.fail(e)   # the answer began (200) and broke: the upstream span says so
            await out.write(stream.error(t.OpenAIError(502, f"the replica failed mid-stream: {type(e).__name__}",
                                                       "upstream_error", code="upstream_failed")))
        finally:
            if gen.llm:
                self._spend(caller, svc, stream.prompt_tokens, stream.tokens)
            else:
                self.child(m.OUTPUT_TOKENS, *svc.key).inc(stream.tokens)
            if first is not None and stream.tokens > 1:
                span = self.clock() - first
                if span > 0:
                    m.TOKENS_PER_SECOND.labels(*svc.key).observe((stream.tokens - 1) / span)
        await out.write_eof()
        return out

    async def v2(self, request: web.Request) -> web.StreamResponse:
        """KServe v2 pass-through: /v2/models/<service>/... goes to that service's Triton model."""
        try:
            call = passthrough.check(request.raw_path, request.method)
        except passthrough.PathRefused as e:
            m.REJECTED.labels("bad_path" if e.status == 400 else "not_found").inc()
            raise t.OpenAIError(e.status, e.message, code=e.code, allow=e.allow) from None
        caller = self.authorize(request)
        svc = self.resolve(call.service, caller.grant, request.headers.get(NAMESPACE_HEADER), openai=False)
        path = call.upstream_path(svc.v2_model)
        async with self.admitted(request, caller) as body:
            return await self._v2_admitted(request, caller, svc, path, body)

    async def _v2_admitted(self, request: web.Request, caller: Caller, svc: Service, path: str,
                           body: bytes | bytearray) -> web.StreamResponse:
        headers = {h: request.headers[h] for h in V2_REQUEST_HEADERS if h in request.headers}
        headers["Accept-Encoding"] = request.headers.get("Accept-Encoding", "identity")
        started = self.clock()
        code = 500
        in_flight = self.child(m.IN_FLIGHT, *svc.key)
        try:
            address, resp, sent, span = await self._send(svc, caller, request.method, path, body or None, headers)
            in_flight.inc()
            try:
                if resp.status >= 400:
                    # Triton's own error text stays here (it named internal shared-memory regions in
                    # CVE-2025-23319's chain); the client gets a fixed one.
                    raise await _upstream_error(resp, svc)
                headers = {h: resp.headers[h] for h in V2_RESPONSE_HEADERS if h in resp.headers}
                if resp.content_length is not None and resp.content_length <= SMALL_BODY:
                    # Most answers: one read and one write (streaming them costs a third more CPU).
                    code = resp.status
                    return web.Response(status=resp.status, body=await resp.read(), headers=headers)
                out = web.StreamResponse(status=resp.status, headers=headers)
                if resp.content_length is not None:
                    out.content_length = resp.content_length
                await out.prepare(request)
                async for chunk in resp.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                code = resp.status
                return out
            except BaseException as e:   # the answer failed on its way (a broken stream, a cancel)
                span.fail(e)
                raise
            finally:
                span.end()
                resp.release()
                self.router.release(address)
                in_flight.dec()
                self._account(caller, svc, sent)
        except t.OpenAIError as e:
            code = e.status
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            code = 502
            raise t.OpenAIError(502, f"model {svc.key[1]}: the replica failed: {type(e).__name__}",
                                "upstream_error", code="upstream_failed") from None
        finally:
            self.child(m.REQUESTS, *svc.key, "v2", str(code)).inc()
            self.child(m.LATENCY, *svc.key, "v2").observe(self.clock() - started)

    # -- health and metrics ------------------------------------------------------------------------------

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(self, _request: web.Request) -> web.Response:
        body = {"ready": self.ready, "keys": len(self.grants), "keysError": self.keys_error,
                "services": len(self.router.services),
                "watches": {w.name: {"synced": w.synced.is_set(), "failing": w.failing} for w in self.watches},
                "held": self.holds.count, "connections": self.connections.open}
        return web.json_response(body, status=200 if self.ready else 503)

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- wiring ----------------------------------------------------------------------------------------

    def api_app(self, with_health: bool) -> web.Application:
        traced = self.tracing.middleware()   # None while tracing is off
        app = web.Application(client_max_size=self.settings.max_body_bytes,
                              middlewares=[self.connections.middleware, *([traced] if traced else []), errors])
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/v1/models/{model:.+}", self.get_model)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        # Every /v2 path reaches the handler, which checks the path as sent (raw_path) against
        # the pass-through's allow-list before anything else: the router matches the normalised
        # path, in which "/v2/models/x/../../repository" is already "/v2/repository".
        app.router.add_route("*", r"/v2{tail:.*}", self.v2)
        app.on_response_prepare.append(_server_header)
        if with_health:
            self._add_health(app)
        app.on_shutdown.append(self.on_shutdown)
        app.on_cleanup.append(self.cleanup)
        return app

    def health_app(self) -> web.Application:
        app = web.Application(middlewares=[errors])
        app.on_response_prepare.append(_server_header)
        self._add_health(app)
        return app

    def _add_health(self, app: web.Application) -> None:
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)

    def api_runner(self, with_health: bool) -> web.AppRunner:
        """The API port's runner: idle connections closed after idle_timeout_seconds (aiohttp's
        keepalive_timeout also bounds a connection that never sends a whole request), bodies
        passed on as they came (a v2 client's compressed body stays compressed for Triton)."""
        s = self.settings
        return web.AppRunner(self.api_app(with_health), handler_cancellation=True,
                             shutdown_timeout=s.shutdown_timeout_seconds, access_log=None,
                             keepalive_timeout=s.idle_timeout_seconds, auto_decompress=False)

    def api_site(self, runner: web.AppRunner, host: str, port: int) -> web.TCPSite:
        return guard.GuardedSite(runner, host, port, self.connections)

    async def start(self) -> None:
        if self.settings.key_files:
            self.refresh_keys()
            self._tasks.append(asyncio.create_task(self._reload_keys(), name="reload keys"))
        else:
            self.keys_loaded = True  # no key files: every request is refused with 401
        if self.api is not None:
            self.start_watches()

    async def cleanup(self, _app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.upstream is not None:
            await self.upstream.close()
        if self.api is not None:
            await self.api.close()
        self.tracing.shutdown()


class PinnedResolver(aiohttp.abc.AbstractResolver):
    """Host names pinned to addresses (--resolve HOST=ADDRESS, as curl's --resolve), the rest
    resolved as usual: for EndpointSlices of addressType FQDN whose names the gateway's resolver
    does not know (the e2e suite points one at a local Triton this way)."""

    def __init__(self, pins: dict[str, str]):
        self.pins = pins
        self.fallback = aiohttp.resolver.DefaultResolver()

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[aiohttp.abc.ResolveResult]:
        pinned = self.pins.get(host)
        if pinned is None:
            return await self.fallback.resolve(host, port, family)
        fam = socket.AF_INET6 if ":" in pinned else socket.AF_INET
        return [{"hostname": host, "host": pinned, "port": port, "family": fam, "proto": 0,
                 "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        await self.fallback.close()


async def read_body(request: web.Request, length: int | None) -> bytes | bytearray:
    """The request's body in one buffer of its announced length, filled as it arrives: one copy
    in memory at every moment (aiohttp's read() grows a bytearray and then copies it into bytes,
    two copies at the end of every read). Without a Content-Length, aiohttp's read()."""
    if length is None:
        return await request.read()
    body = bytearray(length)
    view = memoryview(body)
    got = 0
    while got < length:
        chunk = await request.content.readany()
        if not chunk:
            raise t.OpenAIError(400, f"the request body ended after {got} of its {length} bytes",
                                code="incomplete_body")
        view[got:got + len(chunk)] = chunk
        got += len(chunk)
    view.release()
    return body


async def _server_header(_request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = SERVER_HEADER


async def _upstream_error(resp: aiohttp.ClientResponse, svc: Service) -> t.OpenAIError:
    """A replica's refusal as an OpenAI error with a fixed text: its 4xx (the model refused the
    input) stays a 400, anything else is a 502. What Triton said is logged at debug level only:
    its error texts have named internal state (CVE-2025-23319) and may echo a tenant's input."""
    try:
        text = (await resp.content.read(4096)).decode("utf-8", "replace")
    except (aiohttp.ClientError, asyncio.TimeoutError):
        text = ""
    log.debug("model %s/%s answered %d: %s", svc.key[0], svc.key[1], resp.status, text[:500])
    if 400 <= resp.status < 500 and svc.llm and t.MODEL_ERROR_TAG in text:
        try:
            return t.model_error(json.loads(text).get("error"))   # the llm model's own words
        except (ValueError, AttributeError):
            pass
    if 400 <= resp.status < 500:
        return t.OpenAIError(400, f"model {svc.key[1]} refused the request (HTTP {resp.status})",
                             code="model_error")
    return t.OpenAIError(502, f"model {svc.key[1]} failed (HTTP {resp.status})", "upstream_error",
                         code="upstream_failed")


@web.middleware
async def errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                 ) -> web.StreamResponse:
    try:
        return await handler(request)
    except t.OpenAIError as e:
        return _error_response(e)
    except web.HTTPRequestEntityTooLarge as e:
        m.REJECTED.labels("too_large").inc()
        return _error_response(t.OpenAIError(413, e.text or "request body too large", code="request_too_large"))
    except web.HTTPMethodNotAllowed as e:
        m.REJECTED.labels("not_found").inc()
        return _error_response(t.OpenAIError(405, f"{e.method} is not allowed here; use "
                                                  f"{', '.join(sorted(e.allowed_methods))}",
                                             code="method_not_allowed", allow=tuple(sorted(e.allowed_methods))))
    except web.HTTPException as e:
        if e.status < 400:
            raise
        reason = "not_found" if e.status == 404 else "bad_request"
        m.REJECTED.labels(reason).inc()
        return _error_response(t.OpenAIError(e.status, e.reason, code=reason))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as e:  # noqa: BLE001 - a bug answers 500, never a traceback to the client
        log.error("unexpected %s on %s %s", type(e).__name__, request.method, request.path)
        log.debug("unexpected error", exc_info=True)
        return _error_response(t.OpenAIError(500, "internal error in the gateway", "server_error",
                                             code="internal_error"))
