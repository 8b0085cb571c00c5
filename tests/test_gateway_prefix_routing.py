"""Prefix routing (gateway/routing.py, spec.routing.policy prefix): requests that begin alike go
to the same replica, in an order their beginning alone decides, until it holds more than its
share of the requests in flight; two routers that share nothing pick alike; a replica that comes
or goes moves only the beginnings it ranks first. And the route in process: a conversation's turns
land on one replica."""

from __future__ import annotations

import json
from collections import Counter

from aiohttp import web

from triton_operator.gateway import routing
from triton_operator.gateway.openai_proxy import affinity_of
from triton_operator.gateway import translate as t
from triton_operator.gateway.routing import Router, affinity

from .gateway_http import Rig, isvc, run, slice_for

KEY = ("ml", "llama")


def router_with(ports: list[int], **spec) -> Router:
    r = Router()
    r.set_service(isvc("llama", routing={"policy": "prefix"}, **spec))
    r.set_slice({"metadata": {"name": "s", "namespace": "ml", "labels": {routing.SERVICE_NAME_LABEL: "llama"}},
                 "ports": [{"name": "http", "port": 8000}],
                 "endpoints": [{"addresses": [f"10.0.0.{p}"], "conditions": {"ready": True}} for p in ports]})
    return r


def test_the_same_beginning_goes_to_the_same_replica_and_two_routers_agree():
    a, b = router_with([1, 2, 3, 4]), router_with([4, 3, 2, 1])     # the same replicas, listed apart
    keys = [affinity(f"tenant {i}: you are a helpful assistant") for i in range(200)]
    assert [a.pick(KEY, 0.0, k) for k in keys] == [b.pick(KEY, 0.0, k) for k in keys]
    assert a.pick(KEY, 0.0, keys[0]) == a.pick(KEY, 0.0, keys[0])
    spread = Counter(a.pick(KEY, 0.0, k) for k in keys)
    assert len(spread) == 4 and min(spread.values()) > 25, spread     # beginnings spread over the replicas


def test_a_hot_beginning_spills_to_its_second_replica_past_its_share():
    r = router_with([1, 2, 3])
    hot = affinity("the one system prompt everybody sends")
    first = r.pick(KEY, 0.0, hot)
    picks = []
    for _ in range(6):               # six requests of it in flight at once
        address = r.pick(KEY, 0.0, hot)
        picks.append(address)
        r.acquire(address)
    load = Counter(picks)
    # each takes it while under 1.25 x (in flight + 1) / 3: its first replica and its second
    # alternate, never past 1.25 x the mean (3 of 6), and a third replica is not needed
    assert picks[0] == first and picks[1] != first and set(picks) == {first, picks[1]}
    assert load[first] == load[picks[1]] == 3


def test_a_replica_that_goes_moves_only_the_beginnings_it_ranked_first():
    four, three = router_with([1, 2, 3, 4]), router_with([1, 2, 3])
    keys = [affinity(f"conversation {i}") for i in range(300)]
    before = {k: four.pick(KEY, 0.0, k) for k in keys}
    after = {k: three.pick(KEY, 0.0, k) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(before[k][0] == "10.0.0.4" for k in moved) and moved


def test_without_an_affinity_the_fewest_in_flight_wins():
    r = router_with([1, 2])
    busy = r.pick(KEY, 0.0)
    r.acquire(busy)
    assert r.pick(KEY, 0.0) != busy


def test_a_conversations_turns_share_their_affinity_and_the_service_is_part_of_it():
    turn1 = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    turn2 = turn1 + [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "And?" * 300}]

    def chat(messages):
        return t.parse_body(json.dumps({"model": "m", "messages": messages}).encode(), t.ChatRequest)

    assert affinity_of(chat(turn1), KEY) != affinity_of(chat(turn2), KEY)   # short: the whole text differs
    long_system = [{"role": "system", "content": "Rules. " * 100}]
    assert affinity_of(chat(long_system + turn1[1:]), KEY) == affinity_of(chat(long_system + turn2[1:]), KEY)
    assert affinity_of(chat(long_system), KEY) != affinity_of(chat(long_system), ("ml", "other"))


def test_the_route_sends_a_tenants_requests_to_one_replica():
    hits: list[int] = []

    def upstream_for(port_index: int):
        async def answer(request: web.BaseRequest) -> web.StreamResponse:
            hits.append(port_index)
            return web.json_response({"text_output": "ok", "finish_reason": "stop", "prompt_tokens": 3,
                                      "completion_tokens": 1})
        return answer

    async def scenario():
        async with Rig() as one, Rig() as two:
            # `one` routes llama over its own upstream and `two`'s; only `one`'s gateway is asked
            one.upstream.answer, two.upstream.answer = upstream_for(1), upstream_for(2)
            one.gw.router.set_service(isvc("llama", routing={"policy": "prefix"}))
            other = slice_for("llama", two.upstream.port)
            other["metadata"]["name"] = "llama-y"
            one.gw.router.set_slice(other)      # a second replica: two slices, one port each
            assert len(one.gw.router.endpoints(("ml", "llama"))) == 2
            system = {"role": "system", "content": "You answer for tenant A. " * 20}
            for i in range(6):
                reply = await one.call("POST", "/v1/chat/completions", body={
                    "model": "ml/llama", "messages": [system, {"role": "user", "content": f"question {i}"}]})
                assert reply.status == 200
            assert len(set(hits)) == 1 and len(hits) == 6
    run(scenario)


def test_a_replica_with_a_full_batch_is_passed_over_while_another_has_room():
    """With spec.engine.maxBatchSize 1 (an engine that runs one sequence at a time), a beginning's
    replica that is busy does not take it while another is idle: the next in its order with room
    does; once every replica is busy, the one with the fewest in flight."""
    r = router_with([1, 2, 3], engine={"maxBatchSize": 1})
    talk = affinity("a conversation's opening")
    order = sorted(r.usable(KEY, 0.0), key=lambda a: routing._rank(talk, a), reverse=True)
    picks = []
    for _ in range(4):
        address = r.pick(KEY, 0.0, talk)
        picks.append(address)
        r.acquire(address)
    assert picks[:3] == order            # each replica's one slot, in the beginning's order
    assert picks[3] == order[0]          # all full: the fewest in flight, first in the order
    r.release(order[1])
    assert r.pick(KEY, 0.0, talk) == order[1]
    assert router_with([1, 2, 3]).services[KEY].batch_slots == routing.DEFAULT_MAX_BATCH   # not stated: the default


def test_the_default_batch_is_the_apis_default():
    from triton_operator.api.spec import EngineSpec

    assert EngineSpec().max_batch_size == routing.DEFAULT_MAX_BATCH
