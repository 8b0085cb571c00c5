"""The OpenAI routes: GET /v1/models, /v1/models/{model}, POST /v1/chat/completions and
/v1/completions (streamed or not), translated (`translate`) to the generate / generate_stream
endpoints of the service's Triton model and back."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

import aiohttp
from aiohttp import web

from . import telemetry as m
from . import tracing as tr
from . import translate as t
from .admission import Admission
from .auth import Auth, Caller
from .holding import Holding
from .resolution import Resolver
from .routing import Router, Service
from .upstream import Upstream, upstream_error


class OpenAIProxy:
    def __init__(self, router: Router, auth: Auth, admission: Admission, resolver: Resolver, holding: Holding,
                 upstream: Upstream, clock: Callable[[], float]):
        self.router = router
        self.auth = auth
        self.admission = admission
        self.resolver = resolver
        self.holding = holding
        self.upstream = upstream
        self.clock = clock

    async def list_models(self, request: web.Request) -> web.Response:
        grant = self.auth.authorize(request).grant
        data = [{"id": self.resolver.model_id(s, grant), "object": "model", "created": 0, "owned_by": s.key[0]}
                for key, s in sorted(self.router.services.items()) if s.openai and grant.allows(key)]
        return web.json_response({"object": "list", "data": data})

    async def get_model(self, request: web.Request) -> web.Response:
        grant = self.auth.authorize(request).grant
        svc = self.resolver.resolve(request.match_info["model"], grant)
        return web.json_response({"id": self.resolver.model_id(svc, grant), "object": "model", "created": 0,
                                  "owned_by": svc.key[0]})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, t.ChatRequest, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, t.CompletionRequest, "completions")

    async def _openai(self, request: web.Request, kind: type[t._Request], route: str) -> web.StreamResponse:
        caller = self.auth.authorize(request)
        if request.headers.get("Content-Encoding", "identity").lower() != "identity":
            m.REJECTED.labels("bad_request").inc()
            raise t.OpenAIError(415, "compressed request bodies are not accepted on the OpenAI routes",
                                code="unsupported_content_encoding")
        async with self.admission.admitted(request, caller) as raw:
            return await self._openai_admitted(request, caller, raw, kind, route)

    async def _openai_admitted(self, request: web.Request, caller: Caller, raw: bytes | bytearray,
                               kind: type[t._Request], route: str) -> web.StreamResponse:
        req = t.parse_body(raw, kind)
        svc = self.resolver.resolve(req.model, caller.grant)
        cap = self.auth.max_tokens_cap(caller)
        asked = t.max_tokens_asked(req)
        if asked is not None and asked > cap:
            m.REJECTED.labels("bad_request").inc()
            raise t.OpenAIError(400, f"max_tokens: at most {cap} for this API key", param="max_tokens",
                                code="max_tokens_too_large")
        if not self.router.endpoints(svc.key):
            # Held with the body as it came and nothing else (the parsed request is dropped and
            # made again once a replica is ready): a held request costs one copy of its body.
            del req
            await self.holding.endpoint(svc, caller)
            req = t.parse_body(raw, kind)
        prompt = None
        if not svc.llm:   # a text model: the gateway renders the chat (the llm model renders its own)
            if isinstance(req, t.ChatRequest):
                template = svc.chat_template or await self.upstream.model_template(svc, caller)
                prompt = t.render_chat(template, req.messages)
            else:
                prompt = req.text()  # type: ignore[attr-defined]
        gen = t.to_generate(req, min(svc.default_max_tokens, cap), svc.llm, prompt)
        path = f"/v2/models/{svc.generate_model}/" + ("generate_stream" if gen.stream else "generate")
        async with self.upstream.exchange(svc, caller, route, "POST", path, json.dumps(gen.body).encode(),
                                          {"Content-Type": "application/json", "Accept-Encoding": "identity"},
                                          lambda sent: self.auth.account(caller, svc, sent)) as ex:
            resp = ex.resp
            if resp.status != 200:
                raise await upstream_error(resp, svc)
            if gen.stream:
                answer = await self._stream(request, resp, gen, svc, ex.started, caller, ex.span)
            else:
                whole = t.answer_of(await resp.json(content_type=None))
                self.auth.spend(caller, svc, whole.prompt_tokens, whole.completion_tokens)
                answer = web.json_response(t.completion(gen, whole))
            ex.code = answer.status
            return answer

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
                self.auth.spend(caller, svc, stream.prompt_tokens, stream.tokens)
            else:
                m.child(m.OUTPUT_TOKENS, *svc.key).inc(stream.tokens)
            if first is not None and stream.tokens > 1:
                decode = self.clock() - first
                if decode > 0:
                    m.TOKENS_PER_SECOND.labels(*svc.key).observe((stream.tokens - 1) / decode)
        await out.write_eof()
        return out
