"""Saved engine states for prompt prefixes, for the CPU engine (pure: the states are opaque).

llama.cpp's context holds one sequence; llama-cpp-python's LlamaRAMCache keeps whole prompts, so
a shared system prompt followed by different questions never hits. Here a state is saved at the
prompt's boundaries (where a message's content begins: what every request of a tenant, or every
later turn of a conversation, shares) and at the prompt's end, and a new prompt starts from the
longest saved prefix of its tokens. The prompt is evaluated in the same pieces whether or not a
prefix was saved (first up to the boundary, then the rest), so an answer does not depend on what
other requests left behind: greedy decoding gives the same tokens cold or warm.

When the saved bytes pass the budget, states never reused go first, then the least recently
used (as in 2Q / segmented LRU). Among those never reused, the kind that has served fewer prompts
so far goes first, the oldest of it first: the two kinds serve different traffic. A tenant's
requests share the state at the boundary (its system prompt) and never the end of a question; a
conversation's next turn starts from the end of the last one (the history it resends) and never
from the boundary before its last question. A new tenant's system prompt then outlives the ends
of the questions saved after it until its second request comes (with the oldest never-reused
state going first, a replica that held a few tenants' prompts lost each new one to the next
question), and a conversation's last turn outlives the boundaries saved after it.

What the cache holds is also told as events (KvEvents), in the router's own terms: a request may
carry the gateway's chained hashes of its prompt's blocks (`prefix_keys`, and how many of them lie
before its last message), and a state saved for it is then named by the last key it covers and how
many keys that is. Saving and evicting such a state are "stored" and "removed" events, numbered
in order within the engine's run (its epoch), which the gateway reads back with its answers: the
precise counterpart of the index it would otherwise keep of what it sent where (TensorRT-LLM's
KV cache events, and Dynamo's and llm-d's routers, work on the same idea with token blocks).
"""

from __future__ import annotations

import json
import secrets
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Sequence

MIN_TOKENS = 16     # shorter prefixes are not worth a state
LOG_EVENTS = 1024   # events kept for readers that come back; one that fell further behind gets a snapshot
Tag = tuple[str, int]   # (the last prefix key a state covers, how many keys it covers)


BOUNDARY, END = "boundary", "end"   # a state where the last message begins, at the prompt's end


@dataclass
class Stats:
    lookups: int = 0
    hits: int = 0
    hits_by_kind: dict[str, int] = field(default_factory=lambda: {BOUNDARY: 0, END: 0})
    prompt_tokens: int = 0
    cached_tokens: int = 0
    stored: int = 0
    removed: int = 0


class PrefixCache:
    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self.events = KvEvents()
        self.tags: dict[tuple[int, ...], Tag] = {}     # prefix -> what the router calls it (see the module)
        self.states: OrderedDict[tuple[int, ...], tuple[Any, int]] = OrderedDict()   # prefix -> (state, bytes)
        self.reused: set[tuple[int, ...]] = set()     # prefixes whose state served a later prompt
        self.kinds: dict[tuple[int, ...], str] = {}    # prefix -> BOUNDARY or END
        self.bytes = 0
        self.stats = Stats()

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def longest(self, ids: Sequence[int]) -> tuple[int, Any]:
        """The longest saved prefix of `ids` shorter than `ids` (a token must be left to evaluate:
        its logits start the answer), as (its length, its state); (0, None) when none."""
        self.stats.lookups += 1
        self.stats.prompt_tokens += len(ids)
        best: tuple[int, ...] | None = None
        for prefix in self.states:
            n = len(prefix)
            if n < len(ids) and (best is None or n > len(best)) and tuple(ids[:n]) == prefix:
                best = prefix
        if best is None:
            return 0, None
        self.states.move_to_end(best)
        self.reused.add(best)
        self.stats.hits += 1
        self.stats.hits_by_kind[self.kinds[best]] += 1
        self.stats.cached_tokens += len(best)
        return len(best), self.states[best][0]

    def wants(self, prefix: Sequence[int]) -> bool:
        """Whether a state for `prefix` is worth saving (long enough, not saved yet)."""
        return self.enabled and len(prefix) >= MIN_TOKENS and tuple(prefix) not in self.states

    def store(self, prefix: Sequence[int], state: Any, size: int, kind: str = END,
              tag: Tag | None = None) -> list[tuple[int, ...]]:
        """Save `state` for `prefix`, a state of `kind` (BOUNDARY or END), named `tag` to the
        router when the request said (see the module); returns the prefixes evicted to stay
        within the budget."""
        key = tuple(prefix)
        if not self.enabled or size > self.budget or key in self.states:
            return []
        self.states[key] = (state, size)
        self.kinds[key] = kind
        if tag is not None:
            self.tags[key] = tag
            self.events.stored(tag)
        self.bytes += size
        self.stats.stored += 1
        evicted = []
        while self.bytes > self.budget:
            old = self._victim(key)
            _, old_size = self.states.pop(old)
            self.reused.discard(old)
            del self.kinds[old]
            if old in self.tags:
                self.events.removed(self.tags.pop(old))
            self.bytes -= old_size
            self.stats.removed += 1
            evicted.append(old)
        return evicted

    def name(self, prefix: Sequence[int], tag: Tag | None) -> None:
        """Name a state already saved for `prefix` that has no name yet (saved for a request that
        carried no keys) `tag`."""
        key = tuple(prefix)
        if tag is not None and key in self.states and key not in self.tags:
            self.tags[key] = tag
            self.events.stored(tag)

    def _victim(self, keep: tuple[int, ...]) -> tuple[int, ...]:
        """The state to evict (never `keep`, the one just saved): the oldest never reused of the
        kind that has served fewer prompts (ends on a tie), then the oldest never reused, then the
        least recently used."""
        hits = self.stats.hits_by_kind
        first = END if hits[END] <= hits[BOUNDARY] else BOUNDARY
        unused = [p for p in self.states if p not in self.reused and p != keep]
        pick = next((p for p in unused if self.kinds[p] == first), None) or next(iter(unused), None)
        return pick if pick is not None else next(p for p in self.states if p != keep)

    def clear(self) -> None:
        self.states.clear()
        self.reused.clear()
        self.kinds.clear()
        for tag in self.tags.values():
            self.events.removed(tag)
        self.tags.clear()
        self.bytes = 0


class KvEvents:
    """What a cache holds, as the router names it, and the numbered events that changed it.

    A reader keeps a cursor, "<epoch>:<seq>" (the last event it has applied), and asks for what
    came after it (`since`): the events after `seq` when the cursor is of this epoch and the log
    still reaches back to it, else a snapshot of everything held (a reader that is new, that fell
    behind more than LOG_EVENTS, or that last read an engine since restarted). Several states
    may carry one tag (two prompts whose keys end alike): it is held while any does, and
    "stored" and "removed" are told when the first comes and when the last goes. Not
    thread-safe: one engine thread changes it and reads it."""

    def __init__(self, epoch: str | None = None) -> None:
        self.epoch = epoch or secrets.token_hex(8)
        self.seq = 0
        self.held: dict[Tag, int] = {}                        # tag -> states that carry it
        self.log: deque[tuple[int, str, Tag]] = deque(maxlen=LOG_EVENTS)

    def stored(self, tag: Tag) -> None:
        n = self.held.get(tag, 0)
        self.held[tag] = n + 1
        if not n:
            self._append("stored", tag)

    def removed(self, tag: Tag) -> None:
        n = self.held.get(tag, 0)
        if n > 1:
            self.held[tag] = n - 1
        elif n == 1:
            del self.held[tag]
            self._append("removed", tag)

    def _append(self, kind: str, tag: Tag) -> None:
        self.seq += 1
        self.log.append((self.seq, kind, tag))

    def since(self, cursor: str) -> str:
        """What a reader whose cursor is `cursor` ("" for none) has not seen, as JSON:
        {"epoch", "seq", "after": the cursor's seq, "events": [["stored"|"removed", key, depth], ...]}
        (the events numbered after+1 to seq) or {"epoch", "seq", "snapshot": [[key, depth], ...]}."""
        epoch, _, seq_text = cursor.partition(":")
        seq = int(seq_text) if seq_text.isdigit() else -1
        oldest = self.log[0][0] if self.log else self.seq + 1
        out: dict[str, Any] = {"epoch": self.epoch, "seq": self.seq}
        if epoch == self.epoch and oldest - 1 <= seq <= self.seq:
            out["after"] = seq
            out["events"] = [[kind, key, depth] for n, kind, (key, depth) in self.log if n > seq]
        else:
            out["snapshot"] = [[key, depth] for key, depth in self.held]
        return json.dumps(out, separators=(",", ":"))


def boundary(offsets: Sequence[tuple[int, bool]], total: int) -> int:
    """Where the prompt's last message content begins (a token offset), from the pieces' start
    offsets and whether each is the template's own text: what the requests that share everything
    but their last message share. 0 when the prompt is one piece (a completion's)."""
    starts = [start for start, trusted in offsets if not trusted and 0 < start < total]
    return starts[-1] if starts else 0
