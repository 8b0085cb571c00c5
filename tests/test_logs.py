"""The JSON log format: one object per line, with severity, logger and the service's fields."""

from __future__ import annotations

import io
import json
import logging

from triton_operator import logs


def test_json_lines_carry_the_service_fields_and_tracebacks():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.formatter("json"))
    logger = logging.getLogger("triton_operator.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.warning("scaled %s", "up", extra=logs.service("ml", "llama", reason="Scaled"))
        try:
            raise ValueError("bad")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert {k: first[k] for k in ("message", "severity", "logger", "namespace", "inferenceservice", "reason")} == {
        "message": "scaled up", "severity": "warning", "logger": "triton_operator.test_logs", "namespace": "ml",
        "inferenceservice": "llama", "reason": "Scaled"}
    assert "timestamp" in first and "ValueError: bad" in second["exc_info"] and second["severity"] == "error"
    assert isinstance(logs.formatter("text"), logging.Formatter) and not isinstance(logs.formatter("text"),
                                                                                     logs.JsonFormatter)
