#!/usr/bin/env bash
# Builds, once, the real Kubernetes pieces the local cluster and the e2e suite use, from the Go
# module proxy, and caches them outside the work tree in a folder keyed by every version below.
# A missing cache folder is rebuilt; a complete one is reused in well under a second.
# Prints the bin folder on stdout (progress goes to stderr).
#
#   hack/install-tools.sh              every tool below (the local cluster, the e2e suite)
#   hack/install-tools.sh helm ...     only the named ones (make dist needs helm, the release
#                                      workflow's test actionlint), in the same folder
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
HELM_VERSION=${HELM_VERSION:-v3.21.4}
# LeaderWorkerSet (multi-node replicas): its manager and CRD, kept beside the others under a name
# that carries its own version, so a new LWS version builds only itself.
LWS_VERSION=${LWS_VERSION:-v0.9.0}
# The Gateway API Inference Extension's InferencePool CRD (the operator renders pools where it is
# installed), kept the same way.
GIE_VERSION=${GIE_VERSION:-v1.5.0}
# actionlint (the release workflow's linter), kept the same way.
ACTIONLINT_VERSION=${ACTIONLINT_VERSION:-v1.7.12}

CACHE_ROOT=${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator}
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
BIN="$CACHE_ROOT/tools/$KEY/bin"
STAMP="$CACHE_ROOT/tools/$KEY/complete"
LWS="lws-manager-$LWS_VERSION"
GIE="inference-extension-$GIE_VERSION.crds.yaml"
ACTIONLINT="actionlint-$ACTIONLINT_VERSION"
TOOLS=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok kwokctl helm "$LWS" "$ACTIONLINT")
ONLY=("$@")
for t in "${ONLY[@]}"; do
  case $t in helm|actionlint) ;; *) echo "install-tools: can build only helm or actionlint alone, not $t" >&2; exit 2;; esac
done

log() { echo "install-tools: $*" >&2; }

if [ -f "$STAMP" ]; then
  for t in "${TOOLS[@]}"; do [ -x "$BIN/$t" ] || { rm -f "$STAMP"; break; }; done
  [ -f "$BIN/$LWS.crds.yaml" ] && [ -f "$BIN/$GIE" ] || rm -f "$STAMP"
fi
if [ -f "$STAMP" ]; then echo "$BIN"; exit 0; fi
only_ready() {
  local t
  for t in "${ONLY[@]}"; do [ -x "$BIN/$t" ] || return 1; done
}
if [ ${#ONLY[@]} -gt 0 ] && only_ready; then echo "$BIN"; exit 0; fi

command -v go >/dev/null || { log "Go is required (https://go.dev/dl); none found on PATH"; exit 1; }
# The checksum database is not reachable from every network; modules come from the proxy.
export GOSUMDB=${GOSUMDB:-off} GOTOOLCHAIN=${GOTOOLCHAIN_OVERRIDE:-local} GOFLAGS=-buildvcs=false CGO_ENABLED=0
mkdir -p "$BIN"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
started=$(date +%s)

build_kubernetes() {
  local v=$K8S_VERSION minor staging_v gomod
  minor=$(echo "$v" | cut -d. -f2)
  staging_v="v0.${v#v1.}"
  mkdir -p "$work/k8s" && cd "$work/k8s"
  go mod init local/k8sbuild >/dev/null 2>&1
  gomod=$(go mod download -json "k8s.io/kubernetes@$v" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  # Every staging module the release replaces with ./staging/... gets its published twin instead
  # (kubernetes/kubernetes#79384); the list comes from the release's own go.mod.
  local args=()
  while read -r mod; do args+=("-replace=$mod=$mod@$staging_v"); done < <(
    grep -E '^\s*k8s\.io/[^ ]+ => \./staging/' "$gomod" | awk '{print $1}')
  [ ${#args[@]} -gt 10 ] || { log "found only ${#args[@]} staging replaces in $gomod"; exit 1; }
  go mod edit "${args[@]}" "-require=k8s.io/kubernetes@$v"
  # Keep the release's godebug settings (they change runtime defaults the binaries rely on).
  grep -E '^godebug ' "$gomod" | while read -r _ kv; do go mod edit "-godebug=$kv"; done || true
  log "resolving k8s.io/kubernetes $v (${#args[@]} staging modules)"
  go get "k8s.io/kubernetes/cmd/kube-apiserver@$v" "k8s.io/kubernetes/cmd/kube-controller-manager@$v" \
    "k8s.io/kubernetes/cmd/kube-scheduler@$v" "k8s.io/kubernetes/cmd/kubectl@$v" >&2
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl"
  go build -trimpath -ldflags "$ld" -o "$BIN/" k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
}

build_etcd() {
  mkdir -p "$work/etcd" && cd "$work/etcd"
  go mod init local/etcdbuild >/dev/null 2>&1
  log "building etcd $ETCD_VERSION"
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
}

build_lws() {
  # The module's version list is not served by every proxy, its exact versions are: download the
  # release's module and build its manager from it (go install would ask for the list).
  local dir
  log "building the LeaderWorkerSet manager $LWS_VERSION"
  dir=$(go mod download -json "sigs.k8s.io/lws@$LWS_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  cp -r "$dir" "$work/lws" && chmod -R u+w "$work/lws" && cd "$work/lws"
  go build -trimpath -ldflags "-s -w" -o "$BIN/$LWS" ./cmd
  # Both CRDs: the manager always runs its DisaggregatedSet controller too.
  cat config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml \
      config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml > "$BIN/$LWS.crds.yaml"
}

fetch_gie() {
  # CRDs only: nothing to build. The exact version's module, as for LWS.
  local dir
  log "fetching the InferencePool CRD $GIE_VERSION"
  dir=$(cd "$work" && go mod download -json "sigs.k8s.io/gateway-api-inference-extension@$GIE_VERSION" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  cp "$dir/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml" "$BIN/$GIE"
}

build_go_install() {  # module path, version, packages...
  local ver=$1; shift
  log "installing $* @ $ver"
  local p; local pkgs=()
  for p in "$@"; do pkgs+=("$p@$ver"); done
  GOBIN="$BIN" go install -trimpath -ldflags "-s -w" "${pkgs[@]}"
}

build_actionlint() {
  build_go_install "$ACTIONLINT_VERSION" github.com/rhysd/actionlint/cmd/actionlint
  mv "$BIN/actionlint" "$BIN/$ACTIONLINT"
}

if [ ${#ONLY[@]} -gt 0 ]; then
  for t in "${ONLY[@]}"; do
    case $t in
      helm) [ -x "$BIN/helm" ] || build_go_install "$HELM_VERSION" helm.sh/helm/v3/cmd/helm ;;
      actionlint) [ -x "$BIN/$ACTIONLINT" ] || build_actionlint; ln -sf "$ACTIONLINT" "$BIN/actionlint" ;;
    esac
  done
  only_ready || { log "missing one of ${ONLY[*]} after build"; exit 1; }
  log "${ONLY[*]} ready in $BIN"
  echo "$BIN"
  exit 0
fi

[ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kubectl" ] && [ -x "$BIN/kube-scheduler" ] && [ -x "$BIN/kube-controller-manager" ] || build_kubernetes
[ -x "$BIN/etcd" ] || build_etcd
[ -x "$BIN/kwok" ] && [ -x "$BIN/kwokctl" ] || build_go_install "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
[ -x "$BIN/helm" ] || build_go_install "$HELM_VERSION" helm.sh/helm/v3/cmd/helm
[ -x "$BIN/$LWS" ] && [ -f "$BIN/$LWS.crds.yaml" ] || build_lws
[ -f "$BIN/$GIE" ] || fetch_gie
[ -x "$BIN/$ACTIONLINT" ] || build_actionlint
# hack/lws.sh runs whichever version this script was told to build.
ln -sf "$LWS" "$BIN/lws-manager" && ln -sf "$LWS.crds.yaml" "$BIN/lws-crds.yaml"
ln -sf "$GIE" "$BIN/inference-extension-crds.yaml"
ln -sf "$ACTIONLINT" "$BIN/actionlint"

for t in "${TOOLS[@]}"; do [ -x "$BIN/$t" ] || { log "missing $t after build"; exit 1; }; done
touch "$STAMP"
log "tools ready in $BIN after $(( $(date +%s) - started ))s"
echo "$BIN"
