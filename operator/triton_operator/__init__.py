"""triton-operator: serve models on Triton Inference Server and TensorRT-LLM, on the right GPUs."""

__version__ = "0.1.0"
