"""The live loop's pure parts: the one combined PromQL query, its result back into per-service
signals, the pods' start-up time from the cache, and the planner's sizing of a replica. The
query itself runs against a real Prometheus in e2e/test_autoscaling.py."""

from __future__ import annotations

import math

import pytest

from triton_operator.api import GPUClass, InferenceService
from triton_operator.autoscaling.loop import (ASSUMED_OUTPUT_TOKENS, ASSUMED_PROMPT_TOKENS, is_new, signals_for, sizing_for,
                                           startup_seconds)
from triton_operator.autoscaling.prometheus import SIGNAL_LABEL, SIGNALS, Snapshot, combined_query, parse
from triton_operator.cli import default_catalog
from triton_operator.controller.trim import trim_pod
from triton_operator.labels import LABEL_GPU_CLASS
from triton_operator.planning.llm_performance import llm_performance
from triton_operator.settings import Settings

KEY = ("prod", "chat")


def series(signal: str, value: str, ns: str = "prod", svc: str = "chat") -> dict:
    return {"metric": {SIGNAL_LABEL: signal, "namespace": ns, "inferenceservice": svc}, "value": [1.0, value]}


def test_one_query_tags_every_signal_and_substitutes_the_labels():
    q = combined_query(Settings())
    assert q.count("label_replace(") == len(SIGNALS) == 13
    for signal in SIGNALS:
        assert f'"{SIGNAL_LABEL}", "{signal}", "", ""' in q
    assert "$service" not in q and "$namespace" not in q
    assert ('sum by (namespace, inferenceservice) ({__name__=~"nv_inference_pending_request_count|'
            'triton_llm_queued_requests", inferenceservice!=""})') in q
    # the gateway's gauges are two more signals of the same query (no second query for them)
    assert 'sum by (namespace, inferenceservice) (triton_gateway_held_requests{inferenceservice!=""})' in q
    assert 'sum by (namespace, inferenceservice) (triton_gateway_in_flight_requests{inferenceservice!=""})' in q
    # and so are the requests it counted against the service level, met and all (status.metrics.sloAttainment)
    assert ('sum by (namespace, inferenceservice) (increase(triton_gateway_slo_requests_total{met="true", '
            'inferenceservice!=""}[10m]))') in q
    custom = Settings(metrics_service_label="app", queue_query='sum by ($namespace, $service) (my_queue)')
    assert "sum by (namespace, app) (my_queue)" in combined_query(custom)


def test_the_union_comes_back_per_signal_and_service():
    snap = parse([series("queue", "12"), series("throughput", "30.5"), series("p99", "NaN"),
                  series("queue", "3", svc="other"), {"metric": {"namespace": "prod"}, "value": [1, "9"]}],
                 Settings())
    assert snap.get("queue", KEY) == 12 and snap.get("queue", ("prod", "other")) == 3
    assert snap.get("throughput", KEY) == 30.5 and math.isnan(snap.get("p99", KEY))
    assert snap.get("in_flight", KEY) is None and snap.error is None


def test_a_failed_query_is_an_error_for_every_service():
    s = signals_for(KEY, Snapshot(error="Prometheus unreachable: ConnectionError"), ready=3)
    assert s.error == "Prometheus unreachable: ConnectionError" and s.queue_depth is None


def test_no_queue_series_is_an_error_not_an_idle_service():
    snap = parse([series("throughput", "30")], Settings())
    assert "no Triton metrics for this service" in signals_for(KEY, snap, ready=2).error
    assert "no replica is ready" in signals_for(KEY, snap, ready=0).error


def test_missing_optional_signals_are_unknown_never_zero():
    snap = parse([series("queue", "0"), series("in_flight", "NaN"), series("reporting", "2")], Settings())
    s = signals_for(KEY, snap, ready=2, startup_s=61.0)
    assert s.queue_depth == 0 and s.throughput is None and s.in_flight is None and s.p99_ms is None
    assert s.reporting == 2 and s.startup_s == 61.0 and s.capacity_hint is None


def pod(created: str, ready_at: str | None, status: str = "True", deleting: bool = False, restarts: int = 0,
        scheduled: str | None = None) -> dict:
    conds = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled or created}]
    if ready_at:
        conds.append({"type": "Ready", "status": status, "lastTransitionTime": ready_at})
    return trim_pod({"metadata": {"creationTimestamp": created,
                                  "deletionTimestamp": "2026-01-01T00:00:00Z" if deleting else None},
                     "status": {"conditions": conds, "containerStatuses": [
                         {"name": "triton", "ready": status == "True", "restartCount": restarts, "state": {}}]}})


def test_startup_is_the_newest_ready_pods_creation_to_ready():
    """Through the cache's trim_pod, as the loop reads pods."""
    pods = [pod("2026-01-01T10:00:00Z", "2026-01-01T10:01:30Z"),     # old pod: 90 s
            # newest ready: 45 s from creation, of which 30 s waiting for a node
            pod("2026-01-01T11:00:00Z", "2026-01-01T11:00:45Z", scheduled="2026-01-01T11:00:30Z"),
            pod("2026-01-01T11:05:00Z", None),                        # still starting
            pod("2026-01-01T11:06:00Z", "2026-01-01T11:06:10Z", status="False"),
            pod("2026-01-01T11:07:00Z", "2026-01-01T11:07:05Z", deleting=True),
            pod("2026-01-01T11:08:00Z", "2026-01-01T13:00:00Z", restarts=1)]   # recovered, not started
    assert startup_seconds(pods) == 45.0
    assert startup_seconds([pod("2026-01-01T11:05:00Z", None)]) is None and startup_seconds(None) is None


def llm(fmt: str = "tensorrt-llm") -> InferenceService:
    return InferenceService.model_validate({
        "apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "prod"},
        "spec": {"model": {"source": "hf://meta-llama/Meta-Llama-3-8B-Instruct", "format": fmt,
                           "parameters": "8B", "precision": "fp8"},
                 "gpu": {"class": "h100"}, "autoscaling": {"maxReplicas": 8}}})


def deployment(gpu_class: str = "h100") -> dict:
    return {"spec": {"template": {"metadata": {"labels": {LABEL_GPU_CLASS: gpu_class}}}}}


def catalog() -> dict[str, GPUClass]:
    return {d["metadata"]["name"]: GPUClass.model_validate(d) for d in default_catalog()}


def test_a_tensorrt_llm_replica_is_sized_for_the_measured_token_mix():
    classes = catalog()
    snap = parse([series("queue", "0"), series("prompt_tokens", "1155"), series("output_tokens", "211")], Settings())
    sized = sizing_for(llm(), deployment(), classes, snap, KEY)
    expected = llm_performance(llm().spec, classes["h100"].spec).sizing(1155, 211)
    assert sized == expected and 20 < sized.rate < 30 and sized.slots == 64
    s = signals_for(KEY, snap, ready=1, sizing=sized)
    assert (s.capacity_hint, s.solo_latency_s, s.batch_slots) == (sized.rate, sized.solo_s, sized.slots)


def test_prompt_tokens_the_prefix_caches_held_are_not_prefilled_again():
    """Routing by prefix: 900 of 1,155 prompt tokens a request came from the engine's cache. The
    replica is sized for prefilling the other 255 (each still attending to the whole prompt), so it
    completes more requests a second, while every sequence still holds its whole prompt's KV."""
    classes = catalog()
    mix = [series("queue", "0"), series("prompt_tokens", "1155"), series("output_tokens", "211")]
    cold = sizing_for(llm(), deployment(), classes, parse(mix, Settings()), KEY)
    warm = sizing_for(llm(), deployment(), classes, parse(mix + [series("cached_tokens", "900")], Settings()), KEY)
    perf = llm_performance(llm().spec, classes["h100"].spec)
    assert warm == perf.sizing(1155, 211, 900)
    assert warm.prefill_s == pytest.approx(perf.prefill_s(1155) - perf.prefill_s(900))
    assert warm.prefill_s < cold.prefill_s / 3 and warm.rate > 1.2 * cold.rate and warm.slots == cold.slots
    # NaN (no requests in the window) or no cache series: nothing cached.
    nan = sizing_for(llm(), deployment(), classes, parse(mix + [series("cached_tokens", "NaN")], Settings()), KEY)
    assert nan == cold


def test_a_whole_prompt_from_the_cache_still_prefills_its_last_token():
    perf = llm_performance(llm().spec, catalog()["h100"].spec)
    sized = perf.sizing(1000, 100, 5000)
    assert sized.prefill_s == pytest.approx(perf.prefill_s(1000) - perf.prefill_s(999)) and sized.prefill_s > 0


def test_without_token_metrics_the_planner_assumes_a_chat_mix():
    classes = catalog()
    sized = sizing_for(llm(), deployment(), classes, parse([series("queue", "0")], Settings()), KEY)
    assert sized == llm_performance(llm().spec, classes["h100"].spec).sizing(ASSUMED_PROMPT_TOKENS, ASSUMED_OUTPUT_TOKENS)


@pytest.mark.parametrize("service,dep", [(llm("onnx"), deployment()), (llm(), deployment("no-such-class")),
                                         (llm(), {"spec": {}})])
def test_no_sizing_without_an_llm_engine_or_a_known_gpu_class(service, dep):
    assert sizing_for(service, dep, catalog(), parse([series("queue", "0")], Settings()), KEY) is None


def test_the_snapshot_still_reads_as_queue_p99_and_errors():
    snap = parse([series("queue", "4"), series("p99", "250")], Settings())
    assert snap.queue == {KEY: 4.0} and snap.p99 == {KEY: 250.0} and snap.errors == {}
    assert set(Snapshot(error="down").errors) == set(SIGNALS)


@pytest.mark.parametrize(("created", "new"), [
    ("2026-11-21T11:55:00Z", True),    # five minutes old: nothing is known of its bursts yet
    ("2026-11-21T11:30:01Z", True),    # just under the policy's memory of bursts (30 minutes)
    ("2026-11-21T11:30:00Z", False),   # as old as that memory: it has served before
    ("2026-11-20T12:00:00Z", False),   # first seen after an operator restart, a day old
    (None, False),                     # no creation time: not known to be new
])
def test_a_service_is_new_while_younger_than_the_memory_of_bursts(created, new):
    from datetime import datetime, timezone
    now = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
    assert is_new({"metadata": {"creationTimestamp": created}}, now) is new
