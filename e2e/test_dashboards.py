"""Every panel query of the chart's two Grafana dashboards and every expression of its
PrometheusRule, evaluated by a real Prometheus over real series: the real operator (as the chart's
ServiceAccount, on the local cluster), the real gateway, and a real LLM on the real CPU Triton
(SmolLM2-135M through llama.cpp, e2e/harness/llm.py), with the PrometheusRule's groups loaded as
Prometheus's rule file. The dashboards and the rule are those `helm template` prints with
dashboards.enabled and alerts.enabled.

The scenario (namespace NS) gives every panel something to show:
- `smol` (tensorrt-llm on l4, autoscaled, targetP99LatencyMs 50: no CPU answer is that quick, so
  its latency SLO burns): a request held at the gateway before the service is routed, twice (a
  histogram's first observation creates its series, so only the second shows as a rate), then
  streamed and whole answers through the gateway (time to first token, tokens, key usage), and one
  request with a wrong key (a refusal);
- `vision` (onnx on a100-80gb): a plain Triton model (e2e/harness/triton.py) answering a few
  inferences, for the panels of non-LLM formats (Triton's p99 summary);
- `nometrics` (onnx on a100-80gb, autoscaled, no Triton series): MetricsAvailable=False;
- `big` (4 replicas of 8 GPUs, h100 spilling to h200): 2 on h100, 1 spilled to h200, 1 that
  fits nowhere: Degraded=GPUClassesFull and spilled replicas;
- `lost` (a GPU class that does not exist): not Ready, Degraded.
The operator's and the gateway's jobs are named as the Prometheus Operator names the chart's
ServiceMonitors' jobs (the metrics Services), with honorLabels, so the alerts' `up` selectors are
checked too; at the end both are stopped and the down alerts' expressions must see it.

Stand-ins, as in e2e/test_llm_gateway.py: kwok pods cannot serve, so an EndpointSlice points `smol`
at the local Triton, and Prometheus gives the Tritons' series the labels the chart's PodMonitor would.
Grafana's variables are substituted as Grafana would ($__rate_interval, $__range, $namespace,
$service); the variables' own label_values() queries are read through Prometheus's label API.

Run: E2E_CLUSTER_NAME=<name> .venv/bin/python -m pytest e2e/test_dashboards.py -q
"""

from __future__ import annotations

import json
import math
import re
import secrets
import subprocess
import threading
import uuid
from typing import Any, Iterator

import numpy as np
import openai
import pytest
import tritonclient.http as httpclient
import yaml

from .cluster import ROOT, Cluster, Operator, model_cache, wait_for
from .conftest import RELEASE_NS, tenant_gateway
from .harness.gateway import SLICE_MANAGER, TRITON_HOST, GatewayProcess
from .harness.llm import LLMTriton
from .harness.prometheus import Prometheus, PrometheusError, Target
from .harness.triton import TritonServer

NS = f"dash-e2e-{uuid.uuid4().hex[:5]}"
GROUP = "serving.triton-operator.io"
NAME, PLAIN = "smol", "vision"
#: The per-service dashboard is evaluated for each of these; every query must have data for one.
SERVICES = (NAME, PLAIN, "nometrics")
KEY = "sk-e2e-dash-" + secrets.token_urlsafe(32)
CHART = ROOT / "charts" / "triton-operator"
OPERATOR_JOB, GATEWAY_JOB = "triton-operator-metrics", "triton-operator-gateway-metrics"
GRAFANA = {"$__rate_interval": "5m", "$__range": "15m"}

#: Queries that may return nothing here, and why. They are evaluated all the same (they must run).
MAY_BE_EMPTY = {
    ("fleet", "Reconcile errors", "A"): "no reconcile pass fails in this scenario: the retry and error outcomes "
                                        "have no series until one does",
    ("fleet", "Prometheus query errors", "A"): "the autoscaler's query never fails here: "
                                          "triton_operator_prometheus_query_errors_total has no series until one does",
}

#: Alerts whose expression returns these services in the scenario (firing, before their `for`).
FIRING = {
    "TritonServiceLatencyBudgetBurnFast": {NAME}, "TritonServiceLatencyBudgetBurnSlow": {NAME},
    "TritonServiceMetricsUnavailable": {"nometrics"}, "TritonServiceGPUClassFull": {"big"},
    "TritonServiceSpilledOver": {"big"},
}
#: Alerts quiet in the healthy scenario, and why; their expressions must return nothing, and every
#: series they read must exist. promtool (e2e/test_alerts.py) makes each of them fire.
QUIET = {
    "TritonServicePreparationFailed": "kwok completes every preparation Job; smol's ModelReady series is read",
    "TritonOperatorNoLeader": "one operator process, and it leads; a standby alone is e2e/test_leader.py's",
    "TritonOperatorDown": "up while the scenario runs; test_the_down_alerts_see_the_outage stops it",
    "TritonGatewayDown": "up while the scenario runs; test_the_down_alerts_see_the_outage stops it",
    "TritonGatewayKeyFilesUnusable": "the gateway's key file is valid here (broken ones: tests/test_gateway*.py)",
}


def helm_template(*args: str) -> list[dict[str, Any]]:
    bin_dir = subprocess.run([ROOT / "hack" / "install-tools.sh"], check=True, capture_output=True,
                             text=True).stdout.strip()
    out = subprocess.run([f"{bin_dir}/helm", "template", "triton-operator", str(CHART), "-n", RELEASE_NS,
                          "--kube-version", "1.36.0",
                          "--set", "dashboards.enabled=true", "--set", "alerts.enabled=true",
                          "--set", "gateway.enabled=true", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def chart() -> dict[str, Any]:
    docs = helm_template()
    dashboards = {cm["metadata"]["name"].rsplit("-", 1)[1]: json.loads(next(iter(cm["data"].values())))
                  for cm in docs if cm["kind"] == "ConfigMap" and "grafana_dashboard" in cm["metadata"]["labels"]}
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    # The jobs the alerts select are the ServiceMonitors' Services.
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert {OPERATOR_JOB, GATEWAY_JOB} <= services
    return {"dashboards": dashboards, "groups": rule["spec"]["groups"]}


@pytest.fixture(scope="module")
def llm() -> Iterator[LLMTriton]:
    with LLMTriton() as server:
        yield server


@pytest.fixture(scope="module")
def plain() -> Iterator[TritonServer]:
    with TritonServer(model_name=PLAIN, delay_ms=0) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(installed: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("dash-gateway")
    with tenant_gateway(installed, work, [{"name": "dash-team", "key": KEY, "namespaces": [NS]}], NS) as gw:
        yield gw


def client(gw: GatewayProcess, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0, timeout=120)


def isvc(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceService", "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def ask(gw: GatewayProcess, i: int, stream: bool) -> None:
    messages = [{"role": "user", "content": f"Name a colour (number {i})."}]
    if stream:
        chunks = client(gw).chat.completions.create(model=NAME, messages=messages, max_tokens=12, temperature=0,
                                                    stream=True, stream_options={"include_usage": True})
        assert any(c.usage for c in chunks)
    else:
        out = client(gw).chat.completions.create(model=NAME, messages=messages, max_tokens=12, temperature=0)
        assert out.usage.completion_tokens > 0


def route(c: Cluster, port: int, ready: bool) -> None:
    """smol's EndpointSlice (as e2e/harness/gateway.SliceMirror writes it): one endpoint at the
    local Triton, or none."""
    c.apply({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": f"{NAME}-e2e", "namespace": NS, "labels": {
                 "kubernetes.io/service-name": NAME, "endpointslice.kubernetes.io/managed-by": SLICE_MANAGER}},
             "addressType": "FQDN", "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
             "endpoints": [{"addresses": [TRITON_HOST], "conditions": {"ready": True}}] if ready else []})


def hold_once(c: Cluster, gw: GatewayProcess, port: int, i: int) -> None:
    """A request to smol held at the gateway (smol has no endpoint), answered once the slice has
    one. A request the gateway still routes (its watch has not seen the slice emptied yet) is
    answered at once: then another is sent."""
    for attempt in range(20):
        held = threading.Thread(target=ask, args=(gw, i + attempt, False))
        held.start()
        if wait_for("a request held for smol, or answered", lambda: (
                gw.metric("triton_gateway_held_requests", inferenceservice=NAME) == 1 and "held")
                or (not held.is_alive() and "answered"), timeout=60) == "held":
            route(c, port, True)
            held.join(180)
            assert not held.is_alive(), "the held request was answered once smol was routed"
            return
    raise AssertionError("the gateway never held a request for smol without endpoints")


def infer(server: TritonServer, n: int) -> None:
    client = httpclient.InferenceServerClient(server.http_address)
    try:
        for _ in range(n):
            inp = httpclient.InferInput("INPUT0", [4], "FP32")
            inp.set_data_from_numpy(np.arange(4, dtype=np.float32))
            client.infer(PLAIN, [inp])
    finally:
        client.close()


@pytest.fixture(scope="module")
def scenario(chart, operator: Operator, gateway: GatewayProcess, llm: LLMTriton,
             plain: TritonServer) -> Iterator[Prometheus]:
    def job(name: str, port: int) -> dict[str, Any]:
        return {"job_name": name, "honor_labels": True, "scrape_interval": "1s",
                "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": RELEASE_NS}}]}

    prom = Prometheus([Target(llm.metrics_address, {"namespace": NS, "inferenceservice": NAME, "pod": f"{NAME}-0"}),
                       Target(plain.metrics_address, {"namespace": NS, "inferenceservice": PLAIN, "pod": f"{PLAIN}-0"})],
                      rule_groups=chart["groups"],
                      scrape_configs=[job(OPERATOR_JOB, operator.metrics_port), job(GATEWAY_JOB, gateway.metrics_port)])
    prom.start()
    saved = dict(operator.extra_env)
    operator.extra_env.update({"TRITON_OPERATOR_PROMETHEUS_URL": prom.url,
                               "TRITON_OPERATOR_AUTOSCALE_INTERVAL_SECONDS": "1",
                               "TRITON_OPERATOR_GATEWAY_URL": gateway.url,
                               # one Triton speaks for every simulated replica of smol
                               "TRITON_OPERATOR_REPORTING_QUERY":
                                   'count by ($namespace, $service) (triton_llm_active_requests{$service!=""}) * 1000'})
    operator.stop()
    operator.start()
    c = operator.cluster
    try:
        c.apply([
            *model_cache(NS, "10Gi"),
            isvc(NAME, model={"source": "hf://HuggingFaceTB/SmolLM2-135M-Instruct", "format": "tensorrt-llm",
                              "precision": "bf16"}, gpu={"class": "l4"},
                 autoscaling={"minReplicas": 1, "maxReplicas": 2, "targetQueueDepth": 4, "targetP99LatencyMs": 50}),
            isvc(PLAIN, model={"source": "hf://org/resnet", "format": "onnx", "parameters": "1B"},
                 gpu={"class": "a100-80gb"}, replicas=1),
            isvc("nometrics", model={"source": "hf://org/model", "format": "onnx", "parameters": "1B"},
                 gpu={"class": "a100-80gb"}, autoscaling={"minReplicas": 1, "maxReplicas": 2}),
            isvc("big", model={"source": "hf://org/m", "format": "onnx", "parameters": "8B", "precision": "fp8"},
                 replicas=4, gpu={"class": "h100", "count": 8, "fallbackClasses": ["h200"],
                                  "spill": {"after": "5s", "returnAfter": "15s"}}),
            isvc("lost", model={"source": "hf://org/model", "format": "onnx", "parameters": "1B"}, gpu={"class": "x100"}),
        ])
        c.wait_ready(NAME, NS, timeout=120)
        # Held: smol is Ready but not routed (no EndpointSlice); then routed, unrouted, held again.
        hold_once(c, gateway, llm.http_port, 0)
        prom.wait_for(f'triton_gateway_hold_seconds_count{{inferenceservice="{NAME}"}}', lambda v: v and v[0][1] == 1,
                      timeout=30)
        route(c, llm.http_port, False)
        hold_once(c, gateway, llm.http_port, 100)
        infer(plain, 3)
        threads = [threading.Thread(target=ask, args=(gateway, i, i % 2 == 0)) for i in range(1, 7)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        with pytest.raises(openai.AuthenticationError):
            client(gateway, "sk-wrong-" + secrets.token_urlsafe(32)).models.list()
        wait_for("big spilled and short", lambda: (d := c.condition("infsvc", "big", NS, "Degraded"))
                 and d["reason"] == "GPUClassesFull", timeout=120)
        wait_for("nometrics without metrics", lambda: (m := c.condition("infsvc", "nometrics", NS, "MetricsAvailable"))
                 and m["status"] == "False", timeout=60)
        yield prom
    finally:
        c.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        c.kubectl("delete", "pv", f"models-{NS}", "--wait=false", check=False)
        operator.extra_env.clear()
        operator.extra_env.update(saved)
        operator.stop()
        operator.start()
        prom.close()


def substitute(expr: str, namespace: str, service: str | None) -> str:
    out = expr
    for name, value in GRAFANA.items():
        out = out.replace(name, value)
    out = out.replace("$namespace", namespace)
    if service is not None:
        out = out.replace("$service", service)
    assert "$" not in out.replace("$labels", "").replace("$value", ""), f"a variable left in {out}"
    return out


def queries(chart) -> dict[tuple[str, str, str], list[str]]:
    """(dashboard, panel title, refId) -> the target's PromQL with the variables substituted: once
    for the fleet (all namespaces), once per service of SERVICES for the service dashboard."""
    out: dict[tuple[str, str, str], list[str]] = {}
    for stem, dashboard in chart["dashboards"].items():
        for panel in dashboard["panels"]:
            for target in panel.get("targets") or []:
                key = (stem, panel["title"], target["refId"])
                assert key not in out, f"two panels titled {panel['title']!r} in {stem}"
                out[key] = [substitute(target["expr"], ".*", None)] if stem == "fleet" else [
                    substitute(target["expr"], NS, service) for service in SERVICES]
    return out


def finite(result: list[dict[str, Any]]) -> bool:
    return any(not math.isnan(float(r["value"][1])) for r in result)


def evaluate(prom: Prometheus, expr: str) -> list[dict[str, Any]] | str:
    try:
        return prom.query(expr)
    except PrometheusError as e:
        return f"error: {e}"


def test_every_dashboard_query_returns_real_data(scenario: Prometheus, chart, gateway: GatewayProcess,
                                                 plain: TritonServer):
    every = queries(chart)
    assert len(every) >= 60, len(every)
    assert set(MAY_BE_EMPTY) <= set(every), "a listed query no longer exists"
    # Rates over the traffic need some scrapes after it; poll until every query has data.
    missing: dict[tuple[str, str, str], str] = {}

    def all_answer() -> bool:
        missing.clear()
        for key, exprs in every.items():
            results = [(expr, evaluate(scenario, expr)) for expr in exprs]
            errors = [f"{expr}\n  {r}" for expr, r in results if isinstance(r, str)]
            if errors:
                missing[key] = "\n".join(errors)
            elif key not in MAY_BE_EMPTY and not any(finite(r) for _, r in results):
                missing[key] = "\n".join(f"{expr}\n  returned {r!r}" for expr, r in results)
        if missing:
            # Rates and Triton's summaries need traffic inside their windows, and a histogram's
            # first observations (those that create its series within one scrape) never show as
            # a rate: more of the same traffic, so that the next scrapes see an increase.
            ask(gateway, 90, True)
            infer(plain, 1)
        return not missing

    try:
        wait_for("every panel query to return data", all_answer, timeout=120, interval=3)
    except AssertionError:
        raise AssertionError("queries without data or failing:\n" + "\n".join(
            f"{k}: {v}" for k, v in missing.items())) from None
    # The control: the same check fails on a query whose metric does not exist.
    expr = every[("service", "Queue", "A")][0]
    assert "triton_llm_queued_requests" in expr and finite(scenario.query(expr))
    assert not finite(scenario.query(expr.replace("triton_llm_queued_requests", "triton_llm_queued_request")))
    print(f"{len(every)} panel queries evaluated ({sum(map(len, every.values()))} with the variables substituted), "
          f"{len(every) - len(MAY_BE_EMPTY)} with data; may be empty here: {sorted(MAY_BE_EMPTY)}")


def test_the_dashboards_variables_list_the_scenarios_namespace_and_services(scenario: Prometheus, chart):
    found: dict[str, list[str]] = {}
    for stem, dashboard in chart["dashboards"].items():
        for var in dashboard["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
            assert m, var["query"]
            match, label = substitute(m.group(1), NS, None), m.group(2)
            found[f"{stem}.{var['name']}"] = scenario.api(f"label/{label}/values", {"match[]": match})
    assert NS in found["fleet.namespace"] and NS in found["service.namespace"]
    assert {NAME, "nometrics", "big", "lost"} <= set(found["service.service"])


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (names followed by a selector or a range)."""
    return set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{\[]", expr)) - {"by", "on", "without", "ignoring"}


def test_every_rule_runs_and_the_alerts_see_the_scenario(scenario: Prometheus, chart):
    rules = [r for g in chart["groups"] for r in g["rules"]]
    alerts = {r["alert"]: r["expr"] for r in rules if "alert" in r}
    assert set(alerts) == set(FIRING) | set(QUIET)

    def seen() -> dict[str, Any]:
        return {name: evaluate(scenario, expr) for name, expr in alerts.items()}

    def as_expected(results: dict[str, Any]) -> bool:
        return all(not isinstance(r, str) for r in results.values()) and all(
            {x["metric"].get("inferenceservice") for x in results[a] if x["metric"].get("namespace") == NS} == want
            for a, want in FIRING.items())

    results = seen()
    try:
        results = wait_for("the alerts to see the scenario", lambda: as_expected(r := seen()) and r,
                           timeout=120, interval=3)
    except AssertionError:
        raise AssertionError(f"alert expressions returned: {json.dumps(seen(), indent=1)[:6000]}") from None
    for name in QUIET:
        assert results[name] == [], (name, QUIET[name], results[name])
        for metric in metric_names(alerts[name]):
            assert scenario.query(f"count({metric})"), f"{name} reads {metric}, which has no series"
    # The recording rules: smol's error ratio in every window, far over any budget (a CPU answer
    # takes longer than 50 ms), and no other service of the scenario has an SLO.
    for r in (r for r in rules if "record" in r):
        got = {x["metric"]["inferenceservice"]: float(x["value"][1]) for x in scenario.query(r["expr"])
               if x["metric"].get("namespace") == NS}
        assert set(got) == {NAME} and got[NAME] > 0.5, (r["record"], got)
    # Prometheus evaluated every rule itself without an error.
    health = [(rule["name"], rule["health"], rule.get("lastError", "")) for g in scenario.api("rules")["groups"]
              for rule in g["rules"]]
    assert len(health) == len(rules) and all(h == "ok" for _, h, _ in health), health


def test_the_down_alerts_see_the_outage(scenario: Prometheus, chart, operator: Operator, gateway: GatewayProcess):
    alerts = {r["alert"]: r["expr"] for g in chart["groups"] for r in g["rules"] if "alert" in r}
    gateway.stop()
    down = wait_for("TritonGatewayDown's expression", lambda: scenario.query(alerts["TritonGatewayDown"]), timeout=30)
    assert down[0]["metric"] == {"job": GATEWAY_JOB, "namespace": RELEASE_NS}
    assert scenario.query(alerts["TritonOperatorDown"]) == []
    operator.stop()
    try:
        down = wait_for("TritonOperatorDown's expression", lambda: scenario.query(alerts["TritonOperatorDown"]),
                        timeout=30)
        assert down[0]["metric"] == {"job": OPERATOR_JOB, "namespace": RELEASE_NS}
    finally:
        operator.start()
