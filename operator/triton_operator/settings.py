"""Operator settings: what differs between clusters, not between InferenceServices."""

from __future__ import annotations

import os

from pydantic import BaseModel, Field, ValidationError

ENV_PREFIX = "TRITON_OPERATOR_"


class Settings(BaseModel):
    """Read from TRITON_OPERATOR_* environment variables (see `from_env`)."""

    triton_image: str = Field("nvcr.io/nvidia/tritonserver:25.01-py3", description="Default Triton image.")
    triton_trtllm_image: str = Field(
        "nvcr.io/nvidia/tritonserver:25.01-trtllm-python-py3",
        description="Default Triton image for tensorrt-llm models.")
    runtime_image: str = Field(
        "ghcr.io/triton-operator/runtime:0.1.0",
        description="Image of runtime/ that stages models and builds engines.")
    cluster_domain: str = Field("cluster.local", description="DNS suffix of Services.")
    field_manager: str = Field("triton-operator", description="Field manager for server-side apply.")
    namespaces: list[str] = Field(default_factory=list, description="Namespaces to watch; empty means all.")
    prometheus_url: str | None = Field(None, description="Prometheus base URL for autoscaling.")
    resync_seconds: float = Field(30.0, gt=0, description="Period of the status refresh and drift check.")


class SettingsError(ValueError):
    pass


def from_env(environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for name in Settings.model_fields:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is None or raw == "":
            continue
        values[name] = [n for n in raw.split(",") if n.strip()] if name == "namespaces" else raw
    try:
        return Settings(**values)
    except ValidationError as e:
        first = e.errors()[0]
        raise SettingsError(f"{ENV_PREFIX}{str(first['loc'][0]).upper()}: {first['msg']}") from None
