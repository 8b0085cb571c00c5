"""The list-then-watch protocol (pure), shared by the informer's two faces: the threaded one the
controller and the autoscaler read (`informer`) and the asyncio one the gateway routes from (`aio`).

LIST in pages, then WATCH from the list's resourceVersion with bookmarks on; every event moves the
resourceVersion to resume from; an expired watch (410 Gone, as an HTTP status or as an ERROR
event) means LIST again; any other failure is retried after a pause that doubles up to a cap.
"""

from __future__ import annotations

from typing import Any

LIST_PAGE = 500
WATCH_SECONDS = 300          # the server ends a watch after this; it is resumed at once
RETRY_FIRST, RETRY_MAX = 1.0, 30.0
GONE = 410


class WatchFailed(Exception):
    """An ERROR event other than an expired watch: the server's status code, reason and message."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}".rstrip(": "))
        self.status, self.reason, self.message = status, reason, message


def list_query(label_selector: str | None, field_selector: str | None, continue_token: str | None,
               limit: int = LIST_PAGE) -> dict[str, str]:
    """The query of one page of a LIST (absent values left out)."""
    query = {"limit": str(limit), "labelSelector": label_selector, "fieldSelector": field_selector,
             "continue": continue_token}
    return {k: v for k, v in query.items() if v}


def watch_query(resource_version: str, label_selector: str | None, field_selector: str | None,
                timeout_seconds: int = WATCH_SECONDS) -> dict[str, str]:
    """The query of a WATCH from `resource_version`, with bookmarks."""
    query = {"watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
             "labelSelector": label_selector, "fieldSelector": field_selector, "timeoutSeconds": str(timeout_seconds)}
    return {k: v for k, v in query.items() if v}


def page_end(page: dict[str, Any]) -> tuple[str | None, str]:
    """(the continue token of the next page or None, the list's resourceVersion)."""
    meta = page.get("metadata") or {}
    return meta.get("continue") or None, meta.get("resourceVersion", "")


def read_event(event: dict[str, Any], version: str) -> tuple[str | None, str | None, dict[str, Any]]:
    """One watch event as (the resourceVersion to resume from, or None when the watch expired and
    the kind must be listed again; the change, ADDED | MODIFIED | DELETED, or None for a bookmark;
    the object). Raises WatchFailed for any other ERROR event."""
    kind = event.get("type")
    obj = event.get("object") or {}
    if kind == "ERROR":
        if obj.get("code") == GONE:
            return None, None, obj
        raise WatchFailed(int(obj.get("code") or 0), obj.get("reason") or "Error",
                          obj.get("message") or "watch error")
    resumed = (obj.get("metadata") or {}).get("resourceVersion") or version
    return resumed, (None if kind == "BOOKMARK" else kind), obj


class Retry:
    """The pause before the next attempt after a failure: RETRY_FIRST, doubling to RETRY_MAX; a
    success starts over."""

    def __init__(self, first: float = RETRY_FIRST, cap: float = RETRY_MAX):
        self.first, self.cap = first, cap
        self.delay = first

    def failed(self) -> float:
        """The pause to take now; the next one is twice as long."""
        delay = self.delay
        self.delay = min(self.cap, self.delay * 2)
        return delay

    def succeeded(self) -> None:
        self.delay = self.first
