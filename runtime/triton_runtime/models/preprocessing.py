"""Triton Python model: text -> token ids for tensorrt_llm (uses the checkpoint's tokenizer)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        tokenizer_dir = config["parameters"]["tokenizer_dir"]["string_value"]
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=False)

    def execute(self, requests):
        responses = []
        for request in requests:
            queries = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy()
            max_tokens = pb_utils.get_input_tensor_by_name(request, "MAX_TOKENS").as_numpy()
            ids = [self.tokenizer.encode(q[0].decode("utf-8")) for q in queries]
            width = max(len(i) for i in ids)
            pad = self.tokenizer.pad_token_id or self.tokenizer.eos_token_id or 0
            batch = np.array([i + [pad] * (width - len(i)) for i in ids], dtype=np.int32)
            lengths = np.array([[len(i)] for i in ids], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("INPUT_ID", batch),
                pb_utils.Tensor("INPUT_LEN", lengths),
                pb_utils.Tensor("OUTPUT_LEN", max_tokens.astype(np.int32)),
            ]))
        return responses
