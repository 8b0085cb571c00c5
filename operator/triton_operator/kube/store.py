"""The watch-fed store: every object a controller reads, kept in memory and updated by watch
events (see `informer`), so that a pass reads no API and a fleet at rest costs nothing.

Objects are stored trimmed (by the informer's `project`: no managedFields at least) to keep memory
flat as the fleet grows. Writers (the informers, and a controller's own writes, stored as the API
server answered them) hold a lock; readers get the stored dicts and must not mutate them.
Objects may also be indexed by an owner (a key the `owner` function derives from each object).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]


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


class Store:
    """Objects by kind and key, plus, when it has an `owner` function, objects by owner."""

    def __init__(self, owner: Callable[[dict[str, Any]], Key | None] | None = None) -> None:
        self.owner = owner
        self._lock = threading.RLock()
        self._objects: dict[str, dict[Key, dict[str, Any]]] = {}
        self._owned: dict[str, dict[Key, dict[str, dict[str, Any]]]] = {}
        self._versions: dict[str, int] = {}
        self._stale: set[str] = set()   # kinds whose watch broke and that have not been listed again

    # -- writes (informers and write-through) ---------------------------------------------------

    def _index(self, kind: str, obj: dict[str, Any], add: bool) -> None:
        owner = self.owner(obj) if self.owner else None
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

    def mark_stale(self, kind: str) -> None:
        """The kind's watch broke: what is cached may have been deleted since (fresh() is False
        until the kind is listed again)."""
        with self._lock:
            self._stale.add(kind)

    def mark_fresh(self, kind: str) -> None:
        with self._lock:
            self._stale.discard(kind)

    def fresh(self, kind: str) -> bool:
        """Whether the kind's cache follows the API server without a gap since its last listing."""
        return kind not in self._stale

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
