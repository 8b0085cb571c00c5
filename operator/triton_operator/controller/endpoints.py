"""The addresses status reports for a service (pure): its Service's HTTP, gRPC and metrics URLs in
the cluster, and the gateway's OpenAI URL when the service is served there."""

from __future__ import annotations

from ..render.server import GRPC_PORT, HTTP_PORT, METRICS_PORT
from ..settings import Settings


def endpoints(name: str, namespace: str, settings: Settings, openai: bool = False) -> dict[str, str]:
    host = f"{name}.{namespace}.svc.{settings.cluster_domain}"
    out = {
        "http": f"http://{host}:{HTTP_PORT}",
        "grpc": f"grpc://{host}:{GRPC_PORT}",
        "metrics": f"http://{host}:{METRICS_PORT}/metrics",
    }
    if openai and settings.gateway_url:
        out["openai"] = settings.gateway_url.rstrip("/") + "/v1"
    return out
