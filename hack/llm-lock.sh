# Sourced by hack/install-llm.sh and hack/install-embedder.sh (which set ROOT, PY and log):
# packages pinned, with their hashes, in requirements/llm.lock and installed one by one.

# The lines of requirements/llm.lock for one package at one version (its pin and its hashes).
locked() {
  awk -v want="$1==$2" '$1 == want { on = 1; print; next } on && /^[^ ]/ { exit } on && /--hash=/ { print }' \
    "$ROOT/requirements/llm.lock" |
    grep . || { log "$1==$2 is not in requirements/llm.lock (make lock)"; exit 1; }
}

# The installed version of a distribution in the venv ("" when it is not installed).
version_of() {
  "$PY" -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: print("")' "$1"
}
