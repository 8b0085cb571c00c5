"""Hygiene, driven in process over real loopback sockets: what the gateway writes to its log and
tells clients when something goes wrong. No header value (an API key above all) ever reaches a
log line; a malformed request costs at most one rate-limited line and never a traceback; every
error is an OpenAI-shaped 4xx or 502 with a fixed text, never a 500, and names no library
version. The upstream is a recording stand-in for Triton (tests/gateway_http.py says why)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp import web

from triton_operator.gateway import guard, server

from .gateway_http import KEY_A, LogLines, Rig, connect, read_reply, run, settle

# Requests whose heads aiohttp's parser refuses, each carrying the key: bare LF line endings
# (aiohttp logged the whole head, Authorization included, at ERROR with a traceback), a control
# character in a header value, a space before the colon, an obsolete line folding, a bad method,
# a bad version, a header name with a bad character, CR alone. The last two have no Host header,
# which aiohttp refuses first; the chunk framing after a valid head is tested further down.
MALFORMED_HEADS = [
    "GET /v1/models HTTP/1.1\nHost: x\nAuthorization: Bearer {key}\n\n",
    "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nX-A: a\x01b\r\n\r\n",
    "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization : Bearer {key}\r\n\r\n",
    "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\r\n  folded\r\nAuthorization: Bearer {key}\r\n\r\n",
    "G(T /v1/models HTTP/1.1\r\nAuthorization: Bearer {key}\r\n\r\n",
    "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuth{{orization: Bearer {key}\r\n\r\n",
    "GET /v1/models HTTP/1.1\r\nHost: x\rAuthorization: Bearer {key}\r\n\r\n",
    "POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer {key}\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    "POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer {key}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
]


async def health_port(rig: Rig) -> tuple[web.AppRunner, int]:
    """The gateway's health and metrics site started on 127.0.0.1: its runner and port."""
    runner = rig.gw.health_runner()
    await runner.setup()
    await rig.gw.health_site(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


async def send_raw(port: int, data: bytes, source: str = "127.0.0.1") -> bytes:
    reader, writer = await connect(port, source)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


@pytest.mark.parametrize("head", MALFORMED_HEADS)
def test_a_malformed_request_is_answered_400_and_its_key_never_logged(head):
    async def scenario():
        with LogLines() as logs:
            async with Rig() as rig:
                answer = await send_raw(rig.port, head.format(key=KEY_A).encode("latin-1"))
        status, _, rest = answer.partition(b"\r\n")
        assert status.split(b" ", 1)[1] == b"400 Bad Request", answer[:200]
        headers, _, body = rest.partition(b"\r\n\r\n")
        assert b"Server: triton-operator-gateway" in headers and b"aiohttp" not in answer
        assert json.loads(body) == guard.MALFORMED
        assert KEY_A.encode() not in answer
        assert logs.lines, "the malformed request is counted in a line"
        for line in logs.lines:
            assert KEY_A not in line and KEY_A[3:20] not in line
            assert "Traceback" not in line
        assert all(r.exc_info is None for r in logs.records)
    run(scenario)


@pytest.mark.parametrize("line, status, code", [
    ("GET /v1/models HTTP/2.0", "505 HTTP Version Not Supported", "http_version_not_supported"),
    ("GET /v1/models HTTP/9.7", "505 HTTP Version Not Supported", "http_version_not_supported"),
    ("GET /v1/models", "400 Bad Request", "bad_request"),
    ("GET /HTTP/1.1", "400 Bad Request", "bad_request"),
    ("GET /v1/models/HTTP/", "400 Bad Request", "bad_request"),
])
def test_a_request_line_of_another_http_version_is_refused_in_http_1_1(line, status, code):
    """`HTTP/2.0` and a bare `GET /path` (HTTP/0.9's form) were served, the answer's status line
    echoing the version asked for in HTTP/1 text. Refused now, counted as malformed, the key never
    logged."""
    async def scenario():
        with LogLines() as logs:
            async with Rig() as rig:
                answer = await send_raw(rig.port, f"{line}\r\nAuthorization: Bearer {KEY_A}\r\n\r\n".encode())
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split(b"\r\n", 1)[0] == b"HTTP/1.1 " + status.encode()
        assert json.loads(body)["error"]["code"] == code
        assert any("malformed HTTP request from 127.0.0.1" in line for line in logs.lines)
        assert all(KEY_A not in line for line in logs.lines)
    run(scenario)


def test_a_flood_of_malformed_requests_costs_one_line():
    async def scenario():
        with LogLines() as logs:
            async with Rig() as rig:
                for i in range(60):
                    head = MALFORMED_HEADS[i % len(MALFORMED_HEADS)]
                    await send_raw(rig.port, head.format(key=KEY_A).encode("latin-1"))
        gateway_lines = [line for line in logs.lines if "malformed" in line]
        assert len(gateway_lines) == 1, logs.lines
        assert "malformed HTTP request from 127.0.0.1 (" in gateway_lines[0]
        assert [r for r in logs.records if r.levelname == "ERROR"] == []
    run(scenario)


def test_valid_requests_with_keys_log_no_header_value():
    """Every route, refused or answered, at DEBUG: the key appears in no line."""
    async def scenario():
        with LogLines() as logs:
            async with Rig() as rig:
                await rig.call("GET", "/v1/models")
                await rig.call("POST", "/v1/chat/completions",
                               body={"model": "llama", "messages": [{"role": "user", "content": "hi"}]})
                await rig.call("POST", "/v1/completions", body={"model": "nope", "prompt": "x"})
                await rig.call("POST", "/v2/models/llama/generate", body={"text_input": "x"})
                await rig.call("GET", "/v2/models/llama/../x")
                await rig.call("GET", "/v1/models", key=KEY_A + "x")
        assert logs.lines is not None
        for line in logs.lines:
            assert KEY_A not in line and KEY_A[3:20] not in line
    run(scenario)


def test_a_head_with_transfer_encoding_is_framed_by_aiohttp_and_ends_the_connection():
    """The guard does not frame chunked bodies: aiohttp does, and the connection closes after."""
    async def scenario():
        async with Rig() as rig:
            reader, writer = await connect(rig.port)
            body = json.dumps({"model": "ml/llama", "prompt": "x"}).encode()
            writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                         f"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                         f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
                         + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            reply = await asyncio.wait_for(read_reply(reader), 5)
            assert reply.status == 200 and reply.json()["choices"][0]["text"] == "hello"
            assert await asyncio.wait_for(reader.read(), 5) == b""   # the pipelined request is not read
            writer.close()
    run(scenario)


def test_a_replica_answer_that_is_not_json_is_a_502_not_a_500():
    async def scenario():
        async def html(request):
            return web.Response(text="<html>proxy error</html>", content_type="text/html")

        async with Rig() as rig:
            rig.upstream.answer = html
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})
            assert (reply.status, reply.error) == (502, {"message": "model llama: the replica's answer is not JSON",
                                                         "type": "upstream_error", "param": None,
                                                         "code": "upstream_failed"})
            reply = await rig.call("POST", "/v2/models/llama/generate", body={"text_input": "x"},
                                   headers={"X-Inference-Namespace": "ml"})
            assert (reply.status, reply.error["code"]) == (502, "upstream_failed")
            reply = await rig.call("POST", "/v2/models/resnet/infer", body=b"{}")   # passed as it came
            assert reply.status == 200 and reply.body == b"<html>proxy error</html>"
    run(scenario)


HOSTILE_BODIES = [
    b"[" * 5000 + b"]" * 5000,
    b'{"model": "ml/llama", "prompt": "x", "metadata": ' + b'{"a": ' * 3000 + b'"x"' + b"}" * 3001,
    b'{"model": "ml/llama", "prompt": "\\ud800"}',
    b'{"model": "ml/llama", "prompt": "x", "max_tokens": 1e400}',
    b'{"model": "ml/llama", "prompt": "x", "seed": 123456789012345678901234567890}',
    b'{"model": "ml/llama", "prompt": "x", "stop": [null]}',
    b'{"model": "ml/llama", "prompt": "x", "response_format": {"type": "json_schema", "json_schema": '
    b'{"schema": ' + b'{"a": ' * 60 + b"1" + b"}" * 60 + b"}}}",
    b"\xff\xfe{}",
    b'{"model": "ml/llama", "prompt": "x"}' + b" " * 100 + b"x",
]


def test_hostile_bodies_are_4xx_never_500():
    async def scenario():
        with LogLines() as logs:
            async with Rig() as rig:
                for body in HOSTILE_BODIES:
                    for target in ("/v1/completions", "/v1/chat/completions"):
                        reply = await rig.call("POST", target, body=body)
                        assert reply.status < 500, (target, body[:60], reply.body)
                    reply = await rig.call("POST", "/v2/models/llama/generate", body=body, headers={
                        "X-Inference-Namespace": "ml"})
                    assert reply.status < 500, (body[:60], reply.body)
        assert [line for line in logs.lines if "unexpected" in line] == []
    run(scenario)


def test_an_unknown_expectation_is_ignored_and_the_request_goes_through_authentication():
    """aiohttp answered any `Expect` but 100-continue with a plain-text 417 quoting the header,
    before authentication and the error shape. The expectation is ignored (RFC 9110 allows it)."""
    async def scenario():
        async with Rig() as rig:
            for key, status in ((None, 401), (KEY_A, 200)):
                auth = f"Authorization: Bearer {key}\r\n" if key else ""
                answer = await send_raw(rig.port, (
                    f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{auth}Expect: <script>x</script>\r\n"
                    f"Content-Type: application/json\r\nContent-Length: 33\r\nConnection: close\r\n\r\n"
                    '{"model":"ml/llama","prompt":"x"}').encode())
                head, _, body = answer.partition(b"\r\n\r\n")
                assert head.split(b"\r\n")[0].startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
                assert b"<script>" not in answer and b"application/json" in head
                if key is None:
                    assert json.loads(body)["error"]["code"] == "invalid_api_key"
                else:
                    assert json.loads(body)["choices"][0]["text"]
            assert len(rig.upstream.seen) == 1
    run(scenario)


def test_clients_that_hang_up_mid_body_cost_no_error_line_and_release_what_they_held():
    """A body cut short by the client raised ConnectionResetError into aiohttp's error path,
    which logged it at ERROR: one line per hang-up, for any client with a key."""
    async def scenario():
        with LogLines() as logs:
            async with Rig() as rig:
                for framing in ("Content-Length: 100\r\n\r\n{\"model\"", "Transfer-Encoding: chunked\r\n\r\n40\r\n{\"m"):
                    for _ in range(10):
                        reader, writer = await connect(rig.port)
                        writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                                     f"Content-Type: application/json\r\n{framing}".encode())
                        await writer.drain()
                        await asyncio.sleep(0.02)
                        writer.transport.abort()
                await settle(lambda: rig.gw.connections.open == 0)
                assert rig.gw.bodies.used == 0
                assert rig.upstream.seen == []
        assert [r.getMessage() for r in logs.records if r.levelname in ("ERROR", "WARNING")] == []
    run(scenario)


@pytest.mark.parametrize("chunks", [b"zz\r\n", b"-5\r\n", b"f" * 40 + b"\r\n", b"5\r\nhello0\r\n\r\n", b"5\nhello\n0\n\n"])
def test_a_chunked_body_whose_framing_breaks_after_a_valid_head_is_a_400_at_once(chunks):
    """The head is valid (Host and all); the chunk sizes or their line ends are not. aiohttp
    queued its 400 behind the request, whose handler waited for a body that could not come:
    body_timeout_seconds holding the key's place and its bytes, then a 408."""
    async def scenario():
        with LogLines() as logs:
            async with Rig(body_timeout_seconds=30.0) as rig:
                reader, writer = await connect(rig.port)
                writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                             f"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + chunks)
                await writer.drain()
                reply = await asyncio.wait_for(read_reply(reader), 5)
                assert reply.status == 400
                assert reply.json() == {"error": {"message": "malformed HTTP request body", "type":
                                                  "invalid_request_error", "param": None, "code": "bad_request"}}
                assert await asyncio.wait_for(reader.read(), 5) == b""     # and the connection is closed
                await settle(lambda: rig.gw.connections.open == 0)
                assert rig.gw.in_flight.by_key == {} and rig.gw.bodies.used == 0
                assert rig.upstream.seen == []
        assert [r.getMessage() for r in logs.records if r.levelname in ("ERROR", "WARNING")] == []
        assert all(r.exc_info is None for r in logs.records)
    run(scenario)


def test_a_valid_chunked_body_is_still_served():
    async def scenario():
        async with Rig() as rig:
            reader, writer = await connect(rig.port)
            body = b'{"model":"ml/llama","prompt":"x"}'
            writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                         f"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
                         + b"5;ext=1\r\n" + body[:5] + b"\r\n" + f"{len(body) - 5:x}\r\n".encode() + body[5:]
                         + b"\r\n0\r\nX-Trailer: t\r\n\r\n")
            await writer.drain()
            reply = await asyncio.wait_for(read_reply(reader), 5)
            assert reply.status == 200 and reply.json()["choices"][0]["text"]
            assert [s.method for s in rig.upstream.seen] == ["POST"]
            writer.close()
    run(scenario)


def test_a_chunk_that_breaks_the_framing_later_in_the_body_is_a_400_at_once():
    """The same, with the bad chunk size in a later packet, once the handler is reading the body."""
    async def scenario():
        async with Rig(body_timeout_seconds=30.0) as rig:
            reader, writer = await connect(rig.port)
            writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                         f"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{{\"t\r\n".encode())
            await writer.drain()
            await settle(lambda: rig.gw.bodies.used > 0)      # admitted: its handler waits for the rest
            writer.write(b"zz\r\n")
            await writer.drain()
            reply = await asyncio.wait_for(read_reply(reader), 5)
            assert (reply.status, reply.json()["error"]["message"]) == (400, "malformed HTTP request body")
            await settle(lambda: rig.gw.connections.open == 0)
            assert rig.gw.in_flight.by_key == {} and rig.gw.bodies.used == 0 and rig.upstream.seen == []
    run(scenario)


@pytest.mark.parametrize("case", ["too large", "too slow"])
def test_a_head_pipelined_behind_a_request_is_not_answered_inside_that_requests_answer(case):
    """A head pipelined behind a request still being answered, over the head limit or arriving
    too slowly, used to get the guard's 431 or 408 written straight to the socket: the client read
    it as its first request's answer (which the replica had run), and aiohttp's write of the real
    answer then failed, one ERROR line per connection, no key needed. That answer is now written
    whole, nothing else, and the connection closes after it."""
    async def scenario():
        settings = {"max_header_bytes": 16384} if case == "too large" else {"header_timeout_seconds": 0.3}
        with LogLines() as logs:
            async with Rig(**settings) as rig:
                async def slow(request):
                    await asyncio.sleep(0.8)
                    return web.json_response({"text_output": "late"})
                rig.upstream.answer = slow
                body = json.dumps({"model": "ml/llama", "prompt": "x"}).encode()
                first = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
                pipelined = b"GET /v1/models HTTP/1.1\r\nX-Pad: " + (b"a" * 40000 if case == "too large" else b"")
                answer = await send_raw(rig.port, first + pipelined)
                seen = len(rig.upstream.seen)
        assert answer.count(b"HTTP/1.1 ") == 1, answer[:300]
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK"), head
        assert json.loads(payload)["choices"][0]["text"] == "late"
        assert seen == 1
        assert [r.getMessage() for r in logs.records if r.levelno >= logging.WARNING] == []
    run(scenario)


@pytest.mark.parametrize("request_line, status, code", [
    ("GET /nope", 404, "not_found"),
    ("POST /v1/models", 405, "method_not_allowed"),
    ("DELETE /healthz", 405, "method_not_allowed"),
])
def test_an_unknown_expectation_on_a_path_without_a_route_is_ignored_too(request_line, status, code):
    """The routes' own `expect` covered only paths with a route of the gateway's: on an unknown
    path or a wrong method aiohttp's answered first, a plain-text 417 quoting the header, before
    any middleware, so the connection guard never saw the request end (its connection was never
    idle again, and a chunked one was read on past the head-size limit). The guard drops the
    expectation from the head; the answer is the path's own, in the OpenAI shape."""
    async def scenario():
        async with Rig() as rig:
            reader, writer = await connect(rig.port)
            writer.write(f"{request_line} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                         f"Expect: <script>x</script>\r\nContent-Length: 0\r\n\r\n".encode())
            await writer.drain()
            reply = await asyncio.wait_for(read_reply(reader), 5)
            assert (reply.status, reply.json()["error"]["code"]) == (status, code)
            assert b"<script>" not in reply.body
            (g,) = rig.gw.connections.guards.values()
            await settle(lambda: g.requests == 0 and g in rig.gw.connections.idle)
            writer.close()
    run(scenario)


def test_an_unknown_expectation_is_dropped_whatever_the_case_of_its_name():
    assert guard.without_unknown_expectations(
        b"POST /x HTTP/1.1\r\nHost: x\r\nEXPect: bogus\r\nX-Expect: kept\r\nContent-Length: 0\r\n\r\n"
    ) == b"POST /x HTTP/1.1\r\nHost: x\r\nX-Expect: kept\r\nContent-Length: 0\r\n\r\n"
    kept = b"POST /x HTTP/1.1\r\nHost: x\r\nexpect: 100-Continue\r\nContent-Length: 0\r\n\r\n"
    assert guard.without_unknown_expectations(kept) == kept
    assert guard.without_unknown_expectations(
        b"GET /x HTTP/1.1\r\nExpect: 100-continue, bogus\r\nHost: x\r\n\r\n") == b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("key, body, status, code", [
    (KEY_A, b'{"model":"ml/llama","prompt":"x"}', 200, None),
    ("sk-wrong", b'{"model":"ml/llama","prompt":"x"}', 401, "invalid_api_key"),
    (KEY_A, b'{"model":"ml/llama","prompt":', 400, None),   # not JSON: no code, as OpenAI
    (KEY_A, b'{"model":"ml/nothing","prompt":"x"}', 404, "model_not_found"),
], ids=["an answer", "a wrong key", "not JSON", "an unknown model"])
def test_100_continue_is_answered_before_the_body_and_an_error_after_it_in_full(key, body, status, code):
    """After `100 Continue` the gateway counted its answer as begun, so an error answer (a wrong
    key, a bad body, an unknown model) cut the connection instead of being sent: the client read
    `100 Continue` and then nothing (curl sends the expectation for large bodies)."""
    async def scenario():
        with LogLines() as logs:
            async with Rig() as rig:
                reader, writer = await connect(rig.port)
                writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                             f"Expect: 100-continue\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(body)}\r\n\r\n".encode())
                await writer.drain()
                assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
                writer.write(body)
                await writer.drain()
                reply = await asyncio.wait_for(read_reply(reader), 5)
                if status == 200:
                    assert reply.status == 200 and reply.json()["choices"][0]["text"]
                else:
                    assert (reply.status, reply.json()["error"]["code"]) == (status, code)
                writer.close()
        assert [line for line in logs.lines if "answer began" in line] == []
    run(scenario)


def test_clients_keeping_the_health_port_busy_leave_room_for_the_probes():
    """One address held all 32 of the health port's connections busy, each asking /healthz every
    fifth of a second, so none was ever idle for the second the reaper waited: every kubelet probe
    from another address got 503 (a restart loop and a pod out of its endpoints). An address has at
    most HEALTH_MAX_PER_ADDRESS of them, and when they are nearly all taken any idle one (they are
    idle between requests nearly all the time) is reaped for a new one: four addresses filling them
    do not keep a probe out either."""
    async def scenario():
        async with Rig() as rig:
            runner, port = await health_port(rig)
            stop = asyncio.Event()
            answered: list[int] = []

            async def busy(reader, writer):
                while not stop.is_set():
                    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    await writer.drain()
                    try:
                        answered.append((await asyncio.wait_for(read_reply(reader), 5)).status)
                    except ConnectionError:
                        return   # reaped for a probe: a busy client reconnects, as the rest do
                    await asyncio.sleep(0.2)

            try:
                held = [await connect(port, "127.0.0.7") for _ in range(server.HEALTH_MAX_PER_ADDRESS + 2)]
                refused = [await asyncio.wait_for(read_reply(r), 5) for r, _ in held[server.HEALTH_MAX_PER_ADDRESS:]]
                assert [(r.status, r.error["code"]) for r in refused] == [
                    (503, "too_many_connections_from_address")] * 2
                held = held[:server.HEALTH_MAX_PER_ADDRESS] + [
                    await connect(port, f"127.0.0.{8 + i // server.HEALTH_MAX_PER_ADDRESS}")
                    for i in range(server.HEALTH_MAX_CONNECTIONS - server.HEALTH_MAX_PER_ADDRESS)]
                tasks = [asyncio.create_task(busy(r, w)) for r, w in held]
                # nearly all taken: idle ones are reaped for new ones from then on
                await settle(lambda: rig.gw.health_connections.open
                             >= int(server.HEALTH_MAX_CONNECTIONS * guard.REAP_AT))
                await asyncio.sleep(1.5)   # past REAP_IDLE_SECONDS: none of them was idle that long
                for _ in range(3):   # the kubelet: a connection a probe, from its node's address
                    answer = await send_raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                                            source="127.0.0.99")
                    assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
                stop.set()
                await asyncio.gather(*tasks)
                assert answered and set(answered) == {200}
                for _, writer in held:
                    writer.close()
            finally:
                await runner.cleanup()
    run(scenario)


def test_clients_that_keep_their_health_connections_busy_are_closed_for_a_probe():
    """A connection with requests always outstanding (eight pipelined probes, one more sent for each
    answer) is never idle, so never reaped: four addresses of eight such connections kept the
    kubelet's probes out (503 ten times of ten), drawing 16,000 answers a second. When the port is
    full a new connection now closes the oldest of the address holding the most."""
    async def scenario():
        async with Rig() as rig:
            runner, port = await health_port(rig)
            stop = asyncio.Event()
            request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"

            async def busy(reader, writer):
                writer.write(request * 8)
                try:
                    while not stop.is_set():   # eight outstanding: one more for each answer
                        await read_reply(reader)
                        writer.write(request)
                except (ConnectionError, asyncio.IncompleteReadError):
                    return   # closed for a probe

            held, tasks = [], []
            try:
                for a in range(server.HEALTH_MAX_CONNECTIONS // server.HEALTH_MAX_PER_ADDRESS):
                    for _ in range(server.HEALTH_MAX_PER_ADDRESS):
                        reader, writer = await connect(port, f"127.0.0.{10 + a}")
                        held.append(writer)
                        tasks.append(asyncio.create_task(busy(reader, writer)))
                await asyncio.sleep(1.0)
                statuses = []
                for _ in range(10):   # the kubelet, from its node's address
                    answer = await send_raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                                            source="127.0.0.99")
                    statuses.append(int(answer.split(b" ", 2)[1]))
                    await asyncio.sleep(0.1)
                assert statuses == [200] * 10
            finally:
                stop.set()
                for writer in held:
                    writer.close()
                await asyncio.gather(*tasks, return_exceptions=True)
                await runner.cleanup()
    run(scenario)


def test_a_connection_whose_answer_is_still_going_out_is_not_reaped_as_idle():
    """A connection counts as idle once its handler has returned, while its answer may still be in
    the transport's buffer: reaped then (at once on the health port, once it is nearly full), a
    Prometheus scrape of 177 KB was cut at 167 KB. Reaping skips a connection with unsent bytes; one
    whose client has stopped reading is judged as stalled, by its progress."""
    limits = guard.Limits(4, 1.0, clock=lambda: 100.0, reap_idle_seconds=0.0)

    class Sending:
        transport = None

        def __init__(self, unsent: int):
            self.unsent_now = unsent
            self.closed = False

        def _buffered(self) -> int:
            return self.unsent_now

        def close(self) -> None:
            self.closed = True

    sending, done = Sending(9884), Sending(0)
    limits.idle[sending] = 50.0   # oldest first
    limits.idle[done] = 60.0
    limits.reap(1)
    assert (sending.closed, done.closed) == (False, True)


def test_the_health_port_is_guarded_as_the_api_port_is(monkeypatch):
    """The probes' and metrics' own port was a plain aiohttp site: an unknown expectation on a path
    without a route was a plain-text 417 quoting the header; a malformed head was a plain-text 400
    quoting it back (a bearer key in it), naming aiohttp's version, with an ERROR traceback per
    request; and no limit held connections, head sizes or head times (300 connections that never
    ended a head of 120 lines of 8 KiB took the gateway from 90 MB to 667 MB)."""
    monkeypatch.setattr(guard, "REAP_IDLE_SECONDS", 0.2)

    async def scenario():
        with LogLines() as logs:
            async with Rig(header_timeout_seconds=0.5) as rig:
                runner, port = await health_port(rig)
                try:
                    for line, status, code in (("GET /nope", 404, "not_found"),
                                               ("POST /healthz", 405, "method_not_allowed"), ("GET /healthz", 200, None)):
                        answer = await send_raw(port, (f"{line} HTTP/1.1\r\nHost: x\r\nExpect: <script>x</script>\r\n"
                                                       "Content-Length: 0\r\nConnection: close\r\n\r\n").encode())
                        head, _, body = answer.partition(b"\r\n\r\n")
                        assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
                        assert b"<script>" not in answer and b"application/json" in head
                        assert b"\r\nServer: triton-operator-gateway" in head and b"aiohttp" not in answer
                        assert json.loads(body) == {"ok": True} if code is None else (
                            json.loads(body)["error"]["code"] == code)
                    answer = await send_raw(port, f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                                                  f"{KEY_A}\x01\r\n\r\n".encode())
                    assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request") and KEY_A.encode() not in answer
                    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "bad_request"
                    assert b"aiohttp" not in answer
                    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 9000 + b"\r\n\r\n"
                    assert await send_raw(port, big) == guard.HEAD_TOO_LARGE
                    reader, writer = await connect(port)
                    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")   # a head that never ends
                    await writer.drain()
                    assert await asyncio.wait_for(reader.read(), 5) == guard.TIMED_OUT
                    writer.close()
                    held = [await connect(port, f"127.0.0.{100 + i}") for i in range(server.HEALTH_MAX_CONNECTIONS)]
                    await settle(lambda: rig.gw.health_connections.open
                                 >= int(server.HEALTH_MAX_CONNECTIONS * guard.REAP_AT))
                    await asyncio.sleep(0.3)   # idle: reaped to make room for a probe
                    answer = await send_raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
                    for _, w in held:
                        w.close()
                finally:
                    await runner.cleanup()
        assert [line for line in logs.lines if KEY_A in line or "Traceback" in line] == []
    run(scenario)


def test_metrics_are_rendered_off_the_event_loop_that_answers_the_api(monkeypatch):
    """A /metrics render ran on the event loop that answers the API (118 ms with 100 services):
    four clients asking for it in a loop took an API request's median latency from 0.3 ms to
    226 ms. A render now runs in a thread, one at a time: the API answers while one is under way."""
    import threading

    from triton_operator.gateway import server

    release = threading.Event()
    renders = []

    def slow_render() -> bytes:
        renders.append(threading.current_thread().name)
        release.wait(5)
        return b"# rendered\n"

    monkeypatch.setattr(server, "generate_latest", slow_render)

    async def scenario():
        async with Rig() as rig:
            scrapes = [asyncio.create_task(rig.call("GET", "/metrics", key=None)) for _ in range(2)]
            await settle(lambda: len(renders) == 1)
            reply = await asyncio.wait_for(rig.call("GET", "/v1/models"), 2)
            assert reply.status == 200
            assert len(renders) == 1                          # the second scrape waits its turn
            release.set()
            replies = await asyncio.wait_for(asyncio.gather(*scrapes), 5)
            assert [(r.status, r.body) for r in replies] == [(200, b"# rendered\n")] * 2
            assert len(renders) == 2 and threading.main_thread().name not in renders
    run(scenario)
