"""triton-runtime doctor's checks, driven with the values its probes would read. The probes
themselves (NVML, statvfs, the package metadata) run for real in test_runtime_build.py; here a
GPU count and a source listing are given because this machine has no GPU and no network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from triton_runtime import doctor, image
from triton_runtime.fetch import FetchError, MissingLibrary, SourceUnavailable
from triton_runtime.prepare import Preparation
from triton_runtime.quantity import quantity_bytes

GIB = 1024**3
SPEC = Preparation(source="hf://meta-llama/Meta-Llama-3-8B-Instruct", precision="fp8", trtllm_version="1.2.1")
# The files of hf://meta-llama/Meta-Llama-3-8B-Instruct (sizes rounded), original/ included.
LLAMA3_8B = {
    "config.json": 654, "generation_config.json": 187, "model.safetensors.index.json": 23950,
    "model-00001-of-00004.safetensors": 4_976_698_672, "model-00002-of-00004.safetensors": 4_999_802_720,
    "model-00003-of-00004.safetensors": 4_915_916_176, "model-00004-of-00004.safetensors": 1_168_138_808,
    "special_tokens_map.json": 73, "tokenizer.json": 9_085_657, "tokenizer_config.json": 50_977,
    "original/consolidated.00.pth": 16_060_617_592, "original/params.json": 211,
    "original/tokenizer.model": 2_183_982, "LICENSE": 7801, "README.md": 37_000, "USE_POLICY.md": 4696,
}


@pytest.mark.parametrize("visible, expected, words", [
    (0, 1, "no GPU visible (probe says why); 1 expected"),
    (1, 2, "1 GPU(s) visible, 2 expected (gpu.count)"),
    (2, 2, None), (8, 2, None),  # more than asked is not this pod's problem
])
def test_gpu_count(visible, expected, words):
    found = doctor.check_gpus(expected, visible, "probe says why")
    assert found == ([] if words is None else found) and (words is None or words in found[0])


def test_download_size_leaves_out_meta_originals_and_the_cache_holds_the_quantized_checkpoint():
    sizes = doctor.sizes(LLAMA3_8B, remote=True)
    weights = sum(v for k, v in LLAMA3_8B.items() if k.endswith(".safetensors"))
    assert sizes.weights == weights
    assert weights < sizes.download < weights + 10_000_000  # + config and tokenizer, no .pth
    scratch, cache = doctor.needs(sizes, "fp8")
    assert cache == pytest.approx(weights / 2)  # fp8: one byte per parameter of a 16-bit checkpoint
    assert scratch == pytest.approx(sizes.download)
    on_claim = doctor.sizes(LLAMA3_8B, remote=False)  # pvc:// is read in place: nothing downloaded
    assert doctor.needs(on_claim, "bf16") == (0, pytest.approx(weights))


def test_space_is_the_smaller_of_free_disk_and_the_volume_limit(tmp_path):
    assert doctor.check_space("scratch", tmp_path, 20 * GIB, 500 * GIB, "advice", limit=30 * GIB) == []
    (line,) = doctor.check_space("scratch", tmp_path, 40 * GIB, 500 * GIB, "do this", limit=30 * GIB)
    assert "30.0 GiB free (volume limit 30.0 GiB), about 40.0 GiB needed: do this" in line
    (line,) = doctor.check_space("model cache", tmp_path, 40 * GIB, 10 * GIB, "grow it")
    assert line.startswith(f"model cache {tmp_path} has 10.0 GiB free")


def test_the_prepared_model_of_this_version_is_found(tmp_path):
    assert f"no prepared model {SPEC.key()} in {tmp_path}" in doctor.check_prepared(tmp_path, SPEC, "1.2.1")[0]
    folder = tmp_path / SPEC.key()
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"source": SPEC.source, "trtllm_version": "1.2.1"}))
    assert doctor.check_prepared(tmp_path, SPEC, "1.2.1") == []
    (line,) = doctor.check_prepared(tmp_path, SPEC, "1.3.0")
    assert "this image has TensorRT-LLM 1.3.0 but the model was prepared for 1.2.1" in line


@pytest.mark.parametrize("installed", ["1.2.1.2510", "1.2.1", "v1.2.1", "1.2.1.post1", "1.2.1+cu131"])
def test_an_image_reporting_a_build_of_the_same_release_passes(tmp_path, installed):
    """NGC images report TensorRT-LLM with a build or local tag after the release; the model
    prepared for that release is the one to serve."""
    folder = tmp_path / SPEC.key()
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"source": SPEC.source, "trtllm_version": "1.2.1"}))
    assert doctor.check_prepared(tmp_path, SPEC, installed) == []


@pytest.mark.parametrize("installed, expected, same", [
    ("1.0.3.2510", "1.0.3", True), ("1.2.0rc2.post1", "1.2.0", True), ("1.2", "1.2.0", True),
    ("1.2.1.2510", "1.2.0", False), ("1.3.0", "1.2.1", False), ("2.1.1", "1.2.1", False),
    ("nightly", "nightly", True), ("nightly", "1.2.1", False)])
def test_versions_are_compared_by_release(installed, expected, same):
    assert image.same_release(installed, expected) is same


@pytest.mark.parametrize("driver, warned", [("590.44.01", False), ("595.10", False), ("580.65.06", True), (None, False)])
def test_an_older_driver_is_a_warning_naming_forward_compatibility(driver, warned):
    found = doctor.check_driver(driver, "590.44.01")
    assert bool(found) is warned
    if warned:
        assert f"NVIDIA driver {driver} is older than the 590.44.01" in found[0] and "forward compatibility" in found[0]


@pytest.mark.parametrize("text, value", [("40Gi", 40 * GIB), ("500M", 500_000_000), ("1.5Ti", int(1.5 * 2**40)),
                                         ("1024", 1024)])
def test_quantities(text, value):
    assert quantity_bytes(text) == value


def _request(tmp_path, **changes) -> doctor.Checkup:
    return doctor.Checkup(mode="prepare", preparation=SPEC, cache_dir=tmp_path / "models", gpus=1,
                          scratch=tmp_path / "scratch", trtllm_version="1.2.1", **changes)


def _environ(tmp_path) -> dict[str, str]:
    from triton_runtime import image
    return image.cache_environment(str(tmp_path / "home"))


def test_preparation_checks_put_together(tmp_path):
    report = doctor.run(_request(tmp_path, scratch_limit=10 * GIB), _environ(tmp_path),
                        gpu_probe=lambda env: (1, "NVML counts 1"), list_source=lambda *a: LLAMA3_8B,
                        free_space=lambda path: 500 * GIB, driver_probe=lambda: "580.65.06")
    # 8B: about 15 GiB downloaded do not fit a 10 GiB scratch volume.
    assert len(report.problems) == 1 and report.problems[0].startswith(f"scratch {tmp_path / 'scratch'} has 10.0 GiB")
    assert "raise spec.engine.buildResources.requests.ephemeral-storage" in report.problems[0]
    assert {"model cache writable", "scratch writable", "1 GPU(s) visible", "TensorRT-LLM 1.2.1"} <= set(report.passed)
    assert len(report.warnings) == 1 and "580.65.06" in report.warnings[0]

    fits = doctor.run(_request(tmp_path, scratch_limit=40 * GIB), _environ(tmp_path),
                      gpu_probe=lambda env: (1, ""), list_source=lambda *a: LLAMA3_8B,
                      free_space=lambda path: 500 * GIB, driver_probe=lambda: "590.44.01")
    assert fits.problems == [] and fits.warnings == [] and "disk: 15.0 GiB scratch, 7.5 GiB cache needed" in fits.passed


def test_a_download_only_preparation_needs_neither_gpu_nor_tensorrt_llm(tmp_path):
    plain = Preparation(source=SPEC.source, precision="bf16", trtllm_version="1.2.1")
    report = doctor.run(doctor.Checkup(mode="prepare", preparation=plain, cache_dir=tmp_path / "models", gpus=0,
                                       scratch=tmp_path / "scratch", trtllm_version=None),
                        _environ(tmp_path), gpu_probe=lambda env: (0, "none"), list_source=lambda *a: LLAMA3_8B,
                        free_space=lambda path: 500 * GIB)
    assert report.problems == [] and not any("GPU" in p for p in report.passed)


@pytest.mark.parametrize("error, problem", [
    (SourceUnavailable("hf://x/y: ConnectionError: timed out"), False),  # retried by the Job: a warning
    (FetchError("hf://x/y: access refused (401: gated)"), True),         # a retry fails the same way
])
def test_a_source_the_doctor_cannot_size(tmp_path, error, problem):
    def listing(*_):
        raise error

    report = doctor.run(_request(tmp_path), _environ(tmp_path), gpu_probe=lambda env: (1, ""),
                        list_source=listing, driver_probe=lambda: None)
    assert (report.problems == [str(error)]) is problem
    assert (report.warnings == [f"could not size the checkpoint, disk not checked: {error}"]) is not problem


def test_termination_message_only_where_the_kubelet_mounted_it(tmp_path):
    assert doctor.write_termination_message(["a"], tmp_path / "absent") is False
    assert not (tmp_path / "absent").exists()
    log = tmp_path / "termination-log"
    log.write_text("")
    assert doctor.write_termination_message(["x" * 5000], log) is True
    assert len(log.read_bytes()) == doctor.TERMINATION_LOG_LIMIT


def test_the_operator_and_the_runtime_name_the_same_cache_variables():
    """render/runtime.py sets them, runtime/triton_runtime/image.py checks them."""
    from triton_operator.render import runtime as rendered
    from triton_runtime import image
    home = "/home/triton-server"
    assert {e["name"]: e["value"] for e in rendered.cache_environment(home)} == image.cache_environment(home)
    assert Path(rendered.BUILD_HOME).parent == Path(rendered.SCRATCH_ROOT)


def test_an_image_without_the_sources_client_leaves_the_disk_to_the_download_step(tmp_path):
    """NVIDIA's image has no boto3: its doctor says the download step (the operator's image) checks the disk."""
    def listing(*_):
        raise MissingLibrary("s3:// needs the boto3 package in this image")

    report = doctor.run(_request(tmp_path), _environ(tmp_path), gpu_probe=lambda env: (1, ""),
                        list_source=listing, driver_probe=lambda: None)
    assert report.problems == []
    assert report.warnings == ["disk not checked here (s3:// needs the boto3 package in this image): the download "
                               "step, in the operator's image, checks it"]


@pytest.mark.parametrize("installed, code", [("1.3.0", 2), ("1.2.1.2510", 0)])
def test_prepare_refuses_another_release_but_not_a_build_of_the_same(tmp_path, monkeypatch, capsys, installed, code):
    """Quantizing needs the release the service expects; a build tag after it is the same release."""
    from triton_runtime import cli, prepare

    monkeypatch.setattr(image, "trtllm_version", lambda: installed)
    monkeypatch.setattr(prepare, "run", lambda req, cache_dir, scratch, downloaded: cache_dir / req.key())
    assert cli.main(["prepare", "--source", SPEC.source, "--precision", "fp8", "--trtllm-version", "1.2.1",
                     "--cache", str(tmp_path)]) == code
    out, err = capsys.readouterr()
    if code:
        assert err.strip() == ("triton-runtime prepare: this image has TensorRT-LLM 1.3.0, the service expects "
                               "1.2.1: set the operator's trtllmVersion to match its llmImage")
    else:
        assert out.startswith("model prepared: ")


def test_a_group_pod_needs_ssh_and_mpi_and_is_warned_of_small_shm_and_no_infiniband():
    from triton_runtime.doctor import GROUP_PROGRAMS, check_group
    everything = {path: f"/usr/bin/{name}" for name, path in GROUP_PROGRAMS.items()}
    ok = check_group(everything.get, 64 * 2**30, ["mlx5_0", "mlx5_1"])
    assert ok.problems == [] and ok.warnings == []
    assert ok.passed == ["SSH and MPI programs present", "InfiniBand devices: mlx5_0, mlx5_1"]
    stock = {k: v for k, v in everything.items() if k != "/usr/sbin/sshd"}
    bare = check_group(stock.get, 64 * 2**20, [])
    assert bare.problems == [
        "the image lacks sshd: a replica across nodes starts MPI over SSH (an SSH server on each worker, mpirun and "
        "TensorRT-LLM's trtllm-llmapi-launch on the leader); serve from an image that adds them (spec.server.image, "
        "e.g. the stock image with openssh-server installed)"]
    assert [w.split(":")[0] for w in bare.warnings] == ["/dev/shm holds 0.1 GiB", "no InfiniBand device visible (/sys/class/infiniband)"]


def test_the_doctor_checks_a_group_only_where_a_replica_spans_nodes(tmp_path, monkeypatch):
    from triton_runtime import doctor
    monkeypatch.setattr(doctor, "check_group", lambda *a: doctor.Report(problems=["group checked"]))
    base = dict(mode="serve", preparation=None, cache_dir=tmp_path, gpus=0, trtllm_version="1.2.1")
    monkeypatch.setattr(doctor, "check_prepared", lambda *a: [])
    assert "group checked" not in doctor.run(doctor.Checkup(**base), environ={}).problems
    assert "group checked" in doctor.run(doctor.Checkup(**base, nodes=2), environ={}).problems
