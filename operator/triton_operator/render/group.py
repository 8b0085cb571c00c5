"""A replica that spans nodes (pure): a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) whose groups
are the replicas, one pod a node, made from the pod a one-node replica would run.

How the group starts is TensorRT-LLM's documented multi-node launch of its LLM API (the
`trtllm-llmapi-launch` wrapper under `mpirun`, one MPI rank a GPU, as the Triton TensorRT-LLM
backend's docs/llmapi.md runs `tritonserver` across nodes):
- every worker runs an SSH server on SSH_PORT, which accepts the service's key only (the key pair
  is a Secret the operator creates once, named by `ssh_secret_name`; no password, no other user),
  and gives its sessions the container's PATH and LD_LIBRARY_PATH (where Open MPI's orted and the
  CUDA libraries are: an SSH session does not inherit the container's environment);
- the leader waits for its workers' SSH servers (their names come from LWS's LWS_LEADER_ADDRESS
  and LWS_GROUP_SIZE), at most `START_TIMEOUT_S`, then runs `mpirun` across the group with
  `trtllm-llmapi-launch tritonserver ...`: rank 0 serves (Triton on the leader, the only pod the
  Service selects), the other ranks hold their GPUs' share of the model. A leader whose workers
  do not come up exits, and LWS recreates the group.
- the environment the ranks need is forwarded by name (`mpirun -x`), never by value in an argument
  (Triton's admin key stays on the leader).

LWS restarts the whole group when any of its pods restarts (RecreateGroupOnPodRestart), starts
the workers with the leader (LeaderCreated: the leader cannot be ready before them), and rolls
groups one at a time within the rollout's surge and unavailability.
"""

from __future__ import annotations

import copy
from typing import Any

from ..labels import LABEL_SERVICE
from ..planning.fit import Layout
from .server import ADMIN_KEY_ENV, MPI_LAUNCHER

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
GROUP_SUFFIX = "-group"      # LWS makes a headless Service named as the set: not the service's own name
# A group's workers are a StatefulSet named <set>-<group index>, and a StatefulSet's name must leave
# room in 63 characters for the revision hash of its pods' label (52): with up to 3 digits of index,
MAX_NAME = 48
SSH_PORT = 2222
START_TIMEOUT_S = 600
SSH_SECRET_SUFFIX = "-mpi-ssh"
SSH_KEY, SSH_PUBLIC_KEY = "id_ed25519", "id_ed25519.pub"
SSH_MOUNT = "/etc/triton-mpi/key"
MPI_DIR = "/var/run/triton-mpi"
WORKER_COMPONENT = "worker"
# What the ranks on the workers need of the leader's environment besides the container's own
# variables: the image's paths.
FORWARDED_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "HOME")

LEADER_SCRIPT = r"""set -eu
d=%(dir)s
umask 077
cp %(key)s/%(private)s "$d/id"
cat > "$d/ssh_config" <<EOF
Host *
  Port %(port)d
  IdentityFile $d/id
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  ConnectionAttempts 20
  LogLevel ERROR
EOF
gpus=%(gpus)d
hosts="$LWS_LEADER_ADDRESS:$gpus"
workers=""
i=1
while [ "$i" -lt "$LWS_GROUP_SIZE" ]; do
  w=$(echo "$LWS_LEADER_ADDRESS" | sed "s/\./-$i./")
  workers="$workers $w"
  hosts="$hosts,$w:$gpus"
  i=$((i + 1))
done
deadline=$(( $(date +%%s) + %(timeout)d ))
for w in $workers; do
  until python3 -c "import socket,sys; socket.create_connection((sys.argv[1], %(port)d), 2).close()" "$w" 2>/dev/null; do
    if [ "$(date +%%s)" -ge "$deadline" ]; then
      echo "worker $w did not accept SSH on port %(port)d within %(timeout)ds; the group restarts" >&2
      exit 1
    fi
    sleep 2
  done
done
exec mpirun --bind-to none -np $((LWS_GROUP_SIZE * gpus)) -H "$hosts" \
  --mca plm_rsh_args "-F $d/ssh_config" %(forward)s \
  trtllm-llmapi-launch "$@"
"""

WORKER_SCRIPT = r"""set -eu
d=%(dir)s
umask 077
cp %(key)s/%(public)s "$d/authorized_keys"
ssh-keygen -q -t ed25519 -N "" -f "$d/host_key"
cat > "$d/sshd_config" <<EOF
Port %(port)d
HostKey $d/host_key
AuthorizedKeysFile $d/authorized_keys
PidFile $d/sshd.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
StrictModes no
UsePAM no
AllowTcpForwarding no
X11Forwarding no
PermitUserEnvironment no
SetEnv PATH=$PATH LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
EOF
exec /usr/sbin/sshd -D -e -f "$d/sshd_config"
"""


def group_name(workload_name: str) -> str:
    return f"{workload_name}{GROUP_SUFFIX}"


def ssh_secret_name(isvc_name: str) -> str:
    return f"{isvc_name}{SSH_SECRET_SUFFIX}"


EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"


def leader_worker_set(deployment: dict[str, Any], layout: Layout, ssh_secret: str,
                      topology_key: str | None = None) -> dict[str, Any]:
    """The LeaderWorkerSet for one GPU class's replicas of `layout.nodes` nodes each, from the
    Deployment a replica of one node's GPUs (`layout.tensor`) would have: its replicas, rollout,
    labels and pod template (the model's init containers and volumes on every pod). With the
    class's `topology_key`, each group's pods share one value of that node label, and no two groups
    share one (LWS's exclusive topology)."""
    spec = deployment["spec"]
    template = spec["template"]
    rolling = spec["strategy"]["rollingUpdate"]
    leader = _leader(copy.deepcopy(template), layout, ssh_secret)
    worker = _worker(copy.deepcopy(template), ssh_secret)
    meta = copy.deepcopy(deployment["metadata"])
    meta["name"] = group_name(meta["name"])
    if topology_key:
        meta["annotations"] = {**meta.get("annotations", {}), EXCLUSIVE_TOPOLOGY: topology_key}
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": meta,
        "spec": {
            "replicas": spec["replicas"],
            "startupPolicy": "LeaderCreated",
            # Rendered in full: LWS's controller reads these without defaults of its own.
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {
                "maxUnavailable": rolling["maxUnavailable"], "maxSurge": rolling["maxSurge"], "partition": 0}},
            "networkConfig": {"subdomainPolicy": "Shared"},
            "leaderWorkerTemplate": {
                "size": layout.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def _mpi_volumes(pod: dict[str, Any], ssh_secret: str) -> None:
    pod["volumes"] = [*pod.get("volumes", []),
                      {"name": "mpi-key", "secret": {"secretName": ssh_secret, "defaultMode": 0o440}},
                      {"name": "mpi", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]


def _mounts(container: dict[str, Any]) -> None:
    container["volumeMounts"] = [*container.get("volumeMounts", []),
                                 {"name": "mpi-key", "mountPath": SSH_MOUNT, "readOnly": True},
                                 {"name": "mpi", "mountPath": MPI_DIR}]


def _server(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["containers"] if c["name"] == "triton")


def _leader(template: dict[str, Any], layout: Layout, ssh_secret: str) -> dict[str, Any]:
    pod = template["spec"]
    _mpi_volumes(pod, ssh_secret)
    server = _server(pod)
    args = list(server["args"])
    if args[:len(MPI_LAUNCHER)] == MPI_LAUNCHER:
        args = args[len(MPI_LAUNCHER):]
    names = [*FORWARDED_ENV, *(e["name"] for e in server.get("env", [])
                               if e["name"] not in FORWARDED_ENV and e["name"] != ADMIN_KEY_ENV)]
    script = LEADER_SCRIPT % {"dir": MPI_DIR, "key": SSH_MOUNT, "private": SSH_KEY, "port": SSH_PORT,
                              "gpus": layout.tensor, "timeout": START_TIMEOUT_S,
                              "forward": " ".join(f"-x {n}" for n in names)}
    server["args"] = ["sh", "-c", script, "triton-group-leader", *args]
    # Open MPI keeps the workers' names as LWS gives them (its default shortens them to the host).
    server["env"] = [*server.get("env", []), {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "1"}]
    _mounts(server)
    # The leader's start-up includes its workers'.
    probe = server.get("startupProbe")
    if probe:
        probe["failureThreshold"] = probe["failureThreshold"] + -(-START_TIMEOUT_S // probe["periodSeconds"])
    return template


def _worker(template: dict[str, Any], ssh_secret: str) -> dict[str, Any]:
    meta = template["metadata"]
    # Not a server: neither the Service, the PodDisruptionBudget's count of replicas, nor
    # Prometheus (no Triton runs here) select it.
    meta["labels"] = {**meta["labels"], "app.kubernetes.io/component": WORKER_COMPONENT}
    meta["annotations"] = {k: v for k, v in meta.get("annotations", {}).items() if not k.startswith("prometheus.io/")}
    pod = template["spec"]
    _mpi_volumes(pod, ssh_secret)
    server = _server(pod)
    server["args"] = ["sh", "-c", WORKER_SCRIPT % {"dir": MPI_DIR, "key": SSH_MOUNT, "public": SSH_PUBLIC_KEY,
                                                   "port": SSH_PORT}]
    server["ports"] = [{"name": "ssh", "containerPort": SSH_PORT, "protocol": "TCP"}]
    for probe in ("startupProbe", "livenessProbe"):
        server.pop(probe, None)
    server["readinessProbe"] = {"tcpSocket": {"port": "ssh"}, "periodSeconds": 5, "timeoutSeconds": 3,
                                "failureThreshold": 3}
    _mounts(server)
    return template


def group_selector(isvc_name: str) -> dict[str, Any]:
    """Every pod of a multi-node service's groups (leaders and workers), not its preparation's."""
    return {"matchLabels": {LABEL_SERVICE: isvc_name},
            "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                                  "values": ["server", WORKER_COMPONENT]}]}


def ssh_key_secret(isvc_name: str, namespace: str, owner: list[dict[str, Any]] | None, private: str,
                   public: str) -> dict[str, Any]:
    """The Secret of a multi-node service's SSH key pair (the leader's key, the workers' authorized key)."""
    meta: dict[str, Any] = {"name": ssh_secret_name(isvc_name), "namespace": namespace,
                            "labels": {LABEL_SERVICE: isvc_name, "app.kubernetes.io/managed-by": "triton-operator",
                                       "app.kubernetes.io/component": "mpi-key"}}
    if owner:
        meta["ownerReferences"] = owner
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
            "stringData": {SSH_KEY: private, SSH_PUBLIC_KEY: public}}
