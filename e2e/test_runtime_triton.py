"""runtime/'s model puller against a real Triton: `triton-runtime stage` lays out a Python-backend
model from a pvc:// source (a local folder stands in for the mounted claim), and the tritonserver
from the nvidia-pytriton wheel loads that repository and answers an inference through tritonclient.
(No GPU here: ONNX/TensorRT backends and TensorRT-LLM engines are not in the CPU wheel.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import tritonclient.http as httpclient

from .harness.triton import TritonServer, ensure_tritonserver

MODEL_PY = textwrap.dedent('''
    import site
    for d in {site_dirs!r}:
        site.addsitedir(d)
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32))]))
            return out
''')
CONFIG = '''name: "anything"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''


def test_staged_python_model_serves_inferences(tmp_path):
    site_dirs = [ensure_tritonserver()["SITE_PACKAGES"]]
    source = tmp_path / "pvc" / "model-store" / "doubler"
    source.mkdir(parents=True)
    (source / "model.py").write_text(MODEL_PY.format(site_dirs=site_dirs))
    (source / "config.pbtxt").write_text(CONFIG)
    repo = tmp_path / "repository"
    out = subprocess.run(
        [sys.executable, "-m", "triton_runtime.cli", "stage", "--source", "pvc://model-store/doubler",
         "--format", "python", "--model-name", "doubler", "--repository", str(repo), "--scratch", str(tmp_path)],
        capture_output=True, text=True, env={**os.environ, "TRITON_RUNTIME_PVC_ROOT": str(tmp_path / "pvc")})
    assert out.returncode == 0, out.stderr
    assert (repo / "doubler" / "1" / "model.py").exists()

    with TritonServer(model_name="doubler", repository=repo) as server:
        client = httpclient.InferenceServerClient(server.http_address)
        data = np.array([1.5, 2.0, -3.0], dtype=np.float32)
        inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        result = client.infer("doubler", [inp])
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), data * 2)
        assert client.get_model_metadata("doubler")["name"] == "doubler"


def test_stage_errors_are_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "triton_runtime.cli", "stage", "--source", "pvc://none/x",
                          "--format", "onnx", "--model-name", "m", "--repository", str(tmp_path / "r")],
                         capture_output=True, text=True,
                         env={**os.environ, "TRITON_RUNTIME_PVC_ROOT": str(tmp_path)})
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("triton-runtime stage: pvc://none/x:")
