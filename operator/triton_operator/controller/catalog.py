"""The default GPUClass catalog a cluster admin ships with the Helm chart.

Helm cannot create GPUClasses in the release that installs their CRD (it maps every kind before
creating anything), so the chart mounts the catalog as a file and the operator applies it at
start: server-side apply with the operator's field manager, a label marking each class as the
catalog's, and removal of catalog classes that were switched off. Classes created by hand carry no
such label and are never touched.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..api import GPUClass, first_error
from ..api.kinds import GPU_CLASS
from ..kube.client import ApiError, Kube, describe_api_error
from ..kube.watching import Retry

log = logging.getLogger(__name__)
CATALOG_LABEL = "serving.triton-operator.io/catalog"
RETRY_FIRST, RETRY_MAX = 1.0, 60.0   # the pause before trying an unapplied catalog again (doubling)


class CatalogError(ValueError):
    pass


def parse(text: str, catalog: str) -> list[dict[str, Any]]:
    """Validated GPUClass manifests, labelled as the catalog's. Raises CatalogError naming the entry."""
    out = []
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        name = (doc.get("metadata") or {}).get("name", "<unnamed>")
        try:
            cls = GPUClass.model_validate(doc)
        except ValidationError as e:
            raise CatalogError(f"GPUClass {name}: {first_error(e)}") from None
        manifest = cls.wire()
        manifest["metadata"] = {"name": cls.name, "labels": {**(doc["metadata"].get("labels") or {}),
                                                              CATALOG_LABEL: catalog}}
        out.append(manifest)
    return out


def sync(kube: Kube, path: str, catalog: str = "default") -> list[str]:
    """Apply the catalog file; delete catalog classes no longer in it. Returns the applied names."""
    try:
        manifests = parse(Path(path).read_text(), catalog)
    except OSError as e:
        raise CatalogError(f"cannot read GPUClass catalog {path}: {e.strerror}") from None
    wanted = {m["metadata"]["name"] for m in manifests}
    for manifest in manifests:
        kube.apply(manifest)
    existing, _ = kube.list(GPU_CLASS, label_selector=f"{CATALOG_LABEL}={catalog}")
    for item in existing:
        name = item["metadata"]["name"]
        if name not in wanted:
            log.info("removing GPUClass %s: no longer in the catalog", name)
            kube.delete(GPU_CLASS, name)
    return sorted(wanted)


def retryable(e: ApiError) -> bool:
    """A failure the same catalog gets past by trying again: the API server unreachable, failing or
    shedding load, or the GPUClass kind not served yet (its CRD, installed by the same release, not
    yet established)."""
    return e.transient or e.status == 404


def sync_again(kube: Kube, path: str, stop: threading.Event) -> list[str] | None:
    """After `sync` failed on a retryable error: `sync` again after a pause (doubling from
    RETRY_FIRST to RETRY_MAX) until it succeeds (the applied names) or `stop` is set (None). The catalog is
    applied when the operator starts; tried only then, a leader that started while the API server
    failed (often why the previous leader stopped) left a changed catalog unapplied until its next
    restart, with one log line to say so. A broken file (CatalogError) or a refusal (RBAC, an
    invalid class) raises: trying again cannot help."""
    retry = Retry(RETRY_FIRST, RETRY_MAX)
    while not stop.wait(retry.failed()):
        try:
            return sync(kube, path)
        except ApiError as e:
            if not retryable(e):
                raise
            log.warning("GPUClass catalog not applied yet: %s; trying again in %.0fs", describe_api_error(e),
                        retry.delay)
    return None
