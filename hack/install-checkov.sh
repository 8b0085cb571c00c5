#!/usr/bin/env bash
# checkov (the offline Kubernetes/Helm security scanner) in its own virtualenv, cached outside the
# work tree by version: its many pinned dependencies stay out of the project's environment.
# Prints the checkov executable's path.
set -euo pipefail
VERSION=${CHECKOV_VERSION:-3.3.30}
CACHE_ROOT=${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator}
VENV="$CACHE_ROOT/checkov-$VERSION"
if [ ! -x "$VENV/bin/checkov" ] || ! "$VENV/bin/checkov" --version >/dev/null 2>&1; then
  echo "install-checkov: installing checkov $VERSION into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "checkov==$VERSION" >&2
fi
echo "$VENV/bin/checkov"
