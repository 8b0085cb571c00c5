"""triton-runtime doctor's checks, driven with the values its probes would read. The probes
themselves (NVML, statvfs, the package metadata) run for real in test_runtime_build.py; here a
GPU count and a source listing are given because this machine has no GPU and no network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from triton_runtime import doctor
from triton_runtime.fetch import FetchError, SourceUnavailable
from triton_runtime.spec import EngineSpec

GIB = 1024**3
SPEC = EngineSpec(source="hf://meta-llama/Meta-Llama-3-8B-Instruct", precision="fp8", compute_capability="9.0")
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


def test_download_size_leaves_out_meta_originals_and_scratch_need_counts_the_converted_checkpoint():
    sizes = doctor.sizes(LLAMA3_8B, remote=True)
    weights = sum(v for k, v in LLAMA3_8B.items() if k.endswith(".safetensors"))
    assert sizes.weights == weights
    assert weights < sizes.download < weights + 10_000_000  # + config and tokenizer, no .pth
    scratch, cache = doctor.needs(sizes, "fp8")
    assert cache == pytest.approx(weights / 2)  # fp8: one byte per parameter of a 16-bit checkpoint
    assert scratch == pytest.approx(sizes.download + weights / 2)
    on_claim = doctor.sizes(LLAMA3_8B, remote=False)  # pvc:// is read in place: nothing downloaded
    assert doctor.needs(on_claim, "fp16") == (pytest.approx(weights), pytest.approx(weights))


def test_space_is_the_smaller_of_free_disk_and_the_volume_limit(tmp_path):
    assert doctor.check_space("scratch", tmp_path, 20 * GIB, 500 * GIB, "advice", limit=30 * GIB) == []
    (line,) = doctor.check_space("scratch", tmp_path, 40 * GIB, 500 * GIB, "do this", limit=30 * GIB)
    assert "30.0 GiB free (volume limit 30.0 GiB), about 40.0 GiB needed: do this" in line
    (line,) = doctor.check_space("engine cache", tmp_path, 40 * GIB, 10 * GIB, "grow it")
    assert line.startswith(f"engine cache {tmp_path} has 10.0 GiB free")


def test_examples_must_hold_the_converter_the_precision_needs(tmp_path):
    found = doctor.check_examples(tmp_path / "none", "fp16", on_path=lambda _: None)
    assert "TensorRT-LLM examples not found" in found[0] and "trtllm-build is not on PATH" in found[1]
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "convert_checkpoint.py").write_text("")
    assert doctor.check_examples(tmp_path, "fp16", on_path=lambda _: "/usr/bin/trtllm-build") == []
    assert "quantization/quantize.py not found: precision fp8" in doctor.check_examples(
        tmp_path, "fp8", on_path=lambda _: "/usr/bin/trtllm-build")[0]


def test_engine_check_finds_the_engine_of_this_version(tmp_path):
    assert "no engine" in doctor.check_engine(tmp_path, SPEC, "0.17.0")[0]
    folder = tmp_path / SPEC.key("0.17.0")
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"spec": SPEC.fields(), "trtllm_version": "0.17.0"}))
    assert doctor.check_engine(tmp_path, SPEC, "0.17.0") == []
    assert "built with TensorRT-LLM 0.17.0 but this image has 0.18.0" in doctor.check_engine(tmp_path, SPEC, "0.18.0")[0]


@pytest.mark.parametrize("text, value", [("40Gi", 40 * GIB), ("500M", 500_000_000), ("1.5Ti", int(1.5 * 2**40)),
                                         ("1024", 1024)])
def test_quantities(text, value):
    assert doctor.parse_quantity(text) == value


def _build_request(tmp_path, **changes) -> doctor.Request:
    return doctor.Request(mode="build", spec=SPEC, cache_dir=tmp_path / "engines", gpus=1,
                          scratch=tmp_path / "scratch", trtllm_version="0.17.0", **changes)


def _environ(tmp_path) -> dict[str, str]:
    from triton_runtime import image
    return {**image.cache_environment(str(tmp_path / "home")), image.EXAMPLES_ENV: str(tmp_path / "examples")}


def test_build_checks_put_together(tmp_path, monkeypatch):
    (tmp_path / "examples" / "quantization").mkdir(parents=True)
    (tmp_path / "examples" / "quantization" / "quantize.py").write_text("")
    monkeypatch.setattr(doctor.shutil, "which", lambda name: f"/usr/local/bin/{name}")
    report = doctor.run(_build_request(tmp_path, scratch_limit=20 * GIB), _environ(tmp_path),
                        gpu_probe=lambda env: (1, "NVML counts 1"), list_source=lambda *a: LLAMA3_8B,
                        free_space=lambda path: 500 * GIB)
    # 8B at fp8: about 15 GiB downloaded plus 7.5 GiB converted do not fit a 20 GiB scratch volume.
    assert len(report.problems) == 1 and report.problems[0].startswith(f"scratch {tmp_path / 'scratch'} has 20.0 GiB")
    assert "raise spec.engine.buildResources.requests.ephemeral-storage" in report.problems[0]
    assert {"engine cache writable", "scratch writable", "1 GPU(s) visible"} <= set(report.passed)

    fits = doctor.run(_build_request(tmp_path, scratch_limit=40 * GIB), _environ(tmp_path),
                      gpu_probe=lambda env: (1, ""), list_source=lambda *a: LLAMA3_8B,
                      free_space=lambda path: 500 * GIB)
    assert fits.problems == [] and any(p.startswith("disk: 22.") for p in fits.passed)


@pytest.mark.parametrize("error, problem", [
    (SourceUnavailable("hf://x/y: ConnectionError: timed out"), False),  # retried by the build: a warning
    (FetchError("hf://x/y: access refused (401: gated)"), True),         # a retry fails the same way
])
def test_a_source_the_doctor_cannot_size(tmp_path, monkeypatch, error, problem):
    (tmp_path / "examples" / "quantization").mkdir(parents=True)
    (tmp_path / "examples" / "quantization" / "quantize.py").write_text("")
    monkeypatch.setattr(doctor.shutil, "which", lambda name: f"/usr/local/bin/{name}")

    def listing(*_):
        raise error

    report = doctor.run(_build_request(tmp_path), _environ(tmp_path), gpu_probe=lambda env: (1, ""),
                        list_source=listing)
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
