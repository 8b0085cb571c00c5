"""The CPU engine's prefix cache (runtime/triton_runtime/serving/prefix_cache.py, pure): the
longest saved prefix of a prompt, the boundary where its last message begins, and the byte budget
(ends a conversation has moved past first, then never reused, of the kind that has served fewer
prompts, then least recently used). The cache on the real model is in e2e/test_llm.py."""

from __future__ import annotations

from triton_runtime.serving.prefix_cache import BOUNDARY, END, MIN_TOKENS, PrefixCache, boundary

SYSTEM = list(range(100, 140))          # a shared system turn: 40 tokens


def test_the_longest_saved_prefix_shorter_than_the_prompt_is_found():
    cache = PrefixCache(10_000)
    cache.store(SYSTEM, "state-system", 100)
    cache.store(SYSTEM + [1, 2, 3] * 6, "state-turn", 100)
    assert cache.longest(SYSTEM + [1, 2, 3] * 6 + [9]) == (58, "state-turn")
    assert cache.longest(SYSTEM + [7, 7]) == (40, "state-system")
    assert cache.longest(SYSTEM) == (0, None), "a token must be left to evaluate"
    assert cache.longest([5] + SYSTEM) == (0, None)
    assert (cache.stats.lookups, cache.stats.hits, cache.stats.cached_tokens) == (4, 2, 98)


def test_short_or_known_prefixes_are_not_worth_a_state():
    cache = PrefixCache(10_000)
    assert not cache.wants(list(range(MIN_TOKENS - 1))) and cache.wants(SYSTEM)
    cache.store(SYSTEM, "s", 10)
    assert not cache.wants(SYSTEM)
    assert not PrefixCache(0).wants(SYSTEM), "a budget of 0 turns it off"


def test_states_never_reused_go_first_then_the_least_recently_used():
    cache = PrefixCache(250)
    a, b, c, d = (SYSTEM + [i] * 20 for i in (1, 2, 3, 4))
    cache.store(a, "a", 100)                # a tenant's system prompt ...
    cache.store(b, "b", 100)                # ... and the end of a one-off question after it
    cache.longest(a + [0])                  # a served a later prompt
    cache.longest(a + [0])
    assert cache.store(c, "c", 100) == [tuple(b)], "the one never reused goes, though a is older"
    assert cache.store(d, "d", 100) == [tuple(c)]
    cache.longest(d + [0])                  # now both were reused: the least recently used goes
    assert cache.store(SYSTEM + [5] * 20, "e", 100) == [tuple(a)]
    assert list(cache.states) == [("", tuple(d)), ("", tuple(SYSTEM + [5] * 20))] and cache.bytes == 200
    assert cache.store(list(range(500)), "big", 300) == [], "a state larger than the budget is not kept"
    assert cache.stats.removed == 3


def test_a_new_tenants_system_prompt_outlives_the_questions_saved_after_it():
    """Tenants: the boundary states (system prompts) serve later prompts, the ends of questions
    never do; a new tenant's system prompt, not yet reused, outlives the ends saved after it."""
    cache = PrefixCache(300)
    t1, t2 = SYSTEM, [200 + i for i in range(40)]
    cache.store(t1, "t1", 100, BOUNDARY)
    cache.store(t1 + [1] * 20, "t1-q1", 100, END)
    cache.longest(t1 + [2] * 20)                      # tenant 1's second question: its boundary serves
    assert cache.stats.hits_by_kind == {BOUNDARY: 1, END: 0}
    cache.store(t1 + [2] * 20, "t1-q2", 100, END)      # the budget is full
    assert cache.store(t2, "t2", 100, BOUNDARY) == [tuple(t1 + [1] * 20)]    # a new tenant: the oldest end goes
    assert cache.store(t2 + [3] * 20, "t2-q1", 100, END) == [tuple(t1 + [2] * 20)], \
        "an end goes, not tenant 2's system prompt, older and never reused yet"
    assert cache.store(t1 + [4] * 20, "t1-q3", 100, END) == [tuple(t2 + [3] * 20)]
    assert ("", tuple(t2)) in cache.states and cache.longest(t2 + [5] * 20) == (40, "t2")


def test_a_conversations_last_turn_outlives_the_boundaries_saved_after_it():
    """Conversations: each turn starts from the end of the last (the history it resends): the end
    a turn moved past goes first, then the boundaries before each turn's last question, which
    never serve."""
    cache = PrefixCache(300)
    turn1 = SYSTEM + [1] * 20
    cache.store(SYSTEM, "b1", 100, BOUNDARY)
    cache.store(turn1, "e1", 100, END)
    turn2 = turn1 + [7] * 10 + [2] * 20                # the reply, then the next question
    assert cache.longest(turn2) == (60, "e1")
    assert cache.stats.hits_by_kind == {BOUNDARY: 0, END: 1}
    assert cache.store(turn1 + [7] * 10, "b2", 100, BOUNDARY) == []
    assert cache.store(turn2, "e2", 100, END) == [tuple(turn1)], "the end turn 2 moved past goes"
    other = [300 + i for i in range(60)]
    assert cache.store(other, "e-other", 100, END) == [tuple(SYSTEM)], "then the unused boundaries, not an end"
    assert cache.store(other + [5] * 20, "e-other-2", 100, END) == [tuple(turn1 + [7] * 10)]
    assert ("", tuple(turn2)) in cache.states


def test_the_last_turns_of_waiting_conversations_outlive_the_turns_moved_past():
    """More conversations under way than the budget holds: the end a conversation has moved past
    (reused, then a longer end saved) goes before the last turns of the others, never reused yet,
    which their next turns start from."""
    cache = PrefixCache(400)
    a1 = SYSTEM + [1] * 20
    cache.store(a1, "a1", 100, END)
    a2 = a1 + [7] * 10 + [2] * 20
    assert cache.longest(a2) == (60, "a1")
    cache.store(a2, "a2", 100, END)                    # a1 is past: a's next turn starts from a2
    b1, c1, d1 = ([400 * i + j for j in range(60)] for i in (1, 2, 3))
    cache.store(b1, "b1", 100, END)
    cache.store(c1, "c1", 100, END)
    assert cache.store(d1, "d1", 100, END) == [tuple(a1)], "not a2, b1 or c1, the turns to come start there"
    assert cache.longest(a2 + [3] * 5) == (len(a2), "a2")
    assert cache.store(d1 + [4] * 20, "d2", 100, END) == [tuple(b1)], "then as before: the oldest never reused"


def test_the_boundary_saved_on_the_way_to_a_turns_end_does_not_evict_a_waiting_conversation():
    cache = PrefixCache(300)
    a1, b1, c1 = ([400 * i + j for j in range(60)] for i in (1, 2, 3))
    for prompt, name in ((a1, "a1"), (b1, "b1"), (c1, "c1")):
        cache.store(prompt, name, 100, END)
    a2 = a1 + [7] * 10 + [2] * 20
    assert cache.longest(a2) == (60, "a1")
    assert cache.store(a1 + [7] * 10, "a2-boundary", 100, BOUNDARY) == [tuple(a1)], "a1 goes, not b1"
    assert cache.store(a2, "a2", 100, END) == [tuple(a1 + [7] * 10)]
    assert [k[1] for k in cache.states] == [tuple(b1), tuple(c1), tuple(a2)]


def test_a_prefix_reused_by_questions_that_end_differently_is_not_moved_past():
    """Only ends are moved past: a tenant's system prompt (a boundary) serves every question, and
    each question's end extends it."""
    cache = PrefixCache(300)
    cache.store(SYSTEM, "t", 100, BOUNDARY)
    assert cache.longest(SYSTEM + [1] * 20) == (40, "t")
    cache.store(SYSTEM + [1] * 20, "q1", 100, END)
    cache.store(SYSTEM + [2] * 20, "q2", 100, END)
    assert cache.store(SYSTEM + [3] * 20, "q3", 100, END) == [tuple(SYSTEM + [1] * 20)]
    assert ("", tuple(SYSTEM)) in cache.states and not cache.superseded


def test_the_boundary_is_where_the_last_message_begins():
    # [template 0..10) [system 10..50) [template 50..55) [user 55..60) [template 60..64)
    starts = [(0, True), (10, False), (50, True), (55, False), (60, True)]
    assert boundary(starts, 64) == 55
    assert boundary([(0, True)], 30) == 0, "a completion's prompt is one piece"


def test_a_prompt_starts_only_from_states_saved_in_its_own_scope():
    """A scope is an API key's (the request's cache_salt): one key's prompt never starts from what
    another key's requests saved, so neither its cached tokens nor its speed tell which prompts
    another key sent."""
    cache = PrefixCache(10 ** 9)
    cache.store(SYSTEM, "b's system prompt", 100, BOUNDARY, scope="b")
    assert cache.longest(SYSTEM + [1], "a") == (0, None)
    assert cache.longest(SYSTEM + [1]) == (0, None), "no scope is a scope of its own"
    assert cache.longest(SYSTEM + [1], "b") == (40, "b's system prompt")
    assert cache.wants(SYSTEM, "a") and not cache.wants(SYSTEM, "b")
    assert cache.store(SYSTEM, "a's", 100, BOUNDARY, scope="a") == [] and cache.longest(SYSTEM + [1], "a") == (40, "a's")
    assert list(cache.states) == [("b", tuple(SYSTEM)), ("a", tuple(SYSTEM))] and cache.bytes == 200
    assert (cache.stats.lookups, cache.stats.hits, cache.stats.cached_tokens) == (4, 2, 80)


# -- what the cache tells the router (KvEvents) ------------------------------------------------------

def _read(cache: PrefixCache, cursor: str) -> tuple[str, dict]:
    import json

    out = json.loads(cache.events.since(cursor))
    return f"{out['epoch']}:{out['seq']}", out


def test_saving_and_evicting_named_states_are_told_as_numbered_events():
    cache = PrefixCache(250)
    cursor, first = _read(cache, "")
    assert first == {"epoch": cache.events.epoch, "seq": 0, "snapshot": []}, "a new reader gets a snapshot"
    cache.store(SYSTEM, "a", 100, BOUNDARY, ("00000000000000aa", 3))
    cache.store(SYSTEM + [1] * 20, "b", 100, END, ("00000000000000bb", 5))
    cache.store([7] * 30, "unnamed", 10, END)                       # a request that carried no keys
    cursor, out = _read(cache, cursor)
    assert out["events"] == [["stored", "00000000000000aa", 3], ["stored", "00000000000000bb", 5]]
    assert cache.longest(SYSTEM + [2]) == (40, "a")                  # the boundary is reused: the end goes first
    cache.store([8] * 30, "c", 100, END, ("00000000000000cc", 2))
    cursor, out = _read(cache, cursor)
    assert out["events"] == [["stored", "00000000000000cc", 2], ["removed", "00000000000000bb", 5]]
    _, out = _read(cache, cursor)
    assert out["events"] == [] and out["seq"] == 4


def test_a_reader_of_another_run_or_too_far_behind_gets_a_snapshot():
    from triton_runtime.serving.kv_events import LOG_EVENTS

    cache = PrefixCache(10 ** 9)
    cache.store(SYSTEM, "a", 100, BOUNDARY, ("00000000000000aa", 3))
    _, out = _read(cache, "another-run:1")
    assert out["snapshot"] == [["00000000000000aa", 3]] and "events" not in out, "an engine restarted since"
    for i in range(LOG_EVENTS):
        cache.name([i] * 20, None)                                  # unnamed: no event
        cache.store([i + 1000] * 20, "s", 1, END, (f"{i:016x}", 1))
    _, out = _read(cache, f"{cache.events.epoch}:0")
    assert len(out["snapshot"]) == LOG_EVENTS + 1, "the log no longer reaches back to event 1"
    _, out = _read(cache, f"{cache.events.epoch}:1")
    assert len(out["events"]) == LOG_EVENTS, "it reaches back to event 2"
    _, out = _read(cache, f"{cache.events.epoch}:{cache.events.seq + 5}")
    assert "snapshot" in out, "a cursor from the future is not this run's"


def test_a_name_held_by_two_states_is_removed_with_the_last_and_a_state_saved_unnamed_can_be_named():
    cache = PrefixCache(250)
    tag = ("00000000000000aa", 3)
    cache.store(SYSTEM, "a", 100, BOUNDARY, tag)
    cache.store(SYSTEM + [5] * 20, "b", 100, BOUNDARY, tag)    # the same keys, other tokens (another template)
    cache.store([9] * 20, "c", 10, END)
    cache.name([9] * 20, ("00000000000000cc", 1))              # later named by a request that carried keys
    cache.name([9] * 20, ("00000000000000dd", 1))              # named once
    cursor, out = _read(cache, f"{cache.events.epoch}:0")
    assert out["events"] == [["stored", "00000000000000aa", 3], ["stored", "00000000000000cc", 1]]
    cache.store([4] * 30, "d", 100, END)             # evicts "c", then "a": "b" still carries a's name
    cursor, out = _read(cache, cursor)
    assert list(cache.states) == [("", tuple(SYSTEM + [5] * 20)), ("", (4,) * 30)]
    assert out["events"] == [["removed", "00000000000000cc", 1]]
    cache.clear()
    _, out = _read(cache, cursor)
    assert out["events"] == [["removed", "00000000000000aa", 3]]


def test_the_prompts_taken_in_and_not_finished_are_told_as_being_read():
    """begin/end bracket a request's life in the engine: while any request whose prompt carries a
    name is queued or running, every reader is told it is being read (a gateway then sends the
    tenant's next request to this replica rather than read the same prompt on a second one)."""
    cache = PrefixCache(10 ** 9)
    tenant = ("00000000000000aa", 3)
    cache.events.begin(tenant)
    cache.events.begin(tenant)
    cache.events.begin(None)                                        # a prompt without keys: nothing to tell
    cursor, out = _read(cache, "")
    assert out["reading"] == [["00000000000000aa", 3]] and out["snapshot"] == []
    cache.events.end(tenant)
    _, out = _read(cache, cursor)
    assert out["reading"] == [["00000000000000aa", 3]] and out["events"] == [], "one of the two still runs"
    cache.events.end(tenant)
    cache.events.end(None)
    _, out = _read(cache, cursor)
    assert "reading" not in out and out["events"] == []
