#!/usr/bin/env bash
# `make dev`: a local cluster with simulated GPU nodes (and LeaderWorkerSet), the CRDs and GPU classes, the operator
# running from this checkout, two example TensorRT-LLM InferenceServices (their preparation Jobs
# and serving pods placed on nodes of their GPU classes; kwok simulates the containers), and the
# gateway in front of `smol`, which a real small LLM answers (SmolLM2-135M-Instruct on a local CPU
# Triton, through the same model LLM services run).
#   hack/dev.sh up | down
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
NAME=${CLUSTER_NAME:-triton-dev}
STATE_ROOT=${TRITON_OPERATOR_STATE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator/clusters}
STATE="$STATE_ROOT/$NAME"
PIDFILE="$STATE/operator.pid"
LOGFILE="$STATE/operator.log"
GATEWAY_PORT=${GATEWAY_PORT:-8090}

stop_pid() {  # stop_pid PIDFILE: the process it names, if it still runs
  if [ -f "$1" ]; then
    kill "$(cat "$1")" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$(cat "$1")" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$(cat "$1")" 2>/dev/null || true
    rm -f "$1"
  fi
}
stop_operator() { stop_pid "$STATE/gateway.pid"; stop_pid "$STATE/dev-triton.pid"; stop_pid "$PIDFILE"; }

case "${1:-up}" in
  down)
    stop_operator
    "$HERE/lws.sh" down "$NAME" 2>/dev/null || true
    "$HERE/cluster.sh" down "$NAME"
    exit 0 ;;
  up) ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac

"$HERE/install-llm.sh" >/dev/null   # llama-cpp-python (built once, cached) and the model file
export KUBECONFIG
KUBECONFIG=$("$HERE/cluster.sh" up "$NAME")
"$HERE/lws.sh" up "$NAME"   # LeaderWorkerSet, for models bigger than a node
BIN=$("$HERE/install-tools.sh")
export PATH="$BIN:$PATH"
cd "$ROOT"
kubectl apply --server-side -f crds/ >/dev/null
kubectl apply --server-side -f "$BIN/inference-extension-crds.yaml" >/dev/null   # InferencePool (spec.routing.inferencePool)
# kubectl wait fails at once, instead of waiting, while a CRD just applied has no conditions yet:
# asked again until every CRD is Established, for at most 60 s.
until_s=$((SECONDS + 60))
until kubectl wait --for=condition=Established crd --all --timeout=10s >/dev/null 2>&1; do
  [ $SECONDS -lt $until_s ] || { echo "dev: the CRDs were not Established within 60s" >&2; exit 1; }
  sleep 0.5
done
kubectl apply --server-side -f examples/gpuclasses.yaml >/dev/null

stop_operator
TRITON_OPERATOR_METRICS_ADDRESS=127.0.0.1 TRITON_OPERATOR_GATEWAY_URL=http://127.0.0.1:$GATEWAY_PORT \
  nohup .venv/bin/triton-operator run --liveness http://127.0.0.1:8089/healthz >"$LOGFILE" 2>&1 &
echo $! >"$PIDFILE"
for _ in $(seq 1 60); do curl -fsS http://127.0.0.1:8089/healthz >/dev/null 2>&1 && break; sleep 0.5; done
curl -fsS http://127.0.0.1:8089/healthz >/dev/null || { echo "operator did not start; see $LOGFILE" >&2; tail -20 "$LOGFILE" >&2; exit 1; }

# Serving pods meet the restricted Pod Security Standard.
kubectl create namespace ml --dry-run=client -o yaml | kubectl apply --server-side -f - >/dev/null
kubectl label namespace ml pod-security.kubernetes.io/enforce=restricted --overwrite >/dev/null
kubectl apply --server-side -f hack/dev-storage.yaml >/dev/null
kubectl apply -f examples/llama3-8b.yaml -f examples/llama3-70b.yaml >/dev/null
kubectl apply -f hack/dev-demo.yaml >/dev/null
kubectl wait --for=condition=Ready infsvc --all -n ml --timeout=120s >/dev/null

# The gateway, with one API key, and a local CPU Triton answering for smol's replica.
KEYS="$STATE/gateway-keys.yaml"
if [ ! -f "$KEYS" ]; then
  printf 'keys:\n  - {name: dev, key: sk-dev-%s, namespaces: [ml]}\n' "$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$KEYS"
  chmod 600 "$KEYS"
fi
API_KEY=$(sed -n 's/.*key: \(sk-dev-[0-9a-f]*\).*/\1/p' "$KEYS")
nohup .venv/bin/python hack/dev-triton.py "$STATE" ml smol >"$STATE/dev-triton.log" 2>&1 &
echo $! >"$STATE/dev-triton.pid"
nohup .venv/bin/triton-operator gateway --kubeconfig "$KUBECONFIG" --address 127.0.0.1 --port "$GATEWAY_PORT" \
  --metrics-port $((GATEWAY_PORT + 1)) --key-file "$KEYS" --resolve triton.dev.invalid=127.0.0.1 \
  --endpoint-slice-selector endpointslice.kubernetes.io/managed-by=dev.triton-operator.io >"$STATE/gateway.log" 2>&1 &
echo $! >"$STATE/gateway.pid"
for _ in $(seq 1 240); do
  curl -fsS -m 60 -H "Authorization: Bearer $API_KEY" "http://127.0.0.1:$GATEWAY_PORT/v2/models/smol/ready" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -fsS -H "Authorization: Bearer $API_KEY" "http://127.0.0.1:$GATEWAY_PORT/v2/models/smol/ready" >/dev/null || {
  echo "the smol model is not reachable through the gateway; see $STATE/gateway.log and $STATE/dev-triton.log" >&2; exit 1; }
echo
kubectl get infsvc,jobs,pods -n ml -o wide
cat <<MSG

The operator runs in the background (log: $LOGFILE).
Point kubectl at the cluster:
  export KUBECONFIG=$KUBECONFIG PATH=$BIN:\$PATH
  kubectl get nodes -L nvidia.com/gpu.product
  kubectl get infsvc -A

The gateway (OpenAI-compatible) listens on http://127.0.0.1:$GATEWAY_PORT with the API key $API_KEY
(log: $STATE/gateway.log). smol answers for real (SmolLM2-135M-Instruct on a local CPU Triton; a
model this small wanders at OpenAI's default temperature 1, so the example asks for greedy):
  .venv/bin/python -c 'import openai; c = openai.OpenAI(base_url="http://127.0.0.1:$GATEWAY_PORT/v1", api_key="$API_KEY")
for chunk in c.chat.completions.create(model="smol", messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0, max_tokens=64, stream=True):
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()'
Stop everything: make dev-down
MSG
