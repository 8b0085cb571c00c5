"""triton-operator's runtime: what runs next to Triton (in the operator's image, or copied into
NVIDIA's stock image).

prepare          download a checkpoint once, quantize it where the precision needs it (ModelOpt),
                 publish it into the model cache under its key
make-repository  write the Triton repository that serves an LLM: our `llm` model over TensorRT-LLM's
                 LLM API (or llama.cpp on CPU), its config and the engine's arguments
install          copy this package into a folder (for PYTHONPATH in another image)
doctor           check that a pod can prepare or serve; one line per problem, exit 3
stage            fetch a non-LLM model (onnx, pytorch, tensorrt, python, triton) into a repository
"""

__version__ = "0.1.0"
