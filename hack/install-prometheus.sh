#!/usr/bin/env bash
# Makes a real Prometheus binary available to the e2e harness without a system install: downloads
# Debian's `prometheus` package with apt-get download, unpacks it with dpkg -x and keeps only the
# binaries (prometheus, and promtool for the alert rules' unit tests), cached outside the work tree
# in a folder keyed by the package version:
#   ${TRITON_OPERATOR_CACHE:-$HOME/.cache/triton-operator}/prometheus/<version>/{prometheus,promtool}
# A cached binary is reused without downloading anything. Prints the binary's path on stdout
# (progress goes to stderr). Needs apt-get and dpkg (Debian/Ubuntu); apt-get update is run only
# when the download fails (e.g. a fresh machine with no package lists).
set -euo pipefail

PKG=${PROMETHEUS_DEB_PACKAGE:-prometheus}
CACHE_ROOT=${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator}
CACHE_DIR="$CACHE_ROOT/prometheus"

log() { echo "install-prometheus: $*" >&2; }

candidate_version() {
  # The version apt would download now; empty when the package lists know no such package.
  apt-cache policy "$PKG" 2>/dev/null | awk '/Candidate:/ {print $2; exit}' | grep -v '^(none)$' || true
}

usable() { [ -x "$1" ] && "$1" --version >/dev/null 2>&1 && [ -x "$(dirname "$1")/promtool" ]; }

version=$(candidate_version)
if [ -n "$version" ] && usable "$CACHE_DIR/$version/prometheus"; then
  echo "$CACHE_DIR/$version/prometheus"
  exit 0
fi
if [ -z "$version" ] && [ -d "$CACHE_DIR" ]; then
  # No package lists (offline or never updated): any complete cached version will do.
  for cached in "$CACHE_DIR"/*/prometheus; do
    if usable "$cached"; then echo "$cached"; exit 0; fi
  done
fi

command -v apt-get >/dev/null && command -v dpkg >/dev/null \
  || { log "apt-get and dpkg are required (Debian/Ubuntu); neither found on PATH"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# apt-get download drops privileges to _apt where it can; let it write here.
chmod 0777 "$work"

download() { (cd "$work" && apt-get download -q "$PKG" >&2); }
log "downloading Debian package $PKG${version:+ $version}"
if ! download; then
  log "download failed; running apt-get update and trying again"
  apt-get update -q >&2
  download
fi

deb=$(ls "$work"/*.deb 2>/dev/null | head -n1)
[ -n "$deb" ] || { log "apt-get download left no .deb in $work"; exit 1; }
version=$(dpkg-deb -f "$deb" Version)
dest="$CACHE_DIR/$version"
if usable "$dest/prometheus"; then
  echo "$dest/prometheus"
  exit 0
fi

log "unpacking $(basename "$deb")"
dpkg -x "$deb" "$work/root"
mkdir -p "$dest"
# promtool first: the cache check looks for prometheus, then for promtool beside it. Each is copied
# to a temporary name and renamed, so a concurrent or interrupted run never leaves half a binary.
for name in promtool prometheus; do
  bin="$work/root/usr/bin/$name"
  [ -x "$bin" ] || { log "no usr/bin/$name in $(basename "$deb")"; exit 1; }
  tmp=$(mktemp "$dest/.$name.XXXXXX")
  cp "$bin" "$tmp"
  chmod 0755 "$tmp"
  mv -f "$tmp" "$dest/$name"
done
usable "$dest/prometheus" || { log "$dest/prometheus does not run"; exit 1; }
log "installed $("$dest/prometheus" --version 2>&1 | head -n1)"
echo "$dest/prometheus"
