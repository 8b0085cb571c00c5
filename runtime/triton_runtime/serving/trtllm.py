"""The GPU engine: TensorRT-LLM's LLM API on its PyTorch backend (TensorRT-LLM 1.2.1 in Triton's
26.07 trtllm-python-py3 image).

Every name used here is the LLM API's, as documented for 1.2.1 (nvidia.github.io/TensorRT-LLM/
1.2.1/llm-api/reference.html) and driven through those names in tests/test_trtllm_engine.py:
- `LLM(model=<checkpoint folder>, tensor_parallel_size=..., ...)` (the PyTorch backend), its other
  arguments from model.yaml's `llm_args` (TorchLlmArgs: max_batch_size, max_num_tokens,
  max_seq_len, kv_cache_config, enable_iter_perf_stats, guided_decoding_backend, ...);
  a pre-quantized ModelOpt checkpoint (FP8, NVFP4, INT4-AWQ) is recognised from its own config;
- `LLM.tokenizer` (a TransformersTokenizer; `.tokenizer` is the Hugging Face one), used to
  tokenize the prompt pieces with `split_special_tokens=True` for user text;
- `LLM.generate_async(prompt_token_ids, SamplingParams(...), streaming=True, cache_salt=...)` -> an
  async iterator of RequestOutput (`cache_salt`: the request's KV blocks are reused only by
  requests of the same salt, the gateway's API key's) (`finished`, `outputs[0]` a CompletionOutput: `text_diff`,
  `token_ids`, `finish_reason` in stop | length | timeout | cancelled), `.abort()`;
- `SamplingParams(max_tokens, temperature, top_p, top_k, stop, stop_token_ids,
  include_stop_str_in_output, detokenize, guided_decoding=GuidedDecodingParams(json=...) or
  GuidedDecodingParams(json_object=True), logprobs=K)` (one guide only: two raise);
- with `logprobs`, CompletionOutput's `logprobs_diff`: for each new token (`token_ids_diff`) a dict
  {token id: Logprob(logprob, rank)} of the most likely tokens at its place;
- `LLM.get_stats(timeout)`: iteration statistics (with `enable_iter_perf_stats`): dicts with
  numQueuedRequests, numActiveRequests and kvCacheStats {usedNumBlocks, maxNumBlocks};
- `LLM.get_kv_cache_events(timeout)` (with `KvCacheConfig(enable_block_reuse=True,
  event_buffer_max_size=N)`, blocks of `KvCacheConfig.tokens_per_block` tokens, 32 by default):
  the blocks the cache stored and removed, as kv_events.BlockNames reads them; a request that
  carried the router's prefix keys gets them back, named, on its last response.

What the names do not say, read from NVIDIA/TensorRT-LLM's sources of the 1.1-1.3 series
(tensorrt_llm/executor/result.py, executor.py, sampling_params.py; the v1.2.1 tag itself could
not be read here):
- `get_stats` drains a queue until it has been quiet for `timeout` seconds, then returns [] until
  the next `generate_async`: it is polled with a short timeout, and an empty answer while
  requests are in flight keeps the last figures instead of reading as idle;
- a stop string found while streaming cuts `text` back, but characters of it already sent as
  `text_diff` stay sent: the stop strings are also held back here (text.StopScanner), and a
  held tail is dropped when `stop_reason` says a stop string ended the answer;
- the default sampler of 1.2.x has one seed for the whole engine and applies no presence,
  frequency or repetition penalty (per-request seeds and penalties came in later releases):
  requests asking for them are refused with a reason rather than silently answered without them;
- token ids must be plain `int`s and a prompt may not be empty.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

from .engine import Counter, Job, RequestError, Sampling, Stats, Step, TokenLogprob, tokenize_pieces
from .kv_events import BOUNDARY, END, BlockNames, tag
from .prefix_cache import boundary
from .text import StopScanner

log = logging.getLogger(__name__)

STATS_PERIOD_S = 0.5    # how often the statistics are read
STATS_QUIET_S = 0.05    # get_stats returns once no new iteration arrived for this long


class TrtllmEngine:
    name = "trtllm"

    def __init__(self, model_dir: str, llm_args: dict[str, Any], stop_token_ids: list[int] | None = None):
        from tensorrt_llm import LLM
        from tensorrt_llm.llmapi import KvCacheConfig

        args = dict(llm_args)
        kv = args.get("kv_cache_config") if isinstance(args.get("kv_cache_config"), dict) else {}
        if isinstance(args.get("kv_cache_config"), dict):
            args["kv_cache_config"] = KvCacheConfig(**args["kv_cache_config"])
        # What the KV cache holds, named for the router, when the engine keeps its events.
        self.names = (BlockNames(int(kv.get("tokens_per_block", 32)))
                      if kv.get("event_buffer_max_size", 0) > 0 and kv.get("enable_block_reuse", True) else None)
        self._names_lock = threading.Lock()
        # Never code from the checkpoint (the API refuses ChatGLM/Baichuan sources by name for it).
        self.llm = LLM(model=model_dir, **{**args, "trust_remote_code": False})
        self.hf_tokenizer = getattr(self.llm.tokenizer, "tokenizer", self.llm.tokenizer)
        # The tokenizer's own rule for BOS: what it adds to an empty text (prompts are encoded
        # piece by piece without special tokens, and with_bos puts it back once).
        self.bos_id = getattr(self.hf_tokenizer, "bos_token_id", None)
        self.adds_bos = self.bos_id is not None and self.bos_id in self.hf_tokenizer.encode("", add_special_tokens=True)
        self.stop_token_ids = list(stop_token_ids or [])
        self.received = Counter()   # submitted, not yet seen by the engine's statistics
        self.outstanding = Counter()  # submitted, not finished
        self._stats = Stats(0, 0, 0.0)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="trtllm", daemon=True)
        self._thread.start()
        self._stopping = threading.Event()
        self._submitted = threading.Event()   # a request reached the LLM API: it has statistics
        self._stats_thread = threading.Thread(target=self._poll_stats, name="trtllm-stats", daemon=True)
        self._stats_thread.start()

    def tokenize(self, pieces: Any) -> list[int]:
        return self._tokenize(pieces)[0]

    def _tokenize(self, pieces: Any) -> tuple[list[int], int]:
        """The prompt's tokens, and where its last message begins in them (prefix_cache.boundary)."""
        ids, starts = tokenize_pieces(pieces, lambda piece: self.hf_tokenizer.encode(
            piece.text, add_special_tokens=False, split_special_tokens=not piece.trusted), self.bos_id, self.adds_bos)
        return ids, boundary(starts, len(ids))

    def _told(self, job: Job, ids: list[int], cut: int) -> str:
        """On a request's last step: its prompt's prefixes named (they are in the cache now), and
        the events since its reader's cursor ("" when it reads none, or the engine keeps none)."""
        if self.names is None:
            return ""
        with self._names_lock:
            if job.prefix_keys:
                self.names.finished(ids, ((cut, tag(job.prefix_keys, job.prefix_boundary, BOUNDARY)),
                                          (len(ids), tag(job.prefix_keys, job.prefix_boundary, END))))
            return self.names.events.since(job.kv_cursor, self.outstanding.value) if job.kv_cursor is not None else ""

    @staticmethod
    def refusal(sampling: Sampling) -> str | None:
        """Why this engine cannot honour a request's sampling as asked (None: it can)."""
        s = sampling
        if s.seed is not None:
            return ("seed: TensorRT-LLM 1.2's sampler has one seed for the whole engine, so a request's seed would "
                    "not be honoured; omit it (temperature 0 gives repeatable answers)")
        for name, value, neutral in (("presence_penalty", s.presence_penalty, 0.0),
                                     ("frequency_penalty", s.frequency_penalty, 0.0),
                                     ("repetition_penalty", s.repetition_penalty, 1.0)):
            if value != neutral:
                return f"{name}: TensorRT-LLM 1.2's sampler does not apply it; omit it"
        return None

    def sampling_params(self, job: Job) -> Any:
        from tensorrt_llm import SamplingParams
        from tensorrt_llm.llmapi import GuidedDecodingParams

        s = job.sampling
        kwargs: dict[str, Any] = {
            "max_tokens": s.max_tokens, "stop": list(job.stops) or None,
            "stop_token_ids": self.stop_token_ids or None, "include_stop_str_in_output": False,
            "detokenize": True,
        }
        if s.greedy:
            kwargs["top_k"] = 1          # greedy: the one most likely token
        else:
            kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or None)
        if s.logprobs is not None:
            kwargs["logprobs"] = s.logprobs
        if s.guided_json is not None:
            schema = json.loads(s.guided_json)
            kwargs["guided_decoding"] = (GuidedDecodingParams(json_object=True) if schema == {}
                                         else GuidedDecodingParams(json=schema))
        return SamplingParams(**{k: v for k, v in kwargs.items() if v is not None})

    def logprobs(self, output: Any, top: int) -> tuple[TokenLogprob, ...]:
        """The new tokens' log probabilities and their `top` alternatives, from the LLM API's
        logprobs_diff (a token the API did not list among its alternatives reads -9999, as OpenAI
        writes a token too unlikely to rank)."""
        ids = list(getattr(output, "token_ids_diff", None) or [])
        entries = list(getattr(output, "logprobs_diff", None) or [])
        out = []
        for token, ranked in zip(ids, entries):
            ranked = ranked if isinstance(ranked, dict) else {}
            best = sorted(ranked.items(), key=lambda kv: -kv[1].logprob)[:top]
            mine = ranked.get(token)
            out.append(TokenLogprob(self._text_of(token), float(mine.logprob) if mine is not None else -9999.0,
                                    tuple((self._text_of(t), float(lp.logprob)) for t, lp in best)))
        return tuple(out)

    def _text_of(self, token: int) -> str:
        return str(self.hf_tokenizer.decode([int(token)]))

    # -- the Engine interface ----------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        if self.names is not None:
            self.names.events.begin(tag(job.prefix_keys, job.prefix_boundary, BOUNDARY))
        self.received.add(1)
        self.outstanding.add(1)
        asyncio.run_coroutine_threadsafe(self._run(job), self._loop)

    def stats(self) -> Stats:
        return self._stats

    def kv_events(self, cursor: str) -> str:
        if self.names is None:
            return ""
        with self._names_lock:
            return self.names.events.since(cursor, self.outstanding.value)

    def shutdown(self) -> None:
        self._stopping.set()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self.llm.shutdown()

    # -- internals -------------------------------------------------------------------------------------

    async def _run(self, job: Job) -> None:
        counted = True
        try:
            why = self.refusal(job.sampling)
            if why:
                raise RequestError(why)
            ids, cut = self._tokenize(job.prompt)
            ids = [int(t) for t in ids]
            if not ids:
                raise RequestError("the prompt is empty")
            params = self.sampling_params(job)
            result = self.llm.generate_async(ids, params, streaming=True, cache_salt=job.cache_salt or None)
            self._submitted.set()
            self.received.add(-1)
            counted = False
            scanner = StopScanner(job.stops)
            async for out in result:
                if job.cancelled() and not out.finished:
                    result.abort()
                    continue
                o = out.outputs[0]
                marks = self.logprobs(o, job.sampling.logprobs) if job.sampling.logprobs is not None else ()
                text = scanner.push(o.text_diff or "")
                if scanner.stopped and not out.finished:   # ours saw the stop first: end it here
                    result.abort()
                    job.emit(Step(text, len(o.token_ids), len(ids), "stop", marks,
                                  kv_events=self._told(job, ids, cut)))
                    return
                if out.finished:
                    reason = {"stop": "stop", "length": "length"}.get(o.finish_reason or "", "cancelled")
                    # A stop string ended it: what is held back is the start of that string.
                    held = "" if scanner.stopped or isinstance(getattr(o, "stop_reason", None), str) else scanner.flush()
                    job.emit(Step(text + held, len(o.token_ids), len(ids), reason, marks,
                                  kv_events=self._told(job, ids, cut)))
                    return
                if text or marks:
                    job.emit(Step(text, len(o.token_ids), len(ids), logprobs=marks))
        except ValueError as e:   # the LLM API refuses what it cannot do (a prompt past max_seq_len, ...)
            job.fail(e if isinstance(e, RequestError) else RequestError(str(e)))
        except Exception as e:  # noqa: BLE001 - reported to the request
            job.fail(e)
        finally:
            self.outstanding.add(-1)
            if counted:
                self.received.add(-1)
            if self.names is not None:
                self.names.events.end(tag(job.prefix_keys, job.prefix_boundary, BOUNDARY))

    def _poll_stats(self) -> None:
        while not self._stopping.wait(STATS_PERIOD_S):
            if not self._submitted.is_set():
                # Before the first generate_async, get_stats prints a warning on every call
                # ("Iteration statistics are not available yet ..."): with nothing submitted the
                # figures are idle anyway.
                continue
            try:
                # Drains what is queued, returning once the queue has been quiet for the timeout.
                entries = self.llm.get_stats(timeout=STATS_QUIET_S)
            except Exception as e:  # noqa: BLE001 - statistics are best effort
                log.debug("get_stats failed: %s", e)
                continue
            self._stats = self.figures(entries, self._stats, self.received.value, self.outstanding.value)
            if self.names is not None:
                try:
                    events = self.llm.get_kv_cache_events(timeout=STATS_QUIET_S)
                    with self._names_lock:
                        self.names.apply(events)
                except Exception as e:  # noqa: BLE001 - routing hints are best effort
                    log.debug("get_kv_cache_events failed: %s", e)

    @staticmethod
    def figures(entries: list[Any], last: Stats, received: int, outstanding: int) -> Stats:
        """Queue, batch and KV-cache figures from one drain of iteration statistics. Nothing new
        while requests are in flight (get_stats answers [] between submissions): the last batch
        figure stands and the queue is what of ours is not in it; nothing in flight: idle."""
        if not entries:
            if outstanding <= 0:
                return Stats(0, 0, 0.0)
            active = min(last.active, outstanding)
            return Stats(queued=max(0, outstanding - active), active=active,
                         kv_cache_utilization=last.kv_cache_utilization)
        latest = entries[-1] if isinstance(entries[-1], dict) else json.loads(entries[-1])
        kv = latest.get("kvCacheStats") or {}
        used, total = kv.get("usedNumBlocks") or 0, kv.get("maxNumBlocks") or 0
        return Stats(queued=int(latest.get("numQueuedRequests") or 0) + received,
                     active=int(latest.get("numActiveRequests") or 0),
                     kv_cache_utilization=used / total if total else 0.0)
