"""The OpenAI routes: GET /v1/models, /v1/models/{model}, POST /v1/chat/completions,
/v1/completions and /v1/responses (streamed or not), translated (`translate`, `responses`) to the
generate / generate_stream endpoints of the service's Triton model and back, and POST
/v1/embeddings to an embedding model's generate endpoint (`embeddings`)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Callable

import aiohttp
from aiohttp import web

from . import embeddings as e
from . import openai_schema as oai
from . import responses as r
from . import telemetry as m
from . import translate as t
from .admission import Admission, Held
from .auth import Auth, Caller, request_units
from .holding import Holding
from .resolution import Resolver
from .routing import Beginning, Router, Service, ServiceKey, beginning, cursor_slot
from .upstream import (Exchange, Upstream, answer_json, answer_too_large, read_chunk, read_whole, unsent,
                       upstream_error)


@dataclass(eq=False)
class OpenAIProxy:
    router: Router
    auth: Auth
    admission: Admission
    resolver: Resolver
    holding: Holding
    upstream: Upstream
    clock: Callable[[], float]

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
        return await self._openai(request, oai.ChatRequest, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, oai.CompletionRequest, "completions")

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, oai.ChatRequest, "responses")

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, oai.ChatRequest, "embeddings")

    async def _openai(self, request: web.Request, kind: type[oai.GenerationRequest], route: str) -> web.StreamResponse:
        caller = self.auth.authorize(request)
        if (request.headers.get("Content-Encoding", "").strip().lower() or "identity") != "identity":   # empty is none
            m.REJECTED.labels("bad_request").inc()
            raise oai.OpenAIError(415, "compressed request bodies are not accepted on the OpenAI routes",
                                code="unsupported_content_encoding")
        async with self.admission.admitted(request, caller) as held:
            assert held.body is not None
            self.auth.recheck(caller, request_units(held.body))   # the body's structure checked, once
            if route == "embeddings":
                return await self._embeddings_admitted(request, caller, held)
            return await self._openai_admitted(request, caller, held, kind, route)

    async def _embeddings_admitted(self, request: web.Request, caller: Caller, held: Held) -> web.StreamResponse:
        assert held.body is not None
        req = e.parse(held.body, checked=True)
        for waited in (False, True):
            svc = self.resolver.resolve(req.model, caller.grant, again=waited)
            if not svc.embeddings:
                m.REJECTED.labels("bad_request").inc()
                raise oai.OpenAIError(400, f"model {req.model!r} generates text and has no embeddings (an embedding "
                                         f"model sets spec.openai.task embeddings)", param="model",
                                    code="wrong_model_task")
            if waited or self.router.endpoints(svc.key):
                break
            del req   # waits ahead with its body alone, and is judged again after (as _openai_admitted)
            await self.holding.endpoint(svc, caller)
            req = e.parse(held.body, checked=True)
        count, model_id = len(req.texts()), self.resolver.model_id(svc, caller.grant)
        payload = held.replace(t.encode(e.generate_body(req)))
        charged = False
        try:
            self.auth.reserve(caller, 0, len(payload), 0)   # its text, at BYTES_PER_TOKEN
            async with self.upstream.exchange(svc, caller, "embeddings", "POST",
                                              f"/v2/models/{svc.generate_model}/generate", payload,
                                              {"Content-Type": "application/json", "Accept-Encoding": "identity"},
                                              lambda sent: self.auth.account(caller, svc, sent)) as ex:
                resp = ex.resp
                if resp.status != 200:
                    raise await upstream_error(resp, svc)
                s = self.upstream.settings
                base = held.bytes   # what goes to the replica, held until the answer is written
                data = await read_whole(resp, svc, held, s.max_answer_bytes, s.upstream_idle_timeout_seconds)
                rows, tokens = e.vectors(answer_json(data, svc), count)
                del data
                # a model that counts nothing pays the estimate its reservation took
                self.auth.spend(caller, svc, e.estimated_tokens(req) if tokens is None else tokens, 0)
                charged = True
                body = t.encode(e.response(req, model_id, rows, tokens), request=False)
                del rows
                answer = await self._send(request, body, held, ex, base)
                ex.code = answer.status
                return answer
        except (asyncio.CancelledError, oai.OpenAIError) as exc:
            # The client left before the model's count came, or the answer was too large to take:
            # the replica read the input all the same, so the key's budget pays an estimate of it.
            self.auth.spend_abandoned(caller, exc, charged)
            raise
        finally:
            self.auth.settle(caller)

    async def _openai_admitted(self, request: web.Request, caller: Caller, held: Held,
                               kind: type[oai.GenerationRequest], route: str) -> web.StreamResponse:
        assert held.body is not None
        body = held.body

        def parse() -> tuple[oai.GenerationRequest, dict[str, Any] | None]:
            # /v1/responses: its chat request, and of the request as sent only what its answer
            # repeats (the parsed request, input items and all, held across the exchange kept some
            # 65 times the bytes its key was counted for).
            if route == "responses":
                original = r.parse(body, checked=True)
                return r.to_chat(original), r.echo(original)
            return oai.parse_body(body, kind, checked=True), None

        req, echoed = parse()
        for waited in (False, True):
            svc = self.resolver.resolve(req.model, caller.grant, again=waited)
            if svc.embeddings:
                m.REJECTED.labels("bad_request").inc()
                raise oai.OpenAIError(400, f"model {req.model!r} is an embedding model: send it to /v1/embeddings",
                                    param="model", code="wrong_model_task")
            cap = self.auth.max_tokens_cap(caller)
            asked = t.max_tokens_asked(req)
            if asked is not None and asked > cap:
                m.REJECTED.labels("bad_request").inc()
                field = "max_output_tokens" if echoed is not None else (
                    "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None
                    else "max_tokens")
                raise oai.OpenAIError(400, f"{field}: at most {cap} for this API key", param=field,
                                    code="max_tokens_too_large")
            chat = isinstance(req, oai.ChatRequest)
            template = svc.chat_template or self.upstream.cached_template(svc)
            if waited or (self.router.endpoints(svc.key) and (svc.llm or not chat or template is not None)):
                break
            # what the model cannot be asked (a text model's seed, n, tools...) is refused before
            # the request waits and wakes its service, not a cold start later
            t.to_generate(req, min(svc.default_max_tokens, cap), svc.llm, "")
            # Waits ahead (for a replica, for the model's chat template): the parsed request is
            # dropped and made again after them, so a waiting request holds its body and nothing
            # else; and it is judged again, as a new request would be: its service or its key may
            # have changed while it waited (it went out to the model as it was before).
            del req, echoed
            await self.holding.endpoint(svc, caller)
            req, echoed = parse()
        if not svc.llm and chat and template is None:
            template = await self.upstream.model_template(svc, caller) or ""
        prompt = None
        if not svc.llm:   # a text model: the gateway renders the chat (the llm model renders its own)
            prompt = t.render_chat(template, req.messages) if chat else req.text()  # type: ignore[attr-defined]
        gen = t.to_generate(req, min(svc.default_max_tokens, cap), svc.llm, prompt)
        scope = caller.cache_scope
        begins = beginning_of(req, svc.key, gen.max_tokens, svc.kv_events, scope) if svc.prefix_routing else None
        precise = begins is not None and begins.precise
        body = gen.body
        if svc.llm:
            body["cache_salt"] = scope   # the engine reuses only what this key's requests left
        if begins is not None and precise:
            body["prefix_keys"] = begins.keys()
            body["prefix_boundary"] = begins.before_last
            body = cursor_slot(body)
        del req, prompt
        encoded = t.encode(body)
        del body
        # the body as it came is no longer held; with a cursor slot, one the replica's cursor is written into
        payload = held.replace(bytearray(encoded) if precise else encoded)
        del encoded
        if echoed is not None:
            held.reserve(len(t.encode(echoed)))   # what the answer repeats is held until it is written
        gen = gen.without_body()
        path = f"/v2/models/{svc.generate_model}/" + ("generate_stream" if gen.upstream_stream else "generate")
        if begins is not None and precise:
            await self.upstream.probe(svc, begins)
        exchange: Exchange | None = None
        try:
            self.auth.reserve(caller, gen.max_tokens * gen.n, len(payload), gen.max_tokens * gen.n)
            async with self.upstream.exchange(svc, caller, route, "POST", path, payload,
                                              {"Content-Type": "application/json", "Accept-Encoding": "identity"},
                                              lambda sent: self.auth.account(caller, svc, sent), begins) as ex:
                exchange = ex
                resp = ex.resp
                if resp.status != 200:
                    raise await upstream_error(resp, svc)
                if gen.stream:
                    answer = await self._stream(request, resp, gen, svc, ex, caller, held, echoed)
                elif gen.upstream_stream:
                    answer = await self._gathered(request, resp, gen, svc, ex, caller, held)
                else:
                    answer = await self._whole(request, resp, gen, svc, ex, caller, held, echoed)
                ex.code = answer.status
                return answer
        except (asyncio.CancelledError, oai.OpenAIError) as exc:
            # The client left before the model's count came (a stream left before its first event
            # too: the prompt is read first), or the answer was too large to take: the replica did
            # the work, so the key's budget pays what the request could make. A stream that got its
            # first event charges what it received.
            self.auth.spend_abandoned(caller, exc, exchange is not None and exchange.charged)
            raise
        finally:
            self.auth.settle(caller)

    async def _whole(self, request: web.Request, resp: aiohttp.ClientResponse, gen: t.Generate, svc: Service,
                     ex: Exchange, caller: Caller, held: Held,
                     echoed: dict[str, Any] | None = None) -> web.StreamResponse:
        """A non-streamed answer: read whole within max_answer_bytes, translated, and written to the
        client while its bytes are still counted."""
        s = self.upstream.settings
        base = held.bytes
        data = await read_whole(resp, svc, held, s.max_answer_bytes, s.upstream_idle_timeout_seconds)
        whole = t.answer_of(answer_json(data, svc))
        ex.kv_events(whole.kv_events)
        if gen.llm:
            self.auth.spend(caller, svc, whole.prompt_tokens, whole.completion_tokens)
        else:
            self.auth.spend_estimate(caller, svc, t.utf8_len(whole.text))
        ex.charged = True
        body = t.encode(r.response_object(echoed, whole) if echoed is not None else t.completion(gen, whole),
                        request=False)
        del data, whole
        return await self._send(request, body, held, ex, base)

    @staticmethod
    async def _send(request: web.Request, body: bytes, held: Held, ex: Exchange, base: int) -> web.StreamResponse:
        """A whole JSON answer, written while its bytes are still counted as held, on top of the
        `base` bytes the request still holds (what went to the replica)."""
        held.set(base + len(body))
        out = web.Response(body=body, content_type="application/json")
        await ex.to_client(request, out.prepare(request))
        await ex.to_client(request, out.write_eof())
        return out

    async def _gathered(self, request: web.Request, resp: aiohttp.ClientResponse, gen: t.Generate, svc: Service,
                        ex: Exchange, caller: Caller, held: Held) -> web.StreamResponse:
        """n answers, not streamed to the client: the model's stream read whole (within
        max_answer_bytes, as a whole answer is), gathered per answer, and written as one."""
        s = self.upstream.settings
        events = t.EventBuffer(s.max_answer_bytes)
        pieces: list[t.Answer] = []
        base, size = held.bytes, 0   # the prompt that went to the replica is still held: counted on top
        while chunk := await read_chunk(resp, svc, s.upstream_idle_timeout_seconds):
            size += len(chunk)
            if size > s.max_answer_bytes:
                raise answer_too_large(svc, s.max_answer_bytes)
            held.set(base + size)
            pieces += [t.answer_of(event) for event in events.feed(chunk)]
        pieces += [t.answer_of(event) for event in events.end()]
        for piece in pieces:
            ex.kv_events(piece.kv_events)
        answers = t.gather(pieces)
        if gen.llm:
            answers = t.finished(answers, gen.n)
        counts = t.total_usage(answers)
        if gen.llm:
            self.auth.spend(caller, svc, counts["prompt_tokens"] if counts else None,
                            counts["completion_tokens"] if counts else None)
        else:
            self.auth.spend_estimate(caller, svc, sum(t.utf8_len(a.text) for a in answers))
        ex.charged = True
        body = t.encode(t.completion(gen, answers), request=False)
        del pieces, answers
        return await self._send(request, body, held, ex, base)

    async def _stream(self, request: web.Request, resp: aiohttp.ClientResponse, gen: t.Generate,
                      svc: Service, ex: Exchange, caller: Caller, held: Held,
                      echoed: dict[str, Any] | None = None) -> web.StreamResponse:
        started, span = ex.started, ex.span
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                          "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await ex.to_client(request, out.prepare(request))
        s = self.upstream.settings
        stream: t.Stream | r.ResponseStream = r.ResponseStream(echoed, llm=gen.llm) if echoed is not None else t.Stream(gen)
        events = t.EventBuffer(s.max_answer_bytes)
        base = held.bytes
        first: float | None = None
        ended: oai.OpenAIError | None = None   # the error that ended the answer, when the gateway raised it

        async def forward(batch: list[dict[str, Any]], size: int) -> None:
            nonlocal first
            for event in batch:
                piece = t.answer_of(event)
                ex.kv_events(piece.kv_events)
                if piece.text and first is None:
                    first = self.clock()
                    m.TTFT.labels(*svc.key).observe(first - started)
                data = stream.delta(piece)
                if data:
                    held.set(base + stream.retained + events.size + size + unsent(request) + len(data))
                    await ex.to_client(request, out.write(data))
                if stream.stopped:
                    return

        try:
            while chunk := await read_chunk(resp, svc, s.upstream_idle_timeout_seconds):
                # the chunk, the events made of it, what the client has not taken yet and what the
                # stream keeps for its last events (a Response repeats its text whole) are held
                held.set(base + stream.retained + events.size + len(chunk) + unsent(request))
                await forward(events.feed(chunk), len(chunk))
                if stream.stopped:
                    break
                held.set(base + stream.retained + events.size + unsent(request))
            else:
                await forward(events.end(), 0)
            tail = stream.end()
            held.set(base + stream.retained + len(tail) + unsent(request))
            await ex.to_client(request, out.write(tail))
        except oai.OpenAIError as e:
            span.fail(e)
            ex.failed = True
            ended = e
            await ex.to_client(request, out.write(stream.error(e)))
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            span.fail(e)   # the answer began (200) and broke: the upstream span says so
            ex.failed = True
            await ex.to_client(request, out.write(stream.error(oai.OpenAIError(
                502, f"the replica failed mid-stream: {type(e).__name__}", "upstream_error", code="upstream_failed"))))
        finally:
            ex.first, ex.tokens = first, stream.tokens
            if gen.llm:
                self.auth.spend(caller, svc, stream.prompt_tokens, stream.tokens)
                ex.charged = stream.prompt_tokens is not None
                if not ex.charged and ended is not None:
                    # ended by the request's own side (its memory share full, an event too large)
                    # before the model's count came: as a client that left, it keeps what it took
                    self.auth.spend_abandoned(caller, ended, False)
            else:
                self.auth.spend_estimate(caller, svc, stream.generated_bytes)
                ex.charged = True
                m.child(m.OUTPUT_TOKENS, *svc.key).inc(stream.tokens)
            if first is not None and stream.tokens > 1:
                decode = self.clock() - first
                if decode > 0:
                    m.TOKENS_PER_SECOND.labels(*svc.key).observe((stream.tokens - 1) / decode)
        await ex.to_client(request, out.write_eof())
        return out


def beginning_of(req: oai.GenerationRequest, key: ServiceKey, answer: int = 0, precise: bool = False,
                 scope: str = "") -> Beginning:
    """The request's Beginning for prefix routing: its prompt as the model will read it, within
    its service and the API key's cache `scope` (Caller.cache_scope: engines reuse a prompt only
    for the key that sent it, so its names and its place in the index are the key's), where its
    last message's content begins, and the `answer` tokens it may take.

    The prompt is encoded so that two prompts the model reads differently never share a name (the
    names are what engines call what they keep, and every gateway believes them): one JSON line
    for the service and scope, one for the tools the template renders when there are any, then
    each message as the JSON object the llm model is sent (translate.chat_message_dicts: tool calls
    and tool_call_id included), one a line, or a completion's prompt as one JSON string. A JSON
    text holds no raw newline, and a line of a chat begins with `{` where a completion begins with
    `"`, so no content can pass for a separator; a later turn of a chat still begins with its
    earlier ones' lines."""
    head = json.dumps([key[0], key[1], scope]) + "\n"
    if isinstance(req, oai.ChatRequest):
        tools = req.tools_json()
        if tools is not None:
            head += json.dumps({"tools": tools, "tool_choice": req.tool_choice_text()}, ensure_ascii=False) + "\n"
        messages = t.chat_message_dicts(req)
        lines = [json.dumps(m, ensure_ascii=False, separators=(",", ":")) + "\n" for m in messages]
        text = "".join(lines)
        last_at = 0
        if lines:   # where the last message's content begins (its line up to the content's opening quote)
            opening = json.dumps({"role": messages[-1]["role"], "content": ""}, separators=(",", ":"))[:-2]
            last_at = len(text) - len(lines[-1]) + len(opening)
    else:
        text = json.dumps(req.text(), ensure_ascii=False)  # type: ignore[attr-defined]
        last_at = 0
    return beginning(head + text, answer, len(head) + last_at if last_at else 0, precise)
