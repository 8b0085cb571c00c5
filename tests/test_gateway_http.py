"""The gateway's handlers driven in process over real loopback sockets: every route and every
error it answers, with exact bodies, and the hostile-HTTP cases of issue 19 (slow and oversized
requests, too many connections, many held requests, guessed keys, broken key files). The
upstream is a recording stand-in for Triton (tests/gateway_http.py says why); the real Triton and
the real openai client are in e2e/test_gateway.py."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from triton_operator.gateway import guard
from triton_operator.gateway import telemetry as m
from triton_operator.gateway.auth import cache_scope

from .gateway_http import KEY_A, KEY_B, Rig, bearer, isvc, raw_request, read_reply, run, slice_for

CHAT = {"model": "ml/llama", "messages": [{"role": "user", "content": "hi"}]}


def sse(body: bytes) -> list:
    events = [line[len(b"data: "):] for line in body.split(b"\n") if line.startswith(b"data: ")]
    return [e.decode() if e == b"[DONE]" else json.loads(e) for e in events]


def error(status: int, message: str, code: str, type_: str = "invalid_request_error", param: str | None = None):
    return status, {"message": message, "type": type_, "param": param, "code": code}


# -- the routes ------------------------------------------------------------------------------------

def test_every_route_answers():
    async def scenario():
        async with Rig() as rig:
            reply = await rig.call("GET", "/v1/models")
            assert reply.status == 200
            assert [d["id"] for d in reply.json()["data"]] == ["lab/llama", "ml/llama"]
            reply = await rig.call("GET", "/v1/models", key=KEY_B)
            assert [d["id"] for d in reply.json()["data"]] == ["llama"]
            reply = await rig.call("GET", "/v1/models/ml/llama")
            assert reply.json() == {"id": "ml/llama", "object": "model", "created": 0, "owned_by": "ml"}

            reply = await rig.call("POST", "/v1/chat/completions", body=CHAT)
            assert reply.status == 200 and reply.json()["choices"][0]["message"] == {"role": "assistant",
                                                                                      "content": "hello"}
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})
            assert reply.status == 200 and reply.json()["choices"][0]["text"] == "hello"
            reply = await rig.call("POST", "/v1/chat/completions", body={**CHAT, "stream": True})
            events = sse(reply.body)
            assert reply.headers["content-type"].startswith("text/event-stream")
            assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == "hello"
            assert events[-1] == "[DONE]"
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x", "stream": True})
            assert "".join(e["choices"][0]["text"] for e in sse(reply.body)[:-1]) == "hello"
            reply = await rig.call("POST", "/v1/responses", body={"model": "ml/llama", "input": "hi"})
            assert reply.status == 200 and reply.json()["object"] == "response"
            assert reply.json()["output"][0]["content"][0]["text"] == "hello"
            reply = await rig.call("POST", "/v1/responses", body={"model": "ml/llama", "input": "hi", "stream": True})
            kinds = [line[7:] for line in reply.body.decode().split("\n") if line.startswith("event: ")]
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
            reply = await rig.call("POST", "/v1/chat/completions", body={**CHAT, "n": 2})   # n: gathered from a stream
            assert reply.status == 200 and [c["message"]["content"] for c in reply.json()["choices"]] == ["hello"] * 2
            paths = [s.raw_path for s in rig.upstream.seen]   # an llm model renders its own chat template
            assert paths == ["/v2/models/llm/generate", "/v2/models/llm/generate",
                             "/v2/models/llm/generate_stream", "/v2/models/llm/generate_stream",
                             "/v2/models/llm/generate", "/v2/models/llm/generate_stream",
                             "/v2/models/llm/generate_stream"]
            assert json.loads(rig.upstream.seen[-1].body)["n"] == 2

            assert (await rig.call("GET", "/healthz", key=None)).json() == {"ok": True}
            ready = (await rig.call("GET", "/readyz", key=None)).json()
            assert ready["ready"] is True and ready["keysError"] is None and ready["held"] == 0
            metrics = (await rig.call("GET", "/metrics", key=None)).body.decode()
            assert 'triton_gateway_requests_total{code="200",inferenceservice="llama",namespace="ml",route="chat"}' \
                in metrics
    run(scenario)


def test_every_refusal_has_its_exact_answer():
    async def scenario():
        async with Rig(hold_timeout_seconds=0.2, retry_after_seconds=3) as rig:
            cases = [
                (await rig.call("GET", "/v1/models", key=None),
                 error(401, "missing API key: send it as 'Authorization: Bearer KEY'", "invalid_api_key")),
                (await rig.call("GET", "/v1/models", key=KEY_A[:-2] + "zz"),
                 error(401, "invalid API key", "invalid_api_key")),
                (await rig.call("POST", "/v1/chat/completions", key=KEY_B, body={**CHAT, "model": "lab/llama"}),
                 error(403, "this API key may not use model 'lab/llama'", "model_not_allowed",
                       "permission_error", "model")),
                (await rig.call("POST", "/v1/chat/completions", body={**CHAT, "model": "ml/nothing"}),
                 error(404, "model 'ml/nothing' does not exist or does not serve the OpenAI routes (spec.openai)",
                       "model_not_found", param="model")),
                (await rig.call("POST", "/v1/chat/completions", body={**CHAT, "model": "llama"}),
                 error(400, "model 'llama' exists in namespaces lab, ml: name it NAMESPACE/llama", "model_ambiguous",
                       param="model")),
                (await rig.call("POST", "/v1/chat/completions", body=b"{not json"),
                 error(400, "the request body is not valid JSON", None)),
                (await rig.call("POST", "/v1/chat/completions", body={"model": "ml/llama", "messages": []}),
                 error(400, "messages: List should have at least 1 item after validation, not 0", None,
                       param="messages")),
                (await rig.call("POST", "/v1/chat/completions", body={**CHAT, "max_tokens": 40000}),
                 error(400, "max_tokens: at most 32768 for this API key", "max_tokens_too_large", param="max_tokens")),
                (await rig.call("POST", "/v1/chat/completions", body={**CHAT, "max_completion_tokens": 40000}),
                 error(400, "max_completion_tokens: at most 32768 for this API key", "max_tokens_too_large",
                       param="max_completion_tokens")),
                (await rig.call("POST", "/v1/chat/completions", body={**CHAT, "n": 17}),
                 error(400, "n: Input should be less than or equal to 16", None, param="n")),
                (await rig.call("POST", "/v1/completions", body=b"x", headers={"Content-Encoding": "gzip"}),
                 error(415, "compressed request bodies are not accepted on the OpenAI routes",
                       "unsupported_content_encoding")),
                (await rig.call("GET", "/nowhere"), error(404, "Not Found", "not_found")),
            ]
            for reply, (status, body) in cases:
                assert (reply.status, reply.error) == (status, body)
            # an empty Content-Encoding names no coding, as on the /v2 routes
            assert (await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"},
                                   headers={"Content-Encoding": ""})).status == 200
            assert (await rig.call("GET", "/v1/models", key=None)).headers.get("www-authenticate") is None
    run(scenario)


def test_replica_failures_have_fixed_texts():
    async def broken(request):
        return web.Response(status=500, text="segfault in backend at 0xdeadbeef")

    async def scenario():
        async with Rig() as rig:
            rig.upstream.answer = broken
            reply = await rig.call("POST", "/v1/chat/completions", body={**CHAT, "max_tokens": 4})
            assert (reply.status, reply.error) == error(502, "model llama failed (HTTP 500)", "upstream_failed",
                                                        "upstream_error")
            rig.gw.router.set_slice(slice_for("llama", 1, "ml"))   # a port nothing listens on
            reply = await rig.call("POST", "/v1/chat/completions", body=CHAT)
            assert (reply.status, reply.error) == error(
                503, "model llama: every ready replica refused the connection or timed out in the last 30s; retry "
                     "later", "upstream_unreachable", "service_unavailable")
            assert 1 <= int(reply.headers["retry-after"]) <= 30
    run(scenario)


# -- holding --------------------------------------------------------------------------------------------

def test_a_held_request_is_answered_once_a_replica_is_ready_and_times_out_otherwise():
    async def scenario():
        async with Rig(hold_timeout_seconds=0.3, retry_after_seconds=3) as rig:
            rig.gw.router.set_slice({"metadata": {"name": "llama-x", "namespace": "ml",
                                                  "labels": {"kubernetes.io/service-name": "llama"}},
                                     "ports": [{"name": "http", "port": rig.upstream.port}], "endpoints": []})
            reply = await rig.call("POST", "/v1/chat/completions", body=CHAT)
            assert (reply.status, reply.error, reply.headers["retry-after"]) == (
                *error(503, "model llama has no ready replica after 0s; it may still be starting: retry later",
                       "model_starting", "service_unavailable"), "3")
            rig.gw.settings.hold_timeout_seconds = 10
            waiting = asyncio.create_task(rig.call("POST", "/v1/chat/completions", body=CHAT))
            for _ in range(100):
                if rig.gw.holds.count:
                    break
                await asyncio.sleep(0.01)
            assert rig.gw.holds.by_service == {("ml", "llama"): 1}
            assert rig.gw.bodies.used == len(json.dumps(CHAT))   # its body, counted while it waits
            rig.gw.watches._slice_event("MODIFIED", slice_for("llama", rig.upstream.port, "ml"))
            reply = await asyncio.wait_for(waiting, 10)
            assert reply.status == 200 and rig.gw.holds.count == 0 and rig.gw.bodies.used == 0
    run(scenario)


def test_held_bytes_are_bounded_per_key_and_in_all():
    """Bodies are counted from before they are read: past a key's share 429, past the gateway's
    budget 503, each before the body is read, and nothing is left counted afterwards."""
    async def scenario():
        mib = 1 << 20
        async with Rig(max_body_bytes=mib, body_budget_bytes=4 * mib, key_share=0.6, hold_timeout_seconds=30,
                       max_held_per_service=64, max_held_total=64) as rig:
            # the budget below fits the prompts as sent; kvEvents routing would add their block hashes
            rig.gw.router.set_service(isvc("llama", routing={"policy": "leastInFlight"}))
            rig.gw.router.set_slice({"metadata": {"name": "llama-x", "namespace": "ml",
                                                  "labels": {"kubernetes.io/service-name": "llama"}},
                                     "ports": [{"name": "http", "port": rig.upstream.port}], "endpoints": []})
            big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * (mib - 200)}]}).encode()
            held = [asyncio.create_task(rig.call("POST", "/v1/chat/completions", body=big)) for _ in range(2)]
            for _ in range(500):
                if rig.gw.holds.count == 2:
                    break
                await asyncio.sleep(0.01)
            assert rig.gw.holds.count == 2
            reply = await rig.call("POST", "/v1/chat/completions", body=big)
            assert (reply.status, reply.error["code"]) == (429, "too_many_bytes_in_flight")
            generate = json.dumps({"text_input": "x" * (mib - 200), "max_tokens": 16}).encode()
            held += [asyncio.create_task(rig.call("POST", "/v2/models/llama/generate", key=KEY_B, body=generate,
                                                  headers={"X-Inference-Namespace": "ml"})) for _ in range(2)]
            for _ in range(500):
                if rig.gw.holds.count == 4:
                    break
                await asyncio.sleep(0.01)
            # held as they came (capped and re-encoded once a replica is there, as they will be sent)
            assert rig.gw.bodies.used == 2 * len(big) + 2 * len(generate)
            # b is within its share (2 of 2.4 MiB) but the gateway's 4 MiB are taken
            reply = await rig.call("POST", "/v1/completions", key=KEY_B, body={"model": "ml/llama", "prompt": "x" * 1000})
            assert (reply.status, reply.error["code"], reply.headers["retry-after"]) == (503, "gateway_busy", "1")
            rig.gw.watches._slice_event("MODIFIED", slice_for("llama", rig.upstream.port, "ml"))
            assert [r.status for r in await asyncio.wait_for(asyncio.gather(*held), 30)] == [200] * 4
            assert rig.gw.bodies.used == 0 and rig.gw.bodies.by_key == {} and rig.gw.in_flight.by_key == {}
    run(scenario)


def test_requests_in_flight_are_capped_per_key():
    release = asyncio.Event()

    async def slow(request):
        await release.wait()
        return web.json_response({"text_output": "ok"})

    async def scenario():
        async with Rig(max_in_flight_per_key=2) as rig:
            rig.upstream.answer = slow
            open_ = [asyncio.create_task(rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"}))
                     for _ in range(2)]
            for _ in range(200):
                if len(rig.upstream.seen) == 2:
                    break
                await asyncio.sleep(0.01)
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})
            assert (reply.status, reply.error["code"]) == (429, "too_many_requests_in_flight")
            other = await asyncio.wait_for(asyncio.shield(asyncio.create_task(
                rig.call("GET", "/v1/models", key=KEY_B))), 5)
            assert other.status == 200   # another key is not held back
            release.set()
            assert [r.status for r in await asyncio.gather(*open_)] == [200, 200]
    run(scenario)


# -- slow, large and many ------------------------------------------------------------------------------------

def test_bodies_over_the_limit_are_refused_before_they_are_read():
    async def scenario():
        async with Rig(max_body_bytes=4096) as rig:
            reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
            head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                    f"Content-Length: {1 << 30}\r\n\r\n")
            writer.write(head.encode())   # says 1 GiB, sends nothing of it
            await writer.drain()
            reply = await asyncio.wait_for(read_reply(reader), 5)
            assert (reply.status, reply.error) == error(
                413, f"request body of {1 << 30} bytes; the largest accepted is 4096", "request_too_large")
            writer.close()
            chunked = await raw_request(rig.port, "POST", "/v1/completions",
                                        {**bearer(KEY_A), "Transfer-Encoding": "chunked"},
                                        b"2000\r\n" + b"x" * 0x2000 + b"\r\n0\r\n\r\n")
            assert chunked.status == 413 and chunked.error["code"] == "request_too_large"
            assert rig.gw.bodies.used == 0
    run(scenario)


# -- keys ---------------------------------------------------------------------------------------------------

def test_a_broken_key_file_fails_closed_alone(tmp_path):
    """One team's typo in its key file took every tenant's keys with it (every request 503). The
    broken file's keys fail closed, and so does any key no readable file holds (it may be in the
    broken one: a 401 would tell its client the key is wrong); the other files' keys keep working.
    A key listed in two files is that second file's error."""
    async def scenario():
        good, bad = tmp_path / "a.yaml", tmp_path / "b.yaml"
        good.write_text(f"keys: [{{name: a, key: {KEY_A}, namespaces: [ml]}}]")
        bad.write_text(f"keys: [{{name: b, key: {KEY_B}, namespaces: [ml]}}]")
        async with Rig(key_files=[str(good), str(bad)]) as rig:
            rig.gw.auth.refresh_keys()
            assert [(await rig.call("GET", "/v1/models", key=k)).status for k in (KEY_A, KEY_B)] == [200, 200]
            bad.write_text("keys: [{name: b, key: " + KEY_B)   # a broken edit
            rig.gw.auth.refresh_keys()
            assert (await rig.call("GET", "/v1/models", key=KEY_A)).status == 200
            for key in (KEY_B, "sk-" + "q" * 40, None):
                reply = await rig.call("GET", "/v1/models", key=key)
                assert (reply.status, reply.error["code"]) == (503, "keys_unavailable"), key
            ready = (await rig.call("GET", "/readyz", key=None)).json()
            assert ready["keysError"] == f"{bad}: not valid YAML or JSON" and ready["keys"] == 1
            assert m.KEY_FILES_VALID._value.get() == 0
            bad.write_text(f"keys: [{{name: b2, key: {KEY_A}, namespaces: [ml]}}]")   # KEY_A twice
            rig.gw.auth.refresh_keys()
            assert (await rig.call("GET", "/v1/models", key=KEY_A)).status == 200
            ready = (await rig.call("GET", "/readyz", key=None)).json()
            assert ready["keysError"] == f"{bad}: key b2 is also listed as a"
            bad.write_text(f"keys: [{{name: b, key: {KEY_B}, namespaces: [ml]}}]")   # fixed
            rig.gw.auth.refresh_keys()
            assert [(await rig.call("GET", "/v1/models", key=k)).status for k in (KEY_A, KEY_B)] == [200, 200]
            assert m.KEY_FILES_VALID._value.get() == 1
    run(scenario)


def test_key_files_that_break_fail_closed_and_say_so(tmp_path):
    async def scenario():
        path = tmp_path / "keys.yaml"
        path.write_text(f"keys: [{{name: a, key: {KEY_A}, namespaces: [ml]}}]")
        async with Rig(key_files=[str(path)]) as rig:
            rig.gw.auth.refresh_keys()
            assert (await rig.call("GET", "/v1/models")).status == 200
            path.write_text("keys: [{name: a, key: " + KEY_A)   # a broken edit
            rig.gw.auth.refresh_keys()
            reply = await rig.call("GET", "/v1/models")
            assert (reply.status, reply.error["code"]) == (503, "keys_unavailable")
            assert reply.error["message"] == "the gateway cannot read its API keys; its operator has been told"
            ready = (await rig.call("GET", "/readyz", key=None)).json()
            assert ready["keysError"] == f"{path}: not valid YAML or JSON" and ready["keys"] == 0
            assert m.KEY_FILES_VALID._value.get() == 0
            path.write_text(f"keys: [{{name: a, key: {KEY_B}, namespaces: [ml]}}]")   # fixed, a rotated key
            rig.gw.auth.refresh_keys()
            assert (await rig.call("GET", "/v1/models")).status == 401
            assert (await rig.call("GET", "/v1/models", key=KEY_B)).status == 200
            assert m.KEY_FILES_VALID._value.get() == 1
            path.write_bytes(b"keys: [{name: a, key: \xff\xfe}]")   # not UTF-8: it escaped, and the key stayed valid
            rig.gw.auth.refresh_keys()
            assert (await rig.call("GET", "/v1/models", key=KEY_B)).status == 503
            assert (await rig.call("GET", "/readyz", key=None)).json()["keysError"] == f"{path}: not UTF-8 text"
    run(scenario)


def _pki(tmp_path, name: str) -> tuple[str, str, str]:
    """A CA and a server certificate for DNS name `name`, made with the openssl command line."""
    import subprocess

    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=test-ca")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={name}")
    (tmp_path / "san.ext").write_text(f"subjectAltName=DNS:{name}\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "san.ext")
    return str(tmp_path / "ca.pem"), str(tmp_path / "server.pem"), str(tmp_path / "server.key")


def test_a_request_tries_every_replica_that_refuses_at_once():
    """Replicas that refuse the connection (their node gone) cost nothing to try: three of them
    used up a request's three attempts, and it was answered 503 with a healthy fourth untried."""
    import socket

    async def scenario():
        async with Rig() as rig:
            slices = [slice_for("llama", rig.upstream.port)]
            for i in range(3):   # closed ports, after the healthy one in the replicas' order
                sock = socket.socket()
                sock.bind((f"127.0.0.{i + 2}", 0))
                host, port = sock.getsockname()
                sock.close()
                dead = slice_for("llama", port, address=host)
                dead["metadata"] = {**dead["metadata"], "name": f"llama-d{i}"}
                slices.append(dead)
            rig.gw.router.set_service(isvc("llama", routing={"policy": "leastInFlight"}))
            rig.gw.router.replace_slices(slices)
            replies = [await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})
                       for _ in range(2)]
            assert [r.status for r in replies] == [200, 200] and len(rig.gw.router.ejected) == 3
    run(scenario)


def test_tls_to_the_replicas_is_verified_against_the_services_name(tmp_path):
    """With upstream_tls_ca_file the gateway speaks HTTPS to the port upstream_port_name names,
    and checks the replica's certificate against NAME.NAMESPACE.svc (it dials a pod IP)."""
    import ssl

    ca, cert, key = _pki(tmp_path, "llama.ml.svc")
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    async def scenario():
        async with Rig(upstream_tls_ca_file=ca, upstream_port_name="https") as rig:
            tls = type(rig.upstream)()
            await tls.start(ssl_context=server_tls)
            try:
                for ns, name in (("ml", "llama"), ("lab", "llama")):
                    rig.gw.router.set_slice(slice_for(name, tls.port, ns, port_name="https"))
                ok = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": "x"})
                assert ok.status == 200 and ok.json()["choices"][0]["text"] == "hello"
                assert [s.raw_path for s in tls.seen] == ["/v2/models/llm/generate"]
                # lab/llama's replica presents llama.ml.svc's certificate: refused, nothing sent
                bad = await rig.call("POST", "/v1/completions", body={"model": "lab/llama", "prompt": "x"})
                assert (bad.status, bad.error["code"]) == (503, "upstream_unreachable")
                assert len(tls.seen) == 1
            finally:
                await tls.stop()
    run(scenario)


# -- the service level ---------------------------------------------------------------------------------------

def test_requests_are_counted_against_the_services_own_latency_target():
    """triton_gateway_slo_requests_total{met} per service, against spec.autoscaling.slo: end to end
    (targetP99LatencyMs too), to the first token, or between tokens (streams only); a request that
    failed, or a stream that broke, did not meet it."""
    def count(name, met):
        return m.SLO_REQUESTS.labels("ml", name, met)._value.get()

    async def slow(request):
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await asyncio.sleep(0.25)   # the first token after 0.25 s, the next 0.01 s later
        for piece in ("a", "b", "c"):
            await out.write(b'data: {"text_output": "' + piece.encode() + b'"}\n\n')
            await asyncio.sleep(0.01)
        await out.write_eof()
        return out

    async def scenario():
        async with Rig() as rig:
            for name, slo in (("e2e", {"latencyMs": 100}), ("ttft", {"latencyMs": 100, "latency": "timeToFirstToken"}),
                              ("itl", {"latencyMs": 100, "latency": "interToken"})):
                rig.gw.router.set_service(isvc(name, fmt="python", openai={"enabled": True},
                                               autoscaling={"maxReplicas": 2, "slo": slo}))
                rig.gw.router.set_slice(slice_for(name, rig.upstream.port))
            rig.upstream.answer = slow
            before = {(n, k): count(n, k) for n in ("e2e", "ttft", "itl") for k in ("true", "false")}
            for name in ("e2e", "ttft", "itl"):
                reply = await rig.call("POST", "/v1/completions", body={"model": f"ml/{name}", "prompt": "x",
                                                                         "stream": True})
                assert reply.status == 200
            after = {(n, k): count(n, k) - before[(n, k)] for n in ("e2e", "ttft", "itl") for k in ("true", "false")}
            assert after == {("e2e", "true"): 0, ("e2e", "false"): 1,     # 0.28 s end to end: over 0.1 s
                             ("ttft", "true"): 0, ("ttft", "false"): 1,   # 0.25 s to the first token
                             ("itl", "true"): 1, ("itl", "false"): 0}     # 0.01 s between tokens
    run(scenario)
