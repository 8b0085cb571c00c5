"""Triton Python model: token ids from tensorrt_llm -> text (uses the checkpoint's tokenizer)."""

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
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
            texts = []
            for beams, beam_lengths in zip(tokens, lengths):
                for beam, length in zip(beams, beam_lengths):
                    texts.append(self.tokenizer.decode(beam[:length], skip_special_tokens=True).encode("utf-8"))
            out = np.array(texts, dtype=object).reshape(len(tokens), -1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", out)]))
        return responses
