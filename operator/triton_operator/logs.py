"""Log lines as text or JSON: one switch for the operator and the gateway (the chart's
`logFormat`). In JSON each line is an object with `timestamp`, `severity`, `logger` and `message`,
plus the fields a line carries: `namespace`, `inferenceservice`, `reason` and `type` where it is
about one service (every Event the operator posts is also such a line; so is every autoscaling
decision). python-json-logger comes with kopf."""

from __future__ import annotations

import logging
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS as _RESERVED
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

FORMATS = ("text", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SEVERITY = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning", logging.ERROR: "error",
            logging.CRITICAL: "critical"}


class JsonFormatter(_JsonFormatter):
    def __init__(self) -> None:
        super().__init__(timestamp=True, reserved_attrs=[*_RESERVED, "k8s_skip", "k8s_ref", "settings"])

    def add_fields(self, log_record: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        super().add_fields(log_record, record, message_dict)
        log_record["severity"] = SEVERITY.get(record.levelno, record.levelname.lower())
        log_record["logger"] = record.name
        if record.exc_info and "exc_info" not in log_record:
            log_record["exc_info"] = self.formatException(record.exc_info)


def formatter(fmt: str) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else logging.Formatter(TEXT)


def use(fmt: str) -> None:
    """Put `fmt` on every handler of the root logger (after kopf or basicConfig installed theirs)."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter(fmt))


def service(namespace: str, name: str, **more: str) -> dict[str, Any]:
    """The `extra` of a line about one InferenceService."""
    return {"namespace": namespace, "inferenceservice": name, **more}
