#!/usr/bin/env python3
"""Ask a real API server what it says about every case in tests/admission_cases.yaml, and record
the answers in tests/admission_recorded.json (the unit tests compare the models with them).

    KUBECONFIG=... hack/record-admission.py          # the CRDs in crds/ must be installed

Each case goes as JSON, the way a Python client sends it (so 1.0 stays a float), as a server-side
dry run with fieldValidation=Strict (what kubectl does by default): nothing is stored.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import kubernetes
import urllib3
from kubernetes.client.rest import ApiException

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.admission_cases import GROUP, PLURALS, VERSION, case_document, load_cases  # noqa: E402

NAMESPACE = "default"


def main() -> int:
    kubernetes.config.load_kube_config()
    urllib3.disable_warnings()  # a local cluster's self-signed certificate
    api = kubernetes.client.CustomObjectsApi()
    recorded = {}
    for case in load_cases():
        doc = case_document(case)
        try:
            if doc["kind"] == "GPUClass":
                api.create_cluster_custom_object(GROUP, VERSION, PLURALS["GPUClass"], doc,
                                                 dry_run="All", field_validation="Strict")
            else:
                api.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURALS[doc["kind"]], doc,
                                                    dry_run="All", field_validation="Strict")
            recorded[case["name"]] = {"admitted": True}
        except ApiException as e:
            if e.status not in (400, 422):
                raise
            recorded[case["name"]] = {"admitted": False, "message": json.loads(e.body)["message"]}
        print(("admitted " if recorded[case["name"]]["admitted"] else "refused  ") + case["name"])
    out = ROOT / "tests" / "admission_recorded.json"
    out.write_text(json.dumps(recorded, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
