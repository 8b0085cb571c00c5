"""In-process HTTP harness for the gateway's handlers: the real aiohttp application on a loopback
port, a recording upstream standing in for Triton (it records every request that reaches it,
path as sent), and a raw HTTP/1.1 client that sends request targets byte for byte (aiohttp's and
most clients' URL handling would normalise "..", "%2e" and friends before they leave).

The upstream is a stand-in, not Triton: these tests are about what the gateway lets through and
answers, which the real Triton in e2e/test_gateway.py cannot observe from outside.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aiohttp import web

from triton_operator.gateway import keys as k
from triton_operator.gateway import tracing as tr
from triton_operator.gateway.config import GatewaySettings
from triton_operator.gateway.server import Gateway

# Keys with 256 bits of randomness, made once per run (never a literal a reader could reuse).
KEY_A = "sk-" + secrets.token_urlsafe(32)
KEY_B = "sk-" + secrets.token_urlsafe(32)


@dataclass
class Seen:
    method: str
    raw_path: str
    headers: dict[str, str]
    body: bytes


Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


UPSTREAM_MAX_BODY = 64 << 20


@dataclass
class Upstream:
    """A loopback HTTP server that records every request and answers as `answer` says (by
    default: generate -> {"text_output": "hello"}, generate_stream -> two events per answer asked
    for, the last with its finish reason and counts as the llm model sends them, infer -> the
    body echoed, GET -> a small JSON)."""

    seen: list[Seen] = field(default_factory=list)
    answer: Handler | None = None
    port: int = 0
    _server: Any = None

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(Seen(request.method, request.raw_path, dict(request.headers), body))
        if self.answer is not None:
            return await self.answer(request)
        return await default_answer(request, body)

    async def start(self, ssl_context: Any = None) -> None:
        loop = asyncio.get_running_loop()

        def request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
            # Triton takes bodies far past aiohttp's 1 MiB default (a long prompt with its block hashes)
            return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=UPSTREAM_MAX_BODY)
        self._server = await loop.create_server(
            web.Server(self._handle, request_factory=request), "127.0.0.1", 0, ssl=ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self._server.close()
        await self._server.wait_closed()


async def default_answer(request: web.BaseRequest, body: bytes) -> web.StreamResponse:
    path = request.raw_path
    if path.endswith("/generate_stream"):
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        try:
            asked = json.loads(body)
            n = asked.get("n") or asked.get("parameters", {}).get("n") or 1
        except (ValueError, AttributeError):
            n = 1
        for index in range(n if isinstance(n, int) and 0 < n <= 16 else 1):
            for piece, last in (("hel", {}), ("lo", {"finish_reason": "stop", "prompt_tokens": 1,
                                                    "completion_tokens": 2})):
                event = {"text_output": piece, "index": index, **last}
                await out.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await out.write_eof()
        return out
    if path.endswith("/generate"):
        return web.json_response({"text_output": "hello"})
    if path.endswith("/infer"):
        return web.Response(body=body, content_type="application/json")
    return web.json_response({"name": "model", "path": path})


def isvc(name: str, ns: str = "ml", fmt: str = "tensorrt-llm", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns},
            "spec": {"model": {"format": fmt, "source": "hf://a/b"}, "gpu": {"class": "h100"}, **spec}}


def slice_for(service: str, port: int, ns: str = "ml", address: str = "127.0.0.1",
              port_name: str = "http") -> dict[str, Any]:
    return {"metadata": {"name": f"{service}-x", "namespace": ns, "labels": {"kubernetes.io/service-name": service}},
            "ports": [{"name": port_name, "port": port}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}]}


def keys_text() -> str:
    return f"""keys:
  - {{name: a, key: {KEY_A}, namespaces: [ml, lab]}}
  - {{name: b, key: {KEY_B}, services: [ml/llama]}}
"""


def make_gateway(tracing: tr.Off | tr.On = tr.OFF, **settings: Any) -> Gateway:
    gw = Gateway(GatewaySettings(**settings), api=None, tracing=tracing)
    gw.auth.grants = k.parse(keys_text(), "keys")
    gw.auth.keys_loaded = True
    return gw


@dataclass
class Reply:
    status: int
    headers: dict[str, str]     # lower-case names; a repeated header keeps its last value
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> dict[str, Any]:
        return self.json()["error"]


async def never_reading(port: int, target: str, body: bytes | dict[str, Any], headers: str = "") -> socket.socket:
    """A client with a tiny receive buffer (4 KiB) that sends its request and reads nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    await loop.sock_sendall(sock, (
        f"POST {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n{headers}"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data)
    return sock


async def raw_request(port: int, method: str, target: str, headers: dict[str, str] | None = None,
                      body: bytes = b"", timeout: float = 10.0) -> Reply:
    """One HTTP/1.1 request whose request target is sent exactly as given, then the answer
    (Content-Length or chunked; the connection is closed after it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = [f"{method} {target} HTTP/1.1", "Host: gateway", "Connection: close"]
        for name, value in (headers or {}).items():
            head.append(f"{name}: {value}")
        chunked = any(n.lower() == "transfer-encoding" for n in (headers or {}))
        if (body or method in ("POST", "PUT")) and not chunked:
            head.append(f"Content-Length: {len(body)}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        return await asyncio.wait_for(read_reply(reader), timeout)
    finally:
        writer.close()


async def read_reply(reader: asyncio.StreamReader) -> Reply:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the server closed the connection without answering")
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while True:
        line = (await reader.readline()).decode("latin-1").rstrip("\r\n")
        if not line:
            break
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                break
            body += await reader.readexactly(size)
            await reader.readline()
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:
        body = await reader.read()
    return Reply(status, headers, body)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Rig:
    """The gateway app served in process on a loopback port, with one recording upstream behind
    the services `ml/llama` (tensorrt-llm: OpenAI on), `lab/llama` and `ml/resnet` (onnx)."""

    def __init__(self, tracing: tr.Off | tr.On = tr.OFF, **settings: Any):
        self.gw = make_gateway(tracing, **{"idle_timeout_seconds": 5.0, **settings})
        self.upstream = Upstream()
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def __aenter__(self) -> "Rig":
        await self.upstream.start()
        for obj in (isvc("llama"), isvc("llama", ns="lab"), isvc("resnet", fmt="onnx"),
                    isvc("secret", ns="vault")):
            self.gw.router.set_service(obj)
        for name, ns in (("llama", "ml"), ("llama", "lab"), ("resnet", "ml"), ("secret", "vault")):
            self.gw.router.set_slice(slice_for(name, self.upstream.port, ns))
        self.runner = self.gw.api_runner(with_health=True)
        await self.runner.setup()
        await self.gw.api_site(self.runner, "127.0.0.1", 0).start()
        self.port = self.runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self.runner is not None
        await self.runner.cleanup()
        await self.upstream.stop()

    async def call(self, method: str, target: str, key: str | None = KEY_A, body: bytes | dict[str, Any] = b"",
                   headers: dict[str, str] | None = None) -> Reply:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        h = {**(bearer(key) if key else {}), **({"Content-Type": "application/json"} if data else {}),
             **(headers or {})}
        return await raw_request(self.port, method, target, h, data)


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro_fn())


class LogLines(logging.Handler):
    """Every log record of every logger while installed, formatted as the gateway's text logs
    are, with any traceback: what an operator of the gateway would read."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append(self.format(record))

    def __enter__(self) -> "LogLines":
        root = logging.getLogger()
        self._level = root.level
        root.setLevel(logging.DEBUG)
        root.addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        root = logging.getLogger()
        root.removeHandler(self)
        root.setLevel(self._level)


async def connect(port: int, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection from `source` (any 127.0.0.0/8 address is this machine's: a second client)."""
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """What the server sent until it closed the connection (fails if it stays open)."""
    return await asyncio.wait_for(reader.read(), seconds)


async def settle(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    """Wait (bounded) until `condition()` holds; fail with the last state if it does not."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)
