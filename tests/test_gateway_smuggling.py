"""Smuggling, driven in process over real loopback sockets: requests framed so that the gateway
and what is behind it could read them differently. aiohttp's parser refuses ambiguous framing; the
connection guard frames heads itself, so pipelined requests are read one at a time and a chunked
one ends its connection; headers that Triton reads on its own (Inference-Header-Content-Length)
are checked before a byte reaches a replica. The upstream is a recording stand-in for Triton
(tests/gateway_http.py says why)."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest

from .gateway_http import KEY_A, Rig, connect, read_reply, run

INFER = "/v2/models/resnet/infer"
BODY = b'{"inputs": []}' + b"\x00" * 16    # a JSON header and binary data after it


@pytest.mark.parametrize("value", ["99999999999", "2147483648", "-1", "+5", "12abc", "1e3", "0x10", "", "31",
                                   "\xb2", "1 2"])
def test_an_inference_header_length_outside_the_body_is_refused_before_the_replica(value):
    """Triton r26.07 parses it with std::stoi and ends its process past INT_MAX."""
    async def scenario():
        async with Rig() as rig:
            reply = await rig.call("POST", INFER, body=BODY, headers={"Inference-Header-Content-Length": value})
            assert (reply.status, reply.error["code"], reply.error["message"]) == (
                400, "bad_header", "Inference-Header-Content-Length must be sent once, as an integer from 0 to "
                                   "the body length")
            assert rig.upstream.seen == []
    run(scenario)


def test_an_inference_header_length_sent_twice_is_refused():
    async def scenario():
        async with Rig() as rig:
            reader, writer = await connect(rig.port)
            writer.write(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                         f"Content-Length: {len(BODY)}\r\nInference-Header-Content-Length: 14\r\n"
                         f"Inference-Header-Content-Length: 99999999999\r\n\r\n".encode() + BODY)
            await writer.drain()
            reply = await asyncio.wait_for(read_reply(reader), 5)
            assert (reply.status, reply.error["code"]) == (400, "bad_header")
            writer.close()
            assert rig.upstream.seen == []
    run(scenario)


@pytest.mark.parametrize("value", ["0", "14", str(len(BODY))])
def test_an_inference_header_length_within_the_body_passes(value):
    async def scenario():
        async with Rig() as rig:
            reply = await rig.call("POST", INFER, body=BODY, headers={"Inference-Header-Content-Length": value})
            assert reply.status == 200
            [seen] = rig.upstream.seen
            assert seen.headers["Inference-Header-Content-Length"] == value and seen.body == BODY
    run(scenario)


def test_a_compressed_body_may_name_a_header_length_up_to_int32():
    """Triton checks a compressed body's header length once it is decompressed; the gateway bounds
    it by what Triton can parse."""
    async def scenario():
        async with Rig() as rig:
            packed = gzip.compress(BODY)
            ok = await rig.call("POST", INFER, body=packed, headers={"Content-Encoding": "gzip",
                                                                     "Inference-Header-Content-Length": "14"})
            assert ok.status == 200 and rig.upstream.seen[0].headers["Content-Encoding"] == "gzip"
            bad = await rig.call("POST", INFER, body=packed, headers={"Content-Encoding": "gzip",
                                                                      "Inference-Header-Content-Length": "2147483648"})
            assert (bad.status, bad.error["code"]) == (400, "bad_header") and len(rig.upstream.seen) == 1
    run(scenario)


@pytest.mark.parametrize("encoding", ["", " ", "IDENTITY"])
def test_an_empty_content_encoding_is_identity_and_its_header_length_within_the_body(encoding):
    """Triton reads an empty Content-Encoding as none; the gateway read it as a compression, and let
    a header length of INT32_MAX past with a body of 14 bytes."""
    async def scenario():
        async with Rig() as rig:
            bad = await rig.call("POST", INFER, body=BODY, headers={"Content-Encoding": encoding,
                                                                    "Inference-Header-Content-Length": "2147483647"})
            assert (bad.status, bad.error["code"]) == (400, "bad_header") and rig.upstream.seen == []
    run(scenario)


FRAMINGS = [
    # (what is sent after the head's first lines, why it is refused)
    ("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /v2/repository/index HTTP/1.1\r\n\r\n",
     "both framings"),
    ("Content-Length: 5\r\nContent-Length: 40\r\n\r\nhello", "two lengths"),
    ("Content-Length: +5\r\n\r\nhello", "a signed length"),
    ("Content-Length: 5, 5\r\n\r\nhello", "a list of lengths"),
    ("Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", "chunked not last"),
    ("Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", "an unknown coding"),
    ("Transfer-Encoding:\tchunked\r\nTransfer-Encoding: gzip\r\n\r\n0\r\n\r\n", "two encodings"),
    ("Content-Length: 5\r\n Transfer-Encoding: chunked\r\n\r\nhello", "a folded line"),
]


@pytest.mark.parametrize("framing, why", FRAMINGS, ids=[f[1] for f in FRAMINGS])
def test_ambiguous_framing_is_refused_and_reaches_nothing(framing, why):
    async def scenario():
        async with Rig() as rig:
            reader, writer = await connect(rig.port)
            writer.write(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n{framing}".encode())
            await writer.drain()
            reply = await asyncio.wait_for(read_reply(reader), 5)
            assert reply.status == 400, why
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()
            assert rig.upstream.seen == []
    run(scenario)


def test_a_body_that_looks_like_a_request_stays_a_body():
    async def scenario():
        async with Rig() as rig:
            inner = b"GET /v2/repository/index HTTP/1.1\r\nHost: x\r\n\r\n"
            body = json.dumps({"model": "ml/llama", "prompt": inner.decode()}).encode()
            reader, writer = await connect(rig.port)
            writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
            reply = await asyncio.wait_for(read_reply(reader), 5)
            assert reply.status == 200
            writer.close()
            assert [s.raw_path for s in rig.upstream.seen] == ["/v2/models/llm/generate"]
    run(scenario)
