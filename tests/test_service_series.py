"""The per-service series dashboards and alerts read (controller/series.py, pure) and the gauges
that follow them (telemetry.ServiceSeries): a condition's old reason, a class a service left and a
deleted service leave no series behind."""

from __future__ import annotations

from prometheus_client import REGISTRY

from triton_operator import telemetry
from triton_operator.controller.series import service_series

SPILLED_STATUS = {
    "replicas": 3, "readyReplicas": 2, "gpuClass": "h100",
    "conditions": [{"type": "Ready", "status": "True", "reason": "Serving"},
                   {"type": "Degraded", "status": "False", "reason": "AsExpected"},
                   {"type": "MetricsAvailable", "status": "False", "reason": "PrometheusUnreachable"}],
    "placement": [{"gpuClass": "h100", "desired": 1, "ready": 1, "reason": "Full"},
                  {"gpuClass": "h200", "desired": 2, "ready": 1, "reason": "SpilledOver"},
                  {"gpuClass": "l4", "desired": 0, "ready": 0, "reason": "TooSmall"}],
}


def test_conditions_replicas_by_class_spill_and_the_latency_target():
    series = service_series({"autoscaling": {"targetP99LatencyMs": 800}}, SPILLED_STATUS)
    assert series["triton_operator_service_condition"] == {
        ("Ready", "True", "Serving"): 1, ("Degraded", "False", "AsExpected"): 1,
        ("MetricsAvailable", "False", "PrometheusUnreachable"): 1}
    # The class left out (l4, no replicas) has no replica series.
    assert series["triton_operator_service_replicas"] == {
        ("h100", "desired"): 1, ("h100", "ready"): 1, ("h200", "desired"): 2, ("h200", "ready"): 1}
    assert series["triton_operator_service_spilled_replicas"] == {(): 2}
    assert series["triton_operator_service_latency_target_seconds"] == {(): 0.8}
    assert series["triton_operator_service_slo_objective"] == {("endToEnd",): 0.99}


def test_the_service_level_from_slo_sets_the_objective_and_an_end_to_end_target_only():
    """spec.autoscaling.slo states the share and which latency; the histograms the alerts read are
    end to end, so a target on the first token or between tokens exports no latency target (the
    gateway's SLO counter judges those requests)."""
    def level(slo):
        got = service_series({"autoscaling": {"slo": slo}}, {})
        return got["triton_operator_service_latency_target_seconds"], got["triton_operator_service_slo_objective"]

    assert level({"latencyMs": 4000, "attainment": 0.95}) == ({(): 4.0}, {("endToEnd",): 0.95})
    assert level({"latencyMs": 4000}) == ({(): 4.0}, {("endToEnd",): 0.99})
    assert level({"latencyMs": 300, "latency": "timeToFirstToken", "attainment": 0.9}) == (
        {}, {("timeToFirstToken",): 0.9})
    assert level({"latencyMs": 50, "latency": "interToken"}) == ({}, {("interToken",): 0.99})
    # Out of shape (the CRD refuses these; a reader of stored objects still must not fail).
    assert level({"latencyMs": "4s"}) == ({}, {})
    assert level({"latencyMs": 4000, "attainment": 1.5}) == ({(): 4.0}, {("endToEnd",): 0.99})
    assert level("fast") == ({}, {})


def test_replicas_spilled_to_a_class_that_is_full_too_still_count_as_spilled():
    """Two replicas moved to h200, which had room for one: the class spilled to reads Full, not
    SpilledOver, yet both run (or wait) on a fallback class; the count read 0 and the SpilledOver
    alert stayed quiet (a CI run of e2e/test_dashboards.py)."""
    status = {**SPILLED_STATUS, "placement": [
        {"gpuClass": "h100", "desired": 2, "ready": 2, "reason": "Full"},
        {"gpuClass": "h200", "desired": 2, "ready": 1, "reason": "Full"},
        {"gpuClass": "a100-80gb", "desired": 0, "ready": 0, "reason": "Standby"}]}
    assert service_series({}, status)["triton_operator_service_spilled_replicas"] == {(): 2}


def test_a_service_without_placement_autoscaling_or_status():
    plain = service_series({"replicas": 2}, {"replicas": 2, "readyReplicas": 0, "gpuClass": "l4",
                                             "conditions": [{"type": "Ready", "status": "False", "reason": "Loading"}]})
    assert plain["triton_operator_service_replicas"] == {("l4", "desired"): 2, ("l4", "ready"): 0}
    assert plain["triton_operator_service_spilled_replicas"] == {(): 0}
    assert plain["triton_operator_service_latency_target_seconds"] == {}
    assert plain["triton_operator_service_slo_objective"] == {}
    # No class yet (a missing GPUClass): conditions only, no replica or spill series invented.
    empty = service_series({}, {"conditions": [{"type": "Degraded", "status": "True", "reason": "GPUClassNotFound"}]})
    assert empty["triton_operator_service_replicas"] == {} and empty["triton_operator_service_spilled_replicas"] == {}


def _value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_the_gauges_follow_the_status_and_go_with_the_service():
    exporter, key = telemetry.ServiceSeries(), ("series-test", "demo")
    svc = {"namespace": key[0], "inferenceservice": key[1]}
    exporter.set(key, service_series({"autoscaling": {"targetP99LatencyMs": 500}}, SPILLED_STATUS))
    assert _value("triton_operator_service_condition", **svc, condition="MetricsAvailable", status="False",
                  reason="PrometheusUnreachable") == 1
    assert _value("triton_operator_service_replicas", **svc, gpu_class="h200", state="desired") == 2
    assert _value("triton_operator_service_spilled_replicas", **svc) == 2
    assert _value("triton_operator_service_latency_target_seconds", **svc) == 0.5
    assert _value("triton_operator_service_slo_objective", **svc, latency="endToEnd") == 0.99

    back = {**SPILLED_STATUS, "placement": [{"gpuClass": "h100", "desired": 3, "ready": 3, "reason": "Preferred"}],
            "conditions": [{"type": "MetricsAvailable", "status": "True", "reason": "MetricsFresh"}]}
    exporter.set(key, service_series({}, back))
    assert _value("triton_operator_service_condition", **svc, condition="MetricsAvailable", status="False",
                  reason="PrometheusUnreachable") is None
    assert _value("triton_operator_service_condition", **svc, condition="MetricsAvailable", status="True",
                  reason="MetricsFresh") == 1
    assert _value("triton_operator_service_replicas", **svc, gpu_class="h200", state="desired") is None
    assert _value("triton_operator_service_spilled_replicas", **svc) == 0
    assert _value("triton_operator_service_latency_target_seconds", **svc) is None
    assert _value("triton_operator_service_slo_objective", **svc, latency="endToEnd") is None

    exporter.forget(key)
    assert _value("triton_operator_service_replicas", **svc, gpu_class="h100", state="ready") is None
    assert _value("triton_operator_service_spilled_replicas", **svc) is None
    exporter.forget(key)   # twice: nothing left to remove, no error
