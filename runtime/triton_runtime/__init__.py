"""triton-operator's runtime: what runs inside the serving image.

build-engine     fetch a checkpoint, convert/quantize it, run trtllm-build, publish into the cache
make-repository  write the in-flight-batching model repository for a cached engine
stage            fetch a non-LLM model (onnx, pytorch, tensorrt, python, triton) into a repository
serve            exec tritonserver (under mpirun, one rank per GPU, when tensor parallel)
doctor           check that a pod can build or serve an engine; one line per problem, exit 3
"""

__version__ = "0.1.0"
