"""The KServe v2 pass-through: /v2/models/<service>/... checked against `passthrough`'s rules
(before anything else), then passed to that service's Triton model, its answer passed back
(Triton's own error texts replaced by fixed ones).

The generate routes are admitted as the OpenAI routes are: the key's max_tokens cap applies (an
LLM service's request without max_tokens gets the service's default, capped), the answer's token
counts are the key's usage and spend its tokens-per-minute. Triton maps every key of a generate
body to the model input of that name, at the top level and inside "parameters" (server
src/http_server.cc ConvertGenerateRequest), so both are checked, and the replica is sent the
document as checked, re-encoded (one key once), not the bytes as they came. An LLM service's model
is decoupled and answers only through generate and generate_stream, so /infer is refused for it,
and for a service whose model serves the OpenAI text routes (its /infer would take any max_tokens
tensor): no route around those limits. `Inference-Header-Content-Length` must be an integer within
the body (Triton r26.07 ends its process on a value past INT_MAX); the generate routes read the
whole body as JSON and are sent none."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
from aiohttp import web

from . import openai_schema as oai
from . import passthrough
from . import telemetry as m
from . import translate as t
from .admission import Admission, Held
from .auth import Auth, Caller, request_units
from .resolution import Resolver
from .routing import Service
from .upstream import Exchange, Upstream, answer_json, read_chunk, read_whole, unsent, upstream_error

# Request headers passed to a replica on the KServe v2 routes (binary tensors need
# Inference-Header-Content-Length; a compressed body its Content-Encoding). Accept-Encoding is the
# client's or identity: the client library would otherwise ask for gzip on the client's behalf.
V2_REQUEST_HEADERS = ("Content-Type", "Accept", "Inference-Header-Content-Length", "Content-Encoding")
V2_RESPONSE_HEADERS = ("Content-Type", "Inference-Header-Content-Length", "Content-Encoding")
NAMESPACE_HEADER = "X-Inference-Namespace"
HEADER_LENGTH = "Inference-Header-Content-Length"
INT32_MAX = 2**31 - 1
SMALL_BODY = 1 << 16  # answers up to this size are passed through whole, larger ones streamed
GENERATE_ROUTES = ("/generate", "/generate_stream")
# The llm model's inputs the gateway sets: the router's (kvEvents), and the key's cache scope
ROUTER_INPUTS = frozenset({"prefix_keys", "prefix_boundary", "kv_events_after", "cache_salt"})
_DIGITS = re.compile(r"[0-9]{1,10}")


class PassthroughProxy:
    def __init__(self, auth: Auth, admission: Admission, resolver: Resolver, upstream: Upstream):
        self.auth = auth
        self.admission = admission
        self.resolver = resolver
        self.upstream = upstream

    async def v2(self, request: web.Request) -> web.StreamResponse:
        """KServe v2 pass-through: /v2/models/<service>/... goes to that service's Triton model."""
        try:
            call = passthrough.check(request.raw_path, request.method)
        except passthrough.PathRefused as e:
            m.REJECTED.labels("bad_path" if e.status == 400 else "not_found").inc()
            raise oai.OpenAIError(e.status, e.message, code=e.code, allow=e.allow) from None
        caller = self.auth.authorize(request)
        svc, path = self._route(call, caller, request, again=False)
        encoding = request.headers.get("Content-Encoding", "").strip().lower() or "identity"   # empty is none
        generate = call.route in GENERATE_ROUTES
        if generate and encoding != "identity":
            m.REJECTED.labels("bad_request").inc()
            raise oai.OpenAIError(415, "compressed request bodies are not accepted on the generate routes",
                                code="unsupported_content_encoding")
        async with self.admission.admitted(request, caller) as held:
            assert held.body is not None
            # the body took a while: the key may be revoked, or its grant changed; a generate
            # route's body is parsed, and counts by its size (its structure checked here, once)
            self.auth.recheck(caller, request_units(held.body) if generate else 1)
            # ... and its service may have changed: judged again as a new request would be (one
            # deleted, or made an LLM, while a body came was still sent on)
            svc, path = self._route(call, caller, request)
            check_header_length(request, len(held.body), encoding == "identity")
            capped = self._capped(held.body, svc, caller, call.route) if generate else None
            if not self.upstream.router.endpoints(svc.key):
                # A request that will be refused is refused now, not after waking its service;
                # one that waits ahead is judged again after (what it is charged and capped to, and
                # where it goes, are what they are when it is sent), holding its body alone.
                capped = None
                await self.upstream.holding.endpoint(svc, caller)
                svc, path = self._route(call, caller, request)
                capped = self._capped(held.body, svc, caller, call.route) if generate else None
            if capped is not None:
                held.replace(capped)
            return await self._v2_admitted(request, caller, svc, path, held, generate)

    def _route(self, call: passthrough.V2Call, caller: Caller, request: web.Request,
               again: bool = True) -> tuple[Service, str]:
        """The service a /v2 call names, as the caller's key may use it, and the upstream path; a
        404 for a route its model does not serve (`again`: looked at again, not traced again)."""
        svc = self.resolver.resolve(call.service, caller.grant, request.headers.get(NAMESPACE_HEADER), openai=False,
                                    again=again)
        if call.route == "/infer" and generates_text(svc):
            m.REJECTED.labels("not_found").inc()
            what = "is an LLM" if svc.llm else "generates text"
            raise oai.OpenAIError(404, f"model {call.service} {what}: send its requests to /v2/models/"
                                     f"{call.service}/generate or generate_stream, or to the OpenAI routes",
                                code="route_not_allowed")
        if call.route in ("/infer", *GENERATE_ROUTES) and embeds(svc):
            m.REJECTED.labels("not_found").inc()
            raise oai.OpenAIError(404, f"model {call.service} serves embeddings: send its requests to /v1/embeddings",
                                code="route_not_allowed")
        try:
            return svc, call.upstream_path(svc.v2_model)
        except passthrough.PathRefused as e:
            raise oai.OpenAIError(e.status, e.message, "upstream_error", code=e.code) from None

    def _capped(self, raw: bytes | bytearray, svc: Service, caller: Caller, route: str = "/generate") -> bytes:
        """A generate request within the key's max_tokens, as the replica is sent it (re-encoded):
        refused past the cap, at the top level or inside "parameters"; an LLM service's request that
        names none gets the service's default, capped (the model's own default may be larger).
        `n` is held to what the key is charged for (one whole number, 1 to MAX_N), and an LLM's
        /generate may not ask the model to stream."""
        data = oai.parse_json(raw, checked=True)   # request_units checked its structure
        if not isinstance(data, dict):
            m.REJECTED.labels("bad_request").inc()
            raise oai.OpenAIError(400, "the request body must be a JSON object")
        scopes: list[tuple[dict[str, Any], str]] = [(data, "")]
        if "parameters" in data:
            if not isinstance(data["parameters"], dict):
                m.REJECTED.labels("bad_request").inc()
                raise oai.OpenAIError(400, "parameters must be a JSON object", param="parameters")
            scopes.append((data["parameters"], "parameters."))
        for scope, prefix in scopes:
            # An integer past a double's range, refused as 1e400 is (parse_json): the replica's JSON
            # reader takes numbers as doubles, and a 4,000-digit temperature or seed was passed on.
            # The settings only: a token-id list is the model's input (a parse hook on every integer
            # tripled the parse of a 1 MiB list, on the event loop).
            for name, value in scope.items():
                if isinstance(value, int) and value.bit_length() > 1024:
                    m.REJECTED.labels("bad_request").inc()
                    raise oai.OpenAIError(400, f"{prefix}{name}: a number past a double's range", param=prefix + name)
        reserved = sorted(prefix + name for scope, prefix in scopes for name in ROUTER_INPUTS & scope.keys())
        if reserved:
            # The router's own inputs (kvEvents routing) and the cache scope: a client that set them
            # could read which prompts other keys' requests left in a replica's cache, name its
            # states falsely, or reuse (and time) what another key's requests left there.
            m.REJECTED.labels("bad_request").inc()
            raise oai.OpenAIError(400, f"{', '.join(reserved)}: set by the gateway, not by clients", param=reserved[0],
                                code="reserved_parameter")
        streaming = [p for scope, p in scopes if scope.get("stream") not in (None, False, [False])]
        if svc.llm and route == "/generate" and streaming:
            # Triton's /generate takes one response: a streaming model's many are answered 200 with
            # an error after the whole generation ran, and the answer had no counts to charge.
            prefix = streaming[0]
            m.REJECTED.labels("bad_request").inc()
            raise oai.OpenAIError(400, f"{prefix}stream: send streamed requests to generate_stream",
                                param=f"{prefix}stream")
        for scope, prefix in scopes:
            n = _single(scope.get("n"))
            if "n" in scope and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= oai.MAX_N):
                # Triton flattens nested lists (`[[16]]` is 16) and wraps 64-bit numbers to 32: what
                # the key is charged for must be what the model is told.
                m.REJECTED.labels("bad_request").inc()
                raise oai.OpenAIError(400, f"{prefix}n must be a whole number from 1 to {oai.MAX_N}", param=f"{prefix}n")
        cap = self.auth.max_tokens_cap(caller)
        asked_anywhere = False
        for scope, prefix in scopes:
            asked = _single(scope.get("max_tokens"))
            if asked is None:
                scope.pop("max_tokens", None)   # null is none asked (and no input given twice below)
                continue
            asked_anywhere = True
            if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
                m.REJECTED.labels("bad_request").inc()
                raise oai.OpenAIError(400, f"{prefix}max_tokens must be a positive integer", param=f"{prefix}max_tokens")
            if asked > cap:
                m.REJECTED.labels("bad_request").inc()
                raise oai.OpenAIError(400, f"{prefix}max_tokens: at most {cap} for this API key",
                                    param=f"{prefix}max_tokens", code="max_tokens_too_large")
        if svc.llm and not asked_anywhere:
            data["max_tokens"] = min(svc.default_max_tokens, cap)
        if svc.llm:
            data["cache_salt"] = caller.cache_scope   # the engine reuses only what this key's requests left
        return t.encode(data)

    async def _v2_admitted(self, request: web.Request, caller: Caller, svc: Service, path: str,
                           held: Held, generate: bool) -> web.StreamResponse:
        # a generate body is re-encoded JSON, read whole by Triton: no Inference-Header-Content-Length
        headers = {h: request.headers[h] for h in V2_REQUEST_HEADERS
                   if h in request.headers and not (generate and h == HEADER_LENGTH)}
        headers["Accept-Encoding"] = "identity" if generate else request.headers.get("Accept-Encoding", "identity")
        s = self.upstream.settings
        exchange: Exchange | None = None
        try:
            if generate and svc.llm:
                asked = _asked_tokens(held.body)
                self.auth.reserve(caller, asked, len(held.body or b""), asked)
            elif generate and generates_text(svc):
                # a text model counts no tokens: what it is sent and sends back is charged at an
                # estimate (Auth.spend_estimate), while the key's budget is above zero
                self.auth.reserve(caller, 0, len(held.body or b""))
            async with self.upstream.exchange(svc, caller, "v2", request.method, path, held.body or None, headers,
                                              lambda sent: self.auth.account(caller, svc, sent)) as ex:
                exchange = ex
                resp = ex.resp
                if not 200 <= resp.status < 300:
                    # Triton's own error text stays here (it named internal shared-memory regions in
                    # CVE-2025-23319's chain); the client gets a fixed one. A redirect or an interim
                    # status (101) is no answer either: a 502.
                    raise await upstream_error(resp, svc)
                headers = {h: resp.headers[h] for h in V2_RESPONSE_HEADERS if h in resp.headers}
                if path.endswith("/generate_stream"):
                    out = await self._stream(request, resp, svc, caller, held, headers, ex)
                elif generate or (resp.content_length is not None and resp.content_length <= SMALL_BODY):
                    # Most answers: one read and one write (streaming them costs a third more CPU).
                    body = await read_whole(resp, svc, held, s.max_answer_bytes, s.upstream_idle_timeout_seconds)
                    if generate and svc.llm:
                        counts = answer_json(body, svc)
                        if isinstance(counts, dict) and "error" not in counts:
                            answer = t.answer_of(counts)
                            self.auth.spend(caller, svc, answer.prompt_tokens, answer.completion_tokens)
                    elif generate and generates_text(svc):
                        self.auth.spend_estimate(caller, svc, _text_bytes(_json_or_none(body)))
                    ex.charged = True
                    out = web.Response(status=resp.status, body=bytes(body), headers=headers)
                    await ex.to_client(request, out.prepare(request))
                    await ex.to_client(request, out.write_eof())
                else:
                    out = web.StreamResponse(status=resp.status, headers=headers)
                    if resp.content_length is not None:
                        out.content_length = resp.content_length
                    await ex.to_client(request, out.prepare(request))
                    base = held.bytes
                    while chunk := await read_chunk(resp, svc, s.upstream_idle_timeout_seconds):
                        held.set(base + len(chunk) + unsent(request))   # until it is sent
                        await ex.to_client(request, out.write(chunk))
                        held.set(base + unsent(request))
                    await ex.to_client(request, out.write_eof())
                ex.code = resp.status
                return out
        except (asyncio.CancelledError, oai.OpenAIError) as e:
            # The client left before the model's count came (a stream left before its first event
            # too), or the answer was too large to take: the replica did the work, so the key's
            # budget pays what the request could make. A stream charges what it received.
            if generate and generates_text(svc):
                self.auth.spend_abandoned(caller, e, exchange is not None and exchange.charged)
            raise
        finally:
            self.auth.settle(caller)

    async def _stream(self, request: web.Request, resp: aiohttp.ClientResponse, svc: Service, caller: Caller,
                      held: Held, headers: dict[str, str], ex: Exchange) -> web.StreamResponse:
        """generate_stream passed through as it comes; an LLM service's events are read on the way for
        their token counts, each at most max_answer_bytes: the last event of each of the n answers
        carries that answer's totals, and the key spends the prompt once and every answer's tokens
        (as translate.total_usage counts them on the OpenAI routes)."""
        s = self.upstream.settings
        out = web.StreamResponse(status=resp.status, headers=headers)
        await ex.to_client(request, out.prepare(request))
        events = t.EventBuffer(s.max_answer_bytes)
        base = held.bytes
        last: dict[int, dict[str, Any]] = {}   # each answer's last event, by its index
        streamed = 0                            # bytes of text a text model sent (charged an estimate of)
        text_model = not svc.llm and generates_text(svc)
        ended: oai.OpenAIError | None = None    # the error that ended the stream, when the gateway raised it

        def count(batch: list[dict[str, Any]]) -> int:
            """Each answer's last event kept (an llm model's counts), or a text model's text bytes."""
            if svc.llm:
                for event in batch:
                    if "error" not in event:
                        last[t.answer_index(event)] = event
            return sum(_text_bytes(event) for event in batch) if text_model else 0

        parsed = svc.llm or text_model   # another model's stream passes as it is, never parsed
        tail = b""                       # how the last chunk sent ended

        try:
            while chunk := await read_chunk(resp, svc, s.upstream_idle_timeout_seconds):
                held.set(base + events.size + len(chunk) + unsent(request))   # until the chunk is sent
                if parsed:
                    streamed += count(events.feed(chunk))
                await ex.to_client(request, out.write(chunk))
                tail = chunk[-4:]
                held.set(base + events.size + unsent(request))
            if parsed:
                # a cut last event reached the client as the replica sent it: nothing more to count
                streamed += count(events.end(cut_ok=True))
        except (oai.OpenAIError, aiohttp.ClientError) as e:
            ended = e if isinstance(e, oai.OpenAIError) else None
            code = e.code if isinstance(e, oai.OpenAIError) else "upstream_failed"
            # after an event cut short, a blank line first: glued to its open line the error was unreadable
            cut = b"" if not tail or tail.endswith((b"\n\n", b"\r\n\r\n", b"\r\r")) else b"\n\n"
            await ex.to_client(request, out.write(
                cut + b"data: " + t.encode({"error": {"message": "the replica's stream broke", "code": code}}) + b"\n\n"))
        finally:
            if text_model:
                self.auth.spend_estimate(caller, svc, streamed)
                ex.charged = True
            if last:
                try:
                    usage = t.total_usage(t.gather([t.answer_of(event) for event in last.values()]))
                except oai.OpenAIError:
                    usage = None
                if usage is not None:
                    self.auth.spend(caller, svc, usage["prompt_tokens"], usage["completion_tokens"])
                    ex.charged = True   # total_usage gives counts only when every answer had them
            if svc.llm and not ex.charged and ended is not None:
                # ended by the request's own side before the counts came: it keeps what it took
                self.auth.spend_abandoned(caller, ended, False)
                ex.charged = True
        await ex.to_client(request, out.write_eof())
        return out


def _text_bytes(answer: Any) -> int:
    """Bytes (UTF-8) of text in a generate answer or stream event (a text model's, charged an estimate of)."""
    text = answer.get("text_output") if isinstance(answer, dict) else None
    if isinstance(text, list):
        return sum(t.utf8_len(x) for x in text if isinstance(x, str))
    return t.utf8_len(text) if isinstance(text, str) else 0


def _json_or_none(body: bytes | bytearray) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def generates_text(svc: Service) -> bool:
    """Whether /v2/models/<service>/ reaches a model that generates text under the key's limits: an
    LLM's, or the text model a service serves the OpenAI text routes from."""
    return svc.llm or (svc.openai and not svc.embeddings and svc.generate_model == svc.v2_model)


def embeds(svc: Service) -> bool:
    """Whether /v2/models/<service>/ reaches the model a service serves /v1/embeddings from: its
    inference routes would spend none of the key's tokensPerMinute and take any number of inputs,
    so that model is reached through /v1/embeddings only."""
    return svc.embeddings and svc.generate_model == svc.v2_model


def check_header_length(request: web.Request, body_length: int, identity: bool) -> None:
    """Inference-Header-Content-Length, when sent: once, an integer from 0 to the body's length (to
    INT32_MAX for a compressed body, whose length Triton checks once it is decompressed)."""
    values = request.headers.getall(HEADER_LENGTH, [])
    if not values:
        return
    limit = body_length if identity else INT32_MAX
    if len(values) > 1 or not _DIGITS.fullmatch(values[0]) or int(values[0]) > limit:
        m.REJECTED.labels("bad_request").inc()
        raise oai.OpenAIError(400, f"{HEADER_LENGTH} must be sent once, as an integer from 0 to "
                                 f"{'the body length' if identity else INT32_MAX}", param=HEADER_LENGTH,
                            code="bad_header")


def _single(value: Any) -> Any:
    """A value as Triton reads a request parameter: a list of one stands for its item."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _asked_tokens(body: bytes | bytearray | None) -> int:
    """The most tokens a generate request sent to a replica could make: its max_tokens (the
    gateway sets one on every LLM request it passes), n times."""
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return 0
    scopes = [data, data.get("parameters") if isinstance(data.get("parameters"), dict) else {}]

    def number(name: str, default: int) -> int:
        for scope in scopes:
            value = _single(scope.get(name))
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return default
    return number("max_tokens", 0) * number("n", 1)
