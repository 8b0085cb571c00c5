"""A real OpenTelemetry Collector on loopback for the tracing e2e test: the minimal build of
hack/install-otelcol.sh (the OTLP receiver and the file exporter), receiving OTLP over HTTP and
writing every batch it gets to a file as OTLP JSON, one batch per line, which `spans()` reads."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from . import REPO_ROOT, free_port, port_open, stop_process_group, tail

INSTALL_SCRIPT = REPO_ROOT / "hack" / "install-otelcol.sh"


def ensure_otelcol() -> str:
    out = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{INSTALL_SCRIPT} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def _value(v: dict[str, Any]) -> Any:
    """An OTLP JSON AnyValue as a plain value (int64s come as strings in OTLP JSON)."""
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    return v


def attributes(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {a["key"]: _value(a["value"]) for a in items or []}


class Collector:
    """``otelcol`` on 127.0.0.1 (a free port), writing to ``workdir/spans.jsonl``."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.port = free_port()
        self.output = self.workdir / "spans.jsonl"
        self.log_path = self.workdir / "otelcol.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """What OTEL_EXPORTER_OTLP_ENDPOINT takes (the SDK adds /v1/traces)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = ensure_otelcol()
        config = self.workdir / "otelcol.yaml"
        config.write_text(json.dumps({
            "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{self.port}"}}}},
            "exporters": {"file": {"path": str(self.output), "flush_interval": "100ms"}},
            "service": {"pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["file"]}}}}))
        self.proc = subprocess.Popen([binary, f"--config={config}"], stdout=open(self.log_path, "ab"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the collector did not listen on {self.port}:\n{tail(self.log_path)}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc, timeout=10)
            self.proc = None

    def text(self) -> str:
        return self.output.read_text() if self.output.exists() else ""

    def spans(self) -> list[dict[str, Any]]:
        """Every span received so far, each with its resource's service.name as "service" and its
        attributes as a plain dict."""
        out = []
        for line in self.text().splitlines():
            if not line.strip():
                continue
            for rs in json.loads(line).get("resourceSpans", []):
                service = attributes(rs.get("resource", {}).get("attributes")).get("service.name")
                for ss in rs.get("scopeSpans", []):
                    for span in ss.get("spans", []):
                        out.append({**span, "service": service, "attributes": attributes(span.get("attributes"))})
        return out
