"""The gateway's aiohttp application: authentication, routes, holding, proxying, metrics.

Every answer that is not the model's own is OpenAI-shaped JSON (`translate.OpenAIError`); an
unexpected exception is logged with its type only and answered 500 without a traceback.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import socket
import time
from typing import Any, Awaitable, Callable

import aiohttp
import aiohttp.abc
import aiohttp.resolver
import yarl
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import keys as keys_core
from . import metrics as m
from . import passthrough
from . import translate as t
from .config import GatewaySettings
from .discovery import ENDPOINT_SLICES, INFERENCE_SERVICES, ApiServer, Watch
from .routing import Address, Key, Router, Service, url

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


class Gateway:
    def __init__(self, settings: GatewaySettings, api: ApiServer | None,
                 clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.api = api
        self.clock = clock
        self.router = Router()
        self.grants: dict[str, keys_core.Grant] = {}
        self.keys_loaded = False
        self._key_file_digest: str | None = None
        self.limiter = keys_core.RateLimiter(settings.requests_per_minute)
        self.watches: list[Watch] = []
        self._wake: dict[Key, asyncio.Event] = {}
        self.held: dict[Key, int] = {}
        self.draining = False
        self.upstream: aiohttp.ClientSession | None = None
        self._children: dict[tuple[Any, ...], Any] = {}
        self._model_templates: dict[tuple[Key, str], tuple[float, str | None]] = {}
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
            changed: set[Key] = set()
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

    def _wake_up(self, keys: set[Key]) -> None:
        for key in keys:
            event = self._wake.pop(key, None)
            if event is not None:
                event.set()

    @property
    def ready(self) -> bool:
        return self.keys_loaded and all(w.synced.is_set() for w in self.watches) and not self.draining

    # -- API keys ----------------------------------------------------------------------------------

    def load_keys(self) -> bool:
        """(Re)read the key files; True when the keys changed. A broken file keeps the keys in
        use (and is logged by name, never by content)."""
        texts = []
        for path in self.settings.key_files:
            with open(path, encoding="utf-8") as f:
                texts.append((path, f.read()))
        stamp = hashlib.sha256(json.dumps(texts).encode()).hexdigest()
        if stamp == self._key_file_digest:
            return False
        grants = keys_core.merge((path, keys_core.parse(text, path)) for path, text in texts)
        self.grants = grants
        self._key_file_digest = stamp
        self.limiter.forget(grants)
        self.keys_loaded = True
        m.API_KEYS.set(len(grants))
        return True

    async def _reload_keys(self) -> None:
        while True:
            await asyncio.sleep(self.settings.key_reload_seconds)
            try:
                if self.load_keys():
                    log.info("API keys reloaded: %d key(s)", len(self.grants))
            except (OSError, keys_core.KeyFileError) as e:
                log.error("API keys not reloaded, keeping the %d in use: %s", len(self.grants),
                          e if isinstance(e, keys_core.KeyFileError) else f"{type(e).__name__}: {e.filename}")

    def authorize(self, request: web.Request) -> keys_core.Grant:
        presented = keys_core.bearer(request.headers.get("Authorization"))
        if presented is None:
            m.REJECTED.labels("unauthorized").inc()
            raise t.OpenAIError(401, "missing API key: send it as 'Authorization: Bearer KEY'",
                                code="invalid_api_key")
        d = keys_core.digest(presented)
        grant = self.grants.get(d)
        if grant is None:
            m.REJECTED.labels("unauthorized").inc()
            raise t.OpenAIError(401, "invalid API key", code="invalid_api_key")
        wait = self.limiter.take(d, grant, self.clock())
        if wait > 0:
            m.REJECTED.labels("rate_limited").inc()
            raise t.OpenAIError(429, f"rate limit of API key {grant.name} reached; retry in {wait:.1f}s",
                                "rate_limit_error", code="rate_limit_exceeded", retry_after=wait)
        return grant

    def resolve(self, model: str, grant: keys_core.Grant, namespace: str | None = None,
                openai: bool = True) -> Service:
        """The service a model id names, for this key: "NAME" (among the services the key may
        use) or "NAMESPACE/NAME". 403 for what the key may not use, existing or not."""
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

    async def endpoint(self, svc: Service) -> Address:
        """A ready replica for `svc`, waiting for one (bounded) while there is none."""
        address = self.router.pick(svc.key)
        if address is not None:
            return address
        self._check_servable(svc)
        total = sum(self.held.values())
        if self.held.get(svc.key, 0) >= self.settings.max_held_per_service or total >= self.settings.max_held_total:
            m.REJECTED.labels("hold_full").inc()
            raise t.OpenAIError(503, f"model {svc.key[1]} is starting and {self.held.get(svc.key, 0)} requests "
                                     f"already wait for it; retry later", "service_unavailable",
                                code="model_starting", retry_after=self.settings.retry_after_seconds)
        self.held[svc.key] = self.held.get(svc.key, 0) + 1
        gauge = m.HELD.labels(*svc.key)
        gauge.inc()
        started = self.clock()
        deadline = started + self.settings.hold_timeout_seconds
        try:
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
        finally:
            self.held[svc.key] -= 1
            if not self.held[svc.key]:
                del self.held[svc.key]
            gauge.dec()

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
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60, resolver=resolver), timeout=timeout,
                auto_decompress=False)
        return self.upstream

    async def _send(self, svc: Service, method: str, path: str, body: bytes | None,
                    headers: dict[str, str]) -> tuple[Address, aiohttp.ClientResponse]:
        """A request to a ready replica; a replica that refuses the connection is tried once more
        on another (nothing reached the first one)."""
        tried: set[Address] = set()
        while True:
            address = await self.endpoint(svc)
            if address in tried:
                address = next((a for a in self.router.endpoints(svc.key) if a not in tried), address)
            self.router.acquire(address)
            try:
                # Already encoded: the path is built from checked names only, and must reach the
                # replica exactly as built (a plain string would be re-normalised by yarl).
                target = yarl.URL(url(address) + path, encoded=True)
                resp = await self.session().request(method, target, data=body, headers=headers)
                return address, resp
            except aiohttp.ClientConnectorError:
                self.router.release(address)
                tried.add(address)
                if len(tried) >= 2:
                    raise t.OpenAIError(502, f"model {svc.key[1]}: its replicas refused the connection",
                                        "upstream_error", code="upstream_unreachable") from None
            except BaseException:
                self.router.release(address)
                raise

    async def model_template(self, svc: Service) -> str | None:
        """The chat template in the Triton model's config (parameter chat_template, where the model
        repository carries its tokenizer's), read once from a replica and kept for TEMPLATE_TTL."""
        cache_key = (svc.key, svc.generate_model)
        hit = self._model_templates.get(cache_key)
        if hit is not None and self.clock() - hit[0] < TEMPLATE_TTL:
            return hit[1]
        address = await self.endpoint(svc)
        template: str | None = None
        try:
            async with self.session().get(yarl.URL(f"{url(address)}/v2/models/{svc.generate_model}/config", encoded=True),
                                          timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status == 200:
                    params = (await resp.json(content_type=None)).get("parameters") or {}
                    value = (params.get("chat_template") or {}).get("string_value")
                    template = value if isinstance(value, str) and value.strip() else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError):
            return None  # not cached: the next request asks again
        self._model_templates[cache_key] = (self.clock(), template)
        return template

    # -- routes --------------------------------------------------------------------------------------

    async def list_models(self, request: web.Request) -> web.Response:
        grant = self.authorize(request)
        data = [{"id": self.model_id(s, grant), "object": "model", "created": 0, "owned_by": s.key[0]}
                for key, s in sorted(self.router.services.items()) if s.openai and grant.allows(key)]
        return web.json_response({"object": "list", "data": data})

    async def get_model(self, request: web.Request) -> web.Response:
        grant = self.authorize(request)
        svc = self.resolve(request.match_info["model"], grant)
        return web.json_response({"id": self.model_id(svc, grant), "object": "model", "created": 0,
                                  "owned_by": svc.key[0]})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, t.ChatRequest, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, t.CompletionRequest, "completions")

    async def _openai(self, request: web.Request, kind: type[t._Request], route: str) -> web.StreamResponse:
        grant = self.authorize(request)
        raw = await request.read()
        req = t.parse_body(raw, kind)
        svc = self.resolve(req.model, grant)
        if isinstance(req, t.ChatRequest):
            template = svc.chat_template or await self.model_template(svc)
            prompt = t.render_chat(template, req.messages)
        else:
            prompt = req.text()  # type: ignore[attr-defined]
        gen = t.to_generate(req, prompt, svc.default_max_tokens)
        started = self.clock()
        code = 500
        in_flight = self.child(m.IN_FLIGHT, *svc.key)
        try:
            path = f"/v2/models/{svc.generate_model}/" + ("generate_stream" if gen.stream else "generate")
            address, resp = await self._send(svc, "POST", path, json.dumps(gen.body).encode(),
                                             {"Content-Type": "application/json"})
            in_flight.inc()
            try:
                if resp.status != 200:
                    raise await _upstream_error(resp, svc)
                if gen.stream:
                    answer = await self._stream(request, resp, gen, svc, started)
                else:
                    text, _ = t.cut_at_stop(t.output_text(await resp.json(content_type=None)), gen.stops)
                    answer = web.json_response(t.completion(gen, text, "stop"))
                code = answer.status
                return answer
            finally:
                resp.release()
                self.router.release(address)
                in_flight.dec()
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

    async def _stream(self, request: web.Request, resp: aiohttp.ClientResponse, gen: t.Generate,
                      svc: Service, started: float) -> web.StreamResponse:
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
                    piece = t.output_text(event)
                    if piece and first is None:
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
            await out.write(stream.error(e))
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            await out.write(stream.error(t.OpenAIError(502, f"the replica failed mid-stream: {type(e).__name__}",
                                                       "upstream_error", code="upstream_failed")))
        finally:
            m.OUTPUT_TOKENS.labels(*svc.key).inc(stream.tokens)
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
        grant = self.authorize(request)
        svc = self.resolve(call.service, grant, request.headers.get(NAMESPACE_HEADER), openai=False)
        path = call.upstream_path(svc.v2_model)
        body = await request.read()
        headers = {h: request.headers[h] for h in V2_REQUEST_HEADERS if h in request.headers}
        headers["Accept-Encoding"] = request.headers.get("Accept-Encoding", "identity")
        started = self.clock()
        code = 500
        in_flight = self.child(m.IN_FLIGHT, *svc.key)
        try:
            address, resp = await self._send(svc, request.method, path, body or None, headers)
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
            finally:
                resp.release()
                self.router.release(address)
                in_flight.dec()
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
        body = {"ready": self.ready, "keys": len(self.grants), "services": len(self.router.services),
                "watches": {w.name: {"synced": w.synced.is_set(), "failing": w.failing} for w in self.watches},
                "held": sum(self.held.values())}
        return web.json_response(body, status=200 if self.ready else 503)

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- wiring ----------------------------------------------------------------------------------------

    def api_app(self, with_health: bool) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes, middlewares=[errors])
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

    async def start(self) -> None:
        if self.settings.key_files:
            self.load_keys()
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
