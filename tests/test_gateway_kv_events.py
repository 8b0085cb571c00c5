"""Routing on the engine's own KV events (gateway/routing.py, spec.routing.policy kvEvents): a
replica holds what its engine last said it stored, under the names the gateway gave the blocks;
answers that come back out of order, an engine that restarted and a gateway that fell behind all
end in what the engine holds; what a replica sends that cannot be read is ignored; two gateways
that read the same engines route alike; and, in process, the route sends each request's block
hashes and this gateway's cursor and applies the events its answer brings. The engine side is the
real runtime's event log (runtime/triton_runtime/serving/prefix_cache.py) behind a stand-in replica
(no model runs here: the real engine's events are in e2e/test_llm.py)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from aiohttp import web

from triton_operator.gateway import openai_schema as oai
from triton_operator.gateway import routing
from triton_operator.gateway import translate as t
from triton_operator.gateway.auth import cache_scope
from triton_operator.gateway.openai_proxy import beginning_of
from triton_operator.gateway.routing import Router
from triton_runtime.serving import contract
from triton_runtime.serving.prefix_cache import BOUNDARY, END, PrefixCache

from .gateway_http import Rig, Upstream, isvc, run, slice_for

KEY = ("ml", "llama")
NS = {"X-Inference-Namespace": "ml"}     # ml/llama, not lab/llama
SYSTEM = "Answer in the company's voice. " * 64


def router_with(ports: list[int]) -> Router:
    r = Router()
    r.set_service(isvc("llama", routing={"policy": "kvEvents"}))
    r.set_slice({"metadata": {"name": "s", "namespace": "ml", "labels": {routing.SERVICE_NAME_LABEL: "llama"}},
                 "ports": [{"name": "http", "port": 8000}],
                 "endpoints": [{"addresses": [f"10.0.0.{p}"], "conditions": {"ready": True}} for p in ports]})
    return r


def chat(tenant: int, question: str, key: tuple[str, str] = KEY, scope: str = "") -> routing.Beginning:
    req = oai.parse_body(json.dumps({"model": "m", "messages": [
        {"role": "system", "content": f"tenant {tenant}: {SYSTEM}"}, {"role": "user", "content": question}]}).encode(),
        oai.ChatRequest)
    return beginning_of(req, key, 8, precise=True, scope=scope)


class Engine:
    """A replica's prefix cache as the real runtime keeps it, fed the names a request carries:
    serving one saves its boundary and its end, as the CPU engine does."""

    def __init__(self, budget: int = 10 ** 9) -> None:
        self.cache = PrefixCache(budget)

    def serve(self, begins: routing.Beginning, cursor: str, size: int = 100) -> str:
        keys = begins.keys()
        for depth, kind in ((begins.before_last, BOUNDARY), (len(keys), END)):
            if depth:
                self.cache.store([int(k, 16) for k in keys[:depth]], "state", size, kind, (keys[depth - 1], depth))
        return self.cache.events.since(cursor)


def test_the_last_message_starts_where_a_tenants_requests_part():
    one, two = chat(1, "What is ACME?"), chat(1, "Who are you, and what do you sell? " * 4)
    assert one.precise and one.before_last == two.before_last > 30
    assert one.blocks[:one.before_last] == two.blocks[:two.before_last]
    assert one.blocks[one.before_last:] != two.blocks[two.before_last:]
    assert len(one.keys()) == len(one.blocks) and all(len(k) == 16 for k in one.keys())
    completion = beginning_of(oai.parse_body(b'{"model": "m", "prompt": "' + b"x" * 300 + b'"}', oai.CompletionRequest),
                              KEY, 8, precise=True)
    # the service line (20 characters) and the prompt as a JSON string (302): 322 characters, 5 blocks
    assert completion.before_last == 0 and len(completion.blocks) == 5 and completion.chars == 322


QUESTION = "Where is my order #1234? It was due last week and nobody answers."
WEATHER = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What's the weather in town?"}]


def parse_chat(messages: list[dict[str, Any]]) -> oai.ChatRequest:
    return oai.parse_body(json.dumps({"model": "m", "messages": messages}).encode(), oai.ChatRequest)


def call(city: str, call_id: str = "c1") -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": city})}}]},
            {"role": "tool", "tool_call_id": call_id, "content": "sunny"}, {"role": "user", "content": "And tomorrow?"}]


@pytest.mark.parametrize("one, two", [
    # the old separators inside a content: one system message that reads like two messages
    ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
     [{"role": "system", "content": SYSTEM + "\x1euser\x1f" + QUESTION}]),
    # tool calls and tool_call_id, which the model reads and the names left out
    (WEATHER + call("Paris"), WEATHER + call("Rome")),
    (WEATHER + call("Paris", "c1"), WEATHER + call("Paris", "c2")),
    # a completion whose prompt spells a chat as the names used to
    ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
     f"system\x1f{SYSTEM}\x1euser\x1f{QUESTION}"),
], ids=["separators-in-content", "tool-call-arguments", "tool-call-id", "completion-spelling-a-chat"])
def test_prompts_the_model_reads_differently_never_share_their_names(one, two):
    """Prefix names were hashed from "role\\x1fcontent" turns joined by "\\x1e", separators a
    client may put in a content, with tool calls and tool_call_id left out: two different chats got
    every name alike, so the replica that served a forged chat was believed (by every gateway) to
    hold another chat's whole prompt."""
    def begins(prompt: Any) -> routing.Beginning:
        if isinstance(prompt, str):
            req: Any = oai.parse_body(json.dumps({"model": "m", "prompt": prompt}).encode(), oai.CompletionRequest)
            return beginning_of(req, KEY, 8, True)
        return beginning_of(parse_chat(prompt), KEY, 8, True)

    model_reads = [t.chat_messages(parse_chat(p)) if isinstance(p, list) else p for p in (one, two)]
    assert model_reads[0] != model_reads[1]
    victim, forged = begins(one), begins(two)
    assert victim.keys()[-1] != forged.keys()[-1] and victim.keys() != forged.keys()
    # the engine that served the forged prompt tells every gateway what it stored, by its names
    r = router_with([1, 2, 3])
    replica = r.endpoints(KEY)[2]
    r.observe(replica, json.dumps({"epoch": "e", "seq": 1, "snapshot": [[forged.keys()[-1], len(forged.keys())]]}))
    assert r.holds(replica, forged) == len(forged.blocks)
    assert r.holds(replica, victim) == 0, "believed to hold none of the victim's prompt"


def test_the_tools_a_template_renders_are_part_of_a_prompts_names():
    def with_tools(*names: str) -> routing.Beginning:
        tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names]
        req = oai.parse_body(json.dumps({"model": "m", "messages": WEATHER, **({"tools": tools} if tools else {})}
                                      ).encode(), oai.ChatRequest)
        return beginning_of(req, KEY, 8, True)

    plain, weather, search = with_tools(), with_tools("get_weather"), with_tools("web_search")
    assert len({plain.keys()[-1], weather.keys()[-1], search.keys()[-1]}) == 3
    assert with_tools("get_weather").keys() == weather.keys()


def test_a_replica_holds_what_its_engine_said_it_stored_and_no_more():
    r = router_with([1, 2, 3])
    engine, home = Engine(), r.endpoints(KEY)[1]
    question = "What is ACME, and what does it sell? " * 5
    first = chat(1, question)
    r.observe(home, engine.serve(first, r.cursor(home)))
    assert len(first.blocks) > first.before_last
    assert r.holds(home, first) == len(first.blocks)                        # its end
    assert r.holds(home, chat(1, "Who are you?")) == first.before_last       # the system prompt's state
    assert all(r.holds(a, chat(1, "Who are you?")) == 0 for a in r.endpoints(KEY) if a != home)
    # a saved state is one whole prefix: sharing more than the boundary but less than the end
    # holds the boundary only (the engine restores the longest state, not blocks of one)
    part = chat(1, question[:120] + " and then something else entirely" * 4)
    shared = next(i for i, (x, y) in enumerate(zip(part.blocks, first.blocks)) if x != y)
    assert shared > first.before_last and r.holds(home, part) == first.before_last
    assert r.pick(KEY, 0.0, chat(1, "Who are you?")) == home


def test_events_move_what_a_replica_holds_and_an_older_answer_changes_nothing():
    r = router_with([1, 2])
    home = r.endpoints(KEY)[0]
    engine = Engine(budget=250)                       # two states of 100: a third evicts the oldest
    stale = r.cursor(home)
    r.observe(home, engine.serve(chat(1, "a question of a few blocks " * 5), stale))   # its boundary and end
    cursor = r.cursor(home)
    late = engine.cache.events.since(stale)          # an answer sent with the old cursor, back late
    r.observe(home, engine.serve(chat(2, "another question, as long " * 5), cursor))  # evicts tenant 1's
    assert r.holds(home, chat(1, "q9")) == 0 and r.holds(home, chat(2, "q9")) == chat(2, "q9").before_last
    r.observe(home, late)
    assert r.holds(home, chat(1, "q9")) == 0, "an answer that brings nothing newer is ignored"
    # two answers sent with one cursor: the second brings the first's events again, applied once
    c = r.cursor(home)
    a = engine.serve(chat(3, "q3"), c)
    b = engine.serve(chat(2, "q4"), c)
    r.observe(home, a)
    r.observe(home, b)
    assert set(r.stored[home]) == {int(k, 16) for k, _ in engine.cache.events.held}


def test_a_restarted_engine_or_a_gateway_far_behind_is_replaced_by_a_snapshot():
    r = router_with([1, 2])
    home = r.endpoints(KEY)[0]
    before = Engine()
    r.observe(home, before.serve(chat(1, "q"), r.cursor(home)))
    assert r.holds(home, chat(1, "x")) > 0
    restarted = Engine()                              # a new run: its answer to the old cursor is a snapshot
    r.observe(home, restarted.serve(chat(2, "q"), r.cursor(home)))
    assert r.holds(home, chat(1, "x")) == 0 and r.holds(home, chat(2, "x")) > 0
    assert r.cursor(home) == f"{restarted.cache.events.epoch}:{restarted.cache.events.seq}"


def test_two_gateways_that_read_the_same_engines_hold_and_pick_alike():
    a, b = router_with([1, 2, 3]), router_with([3, 2, 1])
    engines = {address: Engine() for address in a.endpoints(KEY)}
    for i in range(30):                              # gateway a sends everything, b only reads answers
        begins = chat(i % 6, f"question {i}")
        address = a.pick(KEY, 0.0, begins)
        a.observe(address, engines[address].serve(begins, a.cursor(address)))
    for address, engine in engines.items():           # b's next answer from each replica
        b.observe(address, engine.cache.events.since(b.cursor(address)))
    assert a.stored == b.stored and a.stored
    asks = [chat(i, "next") for i in range(6)]
    assert [a.pick(KEY, 0.0, k) for k in asks] == [b.pick(KEY, 0.0, k) for k in asks]
    assert all(max(a.holds(x, k) for x in a.endpoints(KEY)) == k.before_last for k in asks)


def test_what_this_gateway_sent_counts_until_the_engine_says_it_evicted_it_or_restarted():
    r = router_with([1, 2, 3])
    one, two = chat(1, "q"), chat(2, "a question of a few blocks " * 5)
    home = r.pick(KEY, 0.0, one)
    r.release(home, r.acquire(home, one))
    r.release(home, r.acquire(home, two))
    assert r.holds(home, chat(1, "other")) == one.before_last        # sent there: not reported yet
    engine = Engine(budget=250)
    r.observe(home, engine.serve(one, r.cursor(home)))
    r.observe(home, engine.serve(two, r.cursor(home)))              # its boundary and end evict tenant 1's
    assert r.holds(home, chat(1, "other")) < one.before_last, "the engine said it evicted it"
    assert r.holds(home, chat(2, "other")) == two.before_last
    r.observe(home, Engine().serve(chat(3, "q"), r.cursor(home)))   # a new run: what was sent is gone
    assert r.holds(home, chat(2, "other")) == 0 and r.holds(home, chat(3, "other")) > 0
    r.eject(home, until=5.0)
    assert home not in r.stored and home not in r.held and r.cursor(home) == ""
    r.observe(home, Engine().serve(chat(4, "q"), ""))
    assert home not in r.stored, "an answer from a replica that left changes nothing"


@pytest.mark.parametrize("payload", [
    "", "not json", "[]", '{"epoch": "e", "seq": "1", "events": []}', '{"epoch": "a b", "seq": 1, "snapshot": []}',
    '{"epoch": "e", "seq": 2, "snapshot": [["zz", 1]]}', '{"epoch": "e", "seq": 2, "snapshot": [["00000000000000aa", 0]]}',
    '{"epoch": "e", "seq": 2, "snapshot": [["00000000000000aa", true]]}', '{"epoch": "' + "e" * 33 + '", "seq": 1, "snapshot": []}',
    '{"epoch": "e", "seq": 2, "snapshot": {"00000000000000aa": 1}}', '{"epoch": "e", "seq": -1, "snapshot": []}',
    '{"epoch": "e", "seq": 3, "snapshot": [["0x0000000000000a", 1]]}', '{"seq": 3, "snapshot": []}',
    '{"epoch": "e", "seq": 3, "after": 2, "events": [["removed", "00000000000000bb", 2]]}',
    '{"epoch": "e", "seq": 3, "after": "1", "events": [["removed", "00000000000000bb", 2]]}',
])
def test_what_a_replica_sends_that_cannot_be_read_changes_nothing(payload: str):
    r = router_with([1])
    home = r.endpoints(KEY)[0]
    r.observe(home, '{"epoch": "e", "seq": 1, "snapshot": [["00000000000000bb", 2]]}')
    r.observe(home, payload)
    assert r.stored[home] == {0xbb: 2} and r.cursor(home) == "e:1"


def test_an_engine_cannot_grow_the_index_past_its_bound(monkeypatch):
    monkeypatch.setattr(routing, "ENGINE_INDEX", 3)
    r = router_with([1])
    home = r.endpoints(KEY)[0]
    r.observe(home, json.dumps({"epoch": "e", "seq": 1, "snapshot": [[f"{i:016x}", 1] for i in range(10)]}))
    assert len(r.stored[home]) == 3
    r.observe(home, json.dumps({"epoch": "e", "seq": 2, "after": 1,
                                "events": [["stored", f"{i + 100:016x}", 1] for i in range(10)]}))
    assert len(r.stored[home]) == 3


def test_the_route_sends_block_hashes_and_the_cursor_and_applies_the_answers_events():
    engine = Engine()
    bodies: list[dict[str, Any]] = []

    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        body = json.loads(await request.read())
        bodies.append(body)
        keys, before = body["prefix_keys"], body["prefix_boundary"]
        begins = routing.Beginning(0, tuple(int(k, 16) for k in keys), 0, 0, before, True)
        events = engine.serve(begins, body["kv_events_after"])
        if request.raw_path.endswith("/generate_stream"):
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            for piece, last in (("he", False), ("llo", True)):
                await out.write(b"data: " + json.dumps({
                    "text_output": piece, "finish_reason": "stop" if last else "", "prompt_tokens": 3,
                    "completion_tokens": 1 + last, "kv_events": events if last else ""}).encode() + b"\n\n")
            await out.write_eof()
            return out
        return web.json_response({"text_output": "ok", "finish_reason": "stop", "prompt_tokens": 3,
                                  "completion_tokens": 1, "kv_events": events})

    async def scenario():
        async with Rig() as rig:
            rig.upstream.answer = answer
            rig.gw.router.set_service(isvc("llama", routing={"policy": "kvEvents"}))
            address = rig.gw.router.endpoints(KEY)[0]
            system = {"role": "system", "content": SYSTEM}
            for i, stream in enumerate((False, True, False)):
                reply = await rig.call("POST", "/v1/chat/completions", body={
                    "model": "ml/llama", "stream": stream,
                    "messages": [system, {"role": "user", "content": f"question {i}, in a few blocks " * 4}]})
                assert reply.status == 200
            first, second, third = bodies
            assert first["kv_events_after"] == "" and next(iter(first)) == "kv_events_after"
            assert second["kv_events_after"] == f"{engine.cache.events.epoch}:2"     # boundary and end
            assert third["kv_events_after"] == f"{engine.cache.events.epoch}:3"      # the second's end
            assert first["prefix_keys"][:first["prefix_boundary"]] == second["prefix_keys"][:second["prefix_boundary"]]
            assert json.loads(first["messages"])[0] == system
            assert rig.gw.router.stored[address] == {int(k, 16): n for k, n in engine.cache.events.held}
            assert len(rig.gw.router.stored[address]) == 4
    run(scenario)


@pytest.mark.parametrize("spec,policy", [
    ({}, "kvEvents"),                                                        # an LLM on the llm model
    ({"routing": {"inferencePool": {"endpointPicker": {"name": "epp"}}}}, "kvEvents"),   # routing without a policy
    ({"routing": {"policy": "leastInFlight"}}, "leastInFlight"),
    ({"routing": {"policy": "prefix"}}, "prefix"),
    ({"openai": {"model": "ensemble"}}, "leastInFlight"),                    # generates on a model of its own
    ({"model": {"format": "onnx", "source": "hf://a/b"}}, "leastInFlight"),
    ({"model": {"format": "python", "source": "hf://a/b"}, "openai": {"enabled": True}}, "leastInFlight"),
])
def test_the_default_policy_is_kv_events_for_an_llm_on_the_llm_model(spec, policy):
    svc = routing.service_from(isvc("llama", **spec))
    assert (svc.prefix_routing, svc.kv_events) == {"kvEvents": (True, True), "prefix": (True, False),
                                                   "leastInFlight": (False, False)}[policy]


def test_the_cursor_is_written_in_place_for_each_replica_tried():
    """The slot reserved first in the encoded body takes each replica's cursor in turn (a request
    retried elsewhere after a connect failure), the body stays the same length and valid JSON, and
    a cursor too long for the slot is sent as "" (the engine then answers with what it holds)."""
    r = Router()
    a, b, c = ("10.0.0.1", 8000), ("10.0.0.2", 8000), ("10.0.0.3", 8000)
    r.cursors[a] = ("run1", 5)
    r.cursors[b] = ("z" * 32, 10 ** 30)
    r.cursors[c] = ("z" * 32, 10 ** 40)                   # 32 + 1 + 41 characters: past the slot
    body = bytearray(t.encode(routing.cursor_slot({"text_input": "x", "prefix_keys": ["00ff"]})))
    size = len(body)
    assert routing.has_cursor_slot(body) and not routing.has_cursor_slot(bytes(body))
    seen = []
    for address in (a, b, c, a):
        r.write_cursor(body, address)
        assert len(body) == size and routing.has_cursor_slot(body)
        seen.append(json.loads(body))
    assert [x["kv_events_after"] for x in seen] == ["run1:5", "z" * 32 + ":" + "1" + "0" * 30, "", "run1:5"]
    assert all(x == {"kv_events_after": x["kv_events_after"], "text_input": "x", "prefix_keys": ["00ff"]}
               for x in seen)
    assert next(iter(seen[0])) == "kv_events_after"
    assert not routing.has_cursor_slot(bytearray(t.encode({"text_input": "x"})))


def test_a_service_of_another_format_is_never_routed_on_engine_events():
    r = Router()
    r.set_service(isvc("resnet", fmt="onnx", routing={"policy": "kvEvents"}))
    svc = r.services[("ml", "resnet")]
    assert svc.prefix_routing and not svc.kv_events


def test_admission_refuses_kv_events_for_a_model_that_is_not_an_llm():
    """At admission (the CRD's CEL rule, as tests/crd_admission.py evaluates it) and in the models."""
    from pydantic import ValidationError

    from triton_operator import crdgen
    from triton_operator.api.spec import InferenceServiceSpec

    from .crd_admission import Admission

    admission = Admission(crdgen.inference_service_crd())

    def doc(fmt: str) -> dict[str, Any]:
        return {"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
                "metadata": {"name": "chat"},
                "spec": {"model": {"source": "hf://org/model", "format": fmt}, "gpu": {"class": "h100"},
                         "routing": {"policy": "kvEvents"}}}

    refusals = admission.refusals(doc("onnx"))
    assert [(r.path, r.message) for r in refusals] == [
        ("spec.routing.policy", "routing.policy kvEvents needs model.format tensorrt-llm (the LLM engine reports "
                                "what its cache holds)")]
    assert admission.refusals(doc("tensorrt-llm")) == []
    with pytest.raises(ValidationError, match="routing.policy kvEvents needs model.format tensorrt-llm"):
        InferenceServiceSpec.model_validate(doc("onnx")["spec"])
    assert InferenceServiceSpec.model_validate(doc("tensorrt-llm")["spec"]).routing.policy == "kvEvents"


def test_what_other_gateways_sent_a_replica_counts_for_a_while():
    """An answer says how many requests the engine held: less this gateway's own, what other
    gateway replicas sent it, which the load bound and the work ahead count for OTHERS_FOR_S."""
    r = router_with([1, 2, 3])
    r.services[KEY] = routing.Service(KEY, "llm", "llm", True, llm=True, prefix_routing=True, kv_events=True,
                                      batch_slots=1)
    begins = chat(1, "q")
    home = r.pick(KEY, 10.0, begins)
    work = r.acquire(home, begins)
    r.observe(home, json.dumps({"epoch": "e", "seq": 0, "snapshot": [], "load": 3}), now=10.0)
    assert r.load(home, 10.5) == 3 and r.others[home] == (2, 10.0)
    assert r.pick(KEY, 10.5, chat(1, "next")) != home, "two more of other gateways' requests wait there"
    r.release(home, work)
    assert r.load(home, 10.0 + routing.OTHERS_FOR_S) == 0 and home not in r.others, "told too long ago"
    assert r.pick(KEY, 13.0, chat(1, "next")) == home
    r.observe(home, json.dumps({"epoch": "e", "seq": 0, "snapshot": [], "load": True}), now=13.0)
    r.observe(home, json.dumps({"epoch": "e", "seq": 0, "snapshot": [], "load": -1}), now=13.0)
    assert home not in r.others


def test_a_prompt_no_replica_is_known_to_hold_asks_the_replicas_not_heard_from_lately():
    r = router_with([1, 2, 3])
    a, b, c = r.endpoints(KEY)
    begins = chat(1, "q")
    assert r.to_probe(KEY, begins, 10.0) == [a, b, c]
    assert r.to_probe(KEY, begins, 10.1) == [], "asked just now (answered or not)"
    r.observe(b, json.dumps({"epoch": "e", "seq": 0, "snapshot": []}), now=10.3)
    assert r.to_probe(KEY, begins, 10.0 + routing.PROBE_FRESH_S) == [a, c], "b's events were read at 10.3"
    r.observe(b, json.dumps({"epoch": "e", "seq": 1, "after": 0,
                             "events": [["stored", begins.keys()[begins.before_last - 1], begins.before_last]]}),
              now=11.0)
    assert r.holds(b, begins) == begins.before_last
    assert r.to_probe(KEY, begins, 20.0) == [], "b holds the prompt up to its last message"
    assert r.to_probe(KEY, chat(2, "q"), 20.0) == [a, b, c], "another tenant's prompt: nobody is known to hold it"
    one_message = beginning_of(oai.parse_body(b'{"model": "m", "prompt": "' + b"x" * 300 + b'"}', oai.CompletionRequest),
                               KEY, 8, precise=True)
    assert r.to_probe(KEY, one_message, 30.0) == [], "nothing before its last message to find"
    assert r.to_probe(KEY, dataclasses.replace(begins, precise=False), 40.0) == [], "prefix routing: no events"
    alone = router_with([1])
    assert alone.to_probe(KEY, begins, 10.0) == [], "one replica: nothing to choose"


def test_a_prompt_another_gateway_sent_and_a_replica_is_still_reading_is_sent_there_too():
    """Two gateways that each send a tenant's first requests before either is answered would read
    its system prompt on two replicas: an engine tells what it is reading (its requests taken in
    and not finished, up to their last message), which counts as held there for OTHERS_FOR_S or
    until the engine next tells (an older answer changes nothing)."""
    r = router_with([1, 2, 3])
    r.services[KEY] = routing.Service(KEY, "llm", "llm", True, llm=True, prefix_routing=True, kv_events=True,
                                      batch_slots=1)
    begins = chat(1, "q")
    home = min(r.endpoints(KEY), key=lambda a: routing._rank(begins.affinity, a))   # last in its order
    name = [begins.keys()[begins.before_last - 1], begins.before_last]
    r.observe(home, json.dumps({"epoch": "e", "seq": 4, "snapshot": [], "load": 1, "reading": [name]}), now=10.0)
    assert r.holds(home, begins) == begins.before_last
    assert r.to_probe(KEY, begins, 10.1) == [], "known to be read there"
    assert r.pick(KEY, 10.2, begins) == home, "waiting for one request there beats reading it all elsewhere"
    r.observe(home, json.dumps({"epoch": "e", "seq": 3, "snapshot": [], "load": 0}), now=10.3)
    assert r.holds(home, begins) == begins.before_last, "an older answer says nothing about now"
    assert r.pick(KEY, 10.0 + routing.OTHERS_FOR_S, begins) != home and r.holds(home, begins) == 0, "told too long ago"
    r.observe(home, json.dumps({"epoch": "e", "seq": 5, "after": 4, "events": [], "reading": [name]}), now=20.0)
    r.observe(home, json.dumps({"epoch": "e", "seq": 6, "after": 5, "events": []}), now=20.5)
    assert r.holds(home, begins) == 0, "done reading, and not stored: evicted already, or failed"
    r.observe(home, json.dumps({"epoch": "e", "seq": 7, "after": 6, "events": [], "reading": [["xyz", 1]]}), now=21.0)
    assert r.holds(home, begins) == 0


def test_a_gateway_asks_what_another_gateways_requests_left_before_it_routes():
    """Two replicas; this gateway never sent the tenant's prompt anywhere, and the engine of the
    replica the prompt's beginning does not rank first says it holds the system prompt (another
    gateway's request left it there). The probe (kv_events_after alone) reads that before the
    request is routed, and the request goes there. A replica whose probe fails is routed on what is
    known of it."""
    begins = chat(1, "What is ACME?", scope=cache_scope("a"))    # as key a's request names it
    probes: dict[int, list[dict[str, Any]]] = {}

    def replica(events: str | None) -> Any:
        async def answer(request: web.BaseRequest) -> web.StreamResponse:
            body = json.loads(await request.read())
            if "messages" not in body:
                probes.setdefault(request.transport.get_extra_info("sockname")[1], []).append(body)
                if events is None:
                    return web.json_response({"error": "no"}, status=500)
                return web.json_response({"text_output": "", "kv_events": events})
            return web.json_response({"text_output": "ok", "finish_reason": "stop", "prompt_tokens": 3,
                                      "completion_tokens": 1})
        return answer

    async def scenario():
        other = Upstream()
        await other.start()
        try:
            async with Rig() as rig:
                rig.gw.router.set_service(isvc("llama", routing={"policy": "kvEvents"}))
                rig.gw.router.replace_slices([slice_for("llama", rig.upstream.port),
                                              {**slice_for("llama", other.port), "metadata": {
                                                  "name": "llama-y", "namespace": "ml",
                                                  "labels": {routing.SERVICE_NAME_LABEL: "llama"}}}])
                first = max(rig.gw.router.endpoints(KEY), key=lambda a: routing._rank(begins.affinity, a))
                holder, cold = (other, rig.upstream) if first[1] == rig.upstream.port else (rig.upstream, other)
                keys = begins.keys()
                holder.answer = replica(json.dumps({"epoch": "run1", "seq": 1, "snapshot": [
                    [keys[begins.before_last - 1], begins.before_last]]}))
                cold.answer = replica(None)
                body = {"model": "ml/llama", "messages": [{"role": "system", "content": f"tenant 1: {SYSTEM}"},
                                                          {"role": "user", "content": "What is ACME?"}]}
                reply = await rig.call("POST", "/v1/chat/completions", body=body)
                assert reply.status == 200
                assert probes == {holder.port: [{"kv_events_after": ""}], cold.port: [{"kv_events_after": ""}]}
                sent = [s for s in holder.seen if b'"messages"' in s.body]
                assert len(sent) == 1 and not [s for s in cold.seen if b'"messages"' in s.body]
                assert json.loads(sent[0].body)["kv_events_after"] == "run1:1"
                reply = await rig.call("POST", "/v1/chat/completions", body=body)
                assert reply.status == 200 and len(probes[holder.port]) == 1, "known to hold it: no probe"
        finally:
            await other.stop()
    run(scenario)


def test_a_prompt_longer_than_the_model_names_is_served_named_by_its_first_blocks():
    """One block hash per 64 characters used to be sent however long the prompt: past 8,192 (about
    524k characters, within the default body limit) the llm model refused the request for the
    router's hints alone. The gateway now names a prompt by its first MAX_PREFIX_KEYS blocks, the
    model's own bound, and clamps the boundary to them."""
    assert routing.MAX_PREFIX_KEYS == contract.MAX_PREFIX_KEYS == 8192
    report = "The quarterly report, section by section. " * 14_000        # 602,000 characters

    async def scenario():
        async with Rig() as rig:
            reply = await rig.call("POST", "/v1/completions", body={"model": "ml/llama", "prompt": report,
                                                                     "max_tokens": 8})
            assert reply.status == 200
            sent = json.loads(rig.upstream.seen[-1].body)
            assert (len(sent["prefix_keys"]), sent["prefix_boundary"]) == (8192, 0)
            reply = await rig.call("POST", "/v1/chat/completions", body={"model": "ml/llama", "max_tokens": 8,
                                   "messages": [{"role": "system", "content": report},
                                                {"role": "user", "content": "Summarise it."}]})
            assert reply.status == 200
            sent = json.loads(rig.upstream.seen[-1].body)
            assert (len(sent["prefix_keys"]), sent["prefix_boundary"]) == (8192, 8192)
            assert len(set(sent["prefix_keys"])) == 8192
    run(scenario)


def test_a_client_cannot_set_the_routers_inputs_through_the_v2_routes():
    """prefix_keys, prefix_boundary and kv_events_after are the gateway's: a client that set them
    on the generate pass-through could read which prompts other keys left in a replica's cache
    (the events' names are hashes of prompts a client can compute) or name states falsely."""
    async def scenario():
        async with Rig() as rig:
            for route in ("generate", "generate_stream"):
                for extra in ({"kv_events_after": ""}, {"prefix_keys": ["00000000000000aa"], "prefix_boundary": 1}):
                    reply = await rig.call("POST", f"/v2/models/llama/{route}", body={"text_input": "x", **extra},
                                           headers=NS)
                    field = sorted(extra)
                    assert (reply.status, reply.error["code"], reply.error["message"]) == (
                        400, "reserved_parameter", f"{', '.join(field)}: set by the gateway, not by clients")
            assert not rig.upstream.seen, "nothing reached the replica"
            ok = await rig.call("POST", "/v2/models/llama/generate", body={"text_input": "x", "max_tokens": 4},
                                headers=NS)
            assert ok.status == 200
    run(scenario)


def test_the_routers_inputs_are_refused_inside_parameters_too():
    """Triton maps every key inside a generate body's "parameters" to the model input of that name
    as it maps the top-level ones (server src/http_server.cc ConvertGenerateRequest): the nested
    kv_events_after used to reach the model and bring back every tenant's cached prompt names."""
    async def scenario():
        async with Rig() as rig:
            for route in ("generate", "generate_stream"):
                for extra, named in (({"kv_events_after": ""}, "parameters.kv_events_after"),
                                     ({"prefix_keys": ["00000000deadbeef"], "prefix_boundary": 1},
                                      "parameters.prefix_boundary, parameters.prefix_keys")):
                    reply = await rig.call("POST", f"/v2/models/llama/{route}", headers=NS,
                                           body={"text_input": "x", "parameters": extra})
                    assert (reply.status, reply.error) == (400, {
                        "message": f"{named}: set by the gateway, not by clients", "type": "invalid_request_error",
                        "param": named.split(", ")[0], "code": "reserved_parameter"})
                reply = await rig.call("POST", f"/v2/models/llama/{route}", headers=NS,
                                       body={"text_input": "x", "parameters": ["kv_events_after"]})
                assert (reply.status, reply.error["message"], reply.error["param"]) == (
                    400, "parameters must be a JSON object", "parameters")
            assert rig.upstream.seen == []
            ok = await rig.call("POST", "/v2/models/llama/generate", headers=NS,
                                body={"text_input": "x", "parameters": {"temperature": 0.5}})
            assert ok.status == 200 and rig.upstream.seen[-1].body == (
                b'{"text_input":"x","parameters":{"temperature":0.5},"max_tokens":256,"cache_salt":"%s"}'
                % cache_scope("a").encode())
    run(scenario)
