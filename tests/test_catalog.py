"""The GPUClass catalog the operator applies when it starts (controller/catalog.py), through the
start-up handler, against a stand-in API server (no cluster in the unit suite; e2e/test_startup.py
starts the operator with a broken catalog file against a real one)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import kopf
import pytest
from triton_operator.controller import catalog, handlers
from triton_operator.kube.client import ApiError
from triton_operator.settings import Settings

CATALOG = """\
apiVersion: serving.triton-operator.io/v1alpha1
kind: GPUClass
metadata: {name: h100}
spec:
  productNames: [NVIDIA-H100-80GB-HBM3]
  memoryGiB: 80
  memoryBandwidthTBps: 3.35
  computeCapability: "9.0"
"""


class FlakyApiServer:
    """Fails the first `failures` applies with `error`, then applies."""

    def __init__(self, failures: int, error: ApiError):
        self.failures, self.error = failures, error
        self.applied: list[str] = []
        self.attempts = 0
        self.done = threading.Event()

    def apply(self, manifest: dict) -> dict:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise self.error
        self.applied.append(manifest["metadata"]["name"])
        self.done.set()
        return manifest

    def list(self, kind, namespace=None, label_selector=None, **_):
        return [], "1"

    def delete(self, kind, name, namespace=None, propagation=None) -> None:
        raise AssertionError("nothing to delete")


class IdleManager:
    def __init__(self, settings, kube) -> None:
        self.kube = kube

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def start_with(monkeypatch, tmp_path: Path, api: FlakyApiServer) -> kopf.Memo:
    path = tmp_path / "gpuclasses.yaml"
    path.write_text(CATALOG)
    monkeypatch.setattr(handlers, "Kube", lambda *a, **kw: api)
    monkeypatch.setattr(handlers, "Manager", IdleManager)
    monkeypatch.setattr(catalog, "RETRY_FIRST", 0.01)
    memo = kopf.Memo(settings=Settings(catalog_file=str(path)))
    handlers.start(settings=kopf.OperatorSettings(), memo=memo)
    return memo


@pytest.mark.parametrize("error", [
    ApiError(0, "Unreachable", "API server unreachable: ConnectionRefusedError"),
    ApiError(429, "TooManyRequests", "the server has received too many requests"),
    ApiError(503, "ServiceUnavailable", "etcd is unavailable"),
    ApiError(404, "NotFound", "the server could not find the requested resource"),   # CRD not established yet
])
def test_a_catalog_the_api_server_failed_at_start_is_applied_once_it_answers(monkeypatch, tmp_path, error):
    """The leader starts while the API server fails (often why the previous leader stopped): the
    catalog is tried again beside the controller until it is applied. Tried once, a changed
    catalog stayed unapplied until the next restart, with one log line to say so."""
    api = FlakyApiServer(failures=2, error=error)
    memo = start_with(monkeypatch, tmp_path, api)
    try:
        assert api.done.wait(10), "the catalog was never applied"
        assert api.applied == ["h100"] and api.attempts == 3
    finally:
        handlers.stop(memo=memo)


def test_a_refused_catalog_is_not_tried_again(monkeypatch, tmp_path):
    """A refusal (RBAC, an invalid class) is the install's to fix: said once, not retried."""
    api = FlakyApiServer(failures=100, error=ApiError(403, "Forbidden", "gpuclasses is forbidden"))
    memo = start_with(monkeypatch, tmp_path, api)
    try:
        time.sleep(0.2)
        assert api.attempts == 1 and getattr(memo, "catalog_stop", None) is None
    finally:
        handlers.stop(memo=memo)


def test_stopping_ends_the_retries(monkeypatch, tmp_path):
    api = FlakyApiServer(failures=10**6, error=ApiError(0, "Unreachable", "down"))
    memo = start_with(monkeypatch, tmp_path, api)
    handlers.stop(memo=memo)
    attempts = api.attempts
    time.sleep(0.3)
    assert api.attempts <= attempts + 1 and not api.applied
