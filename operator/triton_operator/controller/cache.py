"""The watch-fed cache: every object the operator reads, kept in memory and updated by watch
events (see `informer`), so that a reconcile reads no API and a fleet at rest costs nothing.

Objects are stored trimmed (no managedFields; pods keep only what status needs) to keep memory
flat as the fleet grows. Writers (the informers, and the operator's own writes through
`write_through`) hold a lock; readers get the stored dicts and must not mutate them.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any, Iterable

from ..labels import LABEL_GPU_CLASS, LABEL_SERVICE
from ..planning.capacity import pod_requests

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]


def owner_of(obj: dict[str, Any]) -> Key | None:
    """The InferenceService a child or pod belongs to, from the label the operator puts on it."""
    meta = obj["metadata"]
    owner = (meta.get("labels") or {}).get(LABEL_SERVICE)
    return (meta.get("namespace") or "", owner) if owner else None


def newer(candidate: str | None, current: str | None) -> bool:
    """Whether resourceVersion `candidate` is newer than `current`. resourceVersions are opaque by
    contract, but every API server backed by etcd3 issues increasing integers; where they are not
    integers, the latest arrival wins."""
    if not current or not candidate:
        return True
    if candidate.isdigit() and current.isdigit():
        return int(candidate) > int(current)
    return candidate != current


def _meta(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k != "managedFields"}


def trim(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without its managedFields (often half its size)."""
    out = {k: v for k, v in obj.items() if k != "metadata"}
    out["metadata"] = _meta(obj.get("metadata") or {})
    return out


SPEC_JSON = "specJSON"


def trim_child(obj: dict[str, Any]) -> dict[str, Any]:
    """A child the operator renders (Deployment, Service, PDB, Job), trimmed, with its spec kept as
    compact JSON: the spec is read whole only when a pass compares it with a new rendering, and a
    spec as a string takes a fifth of the memory of the same spec as dicts. What other readers use
    stays a dict: replicas and the pod template's labels."""
    out = trim(obj)
    spec = out.pop("spec", None) or {}
    template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels")
    summary: dict[str, Any] = {}
    if "replicas" in spec:
        summary["replicas"] = spec["replicas"]
    if template_labels is not None:
        summary["template"] = {"metadata": {"labels": template_labels}}
    out["spec"] = summary
    out[SPEC_JSON] = json.dumps(spec, separators=(",", ":"))
    return out


def same_content(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two stored objects differ at most in their resourceVersion."""
    if a.keys() != b.keys():
        return False
    for k, v in a.items():
        if k == "metadata":
            w = b[k]
            if v.keys() != w.keys() or any(v[m] != w[m] for m in v if m != "resourceVersion"):
                return False
        elif v != b[k]:
            return False
    return True


def whole(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """A cached child with its whole spec (decoded from its compact form)."""
    if obj is None or SPEC_JSON not in obj:
        return obj
    out = {k: v for k, v in obj.items() if k != SPEC_JSON}
    out["spec"] = json.loads(obj[SPEC_JSON])
    return out


_POD_CONDITIONS = {"PodScheduled", "Ready"}
_POD_LABELS = {LABEL_SERVICE, LABEL_GPU_CLASS, "app.kubernetes.io/component", "batch.kubernetes.io/job-name",
               "job-name"}


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


def token(obj: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What identifies a child's desired-side content: uid, generation (which moves with every
    spec change but not with status) or else resourceVersion, and a digest of the metadata a
    reconcile renders (labels, annotations, owners). Equal tokens mean an unchanged object."""
    if obj is None:
        return None
    meta = obj["metadata"]
    digest = hashlib.blake2b(json.dumps(
        [meta.get("labels"), meta.get("annotations"), meta.get("ownerReferences")],
        sort_keys=True).encode(), digest_size=8).hexdigest()
    return meta.get("uid"), meta.get("generation") or meta.get("resourceVersion"), digest


class Store:
    """Objects by kind and key, plus children and pods by owning InferenceService."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._objects: dict[str, dict[Key, dict[str, Any]]] = {}
        self._owned: dict[str, dict[Key, dict[str, dict[str, Any]]]] = {}
        self._versions: dict[str, int] = {}

    # -- writes (informers and write-through) ---------------------------------------------------

    def _index(self, kind: str, obj: dict[str, Any], add: bool) -> None:
        owner = owner_of(obj)
        if owner is None:
            return
        owned = self._owned.setdefault(kind, {})
        name = obj["metadata"]["name"]
        if add:
            owned.setdefault(owner, {})[name] = obj
        else:
            siblings = owned.get(owner)
            if siblings is not None:
                siblings.pop(name, None)
                if not siblings:
                    del owned[owner]

    def upsert(self, kind: str, obj: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
        """Store `obj` unless an object of the same or a newer resourceVersion is there.
        Returns (the previous object, whether anything changed). A newer object whose stored
        (trimmed) content is the same but for its resourceVersion (a node's heartbeat, a pod's
        status change the GPU view does not keep) replaces the old one and counts as no change:
        nobody is told, and derived views keep their memo."""
        key = key_of(obj)
        with self._lock:
            objects = self._objects.setdefault(kind, {})
            old = objects.get(key)
            if old is not None and not newer(obj["metadata"].get("resourceVersion"),
                                             old["metadata"].get("resourceVersion")):
                return old, False
            if old is not None:
                self._index(kind, old, add=False)
            objects[key] = obj
            self._index(kind, obj, add=True)
            if old is not None and same_content(old, obj):
                return old, False
            self._versions[kind] = self._versions.get(kind, 0) + 1
            return old, True

    def remove(self, kind: str, obj: dict[str, Any]) -> dict[str, Any] | None:
        key = key_of(obj)
        with self._lock:
            old = self._objects.get(kind, {}).pop(key, None)
            if old is not None:
                self._index(kind, old, add=False)
                self._versions[kind] = self._versions.get(kind, 0) + 1
            return old

    def replace(self, kind: str, namespace: str | None, objs: Iterable[dict[str, Any]]
                ) -> list[tuple[dict[str, Any] | None, dict[str, Any] | None]]:
        """A fresh listing of `kind` (in `namespace`, or everywhere when None): store it and
        return the (old, new) pairs that differ, deletions as (old, None)."""
        changes: list[tuple[dict[str, Any] | None, dict[str, Any] | None]] = []
        with self._lock:
            objects = self._objects.setdefault(kind, {})
            seen: set[Key] = set()
            for obj in objs:
                key = key_of(obj)
                seen.add(key)
                old = objects.get(key)
                if old is None or old["metadata"].get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                    if old is not None:
                        self._index(kind, old, add=False)
                    objects[key] = obj
                    self._index(kind, obj, add=True)
                    changes.append((old, obj))
            for key in [k for k in objects if k not in seen and (namespace is None or k[0] == namespace)]:
                old = objects.pop(key)
                self._index(kind, old, add=False)
                changes.append((old, None))
            if changes:
                self._versions[kind] = self._versions.get(kind, 0) + 1
        return changes

    # -- reads ------------------------------------------------------------------------------------

    def get(self, kind: str, key: Key) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get(kind, {}).get(key)

    def list(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._objects.get(kind, {}).values())

    def keys(self, kind: str) -> list[Key]:
        with self._lock:
            return list(self._objects.get(kind, {}))

    def owned(self, kind: str, owner: Key) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._owned.get(kind, {}).get(owner, {}).values())

    def version(self, kind: str) -> int:
        """A counter that moves whenever any object of `kind` changes (to memoize derived views)."""
        with self._lock:
            return self._versions.get(kind, 0)

    def count(self, kind: str) -> int:
        with self._lock:
            return len(self._objects.get(kind, {}))
