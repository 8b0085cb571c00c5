"""TensorRT-LLM's KV cache events told in the router's names (runtime/triton_runtime/serving/
kv_events.py BlockNames, pure): token blocks kept as a tree; a finished request's prefixes are
told stored at once and tied to their last full block once the events show it; removed with that
block, or when it never shows. The events are written as the LLM API serializes them
(KVCacheEventSerializer: stored {parent_hash, blocks [{block_hash, tokens [{token_id}]}]},
removed {block_hashes}); the engine that drains them is in tests/test_trtllm_engine.py."""

from __future__ import annotations

import json

from triton_runtime.serving.kv_events import BlockNames

PER = 4
SYSTEM = list(range(100, 112))          # three blocks
QUESTION = list(range(200, 206))        # one block and a half
A, B = ("00000000000000aa", 3), ("00000000000000bb", 5)


def stored(parent, *blocks):
    return {"event_id": 1, "window_size": 4096, "data": {"type": "stored", "parent_hash": parent, "blocks": [
        {"type": "stored_block", "block_hash": h, "tokens": [{"type": "unique_token", "token_id": t,
                                                               "token_extra_id": 0} for t in tokens],
         "cache_level": 0, "priority": 35} for h, tokens in blocks]}}


def removed(*hashes):
    return {"event_id": 2, "window_size": 4096, "data": {"type": "removed", "block_hashes": list(hashes)}}


def read(names: BlockNames, cursor: str = "") -> dict:
    return json.loads(names.events.since(cursor))


def test_a_finished_prompts_names_are_stored_then_tied_to_their_blocks_and_removed_with_them():
    names = BlockNames(PER, patience=2)
    prompt = SYSTEM + QUESTION
    names.finished(prompt, ((12, A), (len(prompt), B), (3, ("00000000000000cc", 1))))   # 3 tokens: no block
    assert read(names)["snapshot"] == [["00000000000000aa", 3], ["00000000000000bb", 5]]
    cursor = f"{names.events.epoch}:2"
    # the engine's events: the system prompt's three blocks, then the question's full one, a
    # 64-bit hash among them (hashes are unsigned ints)
    names.apply([stored(None, (1, SYSTEM[0:4]), (2, SYSTEM[4:8]), (2 ** 64 - 3, SYSTEM[8:12])),
                 stored(2 ** 64 - 3, (4, QUESTION[0:4]))])
    assert names.named == {A: 2 ** 64 - 3, B: 4} and not names.waiting
    names.apply([removed(4)])
    assert read(names, cursor)["events"] == [["removed", "00000000000000bb", 5]]
    names.apply([{"event_id": 3, "data": {"type": "updated", "block_hash": 1}}, {"event_id": 4, "data": {
        "type": "created", "num_blocks_per_cache_level": [100]}}])              # other kinds change nothing
    assert names.named == {A: 2 ** 64 - 3}


def test_a_name_whose_blocks_never_show_is_removed_after_its_patience():
    names = BlockNames(PER, patience=2)
    names.finished(SYSTEM + QUESTION, ((12, A),))
    names.apply([])
    assert A in names.waiting
    names.apply([stored(None, (1, SYSTEM[0:4]))])          # the rest was evicted before it was read
    assert A not in names.named and read(names, f"{names.events.epoch}:1")["events"] == [
        ["removed", "00000000000000aa", 3]]


def test_a_block_that_goes_takes_the_names_it_ends_and_a_tree_walk_needs_every_block():
    names = BlockNames(PER)
    names.apply([stored(None, (1, SYSTEM[0:4]), (2, SYSTEM[4:8]), (3, SYSTEM[8:12]))])
    names.finished(SYSTEM + QUESTION, ((12, A),))
    names.finished(SYSTEM + [9, 9, 9, 9, 9], ((12, A),))    # the same name again: told once
    names.apply([])
    assert names.named == {A: 3} and names.events.held == {A: 1}
    names.apply([removed(2), removed(3)])                     # its parent went too
    assert names.named == {} and names.events.held == {} and not names.needs
    assert names._walk(tuple(SYSTEM)) is None and names._walk(tuple(SYSTEM[:4])) == 1


def test_the_tree_and_the_names_are_bounded(monkeypatch):
    monkeypatch.setattr(BlockNames, "MAX_BLOCKS", 2)
    monkeypatch.setattr(BlockNames, "MAX_NAMES", 1)
    names = BlockNames(PER)
    names.apply([stored(None, (1, SYSTEM[0:4]), (2, SYSTEM[4:8]), (3, SYSTEM[8:12]))])
    assert list(names.parents) == [2, 3]
    names.finished(SYSTEM, ((8, A),))
    names.finished(SYSTEM, ((12, B),))
    assert list(names.named) == [B] and names.events.held == {B: 1}


def test_a_cursor_whose_sequence_is_not_an_ascii_number_is_read_as_none():
    """"²" is a digit to str.isdigit() and not a number to int(): the cursor "e:²" raised out of
    the model's probe. Now it is a cursor from no known point: the reader gets a snapshot."""
    names = BlockNames(PER)
    for cursor in ("e:²", f"{names.events.epoch}:²", f"{names.events.epoch}:١", f"{names.events.epoch}:-1"):
        out = read(names, cursor)
        assert "snapshot" in out and "events" not in out, cursor
