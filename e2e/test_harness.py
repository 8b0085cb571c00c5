"""The e2e harness is real: a real tritonserver queues requests, a real Prometheus scrapes it.

Run: .venv/bin/python -m pytest e2e/test_harness.py -q   (about half a minute; loopback only)
"""

from __future__ import annotations

import os
import threading
import time
import urllib.error

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from .harness import group_members, port_open
from .harness.loadgen import LoadGenerator, run_load
from .harness.prometheus import Prometheus, PrometheusError, Target
from .harness.triton import TritonServer, model_config, parse_metrics

MODEL = "slow"
DELAY_MS = 200
LABELS = {"namespace": "default", "service": "slow", "pod": "slow-0"}
TARGET_SELECTOR = 'namespace="default",service="slow",pod="slow-0"'
SELECTOR = f'model="slow",{TARGET_SELECTOR}'


@pytest.fixture(scope="module")
def triton():
    with TritonServer(model_name=MODEL, delay_ms=DELAY_MS) as server:
        yield server


@pytest.fixture(scope="module")
def prom(triton):
    with Prometheus([Target(triton.metrics_address, LABELS)]) as p:
        p.wait_targets_up(timeout=30)
        yield p


def _infer(triton: TritonServer, data: np.ndarray) -> tuple[np.ndarray, float]:
    client = grpcclient.InferenceServerClient(triton.grpc_address)
    try:
        inp = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        started = time.monotonic()
        result = client.infer(MODEL, [inp])
        return result.as_numpy("OUTPUT0"), time.monotonic() - started
    finally:
        client.close()


def test_generated_config_is_a_valid_model_config():
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    text = model_config(MODEL, 250, "/tmp/delay", instances=2)
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.name == MODEL and config.backend == "python" and config.max_batch_size == 0
    assert config.instance_group[0].count == 2
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert config.parameters["delay_ms"].string_value == "250"
    assert config.parameters["delay_file"].string_value == "/tmp/delay"
    assert not config.HasField("dynamic_batching")


def test_triton_starts_on_loopback_and_reports_ready(triton):
    client = httpclient.InferenceServerClient(triton.http_address)
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready(MODEL)
        assert client.get_server_metadata()["version"] == "2.51.0"
        config = client.get_model_config(MODEL)
        assert config["backend"] == "python"
        assert config["max_batch_size"] == 0
        assert config["instance_group"][0]["count"] == 1
        assert config["parameters"]["delay_ms"]["string_value"] == str(DELAY_MS)
    finally:
        client.close()
    listening = _listening_addresses()
    for port in (triton.http_port, triton.grpc_port, triton.metrics_port):
        assert listening.get(port) == {"127.0.0.1"}, (port, listening.get(port))
    assert triton.startup_seconds is not None  # bounded by start()'s own timeout; speed is not claimed here


def _listening_addresses() -> dict[int, set[str]]:
    """port -> local IPv4 addresses of the LISTEN sockets, from /proc/net/tcp (and tcp6)."""
    found: dict[int, set[str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            if state != "0A":  # LISTEN
                continue
            addr, port = local.rsplit(":", 1)
            if len(addr) == 32 and addr.startswith("0000000000000000FFFF0000"):
                addr = addr[24:]  # an IPv4-mapped IPv6 address: its IPv4 part
            if len(addr) == 8:  # one little-endian 32-bit word
                ip = ".".join(str(int(addr[i : i + 2], 16)) for i in (6, 4, 2, 0))
            else:
                ip = "::" if set(addr) == {"0"} else addr
            found.setdefault(int(port, 16), set()).add(ip)
    return found


def test_inference_answers_and_delay_changes_at_runtime(triton):
    """Lower bounds where a sleep guarantees them; the delay-free request is compared with the
    delayed one (a ratio), never with a fixed wall-clock limit a loaded runner could miss."""
    data = np.arange(4, dtype=np.float32)
    out, elapsed = _infer(triton, data)
    np.testing.assert_array_equal(out, data)
    assert elapsed >= DELAY_MS / 1000 * 0.9, elapsed

    triton.set_delay_ms(0)
    try:
        _, fast = _infer(triton, data)
        triton.set_delay_ms(400)
        _, slow = _infer(triton, data)
        assert slow >= 0.36, slow
        # Without the delay the same request takes a small fraction of the 400 ms one: the model
        # read the new delay (0) instead of keeping 200 ms.
        assert fast < slow / 2, (fast, slow)
    finally:
        triton.set_delay_ms(DELAY_MS)


def test_metrics_text_has_the_autoscaling_series(triton):
    samples = parse_metrics(triton.metrics_text())
    names = {(n, l.get("model"), l.get("quantile")) for n, l, _ in samples}
    assert ("nv_inference_pending_request_count", MODEL, None) in names
    assert ("nv_inference_request_summary_us", MODEL, "0.99") in names
    assert ("nv_inference_queue_duration_us", MODEL, None) in names
    assert ("nv_inference_compute_infer_duration_us", MODEL, None) in names


def test_queue_and_p99_under_load_are_seen_by_prometheus(triton, prom):
    with LoadGenerator(triton.grpc_address, MODEL, concurrency=8, duration_s=40) as load:
        # One instance at 200 ms a request: of 8 in flight, about 7 wait in Triton's queue.
        # Waited for, not sampled once: the queue fills as the load generator's workers start.
        pending = prom.wait_for(
            f"nv_inference_pending_request_count{{{SELECTOR}}}",
            lambda v: len(v) == 1 and v[0][1] >= 4,
            timeout=30,
        )
        labels, value = pending[0]
        assert labels["version"] == "1" and labels["job"] == "triton"
        assert value >= 4, pending
        # The p99 of requests that queued behind ~7 others is well above one service time.
        p99 = prom.wait_for(
            f'nv_inference_request_summary_us{{{SELECTOR},quantile="0.99"}}',
            lambda v: len(v) == 1 and v[0][1] >= 2 * DELAY_MS * 1000,
            timeout=20,
        )
        assert p99[0][0]["quantile"] == "0.99"
        # Queue time dominates compute time: the tutorial's queue/compute ratio is above 1.
        ratio = prom.wait_for(
            f"rate(nv_inference_queue_duration_us{{{SELECTOR}}}[5s])"
            f" / clamp_min(rate(nv_inference_compute_infer_duration_us{{{SELECTOR}}}[5s]), 1)",
            lambda v: len(v) == 1 and v[0][1] > 1,
            timeout=20,
        )
        assert ratio[0][1] > 1
    result = load.result
    assert result.failures == 0, result.summary()
    assert result.successes >= 8, result.summary()
    assert result.p50_ms is not None and result.p50_ms >= DELAY_MS, result.summary()
    assert result.p99_ms is not None and result.p99_ms >= result.p50_ms

    # Without load the queue drains and Prometheus sees it.
    prom.wait_for(f"nv_inference_pending_request_count{{{SELECTOR}}} == 0", lambda v: len(v) == 1, timeout=15)


def _run_load_bounded(wait_s: float, *args, **kwargs):
    """run_load in a thread, waited for at most wait_s: a run that ignores its bounds fails here
    instead of hanging the suite."""
    done: list = []
    worker = threading.Thread(target=lambda: done.append(run_load(*args, **kwargs)), daemon=True)
    worker.start()
    worker.join(timeout=wait_s)
    assert done, f"run_load{args} did not return within {wait_s}s"
    return done[0]


def test_run_load_is_bounded_in_time_and_count(triton):
    # The count bound: 4 requests, then it returns although its duration (30 s) is far from over.
    result = _run_load_bounded(15, triton.http_url, MODEL, concurrency=2, duration_s=30, max_requests=4)
    assert result.requests == 4 and result.failures == 0, result.summary()
    assert result.duration_s < 30 / 2, result.summary()

    # The time bound: it ran for its duration and then stopped sending. Two workers at 200 ms a
    # request cannot send more than 2 * (1 s / 200 ms + 1) requests in 1 s; a run that went on
    # past its duration would (a slow machine only sends fewer).
    result = _run_load_bounded(30, triton.grpc_address, MODEL, concurrency=2, duration_s=1.0)
    assert result.failures == 0 and result.successes >= 2, result.summary()
    assert result.duration_s >= 1.0, result.summary()
    assert result.requests <= 2 * (1000 // DELAY_MS + 1), result.summary()


def test_prometheus_follows_target_changes(triton, prom):
    # A scale-up adds a pod: a second server becomes a second target of the same service.
    second = {**LABELS, "pod": "slow-1"}
    with TritonServer(model_name=MODEL, delay_ms=0) as other:
        prom.set_targets([Target(triton.metrics_address, LABELS), Target(other.metrics_address, second)])
        up = prom.wait_for('up{service="slow"} == 1', lambda v: len(v) == 2, timeout=30)
        assert {labels["pod"] for labels, _ in up} == {"slow-0", "slow-1"}
        per_pod = prom.wait_for(
            'sum by (pod) (nv_inference_pending_request_count{service="slow",model="slow"})',
            lambda v: len(v) == 2, timeout=15,
        )
        assert {labels["pod"] for labels, _ in per_pod} == {"slow-0", "slow-1"}
    prom.set_targets([Target(triton.metrics_address, LABELS)])
    assert [t["labels"]["pod"] for t in prom.active_targets()] == ["slow-0"]


def test_prometheus_can_be_stopped_and_restarted(prom):
    up = f"up{{{TARGET_SELECTOR}}}"
    history = f"count_over_time({up}[10m])"
    before = prom.query_values(history)[0][1]
    port, data_dir = prom.port, prom.data_dir
    assert _listening_addresses().get(port) == {"127.0.0.1"}

    prom.stop()
    assert not prom.running() and not port_open("127.0.0.1", port)
    with pytest.raises((urllib.error.URLError, OSError)):
        prom.query("up")

    restarted_at = time.time()
    prom.start()
    assert prom.port == port and prom.data_dir == data_dir
    # The samples from before the outage are still there (same TSDB)...
    after = prom.query_values(history)[0][1]
    assert after >= before, (before, after)
    # ...and it scrapes again (the first scrape comes ~5 s after start: target sync period).
    prom.wait_for(f"timestamp({up}) > {restarted_at:.3f}", lambda v: len(v) == 1, timeout=20)

    # An abrupt crash too: the WAL is replayed on start.
    prom.kill()
    assert not prom.running()
    restarted_at = time.time()
    prom.start()
    assert prom.query_values(history)[0][1] >= before
    prom.wait_for(f"timestamp({up}) > {restarted_at:.3f}", lambda v: len(v) == 1, timeout=20)
    with pytest.raises(PrometheusError):
        prom.query("this is not promql")


def test_stop_leaves_no_process_behind():
    server = TritonServer(model_name="other", delay_ms=0).start()
    pgid = server.pid
    members = group_members(pgid)
    assert len(members) >= 2, members  # tritonserver and its Python-backend stub
    shm_prefix = server._shm_prefix
    server.stop()
    assert group_members(pgid) == []
    assert all(not os.path.exists(f"/proc/{pid}") for pid in members)
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(shm_prefix)]

    prom = Prometheus([]).start()
    prom_pid = prom.pid
    workdir = prom.workdir
    prom.close()
    assert not os.path.exists(f"/proc/{prom_pid}")
    assert workdir is not None and not workdir.exists()
