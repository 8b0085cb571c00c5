"""Operator settings: what differs between clusters, not between InferenceServices."""

from __future__ import annotations

import os

import json
from typing import Callable, Iterable, Mapping

from pydantic import BaseModel, Field, ValidationError, field_validator

ENV_PREFIX = "TRITON_OPERATOR_"


class NetworkPolicySettings(BaseModel):
    """A NetworkPolicy per InferenceService: its Triton pods accept connections only from these
    peers (NetworkPolicyPeer objects, as in networking.k8s.io/v1). The kubelet's probes come from
    the node and are not subject to it on common CNIs."""

    enabled: bool = False
    clients: list[dict[str, object]] = Field(
        default_factory=list, description="Peers allowed on Triton's HTTP and gRPC ports (the gateway, and any "
                                          "in-cluster client that calls Triton directly).")
    metrics: list[dict[str, object]] = Field(
        default_factory=list, description="Peers allowed on Triton's metrics port (Prometheus).")

    @field_validator("clients", "metrics", mode="before")
    @classmethod
    def _null_is_none(cls, value: object) -> object:
        return [] if value is None else value   # JSON's null, as a template writes an empty list


class Settings(BaseModel):
    """Read from TRITON_OPERATOR_* environment variables (see `from_env`)."""

    triton_image: str = Field(
        "nvcr.io/nvidia/tritonserver:26.07-py3",
        description="Default Triton image for formats other than tensorrt-llm (26.07: Triton 2.71.0, past the 25.07 "
                    "fixes of CVE-2025-23310/23311/23319/23320/23334).")
    llm_image: str = Field(
        "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3",
        description="NVIDIA's stock image that serves (and quantizes) tensorrt-llm services: Triton 2.71.0 with "
                    "TensorRT-LLM 1.2.1 (server docs/introduction/compatibility.md, release 26.07).")
    trtllm_version: str = Field(
        "1.2.1", pattern=r"^[0-9]+[.][0-9]+[.][0-9]+([a-z0-9.+-]*)$",
        description="TensorRT-LLM version of llm_image: prepared models are keyed by it, and serving pods check it.")
    min_driver: str = Field(
        "590.44.01", pattern=r"^[0-9]+([.][0-9]+)*$",
        description="NVIDIA driver llm_image's CUDA needs (13.1 for 26.07); older drivers are a warning of the doctor.")
    runtime_image: str = Field(
        "ghcr.io/triton-operator/triton-operator:0.1.0",
        description="The operator's own image, which holds triton-runtime: init containers write the model "
                    "repository with it, preparation Jobs download with it.")
    model_cache_claim: str = Field(
        "triton-models",
        description="Default PersistentVolumeClaim of the prepared-model cache (ReadWriteMany where several nodes "
                    "share it).")
    image_pull_secrets: list[str] = Field(
        default_factory=list,
        description="Secrets for pulling images (NGC's nvcr.io, a private registry), added to every pod and Job the "
                    "operator renders, beside spec.imagePullSecrets.")
    cluster_domain: str = Field("cluster.local", description="DNS suffix of Services.")
    field_manager: str = Field("triton-operator", description="Field manager for server-side apply.")
    namespaces: list[str] = Field(default_factory=list, description="Namespaces to watch; empty means all.")
    prometheus_url: str | None = Field(None, description="Prometheus base URL for autoscaling.")
    resync_seconds: float = Field(
        300.0, gt=0,
        description="Period of the full check: every InferenceService is queued again and compared with the cache "
                    "(no API reads; drift arrives as watch events and is corrected at once).")
    workers: int = Field(8, ge=1, le=64, description="InferenceServices reconciled in parallel.")
    api_qps: float = Field(100.0, gt=0, description="Sustained API requests per second (client-side limit).")
    api_burst: int = Field(200, ge=1, description="API requests allowed in a burst above api_qps.")
    autoscale_interval_seconds: float = Field(10.0, gt=0, description="Period of the autoscaler's tick.")
    prometheus_timeout_seconds: float = Field(5.0, gt=0, description="Timeout of one Prometheus query.")
    metrics_namespace_label: str = Field(
        "namespace", description="Label of Triton's series that holds the pod's namespace.")
    metrics_service_label: str = Field(
        "inferenceservice",
        description="Label of Triton's series that holds the InferenceService name (the chart's PodMonitor "
                    "copies it from the pod label serving.triton-operator.io/inferenceservice).")
    # LLM services run the `llm` model (runtime/triton_runtime/serving), which reports its engine's
    # own figures as triton_llm_*: it takes every request at once (a decoupled model's execute
    # returns immediately), so Triton's pending count stays at 0 and Triton's request durations
    # end when execute returns, not when the answer does. Other formats keep Triton's figures.
    queue_query: str = Field(
        'sum by ($namespace, $service) ({__name__=~"nv_inference_pending_request_count|triton_llm_queued_requests", '
        '$service!=""})',
        description="PromQL for requests waiting per service, over all its pods: the LLM engine's queue (requests it "
                    "accepted and has not started) plus Triton's pending requests.")
    p99_query: str = Field(
        'max by ($namespace, $service) (histogram_quantile(0.99, sum by ($namespace, $service, le) '
        '(rate(triton_llm_request_duration_seconds_bucket{$service!=""}[1m])))) * 1000'
        ' or max by ($namespace, $service) (nv_inference_request_summary_us{quantile="0.99", model!="llm", '
        '$service!=""}) / 1000',
        description="PromQL for the p99 request latency per service in milliseconds: request to last token for LLM "
                    "services, Triton's request summary for other models.")
    in_flight_query: str = Field(
        'sum by ($namespace, $service) (triton_llm_active_requests{$service!=""})',
        description="PromQL for requests inside the engines' batches per service (the LLM engine's active requests).")
    throughput_query: str = Field(
        'max by ($namespace, $service) ('
        'sum by ($namespace, $service, model) (rate(triton_llm_requests_total{finish_reason!="error", $service!=""}[1m]))'
        ' or sum by ($namespace, $service, model) (rate(nv_inference_request_success{model!="llm", $service!=""}[1m])))',
        description="PromQL for requests/s completed per service over the last minute (answers finished by the LLM "
                    "engine; for other formats, Triton's successes of the busiest model). The window must match the "
                    "policy's RATE_WINDOW_S.")
    recent_throughput_query: str = Field(
        'max by ($namespace, $service) ('
        'sum by ($namespace, $service, model) (rate(triton_llm_requests_total{finish_reason!="error", $service!=""}[20s]))'
        ' or sum by ($namespace, $service, model) (rate(nv_inference_request_success{model!="llm", $service!=""}[20s])))',
        description="PromQL for requests/s completed per service over the last 20 seconds: the throughput query over "
                    "a shorter window, which shows the bursts a minute's rate smooths away (the autoscaler holds "
                    "headroom for them). The window must match the policy's SHORT_WINDOW_S and hold at least two "
                    "scrapes (a scrape interval of 10 s or less); without it the policy learns bursts from minutes.")
    prompt_tokens_query: str = Field(
        'sum by ($namespace, $service) (rate(triton_llm_prompt_tokens_total{$service!=""}[5m]))'
        ' / sum by ($namespace, $service) (rate(triton_llm_requests_total{$service!=""}[5m]))',
        description="PromQL for the mean prompt tokens per request per service (the planner sizes a replica for it).")
    cached_tokens_query: str = Field(
        'sum by ($namespace, $service) (rate(triton_llm_prompt_tokens_cached_total{$service!=""}[5m]))'
        ' / sum by ($namespace, $service) (rate(triton_llm_requests_total{$service!=""}[5m]))',
        description="PromQL for the mean prompt tokens per request per service that the engines' prefix caches "
                    "already held (their prefill is skipped: the planner sizes a replica for the rest).")
    output_tokens_query: str = Field(
        'sum by ($namespace, $service) (rate(triton_llm_generation_tokens_total{$service!=""}[5m]))'
        ' / sum by ($namespace, $service) (rate(triton_llm_requests_total{$service!=""}[5m]))',
        description="PromQL for the mean output tokens per request per service.")
    reporting_query: str = Field(
        'count by ($namespace, $service) (count by ($namespace, $service, instance) '
        '(nv_inference_pending_request_count{$service!=""}))',
        description="PromQL for the number of a service's pods whose Triton metrics Prometheus has (fewer than the "
                    "ready replicas: the figures are partial, and nothing scales down on them).")
    held_query: str = Field(
        'sum by ($namespace, $service) (triton_gateway_held_requests{$service!=""})',
        description="PromQL for requests the gateway holds per service while no replica is ready (a service "
                    "waking from zero); they count as queued, so a service at zero wakes on the first tick that "
                    "sees one. The gateway labels its series namespace and inferenceservice.")
    gateway_in_flight_query: str = Field(
        'sum by ($namespace, $service) (triton_gateway_in_flight_requests{$service!=""})',
        description="PromQL for requests the gateway has sent to a service's replicas and not yet finished (use "
                    "that keeps a minReplicas 0 service from the idle window).")
    slo_met_query: str = Field(
        'sum by ($namespace, $service) (increase(triton_gateway_slo_requests_total{met="true", $service!=""}[10m]))',
        description="PromQL for the requests per service that met its latency target (spec.autoscaling.slo) over "
                    "the last 10 minutes, as the gateway counts them.")
    slo_requests_query: str = Field(
        'sum by ($namespace, $service) (increase(triton_gateway_slo_requests_total{$service!=""}[10m]))',
        description="PromQL for the requests per service counted against its latency target over the last 10 "
                    "minutes; met / counted is status.metrics.sloAttainment.")
    watch_gpu_capacity: bool = Field(
        True,
        description="Watch Nodes and every pod's GPU requests (cluster-wide list/watch) to know the free GPUs per "
                    "class: spill-over then moves replicas only to classes with room and brings them back when the "
                    "preferred class has had room for returnAfter. Off: spill tries the next class blindly and a "
                    "return is probed every returnAfter.")
    gateway_url: str | None = Field(
        None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$",
        description="Base URL of the gateway (e.g. https://llm.example.com); status.endpoints.openai is its /v1 "
                    "for the services it serves.")
    catalog_file: str | None = Field(
        None, description="GPUClass catalog YAML the operator applies at start (the Helm chart mounts it).")
    network_policy: NetworkPolicySettings = Field(
        default_factory=NetworkPolicySettings,
        description="NetworkPolicies for the Triton pods, as JSON (the chart builds it from networkPolicy.*).")
    log_format: str = Field("text", pattern=r"^(text|json)$",
                            description="Log lines as text or as JSON objects (with namespace, inferenceservice "
                                        "and reason fields where a line is about one service).")
    metrics_port: int = Field(8081, ge=0, le=65535, description="Port of the operator's own /metrics; 0 disables it.")
    metrics_address: str = Field("0.0.0.0", description="Address the operator's /metrics listens on.")


class SettingsError(ValueError):
    pass


def env_values(fields: Iterable[str], prefix: str, environ: Mapping[str, str] | None = None,
               lists: Iterable[str] = (), parsers: Mapping[str, Callable[[str], object]] | None = None
               ) -> dict[str, object]:
    """The settings given as environment variables (PREFIX + FIELD in upper case; unset or empty:
    the default): a list field is comma-separated (items stripped, empty ones dropped), a field with
    a parser is parsed, the rest is left to the model. Shared by the operator and the gateway."""
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for name in fields:
        raw = env.get(prefix + name.upper())
        if raw is None or raw == "":
            continue
        if parsers and name in parsers:
            values[name] = parsers[name](raw)
        elif name in lists:
            values[name] = [n.strip() for n in raw.split(",") if n.strip()]
        else:
            values[name] = raw
    return values


def _json(raw: str) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        raise SettingsError(f"{ENV_PREFIX}NETWORK_POLICY: not valid JSON") from None


def from_env(environ: Mapping[str, str] | None = None) -> Settings:
    values = env_values(Settings.model_fields, ENV_PREFIX, environ, lists=("namespaces", "image_pull_secrets"),
                        parsers={"network_policy": _json})
    try:
        return Settings(**values)
    except ValidationError as e:
        first = e.errors()[0]
        raise SettingsError(f"{ENV_PREFIX}{str(first['loc'][0]).upper()}: {first['msg']}") from None
