"""GPU capacity (pure): free GPUs per class from the nodes and the pods bound to them, and how a
replica's serving capacity differs between classes.

Free GPUs on a node = its allocatable GPUs minus the GPU requests of every pod bound to it (any
namespace, any owner: a GPU another team's pod holds is not free). A replica needs all its GPUs
on one node, so the room of a class is the sum over its nodes of free // GPUs per replica. Nodes
count for a class when they carry its product label and node selector, accept new pods
(not cordoned, Ready) and every NoSchedule/NoExecute taint is tolerated by the class.

The objects are the cache's trimmed forms (controller/trim.trim_node, trim_gpu_pod): nodes with
labels, taints, unschedulable, readiness and allocatable extended resources; pods with their node
and extended-resource requests.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from ..api import GPUClass, GPUClassSpec, Toleration


def tolerates(tolerations: Iterable[Toleration], taint: Mapping[str, Any]) -> bool:
    """Whether a taint is tolerated, as the scheduler's TaintToleration plugin matches them."""
    for t in tolerations:
        if t.effect and t.effect != taint.get("effect"):
            continue
        if t.operator == "Exists" and (not t.key or t.key == taint.get("key")):
            return True
        if t.operator == "Equal" and t.key == taint.get("key") and (t.value or "") == (taint.get("value") or ""):
            return True
    return False


def node_in_class(node: Mapping[str, Any], cls: GPUClassSpec) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    if cls.product_names and labels.get(cls.product_label) not in cls.product_names:
        return False
    if any(labels.get(k) != v for k, v in cls.node_selector.items()):
        return False
    spec, status = node.get("spec") or {}, node.get("status") or {}
    if spec.get("unschedulable") or status.get("ready") is False:
        return False
    return all(tolerates(cls.tolerations, t) for t in spec.get("taints") or []
               if t.get("effect") in ("NoSchedule", "NoExecute"))


def used_per_node(pods: Iterable[Mapping[str, Any]], resource: str) -> dict[str, int]:
    used: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        n = int((pod.get("requests") or {}).get(resource) or 0)
        if node and n:
            used[node] = used.get(node, 0) + n
    return used


def free_gpus(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
              classes: Mapping[str, GPUClass]) -> dict[str, list[int]]:
    """Free GPUs on each node of each class (a node may serve several classes)."""
    nodes, pods = list(nodes), list(pods)
    by_resource: dict[str, dict[str, int]] = {}
    out: dict[str, list[int]] = {}
    for name, c in classes.items():
        res = c.spec.resource_name
        if res not in by_resource:
            by_resource[res] = used_per_node(pods, res)
        used = by_resource[res]
        free = []
        for node in nodes:
            if not node_in_class(node, c.spec):
                continue
            total = int(((node.get("status") or {}).get("allocatable") or {}).get(res) or 0)
            free.append(max(0, total - used.get(node["metadata"]["name"], 0)))
        out[name] = free
    return out


def room(free: Iterable[int], gpus_per_replica: int, nodes_per_replica: int = 1) -> int:
    """Replicas that fit: all of a replica's GPUs on one node; a replica across nodes (a group of
    `nodes_per_replica` pods of gpus_per_replica / nodes GPUs each) on that many nodes with room."""
    if nodes_per_replica <= 1:
        return sum(f // max(1, gpus_per_replica) for f in free)
    per_pod = max(1, gpus_per_replica // nodes_per_replica)
    return sum(f // per_pod for f in free) // nodes_per_replica


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """A pod's effective request of each extended resource (names with a '/': nvidia.com/gpu, MIG
    profiles), as the scheduler computes it: the larger of the app containers' sum (plus restartable
    init containers, i.e. sidecars) and the largest plain init container (plus the sidecars started
    before it, approximated by all of them); plus the pod overhead."""
    spec = pod.get("spec") or {}

    def ext(container: Mapping[str, Any]) -> dict[str, int]:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}  # limits default requests
        out = {}
        for k, v in merged.items():
            if "/" in k:
                try:
                    out[k] = int(float(str(v)))
                except ValueError:
                    continue
        return out

    apps: dict[str, int] = {}
    for c in spec.get("containers") or []:
        for k, v in ext(c).items():
            apps[k] = apps.get(k, 0) + v
    sidecars: dict[str, int] = {}
    inits: list[dict[str, int]] = []
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            _add(sidecars, ext(c))
        else:
            inits.append(ext(c))
    total = dict(apps)
    _add(total, sidecars)
    for init in inits:
        for k, v in init.items():
            total[k] = max(total.get(k, 0), v + sidecars.get(k, 0))
    _add(total, {k: int(float(str(v))) for k, v in (spec.get("overhead") or {}).items() if "/" in k})
    return {k: v for k, v in total.items() if v}


def _add(into: dict[str, int], more: Mapping[str, int]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


# -- serving capacity per class ---------------------------------------------------------------------

def relative_capacity(classes: Mapping[str, tuple[GPUClassSpec, int]], preferred: str) -> dict[str, float]:
    """A replica's serving capacity on each class relative to one on the preferred class.

    LLM decode is memory-bandwidth bound (every token reads all weights), so at the same batch a
    replica's throughput scales with bandwidth x GPUs per replica: an H200 replica (4.8 TB/s)
    serves ~1.43x an H100 one (3.35 TB/s), an A100 one (2.0 TB/s) ~0.6x. `classes` maps a class to
    (its spec, GPUs per replica). Prefill is compute bound and shifts this a little; the autoscaler
    learns the real figure (throughput / ready) per class where it can."""
    base_spec, base_n = classes[preferred]
    base = base_spec.memory_bandwidth_tbps * base_n
    return {name: round(spec.memory_bandwidth_tbps * n / base, 3) for name, (spec, n) in classes.items()}


def equivalent_replicas(ready: Mapping[str, int], weights: Mapping[str, float]) -> float:
    """Ready replicas counted in preferred-class replicas (sum of ready x relative capacity)."""
    return sum(n * weights.get(c, 1.0) for c, n in ready.items())


def replicas_for(equivalents: float, current: Mapping[str, int], weights: Mapping[str, float], adds_to: str) -> int:
    """The total replicas that give `equivalents` preferred-class replicas of capacity, when the
    replicas there are stay and the difference is added on (or removed from) class `adds_to`
    (where the placement puts the next replica: the preferred class, or the spill class during a
    shortage)."""
    have = equivalent_replicas(current, weights)
    total = sum(current.values())
    w = weights.get(adds_to, 1.0) or 1.0
    delta = (equivalents - have) / w
    step = math.ceil(delta - 1e-9) if delta > 0 else -math.floor(-delta + 1e-9)
    return max(0, total + step)
