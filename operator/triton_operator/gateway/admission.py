"""A request's body, admitted within its API key's share of the gateway: a place among the key's
requests in flight, its bytes counted in the body budget (`limits`) from before they are read until
the answer ends, read within body_timeout_seconds."""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

from aiohttp import web

from . import limits
from . import telemetry as m
from . import translate as t
from .auth import Caller
from .config import GatewaySettings


class Admission:
    def __init__(self, settings: GatewaySettings, bodies: limits.BodyBudget, in_flight: limits.InFlight):
        self.settings = settings
        self.bodies = bodies
        self.in_flight = in_flight

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
