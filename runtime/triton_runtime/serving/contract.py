"""The LLM model's interface on Triton (pure): its input and output tensors, and its config.pbtxt.

One Triton Python-backend model, `llm`, serves every LLM service, whatever engine runs it
(TensorRT-LLM's LLM API on a GPU, llama.cpp on a CPU). It is decoupled: with `stream` true it sends
one response per piece of text as it is generated, else one response with the whole answer; the
last response of an answer always carries `finish_reason` and the token counts. With `n` > 1 each
response names its answer's `index`, and only the very last one is final (answers are
generated one after another or together, as the engine schedules them): such a request is sent to
generate_stream. Triton's generate extension
maps a JSON request's fields to these inputs by name and each output to a JSON field of the answer
(server docs/protocol/extension_generate.md), so

    POST /v2/models/llm/generate         {"messages": "[{\"role\": \"user\", ...}]", "max_tokens": 64}
    POST /v2/models/llm/generate_stream  {"text_input": "Once upon", "stream": true, "stop": ["."]}

The names follow the upstream llmapi model (TensorRT-LLM triton_backend/all_models/llmapi/
tensorrt_llm/config.pbtxt: text_input, text_output, finish_reason) where it has them; its
sampling_param_* inputs are named here as OpenAI and the LLM API's SamplingParams name them
(temperature, top_p, top_k, seed, stop, presence_penalty, frequency_penalty, repetition_penalty,
max_tokens), and what the upstream model does not have is added: chat `messages` rendered with the
model's own chat template, `tools` and `tool_choice` (tools.py), `n` answers to one prompt,
`logprobs`, `guided_json` for JSON output, token counts for usage, and `text_output` holding only
the new text of each streamed response (upstream's is cumulative).
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL_NAME = "llm"

# Bounds of the triton_llm_request_duration_seconds histogram, in seconds. The autoscaler's p99 is
# histogram_quantile over them (settings.p99_query), which reads a quantile by linear interpolation
# inside its bucket: with few requests in the minute, near the bucket's top. Bounds at most 1.33x
# apart from 0.15 s up keep that within a third of the exact p99; at 2.5x apart (1, 2.5, 5, 10) a
# p99 of 2.0 s read 2.48 s, and live replicas were held that a simulation reading the exact p99
# released.
DURATION_BUCKETS = [0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6,
                    7.5, 10, 12.5, 15, 20, 25, 30, 40, 50, 60, 80, 100, 120, 160, 200, 240, 320]

# Errors a request causes start with this tag; the gateway passes such messages on to the client.
ERROR_TAG = "[llm] "


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str          # Triton's TYPE_* name
    dims: tuple[int, ...] = (1,)
    optional: bool = True
    meaning: str = ""


INPUTS = (
    Tensor("text_input", "TYPE_STRING", meaning="the prompt, as is (completions)"),
    Tensor("messages", "TYPE_STRING",
           meaning="the chat, a JSON array of {role, content}; rendered with the model's chat template"),
    Tensor("max_tokens", "TYPE_INT32", meaning="most tokens to generate"),
    Tensor("temperature", "TYPE_FP32", meaning="0 is greedy; default 1"),
    Tensor("top_p", "TYPE_FP32", meaning="nucleus sampling; default 1"),
    Tensor("top_k", "TYPE_INT32", meaning="0 or absent: no top-k"),
    Tensor("seed", "TYPE_UINT64", meaning="the sampler's seed, for repeatable sampling"),
    Tensor("stop", "TYPE_STRING", (-1,), meaning="strings that end the answer (not included in it)"),
    Tensor("presence_penalty", "TYPE_FP32"),
    Tensor("frequency_penalty", "TYPE_FP32"),
    Tensor("repetition_penalty", "TYPE_FP32"),
    Tensor("guided_json", "TYPE_STRING",
           meaning="a JSON schema the answer must follow; '{}' for any JSON object"),
    Tensor("stream", "TYPE_BOOL", meaning="one response per piece of text (generate_stream)"),
    Tensor("tools", "TYPE_STRING",
           meaning='the functions the model may call: a JSON array of {"type": "function", "function": {...}}'),
    Tensor("tool_choice", "TYPE_STRING",
           meaning='none, auto (the default with tools), required, or {"type": "function", "function": {"name"}}'),
    Tensor("n", "TYPE_INT32", meaning="answers to generate for the prompt (each response names its index)"),
    Tensor("logprobs", "TYPE_INT32",
           meaning="report each token's log probability and this many most likely alternatives (0-20)"),
    Tensor("prefix_keys", "TYPE_STRING", (-1,),
           meaning="the router's chained hashes of the prompt's blocks, 16 hex digits each: the prefix "
                   "cache names what it saves for this prompt by them (prefix_cache.py)"),
    Tensor("prefix_boundary", "TYPE_INT32", meaning="how many of prefix_keys lie before the last message"),
    Tensor("cache_salt", "TYPE_STRING",
           meaning="the scope of prefix-cache reuse: a prompt reuses only what requests of the same salt left "
                   "(the gateway sends its API key's; on GPUs TensorRT-LLM's cache_salt)"),
    Tensor("kv_events_after", "TYPE_STRING",
           meaning="the reader's cursor into the prefix cache's events ('' for none): the last response "
                   "then carries kv_events; sent alone (no text_input, no messages), one response at once, "
                   "outside the engine's queue, with kv_events and no text (a gateway's probe)"),
)

OUTPUTS = (
    Tensor("text_output", "TYPE_STRING", optional=False,
           meaning="the new text of this response (streamed), or the whole answer"),
    Tensor("finish_reason", "TYPE_STRING", optional=False,
           meaning="'' until the last response; then 'stop', 'length' or 'cancelled'"),
    Tensor("prompt_tokens", "TYPE_INT32", optional=False, meaning="tokens of the prompt as the model saw it"),
    Tensor("completion_tokens", "TYPE_INT32", optional=False, meaning="tokens generated so far"),
    Tensor("index", "TYPE_INT32", optional=False, meaning="which of the n answers this response belongs to"),
    Tensor("tool_calls", "TYPE_STRING", optional=False,
           meaning='on the last response of an answer that calls tools: [{"name", "arguments"}] as JSON; else ""'),
    Tensor("logprobs", "TYPE_STRING", optional=False,
           meaning='with logprobs: the tokens of this response\'s text, [{"token", "logprob", "top"}] as JSON; else ""'),
    Tensor("cached_tokens", "TYPE_INT32", optional=False,
           meaning="prompt tokens the engine's prefix cache held (not evaluated again)"),
    Tensor("kv_events", "TYPE_STRING", optional=False,
           meaning='with kv_events_after, on the last response: what the prefix cache stored and removed since '
                   'that cursor, as JSON (prefix_cache.KvEvents.since); else ""'),
)

INPUT_NAMES = frozenset(t.name for t in INPUTS)
FINISH_REASONS = ("stop", "length", "cancelled", "tool_calls")
MAX_N = 16
MAX_TOP_LOGPROBS = 20
# keys of 64 characters: prompts of about half a million characters (the gateway sends no more:
# operator/triton_operator/gateway/routing.py MAX_PREFIX_KEYS, held equal by a test)
MAX_PREFIX_KEYS = 8192


def config_pbtxt(name: str = MODEL_NAME, instances: int = 1) -> str:
    """config.pbtxt of the model: Python backend, decoupled, no Triton-side batching (the engine
    batches in flight), inputs and outputs as above. Parsed by tests with tritonclient's
    ModelConfig protobuf."""
    def tensor(t: Tensor, with_optional: bool) -> str:
        dims = ", ".join(str(d) for d in t.dims)
        opt = "\n    optional: true" if with_optional and t.optional else ""
        return f'  {{\n    name: "{t.name}"\n    data_type: {t.data_type}\n    dims: [ {dims} ]{opt}\n  }}'

    inputs = ",\n".join(tensor(t, True) for t in INPUTS)
    outputs = ",\n".join(tensor(t, False) for t in OUTPUTS)
    return f"""name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{
  decoupled: true
}}
input [
{inputs}
]
output [
{outputs}
]
instance_group [
  {{
    count: {instances}
    kind: KIND_CPU
  }}
]
"""
