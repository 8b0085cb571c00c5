"""Calls to the replicas: one client session (TLS to the replicas when configured, host names
pinned with --resolve), a request sent to a ready replica (tried once more on another when the
first refuses the connection), a text model's chat template read from its config, and a replica's
refusal turned into an OpenAI error with a fixed text."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
import aiohttp.abc
import aiohttp.payload
import aiohttp.resolver
import yarl
from aiohttp import web

from . import openai_schema as oai
from . import telemetry as m
from . import tracing as tr
from . import translate as t
from .admission import Held
from .auth import Caller
from .config import GatewaySettings
from .holding import EJECT_SECONDS, Holding
from .routing import Address, Beginning, Router, Service, ServiceKey, has_cursor_slot, url

log = logging.getLogger(__name__)

TEMPLATE_TTL = 600.0  # seconds a chat template read from a model's config is used before it is read again
CONNECT_ATTEMPTS = 3  # replicas a request tries whose connection fails other than by a refusal (a timeout, TLS, a host unreachable)
PROBE_TIMEOUT_S = 0.5  # kvEvents: how long a request waits for the replicas' engines to say what they hold
PROBE_MAX_BYTES = 8 << 20   # kvEvents: the largest answer to a probe read (a snapshot of a full index is ~2 MiB)
READ_CHUNK = 16 * 1024      # the most of a replica's answer read at once (counted until it is written)
READ_BUFSIZE = 16 * 1024    # a replica's answer waiting to be read: reading pauses past twice this
CONFIG_MAX_BYTES = 1 << 20   # the largest model config read for its chat template
UPSTREAM_RCVBUF = 32 * 1024  # a replica socket's receive buffer (the kernel doubles it)


# The status a request whose client left before its answer was whole is counted under (nginx's "client
# closed request"). It is not the service's failure: counted as a 500 and as a miss of the latency
# target, a tenant that hung up lowered the attainment the autoscaler keeps replicas for.
CLIENT_CLOSED = 499


@dataclass
class Exchange:
    """One request to a replica, as a route handler sees it inside `Upstream.exchange`: the
    replica's answer (headers read) and the attempt's span to read and report, when the handler
    started, and `code`, the status the client got, which the handler sets when it answers. What
    goes to the client goes through `to_client`."""

    resp: aiohttp.ClientResponse
    span: Any
    started: float
    code: int = 500
    first: float | None = None    # when the first token went to the client (streams)
    tokens: int = 0               # tokens streamed to the client
    failed: bool = False          # the answer began (200) and broke
    charged: bool = False         # the answer's tokens went to the key's budget
    kv_events: Callable[[str], None] = lambda _: None   # what the replica's prefix cache did (routing.Router.observe)
    idle: float = math.inf        # the longest one write to the client may wait (upstream_idle_timeout_seconds)
    deadline: float = math.inf    # when the exchange must be over, by `clock` (upstream_timeout_seconds after it began)
    clock: Callable[[], float] = time.monotonic

    async def to_client(self, request: web.BaseRequest, write: Awaitable[Any]) -> None:
        """One write to the client (a response's head, a piece of it, its end), within `idle`
        seconds and the exchange's deadline. A client that stops reading would otherwise hold its
        request for good once the socket's buffers are full: its place among the key's requests in
        flight, the replica's count, the held bytes and the connection to the replica, which goes
        on generating. Its connection is then aborted and the request ends as when a client goes
        away (cancelled: everything it holds is released on the way out)."""
        try:
            async with asyncio.timeout(max(0.0, min(self.idle, self.deadline - self.clock()))):
                await write
        except asyncio.TimeoutError:
            m.CONNECTIONS_REFUSED.labels("client_stalled").inc()
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError("the client stopped reading its answer") from None
        except ConnectionResetError:
            # The client's connection is gone (aiohttp's ClientConnectionResetError is a ClientError
            # too: caught as one, a client that hung up mid-stream was a replica failing, a 502).
            raise asyncio.CancelledError("the client went away") from None


class _Reaching(aiohttp.payload.BytesPayload):
    """A request's body, whose caller counts as reached (Caller.reached) once it is written, after
    the head: a client that left while the gateway was still connecting (a node that is down
    drops connection attempts for the connect timeout) was charged its whole reservation for a
    request no replica saw. (A trace hook did the same for 14 us a request.)"""

    def __init__(self, value: bytes | bytearray, caller: Caller):
        super().__init__(value)
        self._caller = caller

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        self._caller.reached = True
        await super().write_with_length(writer, content_length)

    async def write(self, writer: Any) -> None:
        self._caller.reached = True
        await super().write(writer)


class Upstream:
    def __init__(self, settings: GatewaySettings, router: Router, holding: Holding,
                 clock: Callable[[], float], tracing: tr.Off | tr.On):
        self.settings = settings
        self.router = router
        self.holding = holding
        self.clock = clock
        self.tracing = tracing
        self.scheme = "https" if settings.upstream_tls_ca_file else "http"
        self._session: aiohttp.ClientSession | None = None
        self._model_templates: dict[tuple[ServiceKey, str], tuple[float, str | None]] = {}

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self.settings.upstream_timeout_seconds,
                                            sock_connect=self.settings.upstream_connect_timeout_seconds)
            resolver = PinnedResolver(self.settings.resolve) if self.settings.resolve else None
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60, resolver=resolver,
                                               ssl=self.tls_context() or True, socket_factory=_upstream_socket),
                timeout=timeout, auto_decompress=False, read_bufsize=READ_BUFSIZE)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def tls_context(self) -> ssl.SSLContext | None:
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

    @contextlib.asynccontextmanager
    async def exchange(self, svc: Service, caller: Caller, route: str, method: str, path: str,
                       body: bytes | bytearray | None, headers: dict[str, str],
                       account: Callable[[float], None], begins: Beginning | None = None) -> AsyncIterator[Exchange]:
        """What every route does around one request to a replica: send it (`send`), count it in
        flight, and once the handler's answer is over (or failed on its way, or was cancelled) end
        the span, release the answer and the replica and `account(sent)` for the key; a replica
        that fails becomes a 502 with a fixed text; the request and its latency are counted by
        `route` and the status the client got."""
        started = self.clock()
        code = 500
        in_flight_gauge = m.child(m.IN_FLIGHT, *svc.key)
        ex: Exchange | None = None
        try:
            address, resp, sent, span, work = await self.send(svc, caller, method, path, body, headers, begins)
            in_flight_gauge.inc()
            ex = Exchange(resp, span, started, kv_events=lambda text: self.router.observe(address, text, self.clock()),
                          idle=self.settings.upstream_idle_timeout_seconds,
                          deadline=started + self.settings.upstream_timeout_seconds, clock=self.clock)
            try:
                yield ex
            except BaseException as e:   # the answer failed on its way (a broken stream, a cancel)
                span.fail(e)
                raise
            finally:
                span.end()
                resp.release()
                self.router.release(address, work)
                in_flight_gauge.dec()
                account(sent)
            code = ex.code
        except oai.OpenAIError as e:
            code = e.status
            raise
        except asyncio.CancelledError:
            code = CLIENT_CLOSED
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            code = 502
            raise oai.OpenAIError(502, f"model {svc.key[1]}: the replica failed: {type(e).__name__}",
                                "upstream_error", code="upstream_failed") from None
        finally:
            ended = self.clock()
            m.child(m.REQUESTS, *svc.key, route, str(code)).inc()
            m.child(m.LATENCY, *svc.key, route).observe(ended - started)
            if svc.slo is not None and ex is not None and code != CLIENT_CLOSED:
                met = slo_met(svc.slo, 502 if ex.failed else code, started, ex.first, ended, ex.tokens)
                if met is not None:
                    m.child(m.SLO_REQUESTS, *svc.key, "true" if met else "false").inc()

    async def send(self, svc: Service, caller: Caller, method: str, path: str, body: bytes | bytearray | None,
                   headers: dict[str, str], begins: Beginning | None = None
                   ) -> tuple[Address, aiohttp.ClientResponse, float, Any, int]:
        """A request to a usable replica. A replica that refuses the connection or does not accept it
        within upstream_connect_timeout_seconds (nothing reached it) is ejected for EJECT_SECONDS and
        the request tried on another: every usable replica that refuses at once, at most
        CONNECT_ATTEMPTS whose connection fails otherwise (a timeout, a failed TLS handshake, a
        host unreachable: each can take seconds; three replicas that refused left a healthy fourth
        untried, and the request a 503); when none is left, a 503 that says so (Holding: every
        replica sitting out).
        Returns the replica, its answer (headers read), when the request was sent, and the attempt's
        upstream span (tracing.py), which the caller ends when the answer is over, and the request's
        work at the replica (router.acquire). The caller also releases the replica (router.release,
        with that work) and the answer. A request routed on engine events (a precise Beginning)
        tells the replica this gateway's cursor into them (kv_events_after, written into the slot
        `body` reserves for it first in its JSON object: the replica is known only now)."""
        attempts = tried = 0   # the connections that failed other than by a refusal; all that failed
        while True:
            address = await self.holding.endpoint(svc, caller, begins)
            work = self.router.acquire(address, begins)
            span = self.tracing.upstream(method, address[0], address[1], path, headers)
            try:
                # Already encoded: the path is built from checked names only, and must reach the
                # replica exactly as built (a plain string would be re-normalised by yarl).
                target = yarl.URL(url(address, self.scheme) + path, encoded=True)
                sent = self.clock()
                if begins is not None and begins.precise and has_cursor_slot(body):
                    self.router.write_cursor(body, address)
                # A replica's redirect is never followed (aiohttp follows ten by default): it sent
                # the tenant's request, prompt and all, to whatever host the Location named and
                # passed that host's answer back as the model's. The caller is marked reached when
                # its body goes out (_Reaching), not before the connection is made.
                if body is None:
                    caller.reached = True
                resp = await self.session().request(
                    method, target, data=None if body is None else _Reaching(body, caller), headers=headers,
                    server_hostname=self.tls_name(svc), allow_redirects=False)
                span.status_code(resp.status)
                return address, resp, sent, span, work
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
                span.fail(e)
                span.end()
                self.router.release(address, work)
                self.router.eject(address, self.clock() + EJECT_SECONDS)
                reason = "timeout" if isinstance(e, aiohttp.ConnectionTimeoutError) else (
                    "tls" if isinstance(e, aiohttp.ClientSSLError) else "refused")
                m.child(m.UPSTREAM_CONNECT_FAILURES, *svc.key, reason).inc()
                log.info("%s/%s: replica %s:%d %s; it sits out %.0fs", svc.key[0], svc.key[1], address[0],
                         address[1], {"timeout": "did not accept the connection in time",
                                      "tls": "failed the TLS handshake", "refused": "refused the connection"}[reason],
                         EJECT_SECONDS)
                # a refusal costs nothing to try past; an unreachable host (EHOSTUNREACH after an
                # ARP timeout, about 3 s) costs as a timeout does
                attempts += not isinstance(getattr(e, "os_error", None), ConnectionRefusedError)
                tried += 1
                if attempts >= CONNECT_ATTEMPTS:
                    raise oai.OpenAIError(503, f"model {svc.key[1]}: its replicas refused the connection or timed "
                                             f"out ({tried} tried); retry later", "service_unavailable",
                                        code="upstream_unreachable",
                                        retry_after=self.settings.retry_after_seconds) from None
            except BaseException as e:
                span.fail(e)
                span.end()
                self.router.release(address, work)
                raise

    async def probe(self, svc: Service, begins: Beginning) -> None:
        """kvEvents: before `begins` is routed, ask the replicas Router.to_probe names what their
        engines stored and evicted since this gateway's cursor (the llm model answers a request that
        carries kv_events_after alone at once, outside its engine's queue), all at once, for at most
        PROBE_TIMEOUT_S; each answer is applied as a request's would be. A replica that does not
        answer in time, or answers what cannot be read, is routed on what is known of it."""
        addresses = self.router.to_probe(svc.key, begins, self.clock())
        if not addresses:
            return
        path = f"/v2/models/{svc.generate_model}/generate"

        async def ask(address: Address) -> None:
            body = json.dumps({"kv_events_after": self.router.cursor(address)}).encode()
            try:
                async with self.session().post(yarl.URL(url(address, self.scheme) + path, encoded=True), data=body,
                                               headers={"Content-Type": "application/json"},
                                               server_hostname=self.tls_name(svc), allow_redirects=False,
                                               timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as resp:
                    data = await read_capped(resp, PROBE_MAX_BYTES)
                    if resp.status != 200:
                        raise ValueError(f"HTTP {resp.status}")
                    events = json.loads(data).get("kv_events")
                    if not isinstance(events, str):
                        raise ValueError("no kv_events")
                    self.router.observe(address, events, self.clock())
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError, RecursionError) as e:
                log.debug("probe of %s:%d: %s", address[0], address[1], e)

        await asyncio.gather(*(ask(a) for a in addresses))

    def cached_template(self, svc: Service) -> str | None:
        """The model's chat template if it was read within TEMPLATE_TTL ("" when the model has none),
        else None (model_template must ask a replica)."""
        hit = self._model_templates.get((svc.key, svc.generate_model))
        if hit is None or self.clock() - hit[0] >= TEMPLATE_TTL:
            return None
        return hit[1] or ""

    async def model_template(self, svc: Service, caller: Caller) -> str | None:
        """The chat template in the Triton model's config (parameter chat_template, where the model
        repository carries its tokenizer's), read once from a replica and kept for TEMPLATE_TTL."""
        cache_key = (svc.key, svc.generate_model)
        hit = self._model_templates.get(cache_key)
        if hit is not None and self.clock() - hit[0] < TEMPLATE_TTL:
            return hit[1]
        address = await self.holding.endpoint(svc, caller)
        template: str | None = None
        path = f"/v2/models/{svc.generate_model}/config"
        headers: dict[str, str] = {}
        span = self.tracing.upstream("GET", address[0], address[1], path, headers)
        try:
            async with self.session().get(yarl.URL(f"{url(address, self.scheme)}{path}", encoded=True),
                                          headers=headers, server_hostname=self.tls_name(svc), allow_redirects=False,
                                          timeout=aiohttp.ClientTimeout(total=10)) as resp:
                span.status_code(resp.status)
                if resp.status == 200:
                    # a replica's config is read within CONFIG_MAX_BYTES (read whole, 200 MB took 400 MB)
                    params = json.loads(await read_capped(resp, CONFIG_MAX_BYTES)).get("parameters") or {}
                    value = (params.get("chat_template") or {}).get("string_value")
                    template = value if isinstance(value, str) and value.strip() else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError, RecursionError) as e:
            span.fail(e)
            return None  # not cached: the next request asks again
        finally:
            span.end()
        self._model_templates[cache_key] = (self.clock(), template)
        return template


def slo_met(slo: tuple[str, float], code: int, started: float, first: float | None, ended: float,
            tokens: int) -> bool | None:
    """Whether a request answered with `code` met the service level (which latency, its target in
    seconds); None when it cannot be told (a latency between tokens of an answer not streamed)."""
    kind, target = slo
    if code >= 400:
        return False
    if kind == "timeToFirstToken":
        return (first if first is not None else ended) - started <= target
    if kind == "interToken":
        if first is None or tokens < 2:
            return None
        return (ended - first) / (tokens - 1) <= target
    return ended - started <= target


async def read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytearray:
    """A replica's whole answer to the gateway's own question (kvEvents, a model's config), or a
    ValueError past `cap` bytes."""
    data = bytearray()
    async for chunk in resp.content.iter_chunked(1 << 16):
        data += chunk
        if len(data) > cap:
            raise ValueError(f"an answer over {cap} bytes")
    return data


def unsent(request: web.BaseRequest) -> int:
    """Bytes written to the client that its connection has not sent yet (the transport's buffer,
    which grows while the client does not read): counted with what a stream holds."""
    transport = request.transport
    return transport.get_write_buffer_size() if transport is not None else 0


def _upstream_socket(info: Any) -> socket.socket:
    """A socket to a replica, whose receive buffer is UPSTREAM_RCVBUF: what one read takes from
    it at once (a stream whose client stopped reading keeps that much, uncounted, on top of the
    chunk it counts) and what the kernel keeps for it besides."""
    family, kind, proto, _, _ = info
    sock = socket.socket(family=family, type=kind, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UPSTREAM_RCVBUF)
    return sock


async def read_chunk(resp: aiohttp.ClientResponse, svc: Service, idle: float) -> bytes:
    """The next bytes of a replica's answer (b"" at its end), at most READ_CHUNK, within `idle`
    seconds: a replica that stalls mid-answer ends it with a 502 instead of holding the client for
    the total timeout. A chunk is counted as held until it is written to the client; taken whole
    (whatever the replica had sent meanwhile), a stream whose client stopped reading held half a
    megabyte and more that nothing counted."""
    try:
        return await asyncio.wait_for(resp.content.read(READ_CHUNK), idle)
    except asyncio.TimeoutError:
        m.child(m.UPSTREAM_STALLED, *svc.key).inc()
        raise oai.OpenAIError(502, f"model {svc.key[1]}: the replica sent nothing for {idle:g}s mid-answer",
                            "upstream_error", code="upstream_stalled") from None


def answer_too_large(svc: Service, cap: int) -> oai.OpenAIError:
    return oai.OpenAIError(502, f"model {svc.key[1]}: the replica's answer is larger than the gateway takes "
                              f"({cap} bytes)", "upstream_error", code="upstream_answer_too_large")


async def read_whole(resp: aiohttp.ClientResponse, svc: Service, held: Held, cap: int, idle: float) -> bytearray:
    """A replica's whole answer, at most `cap` bytes, counted in `held` as it arrives."""
    if resp.content_length is not None and resp.content_length > cap:
        raise answer_too_large(svc, cap)
    base = held.bytes
    out = bytearray()
    while chunk := await read_chunk(resp, svc, idle):
        if len(out) + len(chunk) > cap:
            raise answer_too_large(svc, cap)
        out += chunk
        held.set(base + len(out))
    return out


def answer_json(data: bytes | bytearray, svc: Service) -> Any:
    """A replica's answer as JSON; a 502 when it is not (a replica is not trusted to be well-formed)."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise oai.OpenAIError(502, f"model {svc.key[1]}: the replica's answer is not JSON", "upstream_error",
                            code="upstream_failed") from None


async def upstream_error(resp: aiohttp.ClientResponse, svc: Service) -> oai.OpenAIError:
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
        except (ValueError, AttributeError, RecursionError):
            pass
    if 400 <= resp.status < 500:
        return oai.OpenAIError(400, f"model {svc.key[1]} refused the request (HTTP {resp.status})",
                             code="model_error")
    return oai.OpenAIError(502, f"model {svc.key[1]} failed (HTTP {resp.status})", "upstream_error",
                         code="upstream_failed")


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
