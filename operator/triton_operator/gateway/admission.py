"""A request admitted within its API key's share of the gateway: a place among the key's requests
in flight, and every byte the request makes the gateway hold counted in the byte budget
(`limits.BodyBudget`) under its key, from before its body is read until its answer is written:
the body as it came, then what replaces it (the request sent to the replica), an answer read
whole, a streamed event being assembled. What is counted is what is held: a handler drops its
parsed request before it awaits anything, so a request's Python objects live only between two
awaits, one request at a time, and are never part of what a key holds while it waits."""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

from aiohttp import web

from . import limits
from . import openai_schema as oai
from . import telemetry as m
from .auth import Caller
from .config import GatewaySettings


class Held:
    """The bytes one request holds, counted in the budget under its key. `body` is the request's
    body until a handler replaces it (`replace`) or drops it."""

    def __init__(self, budget: limits.BodyBudget, caller: Caller):
        self.budget = budget
        self.caller = caller
        self.bytes = 0
        self.body: bytes | bytearray | None = None

    def reserve(self, n: int) -> None:
        """Count `n` more bytes, or refuse: 429 past the key's share, 503 past the gateway's budget."""
        if n <= 0:
            return
        full = self.budget.reserve(self.caller.digest, n)
        if full is None:
            self.bytes += n
            return
        if full == "key":
            m.REJECTED.labels("key_memory_share").inc()
            raise oai.OpenAIError(429, f"API key {self.caller.grant.name} has its share of the gateway's memory in "
                                     f"requests already; retry when one ends", "rate_limit_error",
                                code="too_many_bytes_in_flight", retry_after=1)
        m.REJECTED.labels("memory_full").inc()
        raise oai.OpenAIError(503, "the gateway holds as many requests as it can; retry", "service_unavailable",
                            code="gateway_busy", retry_after=1)

    def release(self, n: int) -> None:
        n = min(n, self.bytes)
        if n > 0:
            self.budget.release(self.caller.digest, n)
            self.bytes -= n

    def set(self, n: int) -> None:
        """Count exactly `n` bytes from now on."""
        if n > self.bytes:
            self.reserve(n - self.bytes)
        else:
            self.release(self.bytes - n)

    def replace(self, body: bytes | bytearray) -> bytes | bytearray:
        """The body as it came is no longer held; `body` (what goes to the replica) is, counted from now."""
        self.body = body
        self.set(len(body))
        return body

    def release_all(self) -> None:
        self.body = None
        self.release(self.bytes)


class Admission:
    def __init__(self, settings: GatewaySettings, bodies: limits.BodyBudget, in_flight: limits.InFlight):
        self.settings = settings
        self.bodies = bodies
        self.in_flight = in_flight

    @contextlib.asynccontextmanager
    async def admitted(self, request: web.Request, caller: Caller) -> AsyncIterator[Held]:
        """The request's body (`Held.body`), read within the key's share of the gateway (a place
        among its requests in flight, its bytes counted from before they are read, read within
        body_timeout_seconds); everything given back on the way out."""
        s = self.settings
        cap = caller.grant.max_in_flight or s.max_in_flight_per_key
        if not self.in_flight.acquire(caller.digest, cap):
            m.REJECTED.labels("too_many_in_flight").inc()
            raise oai.OpenAIError(429, f"API key {caller.grant.name} has {cap} requests open already; retry when one "
                                     f"ends", "rate_limit_error", code="too_many_requests_in_flight", retry_after=1)
        held = Held(self.bodies, caller)
        try:
            length = request.content_length
            if length is not None and length > s.max_body_bytes:
                m.REJECTED.labels("too_large").inc()
                raise oai.OpenAIError(413, f"request body of {length} bytes; the largest accepted is "
                                         f"{s.max_body_bytes}", code="request_too_large")
            held.reserve(s.max_body_bytes if length is None else length)
            try:
                held.body = await asyncio.wait_for(read_body(request, length), s.body_timeout_seconds)
            except asyncio.TimeoutError:
                m.REJECTED.labels("body_timeout").inc()
                raise oai.OpenAIError(408, f"the request body did not arrive within {s.body_timeout_seconds:g}s",
                                    code="request_timeout") from None
            held.set(len(held.body))   # a body of unknown length: count only what it is
            yield held
        finally:
            held.release_all()
            self.in_flight.release(caller.digest)


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
            raise oai.OpenAIError(400, f"the request body ended after {got} of its {length} bytes",
                                code="incomplete_body")
        view[got:got + len(chunk)] = chunk
        got += len(chunk)
    view.release()
    return body
