"""The Triton Python-backend model that serves an LLM (contract.py says its inputs and outputs).

Triton loads `<repository>/llm/1/model.py`, which puts this package on the path and re-exports
`TritonPythonModel`. The model reads `model.yaml` beside it (repository.py writes it), starts the
engine it names, and then, for each request: reads the inputs, renders chat messages with the
model's chat template (chat.py: user text stays plain text), hands a Job to the engine and sends
what the engine reports. It is decoupled (python_backend: `request.get_response_sender()`,
`send(response, flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)` on the last one, `execute` returns
None), checks `response_sender.is_cancelled()` between tokens so a client that goes away stops
its generation, and exports the engine's signals as Triton custom metrics
(`pb_utils.MetricFamily`, on Triton's metrics port beside nv_inference_*):

    triton_llm_queued_requests, triton_llm_active_requests, triton_llm_kv_cache_utilization  (gauges)
    triton_llm_time_to_first_token_seconds, triton_llm_inter_token_latency_seconds,
    triton_llm_request_duration_seconds                                                       (histograms)
    triton_llm_prompt_tokens_total, triton_llm_generation_tokens_total, triton_llm_requests_total{finish_reason}

and the same three gauges under the names NVIDIA's TensorRT-LLM backend gives them, which the
Gateway API Inference Extension's endpoint picker reads from pods labelled
`inference.networking.k8s.io/engine-type: triton-tensorrt-llm` (its built-in engine config):

    nv_trt_llm_request_metrics{request_type="waiting"|"scheduled"}, nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}

Errors a request causes are sent as an INVALID_ARG error whose message starts with ERROR_TAG; the
gateway passes such messages on to the client (they are this module's own words) and replaces
any other error text by a fixed one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

from . import chat, tools
from .contract import DURATION_BUCKETS, ERROR_TAG, MAX_N, MAX_PREFIX_KEYS, MAX_TOP_LOGPROBS
from .delivery import CancelWatch, Outbox
from .engine import Job, RequestError, Sampling, Step

log = logging.getLogger("triton_llm")
NOT_UNICODE = "the request holds text that is not valid Unicode (a lone surrogate escape)"
TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28]
STATS_PERIOD_S = 1.0


def _text(request: Any, name: str) -> str | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    values = tensor.as_numpy().reshape(-1)
    if values.size == 0:
        return None
    value = values[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _texts(request: Any, name: str) -> list[str]:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in tensor.as_numpy().reshape(-1)]


def _number(request: Any, name: str, default: Any) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    values = tensor.as_numpy().reshape(-1)
    return values[0].item() if values.size else default


def _check(name: str, value: float, low: float, high: float, low_open: bool = False) -> float:
    if math.isnan(value) or value > high or value < low or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise RequestError(f"{name} must be within {bound}, got {value}")
    return value


def _prefix_keys(request: Any) -> tuple[tuple[str, ...], int, str | None]:
    """prefix_keys (each 16 hex digits, at most MAX_PREFIX_KEYS), prefix_boundary (within them)
    and kv_events_after (a cursor, at most 64 characters)."""
    keys = tuple(_texts(request, "prefix_keys"))
    if len(keys) > MAX_PREFIX_KEYS or not all(len(k) == 16 and all(c in "0123456789abcdef" for c in k) for k in keys):
        raise RequestError(f"prefix_keys: at most {MAX_PREFIX_KEYS} keys of 16 lowercase hex digits")
    before = int(_number(request, "prefix_boundary", 0))
    if not 0 <= before <= len(keys):
        raise RequestError(f"prefix_boundary must be within [0, {len(keys)}] (the prefix_keys sent), got {before}")
    return keys, before, _cursor(request)


def _cache_salt(request: Any) -> str:
    """cache_salt: the scope of prefix-cache reuse ("" when not sent), at most 64 characters."""
    salt = _text(request, "cache_salt") or ""
    if len(salt) > 64:
        raise RequestError("cache_salt: at most 64 characters")
    return salt


def _cursor(request: Any) -> str | None:
    """kv_events_after: a reader's cursor into the prefix cache's events ("" for none yet), at most
    64 characters; None when not sent."""
    cursor = _text(request, "kv_events_after")
    if cursor is not None and len(cursor) > 64:
        raise RequestError("kv_events_after: at most 64 characters")
    return cursor


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.model_name = args["model_name"]
        here = Path(args["model_repository"]) / args["model_version"]
        self.settings = yaml.safe_load((here / os.environ.get("LLM_CONFIG_PATH", "model.yaml")).read_text())
        self.engine = self._engine(self.settings)
        template = self.settings.get("chat_template") or getattr(self.engine, "chat_template", None)
        self.chat_template: str | None = template or None
        self.bos_token = self.settings.get("bos_token", getattr(self.engine, "bos_token", "")) or ""
        self.eos_token = self.settings.get("eos_token", getattr(self.engine, "eos_token", "")) or ""
        self.default_max_tokens = int(self.settings.get("default_max_tokens", 256))
        self.max_tokens_limit = int(self.settings.get("max_tokens_limit", 1 << 20))
        self._metrics_lock = threading.Lock()
        self._metrics()
        # Sends and cancellation checks run off the engine's token path (delivery.py).
        self.outbox = Outbox()
        self.cancels = CancelWatch()
        self._stopping = threading.Event()
        self._stats_thread = threading.Thread(target=self._poll, name="llm-stats", daemon=True)
        self._stats_thread.start()

    @staticmethod
    def _engine(settings: dict[str, Any]) -> Any:
        kind = settings.get("engine")
        if kind == "llamacpp":
            from .llamacpp import LlamaCppEngine
            opts = settings.get("llamacpp") or {}
            return LlamaCppEngine(settings["model"], n_ctx=int(opts.get("n_ctx", 4096)), n_threads=opts.get("n_threads"),
                                  prefix_cache_bytes=int(opts.get("prefix_cache_bytes", 256 << 20)))
        if kind == "trtllm":
            from .trtllm import TrtllmEngine
            return TrtllmEngine(settings["model"], settings.get("llm_args") or {}, settings.get("stop_token_ids"))
        raise pb_utils.TritonModelException(f"model.yaml: engine must be trtllm or llamacpp, got {kind!r}")

    def _metrics(self) -> None:
        labels = {"model": self.model_name, "engine": self.engine.name}
        kinds = pb_utils.MetricFamily
        # The families must outlive their metrics (python_backend deletes a family's metrics with
        # it, and a metric of a deleted family refuses every update).
        self._families: list[Any] = []

        def family(name: str, kind: Any, description: str) -> Any:
            self._families.append(pb_utils.MetricFamily(name=name, description=description, kind=kind))
            return self._families[-1]

        self.queued = family("triton_llm_queued_requests", kinds.GAUGE,
                             "Requests the engine accepted and has not started generating").Metric(labels=labels)
        self.active = family("triton_llm_active_requests", kinds.GAUGE,
                             "Requests the engine is generating").Metric(labels=labels)
        self.kv_cache = family("triton_llm_kv_cache_utilization", kinds.GAUGE,
                               "Fraction of the KV cache in use (0-1)").Metric(labels=labels)
        # The endpoint picker's names for the same gauges (see the module).
        requests_now = family("nv_trt_llm_request_metrics", kinds.GAUGE,
                              "Requests by state (waiting: triton_llm_queued_requests, scheduled: "
                              "triton_llm_active_requests), as the TensorRT-LLM backend names them")
        self.picker_waiting = requests_now.Metric(labels={**labels, "request_type": "waiting"})
        self.picker_scheduled = requests_now.Metric(labels={**labels, "request_type": "scheduled"})
        self.picker_kv_cache = family("nv_trt_llm_kv_cache_block_metrics", kinds.GAUGE,
                                      "KV cache use (fraction: triton_llm_kv_cache_utilization), as the TensorRT-LLM "
                                      "backend names it").Metric(labels={**labels, "kv_cache_block_type": "fraction"})
        self.ttft = family("triton_llm_time_to_first_token_seconds", kinds.HISTOGRAM,
                           "Time from a request's arrival to its first generated token").Metric(
            labels=labels, buckets=TTFT_BUCKETS)
        self.itl = family("triton_llm_inter_token_latency_seconds", kinds.HISTOGRAM,
                          "Mean time between tokens after the first, per request").Metric(labels=labels,
                                                                                          buckets=ITL_BUCKETS)
        self.duration = family("triton_llm_request_duration_seconds", kinds.HISTOGRAM,
                               "Time from a request's arrival to its last response").Metric(
            labels=labels, buckets=DURATION_BUCKETS)
        self.prompt_tokens = family("triton_llm_prompt_tokens_total", kinds.COUNTER,
                                    "Prompt tokens of finished requests").Metric(labels=labels)
        self.cached_tokens = family("triton_llm_prompt_tokens_cached_total", kinds.COUNTER,
                                    "Prompt tokens of finished requests that the engine's prefix cache held "
                                    "(their share of triton_llm_prompt_tokens_total is the hit rate)").Metric(labels=labels)
        self.generation_tokens = family("triton_llm_generation_tokens_total", kinds.COUNTER,
                                        "Tokens generated by finished requests").Metric(labels=labels)
        requests = family("triton_llm_requests_total", kinds.COUNTER, "Finished requests by finish reason")
        self.finished = {reason: requests.Metric(labels={**labels, "finish_reason": reason})
                         for reason in ("stop", "length", "cancelled", "error")}

    def _poll(self) -> None:
        while not self._stopping.wait(STATS_PERIOD_S):
            try:
                s = self.engine.stats()
                with self._metrics_lock:
                    for gauges, value in (((self.queued, self.picker_waiting), s.queued),
                                          ((self.active, self.picker_scheduled), s.active),
                                          ((self.kv_cache, self.picker_kv_cache), s.kv_cache_utilization)):
                        for gauge in gauges:
                            gauge.set(value)
            except Exception as e:  # noqa: BLE001 - a metric update must not stop the model
                log.debug("stats: %s", e)

    # -- requests ---------------------------------------------------------------------------------------

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                events = self._probe(request)
                if events is not None:
                    sender.send(self._response("", Step("", 0, 0, kv_events=events)),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                for job in self._jobs(request, sender):
                    self.engine.submit(job)
            except (RequestError, chat.ChatError, tools.ToolError) as e:
                self._fail(sender, e, time.monotonic())
            except RecursionError:
                self._fail(sender, RequestError("the request nests JSON too deeply"), time.monotonic())
            except UnicodeEncodeError:
                self._fail(sender, RequestError(NOT_UNICODE), time.monotonic())
        return None

    def _probe(self, request: Any) -> str | None:
        """A gateway's probe: kv_events_after alone, no prompt and no chat. Answered at once, outside
        the engine's queue, with what the prefix cache did since that cursor and the engine's load
        (a gateway about to route a prompt it saw no replica hold asks what the other gateways'
        requests left; the generate pass-through never lets a client set the cursor). None: not one."""
        if _text(request, "text_input") is not None or _text(request, "messages") is not None:
            return None
        cursor = _cursor(request)
        return None if cursor is None else self.engine.kv_events(cursor)

    def _jobs(self, request: Any, sender: Any) -> list[Job]:
        """The request's answers as engine jobs (n of them), all checked before any is submitted."""
        arrived = time.monotonic()
        text, messages = _text(request, "text_input"), _text(request, "messages")
        if (text is None) == (messages is None):
            raise RequestError("send exactly one of text_input (a prompt) and messages (a chat)")
        offered = tools.parse_tools(_text(request, "tools"))
        choice = tools.parse_choice(_text(request, "tool_choice"), offered)
        offered = tools.offered(offered, choice)
        if messages is not None:
            if not self.chat_template:
                raise RequestError("this model has no chat template: send text_input")
            turns, template_tools = tools.for_template(chat.parse_messages(messages), offered, self.chat_template,
                                                       self._has_special)
            pieces = chat.render(self.chat_template, turns, self.bos_token, self.eos_token, tools=template_tools)
        else:
            if offered:
                raise RequestError("tools need a chat (messages), not a prompt")
            pieces = [chat.Piece(text or "", True)]
        try:
            for piece in pieces:
                piece.text.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(NOT_UNICODE) from None
        max_tokens = int(_number(request, "max_tokens", self.default_max_tokens))
        if not 1 <= max_tokens <= self.max_tokens_limit:
            raise RequestError(f"max_tokens must be within [1, {self.max_tokens_limit}], got {max_tokens}")
        seed = _number(request, "seed", None)
        guided = _text(request, "guided_json")
        if guided is not None:
            try:
                schema = json.loads(guided)
            except ValueError:
                raise RequestError("guided_json is not valid JSON") from None
            if not isinstance(schema, dict):
                raise RequestError("guided_json must be a JSON schema (an object)")
        forced = tools.forced_schema(offered, choice)
        if forced is not None:
            if guided is not None:
                raise RequestError("a JSON response format and a required tool call cannot both be asked for")
            guided = forced
        n = int(_number(request, "n", 1))
        if not 1 <= n <= MAX_N:
            raise RequestError(f"n must be within [1, {MAX_N}], got {n}")
        top = _number(request, "logprobs", None)
        if top is not None and not 0 <= int(top) <= MAX_TOP_LOGPROBS:
            raise RequestError(f"logprobs must be within [0, {MAX_TOP_LOGPROBS}], got {top}")
        sampling = Sampling(
            max_tokens=max_tokens,
            temperature=_check("temperature", float(_number(request, "temperature", 1.0)), 0.0, 2.0),
            top_p=_check("top_p", float(_number(request, "top_p", 1.0)), 0.0, 1.0, low_open=True),
            top_k=int(_check("top_k", float(_number(request, "top_k", 0)), 0, 1 << 20)),
            seed=int(seed) if seed is not None else None,
            presence_penalty=_check("presence_penalty", float(_number(request, "presence_penalty", 0.0)), -2.0, 2.0),
            frequency_penalty=_check("frequency_penalty", float(_number(request, "frequency_penalty", 0.0)), -2.0, 2.0),
            repetition_penalty=_check("repetition_penalty", float(_number(request, "repetition_penalty", 1.0)), 0.0,
                                      2.0, low_open=True),
            guided_json=guided, logprobs=None if top is None else int(top))
        stream = bool(_number(request, "stream", False))
        stops = _texts(request, "stop")
        if len(stops) > 16 or any(len(s) > 1024 for s in stops):
            raise RequestError("stop: at most 16 strings of at most 1024 characters")
        if n > 1 and not stream:
            raise RequestError("n > 1 answers stream (send to generate_stream with stream true)")
        keys, keys_before, cursor = _prefix_keys(request)
        salt = _cache_salt(request)
        left = [n]       # answers not finished yet: the last one's last response is the final one
        jobs = []
        for index in range(n):
            # each answer its own seed (seed, seed + 1, ...): n samples, each repeatable
            own = sampling if sampling.seed is None or index == 0 else replace(sampling, seed=(sampling.seed + index) % (1 << 63))
            scanner = tools.CallScanner(offered, choice.forced) if offered else None
            job = self._new_job(pieces, own, stops, stream, sender, arrived, index, left, scanner)
            job.prefix_keys, job.prefix_boundary, job.cache_salt = keys, keys_before, salt
            job.kv_cursor = cursor if index == n - 1 else None   # the request's last answer tells the events
            jobs.append(job)
        return jobs

    def _has_special(self, text: str) -> bool:
        """Whether `text` holds one of the model's special tokens (its tokens differ when parsed)."""
        plain = self.engine.tokenize([chat.Piece(text, False)])
        return plain != self.engine.tokenize([chat.Piece(text, True)])

    def _new_job(self, pieces: list[chat.Piece], sampling: Sampling, stops: list[str], stream: bool, sender: Any,
                 arrived: float, index: int = 0, left: list[int] | None = None,
                 scanner: tools.CallScanner | None = None) -> Job:
        parts: list[str] = []
        marks: list[Any] = []
        job: Job
        left = left if left is not None else [1]

        # Called on the engine's thread: it notes the time and hands the rest (building the
        # response, sending it, the metrics) to the outbox's thread, in order.
        def emit(step: Step) -> None:
            now = time.monotonic()
            first = bool(step.completion_tokens) and job.first_token is None
            if first:
                job.first_token = now
            if step.completion_tokens:
                job.last_token = now
            final = step.finish_reason is not None
            text = step.text
            calls: list[tools.Call] = []
            if scanner is not None:
                text = scanner.push(text)
                if final:
                    rest, calls = scanner.end()
                    text += rest
                    if calls:
                        step = replace(step, finish_reason="tool_calls")
            if final:
                self.cancels.forget(cancelled)
            if not stream:
                parts.append(text)
                marks.extend(step.logprobs)
                if not final:
                    return
                text = "".join(parts)
                step = replace(step, logprobs=tuple(marks))
            if final:
                left[0] -= 1
            last = final and left[0] == 0
            self.outbox.put(lambda: self._deliver(sender, job, step, text, final, first, now, index, calls, last))

        def fail(error: Exception) -> None:
            self.cancels.forget(cancelled)
            self.outbox.put(lambda: self._fail(sender, error, job.arrived))

        cancelled = self.cancels.watch(sender)
        job = Job(prompt=pieces, sampling=sampling, stops=stops, emit=emit, fail=fail,
                  cancelled=cancelled, arrived=arrived)
        return job

    def _deliver(self, sender: Any, job: Job, step: Step, text: str, final: bool, first: bool, at: float,
                 index: int = 0, calls: list[tools.Call] | None = None, last: bool | None = None) -> None:
        """On the outbox's thread: one response, and the metrics it completes. `last`: the request's
        final response (its answer's last, and no other answer still going)."""
        if first:
            self._observe(self.ttft, at - job.arrived)
        last = final if last is None else last
        sender.send(self._response(text, step, index, calls or []),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
        if final:
            self._finished(job, step, at)

    def _response(self, text: str, step: Step, index: int = 0, calls: list[tools.Call] | None = None) -> Any:
        def string(value: str) -> Any:
            # "replace": a lone surrogate (a name or schema a request escaped) must not stop the
            # response, which would leave the request open for good.
            return np.array([value.encode("utf-8", "replace")], dtype=np.object_)

        marks = json.dumps([m.as_dict() for m in step.logprobs], ensure_ascii=False) if step.logprobs else ""
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("text_output", string(text)),
            pb_utils.Tensor("finish_reason", string(step.finish_reason or "")),
            pb_utils.Tensor("prompt_tokens", np.array([step.prompt_tokens], dtype=np.int32)),
            pb_utils.Tensor("completion_tokens", np.array([step.completion_tokens], dtype=np.int32)),
            pb_utils.Tensor("index", np.array([index], dtype=np.int32)),
            pb_utils.Tensor("tool_calls", string(json.dumps([c.as_dict() for c in calls], ensure_ascii=False)
                                                 if calls else "")),
            pb_utils.Tensor("logprobs", string(marks)),
            pb_utils.Tensor("cached_tokens", np.array([step.cached_tokens], dtype=np.int32)),
            pb_utils.Tensor("kv_events", string(step.kv_events)),
        ])

    def _finished(self, job: Job, step: Step, now: float) -> None:
        self._observe(self.duration, now - job.arrived)
        if job.first_token is not None and job.last_token is not None and step.completion_tokens > 1:
            self._observe(self.itl, (job.last_token - job.first_token) / (step.completion_tokens - 1))
        with self._metrics_lock:
            self.prompt_tokens.increment(step.prompt_tokens)
            self.cached_tokens.increment(step.cached_tokens)
            self.generation_tokens.increment(step.completion_tokens)
            self.finished.get(step.finish_reason or "", self.finished["error"]).increment(1)

    def _observe(self, metric: Any, value: float) -> None:
        with self._metrics_lock:
            metric.observe(value)

    def _fail(self, sender: Any, error: Exception, arrived: float) -> None:
        if isinstance(error, (RequestError, chat.ChatError, tools.ToolError)):
            err = pb_utils.TritonError(ERROR_TAG + str(error), pb_utils.TritonError.INVALID_ARG)
        else:
            log.error("generation failed: %s: %s", type(error).__name__, error)
            err = pb_utils.TritonError("the model failed to generate", pb_utils.TritonError.INTERNAL)
        try:
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=err),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as e:  # noqa: BLE001 - the client may be gone already
            log.debug("could not send an error: %s", e)
        with self._metrics_lock:
            self.finished["error"].increment(1)
            self._observe_unlocked(self.duration, time.monotonic() - arrived)

    def _observe_unlocked(self, metric: Any, value: float) -> None:
        metric.observe(value)

    def finalize(self) -> None:
        self._stopping.set()
        self.engine.shutdown()
        self.cancels.close()
        self.outbox.close()
