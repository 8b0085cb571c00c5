"""Rendering: golden files for every example, structural checks, and the Kubernetes schemas."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from triton_operator.planning.assign import assign
from triton_operator.render import RenderError, render
from triton_operator.settings import Settings

from .conftest import ROOT, isvc
from .generated import isvc_examples, render_example

GOLDEN = ROOT / "tests" / "golden"
ISVC_EXAMPLES = isvc_examples()
K8S_VERSION = "1.34"  # newest schema set kubernetes-validate ships with certainty


def _render_file(path):
    return [d for d in yaml.safe_load_all(render_example(path)) if d]


@pytest.mark.parametrize("path", ISVC_EXAMPLES, ids=lambda p: p.stem)
def test_examples_match_golden_files(path):
    """Compares only: this test never writes a golden file, whatever the environment holds.
    After an intended rendering change run `make golden` and review the diff."""
    golden = GOLDEN / f"{path.stem}.yaml"
    assert golden.is_file(), f"{golden.relative_to(ROOT)} is missing: run make golden"
    assert golden.read_text() == render_example(path), \
        f"{golden.relative_to(ROOT)} differs from what render makes of examples/{path.name}: " \
        "if the change is intended, run make golden and review the diff"


@pytest.mark.parametrize("path", ISVC_EXAMPLES, ids=lambda p: p.stem)
def test_examples_pass_the_kubernetes_schema(path):
    """A LeaderWorkerSet is not a built-in kind: its pod templates are checked here, the object
    itself by the real API server with LWS's CRD (e2e/test_multinode.py)."""
    for manifest in _render_file(path):
        if manifest["kind"] == "LeaderWorkerSet":
            for role, template in manifest["spec"]["leaderWorkerTemplate"].items():
                if role.endswith("Template"):
                    kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                                  "template": template}, K8S_VERSION, strict=True)
            continue
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_deployment_lands_on_the_requested_class(classes):
    obj = isvc(gpu={"class": "h200", "count": 2})
    dep = render(obj, classes, Settings(), assign(obj, classes)).by_kind("Deployment")
    pod = dep["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                            "values": ["NVIDIA-H200", "NVIDIA-H200-SXM5-141GB"]}]}]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    triton = pod["containers"][0]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert triton["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert dep["spec"]["template"]["metadata"]["labels"]["serving.triton-operator.io/gpu-class"] == "h200"


def test_triton_container_is_configured_for_serving(classes):
    service = isvc()
    dep = render(service, classes, Settings(), assign(service, classes)).by_kind("Deployment")
    pod = dep["spec"]["template"]["spec"]
    triton = pod["containers"][0]
    assert "--strict-readiness=true" in triton["args"]
    assert "--metrics-config=summary_latencies=true" in triton["args"]
    assert {p["name"]: p["containerPort"] for p in triton["ports"]} == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    startup = triton["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in triton["volumeMounts"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert triton["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("fmt,drain,grace", [("tensorrt-llm", 300, 315), ("onnx", 30, 60)])
def test_a_replica_that_goes_drains_what_it_is_answering(classes, fmt, drain, grace):
    """On SIGTERM (scale-down, rollout, eviction) Triton waits for the requests in flight up to its
    exit timeout; an LLM answer streams for minutes, so an LLM service waits longer, and the pod's
    grace period outlasts the wait (e2e/test_llm.py stops a real Triton mid-answer)."""
    service = isvc(model={"format": fmt, "source": "hf://org/m", "parameters": "8B"})
    d = render(service, classes, Settings(), assign(service, classes)).by_kind("Deployment")
    pod = d["spec"]["template"]["spec"]
    assert f"--exit-timeout-secs={drain}" in pod["containers"][0]["args"]
    assert pod["terminationGracePeriodSeconds"] == grace


def test_children_are_owned_and_labelled(classes):
    service = isvc()
    for m in render(service, classes, Settings(), assign(service, classes)).manifests:
        (owner,) = m["metadata"]["ownerReferences"]
        assert owner["uid"] == "1234-abcd" and owner["controller"] is True
        assert m["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "triton-operator"
        assert m["metadata"]["labels"]["app.kubernetes.io/instance"] == "demo"
    service = isvc()
    assert {m["kind"] for m in render(service, classes, Settings(), assign(service, classes)).manifests} == \
        {"Deployment", "Service", "PodDisruptionBudget"}


def test_offline_render_has_no_owner_reference(classes):
    obj = isvc()
    del obj.metadata["uid"]
    rendered = render(obj, classes, Settings(), assign(obj, classes))
    assert all("ownerReferences" not in m["metadata"] for m in rendered.manifests)


@pytest.mark.parametrize("cls, rollout, surge, unavailable", [
    ("h100", {}, 0, 1),                                   # no spare GPUs: never surge
    ("l4", {}, 1, 1),                                     # spareGPUs: true
    ("h100", {"maxSurge": 1, "maxUnavailable": 0}, 1, 0),  # the user's word wins
])
def test_rollout_never_waits_for_gpus_that_do_not_exist(classes, cls, rollout, surge, unavailable):
    obj = isvc(gpu={"class": cls}, rollout=rollout)
    dep = render(obj, classes, Settings(), assign(obj, classes)).by_kind("Deployment")
    strategy = dep["spec"]["strategy"]["rollingUpdate"]
    assert (strategy["maxSurge"], strategy["maxUnavailable"]) == (surge, unavailable)


def test_model_sources_reach_triton(classes):
    service = isvc(model={"source": "pvc://store/repo/a", "format": "triton"})
    pvc = render(service, classes, Settings(), assign(service, classes))
    pod = pvc.by_kind("Deployment")["spec"]["template"]["spec"]
    assert "--model-repository=/models/repo/a" in pod["containers"][0]["args"]
    assert {"name": "model-repository", "persistentVolumeClaim": {"claimName": "store", "readOnly": True}} in pod["volumes"]
    assert "initContainers" not in pod

    service = isvc(model={"source": "s3://bucket/repo", "format": "triton", "credentialsSecret": "aws"})
    s3 = render(service, classes, Settings(),
                assign(service, classes)).by_kind("Deployment")["spec"]["template"]["spec"]
    assert "--model-repository=s3://bucket/repo" in s3["containers"][0]["args"]
    assert s3["containers"][0]["envFrom"] == [{"secretRef": {"name": "aws"}}]

    service = isvc(model={"source": "hf://org/m", "format": "onnx", "credentialsSecret": "hf"})
    hf = render(service, classes, Settings(),
                assign(service, classes)).by_kind("Deployment")["spec"]["template"]["spec"]
    (stage,) = hf["initContainers"]
    assert stage["command"] == ["triton-runtime"] and stage["args"][:3] == ["stage", "--source", "hf://org/m"]
    assert stage["envFrom"] == [{"secretRef": {"name": "hf"}}]
    assert "envFrom" not in hf["containers"][0]  # the secret stays with the container that fetches
    # The runtime image's uid 1000 has no home directory: the staging container gets one; the
    # Triton image's server container is left as its image defines it.
    assert {"name": "home", "mountPath": "/home/triton-server"} in stage["volumeMounts"]
    assert {e["name"]: e["value"] for e in stage["env"]}["HOME"] == "/home/triton-server"
    # (its only variable is the admin key of Triton's restricted APIs, the pod's own UID)
    assert hf["containers"][0]["env"] == [{"name": "TRITON_ADMIN_KEY",
                                          "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]


def test_triton_admin_apis_answer_only_the_pods_own_key(classes):
    """Model control, shared memory, statistics, trace and logging are restricted on both
    protocols to a header carrying the pod's UID (Triton server --http-restricted-api /
    --grpc-restricted-protocol, format <apis>:<header>=<value>, as tritonserver 2.51 --help
    prints it); a user's TRITON_ADMIN_KEY replaces ours."""
    from triton_operator.render import ADMIN_KEY_FROM_POD, RESTRICTED_ARGS

    for fmt in ("onnx", "tensorrt-llm"):
        service = isvc(model={"format": fmt, "source": "hf://org/m", "parameters": "8B"})
        d = render(service, classes, Settings(), assign(service, classes)).by_kind("Deployment")
        container = d["spec"]["template"]["spec"]["containers"][0]
        assert all(a in container["args"] for a in RESTRICTED_ARGS), fmt
        assert ADMIN_KEY_FROM_POD in container["env"]
    assert RESTRICTED_ARGS[0] == ("--http-restricted-api=model-repository,shared-memory,statistics,trace,logging:"
                                  "x-triton-operator-admin=$(TRITON_ADMIN_KEY)")
    mine = {"name": "TRITON_ADMIN_KEY", "value": "a-key-of-my-own"}
    service = isvc(model={"format": "onnx", "source": "hf://org/m"}, server={"env": [mine]})
    d = render(service, classes, Settings(), assign(service, classes)).by_kind("Deployment")
    assert [e for e in d["spec"]["template"]["spec"]["containers"][0]["env"]
            if e["name"] == "TRITON_ADMIN_KEY"] == [mine]


def test_fallback_class_is_used_when_the_class_is_missing(classes):
    del classes["h100"]
    service = isvc(gpu={"class": "h100", "fallbackClasses": ["h200"]})
    out = render(service, classes, Settings(), assign(service, classes))
    assert out.gpu_class == "h200" and "using fallback h200" in out.notes[0]


@pytest.mark.parametrize("changes, reason, words", [
    ({"gpu": {"class": "x100"}}, "GPUClassNotFound", "GPUClass x100 does not exist"),
    ({"gpu": {"class": "a100-80gb"}, "model": {"source": "hf://a/b", "format": "onnx", "precision": "fp8"}},
     "PrecisionUnsupported", "compute capability 8.9"),
    ({"gpu": {"class": "l4", "count": 8}}, "MultiNodeNeedsLLMEngine", "spans 2 l4 nodes of 4 GPUs"),
    ({"gpu": {"class": "l4"}, "model": {"source": "hf://a/b", "format": "onnx", "parameters": "70B"}},
     "ModelDoesNotFit", "use a lower precision"),
])
def test_specs_that_cannot_run_say_why(classes, changes, reason, words):
    with pytest.raises(RenderError) as err:
        service = isvc(**changes)
        render(service, classes, Settings(), assign(service, classes))
    assert err.value.reason == reason and words in err.value.message


def test_autoscaled_services_start_at_min_replicas(classes):
    obj = isvc(autoscaling={"minReplicas": 2, "maxReplicas": 5})
    assert render(obj, classes, Settings(), assign(obj, classes)).by_kind("Deployment")["spec"]["replicas"] == 2
    assert render(obj, classes, Settings(),
                  assign(obj, classes, replicas=4)).by_kind("Deployment")["spec"]["replicas"] == 4


def test_values_cannot_break_the_yaml(classes):
    obj = isvc(podAnnotations={"note": "a: b\n- c: {d}"}, server={"args": ["--log-info=true # x"]})
    dep = render(obj, classes, Settings(), assign(obj, classes)).by_kind("Deployment")
    assert dep["spec"]["template"]["metadata"]["annotations"]["note"] == "a: b\n- c: {d}"
    assert dep["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--log-info=true # x"


def _containers(manifest):
    pod = manifest["spec"]["template"]["spec"]
    return pod.get("initContainers", []) + pod["containers"]


@pytest.mark.parametrize("path", ISVC_EXAMPLES, ids=lambda p: p.stem)
def test_no_container_replaces_the_ngc_entrypoint(path):
    """The NGC images' entrypoint (/opt/nvidia/nvidia_entrypoint.sh: CUDA forward compatibility,
    driver checks) must run: programs go in args, as Triton server
    deploy/k8s-onprem/templates/deployment.yaml passes `args: [tritonserver, ...]`. Containers of
    the operator's own image (entrypoint triton-operator) name triton-runtime as their command."""
    settings = Settings()
    for manifest in _render_file(path):
        if manifest["kind"] not in ("Deployment", "Job"):
            continue
        for container in _containers(manifest):
            where = (path.stem, container["name"])
            if container["image"] == settings.runtime_image:
                assert container["command"] == ["triton-runtime"], where
            else:
                assert container["image"].startswith("nvcr.io/nvidia/tritonserver:") and "command" not in container, where
                args = container["args"]
                program = args[4] if args[:4] == ["mpirun", "--allow-run-as-root", "-n", "1"] else args[0]
                assert program in ("tritonserver", "python3"), where


LLM = {"model": {"source": "hf://meta-llama/Llama-3.2-1B-Instruct", "format": "tensorrt-llm", "parameters": "1B",
                 "precision": "fp16"}, "gpu": {"class": "h100", "count": 1}}


def test_llm_pods_check_themselves_with_their_gpus_and_a_writable_home(classes):
    service = isvc(**LLM, server={"env": [{"name": "HF_HOME", "value": "/custom"}]})
    dep = render(service, classes, Settings(), assign(service, classes)).by_kind("Deployment")
    pod = dep["spec"]["template"]["spec"]
    make_repository, doctor = pod["initContainers"]
    triton = pod["containers"][0]
    assert doctor["name"] == "doctor" and doctor["args"][:6] == ["python3", "-m", "triton_runtime.cli", "doctor",
                                                                 "--for", "serve"]
    assert doctor["args"][doctor["args"].index("--gpus") + 1] == "1"
    # The same model identity as make-repository, so both compute the same cache key.
    identity = doctor["args"][6:doctor["args"].index("--gpus")]
    assert identity == make_repository["args"][3:3 + len(identity)]
    assert doctor["resources"] == triton["resources"]  # GPUs included: the doctor counts them
    assert "nvidia.com/gpu" not in make_repository["resources"]["requests"]
    assert "envFrom" not in make_repository and "envFrom" not in doctor  # nothing is fetched there
    home = {"name": "home", "mountPath": "/home/triton-server"}
    for container in (doctor, make_repository, triton):
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["HOME"] == "/home/triton-server" and env["HF_DATASETS_CACHE"].startswith("/home/triton-server/")
        assert env["TORCH_EXTENSIONS_DIR"].startswith("/home/triton-server/") and home in container["volumeMounts"]
    # The user's variable replaces ours, never twice in the list (server-side apply refuses that).
    assert [e for e in triton["env"] if e["name"] == "HF_HOME"] == [{"name": "HF_HOME", "value": "/custom"}]
    assert {"name": "home", "emptyDir": {"sizeLimit": "2Gi"}} in pod["volumes"]


def test_llm_pods_serve_on_the_stock_image_and_write_their_repository_with_ours(classes):
    settings = Settings(runtime_image="registry.local/triton-operator:1",
                        llm_image="nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3")
    service = isvc(**LLM)
    dep = render(service, classes, settings, assign(service, classes)).by_kind("Deployment")
    assert {c["name"]: c["image"] for c in _containers(dep)} == {
        "model-repository": "registry.local/triton-operator:1",
        "doctor": "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3",
        "triton": "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"}


SPILL = {"class": "h100", "fallbackClasses": ["h200", "a100-80gb"], "spill": {}}


def test_a_placement_renders_one_deployment_per_class_and_shares_service_and_pdb(classes):
    obj = isvc(gpu=SPILL, replicas=3)
    r = render(obj, classes, Settings(), assign(obj, classes, placement={"h100": 1, "h200": 2}))
    deps = [m for m in r.manifests if m["kind"] == "Deployment"]
    assert [(d["metadata"]["name"], d["spec"]["replicas"]) for d in deps] == [("demo", 1), ("demo-spill-h200", 2)]
    assert r.deployments == {"h100": "demo", "h200": "demo-spill-h200"}
    preferred, spill = deps
    service = isvc(gpu={"class": "h100", "fallbackClasses": ["h200", "a100-80gb"]}, replicas=1)
    single = render(service, classes, Settings(), assign(service, classes)).by_kind("Deployment")
    assert preferred == single, "the preferred class's Deployment is today's: an upgrade restarts nothing"
    assert spill["spec"]["selector"]["matchLabels"] == {**preferred["spec"]["selector"]["matchLabels"],
                                                         "serving.triton-operator.io/gpu-class": "h200"}
    terms = spill["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["NVIDIA-H200", "NVIDIA-H200-SXM5-141GB"]
    assert spill["metadata"]["ownerReferences"][0]["name"] == "demo"
    service, pdb = r.by_kind("Service"), r.by_kind("PodDisruptionBudget")
    for selector in (service["spec"]["selector"], pdb["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= spill["spec"]["template"]["metadata"]["labels"].items()
        assert selector.items() <= preferred["spec"]["template"]["metadata"]["labels"].items()
    for m in deps:
        kubernetes_validate.validate(m, K8S_VERSION, strict=True)


def test_every_class_is_held_at_zero_until_the_model_is_prepared_once_for_all(classes):
    llm = {"source": "hf://org/m", "format": "tensorrt-llm", "parameters": "8B", "precision": "fp8"}
    obj = isvc(gpu=SPILL, model=llm)
    r = render(obj, classes, Settings(), assign(obj, classes, placement={"h100": 1, "h200": 2}, prepared=set()))
    assert {m["metadata"]["name"]: m["spec"]["replicas"] for m in r.manifests if m["kind"] == "Deployment"} == \
        {"demo": 0, "demo-spill-h200": 0}
    (job,) = [m for m in r.manifests if m["kind"] == "Job"]
    assert job["metadata"]["labels"]["serving.triton-operator.io/gpu-class"] == "h100", "quantized on the preferred class"
    r = render(obj, classes, Settings(),
               assign(obj, classes, placement={"h100": 1, "h200": 2}, prepared={"h100", "h200"}))
    assert {m["metadata"]["name"]: m["spec"]["replicas"] for m in r.manifests if m["kind"] == "Deployment"} == \
        {"demo": 1, "demo-spill-h200": 2}


def test_class_auto_renders_the_planners_choice_with_its_gpu_count(classes):
    obj = isvc(gpu={"class": "auto", "count": 0, "spill": {}},
               model={"source": "hf://org/m", "format": "tensorrt-llm", "parameters": "70B", "precision": "fp8"})
    r = render(obj, classes, Settings(), assign(obj, classes))
    assert r.gpu_class == "l4"  # 65 GiB at fp8: 4 x L4 (3.2/h) is the cheapest that holds it
    dep = r.by_kind("Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    (job,) = [m for m in r.manifests if m["kind"] == "Job"]
    assert job["metadata"]["labels"]["serving.triton-operator.io/gpu-class"] == "l4", "quantized on the planner's choice"
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"


@pytest.mark.parametrize("resources, requests", [
    # A limit below a default request lowers the request to the limit (Kubernetes refuses
    # request > limit, and itself defaults a missing request to the limit).
    ({"limits": {"cpu": "1"}}, {"cpu": "1", "memory": "8Gi"}),
    ({"limits": {"cpu": "500m", "memory": "4Gi"}}, {"cpu": "500m", "memory": "4Gi"}),
    # A limit above a default leaves the default; an explicit request always wins.
    ({"limits": {"cpu": "4", "memory": "8192Mi"}}, {"cpu": "2", "memory": "8Gi"}),
    ({"requests": {"cpu": "250m"}, "limits": {"cpu": "1"}}, {"cpu": "250m", "memory": "8Gi"}),
    ({"limits": {"ephemeral-storage": "1Gi"}}, {"cpu": "2", "memory": "8Gi"}),
])
def test_default_requests_follow_a_lower_limit(classes, resources, requests):
    service = isvc(server={"resources": resources})
    dep = render(service, classes, Settings(), assign(service, classes)).by_kind("Deployment")
    pod = dep["spec"]["template"]["spec"]
    triton = pod["containers"][0]["resources"]
    assert {k: v for k, v in triton["requests"].items() if k != "nvidia.com/gpu"} == requests
    assert pod["initContainers"][0]["resources"]["requests"] == requests
    kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


def test_env_is_rendered_once_per_name_and_labels_as_given(classes):
    obj = isvc(server={"env": [{"name": "A", "value": "1"}, {"name": "B"}]},
               podLabels={"example.com/team": "ml-platform"}, podAnnotations={"example.com/note": "ready \U0001F680"})
    dep = render(obj, classes, Settings(), assign(obj, classes)).by_kind("Deployment")
    template = dep["spec"]["template"]
    assert template["spec"]["containers"][0]["env"] == [
        {"name": "TRITON_ADMIN_KEY", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "A", "value": "1"}, {"name": "B", "value": ""}]
    assert template["metadata"]["labels"]["example.com/team"] == "ml-platform"
    assert template["metadata"]["annotations"]["example.com/note"] == "ready \U0001F680"


def test_a_network_policy_lets_only_the_named_peers_reach_triton(classes):
    """With settings.network_policy on, each service gets a NetworkPolicy over the pods of all its
    classes: inference ports from the clients (the gateway), the metrics port from Prometheus, and
    nothing else; with no client at all, no inference rule (an empty `from` would mean anyone)."""
    from triton_operator.settings import NetworkPolicySettings

    gateway = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "triton-system"}},
               "podSelector": {"matchLabels": {"app.kubernetes.io/name": "triton-operator-gateway"}}}
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    on = Settings(network_policy=NetworkPolicySettings(enabled=True, clients=[gateway], metrics=[prometheus]))
    service = isvc()
    r = render(service, classes, on, assign(service, classes))
    policy = r.by_kind("NetworkPolicy")
    kubernetes_validate.validate(policy, "1.33", strict=True)
    assert policy["metadata"]["name"] == "demo"
    assert policy["spec"]["podSelector"] == {"matchLabels": r.by_kind("Service")["spec"]["selector"]}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {"from": [gateway], "ports": [{"port": "http", "protocol": "TCP"}, {"port": "grpc", "protocol": "TCP"},
                                      {"port": "https", "protocol": "TCP"}]},
        {"from": [prometheus], "ports": [{"port": "metrics", "protocol": "TCP"}]}]
    service = isvc()
    closed = render(service, classes, Settings(network_policy=NetworkPolicySettings(enabled=True)),
                    assign(service, classes))
    assert closed.by_kind("NetworkPolicy")["spec"]["ingress"] == []
    service = isvc()
    default = render(service, classes, Settings(), assign(service, classes))
    assert "NetworkPolicy" not in [m["kind"] for m in default.manifests]
