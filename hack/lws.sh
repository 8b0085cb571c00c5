#!/usr/bin/env bash
# LeaderWorkerSet (sigs.k8s.io/lws) on the local cluster of hack/cluster.sh: its CRDs, its real
# manager (built by hack/install-tools.sh) as a process on 127.0.0.1, and its webhooks registered
# by URL with a certificate made here. The pod webhook is what gives a group's pods their
# worker-index and group-index labels and the LWS_* environment, so it is not optional.
#
#   hack/lws.sh up [NAME]      install the CRDs, start the manager, register its webhooks
#   hack/lws.sh down [NAME]    stop the manager and remove its webhooks (the CRDs stay)
#
# State (certificate, configuration, log, pid) lives beside the cluster's, in $STATE/lws.
set -euo pipefail

cmd=${1:-up}
NAME=${2:-${CLUSTER_NAME:-triton-dev}}
HERE=$(cd "$(dirname "$0")" && pwd)
STATE_ROOT=${TRITON_OPERATOR_STATE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator/clusters}
STATE="$STATE_ROOT/$NAME"
DIR="$STATE/lws"
export KUBECONFIG="$STATE/kubeconfig"
WEBHOOKS=(lws-mutating-webhook-configuration lws-validating-webhook-configuration)

log() { echo "lws: $*" >&2; }

BIN=$("$HERE/install-tools.sh")
export PATH="$BIN:$PATH"

running() { [ -f "$DIR/pid" ] && kill -0 "$(cat "$DIR/pid")" 2>/dev/null; }

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

webhooks_yaml() {  # the manager's own webhooks (config/webhook), by URL instead of a Service
  local url=$1 ca=$2
  cat <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: ${WEBHOOKS[0]}}
webhooks:
  - name: mleaderworkerset.kb.io
    admissionReviewVersions: [v1]
    sideEffects: None
    failurePolicy: Fail
    timeoutSeconds: 10
    clientConfig: {url: "$url/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset", caBundle: $ca}
    rules: [{apiGroups: [leaderworkerset.x-k8s.io], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [leaderworkersets]}]
  - name: mpod.kb.io
    admissionReviewVersions: [v1]
    sideEffects: None
    failurePolicy: Fail
    timeoutSeconds: 10
    clientConfig: {url: "$url/mutate--v1-pod", caBundle: $ca}
    objectSelector: {matchExpressions: [{key: leaderworkerset.sigs.k8s.io/name, operator: Exists}]}
    rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: ${WEBHOOKS[1]}}
webhooks:
  - name: vleaderworkerset.kb.io
    admissionReviewVersions: [v1]
    sideEffects: None
    failurePolicy: Fail
    timeoutSeconds: 10
    clientConfig: {url: "$url/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset", caBundle: $ca}
    rules: [{apiGroups: [leaderworkerset.x-k8s.io], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [leaderworkersets]}]
  - name: vdisaggregatedset.kb.io
    admissionReviewVersions: [v1]
    sideEffects: None
    failurePolicy: Fail
    timeoutSeconds: 10
    clientConfig: {url: "$url/validate-disaggregatedset-x-k8s-io-v1-disaggregatedset", caBundle: $ca}
    rules: [{apiGroups: [disaggregatedset.x-k8s.io], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [disaggregatedsets]}]
YAML
}

up() {
  [ -f "$KUBECONFIG" ] || { log "no cluster $NAME (hack/cluster.sh up $NAME first)"; exit 1; }
  mkdir -p "$DIR/certs"
  if running && curl -sf "http://127.0.0.1:$(cat "$DIR/health-port")/readyz" >/dev/null; then
    log "manager already running"
    return
  fi
  kubectl apply --server-side --force-conflicts --field-manager=lws-sh -f "$BIN/lws-crds.yaml" >/dev/null
  # kubectl wait fails at once, instead of waiting, while a CRD just applied has no conditions yet
  # ("<nil> is of the type <nil>"): asked again until Established, for at most 60 s.
  local until=$((SECONDS + 60))
  until kubectl wait --for=condition=Established --timeout=10s \
      crd/leaderworkersets.leaderworkerset.x-k8s.io crd/disaggregatedsets.disaggregatedset.x-k8s.io >/dev/null 2>&1; do
    [ $SECONDS -lt $until ] || { log "the LeaderWorkerSet CRDs were not Established within 60s"; exit 1; }
    sleep 0.5
  done
  if [ ! -f "$DIR/certs/tls.crt" ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=lws-webhook" \
      -addext "subjectAltName=IP:127.0.0.1" -keyout "$DIR/certs/tls.key" -out "$DIR/certs/tls.crt" 2>/dev/null
  fi
  local port hport
  port=$(free_port); hport=$(free_port)
  echo "$hport" > "$DIR/health-port"
  cat > "$DIR/config.yaml" <<YAML
apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
webhook: {host: 127.0.0.1, port: $port, certDir: $DIR/certs}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:$hport"}
YAML
  lws-manager --kubeconfig "$KUBECONFIG" --config "$DIR/config.yaml" --leader-elect=false --zap-devel=false \
    > "$DIR/manager.log" 2>&1 &
  echo $! > "$DIR/pid"
  local deadline=$((SECONDS + 60))
  until curl -sf "http://127.0.0.1:$hport/readyz" >/dev/null; do
    running || { log "the manager exited:"; tail -20 "$DIR/manager.log" >&2; exit 1; }
    [ $SECONDS -lt $deadline ] || { log "the manager was not ready within 60s"; tail -20 "$DIR/manager.log" >&2; exit 1; }
    sleep 0.5
  done
  webhooks_yaml "https://127.0.0.1:$port" "$(base64 -w0 < "$DIR/certs/tls.crt")" \
    | kubectl apply --server-side --force-conflicts --field-manager=lws-sh -f - >/dev/null
  log "manager ready (webhooks on 127.0.0.1:$port, log $DIR/manager.log)"
}

down() {
  if [ -f "$KUBECONFIG" ]; then
    kubectl delete mutatingwebhookconfiguration "${WEBHOOKS[0]}" --ignore-not-found --request-timeout=10s >/dev/null 2>&1 || true
    kubectl delete validatingwebhookconfiguration "${WEBHOOKS[1]}" --ignore-not-found --request-timeout=10s >/dev/null 2>&1 || true
  fi
  if running; then
    kill "$(cat "$DIR/pid")" 2>/dev/null || true
    for _ in $(seq 50); do running || break; sleep 0.1; done
    running && kill -9 "$(cat "$DIR/pid")" 2>/dev/null || true
  fi
  rm -f "$DIR/pid"
  log "manager stopped"
}

case "$cmd" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down [NAME]" >&2; exit 2 ;;
esac
