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

Before all of those go the ends a conversation has moved past: an end that served a later prompt
from which a longer state was then saved. The next turn starts from the new end, which holds all
of it (the boundary saved on the way there counts: saving it evicts the past end, not the last
turn of a conversation that is waiting). Reused, the past ends would otherwise outlive every state
not reused yet, among them the last turns of the conversations waiting for their next one: with
more conversations under way than a replica's budget holds, a replica kept each conversation's
past turns and lost its last.

What the cache holds is also told as events in the router's own terms (kv_events.py): a state
saved for a request that carried prefix keys is named by them.

Each state belongs to a scope (the request's `cache_salt`: the gateway sends its API key's), and a
prompt starts only from states of its own scope: one key cannot learn from its cached tokens, or
from how fast it is answered, which prompts another key sent.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

from .kv_events import BOUNDARY, END, KvEvents, Tag

MIN_TOKENS = 16     # shorter prefixes are not worth a state
Key = tuple[str, tuple[int, ...]]    # (scope, prefix)



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
        self.tags: dict[Key, Tag] = {}     # (scope, prefix) -> what the router calls it (see the module)
        self.states: OrderedDict[Key, tuple[Any, int]] = OrderedDict()   # (scope, prefix) -> (state, bytes)
        self.reused: set[Key] = set()     # states that served a later prompt
        self.kinds: dict[Key, str] = {}    # (scope, prefix) -> BOUNDARY or END
        self.superseded: set[Key] = set()  # reused ends a longer saved state holds (see the module)
        self.bytes = 0
        self.stats = Stats()

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def longest(self, ids: Sequence[int], scope: str = "") -> tuple[int, Any]:
        """The longest prefix of `ids` saved in `scope` and shorter than `ids` (a token must be left
        to evaluate: its logits start the answer), as (its length, its state); (0, None) when none."""
        self.stats.lookups += 1
        self.stats.prompt_tokens += len(ids)
        best: Key | None = None
        for key in self.states:
            owner, prefix = key
            n = len(prefix)
            if owner == scope and n < len(ids) and (best is None or n > len(best[1])) and tuple(ids[:n]) == prefix:
                best = key
        if best is None:
            return 0, None
        self.states.move_to_end(best)
        self.reused.add(best)
        self.stats.hits += 1
        self.stats.hits_by_kind[self.kinds[best]] += 1
        self.stats.cached_tokens += len(best[1])
        return len(best[1]), self.states[best][0]

    def wants(self, prefix: Sequence[int], scope: str = "") -> bool:
        """Whether a state for `prefix` in `scope` is worth saving (long enough, not saved yet)."""
        return self.enabled and len(prefix) >= MIN_TOKENS and (scope, tuple(prefix)) not in self.states

    def store(self, prefix: Sequence[int], state: Any, size: int, kind: str = END,
              tag: Tag | None = None, scope: str = "") -> list[tuple[int, ...]]:
        """Save `state` for `prefix` in `scope`, a state of `kind` (BOUNDARY or END), named `tag`
        to the router when the request said (see the module); returns the prefixes evicted to
        stay within the budget."""
        key = (scope, tuple(prefix))
        if not self.enabled or size > self.budget or key in self.states:
            return []
        self.states[key] = (state, size)
        self.kinds[key] = kind
        if tag is not None:
            self.tags[key] = tag
            self.events.stored(tag)
        self.bytes += size
        self.stats.stored += 1
        n = len(key[1])
        self.superseded.update(k for k in self.reused if k[0] == scope and self.kinds[k] == END
                               and len(k[1]) < n and key[1][:len(k[1])] == k[1])
        evicted = []
        while self.bytes > self.budget:
            old = self._victim(key)
            _, old_size = self.states.pop(old)
            self.reused.discard(old)
            self.superseded.discard(old)
            del self.kinds[old]
            if old in self.tags:
                self.events.removed(self.tags.pop(old))
            self.bytes -= old_size
            self.stats.removed += 1
            evicted.append(old[1])
        return evicted

    def name(self, prefix: Sequence[int], tag: Tag | None, scope: str = "") -> None:
        """Name a state already saved for `prefix` in `scope` that has no name yet (saved for a
        request that carried no keys) `tag`."""
        key = (scope, tuple(prefix))
        if tag is not None and key in self.states and key not in self.tags:
            self.tags[key] = tag
            self.events.stored(tag)

    def _victim(self, keep: Key) -> Key:
        """The state to evict (never `keep`, the one just saved): the least recently used end a
        conversation has moved past, then the oldest never reused of the kind that has served fewer
        prompts (ends on a tie), then the oldest never reused, then the least recently used."""
        past = next((p for p in self.states if p in self.superseded and p != keep), None)
        if past is not None:
            return past
        hits = self.stats.hits_by_kind
        first = END if hits[END] <= hits[BOUNDARY] else BOUNDARY
        unused = [p for p in self.states if p not in self.reused and p != keep]
        pick = next((p for p in unused if self.kinds[p] == first), None) or next(iter(unused), None)
        return pick if pick is not None else next(p for p in self.states if p != keep)

    def clear(self) -> None:
        self.states.clear()
        self.reused.clear()
        self.superseded.clear()
        self.kinds.clear()
        for tag in self.tags.values():
            self.events.removed(tag)
        self.tags.clear()
        self.bytes = 0


def boundary(offsets: Sequence[tuple[int, bool]], total: int) -> int:
    """Where the prompt's last message content begins (a token offset), from the pieces' start
    offsets and whether each is the template's own text: what the requests that share everything
    but their last message share. 0 when the prompt is one piece (a completion's)."""
    starts = [start for start, trusted in offsets if not trusted and 0 < start < total]
    return starts[-1] if starts else 0
