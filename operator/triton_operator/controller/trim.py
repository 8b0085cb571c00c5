"""What the controller keeps of each kind in the watch-fed store (`kube.store`), and how it finds
an object's InferenceService: children keep their spec as compact JSON, pods only what status and
the autoscaler read, nodes and other pods only what the free-GPU view needs. Memory stays flat as
the fleet grows."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..kube.store import Key, trim
from ..labels import LABEL_GPU_CLASS, LABEL_SERVICE
from ..planning.capacity import pod_requests


def owner_of(obj: dict[str, Any]) -> Key | None:
    """The InferenceService a child or pod belongs to, from the label the operator puts on it."""
    meta = obj["metadata"]
    owner = (meta.get("labels") or {}).get(LABEL_SERVICE)
    return (meta.get("namespace") or "", owner) if owner else None


SPEC_JSON = "specJSON"


def trim_child(obj: dict[str, Any]) -> dict[str, Any]:
    """A child the operator renders (Deployment, Service, PDB, Job), trimmed, with its spec kept as
    compact JSON: the spec is read whole only when a pass compares it with a new rendering, and a
    spec as a string takes a fifth of the memory of the same spec as dicts. What other readers use
    stays a dict: replicas and the pod template's labels."""
    out = trim(obj)
    spec = out.pop("spec", None) or {}
    template = spec.get("template")
    group = spec.get("leaderWorkerTemplate")
    if group is not None:
        # A LeaderWorkerSet reads as a Deployment of groups: its leaders' template, and its ready
        # groups are the available ones (LWS counts a group ready once all its pods are).
        template = group.get("leaderTemplate") or group.get("workerTemplate")
        status = out.get("status")
        if status is not None:
            out["status"] = {**status, "availableReplicas": status.get("readyReplicas") or 0}
    template_labels = ((template or {}).get("metadata") or {}).get("labels")
    summary: dict[str, Any] = {}
    if "replicas" in spec:
        summary["replicas"] = spec["replicas"]
    if template_labels is not None:
        summary["template"] = {"metadata": {"labels": template_labels}}
    out["spec"] = summary
    out[SPEC_JSON] = json.dumps(spec, separators=(",", ":"))
    return out


def with_full_spec(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """A cached child with its whole spec (decoded from its compact form)."""
    if obj is None or SPEC_JSON not in obj:
        return obj
    out = {k: v for k, v in obj.items() if k != SPEC_JSON}
    out["spec"] = json.loads(obj[SPEC_JSON])
    return out


_POD_CONDITIONS = {"PodScheduled", "Ready"}
_POD_LABELS = {LABEL_SERVICE, LABEL_GPU_CLASS, "app.kubernetes.io/component", "batch.kubernetes.io/job-name",
               "job-name",
               # a group's pods (LeaderWorkerSet): which set, which group, which revision of its template
               "leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/group-index",
               "leaderworkerset.sigs.k8s.io/template-revision-hash"}


def trim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """What status needs of a serving pod: phase, scheduling and readiness, waiting reasons; and
    what the autoscaler needs: when it was created (its start-up runs from there to Ready)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    st = pod.get("status") or {}

    def terminated(state: dict[str, Any] | None) -> dict[str, Any] | None:
        t = (state or {}).get("terminated")
        if not t:
            return None
        # The termination message is where runtime/'s doctor says what is wrong.
        return {"exitCode": t.get("exitCode"), "reason": t.get("reason"), "message": (t.get("message") or "")[:1024]}

    def containers(statuses: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        out = []
        for s in statuses or []:
            state = dict(s.get("state") or {})
            if "terminated" in state:
                state["terminated"] = terminated(state)
            item = {"name": s.get("name"), "ready": s.get("ready"), "restartCount": s.get("restartCount"),
                    "state": state}
            last = terminated(s.get("lastState"))
            if last:
                item["lastState"] = {"terminated": last}
            out.append(item)
        return out

    return {
        "metadata": {
            "name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"), "deletionTimestamp": meta.get("deletionTimestamp"),
            "creationTimestamp": meta.get("creationTimestamp"),
            "labels": {k: v for k, v in labels.items() if k in _POD_LABELS},
        },
        "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")},
        "status": {
            "phase": st.get("phase"),
            "conditions": [c for c in st.get("conditions") or [] if c.get("type") in _POD_CONDITIONS],
            "initContainerStatuses": containers(st.get("initContainerStatuses")),
            "containerStatuses": containers(st.get("containerStatuses")),
        },
    }


def trim_node(node: dict[str, Any]) -> dict[str, Any] | None:
    """What the free-GPU view needs of a node: labels (GPU product, node selectors), taints,
    cordon, readiness and its allocatable extended resources (nvidia.com/gpu, MIG profiles).
    Nodes without any extended resource are not stored (None): no GPU class can use them."""
    meta, spec, st = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    allocatable = {k: v for k, v in (st.get("allocatable") or {}).items() if "/" in k and not k.startswith("hugepages")}
    if not allocatable:
        return None
    ready = next((c.get("status") == "True" for c in st.get("conditions") or [] if c.get("type") == "Ready"), True)
    return {
        "metadata": {"name": meta.get("name"), "resourceVersion": meta.get("resourceVersion"),
                     "labels": meta.get("labels") or {}},
        "spec": {"unschedulable": bool(spec.get("unschedulable")),
                 "taints": [{k: t.get(k) for k in ("key", "value", "effect")} for t in spec.get("taints") or []
                            if t.get("effect") in ("NoSchedule", "NoExecute")]},
        "status": {"allocatable": allocatable, "ready": ready},
    }


def trim_gpu_pod(pod: dict[str, Any]) -> dict[str, Any] | None:
    """A pod of any namespace or owner, as the free-GPU view needs it: its node and its
    extended-resource requests. Pods that request none, are not on a node yet, or have ended
    are not stored (None); most pods of a big cluster are thus a watch event and nothing more."""
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    phase = (pod.get("status") or {}).get("phase")
    if not node or phase in ("Succeeded", "Failed"):
        return None
    requests = pod_requests(pod)
    if not requests:
        return None
    meta = pod.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "resourceVersion": meta.get("resourceVersion")},
            "spec": {"nodeName": node}, "requests": requests}


# Set by the Deployment controller right after each rollout (the revision), never rendered: a
# pass that remembers a Deployment as it wrote it would otherwise plan again for each one.
CONTROLLER_ANNOTATIONS = ("deployment.kubernetes.io/",)


def content_token(obj: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What identifies a child's desired-side content: uid, generation (which moves with every
    spec change but not with status) or else resourceVersion, and a digest of the metadata a
    reconcile renders (labels, annotations, owners). Equal tokens mean an unchanged object."""
    if obj is None:
        return None
    meta = obj["metadata"]
    annotations = meta.get("annotations")
    if annotations and any(k.startswith(CONTROLLER_ANNOTATIONS) for k in annotations):
        annotations = {k: v for k, v in annotations.items() if not k.startswith(CONTROLLER_ANNOTATIONS)}
    digest = hashlib.blake2b(json.dumps(
        [meta.get("labels"), annotations, meta.get("ownerReferences")],
        sort_keys=True).encode(), digest_size=8).hexdigest()
    return meta.get("uid"), meta.get("generation") or meta.get("resourceVersion"), digest




# Children whose status no pass reads: a change to it alone (a PodDisruptionBudget's healthy counts
# as pods come up) cannot change what a pass writes, so it does not re-queue the service.
STATUS_UNREAD_KINDS = ("PodDisruptionBudget", "NetworkPolicy")


def concerns_owner(kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """Whether a child's change can change what a pass of its service does: always, but for a
    kind whose status no pass reads when only its status moved (same uid, generation, labels,
    annotations and owners)."""
    if kind not in STATUS_UNREAD_KINDS or old is None or new is None:
        return True
    if new["metadata"].get("deletionTimestamp") != old["metadata"].get("deletionTimestamp"):
        return True
    if not old["metadata"].get("generation") or not new["metadata"].get("generation"):
        return True   # no generation to tell a spec change from a status one
    return content_token(old) != content_token(new)
