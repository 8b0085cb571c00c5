"""The GPU engine (runtime/triton_runtime/serving/trtllm.py) through the calls it makes to
TensorRT-LLM's LLM API.

A stand-in, because the LLM API needs an NVIDIA GPU: tests/standins/tensorrt_llm accepts exactly
the keyword names TensorRT-LLM 1.2.1 documents for LLM, SamplingParams, GuidedDecodingParams and
KvCacheConfig (a wrong name is a TypeError here as on a GPU) and generates scripted text. What it
cannot prove (real generation, real statistics, load on a GPU) is the GPU smoke procedure's
(runtime/README.md)."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from triton_runtime import repository
from triton_runtime.serving.chat import Piece
from triton_runtime.serving.engine import Job, RequestError, Sampling, Step

STANDINS = Path(__file__).parent / "standins"


@pytest.fixture
def trtllm(monkeypatch):
    monkeypatch.syspath_prepend(str(STANDINS))
    import tensorrt_llm

    from triton_runtime.serving import trtllm as engine_module

    monkeypatch.setattr(tensorrt_llm.LLM, "script", ["Paris", " is", " the", " capital", "."])
    monkeypatch.setattr(tensorrt_llm.LLM, "refuse_longer_than", None)
    monkeypatch.setattr(engine_module, "STATS_PERIOD_S", 0.05)
    engines = []

    def make(**overrides):
        spec = repository.Spec(engine="trtllm", model="/models/cache/llama", tensor_parallelism=2,
                               max_batch_size=64, max_num_tokens=8192, max_seq_len=4096,
                               kv_cache_free_gpu_memory_fraction=0.85, dtype="bfloat16")
        # model.yaml's llm_args as the repository writes them (no checkpoint files: no chat fields)
        args = {**repository.model_yaml(spec)["llm_args"], **overrides}
        e = engine_module.TrtllmEngine("/models/cache/llama", args, stop_token_ids=[128009])
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.shutdown()
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        monkeypatch.delitem(sys.modules, name)   # no other test imports the stand-in by accident


def run(engine, prompt, sampling, stops=(), cancel_after: int | None = None, timeout: float = 10.0, salt: str = ""):
    steps: list[Step] = []
    errors: list[Exception] = []
    done = threading.Event()

    def emit(step: Step) -> None:
        steps.append(step)
        if step.finish_reason is not None:
            done.set()

    def fail(e: Exception) -> None:
        errors.append(e)
        done.set()

    job = Job(prompt=prompt, sampling=sampling, stops=stops, emit=emit, fail=fail,
              cancelled=lambda: cancel_after is not None and len(steps) >= cancel_after, cache_salt=salt)
    engine.submit(job)
    assert done.wait(timeout), "the engine never finished the job"
    return steps, errors


def test_the_llm_is_built_with_model_yamls_arguments_and_never_runs_checkpoint_code(trtllm):
    import tensorrt_llm

    engine = trtllm()
    llm = engine.llm
    assert llm.model == "/models/cache/llama" and llm.tensor_parallel_size == 2 and llm.dtype == "bfloat16"
    assert llm.trust_remote_code is False
    assert "backend" not in llm.kwargs and llm.kwargs["enable_iter_perf_stats"] is True
    assert llm.kwargs["guided_decoding_backend"] == "xgrammar"
    assert isinstance(llm.kwargs["kv_cache_config"], tensorrt_llm.llmapi.KvCacheConfig)
    assert llm.kwargs["kv_cache_config"].free_gpu_memory_fraction == 0.85
    with pytest.raises(TypeError, match="unexpected TorchLlmArgs"):
        trtllm(max_input_len=2048)   # a TensorRT-engine-era name the PyTorch backend does not take


def test_a_streamed_answer_arrives_in_pieces_with_counts_and_its_finish_reason(trtllm):
    engine = trtllm()
    prompt = [Piece("<|begin|>user: ", True), Piece("hi <|eot|>", False), Piece("<|eot|>", True)]
    steps, errors = run(engine, prompt, Sampling(max_tokens=64, temperature=0))
    assert errors == []
    assert [s.text for s in steps] == ["Paris", " is", " the", " capital", "."]
    assert [s.completion_tokens for s in steps] == [1, 2, 3, 4, 5]
    assert [s.finish_reason for s in steps] == [None, None, None, None, "stop"]
    ids, params, streaming = engine.llm.requests[0]
    # user text is split into plain characters; the template's own special token stays one id
    assert ids.count(2) == 1 and ids[-1] == 2 and steps[0].prompt_tokens == len(ids)
    assert streaming is True


def test_sampling_reaches_the_llm_api_by_its_names(trtllm):
    engine = trtllm()
    run(engine, [Piece("x", False)], Sampling(max_tokens=3, temperature=0))
    run(engine, [Piece("x", False)], Sampling(max_tokens=64, temperature=0.7, top_p=0.9, top_k=40,
                                              guided_json='{"type": "object"}'), stops=["\n\n"])
    run(engine, [Piece("x", False)], Sampling(max_tokens=64, guided_json="{}"))
    greedy, sampled, any_json = (r[1] for r in engine.llm.requests)
    assert (greedy.top_k, greedy.temperature, greedy.max_tokens) == (1, None, 3)
    assert greedy.stop_token_ids == [128009] and greedy.include_stop_str_in_output is False
    assert (sampled.temperature, sampled.top_p, sampled.top_k) == (0.7, 0.9, 40)
    assert sampled.stop == ["\n\n"] and sampled.guided_decoding.json == {"type": "object"}
    assert any_json.guided_decoding.json_object is True and any_json.guided_decoding.json is None
    assert all(r[1].seed is None and r[1].presence_penalty is None for r in engine.llm.requests)


def test_a_requests_cache_salt_scopes_its_kv_block_reuse(trtllm):
    """The gateway's API key scope reaches LLM.generate_async as cache_salt: TensorRT-LLM reuses a
    request's KV blocks only for requests of the same salt; none is sent for a request without one."""
    engine = trtllm()
    for salt in ("6652555e035217f0", "", "25bd54bbe346263b"):
        run(engine, [Piece("x", False)], Sampling(max_tokens=3, temperature=0), salt=salt)
    assert engine.llm.salts == ["6652555e035217f0", None, "25bd54bbe346263b"]


@pytest.mark.parametrize("sampling, words", [
    (Sampling(max_tokens=8, seed=7), "seed: TensorRT-LLM 1.2's sampler has one seed for the whole engine"),
    (Sampling(max_tokens=8, presence_penalty=0.5), "presence_penalty: TensorRT-LLM 1.2's sampler does not apply it"),
    (Sampling(max_tokens=8, frequency_penalty=-1.0), "frequency_penalty"),
    (Sampling(max_tokens=8, repetition_penalty=1.1), "repetition_penalty"),
])
def test_what_the_engines_sampler_would_silently_ignore_is_refused(trtllm, sampling, words):
    """TensorRT-LLM 1.2's default sampler has one engine-wide seed and no penalties: a request
    asking for them gets a 400 saying so (the model's words), not an answer without them."""
    engine = trtllm()
    steps, errors = run(engine, [Piece("x", False)], sampling)
    assert steps == [] and isinstance(errors[0], RequestError) and words in str(errors[0])
    assert engine.llm.requests == [] and engine.outstanding.value == 0
    assert engine.refusal(Sampling(max_tokens=8, presence_penalty=0.0, repetition_penalty=1.0)) is None


def test_a_stop_string_split_over_pieces_never_reaches_the_client(trtllm):
    """The LLM API cuts its text at a stop string, but a part of it already sent as text_diff
    stays sent: here ' capital' then '.' with the stop ' capital.' would leak ' capital'."""
    engine = trtllm()
    steps, _ = run(engine, [Piece("x", False)], Sampling(max_tokens=64, temperature=0), stops=[" capital."])
    assert "".join(s.text for s in steps) == "Paris is the" and steps[-1].finish_reason == "stop"
    steps, _ = run(engine, [Piece("x", False)], Sampling(max_tokens=64, temperature=0), stops=[" capitol"])
    assert "".join(s.text for s in steps) == "Paris is the capital.", "a prefix that was not a stop is sent at the end"


def test_length_and_cancellation(trtllm):
    engine = trtllm()
    steps, _ = run(engine, [Piece("x", False)], Sampling(max_tokens=2, temperature=0))
    assert [s.finish_reason for s in steps] == [None, "length"]
    steps, _ = run(engine, [Piece("x", False)], Sampling(max_tokens=64, temperature=0), cancel_after=2)
    assert steps[-1].finish_reason == "cancelled" and len(steps) == 3
    assert engine.llm.aborted == [2], "the client went away: the request was aborted in the engine"


def test_what_the_llm_api_refuses_is_the_requests_error_not_the_servers(trtllm):
    import tensorrt_llm

    tensorrt_llm.LLM.refuse_longer_than = 4
    engine = trtllm()
    steps, errors = run(engine, [Piece("a long prompt", False)], Sampling(max_tokens=8))
    assert steps == [] and len(errors) == 1 and isinstance(errors[0], RequestError)
    assert "should not exceed max_num_tokens (4)" in str(errors[0])
    assert engine.received.value == 0


def test_statistics_become_queue_active_and_kv_cache_figures(trtllm):
    engine = trtllm()
    run(engine, [Piece("x", False)], Sampling(max_tokens=3, temperature=0))   # statistics exist from here on
    engine.llm.stats = [{"numQueuedRequests": 9, "numActiveRequests": 1},
                        {"numQueuedRequests": 3, "numActiveRequests": 5,
                         "kvCacheStats": {"usedNumBlocks": 30, "maxNumBlocks": 120}}]
    deadline = time.monotonic() + 5
    while engine.stats().active != 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    s = engine.stats()
    assert (s.queued, s.active, s.kv_cache_utilization) == (3, 5, 0.25), "the latest iteration counts"


def test_an_empty_drain_keeps_the_figures_while_requests_are_in_flight():
    """get_stats answers [] between submissions: that is not idleness while requests are out."""
    from triton_runtime.serving.engine import Stats
    from triton_runtime.serving.trtllm import TrtllmEngine

    busy = Stats(queued=2, active=6, kv_cache_utilization=0.5)
    # In flight: the last batch figure stands, capped by what is out; the rest of ours is queued.
    assert TrtllmEngine.figures([], busy, received=0, outstanding=9) == Stats(3, 6, 0.5)
    assert TrtllmEngine.figures([], busy, received=0, outstanding=4) == Stats(0, 4, 0.5)
    # Nothing out: idle, whatever came before.
    assert TrtllmEngine.figures([], busy, received=0, outstanding=0) == Stats(0, 0, 0.0)
    # A drain: its latest entry (dicts or JSON strings), plus ours not yet handed to the engine.
    entries = [{"numQueuedRequests": 7, "numActiveRequests": 1},
               '{"numQueuedRequests": 1, "numActiveRequests": 3, "kvCacheStats": {"usedNumBlocks": 9, "maxNumBlocks": 36}}']
    assert TrtllmEngine.figures(entries, busy, received=2, outstanding=6) == Stats(3, 3, 0.25)
    # No KV figures in the entry: 0, not a division by zero.
    assert TrtllmEngine.figures([{"numActiveRequests": 2}], busy, received=0, outstanding=2) == Stats(0, 2, 0.0)


def test_statistics_are_not_read_before_the_first_request(trtllm):
    """Before the first submission, every get_stats call prints a line into the Triton log (twice a
    second on an idle replica); the engine waits for a request before it reads them."""
    engine = trtllm()
    time.sleep(0.3)   # six stats periods of 0.05 s
    assert engine.llm.warnings == 0
    assert engine.stats().active == 0 and engine.stats().queued == 0
    run(engine, [Piece("x", False)], Sampling(max_tokens=3, temperature=0))
    engine.llm.stats = [{"numQueuedRequests": 0, "numActiveRequests": 1}]
    deadline = time.monotonic() + 5
    while engine.llm.stats and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.llm.stats == [], "after a request the statistics are read"
    assert engine.llm.warnings == 0


def test_a_completion_prompt_starts_with_the_tokenizers_bos_once(trtllm):
    """The prompt pieces are encoded without special tokens; the tokenizer's BOS (Llama 3 adds
    <|begin_of_text|>) goes first, and only once when a chat template wrote it already."""
    engine = trtllm()
    run(engine, [Piece("Once upon", True)], Sampling(max_tokens=3, temperature=0))
    run(engine, [Piece("<|bos|>user: ", True), Piece("hi", False)], Sampling(max_tokens=3, temperature=0))
    run(engine, [Piece("<|bos|>", False)], Sampling(max_tokens=3, temperature=0))
    completion, chat, user_text = (r[0] for r in engine.llm.requests)
    assert completion == [1, *map(ord, "Once upon")]
    assert chat == [1, *map(ord, "user: hi")]
    # A user's "<|bos|>" is text, never the special token: the BOS is still added in front.
    assert user_text == [1, *map(ord, "<|bos|>")]


def test_a_tokenizer_without_bos_gets_none(trtllm, monkeypatch):
    import tensorrt_llm

    monkeypatch.setattr(tensorrt_llm._Tokenizer, "adds_bos", False)   # as Qwen's: no BOS added
    engine = trtllm()
    run(engine, [Piece("Once", True)], Sampling(max_tokens=3, temperature=0))
    assert engine.llm.requests[0][0] == list(map(ord, "Once"))


def test_log_probabilities_come_from_the_llm_apis_logprobs_diff(trtllm):
    """SamplingParams(logprobs=K) asks for them; each new token's dict {token id: Logprob} gives its
    own log probability and the K most likely at its place, most likely first."""
    engine = trtllm()
    steps, errors = run(engine, [Piece("x", False)], Sampling(max_tokens=64, temperature=0, logprobs=2))
    assert errors == [] and engine.llm.requests[0][1].logprobs == 2
    marks = [m for s in steps for m in s.logprobs]
    assert [m.token for m in marks] == ["<1000>", "<1001>", "<1002>", "<1003>", "<1004>"]
    assert [round(m.logprob, 2) for m in marks] == [-0.1, -0.11, -0.12, -0.13, -0.14]
    assert marks[0].top == (("<1000>", -0.1), ("<7000>", -3.0))
    plain, _ = run(engine, [Piece("x", False)], Sampling(max_tokens=64, temperature=0))
    assert all(s.logprobs == () for s in plain) and engine.llm.requests[1][1].logprobs is None


def test_the_kv_caches_blocks_come_back_named_by_the_routers_keys(trtllm):
    """With block reuse and an event buffer (the repository's default kv_cache_config), a request
    that carried the router's prefix keys gets, on its last step, what the cache holds named by
    them; the blocks the engine then reports (get_kv_cache_events, drained with the statistics)
    tie each name to its last full block, and a block the engine evicts takes its name with it."""
    engine = trtllm()
    assert engine.llm.kwargs["kv_cache_config"].event_buffer_max_size > 0
    keys = tuple(f"{i:016x}" for i in range(1, 13))
    prompt = [Piece("<|begin|>system: ", True), Piece("You answer for ACME. " * 5, False), Piece("<|eot|>user: ", True),
              Piece("Where is my order, and when will it come? " * 2, False), Piece("<|eot|>", True)]
    steps: list[Step] = []
    done = threading.Event()
    job = Job(prompt=prompt, sampling=Sampling(max_tokens=8, temperature=0), stops=(), fail=lambda e: done.set(),
              emit=lambda s: (steps.append(s), s.finish_reason and done.set()),
              prefix_keys=keys, prefix_boundary=6, kv_cursor="")
    engine.submit(job)
    assert done.wait(10) and steps[-1].finish_reason == "stop"
    told = json.loads(steps[-1].kv_events)
    assert told["snapshot"] == [[keys[5], 6], [keys[11], 12]] and all(s.kv_events == "" for s in steps[:-1])
    deadline = time.monotonic() + 5
    while engine.names.waiting and time.monotonic() < deadline:     # the next drains show the blocks
        time.sleep(0.02)
    ids, _, _ = engine.llm.requests[0]
    per = engine.llm.kwargs["kv_cache_config"].tokens_per_block
    end_block = engine.names.named[(keys[11], 12)]
    assert end_block is not None and engine.names._walk(tuple(ids[:len(ids) // per * per])) == end_block
    engine.llm.evict([end_block])
    cursor = f"{told['epoch']}:{told['seq']}"
    deadline = time.monotonic() + 5
    while (keys[11], 12) in engine.names.named and time.monotonic() < deadline:
        time.sleep(0.02)
    assert json.loads(engine.names.events.since(cursor))["events"] == [["removed", keys[11], 12]]


def test_without_an_event_buffer_no_events_are_read_or_told(trtllm):
    engine = trtllm(kv_cache_config={"enable_block_reuse": True})
    assert engine.names is None
    steps, errors = run(engine, [Piece("hi there", False)], Sampling(max_tokens=4, temperature=0))
    assert errors == [] and steps[-1].kv_events == ""
