"""The Kubernetes edge: one lean HTTP client for every read, watch and write the operator makes
(domain-free: the operator's own kinds are given to it, see `api.kinds`).

Requests go through the kubernetes client's ApiClient (kubeconfig or in-cluster auth, TLS, token
refresh) but bodies are plain JSON dicts, never the generated model classes: deserializing a
Deployment into models costs more CPU than the request itself. Writes are server-side apply with
one field manager, merge patches of status, deletes and Events. A client-side token bucket
(qps/burst) keeps bursts polite; 429 answers from API Priority and Fairness are retried after
their Retry-After. Everything here is I/O; decisions live in the pure modules.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from .events import Event, EventSeries
from .kinds import BUILTIN_KINDS, EVENT, Kind, Kinds
from .watching import LIST_PAGE, WATCH_SECONDS, list_query, page_end, watch_query

log = logging.getLogger(__name__)
# urllib3 logs a warning per retried connection; during an API outage that is a line per object
# per second. We retry through the work queue and log a summary instead.
logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


class ApiError(Exception):
    """An answer from the API server other than 2xx, or no answer at all (status 0)."""

    def __init__(self, status: int, reason: str, message: str = "", body: dict[str, Any] | None = None):
        super().__init__(f"{status} {reason}: {message}".rstrip(": "))
        self.status, self.reason, self.message = status, reason, message
        self.body = body or {}
        self.retry_after: float | None = None

    @property
    def transient(self) -> bool:
        """Worth retrying: the server or the network failed, or asked us to slow down."""
        return self.status == 0 or self.status == 429 or self.status >= 500

    @property
    def rejected(self) -> bool:
        """The server refused this object as it is (invalid, too large, forbidden by policy):
        retrying the same body cannot succeed, the spec or the cluster must change."""
        return self.status in (400, 403, 413, 422) and not namespace_terminating(self)


def describe_api_error(e: BaseException) -> str:
    """One line for an API or network error: the server's message, not the whole HTTP exchange."""
    if isinstance(e, ApiError):
        return str(e)
    if isinstance(e, ApiException):  # from the kubernetes library (leader election)
        try:
            message = json.loads(e.body or "{}").get("message")
        except (ValueError, AttributeError):
            message = None
        return f"{e.status} {e.reason}: {message or ''}".strip().rstrip(":")
    if isinstance(e, (urllib3.exceptions.HTTPError, OSError)):
        return f"API server unreachable: {type(e).__name__}"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def namespace_terminating(e: BaseException) -> bool:
    """The namespace is being deleted: nothing in it can or needs to be created any more."""
    if isinstance(e, ApiError):
        return e.status == 403 and "being terminated" in e.message
    return isinstance(e, ApiException) and e.status == 403 and "being terminated" in (e.body or "")


def load_config(kubeconfig: str | None = None) -> client.Configuration:
    """The kubeconfig file `kubeconfig` when given, else in-cluster credentials, else the default
    kubeconfig; also made the library's default (leader election uses the library's own API
    classes)."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)
    client.Configuration.set_default(configuration)
    return client.Configuration.get_default_copy()


class TokenBucket:
    """Client-side rate limit, as client-go's QPS/burst: at most `burst` requests at once, refilled
    at `qps` per second. Thread-safe; `take` sleeps until a token is free."""

    def __init__(self, qps: float, burst: int, clock: Any = time.monotonic, sleep: Any = time.sleep):
        self.qps, self.burst = qps, max(1, burst)
        self.tokens = float(self.burst)
        self.clock, self.sleep = clock, sleep
        self.stamp = clock()
        self.lock = threading.Lock()

    def take(self) -> float:
        """Take one token; returns the seconds waited."""
        with self.lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.qps)
            self.stamp = now
            self.tokens -= 1
            wait = -self.tokens / self.qps if self.tokens < 0 else 0.0
        if wait > 0:
            self.sleep(wait)
        return wait


class Kube:
    """A thread-safe client for the few kinds its user reads and writes (`kinds`: those it may
    apply, beyond the built-in ones)."""

    def __init__(self, field_manager: str, configuration: client.Configuration | None = None,
                 qps: float = 50.0, burst: int = 100, timeout: float = 30.0, pool_size: int = 32,
                 kinds: tuple[Kind, ...] = ()):
        self.field_manager = field_manager
        self.kinds = Kinds(BUILTIN_KINDS + kinds)
        configuration = configuration or load_config()
        configuration.retries = False          # retries happen in the work queue, with backoff
        configuration.connection_pool_maxsize = pool_size
        self.api = client.ApiClient(configuration)
        self.api.user_agent = f"{field_manager} (python)"
        self.bucket = TokenBucket(qps, burst)
        self.timeout = timeout
        self.requests = 0  # every request made, for the operator's own metrics
        self.events = EventSeries()

    # -- plumbing -------------------------------------------------------------------------------

    def _open(self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None,
              content_type: str | None = None, timeout: float | tuple[float, float] | None = None) -> Any:
        self.bucket.take()
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        for attempt in range(4):
            self.requests += 1
            method_, url, headers_, body_, _ = self.api.param_serialize(
                method, path, query_params=params, header_params=dict(headers), body=body,
                auth_settings=["BearerToken"])
            try:
                resp = self.api.call_api(method_, url, header_params=headers_, body=body_,
                                         _request_timeout=timeout or self.timeout)
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:  # ApiException: TLS errors
                raise ApiError(0, "Unreachable", describe_api_error(e)) from None
            if resp.status == 429 and attempt < 3:
                retry_after = _retry_after(resp)
                resp.response.release_conn()
                time.sleep(retry_after)
                continue
            return resp
        return resp  # the last 429, raised by the caller

    def request(self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None,
                content_type: str | None = None) -> dict[str, Any]:
        resp = self._open(method, path, query, body, content_type)
        data = resp.read()
        if not 200 <= resp.status < 300:
            raise _error(resp.status, resp.reason, data, resp)
        return json.loads(data) if data else {}

    # -- reads ----------------------------------------------------------------------------------

    def list(self, kind: Kind, namespace: str | None = None, label_selector: str | None = None,
             limit: int = LIST_PAGE, field_selector: str | None = None,
             project: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
             ) -> tuple[list[dict[str, Any]], str]:
        """Every object (paged), and the list's resourceVersion to watch from. `project` is applied
        page by page (None drops an object), so a listing of every pod in a big cluster never
        holds more than one page of full objects."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = self.request("GET", kind.path(namespace), list_query(label_selector, field_selector, token, limit))
            batch = page.get("items") or []
            if project is not None:
                batch = [p for p in map(project, batch) if p is not None]
            items.extend(batch)
            token, version = page_end(page)
            if not token:
                return items, version

    def watch(self, kind: Kind, namespace: str | None, resource_version: str, label_selector: str | None = None,
              timeout_seconds: int = WATCH_SECONDS, field_selector: str | None = None) -> Iterator[dict[str, Any]]:
        """Open a watch from `resource_version` (bookmarks on) and return its events; the request
        is made here, so an unreachable server raises before the first event."""
        resp = self._open("GET", kind.path(namespace),
                          watch_query(resource_version, label_selector, field_selector, timeout_seconds),
                          timeout=(10.0, timeout_seconds + 30.0))
        if resp.status != 200:
            raise _error(resp.status, resp.reason, resp.read(), resp)
        return self._events(resp)

    @staticmethod
    def _events(resp: Any) -> Iterator[dict[str, Any]]:
        buffer = b""
        try:
            for chunk in resp.response.stream(amt=None, decode_content=True):
                buffer += chunk
                while True:
                    line, sep, rest = buffer.partition(b"\n")
                    if not sep:
                        break
                    buffer = rest
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.response.release_conn()

    def ready(self) -> bool:
        """Whether the API server answers its readiness check (GET /readyz, readable by every
        authenticated client); False when it cannot be reached or is not ready."""
        try:
            resp = self._open("GET", "/readyz", timeout=(2.0, 3.0))
        except ApiError:
            return False
        resp.read()
        return resp.status == 200

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self.request("GET", kind.path(namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    # -- writes ---------------------------------------------------------------------------------

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply; force, because the operator is the one owner of what it renders."""
        kind = self.kinds.of(manifest)
        meta = manifest["metadata"]
        return self.request("PATCH", kind.path(meta.get("namespace"), meta["name"]),
                            {"fieldManager": self.field_manager, "force": "true"}, manifest,
                            "application/apply-patch+yaml")

    def create(self, manifest: dict[str, Any]) -> bool:
        """Create an object unless one of its name exists (True: created). For what must be made
        once and never read back (a generated key), so the operator needs no right to read it."""
        kind = self.kinds.of(manifest)
        try:
            self.request("POST", kind.path(manifest["metadata"].get("namespace")),
                         {"fieldManager": self.field_manager}, manifest)
        except ApiError as e:
            if e.status == 409:
                return False
            raise
        return True

    def available(self, kind: Kind) -> bool:
        """Whether the API server serves `kind` (its group version lists it)."""
        try:
            found = self.request("GET", kind.path().rsplit("/", 1)[0])
        except ApiError as e:
            if e.status == 404:
                return False
            raise
        return any(r.get("name") == kind.plural for r in found.get("resources") or [])

    def patch(self, kind: Kind, name: str, namespace: str | None, body: dict[str, Any],
              subresource: str | None = None) -> dict[str, Any]:
        """A JSON merge patch (of the object or a subresource such as status)."""
        return self.request("PATCH", kind.path(namespace, name, subresource), {"fieldManager": self.field_manager},
                            body, "application/merge-patch+json")

    def patch_status(self, kind: Kind, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        """A merge patch of .status; None when the object is gone."""
        try:
            return self.patch(kind, name, namespace, {"status": status}, "status")
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def delete(self, kind: Kind, name: str, namespace: str | None = None, propagation: str | None = None) -> None:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation} if propagation else None
        try:
            self.request("DELETE", kind.path(namespace, name), body=body)
        except ApiError as e:
            if e.status != 404:
                raise

    def post_event(self, obj: dict[str, Any], event: Event) -> None:
        """A core/v1 Event on `obj`, aggregated as client-go's recorder does: the same event again
        on the same object (type, reason and message) within EVENT_SERIES_SECONDS raises the count
        and lastTimestamp of the one already posted (a PATCH) instead of a new object; kubectl
        describe then shows "(x5 over 3m)". Failures are logged, never raised: events are best
        effort."""
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"
        now_dt = datetime.now(timezone.utc)
        now = now_dt.strftime("%Y-%m-%dT%H:%M:%SZ")
        message = event.message[:1024]
        # Every Event is also a log line, with the service and reason as fields in JSON logs.
        log.info("%s %s %s/%s: %s", event.type, event.reason, namespace, meta["name"], message,
                 extra={"namespace": namespace, str(obj.get("kind") or "object").lower(): meta["name"],
                        "reason": event.reason, "type": event.type})
        key = (namespace, meta.get("uid") or meta["name"], event.type, event.reason, message)
        try:
            seen = self.events.seen(key, now_dt.timestamp())
            if seen is not None:
                name, count = seen
                try:
                    self.request("PATCH", EVENT.path(namespace, name), body={"count": count, "lastTimestamp": now},
                                 content_type="application/merge-patch+json")
                    return
                except ApiError as e:
                    if e.status != 404:   # gone (events live an hour): post it anew below
                        raise
            body = {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
                "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta["name"],
                                   "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                                   "resourceVersion": meta.get("resourceVersion")},
                "type": event.type, "reason": event.reason, "message": message,
                "firstTimestamp": now, "lastTimestamp": now, "eventTime": None, "count": 1,
                "source": {"component": self.field_manager},
                "reportingComponent": self.field_manager, "reportingInstance": self.field_manager,
            }
            posted = self.request("POST", EVENT.path(namespace), body=body)
            if isinstance(posted, dict) and posted.get("metadata", {}).get("name"):
                self.events.posted(key, posted["metadata"]["name"], now_dt.timestamp())
        except ApiError as e:
            level = logging.DEBUG if namespace_terminating(e) or e.transient else logging.WARNING
            log.log(level, "could not post event %s on %s: %s", event.reason, meta["name"], describe_api_error(e))


def _retry_after(resp: Any) -> float:
    try:
        return min(10.0, max(0.5, float(resp.headers.get("Retry-After") or 1)))
    except ValueError:
        return 1.0


def _error(status: int, reason: str, data: bytes, resp: Any = None) -> ApiError:
    body: dict[str, Any] = {}
    try:
        body = json.loads(data) if data else {}
    except ValueError:
        pass
    message = body.get("message") if isinstance(body, dict) else None
    err = ApiError(status, (body.get("reason") if isinstance(body, dict) else None) or reason or "Error",
                   message or (data[:200].decode("utf-8", "replace") if data else ""), body if isinstance(body, dict) else {})
    if status == 429 and resp is not None:
        err.retry_after = _retry_after(resp)
    return err
