"""Replicas across nodes: the LeaderWorkerSet a 405B model renders to, its pods, and the launch
scripts run by a real shell (with mpirun, ssh-keygen, python3 and date stood in: no GPU, no MPI
and no SSH server here; the real LeaderWorkerSet controller runs them in e2e/test_multinode.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from triton_operator.planning.assign import assign
from triton_operator.render import RenderError, group, render
from triton_operator.settings import NetworkPolicySettings, Settings

from .conftest import EXAMPLES, isvc
from .generated import render_example

K8S_VERSION = "1.34"


@pytest.fixture
def docs():
    return [d for d in yaml.safe_load_all(render_example(EXAMPLES / "llama3-405b.yaml")) if d]


def _kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def test_a_model_larger_than_a_node_renders_groups_of_two_nodes(docs):
    assert [d["kind"] for d in docs] == ["LeaderWorkerSet", "Service", "PodDisruptionBudget", "Job"]
    (lws,) = _kind(docs, "LeaderWorkerSet")
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and lws["metadata"]["name"] == "llama3-405b-group"
    spec = lws["spec"]
    assert spec["replicas"] == 1 and spec["startupPolicy"] == "LeaderCreated"
    assert spec["rolloutStrategy"] == {"type": "RollingUpdate", "rollingUpdateConfiguration": {
        "maxUnavailable": 1, "maxSurge": 0, "partition": 0}}
    assert spec["networkConfig"] == {"subdomainPolicy": "Shared"}
    tmpl = spec["leaderWorkerTemplate"]
    assert (tmpl["size"], tmpl["restartPolicy"]) == (2, "RecreateGroupOnPodRestart")
    for role in ("leaderTemplate", "workerTemplate"):
        pod = tmpl[role]["spec"]
        server = pod["containers"][0]
        assert server["resources"]["limits"] == {"nvidia.com/gpu": "8"}, role   # one node's GPUs each
        assert {"name": "mpi-key", "secret": {"secretName": "llama3-405b-mpi-ssh", "defaultMode": 0o440}} in pod["volumes"]
        repo = next(c for c in pod["initContainers"] if c["name"] == "model-repository")["args"]
        assert repo[repo.index("--tensor-parallelism") + 1] == "8" and repo[repo.index("--pipeline-parallelism") + 1] == "2"
        doctor = next(c for c in pod["initContainers"] if c["name"] == "doctor")["args"]
        assert doctor[doctor.index("--gpus") + 1] == "8"
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                      "template": tmpl[role]}, K8S_VERSION, strict=True)
    # Prepared once (bf16 needs no quantization: a download, without GPUs)
    (job,) = _kind(docs, "Job")
    pod = job["spec"]["template"]["spec"]
    assert not any("nvidia.com/gpu" in c.get("resources", {}).get("limits", {})
                   for c in pod["containers"] + pod.get("initContainers", []))


def test_a_model_quantized_for_a_group_is_prepared_on_one_nodes_gpus(classes):
    obj = isvc(model={"source": "hf://a/b", "format": "tensorrt-llm", "parameters": "405B", "precision": "fp8"},
               gpu={"class": "h100", "count": 16})
    job = render(obj, classes, Settings(), assign(obj, classes)).by_kind("Job")
    limits = [c["resources"]["limits"].get("nvidia.com/gpu") for c in job["spec"]["template"]["spec"]["containers"]]
    assert limits == ["8"]


def test_the_leader_runs_triton_under_mpirun_across_its_group(docs):
    tmpl = _kind(docs, "LeaderWorkerSet")[0]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    server = tmpl["spec"]["containers"][0]
    assert tmpl["metadata"]["labels"]["app.kubernetes.io/component"] == "server"
    assert tmpl["metadata"]["annotations"]["prometheus.io/port"] == "8002"
    args = server["args"]
    assert args[:2] == ["sh", "-c"] and args[3] == "triton-group-leader"
    assert args[4] == "tritonserver" and "mpirun" not in args[4:]      # no one-rank launcher of its own
    assert "trtllm-llmapi-launch \"$@\"" in args[2] and "-np $((LWS_GROUP_SIZE * gpus))" in args[2]
    assert "-x TRITON_ADMIN_KEY" not in args[2] and "-x HF_HOME" in args[2]
    assert {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "1"} in server["env"]
    assert server["startupProbe"]["failureThreshold"] == 540 + 60      # the workers' start-up too
    assert server["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"


def test_workers_run_only_an_ssh_server_and_are_not_served(docs):
    tmpl = _kind(docs, "LeaderWorkerSet")[0]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert tmpl["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    assert not any(k.startswith("prometheus.io/") for k in tmpl["metadata"]["annotations"])
    server = tmpl["spec"]["containers"][0]
    assert server["ports"] == [{"name": "ssh", "containerPort": 2222, "protocol": "TCP"}]
    assert "startupProbe" not in server and "livenessProbe" not in server
    assert server["readinessProbe"]["tcpSocket"] == {"port": "ssh"}
    assert server["args"][:2] == ["sh", "-c"] and "exec /usr/sbin/sshd -D -e" in server["args"][2]
    assert "PasswordAuthentication no" in server["args"][2] and "PermitRootLogin no" in server["args"][2]


def test_the_service_selects_leaders_and_the_budget_covers_whole_groups(docs):
    (svc,) = _kind(docs, "Service")
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "server"
    (pdb,) = _kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == {
        "matchLabels": {"serving.triton-operator.io/inferenceservice": "llama3-405b"},
        "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In", "values": ["server", "worker"]}]}


def test_the_network_policy_lets_a_group_talk_among_itself(classes):
    obj = isvc(model={"source": "hf://a/b", "format": "tensorrt-llm", "parameters": "405B", "precision": "bf16"},
               gpu={"class": "h100", "count": 16})
    settings = Settings(network_policy=NetworkPolicySettings(enabled=True, clients=[{"podSelector": {}}]))
    pol = render(obj, classes, settings, assign(obj, classes)).by_kind("NetworkPolicy")
    assert pol["spec"]["podSelector"] == group.group_selector("demo")
    assert {"from": [{"podSelector": group.group_selector("demo")}]} in pol["spec"]["ingress"]   # every port


def test_a_one_node_replica_still_renders_a_deployment(classes):
    service = isvc(model={"source": "hf://a/b", "format": "tensorrt-llm", "parameters": "405B",
                          "precision": "int4-awq"}, gpu={"class": "h100", "count": 8})
    out = render(service, classes, Settings(), assign(service, classes))
    assert [m["kind"] for m in out.manifests][:1] == ["Deployment"] and out.deployments == {"h100": "demo"}


def test_a_name_too_long_for_the_groups_statefulsets_is_refused(classes):
    obj = isvc(model={"source": "hf://a/b", "format": "tensorrt-llm", "parameters": "405B", "precision": "bf16"},
               gpu={"class": "h100", "count": 16})
    obj = obj.model_copy(update={"metadata": {**obj.metadata, "name": "n" * 43}})
    with pytest.raises(RenderError) as err:
        render(obj, classes, Settings(), assign(obj, classes))
    assert err.value.reason == "NameTooLongForGroups"
    assert err.value.message.endswith("at most 48; shorten the InferenceService's name by 1")


# -- the scripts, in a real shell ------------------------------------------------------------------

def _stubs(tmp_path: Path, python_ok: bool, clock: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stubs = {
        "mpirun": f'echo "mpirun $*" > {tmp_path}/mpirun.txt',
        "python3": f'echo "$3" >> {tmp_path}/probed.txt; exit {0 if python_ok else 1}',
        "date": clock,
        "sleep": "true",
        "ssh-keygen": 'touch "$7"',
        "cp": f'/bin/cp "$1" "$2"',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "LWS_LEADER_ADDRESS": "llama-group-0.llama-group.ml", "LWS_GROUP_SIZE": "3"}


def _script(role: str, tmp_path: Path) -> list[str]:
    docs = [d for d in yaml.safe_load_all(render_example(EXAMPLES / "llama3-405b.yaml")) if d]
    tmpl = _kind(docs, "LeaderWorkerSet")[0]["spec"]["leaderWorkerTemplate"][role]
    key = tmp_path / "key"
    key.mkdir()
    (key / group.SSH_KEY).write_text("private")
    (key / group.SSH_PUBLIC_KEY).write_text("ssh-ed25519 AAAA test")
    (tmp_path / "mpi").mkdir()
    args = tmpl["spec"]["containers"][0]["args"]
    script = args[2].replace(group.SSH_MOUNT, str(key)).replace(group.MPI_DIR, str(tmp_path / "mpi"))
    return ["sh", "-c", script, *args[3:]]


def test_the_leader_script_waits_for_its_workers_then_launches_every_rank(tmp_path):
    env = _stubs(tmp_path, python_ok=True, clock="echo 1000")
    out = subprocess.run(_script("leaderTemplate", tmp_path)[:4] + ["tritonserver", "--http-port=8000"],
                         env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "probed.txt").read_text().split() == ["llama-group-0-1.llama-group.ml",
                                                             "llama-group-0-2.llama-group.ml"]
    launched = (tmp_path / "mpirun.txt").read_text()
    assert launched.startswith("mpirun --bind-to none -np 24 -H llama-group-0.llama-group.ml:8,"
                               "llama-group-0-1.llama-group.ml:8,llama-group-0-2.llama-group.ml:8 ")
    assert launched.rstrip().endswith("trtllm-llmapi-launch tritonserver --http-port=8000")
    assert "Port 2222" in (tmp_path / "mpi" / "ssh_config").read_text()
    assert (tmp_path / "mpi" / "id").read_text() == "private"


def test_a_leader_whose_workers_never_come_up_exits_after_the_start_timeout(tmp_path):
    clock = tmp_path / "clock"
    clock.write_text("0")
    # every call of date is 100 s later than the one before
    env = _stubs(tmp_path, python_ok=False,
                 clock=f'n=$(cat {clock}); echo $((n + 100)) > {clock}; echo $n')
    out = subprocess.run(_script("leaderTemplate", tmp_path), env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and not (tmp_path / "mpirun.txt").exists()
    assert out.stderr.strip() == ("worker llama-group-0-1.llama-group.ml did not accept SSH on port 2222 within "
                                  "600s; the group restarts")


def test_the_worker_script_accepts_the_services_key_only(tmp_path):
    env = _stubs(tmp_path, python_ok=True, clock="echo 0")
    sshd = tmp_path / "bin" / "sshd-args.txt"
    script = _script("workerTemplate", tmp_path)
    script[2] = script[2].replace("exec /usr/sbin/sshd", f'echo "$@" > {sshd}; exec echo sshd')
    out = subprocess.run(script, env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.startswith("sshd -D -e -f "), out.stderr
    config = (tmp_path / "mpi" / "sshd_config").read_text()
    assert f"AuthorizedKeysFile {tmp_path}/mpi/authorized_keys" in config and "Port 2222" in config
    assert f"SetEnv PATH={env['PATH']} LD_LIBRARY_PATH=\n" in config   # mpirun's orted is found on the container's PATH
    assert (tmp_path / "mpi" / "authorized_keys").read_text() == "ssh-ed25519 AAAA test"
    assert oct(os.stat(tmp_path / "mpi" / "authorized_keys").st_mode & 0o777) == "0o600"


def test_a_class_with_a_topology_key_keeps_each_group_within_one_domain(classes):
    obj = isvc(model={"source": "hf://a/b", "format": "tensorrt-llm", "parameters": "405B", "precision": "bf16"},
               gpu={"class": "h100", "count": 16})
    plain = render(obj, classes, Settings(), assign(obj, classes)).by_kind("LeaderWorkerSet")
    assert group.EXCLUSIVE_TOPOLOGY not in plain["metadata"].get("annotations", {})
    h100 = classes["h100"].model_copy(update={"spec": classes["h100"].spec.model_copy(
        update={"group_topology_key": "nvidia.com/gpu.clique"})})
    wide = {**classes, "h100": h100}
    lws = render(obj, wide, Settings(), assign(obj, wide)).by_kind("LeaderWorkerSet")
    assert lws["metadata"]["annotations"] == {group.EXCLUSIVE_TOPOLOGY: "nvidia.com/gpu.clique"}
