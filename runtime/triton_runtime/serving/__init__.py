"""The LLM model Triton serves: its contract, chat templating, engines (TensorRT-LLM, llama.cpp)
and the Triton Python-backend model. Copied into each model repository by repository.py."""
