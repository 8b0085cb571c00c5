"""The narrow interface between the Triton model and an engine (pure).

The model turns a Triton request into a `Job` (prompt pieces, sampling, stop strings, limits) and
hands it to an engine; the engine reports `Step`s (new text, tokens so far) through the job's
callback and ends with one whose `finish_reason` is set, and it answers `stats()` (queued and
active requests, KV-cache use) for the metrics. Two engines implement it: TensorRT-LLM's LLM API
(`trtllm`, GPUs) and llama.cpp (`llamacpp`, CPU: the tests and `make dev`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from .chat import Piece


@dataclass(frozen=True)
class Sampling:
    """OpenAI's defaults: temperature 1, top_p 1; temperature 0 is greedy."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                    # 0: no top-k
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    guided_json: str | None = None    # a JSON schema ('{}': any JSON object)
    logprobs: int | None = None       # report each token's log probability and this many alternatives (None: off)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its text, its log probability under the model, and the most likely
    alternatives at its place (token text, log probability), most likely first."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"token": self.token, "logprob": self.logprob, "top": [list(t) for t in self.top]}


@dataclass(frozen=True)
class Step:
    text: str                         # new text since the last step
    completion_tokens: int            # generated so far
    prompt_tokens: int
    finish_reason: str | None = None  # set on the last step: stop, length or cancelled
    logprobs: tuple[TokenLogprob, ...] = ()   # the tokens of this step's text, when asked for
    cached_tokens: int = 0            # prompt tokens that came from a saved prefix (the engine's cache)
    kv_events: str = ""               # on the last step, when the job has a kv_cursor: what the cache did since


class RequestError(ValueError):
    """A request the engine cannot serve as asked (too long a prompt, a bad schema)."""


@dataclass
class Job:
    prompt: Sequence[Piece]
    sampling: Sampling
    stops: Sequence[str]
    emit: Callable[[Step], None]               # called from the engine's thread(s)
    fail: Callable[[Exception], None]
    cancelled: Callable[[], bool] = lambda: False
    arrived: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None
    tag: Any = None
    prefix_keys: tuple[str, ...] = ()  # the router's chained hashes of the prompt's blocks (prefix_cache.py)
    prefix_boundary: int = 0           # how many of them lie before the last message
    kv_cursor: str | None = None       # the reader's cursor into the cache's events (None: it reads none)
    cache_salt: str = ""               # the scope of prefix-cache reuse: states of other salts are not reused


@dataclass(frozen=True)
class Stats:
    queued: int                       # accepted, not yet generating
    active: int                       # generating
    kv_cache_utilization: float       # 0..1 of the KV cache (or context) in use


class Engine(Protocol):
    name: str

    def submit(self, job: Job) -> None: ...

    def stats(self) -> Stats: ...

    def kv_events(self, cursor: str) -> str:
        """What the prefix cache stored and removed since `cursor`, with the engine's load, as a
        request's last step tells them (KvEvents.since); "" when the engine names nothing."""
        ...

    def shutdown(self) -> None: ...


def with_bos(ids: list[int], bos_id: int | None, adds_bos: bool) -> list[int]:
    """A prompt's token ids as the model's tokenizer would give them: its begin-of-sequence token
    first when the tokenizer adds one (Llama 3 does, Qwen does not), and once only: a chat
    template that writes the token itself (Llama 3's starts with `{{ bos_token }}`) already has
    it. Every engine tokenizes a prompt piece by piece without special tokens, so this is the
    one place the rule lives; a completion's `text_input` gets its BOS here."""
    if not adds_bos or bos_id is None or bos_id < 0 or ids[:1] == [bos_id]:
        return ids
    return [bos_id, *ids]


def tokenize_pieces(pieces: Sequence[Piece], encode: Callable[[Piece], list[int]], bos_id: int | None,
                    adds_bos: bool) -> tuple[list[int], list[tuple[int, bool]]]:
    """A prompt's token ids, `encode`d piece by piece (without special tokens) with its BOS as
    with_bos puts it, and where each piece starts in them (and whether it is the template's own
    text): what prefix_cache.boundary reads."""
    ids: list[int] = []
    starts: list[tuple[int, bool]] = []
    for piece in pieces:
        starts.append((len(ids), piece.trusted))
        ids += encode(piece)
    full = with_bos(ids, bos_id, adds_bos)
    shift = len(full) - len(ids)
    return full, [(start + shift, trusted) for start, trusted in starts]


class Counter:
    """A thread-safe count (queued and active requests)."""

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self._n += n

    @property
    def value(self) -> int:
        return self._n
