"""A Triton Python-backend embedding model for the tests: sentence-transformers/all-MiniLM-L6-v2
(a 6-layer BERT) run with NumPy from its own safetensors weights and tokenizer.json, mean-pooled
over the tokens and L2-normalised as the model's sentence-transformers modules say (1_Pooling:
mean; then Normalize). It stands for a user's embedding model behind an InferenceService with
spec.openai.task embeddings: input text_input (a batch of strings), outputs embedding (one
384-float vector per string) and prompt_tokens (the tokens read).

model.py is this file after a line that adds the venv's site-packages (NumPy, tokenizers,
safetensors) to the path, as the other test models do; config.pbtxt's parameter names the model
folder.
"""

import json
import math

import numpy as np


def _erf(x):
    # Abramowitz and Stegun 7.1.26 (error below 1.5e-7): BERT's GELU is the exact, erf one.
    sign = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-x * x))


def _layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


class MiniLM:
    def __init__(self, folder):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        with open(f"{folder}/config.json") as f:
            self.config = json.load(f)
        self.w = load_file(f"{folder}/model.safetensors")
        self.tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
        self.tokenizer.enable_truncation(max_length=256)
        self.tokenizer.enable_padding(pad_id=self.config.get("pad_token_id", 0))

    def embed(self, texts):
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings])
        mask = np.array([e.attention_mask for e in encodings], dtype=np.float32)
        w, c = self.w, self.config
        eps = c["layer_norm_eps"]
        heads, size = c["num_attention_heads"], c["hidden_size"]
        d = size // heads
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:ids.shape[1]]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        bias = (1.0 - mask)[:, None, None, :] * -1e9          # padding is never attended to
        for i in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{i}."

            def linear(v, name):
                return v @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            def split(v):
                return v.reshape(v.shape[0], v.shape[1], heads, d).transpose(0, 2, 1, 3)

            q, k, v = (split(linear(x, f"attention.self.{n}")) for n in ("query", "key", "value"))
            scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(x.shape)
            x = _layer_norm(x + linear(context, "attention.output.dense"), w[p + "attention.output.LayerNorm.weight"],
                            w[p + "attention.output.LayerNorm.bias"], eps)
            inner = linear(x, "intermediate.dense")
            inner = 0.5 * inner * (1.0 + _erf(inner / math.sqrt(2.0)))
            x = _layer_norm(x + linear(inner, "output.dense"), w[p + "output.LayerNorm.weight"],
                            w[p + "output.LayerNorm.bias"], eps)
        pooled = (x * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled.astype(np.float32), int(mask.sum())


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.model = MiniLM(params["model_dir"]["string_value"])

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            texts = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                     for v in pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)]
            if not texts or any(not t for t in texts):
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                    "text_input: give one or more non-empty strings")))
                continue
            vectors, tokens = self.model.embed(texts)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("embedding", vectors),
                pb_utils.Tensor("prompt_tokens", np.array([tokens], dtype=np.int32))]))
        return responses
