"""kopf hosts the operator process: start-up and clean-up, signals, logging and the liveness
endpoint. The controller itself (watch-fed cache, work queue, workers, autoscaler) runs beside
kopf's event loop in threads of its own; see `manager` and docs/design.md for why it does not
use kopf's per-object handlers."""

from __future__ import annotations

import logging
import threading
from typing import Any

import kopf

from ..kube.client import ApiError, Kube, describe_api_error
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
        except ApiError as e:
            if not catalog.retryable(e):
                log.error("GPUClass catalog not applied: %s", describe_api_error(e))
            else:
                # Tried before the controller starts, so that its first passes find the classes;
                # while the API server fails, tried again beside it: the rest still starts.
                log.warning("GPUClass catalog not applied yet: %s; trying again", describe_api_error(e))
                memo.catalog_stop = threading.Event()
                threading.Thread(target=_apply_catalog_later, args=(kube, ours.catalog_file, memo.catalog_stop),
                                 name="gpuclass catalog", daemon=True).start()
        except Exception as e:  # noqa: BLE001 - the API server may be down: the rest still starts
            log.error("GPUClass catalog not applied: %s", describe_api_error(e))
    memo.manager = Manager(ours, kube)
    memo.manager.start()
    log.info("triton-operator started (%s)", ", ".join(ours.namespaces) or "all namespaces")


def _apply_catalog_later(kube: Kube, path: str, stop: threading.Event) -> None:
    try:
        names = catalog.sync_again(kube, path, stop)
    except Exception as e:  # noqa: BLE001 - a refusal: said once, as at start
        log.error("GPUClass catalog not applied: %s", describe_api_error(e))
        return
    if names is not None:
        log.info("GPUClass catalog applied: %s", ", ".join(names))


@kopf.on.cleanup()
def stop(memo: kopf.Memo, **_: Any) -> None:
    catalog_stop = getattr(memo, "catalog_stop", None)
    if catalog_stop is not None:
        catalog_stop.set()
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

