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


def test_rendered_restricted_api_flags_close_the_admin_apis_of_a_real_triton():
    """The flags the operator renders (render.RESTRICTED_ARGS, with $(TRITON_ADMIN_KEY) expanded
    as the kubelet would) make the real tritonserver refuse model control, shared memory,
    statistics, trace and logging without the pod's key, and keep inference, metadata, config and
    health open (the gateway and the probes need those)."""
    import json
    import urllib.error
    import urllib.request

    from triton_operator.render import ADMIN_HEADER, ADMIN_KEY_ENV, RESTRICTED_ARGS

    pod_uid = "4f7c5f8e-0d6a-4a53-9d1e-2b1f3c4d5e6f"
    flags = [a.replace(f"$({ADMIN_KEY_ENV})", pod_uid) for a in RESTRICTED_ARGS]

    def status(server, method, path, body=None, key=None):
        req = urllib.request.Request(server.http_url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        if key:
            req.add_header(ADMIN_HEADER, key)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status
        except urllib.error.HTTPError as e:
            return e.code

    with TritonServer(extra_args=flags) as server:
        admin = [("POST", "/v2/repository/index", {}), ("POST", "/v2/repository/models/slow/unload", {}),
                 ("GET", "/v2/systemsharedmemory/status", None), ("GET", "/v2/models/stats", None),
                 ("GET", "/v2/trace/setting", None), ("GET", "/v2/logging", None)]
        for method, path, body in admin:
            assert status(server, method, path, body) == 403, path
            assert status(server, method, path, body, key="wrong") == 403, path
        assert status(server, "POST", "/v2/repository/index", {}, key=pod_uid) == 200
        assert status(server, "GET", "/v2/models/stats", key=pod_uid) == 200
        for path in ("/v2/health/ready", "/v2/models/slow", "/v2/models/slow/config", "/v2/models/slow/ready"):
            assert status(server, "GET", path) == 200, path
        infer = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
        assert status(server, "POST", "/v2/models/slow/infer", infer) == 200
