"""What an engine's cache holds, told in the router's own terms (pure).

A request may carry the gateway's chained hashes of its prompt's blocks (`prefix_keys`, 16 hex
digits each, and how many of them lie before its last message: contract.py). What the engine
keeps of such a prompt (a saved state at the last message and at the end on the CPU engine, KV
blocks on TensorRT-LLM) is then named by the last key it covers and how many keys that is (a
`Tag`). Keeping and dropping a named prefix are "stored" and "removed" events, numbered in order
within the engine's run (its epoch), which the gateway reads back with its answers: the precise
counterpart of the index it would otherwise keep of what it sent where (TensorRT-LLM's KV cache
events, and Dynamo's and llm-d's routers, work on the same idea with token blocks).

- KvEvents: the numbered events and what is held, read with a cursor;
- tag: the name of what a request leaves at its boundary or its end;
- BlockNames: TensorRT-LLM's KV cache events (token blocks, as `LLM.get_kv_cache_events` gives
  them) turned into KvEvents for the prompts that carried names.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections import OrderedDict, deque
from typing import Any, Iterable, Sequence

LOG_EVENTS = 1024   # events kept for readers that come back; one that fell further behind gets a snapshot
Tag = tuple[str, int]   # (the last prefix key a kept prefix covers, how many keys it covers)
BOUNDARY, END = "boundary", "end"   # where the prompt's last message begins, the prompt's end


def tag(keys: Sequence[str], before_last: int, kind: str) -> Tag | None:
    """What the router calls the prefix of a prompt with prefix keys `keys` kept at `kind`: all
    the keys at its END, the `before_last` before its last message at its BOUNDARY; None when the
    prompt carried no keys, or none lie before its last message."""
    if not keys:
        return None
    depth = len(keys) if kind == END else min(before_last, len(keys))
    return (keys[depth - 1], depth) if depth > 0 else None


class KvEvents:
    """What a cache holds, as the router names it, and the numbered events that changed it.

    A reader keeps a cursor, "<epoch>:<seq>" (the last event it has applied), and asks for what
    came after it (`since`): the events after `seq` when the cursor is of this epoch and the log
    still reaches back to it, else a snapshot of everything held (a reader that is new, that fell
    behind more than LOG_EVENTS, or that last read an engine since restarted). Several states
    may carry one tag (two prompts whose keys end alike): it is held while any does, and
    "stored" and "removed" are told when the first comes and when the last goes. The engine's
    thread changes it; a gateway's probe (triton_model) reads it from another: one lock."""

    def __init__(self, epoch: str | None = None) -> None:
        self.epoch = epoch or secrets.token_hex(8)
        self.seq = 0
        self.held: dict[Tag, int] = {}                        # tag -> states that carry it
        self.log: deque[tuple[int, str, Tag]] = deque(maxlen=LOG_EVENTS)
        self.reading: dict[Tag, int] = {}                     # tag -> requests queued or running that carry it
        self._lock = threading.Lock()

    def begin(self, tag: Tag | None) -> None:
        """A request whose prompt carries `tag` (where its last message begins) was taken in: until
        `end`, `since` names it as being read (a gateway then sends the tenant's next request here,
        not to a second replica, before this one is stored)."""
        if tag is not None:
            with self._lock:
                self.reading[tag] = self.reading.get(tag, 0) + 1

    def end(self, tag: Tag | None) -> None:
        if tag is not None:
            with self._lock:
                n = self.reading.get(tag, 0)
                if n > 1:
                    self.reading[tag] = n - 1
                else:
                    self.reading.pop(tag, None)

    def stored(self, tag: Tag) -> None:
        with self._lock:
            n = self.held.get(tag, 0)
            self.held[tag] = n + 1
            if not n:
                self._append("stored", tag)

    def removed(self, tag: Tag) -> None:
        with self._lock:
            n = self.held.get(tag, 0)
            if n > 1:
                self.held[tag] = n - 1
            elif n == 1:
                del self.held[tag]
                self._append("removed", tag)

    def _append(self, kind: str, tag: Tag) -> None:
        self.seq += 1
        self.log.append((self.seq, kind, tag))

    def since(self, cursor: str, load: int | None = None) -> str:
        """What a reader whose cursor is `cursor` ("" for none) has not seen, as JSON:
        {"epoch", "seq", "after": the cursor's seq, "events": [["stored"|"removed", key, depth], ...]}
        (the events numbered after+1 to seq) or {"epoch", "seq", "snapshot": [[key, depth], ...]};
        with `load`, also "load": the requests the engine holds now (queued and running, the
        one answered among them), which tells a gateway what the other gateways sent it; while
        requests are taken in and not finished, "reading": [[key, depth], ...], their prompts up to
        their last message (begin)."""
        epoch, _, seq_text = cursor.partition(":")
        seq = int(seq_text) if seq_text.isascii() and seq_text.isdigit() else -1   # "²" is a digit, not an int
        with self._lock:
            oldest = self.log[0][0] if self.log else self.seq + 1
            out: dict[str, Any] = {"epoch": self.epoch, "seq": self.seq}
            if load is not None:
                out["load"] = load
            if self.reading:
                out["reading"] = [[key, depth] for key, depth in self.reading]
            if epoch == self.epoch and oldest - 1 <= seq <= self.seq:
                out["after"] = seq
                out["events"] = [[kind, key, depth] for n, kind, (key, depth) in self.log if n > seq]
            else:
                out["snapshot"] = [[key, depth] for key, depth in self.held]
        return json.dumps(out, separators=(",", ":"))


class BlockNames:
    """TensorRT-LLM's KV cache events told as the router's names (KvEvents).

    The engine reports token blocks (KvCacheConfig(enable_block_reuse=True,
    event_buffer_max_size=N), `LLM.get_kv_cache_events(timeout)`, serialized as
    {"event_id", "data": {"type": "stored", "parent_hash", "blocks": [{"block_hash", "tokens":
    [{"token_id", ...}], ...}]} | {"type": "removed", "block_hashes": [...]} | ..., "window_size"};
    a block's hash chains its parent's). Here the blocks are kept as a tree keyed by (parent,
    tokens), so a prompt's prefix of n tokens is found by walking its n // tokens_per_block full
    blocks from the root.

    A request that finishes (`finished`) has its prompt's blocks in the cache: its names are told
    stored at once, and each waits for the events that show its last full block; a name is told
    removed when that block is removed, or when it has not shown within `patience` drains (the
    prompt was evicted before the events were read). Bounded: at most MAX_BLOCKS blocks and
    MAX_NAMES names (the oldest go first)."""

    MAX_BLOCKS = 1 << 20
    MAX_NAMES = 1 << 16

    def __init__(self, tokens_per_block: int, events: KvEvents | None = None, patience: int = 4) -> None:
        self.per_block = max(1, int(tokens_per_block))
        self.events = events or KvEvents()
        self.patience = patience
        self.children: dict[tuple[int | None, tuple[int, ...]], int] = {}
        self.parents: OrderedDict[int, tuple[int | None, tuple[int, ...]]] = OrderedDict()
        self.needs: dict[int, set[Tag]] = {}                 # block hash -> names it ends
        self.named: OrderedDict[Tag, int | None] = OrderedDict()   # name -> its last block (None: not seen yet)
        self.waiting: dict[Tag, tuple[tuple[int, ...], int]] = {}   # name -> (its tokens, drains left)

    def finished(self, ids: Sequence[int], marks: Iterable[tuple[int, Tag | None]]) -> None:
        """A request whose prompt is `ids` finished: each (n tokens, name) in `marks` is its prefix
        of n tokens, now in the cache (prefixes shorter than one block are not kept as blocks)."""
        for n, name in marks:
            if name is None or n < self.per_block or name in self.named:
                continue
            self.named[name] = None
            self.waiting[name] = (tuple(ids[:n]), self.patience)
            self.events.stored(name)
            while len(self.named) > self.MAX_NAMES:
                self._unname(next(iter(self.named)))

    def apply(self, raw: Iterable[Any]) -> None:
        """Apply one drain of the engine's events, then find the blocks of the names waiting."""
        for event in raw:
            data = event.get("data") if isinstance(event, dict) else None
            kind = data.get("type") if isinstance(data, dict) else None
            if kind == "stored":
                parent = data.get("parent_hash")
                for block in data.get("blocks") or ():
                    h = block["block_hash"]
                    tokens = tuple(int(t["token_id"]) for t in block.get("tokens") or ())
                    self.children[(parent, tokens)] = h
                    self.parents[h] = (parent, tokens)
                    parent = h
                while len(self.parents) > self.MAX_BLOCKS:
                    self._drop(next(iter(self.parents)))
            elif kind == "removed":
                for h in data.get("block_hashes") or ():
                    self._drop(h)
        for name, (tokens, left) in list(self.waiting.items()):
            block = self._walk(tokens)
            if block is not None:
                del self.waiting[name]
                self.named[name] = block
                self.needs.setdefault(block, set()).add(name)
            elif left <= 1:
                self._unname(name)
            else:
                self.waiting[name] = (tokens, left - 1)

    def _walk(self, tokens: tuple[int, ...]) -> int | None:
        parent: int | None = None
        b = self.per_block
        for i in range(len(tokens) // b):
            h = self.children.get((parent, tokens[i * b:(i + 1) * b]))
            if h is None:
                return None
            parent = h
        return parent

    def _drop(self, h: int) -> None:
        key = self.parents.pop(h, None)
        if key is not None and self.children.get(key) == h:
            del self.children[key]
        for name in self.needs.pop(h, ()):
            self._unname(name)

    def _unname(self, name: Tag) -> None:
        block = self.named.pop(name, None)
        self.waiting.pop(name, None)
        if block is not None and block in self.needs:
            self.needs[block].discard(name)
            if not self.needs[block]:
                del self.needs[block]
        self.events.removed(name)
