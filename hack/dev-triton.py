"""`make dev`'s serving stand-in: a real Triton (CPU build, nvidia-pytriton wheel) serving the
`llm` model that LLM services run, with its llama.cpp engine on SmolLM2-135M-Instruct
(e2e/harness/llm.py), and the EndpointSlice that points the InferenceService at it while its
(kwok-simulated) Deployment has a ready replica. kwok pods cannot serve and the API server
refuses loopback IPs in EndpointSlices, so the slice names the host triton.dev.invalid, which
hack/dev.sh tells the gateway is 127.0.0.1 (--resolve), and carries the label the gateway is
told to route by (--endpoint-slice-selector).

    python hack/dev-triton.py STATE_DIR NAMESPACE SERVICE    # runs until SIGTERM
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2e.harness.llm import LLMTriton  # noqa: E402

HOST = "triton.dev.invalid"
MANAGER = "dev.triton-operator.io"


def kubectl(*args: str, input: str | None = None) -> str:
    return subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, timeout=30).stdout


def main() -> int:
    state, namespace, service = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    triton = LLMTriton(log_dir=state)
    triton.start()
    (state / "triton.port").write_text(str(triton.http_port))
    applied = None
    try:
        while not stop.wait(1.0):
            out = kubectl("get", "deployment", service, "-n", namespace, "-o", "jsonpath={.status.readyReplicas}")
            ready = int(out or 0)
            if ready == applied:
                continue
            body = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": f"{service}-dev", "namespace": namespace, "labels": {
                        "kubernetes.io/service-name": service, "endpointslice.kubernetes.io/managed-by": MANAGER}},
                    "addressType": "FQDN", "ports": [{"name": "http", "port": triton.http_port, "protocol": "TCP"}],
                    "endpoints": [{"addresses": [HOST], "conditions": {"ready": True}}] if ready else []}
            kubectl("apply", "-f", "-", input=json.dumps(body))
            applied = ready
    finally:
        triton.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
