"""The Helm chart: lint, template, schema, security scan, and install/upgrade/uninstall on a real
API server; the Argo CD health script against status the real operator wrote."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from triton_operator import crdgen

from .cluster import ROOT, Cluster, Operator, wait_for
from .conftest import CLUSTER_NAME

CHART = ROOT / "charts" / "triton-operator"
SCENARIOS = sorted((CHART / "ci").glob("*.yaml"))
KUBE_VERSION = "1.36.0"


@pytest.fixture(scope="module")
def tools() -> str:
    return subprocess.run([ROOT / "hack" / "install-tools.sh"], check=True, capture_output=True,
                          text=True).stdout.strip()


def helm(tools: str, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([f"{tools}/helm", *args], capture_output=True, text=True, env=env, timeout=300)
    if check and out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}: {out.stderr}")
    return out


def template(tools: str, *args: str) -> list[dict]:
    out = helm(tools, "template", "triton-operator", str(CHART), "-n", "triton-system",
               "--kube-version", KUBE_VERSION, *args)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.parametrize("values", SCENARIOS, ids=lambda p: p.stem)
def test_lint_and_template_every_scenario(tools, values):
    helm(tools, "lint", "--strict", str(CHART), "-f", str(values), "--kube-version", KUBE_VERSION)
    docs = template(tools, "-f", str(values))
    for doc in docs:
        if doc["kind"] in ("CustomResourceDefinition", "ServiceMonitor", "PodMonitor", "PrometheusRule", "HTTPRoute"):
            continue  # not in the built-in schemas
        kubernetes_validate.validate(doc, "1.34", strict=True)
    for dep in (d for d in docs if d["kind"] == "Deployment"):  # the operator's, and the gateway's
        pod = dep["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] in ("/healthz", "/readyz")
        assert container["resources"]["requests"]


@pytest.mark.parametrize("args", [(), ("--set", "networkPolicy.enabled=false"),
                                  *(("-f", str(v)) for v in SCENARIOS)], ids=lambda a: "-".join(a) or "defaults")
def test_every_rendered_pod_starts_on_its_own_settings(tools, args):
    """What the chart sets is what the operator and the gateway read at start: with the gateway off
    and no other Triton client (the defaults), the chart wrote the NetworkPolicy's clients as null,
    and the operator exited at start (a crash loop on a default install). The gateway reads its key
    files as its own group (fsGroup: mounted 0440, they stayed root's, and every request was 503)."""
    from triton_operator import settings
    from triton_operator.gateway import config

    for dep in (d for d in template(tools, *args) if d["kind"] == "Deployment"):
        pod = dep["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value", "") for e in pod["containers"][0].get("env", []) if "value" in e}
        if dep["metadata"]["name"].endswith("-gateway"):
            config.from_env(env)
            mounted = [v for v in pod["volumes"] if "secret" in v]
            assert all(pod["securityContext"].get("fsGroup") == pod["securityContext"]["runAsGroup"]
                       for _ in mounted)
        else:
            settings.from_env(env)


def test_chart_crds_are_the_generated_crds(tools):
    docs = {d["metadata"]["name"]: d for d in template(tools) if d["kind"] == "CustomResourceDefinition"}
    for crd in crdgen.all_crds().values():
        got = docs[crd["metadata"]["name"]]
        assert got["spec"] == crd["spec"]
        assert got["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    for path in (CHART / "files" / "crds").glob("*.yaml"):
        assert path.read_text() == (ROOT / "crds" / path.name).read_text(), "run make crds"
    assert not [d for d in template(tools, "--set", "crds.enabled=false") if d["kind"] == "CustomResourceDefinition"]
    kept = [d for d in template(tools, "--set", "crds.keep=false") if d["kind"] == "CustomResourceDefinition"]
    assert {d["metadata"]["name"] for d in kept} == {c["metadata"]["name"] for c in crdgen.all_crds().values()}
    assert all("annotations" not in d["metadata"] for d in kept)


def _catalog(docs: list[dict]) -> dict[str, dict]:
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-gpuclasses"))
    return {d["metadata"]["name"]: d["spec"] for d in yaml.safe_load_all(cm["data"]["gpuclasses.yaml"]) if d}


def test_default_catalog_is_the_example_catalog(tools):
    examples = {d["metadata"]["name"]: d["spec"]
                for d in yaml.safe_load_all((ROOT / "examples" / "gpuclasses.yaml").read_text()) if d}
    assert _catalog(template(tools)) == examples


def test_catalog_classes_can_be_switched_off_and_overridden(tools):
    docs = template(tools, "--set", "gpuClasses.l4.enabled=false", "--set-json", "gpuClasses.h100.pricePerHour=2.9",
                    "--set-json", 'gpuClasses.h100.productNames=["NVIDIA-H100-80GB-HBM3"]')
    catalog = _catalog(docs)
    assert "l4" not in catalog and catalog["h100"]["pricePerHour"] == 2.9
    assert catalog["h100"]["productNames"] == ["NVIDIA-H100-80GB-HBM3"]
    default = next(d for d in template(tools) if d["kind"] == "Deployment")
    changed = next(d for d in docs if d["kind"] == "Deployment")
    key = "checksum/gpuclasses"
    assert default["spec"]["template"]["metadata"]["annotations"][key] != \
        changed["spec"]["template"]["metadata"]["annotations"][key], "a catalog change rolls the operator"


def test_gpu_class_label_presets_match_the_clouds_node_labels(tools):
    """gfd keeps GPU Feature Discovery's nvidia.com/gpu.product; gke and eks swap each class's
    label and values for the cloud's own, except where a class sets its productLabel."""
    assert _catalog(template(tools, "--set", "gpuClassLabels=gfd")) == _catalog(template(tools))
    gke = _catalog(template(tools, "--set", "gpuClassLabels=gke"))
    assert gke["h100"]["productLabel"] == "cloud.google.com/gke-accelerator"
    assert gke["h100"]["productNames"] == ["nvidia-h100-80gb", "nvidia-h100-mega-80gb"]
    assert gke["l4"]["productNames"] == ["nvidia-l4"] and gke["h100"]["memoryGiB"] == 80
    eks = _catalog(template(tools, "--set", "gpuClassLabels=eks"))
    assert eks["b200"] == {**_catalog(template(tools))["b200"], "productLabel": "node.kubernetes.io/instance-type",
                           "productNames": ["p6-b200.48xlarge"]}
    assert "productLabel" not in eks["gb200"], "no EKS instance type is known for gb200: it keeps GFD's label"
    own = _catalog(template(tools, "--set", "gpuClassLabels=gke", "--set", "gpuClasses.l4.productLabel=example.com/gpu",
                            "--set-json", 'gpuClasses.l4.productNames=["l4"]'))
    assert (own["l4"]["productLabel"], own["l4"]["productNames"]) == ("example.com/gpu", ["l4"])


@pytest.mark.parametrize("args, words", [
    (["--set", "unknownKey=1"], "additional properties 'unknownKey' not allowed"),
    (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
    (["--set", "gpuClasses.h100.memoryGiB=-1"], "/gpuClasses/h100/memoryGiB"),
    (["--set", "gpuClasses.h100.typo=1"], "additional properties 'typo' not allowed"),
    (["--set", "replicaCount=2", "--set", "leaderElection.enabled=false"], "needs leaderElection.enabled=true"),
    (["--set", "prometheus.url=prometheus:9090"], "/prometheus/url"),
    (["--set", "gateway.typo=1"], "additional properties 'typo' not allowed"),
    (["--set", "gateway.httpRoute.enabled=true"], "/gateway/httpRoute/parentRefs"),
    (["--set", "gateway.url=llm.example.com"], "/gateway/url"),
    (["--set", "gpuClassLabels=aks"], "/gpuClassLabels"),
    # an empty `from` admits every source: the metrics ports of every pod opened to all
    (["--set-json", "networkPolicy.prometheus=[]"], "/networkPolicy/prometheus"),
    (["--set-json", "networkPolicy.prometheus=[{}]"], "/networkPolicy/prometheus/0"),
    # the gateway parses these at start: a bad one was a crash loop; all addresses would trust any
    # client's X-Forwarded-For, and every per-address limit with it
    (["--set-json", 'gateway.trustedProxies=["not-a-cidr"]'], "/gateway/trustedProxies/0"),
    (["--set-json", 'gateway.trustedProxies=["0.0.0.0/0"]'], "/gateway/trustedProxies/0"),
    # a Service field the API server ignores or refuses for the type: said here, not at apply
    (["--set", "gateway.enabled=true", "--set-json", 'gateway.service.loadBalancerSourceRanges=["10.0.0.0/8"]'],
     "gateway.service.loadBalancerSourceRanges needs gateway.service.type LoadBalancer"),
    (["--set", "gateway.enabled=true", "--set", "gateway.service.externalTrafficPolicy=Local"],
     "gateway.service.externalTrafficPolicy needs gateway.service.type LoadBalancer or NodePort"),
    (["--set-json", 'gateway.service.loadBalancerSourceRanges=["10.0.0.1"]'],
     "/gateway/service/loadBalancerSourceRanges/0"),
    (["--set", "gateway.service.externalTrafficPolicy=local"], "/gateway/service/externalTrafficPolicy"),
])
def test_bad_values_are_refused_with_a_reason(tools, args, words):
    out = helm(tools, "template", "x", str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
    assert out.returncode != 0 and words in out.stderr, out.stderr


def test_gateway_is_off_by_default_and_complete_when_on(tools):
    assert not [d for d in template(tools) if "gateway" in d["metadata"]["name"]]
    docs = template(tools, "-f", str(CHART / "ci" / "gateway-values.yaml"))
    by_kind = {}
    for d in docs:
        if "gateway" in d["metadata"]["name"]:
            by_kind.setdefault(d["kind"], []).append(d)
    assert set(by_kind) == {"ServiceAccount", "Role", "RoleBinding", "Service", "Deployment", "HTTPRoute", "Ingress",
                            "ServiceMonitor", "NetworkPolicy", "PodDisruptionBudget"}
    (pdb,) = by_kind["PodDisruptionBudget"]   # two gateways by default: a drain takes one at a time
    assert pdb["spec"]["maxUnavailable"] == 1
    (gateway,) = by_kind["Deployment"]
    assert pdb["spec"]["selector"]["matchLabels"] == gateway["spec"]["selector"]["matchLabels"]
    assert gateway["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    # the API on one Service, the metrics (every tenant's service names) on another, which the
    # HTTPRoute and Ingress never point at; only Prometheus may reach the metrics port
    api, metrics = sorted(by_kind["Service"], key=lambda s: s["metadata"]["name"])
    assert [p["name"] for p in api["spec"]["ports"]] == ["http"]
    assert [p["name"] for p in metrics["spec"]["ports"]] == ["metrics"]
    assert {b["name"] for r in by_kind["HTTPRoute"] for rule in r["spec"]["rules"] for b in rule["backendRefs"]} == \
        {api["metadata"]["name"]}
    [policy] = by_kind["NetworkPolicy"]
    http, scrape = policy["spec"]["ingress"]
    assert http == {"ports": [{"port": "http", "protocol": "TCP"}]} and scrape["ports"] == [{"port": "metrics",
                                                                                              "protocol": "TCP"}]
    assert {r["metadata"]["namespace"] for r in by_kind["Role"]} == {"ml", "vision"}
    for role in by_kind["Role"]:
        assert role["rules"] == [
            {"apiGroups": ["serving.triton-operator.io"], "resources": ["inferenceservices"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]
    pod = by_kind["Deployment"][0]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][:3] == ["gateway", "--port=8080", "--metrics-port=9090"]
    assert "--key-file=/etc/triton-gateway/keys/team-a-keys/keys.yaml" in container["args"]
    assert {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v} == {"team-a-keys", "ci-keys"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRITON_GATEWAY_NAMESPACES"] == "ml,vision"
    assert pod["terminationGracePeriodSeconds"] > int(env["TRITON_GATEWAY_SHUTDOWN_TIMEOUT_SECONDS"])
    assert by_kind["ServiceMonitor"][0]["spec"]["endpoints"][0]["honorLabels"] is True
    assert by_kind["HTTPRoute"][0]["spec"]["hostnames"] == ["llm.example.com"]
    operator = next(d for d in docs if d["kind"] == "Deployment" and "gateway" not in d["metadata"]["name"])
    op_env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert op_env["TRITON_OPERATOR_GATEWAY_URL"] == "https://llm.example.com"
    default_url = template(tools, "--set", "gateway.enabled=true")
    op_env = {e["name"]: e.get("value") for d in default_url if d["kind"] == "Deployment" and d["metadata"]["name"] ==
              "triton-operator" for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert op_env["TRITON_OPERATOR_GATEWAY_URL"] == "http://triton-operator-gateway.triton-system.svc.cluster.local:80"


def test_the_gateways_service_exposed_by_a_load_balancer(tools):
    """Its own load balancer: the admitted client ranges, the cloud's annotations, and Local so the
    failed-key limit per client address sees clients, not nodes. By default none of them is set."""
    def api_service(*args: str) -> dict:
        return next(d for d in template(tools, "--set", "gateway.enabled=true", *args)
                    if d["kind"] == "Service" and d["metadata"]["name"] == "triton-operator-gateway")

    plain = api_service()
    assert plain["spec"]["type"] == "ClusterIP" and "annotations" not in plain["metadata"]
    assert not {"loadBalancerSourceRanges", "externalTrafficPolicy"} & set(plain["spec"])
    exposed = api_service("--set", "gateway.service.type=LoadBalancer",
                          "--set-json", 'gateway.service.loadBalancerSourceRanges=["203.0.113.0/24","2001:db8::/32"]',
                          "--set", "gateway.service.externalTrafficPolicy=Local",
                          "--set-json", 'gateway.service.annotations={"service.beta.kubernetes.io/aws-load-balancer-scheme":"internet-facing"}')
    assert exposed["spec"]["type"] == "LoadBalancer"
    assert exposed["spec"]["loadBalancerSourceRanges"] == ["203.0.113.0/24", "2001:db8::/32"]
    assert exposed["spec"]["externalTrafficPolicy"] == "Local"
    assert exposed["metadata"]["annotations"] == {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internet-facing"}
    node_port = api_service("--set", "gateway.service.type=NodePort", "--set", "gateway.service.externalTrafficPolicy=Local")
    assert node_port["spec"]["externalTrafficPolicy"] == "Local"


def _rules(docs: list[dict]) -> list[dict]:
    return [r for d in docs if d["kind"] in ("ClusterRole", "Role") for r in d["rules"]]


@pytest.mark.parametrize("values", SCENARIOS, ids=lambda p: p.stem)
def test_rbac_has_no_wildcards_and_never_reads_secrets(tools, values):
    """Secrets: created only (a multi-node service's SSH key pair), never read, listed or changed."""
    rules = _rules(template(tools, "-f", str(values)))
    assert rules
    for rule in rules:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key], rule
        if "secrets" in rule["resources"]:
            assert rule["resources"] == ["secrets"] and rule["verbs"] == ["create"], rule
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule


def test_watched_namespaces_get_roles_not_cluster_access(tools):
    docs = template(tools, "--set-json", 'watchNamespaces=["ml","vision"]')
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    cluster_resources = {r for rule in cluster_role["rules"] for r in rule["resources"]}
    # The cluster-scoped catalog (kopf watches no CRDs now), and nodes and pods cluster-wide, read
    # only: the free GPUs per class that spill-over needs.
    assert cluster_resources == {"gpuclasses", "nodes", "pods"}
    assert all(rule["verbs"] == ["list", "watch"] for rule in cluster_role["rules"]
               if set(rule["resources"]) & {"nodes", "pods"})
    blind = template(tools, "--set-json", 'watchNamespaces=["ml","vision"]', "--set", "gpuCapacity.watch=false")
    cluster_role = next(d for d in blind if d["kind"] == "ClusterRole")
    assert {r for rule in cluster_role["rules"] for r in rule["resources"]} == {"gpuclasses"}
    roles = {d["metadata"]["namespace"] for d in docs if d["kind"] == "Role"
             if "deployments" in {r for rule in d["rules"] for r in rule["resources"]}}
    assert roles == {"ml", "vision"}
    env = {e["name"]: e.get("value") for e in next(d for d in docs if d["kind"] == "Deployment")
           ["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TRITON_OPERATOR_NAMESPACES"] == "ml,vision"


def test_security_scan_of_chart_and_rendered_manifests(tools, tmp_path):
    """checkov (offline) over every chart scenario and everything the operator renders for the
    examples; the justified exceptions are listed in .checkov.yaml."""
    checkov = subprocess.run([ROOT / "hack" / "install-checkov.sh"], check=True, capture_output=True,
                             text=True).stdout.strip()
    for values in SCENARIOS:
        out = helm(tools, "template", "triton-operator", str(CHART), "-n", "triton-system",
                   "--kube-version", KUBE_VERSION, "-f", str(values))
        (tmp_path / f"chart-{values.stem}.yaml").write_text(out.stdout)
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        out = subprocess.run([sys.executable, "-m", "triton_operator", "render", "-f", str(example)],
                             capture_output=True, text=True, check=True)
        (tmp_path / f"rendered-{example.stem}.yaml").write_text(out.stdout)
    scan = subprocess.run([checkov, "-d", str(tmp_path), "--config-file", str(ROOT / ".checkov.yaml"),
                           "-o", "json"], capture_output=True, text=True, timeout=600)
    report = json.loads(scan.stdout)
    summary = report["summary"] if isinstance(report, dict) else report[0]["summary"]
    failed = report["results"]["failed_checks"] if isinstance(report, dict) else report[0]["results"]["failed_checks"]
    print(f"checkov: {summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped")
    assert summary["passed"] > 100
    assert not failed, [(f["check_id"], f["resource"]) for f in failed]


def test_install_upgrade_uninstall(tools, tmp_path):
    """A cluster of its own, so uninstalling cannot disturb the rest of the suite (named after the
    suite's cluster, so that two suites running side by side do not share it)."""
    name = f"{CLUSTER_NAME}-chart"
    up = subprocess.run([ROOT / "hack" / "cluster.sh", "up", name], capture_output=True, text=True)
    assert up.returncode == 0, up.stderr[-2000:]
    c = Cluster(kubeconfig=up.stdout.strip().splitlines()[-1], bin_dir=tools)
    try:
        out = helm(tools, "install", "triton-operator", str(CHART), "-n", "triton-system", "--create-namespace",
                   "--wait", "--timeout", "120s", env=c.env)
        assert "kubectl get gpuclass" in out.stdout  # NOTES tell the user what to do next
        assert c.get("deployment", "triton-operator", "triton-system")["status"]["readyReplicas"] == 1
        assert c.get("crd", "inferenceservices.serving.triton-operator.io")
        helm(tools, "upgrade", "triton-operator", str(CHART), "-n", "triton-system", "--reuse-values",
             "--set", "gpuClasses.l4.enabled=false", "--set", "replicaCount=2", "--wait", "--timeout", "120s",
             env=c.env)
        cm = c.get("configmap", "triton-operator-gpuclasses", "triton-system")
        assert "name: l4" not in cm["data"]["gpuclasses.yaml"] and "name: h100" in cm["data"]["gpuclasses.yaml"]
        assert c.get("deployment", "triton-operator", "triton-system")["spec"]["replicas"] == 2
        assert helm(tools, "history", "triton-operator", "-n", "triton-system", env=c.env).stdout.count("\n") == 3
        c.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
        c.apply(yaml.safe_load((ROOT / "examples" / "llama3-70b.yaml").read_text()))
        helm(tools, "uninstall", "triton-operator", "-n", "triton-system", "--wait", env=c.env)
        assert c.get("deployment", "triton-operator", "triton-system") is None
        assert c.get("clusterrole", "triton-operator") is None
        # crds.keep: the CRDs, and so the users' InferenceServices, survive an uninstall.
        assert c.get("crd", "inferenceservices.serving.triton-operator.io") is not None
        assert c.get("infsvc", "llama3-70b", "ml") is not None
    finally:
        subprocess.run([ROOT / "hack" / "cluster.sh", "down", name], capture_output=True)


def _lua_health(status_obj: dict) -> dict:
    import lupa
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    script = (ROOT / "docs" / "argocd-health.lua").read_text()
    fn = lua.eval("function(obj) " + script + " end")
    result = fn(_to_lua(lua, status_obj))
    return {"status": result["status"], "message": result["message"]}


def _to_lua(lua, value):
    if isinstance(value, dict):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    return value


def test_argocd_health_script_on_real_status(operator: Operator, ns: str):
    c = operator.cluster
    base = {"model": {"source": "hf://org/m", "format": "onnx"}, "gpu": {"class": "l4"}, "replicas": 1}
    c.apply({"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
             "metadata": {"name": "healthy", "namespace": ns}, "spec": base})
    c.apply({"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
             "metadata": {"name": "broken", "namespace": ns}, "spec": {**base, "gpu": {"class": "nope"}}})
    healthy = wait_for("Healthy", lambda: (h := _lua_health(c.get("infsvc", "healthy", ns)))["status"] == "Healthy" and h)
    assert "1/1 replicas ready" in healthy["message"]
    broken = wait_for("Degraded", lambda: (h := _lua_health(c.get("infsvc", "broken", ns)))["status"] == "Degraded" and h)
    assert broken["message"].startswith("GPUClassNotFound: GPUClass nope does not exist")
    fresh = {"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
             "metadata": {"name": "x", "generation": 1}, "spec": base}
    assert _lua_health(fresh)["status"] == "Progressing"
    c.kubectl("scale", "infsvc", "healthy", "-n", ns, "--replicas=0")
    wait_for("Suspended", lambda: _lua_health(c.get("infsvc", "healthy", ns))["status"] == "Suspended")


def test_reapplying_after_status_is_written_shows_no_diff(operator: Operator, ns: str, tmp_path: Path):
    c = operator.cluster
    doc = {"apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "gitops", "namespace": ns},
           "spec": {"model": {"source": "hf://org/m", "format": "onnx"}, "gpu": {"class": "l4"}, "replicas": 1}}
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(doc))
    c.kubectl("apply", "--server-side", "--field-manager=argocd", "-f", str(path))
    c.wait_ready("gitops", ns, timeout=60)
    spec_before = c.get("infsvc", "gitops", ns)["spec"]
    diff = c.kubectl("diff", "--server-side", "--field-manager=argocd", "-f", str(path), check=False)
    assert diff.returncode == 0, diff.stdout  # 0: no differences
    c.kubectl("apply", "--server-side", "--field-manager=argocd", "-f", str(path))
    after = c.get("infsvc", "gitops", ns)
    assert after["spec"] == spec_before and after["metadata"]["generation"] == 1
    raw = json.loads(c.kubectl("get", "infsvc", "gitops", "-n", ns, "-o", "json", "--show-managed-fields").stdout)
    spec_managers = {f["manager"] for f in raw["metadata"]["managedFields"]
                     if "f:spec" in json.dumps(f.get("fieldsV1", {}))}
    assert spec_managers == {"argocd"}, "nobody but the user's GitOps tool owns spec fields"
    dep = json.loads(c.kubectl("get", "deployment", "gitops", "-n", ns, "-o", "json", "--show-managed-fields").stdout)
    appliers = {f["manager"] for f in dep["metadata"]["managedFields"] if f["operation"] == "Apply"}
    assert appliers == {"triton-operator"}


# -- helm test ---------------------------------------------------------------------------------------

def _hooks(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs
            if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"}


CRD_NAMES = sorted(c["metadata"]["name"] for c in crdgen.all_crds().values())


def test_helm_test_hook_renders_exactly(tools):
    """The `helm test` hook: its objects, the pod's exact command, and RBAC that reads only the
    chart's CRDs by name and lists pods in the release's namespace."""
    hooks = _hooks(template(tools, "-f", str(CHART / "ci" / "gateway-values.yaml")))
    name = "triton-operator-test"
    assert set(hooks) == {("ServiceAccount", name), ("ClusterRole", name), ("ClusterRoleBinding", name),
                          ("Role", name), ("RoleBinding", name), ("NetworkPolicy", f"{name}-op"),
                          ("NetworkPolicy", f"{name}-gw"), ("Pod", name)}
    for (kind, _), doc in hooks.items():
        weight = "-1" if kind != "Pod" else None
        assert doc["metadata"]["annotations"].get("helm.sh/hook-weight") == weight
        assert doc["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert hooks[("ClusterRole", name)]["rules"] == [{"apiGroups": ["apiextensions.k8s.io"],
                                                      "resources": ["customresourcedefinitions"],
                                                      "resourceNames": CRD_NAMES, "verbs": ["get"]}]
    assert hooks[("Role", name)]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    assert hooks[("Role", name)]["metadata"]["namespace"] == "triton-system"
    for binding in ("ClusterRoleBinding", "RoleBinding"):
        assert hooks[(binding, name)]["subjects"] == [{"kind": "ServiceAccount", "name": name,
                                                       "namespace": "triton-system"}]
    pod = hooks[("Pod", name)]
    spec = pod["spec"]
    [container] = spec["containers"]
    assert (spec["restartPolicy"], spec["serviceAccountName"]) == ("Never", name)
    assert container["image"] == "ghcr.io/triton-operator/triton-operator:0.1.0"
    assert container["args"] == [
        "check-install", *(f"--crd={c}" for c in CRD_NAMES), "--namespace=triton-system",
        "--operator-selector=app.kubernetes.io/name=triton-operator,app.kubernetes.io/instance=triton-operator",
        "--operator-port=8080", "--operator-path=/healthz",
        "--url=http://triton-operator-gateway-metrics.triton-system.svc.cluster.local:9090/healthz", "--wait=60"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True and spec["securityContext"]["runAsNonRoot"]
    # the pod is none of the operator's (its ReplicaSet would adopt it) and the policies let it in
    docs = template(tools, "-f", str(CHART / "ci" / "gateway-values.yaml"))
    operator = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "triton-operator")
    selector = operator["spec"]["selector"]["matchLabels"]
    assert not all(pod["metadata"]["labels"].get(k) == v for k, v in selector.items())
    for policy, port in ((f"{name}-op", "health"), (f"{name}-gw", "metrics")):
        [rule] = hooks[("NetworkPolicy", policy)]["spec"]["ingress"]
        assert rule == {"from": [{"podSelector": {"matchLabels": pod["metadata"]["labels"]}}],
                        "ports": [{"port": port, "protocol": "TCP"}]}
    # without the gateway, no gateway check; off, no hook at all
    plain = _hooks(template(tools))
    assert not [a for a in plain[("Pod", name)]["spec"]["containers"][0]["args"] if a.startswith("--url")]
    assert ("NetworkPolicy", f"{name}-gw") not in plain
    assert not _hooks(template(tools, "--set", "helmTest.enabled=false"))


def test_tracing_values_set_the_gateways_otel_variables(tools):
    def gateway_env(*args: str) -> dict[str, str]:
        docs = template(tools, "--set", "gateway.enabled=true", *args)
        dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "triton-operator-gateway")
        return {e["name"]: e.get("value", e.get("valueFrom")) for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}

    assert not [n for n in gateway_env() if n.startswith("OTEL_")]
    env = gateway_env("--set", "tracing.enabled=true", "--set", "tracing.endpoint=http://otel.monitoring:4318",
                      "--set", "tracing.sampler=parentbased_traceidratio", "--set", "tracing.samplerArg=0.1")
    assert {n: v for n, v in env.items() if n.startswith("OTEL_")} == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel.monitoring:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "triton-gateway", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1", "OTEL_K8S_POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
        "OTEL_RESOURCE_ATTRIBUTES": "k8s.namespace.name=triton-system,k8s.pod.name=$(OTEL_K8S_POD_NAME)"}
    # what the chart sets is what the gateway accepts
    from triton_operator.gateway import tracing
    on = tracing.from_env({n: v for n, v in env.items() if isinstance(v, str)})
    assert isinstance(on, tracing.On)
    on.shutdown()
    for args, words in ((["--set", "tracing.enabled=true"], "/tracing/endpoint"),
                        (["--set", "tracing.endpoint=otel:4318"], "/tracing/endpoint"),
                        (["--set", "tracing.sampler=sometimes"], "/tracing/sampler")):
        out = helm(tools, "template", "x", str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
        assert out.returncode != 0 and words in out.stderr, out.stderr


def test_helm_test_checks_against_the_cluster_as_the_test_pod(tools, operator: Operator, tmp_path: Path):
    """`helm test` cannot run here: kwok simulates pods and never runs a container, so the test pod
    would stay Running and never complete. Instead the hook's objects are applied from the chart,
    and the pod's exact command (its args from the rendered manifest) runs from this process with
    a token of the hook's ServiceAccount, so every API read goes through the hook's RBAC. The
    operator's pod and the gateway are simulated too; --resolve sends the checks for the operator
    pod's IP to the operator process of this suite and for the gateway's metrics Service to a
    gateway process."""
    from .conftest import GATEWAY_SERVICE_ACCOUNT, RELEASE_NS, service_account_kubeconfig
    from .harness.gateway import GatewayProcess

    c = operator.cluster
    hooks = _hooks(template(tools, "--set", "gateway.enabled=true"))   # the release the suite installed
    name = "triton-operator-test"
    c.apply([d for (kind, _), d in hooks.items() if kind != "Pod"])
    args = hooks[("Pod", name)]["spec"]["containers"][0]["args"]
    kubeconfig = service_account_kubeconfig(c, tmp_path, name)
    keys = tmp_path / "keys.yaml"
    keys.write_text(json.dumps({"keys": [{"name": "probe", "key": "sk-" + secrets.token_urlsafe(32),
                                          "namespaces": [RELEASE_NS]}]}))
    gw = GatewayProcess(service_account_kubeconfig(c, tmp_path, GATEWAY_SERVICE_ACCOUNT), keys, tmp_path, RELEASE_NS)
    gw.start()
    try:
        pods = json.loads(c.kubectl("get", "pods", "-n", RELEASE_NS, "-l",
                                    "app.kubernetes.io/name=triton-operator,app.kubernetes.io/instance=triton-operator",
                                    "-o", "json").stdout)["items"]
        assert pods and all(p["status"].get("podIP") for p in pods)
        resolve = [f"--resolve={p['status']['podIP']}=127.0.0.1:{operator.port}" for p in pods]
        gateway_host = "triton-operator-gateway-metrics.triton-system.svc.cluster.local"

        def check(*extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "triton_operator", *args, "--kubeconfig", kubeconfig,
                                   *resolve, *extra], capture_output=True, text=True, timeout=120)

        out = check(f"--resolve={gateway_host}=127.0.0.1:{gw.metrics_port}")
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.splitlines() == [
            *(f"ok: CRD {n}: Established" for n in CRD_NAMES),
            *(f"ok: operator pod {p['metadata']['name']} /healthz: HTTP 200" for p in pods),
            f"ok: http://{gateway_host}:9090/healthz: HTTP 200"]
        # a gateway that does not answer fails the test, in one line
        gw.stop()
        out = check(f"--resolve={gateway_host}=127.0.0.1:{gw.metrics_port}", "--wait=0")
        assert out.returncode == 1
        assert out.stdout.splitlines()[-1].startswith(f"FAILED: http://{gateway_host}:9090/healthz: no answer")
        # the hook's account reads nothing but the chart's CRDs by name and pods in its namespace
        out = subprocess.run([sys.executable, "-m", "triton_operator", "check-install", "--kubeconfig", kubeconfig,
                              "--crd=leases.coordination.k8s.io", "--namespace=default",
                              "--operator-selector=app=x", "--wait=0"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 1
        assert out.stdout.splitlines() == ["FAILED: CRD leases.coordination.k8s.io: cannot read it (HTTP 403)",
                                           "FAILED: operator pods app=x in default: cannot list them (HTTP 403)"]
    finally:
        gw.stop()
        for (kind, hook_name), d in hooks.items():
            if kind != "Pod":
                c.kubectl("delete", kind.lower(), hook_name, *(["-n", RELEASE_NS] if "namespace" in d["metadata"]
                                                                 else []), "--ignore-not-found", check=False)
