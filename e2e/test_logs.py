"""JSON logs, as the chart's `logFormat: json` sets them: the operator and the gateway write one
JSON object per line, and a line about one service carries its namespace, name and reason as
fields (every Event the operator posts is also such a line)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Iterator

import pytest

from .cluster import Cluster, Operator, wait_for
from .conftest import GATEWAY_SERVICE_ACCOUNT, service_account_kubeconfig
from .harness.gateway import GatewayProcess
from .test_lifecycle import service


def json_lines(path: Path, offset: int = 0) -> list[dict]:
    text = path.read_bytes()[offset:].decode(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"a log line that is not JSON: {line[:300]}") from None
    return parsed


@pytest.fixture
def json_operator(operator: Operator) -> Iterator[Operator]:
    saved = dict(operator.extra_env)
    operator.extra_env["TRITON_OPERATOR_LOG_FORMAT"] = "json"
    operator.stop()
    offset = operator.log_path.stat().st_size
    operator.start()
    operator.json_offset = offset   # type: ignore[attr-defined]
    try:
        yield operator
    finally:
        operator.extra_env.clear()
        operator.extra_env.update(saved)
        operator.stop()
        operator.start()


def test_the_operator_logs_json_with_the_service_and_reason(json_operator: Operator, ns: str):
    c = json_operator.cluster
    c.apply(service("nowhere", ns, gpu={"class": "x100", "count": 1}))

    def event_line() -> dict | None:
        for line in json_lines(json_operator.log_path, json_operator.json_offset):   # type: ignore[attr-defined]
            if line.get("reason") == "GPUClassNotFound" and line.get("inferenceservice") == "nowhere":
                return line
        return None

    line = wait_for("the event's log line", event_line, timeout=60)
    assert line["namespace"] == ns and line["type"] == "Warning" and line["severity"] == "info"
    assert "GPUClass x100 does not exist" in line["message"]
    assert {"timestamp", "logger"} <= set(line)
    started = json_lines(json_operator.log_path, json_operator.json_offset)   # type: ignore[attr-defined]
    assert any("triton-operator started" in x["message"] for x in started), "every line since the start is JSON"


def test_the_gateway_logs_json(installed: Cluster, tmp_path: Path, ns: str):
    keys = tmp_path / "keys.yaml"
    keys.write_text(json.dumps({"keys": [{"name": "k", "key": "sk-" + secrets.token_urlsafe(32), "namespaces": [ns]}]}))
    gw = GatewayProcess(service_account_kubeconfig(installed, tmp_path, GATEWAY_SERVICE_ACCOUNT), keys, tmp_path, ns,
                        args=["--log-format", "json"])
    gw.start()
    try:
        lines = json_lines(gw.log_path)
        assert any(x["message"].startswith("gateway listening on") and x["severity"] == "info" for x in lines)
        assert any(x["message"] == "API keys loaded: 1 key(s)" for x in lines)
        assert all(x["logger"].startswith(("triton_operator", "aiohttp", "kubernetes")) for x in lines), lines
    finally:
        gw.stop()
