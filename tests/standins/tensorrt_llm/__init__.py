"""A stand-in for TensorRT-LLM 1.2.1's LLM API (tests/standins/README.md): the signatures are the
documented ones (nvidia.github.io/TensorRT-LLM/1.2.1/llm-api/reference.html; research notes in
the commit that added it); generation is scripted by the test through `LLM.script`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from .llmapi import GuidedDecodingParams, KvCacheConfig

__version__ = "1.2.1"

# TorchLlmArgs fields the operator's model.yaml may pass (a subset of the documented ones).
TORCH_LLM_ARGS = frozenset({
    "backend", "max_batch_size", "max_num_tokens", "max_seq_len", "max_beam_width", "kv_cache_config",
    "enable_iter_perf_stats", "guided_decoding_backend", "enable_chunked_prefill", "pipeline_parallel_size",
    "gpus_per_node", "enable_attention_dp",
})


class SamplingParams:
    def __init__(self, *, end_id=None, pad_id=None, max_tokens=32, bad=None, bad_token_ids=None, stop=None,
                 stop_token_ids=None, include_stop_str_in_output=False, embedding_bias=None, logits_processor=None,
                 n=1, best_of=None, use_beam_search=False, top_k=None, top_p=None, top_p_min=None,
                 top_p_reset_ids=None, top_p_decay=None, seed=None, temperature=None, min_tokens=None,
                 beam_search_diversity_rate=None, repetition_penalty=None, presence_penalty=None,
                 frequency_penalty=None, length_penalty=None, early_stopping=None, no_repeat_ngram_size=None,
                 min_p=None, beam_width_array=None, logprobs=None, prompt_logprobs=None,
                 return_context_logits=False, return_generation_logits=False, exclude_input_from_output=True,
                 return_encoder_output=False, return_perf_metrics=False, additional_model_outputs=None,
                 lookahead_config=None, guided_decoding: GuidedDecodingParams | None = None, ignore_eos=False,
                 detokenize=True, add_special_tokens=True, truncate_prompt_tokens=None, skip_special_tokens=True,
                 spaces_between_special_tokens=True):
        given = dict(locals())
        given.pop("self")
        self.__dict__.update(given)
        if guided_decoding is not None and not isinstance(guided_decoding, GuidedDecodingParams):
            raise TypeError("guided_decoding must be a GuidedDecodingParams")


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass
class CompletionOutput:
    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    text_diff: str = ""
    stop_reason: int | str | None = None
    token_ids_diff: list[int] = field(default_factory=list)
    logprobs_diff: list[dict[int, Logprob]] = field(default_factory=list)


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool


class GenerationResult:
    """What generate_async returns: an async iterator of RequestOutput, with abort()."""

    def __init__(self, llm: "LLM", request_id: int, ids: list[int], params: SamplingParams, pieces: list[str]):
        self.llm, self.request_id, self.ids, self.params, self.pieces = llm, request_id, ids, params, pieces
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True
        self.llm.aborted.append(self.request_id)

    def __aiter__(self):
        return self._outputs()

    async def _outputs(self):
        """As the detokenizing result does: text grows by each piece; a stop string found cuts the
        text back to before it (what was already sent as text_diff stays sent) and ends the
        request with finish_reason 'stop' and stop_reason the string."""
        text, tokens = "", []
        limit = self.params.max_tokens
        stops = [self.params.stop] if isinstance(self.params.stop, str) else list(self.params.stop or [])
        for i, piece in enumerate(self.pieces):
            await asyncio.sleep(self.llm.token_seconds)
            if self.aborted:
                yield RequestOutput(self.request_id, self.ids,
                                    [CompletionOutput(0, text, list(tokens), "cancelled", "")], True)
                return
            tokens.append(1000 + i)
            grown = text + piece
            found = min(((grown.find(s), s) for s in stops if grown.find(s) >= 0), default=None)
            if found is not None:
                cut = grown[:found[0]]
                yield RequestOutput(self.request_id, self.ids, [CompletionOutput(
                    0, cut, list(tokens), "stop", cut[len(text):], found[1])], True)
                return
            diff, text = piece, grown
            last = i == len(self.pieces) - 1 or len(tokens) >= limit
            reason = ("length" if len(tokens) >= limit and i < len(self.pieces) - 1 else "stop") if last else None
            # with logprobs=K: the K most likely tokens at the place (the scripted one first, at
            # -0.1 - 0.01 i; the others less likely), as a dict {token id: Logprob}
            ranked = ({tokens[-1]: Logprob(-0.1 - 0.01 * i, 1), **{7000 + k: Logprob(-3.0 - k, k + 2)
                                                                  for k in range(max(0, self.params.logprobs - 1))}}
                      if self.params.logprobs is not None else None)
            yield RequestOutput(self.request_id, self.ids,
                                [CompletionOutput(0, text, list(tokens), reason, diff,
                                                  2 if reason == "stop" else None, [tokens[-1]],
                                                  [ranked] if ranked is not None else [])], last)
            if last:
                return


class _Tokenizer:
    """Hugging Face's tokenizer as TransformersTokenizer.tokenizer: one id per character, and
    '<|eot|>' one special id unless split_special_tokens."""

    bos_token_id = 1
    adds_bos = True     # as Llama 3's tokenizer: encode(..., add_special_tokens=True) starts with BOS

    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)

    def encode(self, text: str, *, add_special_tokens: bool = True, split_special_tokens: bool = False) -> list[int]:
        ids: list[int] = [self.bos_token_id] if add_special_tokens and self.adds_bos else []
        while text:
            if not split_special_tokens and text.startswith("<|eot|>"):
                ids.append(2)
                text = text[len("<|eot|>"):]
            elif not split_special_tokens and text.startswith("<|bos|>"):
                ids.append(self.bos_token_id)
                text = text[len("<|bos|>"):]
            else:
                ids.append(ord(text[0]))
                text = text[1:]
        return ids


class _TransformersTokenizer:
    def __init__(self) -> None:
        self.tokenizer = _Tokenizer()


class LLM:
    instances: list["LLM"] = []
    script: list[str] = ["Paris", " is", " the", " capital", "."]   # the pieces every request generates
    refuse_longer_than: int | None = None                              # prompt tokens past it: ValueError

    def __init__(self, model: str, tokenizer=None, tokenizer_mode="auto", skip_tokenizer_init=False,
                 trust_remote_code=False, tensor_parallel_size=1, dtype="auto", revision=None,
                 tokenizer_revision=None, **kwargs: Any):
        unknown = set(kwargs) - TORCH_LLM_ARGS
        if unknown:
            raise TypeError(f"unexpected TorchLlmArgs {sorted(unknown)}")
        if "kv_cache_config" in kwargs and not isinstance(kwargs["kv_cache_config"], KvCacheConfig):
            raise TypeError("kv_cache_config must be a KvCacheConfig")
        self.model, self.trust_remote_code, self.tensor_parallel_size, self.dtype = \
            model, trust_remote_code, tensor_parallel_size, dtype
        self.kwargs = kwargs
        self.tokenizer = _TransformersTokenizer()
        self.requests: list[tuple[list[int], SamplingParams, bool]] = []
        self.aborted: list[int] = []
        self.salts: list[str | None] = []     # each request's cache_salt
        self.stats: list[dict] = []
        self.warnings = 0      # get_stats calls made before any request was submitted
        self.token_seconds = 0.001
        self.shut = False
        LLM.instances.append(self)

    def generate_async(self, inputs, sampling_params: SamplingParams | None = None, lora_request=None,
                       prompt_adapter_request=None, streaming: bool = False, kv_cache_retention_config=None,
                       disaggregated_params=None, postproc_params=None, scheduling_params=None,
                       cache_salt=None, trace_headers=None) -> GenerationResult:
        if not isinstance(sampling_params, SamplingParams):
            raise TypeError("sampling_params must be a SamplingParams")
        if self.refuse_longer_than is not None and len(inputs) > self.refuse_longer_than:
            raise ValueError(f"The sum of prompt length ({len(inputs)}) and query length (0) should not exceed "
                             f"max_num_tokens ({self.refuse_longer_than})")
        self.requests.append((list(inputs), sampling_params, streaming))
        self.salts.append(cache_salt)
        self._store_blocks(list(inputs))
        return GenerationResult(self, len(self.requests), list(inputs), sampling_params, list(self.script))

    def get_stats(self, timeout: float | None = 2) -> list[dict]:
        if not self.requests:
            # As upstream (llmapi/llm.py): no statistics before the first submission, and a line
            # printed on every such call.
            self.warnings += 1
            print("Iteration statistics are not available yet. To collect runtime statistics, please call "
                  "get_stats() AFTER prompts have been submitted.")
            return []
        out, self.stats = self.stats, []
        return out

    # -- KV cache events (KvCacheConfig(enable_block_reuse=True, event_buffer_max_size=N > 0)) ------------

    def _kv_config(self) -> KvCacheConfig | None:
        return self.kwargs.get("kv_cache_config")

    def _store_blocks(self, ids: list[int]) -> None:
        """As the engine's prefill stores a prompt's full blocks (not its last token's partial one)
        in its radix tree, reporting only the blocks new to it, chained by parent_hash (None at
        the root), each hash a 64-bit unsigned int."""
        config = self._kv_config()
        if config is None or not config.enable_block_reuse or config.event_buffer_max_size <= 0:
            return
        per = config.tokens_per_block
        tree = self.__dict__.setdefault("_tree", {})
        parent, first_parent, new = None, None, []
        for i in range((len(ids) - 1) // per):
            tokens = tuple(ids[i * per:(i + 1) * per])
            h = tree.get((parent, tokens))
            if h is None:
                if not new:
                    first_parent = parent
                h = tree[(parent, tokens)] = hash((parent, tokens, "block")) & ((1 << 64) - 1)
                new.append({"type": "stored_block", "block_hash": h, "tokens": [
                    {"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in tokens],
                    "cache_level": 0, "priority": 35})
            parent = h
        if new:
            self._kv_events().append({"event_id": len(self._kv_events()), "window_size": per * 1024, "data": {
                "type": "stored", "parent_hash": first_parent, "blocks": new}})

    def _kv_events(self) -> list[dict]:
        return self.__dict__.setdefault("_events", [])

    def evict(self, hashes: list[int]) -> None:
        """The test's hand on the engine's evictions: these blocks leave the tree."""
        tree = self.__dict__.setdefault("_tree", {})
        for key in [k for k, h in tree.items() if h in hashes]:
            del tree[key]
        self._kv_events().append({"event_id": len(self._kv_events()), "window_size": 32768,
                                  "data": {"type": "removed", "block_hashes": list(hashes)}})

    def get_kv_cache_events(self, timeout: float | None = 2) -> list[dict]:
        config = self._kv_config()
        if config is None or config.event_buffer_max_size <= 0:
            raise RuntimeError("KV cache events need KvCacheConfig.event_buffer_max_size > 0")
        out, self.__dict__["_events"] = self._kv_events(), []
        return out

    def shutdown(self) -> None:
        self.shut = True


__all__ = ["LLM", "SamplingParams", "GuidedDecodingParams", "KvCacheConfig"]
