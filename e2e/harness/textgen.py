"""A small text-generation model for the real Triton, speaking the generate interface of the
TensorRT-LLM ensemble (the inputs and output runtime/triton_runtime/repository.py declares:
text_input, max_tokens, stream, exclude_input_in_output, temperature, top_k, top_p, end_id,
pad_id -> text_output), so the gateway's translation is tested against Triton's own generate and
generate_stream endpoints.

The model (Python backend, decoupled, like tensorrt_llm with streaming) "generates" the words of
its prompt in order, cycling, one word per token, until max_tokens: a prompt "a b c" with
max_tokens 5 answers " a b c a b". Each token takes `token_ms` (re-read from a file on every
request, so a test slows the model down while it runs). With stream=true every token is its own
response; otherwise one response carries the whole text. Requests run on threads of their own,
so one model instance generates for many requests at once, as in-flight batching does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .triton import TritonServer, ensure_tritonserver

MODEL = "textgen"

MODEL_PY = '''\
import json
import site
import threading
import time

for _dir in {site_dirs}:
    site.addsitedir(_dir)

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else value.item() if hasattr(value, "item") else value


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {{k: v.get("string_value", "") for k, v in config.get("parameters", {{}}).items()}}
        self.token_file = params.get("token_ms_file") or ""
        self.default_ms = float(params.get("token_ms") or 0)

    def _token_s(self):
        try:
            with open(self.token_file) as f:
                return max(0.0, float(f.read().strip())) / 1000.0
        except (OSError, ValueError):
            return self.default_ms / 1000.0

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._generate, args=(request,), daemon=True).start()
        return None

    def _generate(self, request):
        sender = request.get_response_sender()
        try:
            prompt = str(_scalar(request, "text_input", ""))
            max_tokens = int(_scalar(request, "max_tokens", 16))
            stream = bool(_scalar(request, "stream", False))
            words = prompt.split() or ["empty"]
            delay = self._token_s()
            tokens = []
            for i in range(max_tokens):
                if delay:
                    time.sleep(delay)
                token = " " + words[i % len(words)]
                tokens.append(token)
                if stream:
                    out = pb_utils.Tensor("text_output", np.array([token.encode()], dtype=np.object_))
                    sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            if not stream:
                out = pb_utils.Tensor("text_output", np.array(["".join(tokens).encode()], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as e:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        pass
'''

CONFIG = '''\
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "max_tokens", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "stream", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "exclude_input_in_output", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }},
  {{ name: "temperature", data_type: TYPE_FP32, dims: [ 1 ], optional: true }},
  {{ name: "top_k", data_type: TYPE_INT32, dims: [ 1 ], optional: true }},
  {{ name: "top_p", data_type: TYPE_FP32, dims: [ 1 ], optional: true }},
  {{ name: "end_id", data_type: TYPE_INT32, dims: [ 1 ], optional: true }},
  {{ name: "pad_id", data_type: TYPE_INT32, dims: [ 1 ], optional: true }}
]
output [
  {{ name: "text_output", data_type: TYPE_STRING, dims: [ -1 ] }}
]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
parameters [
  {{ key: "token_ms", value: {{ string_value: "{token_ms:g}" }} }},
  {{ key: "token_ms_file", value: {{ string_value: "{token_file}" }} }},
  {{ key: "chat_template", value: {{ string_value: {template} }} }}
]
'''

# A chat template in the model's config (parameter chat_template), where a model repository can
# carry its tokenizer's (runtime/triton_runtime/repository.py does not write it yet): the gateway
# uses it when spec.openai.chatTemplate is unset. The model echoes its prompt, so an answer shows
# which template made it.
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>"


def write_repository(root: Path, token_ms: float = 0, name: str = MODEL) -> Path:
    """A model repository holding the textgen model; returns the token-delay file."""
    site_dirs = [ensure_tritonserver()["SITE_PACKAGES"]]
    token_file = root / f"{name}.token_ms"
    token_file.write_text(f"{token_ms:g}\n")
    model_dir = root / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text(MODEL_PY.format(site_dirs=repr(site_dirs)))
    (model_dir / "config.pbtxt").write_text(CONFIG.format(
        name=name, token_ms=token_ms, token_file=token_file, template=json.dumps(CHAT_TEMPLATE)))
    return token_file


class TextGenTriton(TritonServer):
    """A real tritonserver serving the textgen model (see the module docstring)."""

    def __init__(self, root: Path, token_ms: float = 0, **kwargs: object):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.token_file = write_repository(self.root, token_ms)
        super().__init__(model_name=MODEL, repository=self.root, **kwargs)  # type: ignore[arg-type]

    def set_token_ms(self, token_ms: float) -> None:
        tmp = self.token_file.with_suffix(".tmp")
        tmp.write_text(f"{token_ms:g}\n")
        os.replace(tmp, self.token_file)
