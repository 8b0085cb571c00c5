"""A small informer, the threaded face of `watching`'s protocol: LIST once, then WATCH from that
resourceVersion, keeping the store current.

One thread per (kind, namespace). It lists in pages, stores the objects (trimmed), reports
itself synced, and follows the watch with bookmarks on; a stream that ends is resumed from the
last resourceVersion seen, an expired one (410 Gone) is listed again, and a failed API server is
retried with backoff. Each stored change is handed to `on_change(kind, old, new)`.

Why not kopf's watchers: kopf runs handlers per object (per-object workers, timers, diff-base
annotations, a handler call per event), where the controller wants a plain store shared by the
reconcile, the autoscaler and the free-GPU view, trimmed objects, and one queue of keys; see
docs/design.md.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from .client import ApiError, Kind, Kube, describe_api_error
from .failures import FailureLog
from .reach import Reachability, unreachable
from .store import Store, trim
from .watching import GONE, RETRY_MAX, WATCH_SECONDS, Retry, WatchFailed, read_event

log = logging.getLogger(__name__)
OnChange = Callable[[str, "dict[str, Any] | None", "dict[str, Any] | None"], None]


class Informer:
    def __init__(self, kube: Kube, store: Store, kind: Kind, namespace: str | None, on_change: OnChange,
                 failures: FailureLog, label_selector: str | None = None,
                 project: Callable[[dict[str, Any]], dict[str, Any] | None] = trim, watch_timeout: int = WATCH_SECONDS,
                 field_selector: str | None = None, store_kind: str | None = None,
                 reach: Reachability | None = None, relist_after_gap: bool = False,
                 on_listed: OnChange | None = None):
        """`project` trims what is stored (None: not stored at all); `store_kind` names the
        cache's kind when one API kind is watched twice (serving pods, and every pod's GPUs).
        `reach`: the API server's shared probe, which an unreachable server is waited for on (else
        the doubling pause). `relist_after_gap`: after the watch broke, list the kind again (not
        resume from the last resourceVersion), and have the store say the kind is not fresh until
        then: for the parents children are written for, whose deletion during a gap must be seen
        before anything is written for them. `on_listed` takes the changes a listing finds (after
        a start, an expired watch or a gap) instead of `on_change`, which takes the watch's."""
        self.kube, self.store, self.kind, self.namespace = kube, store, kind, namespace
        self.on_change, self.failures, self.selector, self.project = on_change, failures, label_selector, project
        self.field_selector = field_selector
        self.store_kind = store_kind or kind.kind
        self.watch_timeout = watch_timeout
        self.reach = reach
        self.relist_after_gap = relist_after_gap
        self.on_listed = on_listed or on_change
        self.synced = threading.Event()
        self.stopped = threading.Event()
        self.lists = 0      # LIST passes (the first, and one per expired watch)
        self.events = 0     # watch events applied
        where = f" in {namespace}" if namespace else ""
        self.name = f"{kind.plural}{where}" + (f" ({store_kind})" if store_kind else "")
        self.thread = threading.Thread(target=self.run, name=f"informer {self.name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        # The thread may sit in a watch read for up to watch_timeout; it is a daemon and checks
        # the flag on every event, so it is not joined.
        self.stopped.set()

    def _list(self) -> str:
        items, version = self.kube.list(self.kind, self.namespace, self.selector,
                                        field_selector=self.field_selector, project=self.project)
        self.lists += 1
        changes = self.store.replace(self.store_kind, self.namespace, items)
        self.store.mark_fresh(self.store_kind)
        for old, new in changes:
            self.on_listed(self.store_kind, old, new)
        self.synced.set()
        return version

    def run(self) -> None:
        version: str | None = None
        retry = Retry()
        topic = f"watching {self.name}"
        while not self.stopped.is_set():
            try:
                if version is None:
                    version = self._list()
                events = self.kube.watch(self.kind, self.namespace, version, self.selector, self.watch_timeout,
                                         field_selector=self.field_selector)
                # A watch works once it delivers (an event, a bookmark, its end), not once it opens:
                # one that opens and fails at once (an ERROR event) is a failure like any other, or
                # every failure would log twice ("recovered", then the error) and the pause would
                # never double.
                delivered = False
                for event in events:
                    if self.stopped.is_set():
                        return
                    version = self._apply(event, version)
                    if not delivered:
                        delivered = True
                        self._worked(topic, retry)
                    if version is None:
                        break  # expired: list again
                if not delivered:
                    self._worked(topic, retry)
            except (ApiError, WatchFailed) as e:
                if e.status == GONE:
                    version = None
                    continue
                version = self._gap(version)
                self.failures.failure(topic, describe_api_error(e))
                # A server that answers with an error (an ERROR event, a 500 from a healthy server)
                # is not cured by waiting for it to answer: the doubling pause.
                self._pause(retry, unreachable(e.status))
            except Exception as e:  # noqa: BLE001 - a broken stream must never end the informer
                version = self._gap(version)
                self.failures.failure(topic, describe_api_error(e))
                self._pause(retry, True)

    def _worked(self, topic: str, retry: Retry) -> None:
        self.failures.success(topic)
        retry.succeeded()

    def _gap(self, version: str | None) -> str | None:
        """The watch broke: what may have changed meanwhile is not known. A parent kind is listed
        again (None) and not fresh until then; any other resumes from `version`."""
        if not self.relist_after_gap:
            return version
        self.store.mark_stale(self.store_kind)
        return None

    def _pause(self, retry: Retry, waiting_helps: bool) -> None:
        """Before the next attempt: until the API server answers its probe, when it could not be
        reached (as soon as it is back), else the doubling pause."""
        if waiting_helps and self.reach is not None:
            self.reach.wait(self.stopped, RETRY_MAX)
        else:
            self.stopped.wait(retry.failed())

    def _apply(self, event: dict[str, Any], version: str) -> str | None:
        """Store one watch event; returns the resourceVersion to resume from (None: list again)."""
        resumed, change, obj = read_event(event, version)
        if resumed is None or change is None:
            return resumed
        self.events += 1
        trimmed = None if change == "DELETED" else self.project(obj)
        if trimmed is None:  # deleted, or no longer worth storing
            old = self.store.remove(self.store_kind, obj)
            if old is not None:
                self.on_change(self.store_kind, old, None)
        else:
            old, stored = self.store.upsert(self.store_kind, trimmed)
            if stored:
                self.on_change(self.store_kind, old, trimmed)
        return resumed
