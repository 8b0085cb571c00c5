"""Who is calling and what they used: the API keys read from the key files (re-read every
key_reload_seconds, failing closed), a request's key checked and rate-limited, its max_tokens cap,
and what each key spent (requests, seconds at a replica, tokens) as metrics and against its
tokens-per-minute budget. The rules themselves (parsing, digests, buckets) are `keys`'s."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from . import keys as keys_core
from . import openai_schema as oai
from . import telemetry as m
from . import tracing as tr
from . import translate as t
from .config import GatewaySettings
from .routing import Service

log = logging.getLogger(__name__)

# Errors after a replica did the work that the request's own side caused: its answer was larger
# than it may take, or its key's share of the gateway's memory was full when the answer came (the
# key's own other requests filled it: an upload announced and never sent turned any answer into a
# 429 that cost nothing).
ABANDONED = ("upstream_answer_too_large", "too_many_bytes_in_flight")
TEMPLATE_TOKENS = 8192   # tokens a model's chat template may add to a prompt beyond the bytes it was sent
BYTES_PER_TOKEN = 4      # English text runs about four bytes a token in common tokenizers (estimates)
REQUEST_BYTES = 64 * 1024  # a body the gateway parses counts as a request of requestsPerMinute per this many bytes begun,
REQUEST_CONTAINERS = 1024  # ... or per this many JSON objects and arrays begun, whichever is more


@dataclass(eq=False)
class Caller:
    """An authenticated request's API key: its digest (the tenant's identity in every limit) and
    what it may do; `reserved`, the tokens this request took from the key's tokensPerMinute when it
    started and has not settled yet (Auth.reserve); `reached`, whether the request was sent to a
    replica (one that never was, held while its service woke, costs nothing); `most`, the most
    prompt and generated tokens the request could have used (Auth.reserve), which bound what is
    charged whatever its replica reports."""

    digest: str
    grant: keys_core.Grant
    reserved: int = 0
    reached: bool = False
    most: tuple[int, int] | None = None
    sent: int = 0                       # bytes of the request sent to the replica (Auth.reserve)
    held_since: float | None = None     # when it began to wait for a replica (Holding.endpoint: one deadline)

    @property
    def cache_scope(self) -> str:
        return cache_scope(self.grant.name)


def request_units(body: bytes | bytearray) -> int:
    """How many requests of requestsPerMinute a body the gateway parses counts as: one per
    REQUEST_BYTES begun or per REQUEST_CONTAINERS JSON objects and arrays begun, whichever is more
    (a 400 for a body past openai_schema.check_structure's bounds). Parsing and validating takes
    the event loop up to 2 ms per 1,024 objects (messages and input items; a tool's schema far
    less): a key sending 278 KB Responses bodies of 4,096 input items at 600 a minute held every
    other key's requests behind them (a light request's median went from 2 ms to 250 ms), and 2,180
    tiny items fit in 64 KiB. A long agent turn (100 messages, 15 tools) counts as one."""
    containers = oai.check_structure(body)
    return max(1, -(-len(body) // REQUEST_BYTES), -(-containers // REQUEST_CONTAINERS))


def _limited(grant: keys_core.Grant, wait: float) -> None:
    """429 when a key must wait `wait` seconds for its rate limits (nothing when 0)."""
    if wait > 0:
        m.REJECTED.labels("rate_limited").inc()
        raise oai.OpenAIError(429, f"rate limit of API key {grant.name} reached; retry in {wait:.1f}s",
                            "rate_limit_error", code="rate_limit_exceeded", retry_after=wait)


def cache_scope(key_name: str) -> str:
    """An API key's scope of prompt-cache reuse at the replicas (the llm model's cache_salt, and part
    of every prefix name the gateway computes): a digest of its name, which a client cannot set for
    another key. Keys of one name share it, as they share their usage."""
    return hashlib.blake2b(key_name.encode("utf-8", "surrogatepass"), digest_size=8, person=b"cache-scope").hexdigest()


class Auth:
    def __init__(self, settings: GatewaySettings, clock: Callable[[], float] = time.monotonic,
                 tracing: tr.Off | tr.On = tr.OFF):
        self.settings = settings
        self.clock = clock
        self.tracing = tracing
        self.grants: dict[str, keys_core.Grant] = {}
        self.keys_loaded = False
        self.keys_error: str | None = None   # the key files could not be used: every request fails closed
        self._key_files_stamp: str | None = None   # sha256 of the key files' text as last loaded
        self.limiter = keys_core.RateLimiter(settings.requests_per_minute, settings.replicas)
        self.token_limiter = keys_core.TokenLimiter(settings.replicas)
        self.failures = keys_core.FailureLimiter(settings.failed_auth_per_minute)
        self.trusted_proxies = tuple(ipaddress.ip_network(c, strict=False) for c in settings.trusted_proxies)
        # called when the keys change: requests held for a replica look again (Holding checks their key)
        self.keys_changed: Callable[[], None] = lambda: None

    # -- the key files ------------------------------------------------------------------------------

    def start(self) -> asyncio.Task[Any] | None:
        """Load the keys and keep re-reading them (the task), or, without key files, mark the
        keys loaded: every request is then refused with 401."""
        if not self.settings.key_files:
            self.keys_loaded = True
            return None
        self.refresh_keys()
        return asyncio.create_task(self._reload_keys(), name="reload keys")

    def load_keys(self) -> bool:
        """(Re)read the key files; True when the keys or the files' errors changed. A file that
        cannot be used (unreadable, not UTF-8, invalid, or listing a key another file lists) is
        left out and named in keys_error, never quoted: its keys fail closed (a revoked key must
        not keep working because its file broke), and the other files' keys keep working (one
        team's typo took every tenant's keys with it)."""
        texts: list[tuple[str, str | None, str | None]] = []   # (path, text, why it cannot be used)
        for path in self.settings.key_files:
            try:
                with open(path, encoding="utf-8") as f:
                    texts.append((path, f.read(), None))
            except UnicodeDecodeError:
                texts.append((path, None, f"{path}: not UTF-8 text"))
            except OSError as e:
                texts.append((path, None, f"cannot read {e.filename}: {e.strerror}"))
        stamp = hashlib.sha256(json.dumps(texts).encode()).hexdigest()
        if stamp == self._key_files_stamp:
            return False
        grants: dict[str, keys_core.Grant] = {}
        errors = [why for _, _, why in texts if why is not None]
        for path, text, why in texts:
            if text is None:
                continue
            try:
                grants = keys_core.merge([("", grants), (path, keys_core.parse(text, path))])
            except keys_core.KeyFileError as e:
                errors.append(str(e))
        self.grants = grants
        self._key_files_stamp = stamp
        self.limiter.forget(grants)
        self.token_limiter.forget(grants)
        self.keys_loaded = True
        why = "; ".join(errors) or None
        if why is not None and why != self.keys_error:
            log.error("API key files unusable, their keys refused until they are fixed: %s", why)
        self.keys_error = why
        m.API_KEYS.set(len(grants))
        m.KEY_FILES_VALID.set(0 if errors else 1)
        return True

    def refresh_keys(self) -> None:
        """load_keys, failing closed on anything it did not foresee: every key dropped, and said so
        in a metric, the readiness body and every answer, not only in a log line."""
        try:
            if self.load_keys():
                log.info("API keys loaded: %d key(s)", len(self.grants))
                self.keys_changed()
        except Exception as e:  # noqa: BLE001 - whatever broke, no key of the files that broke stays valid
            why = f"the key files could not be read ({type(e).__name__})"
            if self.keys_error != why:
                log.error("API keys unusable, refusing every request until the key files are fixed: %s", why)
            self.grants, self.keys_error, self.keys_loaded, self._key_files_stamp = {}, why, True, None
            m.API_KEYS.set(0)
            m.KEY_FILES_VALID.set(0)
            self.keys_changed()

    async def _reload_keys(self) -> None:
        while True:
            await asyncio.sleep(self.settings.key_reload_seconds)
            self.refresh_keys()

    # -- a request's key ----------------------------------------------------------------------------

    def _keys_usable(self, digest: str | None = None) -> None:
        """503 while a key file is broken, for a request whose key no readable file holds (it may
        be in the broken one: a 401 would tell its client the key is wrong)."""
        if self.keys_error is not None and (digest is None or digest not in self.grants):
            m.REJECTED.labels("keys_unavailable").inc()
            raise oai.OpenAIError(503, "the gateway cannot read its API keys; its operator has been told",
                                "service_unavailable", code="keys_unavailable",
                                retry_after=self.settings.key_reload_seconds)

    def recheck(self, caller: Caller, units: int = 1) -> None:
        """Once a request's body has arrived (up to body_timeout_seconds after its key was
        checked): 401 when the key was revoked meanwhile; otherwise the caller holds the key's
        grant as it is now, and what it may use is judged on that (a key revoked while its body was
        on its way reached the model).

        A body the gateway parses counts as `units` requests of requestsPerMinute (request_units),
        the rest of them taken now, before it is parsed (429 when the key's bucket does not hold
        them, at most a full bucket's worth: any body can pass on one)."""
        self._keys_usable(caller.digest)
        grant = self.grants.get(caller.digest)
        if grant is None:
            m.REJECTED.labels("unauthorized").inc()
            raise oai.OpenAIError(401, "invalid API key", code="invalid_api_key")
        caller.grant = grant
        if units > 1:
            _limited(grant, self.limiter.charge(caller.digest, grant, units - 1, self.clock()))

    def authorize(self, request: web.Request) -> Caller:
        now = self.clock()
        sent = request.headers.getall("Authorization", [])
        if len(sent) > 1:
            # The header may appear once (RFC 9110): which one counts would be up to each hop (a
            # proxy that adds its own, a gateway that reads the first).
            m.REJECTED.labels("bad_request").inc()
            raise oai.OpenAIError(400, "send one Authorization header", code="bad_header")
        presented = keys_core.bearer(sent[0] if sent else None)
        d = keys_core.digest(presented) if presented is not None else None
        self._keys_usable(d)
        grant = self.grants.get(d) if d is not None else None
        if grant is None or d is None:
            # Failures only are throttled, per client address, and after the key was looked at: a
            # valid key is never refused for what others sent from the same address (a proxy's).
            # Every X-Forwarded-For line, in order (RFC 9110: lines of one field are one list): with
            # the first line alone, a client behind a proxy that adds a line of its own chose its
            # address, dodged the limit and could lock out another address.
            forwarded = ", ".join(request.headers.getall("X-Forwarded-For", [])) or None
            address = keys_core.client_address(request.remote, forwarded, self.trusted_proxies)
            blocked = self.failures.blocked(address, now)
            if blocked > 0:
                m.REJECTED.labels("auth_throttled").inc()
                raise oai.OpenAIError(429, f"too many failed API key attempts from this address; retry in "
                                         f"{blocked:.0f}s", "rate_limit_error", code="too_many_failed_attempts",
                                    retry_after=blocked)
            self.failures.failed(address, now)
            m.REJECTED.labels("unauthorized").inc()
            raise oai.OpenAIError(401, "missing API key: send it as 'Authorization: Bearer KEY'" if presented is None
                                else "invalid API key", code="invalid_api_key")
        _limited(grant, max(self.limiter.take(d, grant, now), self.token_limiter.wait(d, grant, now)))
        self.tracing.annotate(tr.KEY_NAME, grant.name)   # the key's name, never the key
        return Caller(d, grant)

    def max_tokens_cap(self, caller: Caller) -> int:
        return caller.grant.max_tokens or self.settings.max_tokens_per_request

    # -- what a key used ----------------------------------------------------------------------------

    def reserve(self, caller: Caller, tokens: int, sent: int | None = None, generated: int | None = None) -> None:
        """When a request starts, the most tokens it may generate (`tokens`: its max_tokens, n times)
        and its prompt, estimated at BYTES_PER_TOKEN of the `sent` body, are taken from its key's
        tokensPerMinute; `spend` settles them against what the model counted, `settle` returns them
        when nothing was counted. Taken only when requests ended, any number of requests started
        while the bucket was above zero: 50 at once with max_tokens 32768 on a key of 1,000 a minute
        all went through, and left it locked out for a day; with the prompt left out, 30 prompts of
        20 KB at once with max_tokens 1 on a key of 100."""
        now = self.clock()
        # Looked at again here: requests that passed `authorize` together (their bodies read since)
        # all saw the bucket above zero.
        _limited(caller.grant, self.token_limiter.wait(caller.digest, caller.grant, now))
        tokens = max(0, tokens) + (-(-sent // BYTES_PER_TOKEN) if sent else 0)
        self.token_limiter.spend(caller.digest, caller.grant, tokens, now)
        caller.reserved += tokens
        # the most it could use: a prompt of one token a byte of the `sent` body (a token stands for
        # at least one byte of its text) plus what a chat template adds, and `generated` (None: no
        # bound known, a text model's)
        caller.most = None if sent is None else (sent + TEMPLATE_TOKENS,
                                                 t.MAX_COUNT if generated is None else max(0, generated))
        caller.sent = sent or 0

    def spend(self, caller: Caller, svc: Service, prompt: int | None, completion: int | None) -> None:
        """Tokens a request used, as the model counted them: usage per key, and the key's
        tokens-per-minute budget (less what it reserved)."""
        if prompt is None or completion is None:
            return
        if caller.most is not None:
            # A replica's counts are charged up to what the request could have used (Auth.reserve):
            # one that reported 2**53 completion tokens for a max_tokens of 5 locked its key out
            # for 150,000 years.
            prompt, completion = min(prompt, caller.most[0]), min(completion, caller.most[1])
        m.child(m.KEY_TOKENS, caller.grant.name, *svc.key, "prompt").inc(prompt)
        m.child(m.KEY_TOKENS, caller.grant.name, *svc.key, "completion").inc(completion)
        m.child(m.OUTPUT_TOKENS, *svc.key).inc(completion)
        self.token_limiter.spend(caller.digest, caller.grant, prompt + completion - caller.reserved, self.clock())
        caller.reserved = 0

    def spend_abandoned(self, caller: Caller, error: BaseException, charged: bool) -> None:
        """A request that ended with `error` before the model's count was charged (`charged`
        False): when its client left after it was sent to a replica, or its answer was too large to
        take or came while its key's memory share was full (ABANDONED), the replica did the work
        and the request keeps what it took when it started (Auth.reserve: what it could have made,
        its prompt included). Uncharged, a key whose clients hang up took the replicas' time past
        its budget. Anything else costs nothing (`settle` returns the reservation). The usage
        counters, which count what the model reported, are left alone."""
        if charged or not caller.reached or not (
                isinstance(error, asyncio.CancelledError) or getattr(error, "code", None) in ABANDONED):
            return
        caller.reserved = 0

    def spend_estimate(self, caller: Caller, svc: Service, generated: int) -> None:
        """A model that counts no tokens (a text model's answers carry no counts): its prompt and
        answer are charged at BYTES_PER_TOKEN, the bytes sent to the replica (Auth.reserve) and
        `generated` bytes of text back. Uncharged, a key of 100 tokens a minute had 30
        requests of 20 KB prompts and 4 KB answers answered in a minute."""
        self.spend(caller, svc, -(-caller.sent // BYTES_PER_TOKEN), -(-max(0, generated) // BYTES_PER_TOKEN))

    def settle(self, caller: Caller) -> None:
        """A request over whose tokens nothing was charged (the replica failed or refused it, or
        its model counts no tokens): what it reserved goes back to its key."""
        if caller.reserved:
            self.token_limiter.spend(caller.digest, caller.grant, -caller.reserved, self.clock())
            caller.reserved = 0

    def account(self, caller: Caller, svc: Service, sent: float) -> None:
        """One request of `caller` answered by a replica of `svc`: usage per key."""
        m.child(m.KEY_REQUESTS, caller.grant.name, *svc.key).inc()
        m.child(m.KEY_REQUEST_SECONDS, caller.grant.name, *svc.key).inc(max(0.0, self.clock() - sent))
