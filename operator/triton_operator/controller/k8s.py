"""The Kubernetes edge: server-side apply with one field manager, reads, status, events.

Everything here is I/O; decisions live in the pure modules.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import datetime, timezone
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

from ..api import API_VERSION, GROUP, VERSION
from .status import Event

log = logging.getLogger(__name__)


def describe(e: Exception) -> str:
    """One line for an API error: the server's message, not the whole HTTP exchange."""
    if isinstance(e, ApiException):
        try:
            message = json.loads(e.body or "{}").get("message")
        except ValueError:
            message = None
        return f"{e.status} {e.reason}: {message or ''}".strip().rstrip(":")
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def namespace_terminating(e: Exception) -> bool:
    """The namespace is being deleted: nothing in it can or needs to be created any more."""
    return isinstance(e, ApiException) and e.status == 403 and "being terminated" in (e.body or "")


def load_config() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


class Kube:
    """A thin, thread-safe wrapper over the dynamic client."""

    def __init__(self, field_manager: str, api_client: client.ApiClient | None = None):
        self.field_manager = field_manager
        self.api_client = api_client or load_config()
        self.dynamic = DynamicClient(self.api_client)
        self._resources: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def resource(self, api_version: str, kind: str) -> Any:
        key = (api_version, kind)
        with self._lock:
            if key not in self._resources:
                self._resources[key] = self.dynamic.resources.get(api_version=api_version, kind=kind)
            return self._resources[key]

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply; force, because the operator is the one owner of what it renders."""
        res = self.resource(manifest["apiVersion"], manifest["kind"])
        out = self.dynamic.server_side_apply(
            res, body=manifest, namespace=manifest["metadata"].get("namespace"),
            field_manager=self.field_manager, force_conflicts=True)
        return out.to_dict()

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self.resource(api_version, kind).get(name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict[str, Any]]:
        res = self.resource(api_version, kind)
        out = res.get(namespace=namespace, label_selector=label_selector) if namespace else \
            res.get(label_selector=label_selector)
        return [item.to_dict() if hasattr(item, "to_dict") else item for item in out.to_dict()["items"]]

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None,
               propagation: str | None = None) -> None:
        body = {"propagationPolicy": propagation} if propagation else None
        try:
            self.resource(api_version, kind).delete(name=name, namespace=namespace, body=body)
        except NotFoundError:
            pass

    def get_inference_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(API_VERSION, "InferenceService", name, namespace)

    def list_gpu_classes(self) -> list[dict[str, Any]]:
        return self.list(API_VERSION, "GPUClass")

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """A merge patch of .status (fields not mentioned, e.g. the autoscaler's, are kept)."""
        api = client.CustomObjectsApi(self.api_client)
        try:
            api.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, "inferenceservices", name, {"status": status},
                field_manager=self.field_manager)
        except ApiException as e:
            if e.status != 404:  # deleted meanwhile: nothing to report on
                raise

    def post_event(self, obj: dict[str, Any], event: Event) -> None:
        """A core/v1 Event on `obj`. Failures are logged, never raised: events are best effort."""
        meta = obj["metadata"]
        now = datetime.now(timezone.utc)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}.", namespace=meta.get("namespace")),
            involved_object=client.V1ObjectReference(
                api_version=obj.get("apiVersion"), kind=obj.get("kind"), name=meta["name"],
                namespace=meta.get("namespace"), uid=meta.get("uid"),
                resource_version=meta.get("resourceVersion")),
            type=event.type, reason=event.reason, message=event.message[:1024],
            first_timestamp=now, last_timestamp=now, count=1,
            source=client.V1EventSource(component=self.field_manager),
            reporting_component=self.field_manager, reporting_instance=self.field_manager,
        )
        try:
            client.CoreV1Api(self.api_client).create_namespaced_event(meta.get("namespace") or "default", body)
        except ApiException as e:
            level = logging.DEBUG if namespace_terminating(e) else logging.WARNING
            log.log(level, "could not post event %s on %s: %s", event.reason, meta["name"], describe(e))
