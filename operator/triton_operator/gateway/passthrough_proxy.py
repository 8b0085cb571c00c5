"""The KServe v2 pass-through: /v2/models/<service>/... checked against `passthrough`'s rules
(before anything else), then passed to that service's Triton model, its answer passed back
(Triton's own error texts replaced by fixed ones)."""

from __future__ import annotations

from aiohttp import web

from . import telemetry as m
from . import passthrough
from . import translate as t
from .admission import Admission
from .auth import Auth, Caller
from .resolution import Resolver
from .routing import Service
from .upstream import Upstream, upstream_error

# Request headers passed to a replica on the KServe v2 routes (binary tensors need
# Inference-Header-Content-Length; a compressed body its Content-Encoding). Accept-Encoding is the
# client's or identity: the client library would otherwise ask for gzip on the client's behalf.
V2_REQUEST_HEADERS = ("Content-Type", "Accept", "Inference-Header-Content-Length", "Content-Encoding")
V2_RESPONSE_HEADERS = ("Content-Type", "Inference-Header-Content-Length", "Content-Encoding")
NAMESPACE_HEADER = "X-Inference-Namespace"
SMALL_BODY = 1 << 16  # answers up to this size are passed through whole, larger ones streamed


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
            raise t.OpenAIError(e.status, e.message, code=e.code, allow=e.allow) from None
        caller = self.auth.authorize(request)
        svc = self.resolver.resolve(call.service, caller.grant, request.headers.get(NAMESPACE_HEADER), openai=False)
        path = call.upstream_path(svc.v2_model)
        async with self.admission.admitted(request, caller) as body:
            return await self._v2_admitted(request, caller, svc, path, body)

    async def _v2_admitted(self, request: web.Request, caller: Caller, svc: Service, path: str,
                           body: bytes | bytearray) -> web.StreamResponse:
        headers = {h: request.headers[h] for h in V2_REQUEST_HEADERS if h in request.headers}
        headers["Accept-Encoding"] = request.headers.get("Accept-Encoding", "identity")
        async with self.upstream.exchange(svc, caller, "v2", request.method, path, body or None, headers,
                                          lambda sent: self.auth.account(caller, svc, sent)) as ex:
            resp = ex.resp
            if resp.status >= 400:
                # Triton's own error text stays here (it named internal shared-memory regions in
                # CVE-2025-23319's chain); the client gets a fixed one.
                raise await upstream_error(resp, svc)
            headers = {h: resp.headers[h] for h in V2_RESPONSE_HEADERS if h in resp.headers}
            if resp.content_length is not None and resp.content_length <= SMALL_BODY:
                # Most answers: one read and one write (streaming them costs a third more CPU).
                ex.code = resp.status
                return web.Response(status=resp.status, body=await resp.read(), headers=headers)
            out = web.StreamResponse(status=resp.status, headers=headers)
            if resp.content_length is not None:
                out.content_length = resp.content_length
            await out.prepare(request)
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            ex.code = resp.status
            return out
