"""The chart's Grafana dashboards and PrometheusRule as the real helm renders them (no cluster):
the ConfigMaps carry the sidecar's label and valid dashboards with unique panel ids, the rule
passes `promtool check rules`, and `promtool test rules` runs e2e/alerts/*.test.yaml, which make
every alert fire and stay quiet. helm comes from hack/install-tools.sh, promtool from Debian's
prometheus package (hack/install-prometheus.sh); e2e/test_dashboards.py evaluates the same queries
against a real Prometheus scraping the real operator, gateway and Triton.

Run: .venv/bin/python -m pytest e2e/test_alerts.py -q
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cluster import ROOT
from .harness.prometheus import ensure_prometheus

CHART = ROOT / "charts" / "triton-operator"
TESTS = sorted((ROOT / "e2e" / "alerts").glob("*.test.yaml"))
KUBE_VERSION = "1.36.0"
SERVICE_ALERTS = {"TritonServiceLatencyBudgetBurnFast", "TritonServiceLatencyBudgetBurnSlow",
                  "TritonServiceMetricsUnavailable", "TritonServiceGPUClassFull", "TritonServiceSpilledOver",
                  "TritonServicePreparationFailed"}
COMPONENT_ALERTS = {"TritonOperatorDown", "TritonOperatorNoLeader", "TritonGatewayDown", "TritonGatewayKeyFilesUnusable"}


@pytest.fixture(scope="module")
def helm() -> str:
    bin_dir = subprocess.run([ROOT / "hack" / "install-tools.sh"], check=True, capture_output=True,
                             text=True).stdout.strip()
    return f"{bin_dir}/helm"


@pytest.fixture(scope="module")
def promtool() -> str:
    path = Path(ensure_prometheus()).parent / "promtool"
    assert path.is_file(), f"hack/install-prometheus.sh left no promtool beside {ensure_prometheus()}"
    return str(path)


def render(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([helm, "template", "triton-operator", str(CHART), "-n", "triton-system",
                          "--kube-version", KUBE_VERSION, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def docs(helm: str, *args: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(render(helm, *args).stdout) if d]


def rule_groups(helm: str, *args: str) -> list[dict[str, Any]]:
    (rule,) = [d for d in docs(helm, "--set", "alerts.enabled=true", *args) if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    return rule["spec"]["groups"]


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels") or [])
    return out


def test_the_operators_servicemonitor_keeps_the_service_labels(helm):
    """The per-service series (triton_operator_service_*) carry namespace and inferenceservice:
    honorLabels keeps them instead of renaming them exported_namespace."""
    (monitor,) = [d for d in docs(helm, "--set", "metrics.serviceMonitor.enabled=true") if d["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True


def test_both_are_off_by_default(helm):
    rendered = docs(helm, "--set", "gateway.enabled=true")
    assert not [d for d in rendered if d["kind"] == "PrometheusRule"]
    assert not [d for d in rendered if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]]


def test_dashboard_configmaps_for_the_sidecar_hold_valid_dashboards_with_unique_panel_ids(helm):
    rendered = docs(helm, "--set", "dashboards.enabled=true", "--set-json", 'dashboards.annotations={"grafana_folder":"Inference"}')
    maps = {d["metadata"]["name"]: d for d in rendered if d["kind"] == "ConfigMap"
            and d["metadata"]["labels"].get("grafana_dashboard") == "1"}
    assert set(maps) == {"triton-operator-dashboard-fleet", "triton-operator-dashboard-service"}
    uids = set()
    for name, cm in maps.items():
        assert cm["metadata"]["namespace"] == "triton-system"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Inference"}
        ((key, text),) = cm["data"].items()
        stem = name.rsplit("-", 1)[1]
        assert key == f"triton-operator-{stem}.json"
        dashboard = json.loads(text)
        assert dashboard == json.loads((CHART / "dashboards" / f"{stem}.json").read_text()), "the file, unchanged"
        uids.add(dashboard["uid"])
        ids = [p["id"] for p in panels(dashboard)]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        for p in panels(dashboard):
            box = p["gridPos"]
            assert box["x"] + box["w"] <= 24 and box["h"] > 0, (name, p["title"])
            if p["type"] != "row":
                assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), (name, p["title"])
                refs = [t["refId"] for t in p["targets"]]
                assert len(refs) == len(set(refs)), (name, p["title"])
                assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        variables = [v["name"] for v in dashboard["templating"]["list"]]
        assert variables == (["datasource", "namespace", "service"] if stem == "service" else ["datasource", "namespace"])
    assert len(uids) == 2


def test_the_sidecar_label_and_namespace_are_settings(helm):
    rendered = docs(helm, "--set", "dashboards.enabled=true", "--set", "dashboards.label=my_dashboards",
                    "--set", "dashboards.labelValue=yes", "--set", "dashboards.namespace=monitoring")
    maps = [d for d in rendered if d["kind"] == "ConfigMap" and "my_dashboards" in d["metadata"]["labels"]]
    assert len(maps) == 2
    assert {(m["metadata"]["namespace"], m["metadata"]["labels"]["my_dashboards"]) for m in maps} == {("monitoring", "yes")}
    assert all("grafana_dashboard" not in m["metadata"]["labels"] for m in maps)


def test_the_prometheus_rule_passes_promtool_check(helm, promtool, tmp_path):
    groups = rule_groups(helm, "--set", "gateway.enabled=true")
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    assert alerts == SERVICE_ALERTS | COMPONENT_ALERTS
    records = [r["record"] for g in groups for r in g["rules"] if "record" in r]
    assert records == [f"inferenceservice:latency_slo_errors:ratio_rate{w}" for w in ("5m", "30m", "1h", "6h")]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(records) + len(alerts)} rules found" in out.stdout, out.stdout
    # By default each service's own attainment sets its error budget.
    fast = next(r for g in groups for r in g["rules"] if r.get("alert") == "TritonServiceLatencyBudgetBurnFast")
    assert ("ratio_rate1h > on (namespace, inferenceservice) (14.4 * (1 - max by (namespace, inferenceservice) "
            "(triton_operator_service_slo_objective)))") in fast["expr"]
    # Without the gateway there is no gateway alert; an objective set here is every service's.
    groups = rule_groups(helm, "--set-json", "alerts.latencySLO.objective=0.999")
    alerts = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    assert set(alerts) == SERVICE_ALERTS | COMPONENT_ALERTS - {"TritonGatewayDown", "TritonGatewayKeyFilesUnusable"}
    assert "ratio_rate1h > 0.0144" in alerts["TritonServiceLatencyBudgetBurnFast"]["expr"]
    assert "ratio_rate6h > 0.006" in alerts["TritonServiceLatencyBudgetBurnSlow"]["expr"]


def test_the_default_slo_buckets_list_every_bound_the_histograms_write():
    """A bound the engine or the gateway writes but the chart leaves out would count the requests
    between it and the next lower listed bound as missing the target: at a 4 s target, the LLM
    engine's requests within (2.5, 4] s."""
    from triton_operator.gateway.telemetry import LATENCY_BUCKETS
    from triton_runtime.serving.contract import DURATION_BUCKETS

    listed = yaml.safe_load((CHART / "values.yaml").read_text())["alerts"]["latencySLO"]["buckets"]
    assert listed == sorted(listed)
    assert sorted(set(DURATION_BUCKETS) | set(LATENCY_BUCKETS)) == listed


def test_bad_alert_settings_are_refused_with_the_field_named(helm):
    out = render(helm, "--set", "alerts.enabled=true", "--set-json", "alerts.latencySLO.objective=1.5", check=False)
    assert out.returncode != 0 and "objective" in out.stderr, out.stderr
    out = render(helm, "--set", "alerts.enabled=true", "--set", "alerts.for.classFull=ten", check=False)
    assert out.returncode != 0 and "classFull" in out.stderr, out.stderr


def test_promtool_unit_tests_make_every_alert_fire_and_stay_quiet(helm, promtool, tmp_path):
    groups = rule_groups(helm, "--set", "gateway.enabled=true")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    for test in TESTS:
        shutil.copy(test, tmp_path / test.name)
    out = subprocess.run([promtool, "test", "rules", *(t.name for t in TESTS)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(TESTS), out.stdout
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in TESTS:
        for case in yaml.safe_load(test.read_text())["tests"]:
            for check in case.get("alert_rule_test") or []:
                (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    every = SERVICE_ALERTS | COMPONENT_ALERTS
    assert firing == every, f"never seen firing: {sorted(every - firing)}"
    assert quiet == every, f"never seen quiet: {sorted(every - quiet)}"
