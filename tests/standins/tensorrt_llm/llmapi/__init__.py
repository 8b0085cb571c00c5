"""tensorrt_llm.llmapi of the stand-in (tests/standins/README.md)."""

from __future__ import annotations


class GuidedDecodingParams:
    def __init__(self, *, json=None, regex=None, grammar=None, json_object=False, structural_tag=None):
        chosen = [x for x in (json, regex, grammar, structural_tag) if x is not None] + ([1] if json_object else [])
        if len(chosen) > 1:
            raise ValueError("Only one of the fields could be effective")
        self.json, self.regex, self.grammar, self.json_object, self.structural_tag = \
            json, regex, grammar, json_object, structural_tag


class KvCacheConfig:
    def __init__(self, *, enable_block_reuse=True, max_tokens=None, max_attention_window=None,
                 sink_token_length=None, free_gpu_memory_fraction=0.9, host_cache_size=None,
                 onboard_blocks=True, cross_kv_cache_fraction=None, secondary_offload_min_priority=None,
                 event_buffer_max_size=0, enable_partial_reuse=True, copy_on_partial_reuse=True,
                 use_uvm=False, dtype="auto", tokens_per_block=32):
        self.free_gpu_memory_fraction = free_gpu_memory_fraction
        self.dtype = dtype
        self.enable_block_reuse = enable_block_reuse
        self.event_buffer_max_size = event_buffer_max_size
        self.tokens_per_block = tokens_per_block
