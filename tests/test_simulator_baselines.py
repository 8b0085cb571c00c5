"""Baselines configured as users configure them (`--policy hpa:...`, `keda:...`, `kpa:...`,
`fixed:N`): the parser's exact refusals, the upstream defaults for keys left out, the metric each
one scales on, and KEDA's and Knative's scale to zero and back. The replica is the simulator's
model (no GPU runs here)."""

from __future__ import annotations

import pytest

from triton_operator import cli
from triton_operator.api import AutoscalingSpec, GPUClass, InferenceService
from triton_operator.simulator import metrics_path, policies, replica, workload
from triton_operator.simulator.simulation import Pod, SimulationSettings, View
from triton_operator.simulator.policies import PolicyError, parse_policy

CLASSES = {d["metadata"]["name"]: GPUClass.model_validate(d) for d in cli.default_catalog()}


def svc(min_replicas: int = 1) -> InferenceService:
    return InferenceService.model_validate({
        "apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "x"},
        "spec": {"model": {"source": "hf://a/b", "format": "tensorrt-llm", "parameters": "8B", "precision": "fp8"},
                 "gpu": {"class": "h100", "count": 1},
                 "engine": {"maxBatchSize": 64, "maxInputLen": 16000, "maxSeqLen": 17000},
                 "autoscaling": {"minReplicas": min_replicas, "maxReplicas": 16, "targetQueueDepth": 4,
                                 "targetP99LatencyMs": 8000}}})


@pytest.mark.parametrize("text, message", [
    ("magic", "unknown policy 'magic'; choose from ours, oracle[:headroom=H], fixed:N, hpa[:metric=M,target=N,stabilization=S], "
              "keda[:metric=M,target=N,activation=A,polling=S,cooldown=S], kpa[:target=N,utilization=U,window=S] "
              "(M: queue|inflight|occupancy|concurrency)"),
    ("ours:x=1", "policy 'ours:x=1': ours takes no settings"),
    ("oracle:x=1", "policy 'oracle:x=1': unknown key 'x'; oracle takes headroom"),
    ("oracle:headroom=-1", "policy 'oracle:headroom=-1': headroom must be a number > -1 (a share of the saturated "
                           "need: 0.1 is 10 % over it), got '-1'"),
    ("fixed:0", "policy 'fixed:0': fixed:N needs a whole number N >= 1"),
    ("hpa:target", "policy 'hpa:target': expected key=value, got 'target'"),
    ("hpa:metric=queue,target=", "policy 'hpa:metric=queue,target=': expected key=value, got 'target='"),
    ("hpa:metric=queue,target=4,window=60",
     "policy 'hpa:metric=queue,target=4,window=60': unknown key 'window'; hpa takes metric, target, stabilization"),
    ("hpa:metric=gpu,target=4",
     "policy 'hpa:metric=gpu,target=4': metric must be one of queue, inflight, occupancy, concurrency, got 'gpu'"),
    ("hpa:metric=queue,target=x", "policy 'hpa:metric=queue,target=x': target must be a number > 0, got 'x'"),
    ("hpa:metric=queue,target=0", "policy 'hpa:metric=queue,target=0': target must be a number > 0, got '0'"),
    ("hpa:metric=queue,target=nan", "policy 'hpa:metric=queue,target=nan': target must be a number > 0, got 'nan'"),
    ("hpa:metric=queue,target=4,target=5", "policy 'hpa:metric=queue,target=4,target=5': target is given twice"),
    ("hpa:metric=inflight", "policy 'hpa:metric=inflight': metric and target go together (neither has an upstream "
                            "default), e.g. hpa:metric=concurrency,target=48"),
    ("keda:target=4", "policy 'keda:target=4': metric and target go together (neither has an upstream default), "
                      "e.g. keda:metric=concurrency,target=48"),
    ("hpa:metric=queue,target=4,stabilization=-1",
     "policy 'hpa:metric=queue,target=4,stabilization=-1': stabilization must be a number of seconds >= 0, got '-1'"),
    ("keda:metric=queue,target=4,activation=-2",
     "policy 'keda:metric=queue,target=4,activation=-2': activation must be a number >= 0, got '-2'"),
    ("keda:metric=queue,target=4,polling=0.5",
     "policy 'keda:metric=queue,target=4,polling=0.5': polling must be a number of seconds >= 1 (KEDA's "
     "pollingInterval is in whole seconds), got '0.5'"),
    ("oracle:headroom=1e308", "policy 'oracle:headroom=1e308': headroom must be at most 100, got '1e308'"),
    ("fixed:²", "policy 'fixed:²': fixed:N needs a whole number N >= 1"),
    ("fixed:100000000", "policy 'fixed:100000000': N is at most 1000 (maxReplicas' own limit)"),
    ("kpa:utilization=120", "policy 'kpa:utilization=120': utilization must be a percentage in (0, 100], got '120'"),
    ("kpa:window=2", "policy 'kpa:window=2': window must be a number of seconds >= 6 (Knative's minimum), got '2'"),
    ("kpa:metric=queue", "policy 'kpa:metric=queue': unknown key 'metric'; kpa takes target, utilization, window"),
])
def test_bad_policy_specs_are_refused_with_one_exact_line(text, message):
    with pytest.raises(PolicyError) as e:
        parse_policy(text)
    assert str(e.value) == message


def test_keys_left_out_take_the_upstream_defaults():
    auto = svc().spec.autoscaling
    cold = replica.ColdStart()

    def build(text):
        return policies.build_policy(parse_policy(text), auto, cold, 64.0)

    hpa = build("hpa:metric=inflight,target=40")
    assert (hpa.metric, hpa.target, hpa.stabilization, hpa.behavior.down_window, hpa.interval) == (
        "inflight", 40.0, 300.0, 300.0, 15.0)
    assert build("hpa").target == 4.0 and build("hpa").metric == "queue"       # targetQueueDepth on the queue
    assert build("hpa:metric=queue,target=2,stabilization=60").behavior.down_window == 60.0
    keda = build("keda:metric=concurrency,target=48")
    assert (keda.activation, keda.polling, keda.cooldown, keda.stabilization) == (0.0, 30.0, 300.0, 300.0)
    assert build("keda:metric=queue,target=4,polling=5").interval == 5.0
    kpa = build("kpa")
    assert (kpa.target_per_pod, kpa.utilization, kpa.stable_window, kpa.grace_s) == (100.0, 0.7, 60.0, 30.0)
    kpa = build("kpa:target=40,utilization=80,window=120")
    assert (kpa.target_per_pod, kpa.utilization, kpa.stable_window) == (40.0, 0.8, 120.0)
    assert build("fixed:3").replicas == 3
    assert parse_policy(" hpa:metric=queue , target=4 ").name == "hpa:metric=queue , target=4"


@pytest.mark.parametrize("metric, expected", [("queue", 3.0), ("inflight", 30.0), ("concurrency", 33.0),
                                              ("occupancy", 50.0)])
def test_each_metric_reads_its_own_figure_per_pod(metric, expected):
    sample = metrics_path.Sample(0.0, pending=3.0, p99_ms=1.0, success=0, active=30)
    assert policies.pod_metric(sample, metric, 60.0) == expected


def test_an_hpa_on_in_flight_requests_sizes_a_load_the_queue_cannot_see():
    """Ten pods each running 48 requests with nothing waiting: on the queue the HPA sees 0 and
    recommends its minimum; on in-flight with a target of 24 it asks for twice the pods."""
    auto = AutoscalingSpec(min_replicas=1, max_replicas=40)
    prom = metrics_path.Prometheus()
    pods = [Pod(i, "ready", -100.0, -50.0, 48) for i in range(10)]
    for t in (0.0, 5.0, 60.0):
        prom.scrape(t, {i: metrics_path.Sample(t, 0.0, 100.0, 0, 48) for i in range(10)}, [])
    view = View(60.0, 10, pods, prom, 480.0)
    on_queue = policies.HPA(auto, replica.ColdStart(), metric="queue", target=4.0)
    on_inflight = policies.HPA(auto, replica.ColdStart(), metric="inflight", target=24.0)
    assert on_queue.decide(view)[0] == 10          # min recommendation, held by the 300 s window
    assert on_queue.behavior.recommendations[-1][1] == 1
    n, why = on_inflight.decide(view)
    assert n == 20 and "inflight/pod 48.0 (target 24)" in why


def zero_run(name: str):
    """Two bursts 30 minutes apart on a service with minReplicas 0."""
    s = svc(min_replicas=0)
    perf = replica.llm_performance(s.spec, CLASSES["h100"].spec)
    reqs = [workload.Request(t + i * 0.5, 200, 20) for t in (600.0, 2400.0) for i in range(40)]
    cfg = SimulationSettings(min_replicas=0, max_replicas=16, slo_s=8.0, duration=3600.0)
    return policies.run_policy(name, reqs, perf, replica.ColdStart(5, 5, 10, 0), s.spec.autoscaling, cfg)


def test_keda_scales_to_zero_after_its_cooldown_and_wakes_on_activation():
    run = zero_run("keda:metric=concurrency,target=16,polling=30")
    assert run.timeline[0][1] == 0
    wakes = [(t, why) for t, old, new, why in run.decisions if old == 0]
    sleeps = [(t, why) for t, old, new, why in run.decisions if new == 0]
    assert len(wakes) == 2 and len(sleeps) == 2, run.decisions
    for (t, why), burst in zip(wakes, (600.0, 2400.0)):
        assert burst < t <= burst + 30.0 + 1e-9 and "> activation 0: 0 -> 1" in why   # the next poll
    for (t, why), burst in zip(sleeps, (600.0, 2400.0)):
        assert burst + 300.0 <= t <= burst + 20 + 300.0 + 2 * 30.0 and "cooldownPeriod" in why
    assert not any(run.dropped)


def test_knative_scales_to_zero_after_window_and_grace_and_wakes_through_the_activator():
    run = zero_run("kpa:target=16")
    wakes = [t for t, old, new, _ in run.decisions if old == 0]
    sleeps = [t for t, old, new, _ in run.decisions if new == 0]
    assert len(wakes) == 2 and len(sleeps) == 2, run.decisions
    for t, burst in zip(wakes, (600.0, 2400.0)):
        assert burst < t <= burst + 4.0                       # the next 2 s tick
    for t, burst in zip(sleeps, (600.0, 2400.0)):
        # the last request ends ~30 s after the burst starts; the stable window then empties (60 s)
        # and the grace period (30 s) passes
        assert burst + 60.0 + 30.0 <= t <= burst + 40.0 + 60.0 + 30.0 + 4.0
    assert not any(run.dropped)


# -- token mixes for held-out workloads ----------------------------------------------------------

def test_generated_token_mixes_stay_in_their_ranges():
    code = workload.generate("poisson:rate=20,duration=200,mix=code", seed=3)
    assert all(2048 <= r.prompt_tokens <= 8192 and 1 <= r.output_tokens <= 256 for r in code)
    rag = workload.generate("poisson:rate=20,duration=200,mix=rag", seed=3)
    assert all(4096 <= r.prompt_tokens <= 14000 for r in rag)
    chat = workload.generate("poisson:rate=20,duration=200,mix=chat", seed=3)
    assert sum(r.output_tokens for r in chat) > 1.2 * sum(r.prompt_tokens for r in chat)   # decode-heavy
    both = workload.merge(code, chat)
    assert len(both) == len(code) + len(chat) and all(a.arrival <= b.arrival for a, b in zip(both, both[1:]))


@pytest.mark.parametrize("spec, message", [
    ("poisson:rate=5,mix=video", "generator poisson: mix must be one of conv, code, rag, chat, got 'video'"),
    ("poisson:rate=5,mix=code,prompt=10", "generator poisson: give either prompt/output or mix, not both"),
])
def test_bad_token_mixes_are_refused(spec, message):
    with pytest.raises(workload.WorkloadError) as e:
        workload.generate(spec, 1)
    assert str(e.value) == message
