"""Prefix routing (gateway/routing.py, spec.routing.policy prefix): requests that begin alike go
to the same replica, in an order their beginning alone decides, until it holds more than its
share of the requests in flight; two routers that share nothing pick alike; a replica that comes
or goes moves only the beginnings it ranks first; a replica that holds a prompt's beginning is
worth waiting for while its queue costs less than the prompt it saves; the index of what replicas
hold is bounded and forgets a replica that leaves or fails. And the route in process: a tenant's
requests land on one replica."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from aiohttp import web

from triton_operator.gateway import routing
from triton_operator.gateway.openai_proxy import beginning_of
from triton_operator.gateway import openai_schema as oai
from triton_operator.gateway.routing import Router, beginning

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
    keys = [beginning(f"tenant {i}: you are a helpful assistant") for i in range(200)]
    assert [a.pick(KEY, 0.0, k) for k in keys] == [b.pick(KEY, 0.0, k) for k in keys]
    assert a.pick(KEY, 0.0, keys[0]) == a.pick(KEY, 0.0, keys[0])
    spread = Counter(a.pick(KEY, 0.0, k) for k in keys)
    assert len(spread) == 4 and min(spread.values()) > 25, spread     # beginnings spread over the replicas


def test_a_hot_beginning_spills_to_its_second_replica_past_its_share():
    r = router_with([1, 2, 3])
    hot = beginning("the one system prompt everybody sends")
    first = r.pick(KEY, 0.0, hot)
    picks = []
    for _ in range(6):               # six requests of it in flight at once
        address = r.pick(KEY, 0.0, hot)
        picks.append(address)
        r.acquire(address, hot)
    load = Counter(picks)
    # a replica new to the router counts as having had 1/3 of the recent requests; each pick moves a
    # replica's share 1/32 of the way to 1 or 0: the first replica takes the hot beginning past the
    # in-flight bound while its share is under 1.25 / 3 (to 0.43 after the first pick and four of
    # the six), then, over its share and over ceil(1.25 x (in flight + 1) / 3), no more; the second
    # takes the rest (it holds the beginning from the fifth on), and a third replica is not needed
    assert picks[:4] == [first] * 4 and picks[4] == picks[5] != first
    assert load[first] == 4 and load[picks[4]] == 2
    assert r.share[first] == pytest.approx((1 - (2 / 3) * (31 / 32) ** 5) * (31 / 32) ** 2)


def test_a_replica_under_its_share_of_recent_requests_is_worth_a_longer_wait():
    """Tenants spread over the replicas by their prompts: each replica's share of the recent
    requests is about a third, under the bound's 1.25 / 3. A replica of one sequence that holds a
    tenant's prompt then takes a third request of it behind two short ones in flight (about 250
    characters of work ahead, against 2,000 to read cold elsewhere), where the in-flight bound
    alone (two in flight at most: at 3 in flight over 3 replicas) had sent it to read the prompt
    cold on another replica."""
    r = router_with([1, 2, 3], engine={"maxBatchSize": 1})
    homes: dict[routing.Address, int] = {}
    n = 0
    while len(homes) < 3:                           # a tenant whose prompt goes first to each replica
        homes.setdefault(r.pick(KEY, 0.0, tenant(n, "Q0")), n)
        n += 1
    r.share.clear()                                 # as new: a third each
    for _ in range(10):                             # the three tenants' questions, in turn
        for a, t in homes.items():
            assert r.pick(KEY, 0.0, tenant(t, "Q")) == a
            r.release(a, r.acquire(a, tenant(t, "Q")))
    assert all(abs(r.share[a] - 1 / 3) < 0.01 for a in homes)
    home, t = next(iter(homes.items()))
    for q in ("Q1", "Q2"):                          # two short questions of one tenant in flight there
        assert r.pick(KEY, 0.0, tenant(t, q)) == home
        r.acquire(home, tenant(t, q))
    bound = math.ceil(routing.AFFINITY_LOAD * (2 + 1) / 3)
    assert r.in_flight[home] == bound == 2
    assert r.pick(KEY, 0.0, tenant(t, "Q3")) == home              # a third waits there too
    assert r.cost(home, tenant(t, "Q3"), 1) < 400 < 2000 < min(r.cost(a, tenant(t, "Q3"), 1) for a in homes if a != home)


def test_a_replica_that_goes_moves_only_the_beginnings_it_ranked_first():
    four, three = router_with([1, 2, 3, 4]), router_with([1, 2, 3])
    keys = [beginning(f"conversation {i}") for i in range(300)]
    before = {k: four.pick(KEY, 0.0, k) for k in keys}
    after = {k: three.pick(KEY, 0.0, k) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(before[k][0] == "10.0.0.4" for k in moved) and moved


def test_without_an_affinity_the_fewest_in_flight_wins():
    r = router_with([1, 2])
    busy = r.pick(KEY, 0.0)
    r.acquire(busy)
    assert r.pick(KEY, 0.0) != busy


def test_a_conversations_turns_share_their_affinity_and_blocks_and_the_service_is_part_of_them():
    turn1 = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    turn2 = turn1 + [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "And?" * 300}]

    def chat(messages):
        return oai.parse_body(json.dumps({"model": "m", "messages": messages}).encode(), oai.ChatRequest)

    def of(messages, key=KEY):
        return beginning_of(chat(messages), key, 16)

    assert of(turn1).affinity != of(turn2).affinity   # short: the whole text differs
    long_system = [{"role": "system", "content": "Rules. " * 100}]
    first, later = of(long_system + turn1[1:]), of(long_system + turn2[1:])
    assert first.affinity == later.affinity
    # the later turn resends the first: every whole block of the first is a block of the later
    assert len(first.blocks) == (len(first.blocks) * routing.BLOCK_CHARS) // routing.BLOCK_CHARS > 10
    assert later.blocks[:len(first.blocks)] == first.blocks and len(later.blocks) > len(first.blocks) + 10
    assert first.answer == 16 and first.chars == len(first.blocks) * routing.BLOCK_CHARS + first.chars % routing.BLOCK_CHARS
    other = of(long_system, ("ml", "other"))
    assert other.affinity != of(long_system).affinity and not set(other.blocks) & set(of(long_system).blocks)


def test_blocks_are_chained_a_block_names_everything_before_it():
    a, b = beginning("x" * 64 + "same" * 16), beginning("y" * 64 + "same" * 16)
    assert len(a.blocks) == len(b.blocks) == 2
    assert a.blocks[1] != b.blocks[1]          # the same second block after different first ones
    assert beginning("x" * 127).blocks == a.blocks[:1] and beginning("x" * 63).blocks == ()


def tenant(n: int, question: str) -> routing.Beginning:
    """A tenant's request: a 2,000-character system prompt, then a short question; 8 tokens of answer."""
    return beginning(f"tenant {n}: " + "Answer in the company's voice. " * 64 + question, 8)


def test_a_busy_replica_that_holds_the_beginning_wins_while_its_queue_costs_less_than_the_prompt():
    """One sequence at a time (maxBatchSize 1): the replica that read a tenant's system prompt is
    worth a wait behind a request that runs (half of it left, on average: about 1,050 characters
    of a whole new prompt, less than the 2,000 it saves), not behind one that runs and one that
    waits (about 3,100)."""
    r = router_with([1, 2, 3], engine={"maxBatchSize": 1})
    home = r.pick(KEY, 0.0, tenant(1, "Q1"))
    r.release(home, r.acquire(home, tenant(1, "Q1")))          # the first question: the prompt is read
    assert tenant(1, "Q2").blocks == tenant(1, "Q1").blocks      # the question is in the prompt's partial last block
    assert r.holds(home, tenant(1, "Q2")) == len(tenant(1, "Q2").blocks) == 31
    short = r.acquire(home, tenant(1, "Q2"))                     # a second question runs there
    assert short == tenant(1, "Q2").chars - r.holds(home, tenant(1, "Q2")) * routing.BLOCK_CHARS + 8 * 16
    assert short < 200
    assert r.pick(KEY, 0.0, tenant(1, "Q3")) == home            # wait behind it
    r.release(home, short)
    long = r.acquire(home, tenant(2, "a new tenant's first question"))   # a whole prompt to read runs there
    assert r.work[home] == long > 2000
    assert r.cost(home, tenant(1, "Q3"), 1) == tenant(1, "Q3").work(31) + long / 2
    assert r.pick(KEY, 0.0, tenant(1, "Q3")) == home            # still worth the wait: half of it is left
    queued = r.acquire(home, tenant(3, "another new tenant"))   # and another waits behind it
    assert r.cost(home, tenant(1, "Q3"), 1) == tenant(1, "Q3").work(31) + (long + queued) / 2 * 1.5
    assert r.pick(KEY, 0.0, tenant(1, "Q3")) != home            # an idle replica reads it sooner
    r.release(home, long)
    r.release(home, queued)
    assert home not in r.in_flight and home not in r.work       # nothing left over


def product(question: str) -> routing.Beginning:
    """A chat under one product's system prompt (about 3,100 characters), every user's."""
    return beginning("system: " + "Answer in the product's voice. " * 100 + question, 8)


@pytest.mark.parametrize("slots, third_goes_home", [(1, False), (64, True)])
def test_a_prompt_every_request_shares_spreads_once_a_second_request_would_wait(slots, third_goes_home):
    """Three in flight on three replicas: the replica that read the product's prompt takes a
    second request (a wait behind one short request costs less than reading the prompt cold), but
    on a batch of one not a third: two would then wait, and the replicas that never read the prompt
    would never start to (all of a bench's chats went to one replica, at half the requests/s of
    leastInFlight), once the replica has had more than its share of the recent requests (1.25 / 3:
    until then a hot prompt's requests wait there). A batching engine starts the third at once,
    within the load bound."""
    r = router_with([1, 2, 3], engine={"maxBatchSize": slots})
    home = r.pick(KEY, 0.0, product("Q0"))
    r.release(home, r.acquire(home, product("Q0")))             # the prompt is read there
    for _ in range(4):                                          # and its next questions, one at a time
        assert r.pick(KEY, 0.0, product("Q")) == home
        r.release(home, r.acquire(home, product("Q")))
    assert r.share[home] > routing.AFFINITY_LOAD / 3            # over its share of the recent requests
    for q in ("Q1", "Q2"):
        assert r.pick(KEY, 0.0, product(q)) == home
        r.acquire(home, product(q))
    third = r.pick(KEY, 0.0, product("Q3"))
    assert (third == home) is third_goes_home
    assert r.in_flight.get(third, 0) == (2 if third_goes_home else 0)     # not home: an idle replica


def test_with_batch_room_the_replica_that_holds_the_beginning_takes_it():
    """A batching engine (the default 64 slots) starts a request at once while it has a slot: the
    replica holding the prompt takes it whatever its queue, within the load bound."""
    r = router_with([1, 2, 3])
    home = r.pick(KEY, 0.0, tenant(1, "Q1"))
    r.acquire(home, tenant(1, "Q1"))
    assert r.pick(KEY, 0.0, tenant(1, "Q2")) == home    # 1 in flight < ceil(1.25 * 2 / 3)
    other = r.pick(KEY, 0.0, tenant(2, "Q1"))
    assert r.cost(home, tenant(1, "Q2"), 64) < r.cost(other, tenant(1, "Q2"), 64) - 1900


def test_a_replica_that_leaves_or_fails_to_connect_is_forgotten():
    r = router_with([1, 2, 3])
    home = r.pick(KEY, 0.0, tenant(1, "Q1"))
    r.release(home, r.acquire(home, tenant(1, "Q1")))
    assert r.holds(home, tenant(1, "Q2")) > 0
    r.eject(home, until=5.0)                       # refused a connection: it may have restarted
    assert r.holds(home, tenant(1, "Q2")) == 0
    r.release(home, r.acquire(home, tenant(1, "Q1")))
    r.set_slice({"metadata": {"name": "s", "namespace": "ml", "labels": {routing.SERVICE_NAME_LABEL: "llama"}},
                 "ports": [{"name": "http", "port": 8000}],
                 "endpoints": [{"addresses": [f"10.0.0.{p}"], "conditions": {"ready": p != int(home[0][-1])}}
                               for p in (1, 2, 3)]})   # not ready: restarting, or going
    assert home not in r.endpoints(KEY) and home not in r.held
    assert all(r.holds(a, tenant(1, "Q2")) == 0 for a in r.endpoints(KEY))


def test_the_index_is_bounded_and_forgets_a_prompts_last_blocks_first(monkeypatch):
    monkeypatch.setattr(routing, "INDEX_BLOCKS", 40)
    monkeypatch.setattr(routing, "REQUEST_BLOCKS", 40)
    r = router_with([1, 2])
    address = r.endpoints(KEY)[0]
    one, two = tenant(1, "Q"), tenant(2, "Q")       # 31 blocks each
    r.acquire(address, one)
    r.acquire(address, two)
    assert len(r.held[address]) == 40
    assert r.holds(address, two) == len(two.blocks)            # the latest whole
    assert r.holds(address, one) == 9                          # the older keeps its first 40 - 31
def test_one_request_takes_at_most_a_quarter_of_a_replicas_index(monkeypatch):
    """One tenant's prompt of twice the index's blocks (within the 1 MiB body) made the gateway
    forget every other tenant's prompts on that replica; it now indexes its first quarter."""
    monkeypatch.setattr(routing, "INDEX_BLOCKS", 40)
    monkeypatch.setattr(routing, "REQUEST_BLOCKS", 10)
    r = router_with([1, 2])
    address = r.endpoints(KEY)[0]
    others = [tenant(i, "Q") for i in (1, 2, 3)]             # 31 blocks each, 10 indexed
    for other in others:
        r.release(address, r.acquire(address, other))
    huge = beginning('["ml","llama","huge"]\n' + "A" * (80 * routing.BLOCK_CHARS))
    assert len(huge.blocks) > 40
    r.release(address, r.acquire(address, huge))
    assert len(r.held[address]) == 40
    assert r.holds(address, huge) == 10                      # its first quarter
    assert [r.holds(address, other) for other in others] == [10, 10, 10]   # theirs, kept


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
    talk = beginning("a conversation's opening")
    order = sorted(r.usable(KEY, 0.0), key=lambda a: routing._rank(talk.affinity, a), reverse=True)
    picks, works = [], {}
    for _ in range(4):
        address = r.pick(KEY, 0.0, talk)
        picks.append(address)
        works[address] = r.acquire(address, talk)
    assert picks[:3] == order            # each replica's one slot, in the beginning's order
    assert picks[3] == order[0]          # all full: the fewest in flight, first in the order
    r.release(order[1], works[order[1]])
    assert r.pick(KEY, 0.0, talk) == order[1]
    assert router_with([1, 2, 3]).services[KEY].batch_slots == routing.DEFAULT_MAX_BATCH   # not stated: the default


def test_the_default_batch_is_the_apis_default():
    from triton_operator.api.serving import EngineSpec

    assert EngineSpec().max_batch_size == routing.DEFAULT_MAX_BATCH
