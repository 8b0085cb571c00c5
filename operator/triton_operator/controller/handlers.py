"""kopf hosts the operator process: start-up and clean-up, signals, logging and the liveness
endpoint. The controller itself (watch-fed cache, work queue, workers, autoscaler) runs beside
kopf's event loop in threads of its own; see `manager` and docs/design.md for why it does not
use kopf's per-object handlers."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from ..kube.client import Kube, describe_api_error
from ..settings import Settings, from_env
from . import catalog
from .manager import APPLIED_KINDS, Manager

log = logging.getLogger(__name__)


@kopf.on.startup()
def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ours: Settings = getattr(memo, "settings", None) or from_env()
    memo.settings = ours
    settings.posting.level = logging.WARNING
    settings.scanning.disabled = True  # nothing is served by kopf's own watchers
    kube = Kube(ours.field_manager, qps=ours.api_qps, burst=ours.api_burst, kinds=APPLIED_KINDS)
    if ours.catalog_file:
        try:
            log.info("GPUClass catalog applied: %s", ", ".join(catalog.sync(kube, ours.catalog_file)))
        except catalog.CatalogError as e:
            # A broken catalog must not stop the operator from serving what already works.
            log.error("GPUClass catalog not applied: %s", e)
        except Exception as e:  # noqa: BLE001 - the API server may be down: the rest still starts
            log.error("GPUClass catalog not applied: %s", describe_api_error(e))
    memo.manager = Manager(ours, kube)
    memo.manager.start()
    log.info("triton-operator started (%s)", ", ".join(ours.namespaces) or "all namespaces")


@kopf.on.cleanup()
def stop(memo: kopf.Memo, **_: Any) -> None:
    manager = getattr(memo, "manager", None)
    if manager is not None:
        manager.stop()
    stop_flag = getattr(memo, "stop_flag", None)
    if stop_flag is not None:
        stop_flag.set()  # kopf waits on it in a thread of its own: let that thread end too


@kopf.on.probe(id="controller")
def probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Reported by the liveness endpoint: cache sync, queue length, passes, API requests."""
    manager = getattr(memo, "manager", None)
    return manager.health() if manager is not None else {"synced": False}

