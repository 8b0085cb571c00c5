"""The gateway end to end: the real `openai` client against `triton-operator gateway` (a local
process with the chart's gateway ServiceAccount token, so every API request goes through the
chart's RBAC), routing to real Triton servers (the CPU build from the nvidia-pytriton wheel)
serving the textgen model (e2e/harness/textgen.py) through Triton's generate and generate_stream
endpoints, discovery from the local cluster's watches, and scale from and to zero driven by the
real operator reading a real Prometheus that scrapes the gateway and Triton.

Stand-ins, because no GPU and no container runs here:
- The InferenceServices' pods are kwok-simulated and cannot serve. The test keeps an EndpointSlice
  per service (label endpointslice.kubernetes.io/managed-by: e2e.triton-operator.io) with one
  endpoint per ready replica of the service's Deployment, pointing at that service's local
  Triton: the API server refuses loopback IPs in EndpointSlices, so the slice is of addressType
  FQDN with the name triton.e2e.invalid, which the gateway is told (--resolve) is 127.0.0.1; the
  port is that Triton's HTTP port. The gateway runs with --endpoint-slice-selector naming that
  label, so it ignores the slices the endpoint controller makes for the simulated pods' addresses.
  Each service has its own Triton, so one's traffic never shows as the other's.
- Prometheus attaches to each Triton's series the labels a PodMonitor would (namespace,
  inferenceservice); the gateway's own series carry them already.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any, Iterator

import openai
import pytest

from .cluster import Cluster, Operator, wait_for
from .conftest import tenant_gateway
from .harness.gateway import GatewayProcess, SliceMirror
from .harness.prometheus import Prometheus, Target
from .harness.textgen import TextGenTriton

NS = f"gateway-e2e-{uuid.uuid4().hex[:5]}"   # fresh per run: a kept cluster may still hold the last one
CHAT, SLEEPY = "chat", "sleepy"
GROUP = "serving.triton-operator.io"
TICK = 1.0
IDLE_S = 30   # sleepy's scaleToZeroAfterSeconds (the API's minimum)
KEY_A = "sk-e2e-a-" + secrets.token_urlsafe(32)      # namespace NS
KEY_B = "sk-e2e-b-" + secrets.token_urlsafe(32)      # only other/thing
KEY_SLOW = "sk-e2e-s-" + secrets.token_urlsafe(32)   # namespace NS, 6 requests a minute
SLEEPY_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}[assistant]"


@pytest.fixture(scope="module")
def tritons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, TextGenTriton]]:
    servers = {name: TextGenTriton(tmp_path_factory.mktemp(f"triton-{name}"), token_ms=5)
               for name in (CHAT, SLEEPY)}
    try:
        for server in servers.values():
            server.start()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="module")
def gateway(installed: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("gateway")
    with tenant_gateway(installed, work, [
        {"name": "team-a", "key": KEY_A, "namespaces": [NS]},
        {"name": "team-b", "key": KEY_B, "services": ["other/thing"]},
        {"name": "slow", "key": KEY_SLOW, "namespaces": [NS], "requestsPerMinute": 6}], NS) as gw:
        yield gw


@pytest.fixture(scope="module")
def prometheus(tritons: dict[str, TextGenTriton], gateway: GatewayProcess) -> Iterator[Prometheus]:
    targets = [Target(t.metrics_address, {"namespace": NS, "inferenceservice": name, "pod": f"{name}-0"})
               for name, t in tritons.items()]
    targets.append(Target(f"127.0.0.1:{gateway.metrics_port}", {}))
    prom = Prometheus(targets, scrape_interval="1s")
    prom.start()
    try:
        yield prom
    finally:
        prom.close()


@pytest.fixture(scope="module")
def services(operator: Operator, prometheus: Prometheus, gateway: GatewayProcess,
             tritons: dict[str, TextGenTriton]) -> Iterator[Cluster]:
    """The session's operator restarted with Prometheus, a 1 s tick and the gateway's URL; the
    services `chat` (one replica) and `sleepy` (minReplicas 0); the slice mirror. Each service's
    one Triton speaks for all its simulated pods, so the pods-reporting signal counts it as all of
    them (by default it counts scraped pods, and fewer than ready never scale down, to zero
    either)."""
    saved = dict(operator.extra_env)
    operator.extra_env.update({"TRITON_OPERATOR_PROMETHEUS_URL": prometheus.url,
                               "TRITON_OPERATOR_AUTOSCALE_INTERVAL_SECONDS": str(TICK),
                               "TRITON_OPERATOR_GATEWAY_URL": gateway.url,
                               "TRITON_OPERATOR_REPORTING_QUERY":
                                   'count by ($namespace, $service) (nv_inference_pending_request_count{$service!=""}) * 1000'})
    operator.stop()
    operator.start()
    c = operator.cluster
    wait_for("default ServiceAccount", lambda: c.get("serviceaccount", "default", NS), timeout=30)
    model = {"source": "hf://org/textgen", "format": "python", "name": "textgen"}
    c.apply([
        {"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService", "metadata": {"name": CHAT, "namespace": NS},
         "spec": {"model": model, "gpu": {"class": "l4"}, "replicas": 1, "openai": {"defaultMaxTokens": 8}}},
        {"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService", "metadata": {"name": SLEEPY, "namespace": NS},
         "spec": {"model": model, "gpu": {"class": "l4"}, "openai": {"chatTemplate": SLEEPY_TEMPLATE},
                  "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "targetQueueDepth": 4,
                                  "scaleToZeroAfterSeconds": IDLE_S, "scaleDownStabilizationSeconds": 5}}}])
    mirror = SliceMirror(c, {name: t.http_port for name, t in tritons.items()}, NS)
    mirror.thread.start()
    try:
        c.wait_ready(CHAT, NS, timeout=60)
        wait_for("chat routed", lambda: mirror.applied.get(CHAT) == 1, timeout=30)
        yield c
    finally:
        mirror.stop()
        c.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        operator.extra_env.clear()
        operator.extra_env.update(saved)
        operator.stop()
        operator.start()


def client(gw: GatewayProcess, key: str = KEY_A, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0, **kw)


def raw(gw: GatewayProcess, path: str, body: bytes | None = None, key: str | None = KEY_A,
        method: str | None = None) -> tuple[int, dict[str, Any], dict[str, str]]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(gw.url + path, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers)


# -- tests -------------------------------------------------------------------------------------------------

def test_models_keys_and_openai_shaped_errors(services: Cluster, gateway: GatewayProcess):
    assert sorted(m.id for m in client(gateway).models.list()) == [CHAT, SLEEPY]
    assert client(gateway).models.retrieve(CHAT).owned_by == NS
    assert list(client(gateway, KEY_B).models.list()) == []
    for model in (CHAT, f"{NS}/{CHAT}", "does-not-exist"):
        with pytest.raises(openai.PermissionDeniedError) as e:
            client(gateway, KEY_B).chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 403 and e.value.body["code"] == "model_not_allowed"
    with pytest.raises(openai.NotFoundError):  # team-a's namespace could hold it: 404 tells no more
        client(gateway).chat.completions.create(model="does-not-exist", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.AuthenticationError):
        client(gateway, "sk-not-a-key-000000000000").models.list()
    status, body, _ = raw(gateway, "/v1/models", key=None)
    assert status == 401 and body["error"]["code"] == "invalid_api_key"

    status, body, _ = raw(gateway, "/v1/chat/completions", b"{oops")
    assert status == 400 and set(body["error"]) == {"message", "type", "param", "code"}
    status, body, _ = raw(gateway, "/v1/chat/completions", json.dumps({"model": CHAT, "messages": [
        {"role": "user", "content": "x" * (2 << 20)}]}).encode())
    assert status == 413 and body["error"]["code"] == "request_too_large"
    status, body, _ = raw(gateway, "/v1/nothing-here")
    assert status == 404 and "error" in body

    slow = client(gateway, KEY_SLOW)
    for _ in range(5):
        slow.completions.create(model=CHAT, prompt="a", max_tokens=1)
    with pytest.raises(openai.RateLimitError) as e:
        slow.completions.create(model=CHAT, prompt="a", max_tokens=1)
    assert int(e.value.response.headers["Retry-After"]) >= 1
    log = gateway.log_path.read_text()
    assert KEY_A not in log and KEY_B not in log and KEY_SLOW not in log, "a key in the log"
    assert "Traceback" not in log


def test_chat_and_completions_streaming_and_not(services: Cluster, gateway: GatewayProcess):
    c = client(gateway)
    msgs = [{"role": "user", "content": "hello world"}]
    # chat has no spec.openai.chatTemplate: the template in the Triton model's config applies,
    # and the model echoes the prompt's words, so the answer shows the template.
    whole = c.chat.completions.create(model=CHAT, messages=msgs, max_tokens=4)
    expected = " <|user|>hello world<|assistant|> <|user|>hello world<|assistant|>"
    assert whole.choices[0].message.content == expected and whole.choices[0].message.role == "assistant"
    chunks = list(c.chat.completions.create(model=CHAT, messages=msgs, max_tokens=4, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == expected
    assert len(chunks) >= 5 and chunks[-1].choices[0].finish_reason == "length"
    # spec.openai.defaultMaxTokens (8) when the request sets none
    assert len(c.completions.create(model=CHAT, prompt="a b").choices[0].text.split()) == 8
    cut = c.completions.create(model=f"{NS}/{CHAT}", prompt="one two three", max_tokens=9, stop=["three"])
    assert cut.choices[0].text == " one two " and cut.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=CHAT, prompt="x y z", max_tokens=6, stream=True, stop=" z x"))
    assert streamed == " x y"

    status, meta, _ = raw(gateway, f"/v2/models/{CHAT}")
    assert status == 200 and meta["name"] == "textgen"
    status, out, _ = raw(gateway, f"/v2/models/{CHAT}/generate", json.dumps(
        {"text_input": "p q", "max_tokens": 3}).encode())
    assert status == 200 and out["text_output"] == " p q p"
    assert gateway.metric("triton_gateway_requests_total", inferenceservice=CHAT, route="chat", code="200") >= 2
    assert gateway.metric("triton_gateway_time_to_first_token_seconds_count", inferenceservice=CHAT) >= 1
    assert gateway.metric("triton_gateway_output_tokens_total", inferenceservice=CHAT) >= 4
    endpoints = services.get("infsvc", CHAT, NS)["status"]["endpoints"]
    assert endpoints["openai"] == f"{gateway.url}/v1"


def _reasons(c: Cluster, seen: list[str], stop: threading.Event) -> None:
    """Every Ready reason the service's status goes through, from a watch (a poll would miss a
    state that lasts less than one poll)."""
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes import watch as k8s_watch
    api = k8s_client.CustomObjectsApi(k8s_config.new_client_from_config(config_file=c.kubeconfig))
    w = k8s_watch.Watch()
    threading.Thread(target=lambda: stop.wait() or w.stop(), daemon=True).start()
    try:
        for event in w.stream(api.list_namespaced_custom_object, "serving.triton-operator.io", "v1alpha1", NS,
                              "inferenceservices", field_selector=f"metadata.name={SLEEPY}", timeout_seconds=300):
            conds = (event["object"].get("status") or {}).get("conditions") or []
            cond = next((x for x in conds if x.get("type") == "Ready"), None)
            if cond and (not seen or seen[-1] != cond["reason"]):
                seen.append(cond["reason"])
    except Exception:  # noqa: BLE001 - the stream ends when the test stops it
        pass


def test_wake_from_zero_answers_every_held_request(services: Cluster, gateway: GatewayProcess):
    c = services
    wait_for("sleepy at zero", lambda: (c.condition("infsvc", SLEEPY, NS, "ScaledToZero") or {}).get("status")
             == "True", timeout=60)
    assert c.get("deployment", SLEEPY, NS)["spec"]["replicas"] == 0
    seen: list[str] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_reasons, args=(c, seen, stop), daemon=True)
    watcher.start()
    # The watch's first event (the service as it is: at zero) before any request: on a loaded
    # machine the watch was set up after the wake had begun, and saw 'Serving' first.
    wait_for("the watch of the service's status", lambda: bool(seen), timeout=30, interval=0.05)
    answers: dict[int, Any] = {}
    started = time.monotonic()

    def ask(i: int) -> None:
        try:
            r = client(gateway, timeout=120).chat.completions.create(
                model=SLEEPY, messages=[{"role": "user", "content": f"wake {i}"}], max_tokens=3)
            answers[i] = (r.choices[0].message.content, time.monotonic() - started)
        except Exception as e:  # noqa: BLE001 - recorded, asserted below
            answers[i] = e

    askers = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    for t in askers:
        t.start()
    wait_for("6 requests held", lambda: gateway.metric("triton_gateway_held_requests", inferenceservice=SLEEPY) == 6,
             timeout=20, interval=0.1)
    for t in askers:
        t.join(120)
    stop.set()
    watcher.join(5)
    for i in range(6):
        assert not isinstance(answers[i], Exception), answers[i]
        assert answers[i][0] == f" [user] wake {i}", answers[i]   # the spec's chat template, 3 tokens
    first = min(a[1] for a in answers.values())
    print(f"\nwake from zero: first held request answered after {first:.1f}s, last after "
          f"{max(a[1] for a in answers.values()):.1f}s (tick {TICK}s, scrape 1s); Ready reasons {seen}")
    assert c.get("deployment", SLEEPY, NS)["spec"]["replicas"] >= 1
    assert seen[0] == "ScaledToZero" and "Waking" in seen and seen[-1] == "Serving", seen
    assert gateway.metric("triton_gateway_held_requests", inferenceservice=SLEEPY) == 0
    assert gateway.metric("triton_gateway_hold_seconds_count", inferenceservice=SLEEPY) == 6


def test_idle_service_scales_back_to_zero(services: Cluster, gateway: GatewayProcess):
    c = services
    wait_for("sleepy serving", lambda: (c.condition("infsvc", SLEEPY, NS, "Ready") or {}).get("status") == "True",
             timeout=60)
    started = time.monotonic()
    wait_for("sleepy back at zero", lambda: c.get("deployment", SLEEPY, NS)["spec"]["replicas"] == 0,
             timeout=IDLE_S + 120)
    took = time.monotonic() - started
    print(f"\nidle -> zero after {took:.0f}s (scaleToZeroAfterSeconds {IDLE_S}, Triton's 1m rate window)")
    status = c.get("infsvc", SLEEPY, NS)["status"]
    cond = {x["type"]: x for x in status["conditions"]}
    assert cond["ScaledToZero"]["status"] == "True" and cond["Ready"]["reason"] == "ScaledToZero"
    assert "scale to zero" in status["autoscaling"]["lastDecision"] or "scaled to zero" in \
        status["autoscaling"]["lastDecision"]
    wait_for("its slice emptied", lambda: gateway.metric("triton_gateway_services") >= 2, timeout=10)


def _stream_forever(gw: GatewayProcess, results: dict[str, Any], name: str, model: str) -> None:
    started = time.monotonic()
    got = ""
    try:
        for ch in client(gw, timeout=60).chat.completions.create(
                model=model, messages=[{"role": "user", "content": "long answer"}], max_tokens=400, stream=True):
            got += ch.choices[0].delta.content or ""
            results[name + ".first"] = True
        results[name] = ("finished", got, time.monotonic() - started)
    except Exception as e:  # noqa: BLE001 - what the client sees is the point
        results[name] = (type(e).__name__, got, time.monotonic() - started)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_gateway_restart_with_requests_in_flight(services: Cluster, gateway: GatewayProcess,
                                                 tritons: dict[str, TextGenTriton], sig: int):
    """Streams in flight (and, for SIGTERM, requests held for `ghost`, a service whose replicas
    never get a routable endpoint); the gateway stops. Every client gets an error within the
    shutdown timeout (2 s) plus a margin, none hangs; a new gateway serves again."""
    c = services
    tritons[CHAT].set_token_ms(100)   # 400 tokens: 40 s, far longer than the test waits
    results: dict[str, Any] = {}
    threads = [threading.Thread(target=_stream_forever, args=(gateway, results, f"s{i}", CHAT)) for i in range(3)]
    held = []
    if sig == signal.SIGTERM:
        c.apply({"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService",
                 "metadata": {"name": "ghost", "namespace": NS},
                 "spec": {"model": {"source": "hf://org/textgen", "format": "python", "name": "textgen"},
                          "gpu": {"class": "l4"}, "openai": {"enabled": True},
                          "autoscaling": {"minReplicas": 0, "maxReplicas": 1}}})
        wait_for("gateway knows ghost", lambda: "ghost" in [m.id for m in client(gateway).models.list()], 30)
        held = [f"h{i}" for i in range(2)]
        threads += [threading.Thread(target=_stream_forever, args=(gateway, results, name, "ghost")) for name in held]
    try:
        for t in threads:
            t.start()
        wait_for("streams under way", lambda: all(results.get(f"s{i}.first") for i in range(3)), timeout=30)
        if held:
            wait_for("held", lambda: gateway.metric("triton_gateway_held_requests", inferenceservice="ghost") == 2,
                     timeout=10)
        stopped = time.monotonic()
        gateway.signal(sig)
        for t in threads:
            t.join(15)
        assert not any(t.is_alive() for t in threads), "a client hangs"
        gateway.wait(15)
        took = time.monotonic() - stopped
        outcomes = {k: v for k, v in results.items() if not k.endswith(".first")}
        print(f"\n{signal.Signals(sig).name}: every client had its error {took:.1f}s after the signal: "
              f"{ {k: (v[0], round(v[2], 1)) for k, v in outcomes.items()} }")
        for name in [f"s{i}" for i in range(3)] + held:
            assert outcomes[name][0] != "finished", (name, outcomes[name])
        for name in held:
            assert outcomes[name][0] == "InternalServerError", outcomes[name]   # 503, Retry-After
        assert took < 10
    finally:
        tritons[CHAT].set_token_ms(5)
        if gateway.proc is not None and gateway.proc.poll() is None:
            gateway.proc.kill()
        gateway.start()
    assert client(gateway).completions.create(model=CHAT, prompt="back", max_tokens=2).choices[0].text == " back back"


def test_gateway_needs_no_cluster_access_beyond_its_rbac(gateway: GatewayProcess):
    """Covered by test_zz_rbac.py (the audit log); here: the gateway's readiness shows its watches."""
    with urllib.request.urlopen(f"http://127.0.0.1:{gateway.metrics_port}/readyz", timeout=5) as r:
        body = json.loads(r.read())
    assert body["ready"] and all(w["synced"] for w in body["watches"].values())
    assert set(body["watches"]) == {f"inferenceservices in {NS}", f"endpointslices in {NS}"}
    assert os.path.exists(gateway.kubeconfig)
