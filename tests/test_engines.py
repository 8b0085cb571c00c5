"""TensorRT-LLM engines on the operator side: build Jobs per GPU class, engine states from Jobs,
serving held back until the engine exists, and the conditions users see."""

from __future__ import annotations

from datetime import datetime, timezone

from triton_operator.planning import engines
from triton_operator.conditions import find
from triton_operator.render import engine_jobs, render
from triton_operator.settings import Settings
from triton_operator.controller.status import Observed, compute

from .conftest import isvc

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
LLM = {"model": {"source": "hf://meta/llama", "format": "tensorrt-llm", "parameters": "8B", "precision": "fp16"},
       "gpu": {"class": "h100", "count": 2, "fallbackClasses": ["a100-80gb"]}}


def job(name: str, cond: str | None = None, reason: str = "", message: str = "", active: int = 0) -> dict:
    status = {"active": active}
    if cond:
        status["conditions"] = [{"type": cond, "status": "True", "reason": reason, "message": message}]
    return {"metadata": {"name": name}, "status": status}


def test_one_build_job_per_usable_class_on_nodes_of_that_class(classes):
    jobs = engine_jobs(isvc(**LLM), classes, Settings())
    assert [j["metadata"]["labels"]["serving.triton-operator.io/gpu-class"] for j in jobs] == ["h100", "a100-80gb"]
    h100 = jobs[0]["spec"]["template"]["spec"]
    assert h100["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"][0]["values"][0] == "NVIDIA-H100-80GB-HBM3"
    build = h100["containers"][0]
    assert build["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert build["args"][:2] == ["triton-runtime", "build-engine"]
    assert build["args"][build["args"].index("--compute-capability") + 1] == "9.0"
    assert jobs[1]["spec"]["template"]["spec"]["containers"][0]["args"][
        jobs[1]["spec"]["template"]["spec"]["containers"][0]["args"].index("--compute-capability") + 1] == "8.0"
    assert {"name": "engines", "persistentVolumeClaim": {"claimName": "trtllm-engines"}} in h100["volumes"]


def test_classes_that_cannot_run_the_model_get_no_job(classes):
    fp8 = isvc(**{**LLM, "model": {**LLM["model"], "precision": "fp8"}})
    assert [j["metadata"]["labels"]["serving.triton-operator.io/gpu-class"]
            for j in engine_jobs(fp8, classes, Settings())] == ["h100"]  # no FP8 on A100


def test_job_names_change_with_the_spec_and_are_never_edited(classes):
    a = engine_jobs(isvc(**LLM), classes, Settings())[0]["metadata"]["name"]
    b = engine_jobs(isvc(**LLM, engine={"maxBatchSize": 128}), classes, Settings())[0]["metadata"]["name"]
    assert a != b and a.startswith("demo-") and len(a) <= 63
    assert engine_jobs(isvc(**LLM), classes, Settings())[0]["metadata"]["name"] == a
    assert engine_jobs(isvc(), classes, Settings()) == []  # onnx: no engine


def test_serving_is_held_until_the_engine_of_its_class_is_ready(classes):
    obj = isvc(**LLM)
    held = render(obj, classes, Settings(), engines_ready={"a100-80gb"}).by_kind("Deployment")
    assert held["spec"]["replicas"] == 0
    ready = render(obj, classes, Settings(), engines_ready={"h100"}).by_kind("Deployment")
    assert ready["spec"]["replicas"] == 2
    pod = ready["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["doctor", "make-repository"]
    assert "command" not in pod["containers"][0]
    assert pod["containers"][0]["args"][:6] == ["triton-runtime", "serve", "--repository", "/models", "--world-size", "2"]
    assert {"name": "engines", "mountPath": "/engines", "readOnly": True} in pod["containers"][0]["volumeMounts"]


def test_engine_states_from_jobs():
    rendered = [{"metadata": {"name": n, "labels": {"serving.triton-operator.io/gpu-class": c}}}
                for n, c in (("j-h100", "h100"), ("j-a100", "a100-80gb"), ("j-l4", "l4"))]
    observed = [job("j-h100", "Complete"),
                job("j-a100", "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
                job("old", "Complete")]
    out = {e["gpuClass"]: e for e in engines.states(rendered, observed, [])}
    assert out["h100"]["phase"] == "Ready"
    assert out["a100-80gb"]["phase"] == "Failed"
    assert "BackoffLimitExceeded: Job has reached the specified backoff limit" in out["a100-80gb"]["message"]
    assert out["l4"]["phase"] == "Building" and "waiting for a l4 node" in out["l4"]["message"]
    # A Job deleted after success: status remembers, nothing is rebuilt or held.
    again = engines.states(rendered[:1], [], [out["h100"]])
    assert again[0]["phase"] == "Ready"


def _status(phase: str, dep=None, message="m"):
    obs = Observed(desired_replicas=2, gpu_class="h100", gpu_count=2, deployment=dep,
                   engines=[{"gpuClass": "h100", "phase": phase, "job": "j", "message": message}])
    status, events = compute(isvc(**LLM), obs, NOW)
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}, status, events


def test_conditions_while_building_ready_and_failed():
    empty = {"metadata": {"generation": 1}, "spec": {"replicas": 0},
             "status": {"observedGeneration": 1, "replicas": 0}}
    conds, status, events = _status("Building", empty)
    assert conds["Ready"] == ("False", "EngineBuilding") and conds["EngineReady"] == ("False", "EngineBuilding")
    assert conds["Progressing"] == ("True", "EngineBuilding") and conds["Degraded"][0] == "False"
    assert status["engines"][0]["phase"] == "Building"
    assert ("Normal", "EngineBuilding") in [(e.type, e.reason) for e in events]

    conds, _, events = _status("Failed", empty, "build Job j failed: BackoffLimitExceeded")
    assert conds["Ready"] == ("False", "EngineFailed") and conds["Degraded"] == ("True", "EngineFailed")
    assert conds["Progressing"][0] == "False"
    assert ("Warning", "EngineFailed") in [(e.type, e.reason) for e in events]

    serving = {"metadata": {"generation": 2}, "spec": {"replicas": 2},
               "status": {"observedGeneration": 2, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
                          "availableReplicas": 2}}
    conds, _, _ = _status("Ready", serving)
    assert conds["Ready"] == ("True", "Serving") and conds["EngineReady"] == ("True", "EngineReady")
    # A new engine building while the old one serves: still Ready, and Progressing says why.
    conds, _, _ = _status("Building", serving)
    assert conds["Ready"] == ("True", "Serving") and conds["Progressing"] == ("True", "EngineBuilding")


def test_onnx_services_have_no_engine_condition(classes):
    status, _ = compute(isvc(), Observed(desired_replicas=1, gpu_class="h100"), NOW)
    assert find(status["conditions"], "EngineReady") is None and "engines" not in status


def _build_pod(obj, classes, settings=None):
    return engine_jobs(obj, classes, settings or Settings())[0]


def test_build_jobs_run_the_doctor_first_and_fail_at_once_on_what_retries_cannot_fix(classes):
    job = _build_pod(isvc(**LLM), classes)
    pod = job["spec"]["template"]["spec"]
    (doctor,) = pod["initContainers"]
    (build,) = pod["containers"]
    assert doctor["args"][:4] == ["triton-runtime", "doctor", "--for", "build"]
    assert doctor["args"][doctor["args"].index("--gpus") + 1] == "2"
    assert doctor["resources"] == build["resources"] and doctor["volumeMounts"] == build["volumeMounts"]
    assert doctor["env"] == build["env"] and doctor.get("envFrom") == build.get("envFrom")  # it sizes the source
    # runtime/triton_runtime: cli.EXIT_SPEC (2) and doctor.PROBLEMS_EXIT (3) never fix themselves.
    from triton_runtime import cli, doctor as runtime_doctor
    (fail, ignore) = job["spec"]["podFailurePolicy"]["rules"]
    assert fail == {"action": "FailJob", "onExitCodes": {"operator": "In",
                                                         "values": [cli.EXIT_SPEC, runtime_doctor.PROBLEMS_EXIT]}}
    assert ignore["action"] == "Ignore" and ignore["onPodConditions"][0]["type"] == "DisruptionTarget"
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it


def test_build_jobs_have_their_own_resources_not_the_serving_ones(classes):
    """Serving limits (e.g. 128Gi for a 70B server) must not cap a build that holds the whole
    checkpoint in host memory; the build's requests follow the model size (api: engine.buildResources)."""
    serving = {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "128Gi"}}
    seventy = {**LLM, "model": {**LLM["model"], "parameters": "70B", "precision": "fp8"},
               "gpu": {"class": "h200", "count": 2}, "server": {"resources": serving}}
    build = _build_pod(isvc(**seventy), classes)["spec"]["template"]["spec"]["containers"][0]
    # cpu 2+2N; memory 70e9 x 2 bytes x 1.25 = 163 GiB; scratch (2+1) x 70 GB x 1.2 + 10 GiB = 245 GiB
    assert build["resources"] == {
        "requests": {"cpu": "6", "memory": "163Gi", "ephemeral-storage": "245Gi", "nvidia.com/gpu": "2"},
        "limits": {"nvidia.com/gpu": "2"}}
    small = {**LLM, "model": {**LLM["model"], "parameters": "1B"}, "gpu": {"class": "h100"}}
    assert _build_pod(isvc(**small), classes)["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"][
        "memory"] == "16Gi"  # the floor
    chosen = {**seventy, "engine": {"buildResources": {"requests": {"memory": "300Gi", "ephemeral-storage": "400Gi"},
                                                       "limits": {"memory": "350Gi"}}}}
    job = _build_pod(isvc(**chosen), classes)["spec"]["template"]["spec"]
    assert job["containers"][0]["resources"] == {
        "requests": {"cpu": "6", "memory": "300Gi", "ephemeral-storage": "400Gi", "nvidia.com/gpu": "2"},
        "limits": {"memory": "350Gi", "nvidia.com/gpu": "2"}}
    scratch = next(v for v in job["volumes"] if v["name"] == "scratch")
    assert scratch == {"name": "scratch", "emptyDir": {"sizeLimit": "400Gi"}}  # the doctor checks against it too
    doctor_args = job["initContainers"][0]["args"]
    assert doctor_args[doctor_args.index("--scratch-size") + 1] == "400Gi"


def test_a_build_of_unknown_size_gets_a_default_and_an_unbounded_scratch(classes):
    unknown = {**LLM, "model": {k: v for k, v in LLM["model"].items() if k != "parameters"}}
    pod = _build_pod(isvc(**unknown), classes)["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "6", "memory": "32Gi", "nvidia.com/gpu": "2"}
    assert {"name": "scratch", "emptyDir": {}} in pod["volumes"]
    assert "--scratch-size" not in pod["initContainers"][0]["args"]


def test_build_home_and_caches_live_on_the_scratch_volume(classes):
    """uid 1000 has no home in the NGC image (Triton server v2.54.0 build.py: useradd without -m),
    and quantize.py's calibration download goes to HF_DATASETS_CACHE: on scratch, it is counted."""
    build = _build_pod(isvc(**LLM), classes)["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in build["env"]}
    assert set(env) == {"HOME", "XDG_CACHE_HOME", "HF_HOME", "HF_DATASETS_CACHE", "TORCH_EXTENSIONS_DIR"}
    assert all(v.startswith("/scratch/home") for v in env.values())
    assert {"name": "scratch", "mountPath": "/scratch"} in build["volumeMounts"]


def test_calibration_dataset_reaches_the_build_and_its_claim_is_mounted(classes):
    fp8 = {**LLM, "model": {**LLM["model"], "precision": "fp8"}, "gpu": {"class": "h100", "count": 1},
           "engine": {"calibrationDataset": "pvc://datasets/calib/text"}}
    jobs = engine_jobs(isvc(**fp8), classes, Settings())
    pod = jobs[0]["spec"]["template"]["spec"]
    for container in (pod["initContainers"][0], pod["containers"][0]):
        args = container["args"]
        assert args[args.index("--calibration-dataset") + 1] == "pvc://datasets/calib/text"
        assert {"name": "claim-datasets", "mountPath": "/mnt/pvc/datasets", "readOnly": True} in container["volumeMounts"]
    assert {"name": "claim-datasets", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}} in pod["volumes"]
    # The calibration set changes the engine: a new Job, and make-repository names the same key.
    plain = engine_jobs(isvc(**{**fp8, "engine": {}}), classes, Settings())
    assert jobs[0]["metadata"]["name"] != plain[0]["metadata"]["name"]
    dep = render(isvc(**fp8), classes, Settings()).by_kind("Deployment")
    make_repository = dep["spec"]["template"]["spec"]["initContainers"][1]["args"]
    assert make_repository[make_repository.index("--calibration-dataset") + 1] == "pvc://datasets/calib/text"
