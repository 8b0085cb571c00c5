"""Triton Python model: text -> token ids for tensorrt_llm (uses the checkpoint's tokenizer).

Mirrors tensorrtllm_backend v0.17.0 all_models/inflight_batcher_llm/preprocessing/1/model.py for
a text-only model: the prompt's ids and length, the requested output length, and the end and pad
ids (a request's END_ID / PAD_ID, else the tokenizer's), without which generation never stops at
the end-of-sequence token. trust_remote_code stays off: models whose tokenizer is Python code in
the checkpoint are refused before an engine is built."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer


def _ids(tokenizer):
    """(end id, pad id) as upstream derives them: the EOS token's id, and the pad token's or EOS."""
    end = tokenizer.eos_token_id
    if end is None:
        end = tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)[0]
    pad = tokenizer.pad_token_id
    return int(end), int(end if pad is None else pad)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        tokenizer_dir = config["parameters"]["tokenizer_dir"]["string_value"]
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=False)
        self.end_id, self.pad_id = _ids(self.tokenizer)

    def _per_request(self, request, name, default, rows):
        given = pb_utils.get_input_tensor_by_name(request, name)
        if given is not None:
            return given.as_numpy().astype(np.int32).reshape(rows, 1)
        return np.full((rows, 1), default, dtype=np.int32)

    def execute(self, requests):
        responses = []
        for request in requests:
            queries = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy()
            output_len = pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy()
            rows = len(queries)
            end_id = self._per_request(request, "END_ID", self.end_id, rows)
            pad_id = self._per_request(request, "PAD_ID", self.pad_id, rows)
            ids = [self.tokenizer.encode(q[0].decode("utf-8")) for q in queries]
            width = max(len(i) for i in ids)
            # Rows are padded to one width for the batch; input_lengths tells tensorrt_llm where each ends.
            batch = np.array([i + [int(p[0])] * (width - len(i)) for i, p in zip(ids, pad_id)], dtype=np.int32)
            lengths = np.array([[len(i)] for i in ids], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("INPUT_ID", batch),
                pb_utils.Tensor("REQUEST_INPUT_LEN", lengths),
                pb_utils.Tensor("REQUEST_OUTPUT_LEN", output_len.astype(np.int32).reshape(rows, 1)),
                pb_utils.Tensor("OUT_END_ID", end_id),
                pb_utils.Tensor("OUT_PAD_ID", pad_id),
            ]))
        return responses
