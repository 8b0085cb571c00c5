"""Gateway settings, from TRITON_GATEWAY_* environment variables (the chart sets them) or flags."""

from __future__ import annotations

import ipaddress
from typing import Mapping

from pydantic import BaseModel, Field, ValidationError, field_validator

from ..settings import env_values

ENV_PREFIX = "TRITON_GATEWAY_"


class GatewaySettings(BaseModel):
    address: str = Field("0.0.0.0", description="Address the API listens on.")
    port: int = Field(8080, ge=1, le=65535, description="Port of the OpenAI and KServe v2 routes.")
    metrics_port: int = Field(9090, ge=0, le=65535,
                              description="Port of /metrics, /healthz and /readyz (0: on the API port).")
    namespaces: list[str] = Field(default_factory=list, description="Namespaces to serve; empty: all.")
    key_files: list[str] = Field(default_factory=list, description="API key lists (YAML), e.g. mounted Secrets.")
    key_reload_seconds: float = Field(10.0, gt=0, description="How often key files are re-read.")
    requests_per_minute: float = Field(600.0, gt=0, description="Default per-key rate limit (a body the gateway "
                                       "parses counts as one request per 64 KiB or 1,024 JSON objects and arrays).")
    replicas: int = Field(
        1, ge=1, description="Gateway replicas sharing the per-key limits: each enforces 1/replicas of a key's "
                             "requests and tokens per minute (the chart sets it to gateway.replicaCount).")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Largest request body accepted.")
    body_budget_bytes: int = Field(
        150 << 20, ge=1 << 20, description="Request bodies in memory at once (read, held or being sent), all keys; "
                                           "past it requests get 503.")
    key_share: float = Field(
        0.25, gt=0, le=1, description="The fraction of the body budget and of each service's hold queue one API key "
                                      "may take.")
    max_in_flight_per_key: int = Field(
        256, ge=1, description="Requests one API key may have open at once, unless its entry sets maxInFlight.")
    max_tokens_per_request: int = Field(
        32768, ge=1, description="Largest max_tokens a request may ask for, unless its key's entry sets maxTokens.")
    max_held_per_service: int = Field(64, ge=0, description="Requests held per service while it wakes.")
    max_held_total: int = Field(1024, ge=0, description="Requests held across all services.")
    max_connections: int = Field(
        512, ge=1, description="Client connections open at once on the API port; more are answered 503 and closed.")
    max_connections_per_address: int = Field(
        128, ge=1, description="Client connections one client address may have open at once (a trusted proxy's are "
                               "not capped); more are answered 503 and closed.")
    max_header_bytes: int = Field(
        32768, ge=1024, le=1 << 20, description="Largest request head (request line and headers); larger ones are "
                                                "answered 431 and the connection closed.")
    header_timeout_seconds: float = Field(
        10.0, gt=0, description="Time from a request's first byte to the end of its headers; then 408 and closed.")
    body_timeout_seconds: float = Field(
        30.0, gt=0, description="Time to receive a request's body once its headers are in; then 408.")
    idle_timeout_seconds: float = Field(
        60.0, gt=0, description="An idle keep-alive connection (or one that sends nothing) is closed after this.")
    failed_auth_per_minute: float = Field(
        30.0, gt=0, description="Failed API key attempts one client address may make a minute (bursts of a third "
                                "of it); past it that address gets 429, its connection closed after it, until its budget refills.")
    trusted_proxies: list[str] = Field(
        default_factory=list, description="CIDRs of proxies in front of the gateway (an ingress): from those, the "
                                          "client address is the last X-Forwarded-For entry outside them.")
    hold_timeout_seconds: float = Field(
        300.0, gt=0, description="How long a request waits for a replica before a 503 with Retry-After.")
    retry_after_seconds: int = Field(10, ge=1, description="Retry-After of a 503 while a service wakes.")
    upstream_connect_timeout_seconds: float = Field(5.0, gt=0, description="Connect timeout to a replica.")
    upstream_idle_timeout_seconds: float = Field(
        60.0, gt=0, description="Longest a replica's answer may pause once it has begun (between two reads of a "
                                "stream), and longest one write to a client may wait for it to read; then the "
                                "answer ends with an error, or the client's connection is closed.")
    max_answer_bytes: int = Field(
        8 << 20, ge=1 << 16, description="Largest answer read whole from a replica (a non-streamed generate), and "
                                         "largest streamed event; larger ones end the answer with a 502.")
    upstream_timeout_seconds: float = Field(
        900.0, gt=0, description="Longest a replica may take to answer (to finish a stream), and a client to take "
                                 "the answer: past it the client's connection is closed.")
    log_format: str = Field("text", pattern=r"^(text|json)$", description="Log lines as text or JSON objects.")
    shutdown_timeout_seconds: float = Field(
        10.0, ge=0, description="On SIGTERM, how long answers in progress may finish before they are cut.")
    upstream_port_name: str = Field(
        "http", min_length=1, description="The EndpointSlice port the gateway sends requests to: 'http' (Triton's "
                                          "own), or the port of a TLS terminator beside Triton.")
    upstream_tls_ca_file: str | None = Field(
        None, description="CA bundle (PEM) that signs the replicas' certificates: the gateway then speaks HTTPS to "
                          "them and verifies each against its host (a Service DNS name or address in its SANs).")
    upstream_tls_cert_file: str | None = Field(
        None, description="Client certificate (PEM) for mutual TLS to the replicas (with upstream_tls_key_file).")
    upstream_tls_key_file: str | None = Field(None, description="Private key (PEM) of upstream_tls_cert_file.")
    resolve: dict[str, str] = Field(
        default_factory=dict, description="Host names pinned to addresses (HOST=ADDRESS), for FQDN endpoints.")
    endpoint_slice_selector: str = Field(
        "", description="Label selector of the EndpointSlices to route to (empty: all; each names its "
                        "Service by the kubernetes.io/service-name label).")

    @field_validator("trusted_proxies")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        for cidr in v:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"{cidr!r} is not an address or CIDR") from None
        return v


class GatewaySettingsError(ValueError):
    pass


_LISTS = {"namespaces", "key_files", "trusted_proxies"}
# Settings whose command-line flag is not their name with dashes.
FLAGS = {"hold_timeout_seconds": "hold-timeout", "shutdown_timeout_seconds": "shutdown-timeout", "namespaces": "namespace",
         "key_files": "key-file"}


def _pairs(raw: str) -> dict[str, str]:
    return dict(pair.strip().split("=", 1) for pair in raw.split(",") if "=" in pair)


def from_env(environ: Mapping[str, str] | None = None, **overrides: object) -> GatewaySettings:
    values = env_values(GatewaySettings.model_fields, ENV_PREFIX, environ, lists=_LISTS, parsers={"resolve": _pairs})
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return GatewaySettings(**values)
    except ValidationError as e:
        first = e.errors()[0]
        field = str(first["loc"][0])
        flag = FLAGS.get(field, field.replace("_", "-"))
        raise GatewaySettingsError(f"{ENV_PREFIX}{field.upper()} (--{flag}): {first['msg']}") from None
