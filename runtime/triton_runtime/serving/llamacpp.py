"""The CPU engine: llama.cpp through llama-cpp-python, on a GGUF file.

It runs the same Triton model contract as the GPU engine, so `make dev` and the tests serve a real
instruct model (SmolLM2-135M-Instruct) behind the real Triton and the gateway. One request
generates at a time (llama.cpp's context holds one sequence here); the others wait in a queue,
which is what `stats()` reports, as TensorRT-LLM reports the requests its scheduler has not taken.

Everything it reads from the model comes from the GGUF metadata (llama-cpp-python 0.3.36:
`Llama.metadata`, a dict of strings): the chat template (`tokenizer.chat_template`), the BOS/EOS
tokens and whether to add BOS (`tokenizer.ggml.{bos,eos}_token_id`, `tokenizer.ggml.add_bos_token`).
Prompt pieces are tokenized with `Llama.tokenize(text, add_bos=False, special=trusted)`, so user
text is never parsed for special tokens (a str prompt given to create_completion would be: it
tokenizes with special=True). Generation uses `Llama.generate` token by token, so the engine
counts every token, stops at end-of-generation tokens, stop strings and max_tokens, and checks
for a cancelled request between tokens.

Prompts start from the longest saved state of a prefix of their tokens (prefix_cache.py): a state
of the KV cache of the context's one sequence (llama_state_seq_get_data / set_data, sequence 0),
saved where the prompt's last message begins and at its end; `prefix_cache_bytes` (model.yaml
llamacpp.prefix_cache_bytes, 0 to turn it off) bounds what is kept.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import queue
import random
import threading
from typing import Any

from .engine import Counter, Job, RequestError, Stats, Step, TokenLogprob, tokenize_pieces
from .kv_events import tag
from .prefix_cache import BOUNDARY, END, PrefixCache, boundary
from .text import StopScanner, Utf8Pieces

MAX_REPETITIONS = 1000       # minLength, maxLength, minItems, maxItems, minProperties, maxProperties
MAX_GRAMMAR_CHARS = 256 << 10
_REPETITION_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


def _check_repetitions(schema: Any) -> None:
    """Refuse a schema with a repetition bound over MAX_REPETITIONS (walked without recursion: a
    schema's depth is the client's)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in _REPETITION_KEYS:
                bound = node.get(key)
                if isinstance(bound, (int, float)) and not isinstance(bound, bool) and bound > MAX_REPETITIONS:
                    raise RequestError(f"guided_json: {key} {bound:g} is over {MAX_REPETITIONS}, the most this "
                                       "engine turns into a grammar")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)

log = logging.getLogger(__name__)


class LlamaCppEngine:
    name = "llamacpp"

    def __init__(self, model_path: str, n_ctx: int = 4096, n_threads: int | None = None,
                 prefix_cache_bytes: int = 256 << 20):
        from llama_cpp import Llama

        # The prompt's evaluation gets the same threads as generation: llama-cpp-python would give it
        # every core, and replicas sharing a node then spin against each other (ggml's threads wait
        # for each other busily), which made a 50-token prompt take 14 s with two one-thread replicas
        # on two cores.
        threads = n_threads or max(1, (os.cpu_count() or 2))
        self.llm = Llama(model_path=model_path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
        self.n_ctx = self.llm.n_ctx()
        meta = self.llm.metadata
        self.chat_template = meta.get("tokenizer.chat_template")
        self.bos_id = self.llm.token_bos()
        self.eos_id = self.llm.token_eos()
        self.add_bos = meta.get("tokenizer.ggml.add_bos_token", "true").lower() == "true"
        self.bos_token = self._piece(self.bos_id)
        self.eos_token = self._piece(self.eos_id)
        self.queued, self.active = Counter(), Counter()
        self._context_tokens = 0
        self.cache = PrefixCache(prefix_cache_bytes)
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._worker = threading.Thread(target=self._run, name="llamacpp", daemon=True)
        self._worker.start()

    def _piece(self, token: int) -> str:
        return self.llm.detokenize([token], special=True).decode("utf-8", "replace") if token >= 0 else ""

    def _end_of_generation(self, token: int) -> bool:
        if token == self.eos_id:
            return True
        vocab = getattr(self.llm._model, "vocab", None)
        try:
            import llama_cpp
            return bool(llama_cpp.llama_vocab_is_eog(vocab, token)) if vocab is not None else False
        except (AttributeError, TypeError):
            return False

    def tokenize(self, pieces: Any) -> list[int]:
        return self._tokenize(pieces)[0]

    def _tokenize(self, pieces: Any) -> tuple[list[int], list[tuple[int, bool]]]:
        """The prompt's tokens, and where each piece starts in them (and whether it is the
        template's own text)."""
        return tokenize_pieces(pieces, lambda piece: self.llm.tokenize(piece.text.encode("utf-8"), add_bos=False,
                                                                       special=piece.trusted),
                               self.bos_id, self.add_bos)

    # -- the Engine interface ----------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        self.cache.events.begin(_tag(job, BOUNDARY))
        self.queued.add(1)
        self._jobs.put(job)

    def stats(self) -> Stats:
        return Stats(queued=self.queued.value, active=self.active.value,
                     kv_cache_utilization=self._context_tokens / self.n_ctx if self.n_ctx else 0.0)

    def kv_events(self, cursor: str) -> str:
        return self.cache.events.since(cursor, self.queued.value + self.active.value)

    def shutdown(self) -> None:
        self._jobs.put(None)
        self._worker.join(timeout=10)

    # -- the worker ----------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self.queued.add(-1)
            self.active.add(1)
            try:
                self._generate(job)
            except Exception as e:  # noqa: BLE001 - reported to the request, the worker goes on
                job.fail(e)
            finally:
                self.active.add(-1)
                self._context_tokens = 0
                self.cache.events.end(_tag(job, BOUNDARY))

    def _grammar(self, schema: str | None) -> Any:
        """The grammar of a JSON schema, checked before it is used: repetition bounds of at most
        MAX_REPETITIONS (each repeated item is a rule of its own: minItems 3,000,000 was a grammar
        of 54 MB and 570 MB in memory; maxLength 3000 one llama.cpp refuses, printing it whole), a
        grammar of at most MAX_GRAMMAR_CHARS, and compiled once here: llama.cpp refuses one past
        its limits, or one it cannot parse (llama-cpp-python's converter writes `\\d{3}` in a
        pattern as a literal "\\d\\d\\d", not a GBNF escape), by returning no sampler, which
        llama-cpp-python adds to the chain anyway, and sampling then crashed the process."""
        if schema is None:
            return None
        import llama_cpp
        from llama_cpp import LlamaGrammar, llama_grammar

        parsed = json.loads(schema)
        _check_repetitions(parsed)
        try:
            if parsed == {}:
                grammar = LlamaGrammar.from_string(llama_grammar.JSON_GBNF, verbose=False)
            else:
                grammar = LlamaGrammar.from_json_schema(schema, verbose=False)
        except Exception as e:  # noqa: BLE001 - the converter's errors are the schema's (AssertionError, AttributeError...)
            raise RequestError(f"guided_json: the schema cannot be turned into a grammar: {e}") from None
        if len(grammar._grammar) > MAX_GRAMMAR_CHARS:
            raise RequestError(f"guided_json: the schema's grammar is {len(grammar._grammar)} characters; "
                               f"at most {MAX_GRAMMAR_CHARS} are accepted")
        sampler = llama_cpp.llama_sampler_init_grammar(self.llm._model.vocab, grammar._grammar.encode("utf-8"),
                                                       grammar._root.encode("utf-8"))
        if not sampler:
            raise RequestError("guided_json: llama.cpp cannot compile the schema's grammar (a pattern it "
                               "does not support, or a long maxLength, maxItems or repetitions)")
        llama_cpp.llama_sampler_free(sampler)
        return grammar

    def _generate(self, job: Job) -> None:
        if job.cancelled():
            job.emit(Step("", 0, 0, "cancelled"))
            return
        ids, starts = self._tokenize(job.prompt)
        if not ids:
            raise RequestError("the prompt is empty")
        if len(ids) >= self.n_ctx:
            raise RequestError(f"the prompt is {len(ids)} tokens; this model's context holds {self.n_ctx}")
        s = job.sampling
        room = self.n_ctx - len(ids)
        limit = min(s.max_tokens, room)
        grammar = self._grammar(s.guided_json)
        self.llm.set_seed(s.seed if s.seed is not None else random.getrandbits(31))
        # The prompt is evaluated here, from the longest saved prefix and in the same pieces
        # whatever was saved (prefix_cache.py), so generate() finds it whole and samples at once.
        # Left to itself, llama-cpp-python would reuse whatever prefix the last request left in
        # the context and evaluate the rest in other batch splits, and greedy decoding could then
        # tie-break another way.
        cached = self._evaluate(ids, boundary(starts, len(ids)), job)
        # min_p 0 and typical_p 1: no sampling OpenAI does not do; top_k <= 0 is off in llama.cpp.
        tokens = self.llm.generate(ids, top_k=s.top_k if s.top_k > 0 else 0, top_p=s.top_p, min_p=0.0, typical_p=1.0,
                                   temp=s.temperature, repeat_penalty=s.repetition_penalty,
                                   frequency_penalty=s.frequency_penalty, presence_penalty=s.presence_penalty,
                                   grammar=grammar, reset=True)
        decoder, scanner = Utf8Pieces(), StopScanner(job.stops)
        marks = LogprobMarks() if s.logprobs is not None else None
        generated, finish = 0, "length"
        self._context_tokens = len(ids)

        def step(text: str, reason: str | None = None) -> Step:
            events = (self.cache.events.since(job.kv_cursor, self.queued.value + self.active.value)
                      if reason is not None and job.kv_cursor is not None else "")
            return Step(text, generated, len(ids), reason, marks.take(len(text), reason is not None) if marks else (),
                        cached, events)

        try:
            for token in tokens:
                if job.cancelled():
                    finish = "cancelled"
                    break
                if self._end_of_generation(token):
                    finish = "stop"
                    break
                generated += 1
                self._context_tokens = len(ids) + generated
                piece = decoder.push(self.llm.detokenize([token], prev_tokens=ids))
                if marks is not None:
                    marks.add(self._logprob(token, s.logprobs or 0), len(piece))
                text = scanner.push(piece)
                if scanner.stopped:
                    job.emit(step(text, "stop"))
                    return
                if text:
                    job.emit(step(text))
                if generated >= limit:
                    break
        finally:
            tokens.close()
        rest = scanner.push(decoder.flush())
        if scanner.stopped:
            job.emit(step(rest, "stop"))
            return
        job.emit(step(rest + scanner.flush(), finish))

    def _evaluate(self, ids: list[int], cut: int, job: Job | None = None) -> int:
        """Put the prompt `ids` in the context: from the longest saved prefix, then up to `cut`
        (where its last message begins) and the rest, saving a state at each (named by the job's
        prefix keys: prefix_cache.py); the prompt tokens that came from a saved state."""
        import llama_cpp

        self.llm.reset()
        self.llm._ctx.kv_cache_clear()
        scope = job.cache_salt if job is not None else ""
        done, state = self.cache.longest(ids, scope)
        if state is not None:
            size = len(state)
            if llama_cpp.llama_state_seq_set_data(self.llm._ctx.ctx, (ctypes.c_uint8 * size).from_buffer_copy(state),
                                                  size, 0) != size:
                self.llm._ctx.kv_cache_clear()
                done = 0
            else:
                self.llm.input_ids[:done] = ids[:done]
                self.llm.n_tokens = done
        for end, kind in ((cut, BOUNDARY), (len(ids), END)):
            if end > self.llm.n_tokens:
                self.llm.eval(ids[self.llm.n_tokens:end])
                self._context_tokens = end
                if self.cache.wants(ids[:end], scope):
                    size = llama_cpp.llama_state_seq_get_size(self.llm._ctx.ctx, 0)
                    buffer = (ctypes.c_uint8 * size)()
                    written = llama_cpp.llama_state_seq_get_data(self.llm._ctx.ctx, buffer, size, 0)
                    if 0 < written <= size:
                        self.cache.store(ids[:end], bytes(buffer)[:written], written, kind, _tag(job, kind), scope)
                        continue
            self.cache.name(ids[:end], _tag(job, kind), scope)   # saved already (restored, or for another request)
        return done

    def _logprob(self, token: int, top: int) -> TokenLogprob:
        """`token`'s log probability under the model (its raw distribution, before sampling's
        temperature, penalties or grammar), and the `top` most likely tokens at its place: read from
        the logits of the position that produced it, which are the context's last until the next
        token is evaluated."""
        import numpy as np

        n_vocab = self.llm.n_vocab()
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits_ith(-1), shape=(n_vocab,))
        logprobs = self.llm.logits_to_logprobs(logits)
        best: tuple[tuple[str, float], ...] = ()
        if top > 0:
            ids = np.argpartition(-logprobs, top)[:top]
            ids = ids[np.argsort(-logprobs[ids])]
            best = tuple((self._text_of(int(i)), float(logprobs[i])) for i in ids)
        return TokenLogprob(self._text_of(token), float(logprobs[token]), best)

    def _text_of(self, token: int) -> str:
        return self.llm.detokenize([token], special=False).decode("utf-8", "replace")


def _tag(job: Job | None, kind: str) -> tuple[str, int] | None:
    return tag(job.prefix_keys, job.prefix_boundary, kind) if job is not None else None


class LogprobMarks:
    """The log probabilities of generated tokens, handed out with the text they made: a step's
    text may hold back the tail that could begin a stop string, so each token's entry goes out
    once the text up to its end has gone out (all that began, with the last step)."""

    def __init__(self) -> None:
        self._pending: list[tuple[TokenLogprob, int, int]] = []   # (entry, start, end) in characters
        self._made = 0          # characters the tokens have made
        self._sent = 0          # characters sent

    def add(self, entry: TokenLogprob, length: int) -> None:
        self._pending.append((entry, self._made, self._made + length))
        self._made += length

    def take(self, sent: int, last: bool) -> tuple[TokenLogprob, ...]:
        self._sent += sent
        if last:
            out = tuple(e for e, start, end in self._pending if start < self._sent or end == start)
            self._pending = []
            return out
        n = 0
        while n < len(self._pending) and self._pending[n][2] <= self._sent:
            n += 1
        out = tuple(e for e, _, _ in self._pending[:n])
        del self._pending[:n]
        return out
