#!/usr/bin/env bash
# A real local Kubernetes (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) with
# kwok-simulated GPU nodes, run by kwokctl's binary runtime on 127.0.0.1. No Docker, no downloads:
# hack/install-tools.sh builds every binary from the Go module proxy.
#
#   hack/cluster.sh up [NAME]      create (or reuse) the cluster and its GPU nodes
#   hack/cluster.sh down [NAME]    stop it and delete its state; no process is left behind
#   hack/cluster.sh env [NAME]     print the exports that point kubectl/helm at it
#
# State (kubeconfig, logs, etcd data) lives in $TRITON_OPERATOR_STATE/NAME, outside the work tree.
set -euo pipefail

cmd=${1:-up}
NAME=${2:-${CLUSTER_NAME:-triton-dev}}
HERE=$(cd "$(dirname "$0")" && pwd)
STATE_ROOT=${TRITON_OPERATOR_STATE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator/clusters}
STATE="$STATE_ROOT/$NAME"
KUBECONFIG_FILE="$STATE/kubeconfig"
SERVICE_CIDR=${SERVICE_CIDR:-10.96.0.0/16}

log() { echo "cluster: $*" >&2; }

tools() {
  BIN=$("$HERE/install-tools.sh")
  export PATH="$BIN:$PATH"   # kwokctl health-checks with kubectl from PATH
  export KWOK_WORKDIR="$STATE/kwok"
}

nodes_yaml() {
  # class product gpus-per-node node-count memory-MiB family cc-major cc-minor
  local spec
  while read -r cls product gpus count mem family major minor; do
    for i in $(seq 0 $((count - 1))); do
      cat <<YAML
---
apiVersion: v1
kind: Node
metadata:
  name: gpu-$cls-$i
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels:
    kubernetes.io/hostname: gpu-$cls-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
    node.kubernetes.io/instance-type: sim-$cls-x$gpus
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: $product
    nvidia.com/gpu.count: "$gpus"
    nvidia.com/gpu.memory: "$mem"
    nvidia.com/gpu.family: $family
    nvidia.com/gpu.compute.major: "$major"
    nvidia.com/gpu.compute.minor: "$minor"
    nvidia.com/mig.strategy: none
spec:
  taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
status:
  allocatable: {cpu: "96", memory: 1000Gi, pods: "110", nvidia.com/gpu: "$gpus", ephemeral-storage: 2Ti}
  capacity: {cpu: "96", memory: 1000Gi, pods: "110", nvidia.com/gpu: "$gpus", ephemeral-storage: 2Ti}
  nodeInfo: {architecture: amd64, operatingSystem: linux, kubeletVersion: fake, kubeProxyVersion: fake}
YAML
    done
  done <<'NODES'
h100 NVIDIA-H100-80GB-HBM3 8 2 81559 hopper 9 0
h200 NVIDIA-H200 8 1 143771 hopper 9 0
a100-80gb NVIDIA-A100-SXM4-80GB 8 2 81920 ampere 8 0
l4 NVIDIA-L4 4 4 23034 ada-lovelace 8 9
NODES
  # One CPU-only node, untainted: where non-GPU pods land. It has a disk, as real nodes do: the
  # preparation Job of a model that needs no quantization downloads here, asking ephemeral storage.
  cat <<'YAML'
---
apiVersion: v1
kind: Node
metadata:
  name: cpu-0
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels: {kubernetes.io/hostname: cpu-0, kubernetes.io/os: linux, kubernetes.io/arch: amd64, type: kwok}
status:
  allocatable: {cpu: "32", memory: 128Gi, pods: "110", ephemeral-storage: 500Gi}
  capacity: {cpu: "32", memory: 128Gi, pods: "110", ephemeral-storage: 500Gi}
  nodeInfo: {architecture: amd64, operatingSystem: linux, kubeletVersion: fake, kubeProxyVersion: fake}
YAML
}

up() {
  tools
  mkdir -p "$STATE"
  if [ -f "$KUBECONFIG_FILE" ] && kubectl --kubeconfig "$KUBECONFIG_FILE" --request-timeout=5s get --raw /readyz >/dev/null 2>&1; then
    log "cluster $NAME already running"
  else
    [ -d "$STATE/kwok" ] && { kwokctl delete cluster --name "$NAME" --kubeconfig "$KUBECONFIG_FILE" >/dev/null 2>&1 || true; }
    local started=$(date +%s)
    cat > "$STATE/kwok.yaml" <<YAML
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  runtime: binary
  bindAddress: 127.0.0.1
  kubeVersion: $("$BIN/kube-apiserver" --version | awk '{print $2}')
  kubeBinaryPrefix: $BIN
  kubectlBinary: $BIN/kubectl
  etcdBinary: $BIN/etcd
  kwokControllerBinary: $BIN/kwok
  kubeAuthorization: true
  kubeAdmission: true
# kube-apiserver's default Service range (10.0.0.0/24) holds about 250 Services; a /16 holds a
# fleet of thousands (make bench-scale). The controller-manager must agree with the apiserver.
componentsPatches:
  - name: kube-apiserver
    extraArgs:
      - {key: service-cluster-ip-range, value: $SERVICE_CIDR}
  - name: kube-controller-manager
    extraArgs:
      - {key: service-cluster-ip-range, value: $SERVICE_CIDR}
YAML
    # Audit every request a ServiceAccount makes (metadata only): the e2e suite proves from this
    # log that the operator's RBAC grants nothing it does not use.
    cat > "$STATE/audit-policy.yaml" <<'YAML'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
YAML
    log "creating cluster $NAME"
    kwokctl create cluster --name "$NAME" --config "$STATE/kwok.yaml" --kubeconfig "$KUBECONFIG_FILE" \
      --kube-audit-policy "$STATE/audit-policy.yaml" --wait 120s >&2
    log "control plane up in $(( $(date +%s) - started ))s"
  fi
  export KUBECONFIG="$KUBECONFIG_FILE"
  nodes_yaml | kubectl apply --server-side --field-manager=cluster-sh -f - >/dev/null
  kubectl wait --for=condition=Ready node --all --timeout=120s >/dev/null
  # Pods need their namespace's default ServiceAccount, which the controller-manager creates.
  until kubectl get serviceaccount default -n default >/dev/null 2>&1; do sleep 1; done
  log "nodes ready:"
  kubectl get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count >&2
  echo "$KUBECONFIG_FILE"
}

down() {
  tools
  # A LeaderWorkerSet manager hack/lws.sh started for this cluster goes with it.
  if [ -f "$STATE/lws/pid" ]; then kill "$(cat "$STATE/lws/pid")" 2>/dev/null || true; fi
  if [ -d "$STATE" ]; then
    kwokctl delete cluster --name "$NAME" --kubeconfig "$KUBECONFIG_FILE" >&2 || true
    rm -rf "$STATE"
  fi
  log "cluster $NAME deleted"
}

case "$cmd" in
  up) up ;;
  down) down ;;
  env) tools; echo "export KUBECONFIG=$KUBECONFIG_FILE PATH=$BIN:\$PATH" ;;
  audit-log) ls "$STATE"/kwok/clusters/"$NAME"/logs/audit.log ;;
  logs) ls -d "$STATE"/kwok/clusters/"$NAME"/logs ;;
  nodes) nodes_yaml ;;
  *) echo "usage: $0 up|down|env|nodes|audit-log|logs [NAME]" >&2; exit 2 ;;
esac
