"""The GPU engine: TensorRT-LLM's LLM API on its PyTorch backend (TensorRT-LLM 1.2.1 in Triton's
26.07 trtllm-python-py3 image).

Every name used here is the LLM API's, as documented for 1.2.1 (nvidia.github.io/TensorRT-LLM/
1.2.1/llm-api/reference.html) and driven through those names in tests/test_trtllm_engine.py:
- `LLM(model=<checkpoint folder>, backend="pytorch", tensor_parallel_size=..., ...)`, its other
  arguments from model.yaml's `llm_args` (TorchLlmArgs: max_batch_size, max_num_tokens,
  max_seq_len, kv_cache_config, enable_iter_perf_stats, guided_decoding_backend, ...);
  a pre-quantized ModelOpt checkpoint (FP8, NVFP4, INT4-AWQ) is recognised from its own config;
- `LLM.tokenizer` (a TransformersTokenizer; `.tokenizer` is the Hugging Face one), used to
  tokenize the prompt pieces with `split_special_tokens=True` for user text;
- `LLM.generate_async(prompt_token_ids, SamplingParams(...), streaming=True)` -> an async
  iterator of RequestOutput (`finished`, `outputs[0]` a CompletionOutput: `text_diff`,
  `token_ids`, `finish_reason` in stop | length | timeout | cancelled), `.abort()`;
- `SamplingParams(max_tokens, temperature, top_p, top_k, seed, stop, stop_token_ids,
  include_stop_str_in_output, presence_penalty, frequency_penalty, repetition_penalty,
  guided_decoding=GuidedDecodingParams(json=..., json_object=...))`;
- `LLM.get_stats(timeout)`: iteration statistics (with `enable_iter_perf_stats`): dicts with
  numQueuedRequests, numActiveRequests and kvCacheStats {usedNumBlocks, maxNumBlocks}.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

from .engine import Counter, Job, RequestError, Stats, Step

log = logging.getLogger(__name__)

STATS_PERIOD_S = 1.0


class TrtllmEngine:
    name = "trtllm"

    def __init__(self, model_dir: str, llm_args: dict[str, Any], stop_token_ids: list[int] | None = None):
        from tensorrt_llm import LLM
        from tensorrt_llm.llmapi import KvCacheConfig

        args = dict(llm_args)
        if isinstance(args.get("kv_cache_config"), dict):
            args["kv_cache_config"] = KvCacheConfig(**args["kv_cache_config"])
        # Never code from the checkpoint (the API refuses ChatGLM/Baichuan sources by name for it).
        self.llm = LLM(model=model_dir, **{**args, "trust_remote_code": False})
        self.hf_tokenizer = getattr(self.llm.tokenizer, "tokenizer", self.llm.tokenizer)
        self.stop_token_ids = list(stop_token_ids or [])
        self.received = Counter()   # submitted, not yet seen by the engine's statistics
        self._stats = Stats(0, 0, 0.0)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="trtllm", daemon=True)
        self._thread.start()
        self._stopping = threading.Event()
        self._stats_thread = threading.Thread(target=self._poll_stats, name="trtllm-stats", daemon=True)
        self._stats_thread.start()

    def tokenize(self, pieces: Any) -> list[int]:
        ids: list[int] = []
        for piece in pieces:
            ids += self.hf_tokenizer.encode(piece.text, add_special_tokens=False,
                                            split_special_tokens=not piece.trusted)
        return ids

    def sampling_params(self, job: Job) -> Any:
        from tensorrt_llm import SamplingParams
        from tensorrt_llm.llmapi import GuidedDecodingParams

        s = job.sampling
        kwargs: dict[str, Any] = {
            "max_tokens": s.max_tokens, "stop": list(job.stops) or None,
            "stop_token_ids": self.stop_token_ids or None, "include_stop_str_in_output": False,
            "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
            "repetition_penalty": s.repetition_penalty, "seed": s.seed, "detokenize": True,
        }
        if s.greedy:
            kwargs["top_k"] = 1          # greedy: the one most likely token
        else:
            kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or None)
        if s.guided_json is not None:
            schema = json.loads(s.guided_json)
            kwargs["guided_decoding"] = (GuidedDecodingParams(json_object=True) if schema == {}
                                         else GuidedDecodingParams(json=schema))
        return SamplingParams(**{k: v for k, v in kwargs.items() if v is not None})

    # -- the Engine interface ----------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        self.received.add(1)
        asyncio.run_coroutine_threadsafe(self._run(job), self._loop)

    def stats(self) -> Stats:
        return self._stats

    def shutdown(self) -> None:
        self._stopping.set()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self.llm.shutdown()

    # -- internals -------------------------------------------------------------------------------------

    async def _run(self, job: Job) -> None:
        counted = True
        try:
            ids = self.tokenize(job.prompt)
            params = self.sampling_params(job)
            result = self.llm.generate_async(ids, params, streaming=True)
            self.received.add(-1)
            counted = False
            async for out in result:
                if job.cancelled() and not out.finished:
                    result.abort()
                    continue
                o = out.outputs[0]
                reason = None
                if out.finished:
                    reason = {"stop": "stop", "length": "length"}.get(o.finish_reason or "", "cancelled")
                if o.text_diff or reason is not None:
                    job.emit(Step(o.text_diff, len(o.token_ids), len(ids), reason))
        except ValueError as e:   # the LLM API refuses what it cannot do (a prompt past max_seq_len, ...)
            job.fail(RequestError(str(e)))
        except Exception as e:  # noqa: BLE001 - reported to the request
            job.fail(e)
        finally:
            if counted:
                self.received.add(-1)

    def _poll_stats(self) -> None:
        while not self._stopping.wait(STATS_PERIOD_S):
            try:
                entries = self.llm.get_stats(timeout=STATS_PERIOD_S)
            except Exception as e:  # noqa: BLE001 - statistics are best effort
                log.debug("get_stats failed: %s", e)
                continue
            if not entries:
                continue
            last = entries[-1] if isinstance(entries[-1], dict) else json.loads(entries[-1])
            kv = last.get("kvCacheStats") or {}
            used, total = kv.get("usedNumBlocks") or 0, kv.get("maxNumBlocks") or 0
            self._stats = Stats(queued=int(last.get("numQueuedRequests") or 0) + self.received.value,
                                active=int(last.get("numActiveRequests") or 0),
                                kv_cache_utilization=used / total if total else 0.0)
