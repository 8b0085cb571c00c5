"""tensorrt-llm services on the operator side: the model's preparation Job (a GPU only where it
quantizes), its state from the Job, serving held back until the model is prepared, serving pods
on NVIDIA's stock image with the repository written by our init container, and the conditions
users see."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone

import pytest

from triton_operator.api.status import PreparationStatus
from triton_operator.conditions import find
from triton_operator.controller.status import Observed, compute
from triton_operator.planning import preparation
from triton_operator.planning.assign import assign
from triton_operator.render import preparation_jobs, render
from triton_operator.settings import Settings

from .conftest import isvc

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
LLM = {"model": {"source": "hf://meta/llama", "format": "tensorrt-llm", "parameters": "8B", "precision": "bf16"},
       "gpu": {"class": "h100", "count": 2, "fallbackClasses": ["a100-80gb"]}}
FP8 = {**LLM, "model": {**LLM["model"], "precision": "fp8", "credentialsSecret": "hf-token"}}


def job(name: str, cond: str | None = None, reason: str = "", message: str = "", active: int = 0) -> dict:
    status = {"active": active}
    if cond:
        status["conditions"] = [{"type": cond, "status": "True", "reason": reason, "message": message}]
    return {"metadata": {"name": name}, "status": status}


def _job(obj, classes, settings=None):
    (only,) = preparation_jobs(obj, classes, settings or Settings(), assign(obj, classes).candidates)
    return only


def test_a_download_needs_no_gpu_and_runs_the_operators_image(classes):
    j = _job(isvc(**LLM), classes)
    assert "serving.triton-operator.io/gpu-class" not in j["metadata"]["labels"]
    pod = j["spec"]["template"]["spec"]
    assert "affinity" not in pod and pod["tolerations"] == []
    (work,) = pod["containers"]
    assert work["image"] == Settings().runtime_image and work["command"] == ["triton-runtime"]
    assert work["args"][:5] == ["prepare", "--source", "hf://meta/llama", "--precision", "bf16"]
    assert "nvidia.com/gpu" not in work["resources"]["requests"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "triton-models"}} in pod["volumes"]


def test_a_quantization_runs_the_stock_image_on_the_preferred_class_with_its_gpus(classes):
    j = _job(isvc(**FP8), classes)
    assert j["metadata"]["labels"]["serving.triton-operator.io/gpu-class"] == "h100"   # FP8: not A100
    pod = j["spec"]["template"]["spec"]
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"][0]["values"][0] == "NVIDIA-H100-80GB-HBM3"
    (work,) = pod["containers"]
    assert work["image"] == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3" and "command" not in work
    # NGC's entrypoint stays in place; triton-runtime comes from the copy the first init container makes.
    assert work["args"][:4] == ["python3", "-m", "triton_runtime.cli", "prepare"]
    assert {"name": "PYTHONPATH", "value": "/opt/triton-runtime"} in work["env"]
    assert work["resources"]["limits"]["nvidia.com/gpu"] == "2"
    install, doctor, download = pod["initContainers"]
    assert install["command"] == ["triton-runtime"] and install["args"] == ["install", "--into", "/opt/triton-runtime"]
    assert doctor["args"][3:6] == ["doctor", "--for", "prepare"]
    assert doctor["args"][doctor["args"].index("--gpus") + 1] == "2"
    assert work["args"][work["args"].index("--trtllm-version") + 1] == "1.2.1"
    # The download runs in the operator's image (NVIDIA's has no boto3 or google-cloud-storage),
    # with the model's credentials and without the GPUs; the quantization reads what it fetched.
    assert download["image"] == Settings().runtime_image and download["command"] == ["triton-runtime"]
    assert download["args"][:1] + download["args"][-4:] == [
        "prepare", "--download-to", "/scratch/download", "--scratch-size", download["args"][-1]]
    assert "nvidia.com/gpu" not in download["resources"]["requests"] and "limits" not in download["resources"]
    assert download["envFrom"] == work["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
    assert work["args"][-2:] == ["--downloaded", "/scratch/download"]
    assert download["volumeMounts"] == work["volumeMounts"]


def test_job_names_change_with_what_the_job_does_and_are_never_edited(classes):
    a = _job(isvc(**FP8), classes)["metadata"]["name"]
    assert a.startswith("demo-") and len(a) == len("demo-") + 10
    assert _job(isvc(**FP8), classes)["metadata"]["name"] == a
    assert _job(isvc(**{**FP8, "model": {**FP8["model"], "revision": "v2"}}), classes)["metadata"]["name"] != a
    assert _job(isvc(**FP8), classes, Settings(trtllm_version="1.3.0"))["metadata"]["name"] != a
    # LLM API arguments change the serving pods, not the preparation
    assert _job(isvc(**FP8, engine={"maxBatchSize": 128}), classes)["metadata"]["name"] == a
    service = isvc()
    # onnx: nothing to prepare
    assert preparation_jobs(service, classes, Settings(), assign(service, classes).candidates) == []


def test_serving_is_held_until_the_model_is_prepared_and_runs_the_stock_image(classes):
    obj = isvc(**LLM)
    held = render(obj, classes, Settings(), assign(obj, classes, prepared=set())).by_kind("Deployment")
    assert held["spec"]["replicas"] == 0
    dep = render(obj, classes, Settings(), assign(obj, classes, prepared={"h100", "a100-80gb"})).by_kind("Deployment")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["model-repository", "doctor"]
    triton = pod["containers"][0]
    assert triton["image"] == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3" and "command" not in triton
    # two GPUs: the LLM API spawns its second worker with MPI, so the server runs under mpirun,
    # as upstream's launcher starts it; one GPU needs no MPI
    assert triton["args"][:6] == ["mpirun", "--allow-run-as-root", "-n", "1", "tritonserver",
                                  "--model-repository=/models/repository"]
    single = isvc(**{**LLM, "gpu": {"class": "h100", "count": 1}})
    one = render(single, classes, Settings(), assign(single, classes, prepared={"h100"})).by_kind("Deployment")
    assert one["spec"]["template"]["spec"]["containers"][0]["args"][:2] == [
        "tritonserver", "--model-repository=/models/repository"]
    assert {"name": "model-cache", "mountPath": "/models/cache", "readOnly": True} in triton["volumeMounts"]
    repo = pod["initContainers"][0]
    assert repo["image"] == Settings().runtime_image and repo["args"][:3] == ["make-repository", "--engine", "trtllm"]
    assert repo["args"][repo["args"].index("--tensor-parallelism") + 1] == "2"
    assert "nvidia.com/gpu" not in repo["resources"]["requests"]
    doctor = pod["initContainers"][1]
    assert doctor["resources"]["limits"]["nvidia.com/gpu"] == "2"   # the doctor sees the pod's GPUs
    assert doctor["args"][doctor["args"].index("--min-driver") + 1] == "590.44.01"
    # nothing in the default path builds engines
    text = str(dep)
    assert not any(w in text for w in ("trtllm-build", "convert_checkpoint", "quantize.py"))


def test_the_serving_image_may_be_chosen_and_the_doctor_checks_that_one(classes):
    service = isvc(**LLM, server={"image": "registry.local/triton-trtllm:26.07-patched"})
    dep = render(service, classes, Settings(), assign(service, classes)).by_kind("Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.local/triton-trtllm:26.07-patched"
    assert pod["initContainers"][1]["image"] == "registry.local/triton-trtllm:26.07-patched"


def test_a_chat_template_of_the_service_reaches_the_repository(classes):
    obj = isvc(**LLM, openai={"chatTemplate": "{{ messages[0]['content'] }}", "defaultMaxTokens": 99})
    dep = render(obj, classes, Settings(), assign(obj, classes)).by_kind("Deployment")
    repo = dep["spec"]["template"]["spec"]["initContainers"][0]
    assert {"name": "LLM_CHAT_TEMPLATE", "value": "{{ messages[0]['content'] }}"} in repo["env"]
    assert repo["args"][repo["args"].index("--default-max-tokens") + 1] == "99"


def test_preparation_state_from_the_job():
    rendered = [{"metadata": {"name": "p", "labels": {"serving.triton-operator.io/gpu-class": "h100"}}}]
    (done,) = preparation.states(rendered, [job("p", "Complete")], [], "fp8")
    assert (done["phase"], done["precision"], done["gpuClass"]) == ("Ready", "fp8", "h100")
    (failed,) = preparation.states(rendered, [job("p", "Failed", "BackoffLimitExceeded", "limit reached")], [], "fp8")
    assert failed["phase"] == "Failed" and "BackoffLimitExceeded: limit reached" in failed["message"]
    (waiting,) = preparation.states(rendered, [], [], "fp8")
    assert waiting["phase"] == "Preparing" and "waiting for a h100 node to quantize on" in waiting["message"]
    # a Job deleted after success: status remembers, nothing is prepared again or held
    assert preparation.states(rendered, [], [done], "fp8")[0]["phase"] == "Ready"
    assert preparation.ready_classes([done], ["h100", "a100-80gb"]) == {"h100", "a100-80gb"}
    assert preparation.ready_classes([waiting], ["h100"]) == set()


def test_the_commit_a_preparation_fetched_is_in_status_and_remembered():
    """runtime/'s prepare writes "... at commit <sha>" to its termination log; the pod of the
    completed Job says it once, and status keeps it after the Job and its pod are gone."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    rendered = [{"metadata": {"name": "p"}}]
    pod = {"metadata": {"labels": {"batch.kubernetes.io/job-name": "p"}},
           "status": {"containerStatuses": [{"name": "prepare", "state": {"terminated": {
               "exitCode": 0, "message": f"prepared hf://org/m at commit {sha}"}}}]}}
    other = {"metadata": {"labels": {"batch.kubernetes.io/job-name": "q"}}, "status": pod["status"]}
    (done,) = preparation.states(rendered, [job("p", "Complete")], [], "fp8", [other, pod])
    assert done["commit"] == sha and done["message"] == f"model prepared (fp8) and cached, from commit {sha}"
    assert PreparationStatus.model_validate(done).commit == sha
    (later,) = preparation.states(rendered, [], [done], "fp8", [])
    assert later["commit"] == sha
    # a source without commits (s3://, pvc://) or a pod already gone: no commit, no guess
    (plain,) = preparation.states(rendered, [job("p", "Complete")], [], "fp8", [other])
    assert "commit" not in plain and plain["message"] == "model prepared (fp8) and cached"


def _status(phase: str, dep=None, message="m"):
    obs = Observed(desired_replicas=2, gpu_class="h100", gpu_count=2, deployment=dep,
                   preparation=[{"precision": "fp8", "gpuClass": "h100", "phase": phase, "job": "j", "message": message}])
    status, events = compute(isvc(**FP8), obs, NOW)
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}, status, events


def test_conditions_while_preparing_ready_and_failed():
    empty = {"metadata": {"generation": 1}, "spec": {"replicas": 0},
             "status": {"observedGeneration": 1, "replicas": 0}}
    conds, status, events = _status("Preparing", empty)
    assert conds["Ready"] == ("False", "Preparing") and conds["ModelReady"] == ("False", "Preparing")
    assert conds["Progressing"] == ("True", "Preparing") and conds["Degraded"][0] == "False"
    assert status["preparation"][0]["phase"] == "Preparing"
    assert ("Normal", "Preparing") in [(e.type, e.reason) for e in events]

    conds, _, events = _status("Failed", empty, "preparation Job j failed: BackoffLimitExceeded")
    assert conds["Ready"] == ("False", "PreparationFailed") and conds["Degraded"] == ("True", "PreparationFailed")
    assert ("Warning", "PreparationFailed") in [(e.type, e.reason) for e in events]

    serving = {"metadata": {"generation": 2}, "spec": {"replicas": 2},
               "status": {"observedGeneration": 2, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
                          "availableReplicas": 2}}
    conds, _, _ = _status("Ready", serving)
    assert conds["Ready"] == ("True", "Serving") and conds["ModelReady"] == ("True", "Prepared")
    # a new spec's model being prepared while the old one serves: still Ready; Progressing says why
    conds, _, _ = _status("Preparing", serving)
    assert conds["Ready"] == ("True", "Serving") and conds["Progressing"] == ("True", "Preparing")


def test_onnx_services_have_no_model_condition():
    status, _ = compute(isvc(), Observed(desired_replicas=1, gpu_class="h100"), NOW)
    assert find(status["conditions"], "ModelReady") is None and "preparation" not in status


def test_jobs_run_the_doctor_first_and_fail_at_once_on_what_retries_cannot_fix(classes):
    j = _job(isvc(**FP8), classes)
    pod = j["spec"]["template"]["spec"]
    _, doctor, _ = pod["initContainers"]
    (work,) = pod["containers"]
    assert doctor["resources"] == work["resources"] and doctor["volumeMounts"] == work["volumeMounts"]
    assert doctor["env"] == work["env"] and doctor.get("envFrom") == work.get("envFrom")  # it sizes the source
    # runtime/triton_runtime: cli.EXIT_SPEC (2) and doctor.PROBLEMS_EXIT (3) never fix themselves.
    from triton_runtime import cli, doctor as runtime_doctor
    (fail, ignore) = j["spec"]["podFailurePolicy"]["rules"]
    assert fail == {"action": "FailJob", "onExitCodes": {"operator": "In",
                                                         "values": [cli.EXIT_SPEC, runtime_doctor.PROBLEMS_EXIT]}}
    assert ignore["action"] == "Ignore" and ignore["onPodConditions"][0]["type"] == "DisruptionTarget"
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it


def test_preparation_jobs_have_their_own_resources_not_the_serving_ones(classes):
    """Serving limits (e.g. 128Gi for a 70B server) must not cap a quantization that holds the whole
    checkpoint in host memory; the Job's requests follow the model size (api: engine.buildResources)."""
    serving = {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "128Gi"}}
    seventy = {**FP8, "model": {**FP8["model"], "parameters": "70B"}, "gpu": {"class": "h200", "count": 2},
               "server": {"resources": serving}}
    work = _job(isvc(**seventy), classes)["spec"]["template"]["spec"]["containers"][0]
    # cpu 2+2N; memory 70e9 x 2 bytes x 1.25 = 163 GiB; scratch 2 x 70 GB x 1.2 + 10 GiB = 167 GiB
    assert work["resources"] == {
        "requests": {"cpu": "6", "memory": "163Gi", "ephemeral-storage": "167Gi", "nvidia.com/gpu": "2"},
        "limits": {"nvidia.com/gpu": "2"}}
    chosen = {**seventy, "engine": {"buildResources": {"requests": {"memory": "300Gi", "ephemeral-storage": "400Gi"},
                                                       "limits": {"memory": "350Gi"}}}}
    pod = _job(isvc(**chosen), classes)["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "6", "memory": "300Gi", "ephemeral-storage": "400Gi", "nvidia.com/gpu": "2"},
        "limits": {"memory": "350Gi", "nvidia.com/gpu": "2"}}
    assert {"name": "scratch", "emptyDir": {"sizeLimit": "400Gi"}} in pod["volumes"]
    doctor_args = pod["initContainers"][1]["args"]
    assert doctor_args[doctor_args.index("--scratch-size") + 1] == "400Gi"


def test_preparation_home_and_caches_live_on_the_scratch_volume(classes):
    """uid 1000 has no home in the NGC image, and the calibration download goes to
    HF_DATASETS_CACHE: on scratch, it is counted."""
    work = _job(isvc(**FP8), classes)["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in work["env"]}
    assert {k for k in env if k != "PYTHONPATH"} == {"HOME", "XDG_CACHE_HOME", "HF_HOME", "HF_DATASETS_CACHE",
                                                     "TORCH_EXTENSIONS_DIR"}
    assert all(v.startswith("/scratch/home") for k, v in env.items() if k != "PYTHONPATH")


def test_calibration_dataset_reaches_the_job_and_its_claim_is_mounted(classes):
    fp8 = {**FP8, "gpu": {"class": "h100", "count": 1}, "engine": {"calibrationDataset": "pvc://datasets/calib/text"}}
    j = _job(isvc(**fp8), classes)
    pod = j["spec"]["template"]["spec"]
    for container in (pod["initContainers"][1], pod["containers"][0]):
        args = container["args"]
        assert args[args.index("--calibration-dataset") + 1] == "pvc://datasets/calib/text"
        assert {"name": "claim-datasets", "mountPath": "/mnt/pvc/datasets", "readOnly": True} in container["volumeMounts"]
    assert _job(isvc(**{**fp8, "engine": {}}), classes)["metadata"]["name"] != j["metadata"]["name"]
    service = isvc(**fp8)
    dep = render(service, classes, Settings(), assign(service, classes)).by_kind("Deployment")
    make_repository = dep["spec"]["template"]["spec"]["initContainers"][0]["args"]
    assert make_repository[make_repository.index("--calibration-dataset") + 1] == "pvc://datasets/calib/text"


@pytest.mark.parametrize("where, secrets", [("settings", ["ngc"]), ("spec", ["team-registry"]), ("both", ["ngc", "team-registry"])])
def test_image_pull_secrets_and_service_account_reach_pods_and_jobs(classes, where, secrets):
    settings = Settings(image_pull_secrets=["ngc"]) if where in ("settings", "both") else Settings()
    spec = {"imagePullSecrets": ["team-registry"]} if where in ("spec", "both") else {}
    obj = isvc(**FP8, serviceAccountName="llm", **spec)
    dep = render(obj, classes, settings, assign(obj, classes)).by_kind("Deployment")["spec"]["template"]["spec"]
    j = _job(obj, classes, settings)["spec"]["template"]["spec"]
    for pod in (dep, j):
        assert pod["imagePullSecrets"] == [{"name": s} for s in secrets]
        assert pod["serviceAccountName"] == "llm" and pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("gpu_class, precision, count, quantized_on", [
    ("h100", "fp8", 1, "h100"),       # Hopper FP8, quantized on the class (a pre-quantized checkpoint is copied)
    ("a100-80gb", "bf16", 2, None),   # Ampere: BF16, downloaded only
    ("l4", "fp8", 4, "l4"),           # Ada: FP8 from compute capability 8.9
    ("b200", "nvfp4", 1, "b200"),     # Blackwell: NVFP4
])
def test_the_llm_path_renders_for_each_gpu_generation(classes, gpu_class, precision, count, quantized_on):
    """H100 FP8, A100 BF16, L4 and B200 NVFP4 (issue 18's "done when"): the stock image with our
    prepared model folder, the LLM API path, nothing that builds engines."""
    obj = isvc(model={"source": "hf://meta-llama/Llama-3.1-8B-Instruct", "format": "tensorrt-llm", "parameters": "8B",
                      "precision": precision}, gpu={"class": gpu_class, "count": count})
    r = render(obj, classes, Settings(), assign(obj, classes))
    pod = r.by_kind("Deployment")["spec"]["template"]["spec"]
    triton = pod["containers"][0]
    assert triton["image"] == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    launcher = ["mpirun", "--allow-run-as-root", "-n", "1"] if count > 1 else []
    assert triton["args"][:len(launcher) + 2] == [*launcher, "tritonserver", "--model-repository=/models/repository"]
    repo = pod["initContainers"][0]["args"]
    assert repo[repo.index("--precision") + 1] == precision and repo[repo.index("--tensor-parallelism") + 1] == str(count)
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == str(count)
    (j,) = [m for m in r.manifests if m["kind"] == "Job"]
    assert j["metadata"]["labels"].get("serving.triton-operator.io/gpu-class") == quantized_on
    text = str(r.manifests)
    assert not any(w in text for w in ("trtllm-build", "convert_checkpoint", "quantize.py", "inflight_batcher"))


@pytest.mark.parametrize("gpu_class, precision, reason", [
    ("a100-80gb", "fp8", "PrecisionUnsupported"),
    ("h100", "nvfp4", "PrecisionUnsupported"),
])
def test_precisions_a_generation_lacks_are_refused_naming_why(classes, gpu_class, precision, reason):
    from triton_operator.render import RenderError
    obj = isvc(model={"source": "hf://a/b", "format": "tensorrt-llm", "parameters": "8B", "precision": precision},
               gpu={"class": gpu_class})
    with pytest.raises(RenderError) as e:
        render(obj, classes, Settings(), assign(obj, classes))
    assert e.value.reason == reason and "compute capability" in e.value.message


def test_mig_slices_are_not_combined(classes):
    from triton_operator.planning import fit
    from triton_operator.api import GPUClassSpec
    mig = GPUClassSpec.model_validate({"productNames": ["NVIDIA-A100-SXM4-80GB"], "memoryGiB": 10,
                                       "memoryBandwidthTBps": 0.3, "computeCapability": "8.0",
                                       "resourceName": "nvidia.com/mig-1g.10gb"})
    model = isvc(model={"source": "hf://a/b", "format": "onnx"}).spec.model
    (problem,) = fit.problems(model, "a100-1g", mig, 2)
    assert problem.reason == "MIGSlicesCannotCombine" and "nvidia.com/mig-1g.10gb" in problem.message
    assert fit.problems(model, "a100-1g", mig, 1) == []


def test_a_claim_whose_name_is_longer_than_a_volume_name_gets_a_volume_named_by_its_digest(classes):
    """A PersistentVolumeClaim's name may have 253 characters, a volume's 63: "claim-" and a
    60-character claim made a Job the API server refused, and the model was never prepared."""
    long_claim = "c" * 60
    fp8 = {**FP8, "gpu": {"class": "h100", "count": 1},
           "engine": {"calibrationDataset": "pvc://datasets/calib/text"}, "model": {**FP8["model"],
                                                                                   "source": f"pvc://{long_claim}/llama"}}
    pod = _job(isvc(**fp8), classes)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    digest = "claim-" + hashlib.sha256(long_claim.encode()).hexdigest()[:16]
    assert volumes[digest]["persistentVolumeClaim"] == {"claimName": long_claim, "readOnly": True}
    assert volumes["claim-datasets"]["persistentVolumeClaim"]["claimName"] == "datasets"   # short names unchanged
    assert all(len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) for name in volumes)
    for container in (*pod["initContainers"], *pod["containers"]):
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes
    assert {"name": digest, "mountPath": f"/mnt/pvc/{long_claim}", "readOnly": True} in pod["containers"][0]["volumeMounts"]
