#!/usr/bin/env bash
# `make dev`: a local cluster with simulated GPU nodes, the CRDs and GPU classes, the operator
# running from this checkout, and two example TensorRT-LLM InferenceServices: their engine-build
# Jobs and serving pods placed on nodes of their GPU classes (kwok simulates the containers).
#   hack/dev.sh up | down
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
NAME=${CLUSTER_NAME:-triton-dev}
STATE_ROOT=${TRITON_OPERATOR_STATE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator/clusters}
STATE="$STATE_ROOT/$NAME"
PIDFILE="$STATE/operator.pid"
LOGFILE="$STATE/operator.log"

stop_operator() {
  if [ -f "$PIDFILE" ]; then
    kill "$(cat "$PIDFILE")" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$(cat "$PIDFILE")" 2>/dev/null || true
    rm -f "$PIDFILE"
  fi
}

case "${1:-up}" in
  down)
    stop_operator
    "$HERE/cluster.sh" down "$NAME"
    exit 0 ;;
  up) ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac

export KUBECONFIG
KUBECONFIG=$("$HERE/cluster.sh" up "$NAME")
BIN=$("$HERE/install-tools.sh")
export PATH="$BIN:$PATH"
cd "$ROOT"
kubectl apply --server-side -f crds/ >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
kubectl apply --server-side -f examples/gpuclasses.yaml >/dev/null

stop_operator
TRITON_OPERATOR_METRICS_ADDRESS=127.0.0.1 nohup .venv/bin/triton-operator run --liveness http://127.0.0.1:8089/healthz >"$LOGFILE" 2>&1 &
echo $! >"$PIDFILE"
for _ in $(seq 1 60); do curl -fsS http://127.0.0.1:8089/healthz >/dev/null 2>&1 && break; sleep 0.5; done
curl -fsS http://127.0.0.1:8089/healthz >/dev/null || { echo "operator did not start; see $LOGFILE" >&2; tail -20 "$LOGFILE" >&2; exit 1; }

# Serving pods meet the restricted Pod Security Standard.
kubectl create namespace ml --dry-run=client -o yaml | kubectl apply --server-side -f - >/dev/null
kubectl label namespace ml pod-security.kubernetes.io/enforce=restricted --overwrite >/dev/null
kubectl apply --server-side -f hack/dev-storage.yaml >/dev/null
kubectl apply -f examples/llama3-8b.yaml -f examples/llama3-70b.yaml >/dev/null
kubectl wait --for=condition=Ready infsvc --all -n ml --timeout=120s >/dev/null
echo
kubectl get infsvc,jobs,pods -n ml -o wide
cat <<MSG

The operator runs in the background (log: $LOGFILE).
Point kubectl at the cluster:
  export KUBECONFIG=$KUBECONFIG PATH=$BIN:\$PATH
  kubectl get nodes -L nvidia.com/gpu.product
  kubectl get infsvc -A
Stop everything: make dev-down
MSG
