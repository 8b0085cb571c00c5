#!/usr/bin/env bash
# Makes a real Triton Inference Server runnable on this (CPU-only) machine for the e2e harness.
#
# The PyPI wheel nvidia-pytriton bundles a real `tritonserver` (server 2.51.0), its shared
# libraries (nvidia_pytriton.libs/), the Python backend and one Python-backend stub per Python
# version. This script
#   1. installs nvidia-pytriton==$PYTRITON_VERSION into the project venv (<repo>/.venv, or
#      $TRITON_OPERATOR_VENV) unless that exact version is already there;
#   2. puts the stub for the venv's Python version into backends/python/ (idempotent: copied only
#      when missing or different). When site-packages is not writable, the backends folder is
#      copied into ${TRITON_OPERATOR_CACHE:-$HOME/.cache/triton-operator}/triton/<key>/ instead;
#   3. checks that tritonserver and the stub find every shared library they link.
#
# Prints, on stdout, KEY=VALUE lines the harness reads (progress goes to stderr):
#   TRITONSERVER      the tritonserver binary
#   BACKEND_DIR       the folder to pass as --backend-directory
#   LD_LIBRARY_PATH   what tritonserver and the stub need (the bundled libs, then the folder of
#                     the venv's own libpython when it has one, so the stub embeds that Python)
#   SITE_PACKAGES     the venv's site-packages. The stub runs its Python in isolated mode
#                     (PYTHONPATH is ignored), so a model.py that imports numpy, as
#                     triton_python_backend_utils does, must add this folder to sys.path itself
#   SERVER_VERSION    the pytriton wheel version
set -euo pipefail

PYTRITON_VERSION=${PYTRITON_VERSION:-0.7.0}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${TRITON_OPERATOR_VENV:-$ROOT/.venv}
PY="$VENV/bin/python"
CACHE_ROOT=${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator}

log() { echo "install-triton: $*" >&2; }

[ -x "$PY" ] || { log "no Python venv at $VENV (run 'make venv' first)"; exit 1; }

installed=$("$PY" -c 'import importlib.metadata as m
try: print(m.version("nvidia-pytriton"))
except m.PackageNotFoundError: print("")')
if [ "$installed" != "$PYTRITON_VERSION" ]; then
  log "installing nvidia-pytriton==$PYTRITON_VERSION into $VENV (found: ${installed:-none})"
  "$PY" -m pip install --quiet --disable-pip-version-check "nvidia-pytriton==$PYTRITON_VERSION" >&2
fi

read -r SITE PYVER LIBDIR SONAME < <("$PY" -c 'import sys, sysconfig
v = f"{sys.version_info[0]}.{sys.version_info[1]}"
shared = sysconfig.get_config_var("Py_ENABLE_SHARED")
libdir = sysconfig.get_config_var("LIBDIR") if shared else ""
so = sysconfig.get_config_var("INSTSONAME") if shared else ""
print(sysconfig.get_paths()["purelib"], v, libdir or "-", so or "-")')

TRITON_HOME="$SITE/pytriton/tritonserver"
LIBS="$SITE/nvidia_pytriton.libs"
SERVER="$TRITON_HOME/bin/tritonserver"
STUB_SRC="$TRITON_HOME/python_backend_stubs/$PYVER/triton_python_backend_stub"
[ -x "$SERVER" ] || { log "no tritonserver at $SERVER"; exit 1; }
[ -f "$STUB_SRC" ] || { log "nvidia-pytriton $PYTRITON_VERSION ships no Python-backend stub for Python $PYVER"; exit 1; }

# Copies $1 to $2 unless $2 already has the same bytes; through a temporary name, so that a
# concurrent run or a crash never leaves a half-written stub where Triton looks.
install_file() {
  if [ -f "$2" ] && cmp -s "$1" "$2"; then return 0; fi
  local tmp
  tmp=$(mktemp "$(dirname "$2")/.stub.XXXXXX")
  cp "$1" "$tmp" && chmod 0755 "$tmp" && mv -f "$tmp" "$2"
  log "installed $(basename "$2") for Python $PYVER into $(dirname "$2")"
}

BACKEND_DIR="$TRITON_HOME/backends"
if [ -w "$BACKEND_DIR/python" ]; then
  install_file "$STUB_SRC" "$BACKEND_DIR/python/triton_python_backend_stub"
else
  # site-packages is read-only (e.g. a system install): use a private copy of the backends.
  key="pytriton-${PYTRITON_VERSION}_py${PYVER}"
  cached="$CACHE_ROOT/triton/$key/backends"
  if [ ! -f "$cached/.complete" ]; then
    log "site-packages is not writable; copying the backends into $cached"
    rm -rf "$cached"
    mkdir -p "$(dirname "$cached")"
    cp -a "$BACKEND_DIR" "$cached.tmp.$$"
    rm -rf "$cached.tmp.$$/python/__pycache__"
    mv "$cached.tmp.$$" "$cached"
  fi
  install_file "$STUB_SRC" "$cached/python/triton_python_backend_stub"
  touch "$cached/.complete"
  BACKEND_DIR="$cached"
fi

# The stub embeds libpython$PYVER. Prefer the venv's own interpreter library (same patch
# version and stdlib as the venv); otherwise the loader falls back to the system one.
LD_PATH="$LIBS"
if [ "$LIBDIR" != "-" ] && [ -f "$LIBDIR/$SONAME" ]; then LD_PATH="$LD_PATH:$LIBDIR"; fi

missing() { LD_LIBRARY_PATH="$LD_PATH" ldd "$1" 2>/dev/null | awk '/not found/ {print $1}'; }
miss=$(missing "$SERVER"; missing "$BACKEND_DIR/python/triton_python_backend_stub")
if echo "$miss" | grep -q "libpython$PYVER" && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  log "libpython$PYVER is missing; installing Debian's libpython$PYVER"
  apt-get install -y -q --no-install-recommends "libpython$PYVER" >&2 \
    || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "libpython$PYVER" >&2; }
  miss=$(missing "$SERVER"; missing "$BACKEND_DIR/python/triton_python_backend_stub")
fi
if [ -n "$miss" ]; then
  log "shared libraries not found: $(echo $miss)"
  exit 1
fi

echo "TRITONSERVER=$SERVER"
echo "BACKEND_DIR=$BACKEND_DIR"
echo "LD_LIBRARY_PATH=$LD_PATH"
echo "SITE_PACKAGES=$SITE"
echo "SERVER_VERSION=$PYTRITON_VERSION"
