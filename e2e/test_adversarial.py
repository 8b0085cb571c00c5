"""A few hundred hostile InferenceServices (the property suite's strategies, fixed seed) created
against the real API server with the operator running: every one admission accepts gets a status
with a reason for its generation within 60 s and deletes within 30 s; admission's refusals name
the field; the operator never prints a traceback and never exits (e2e/harness/adversarial.py)."""

from __future__ import annotations

import yaml

from triton_operator.kube.client import Kube

from .cluster import Operator
from .harness import adversarial


def admin_kube(kubeconfig: str) -> Kube:
    from kubernetes import client, config
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return Kube("e2e-adversary", configuration, qps=1000, burst=1000)


def test_hostile_specs_never_hang_an_object(operator: Operator, ns: str):
    docs = adversarial.generate(250)
    offset = operator.log_path.stat().st_size
    counts = adversarial.run(admin_kube(operator.cluster.kubeconfig), ns, docs,
                             lambda: operator.log_path.read_bytes()[offset:].decode(errors="replace"),
                             lambda: operator.proc is not None and operator.proc.poll() is None)
    print(adversarial.report(counts))
    assert counts.generated == 250
    assert counts.accepted >= 50 and counts.refused >= 50, "both sides of admission are exercised"
    assert counts.without_status == [], "every accepted spec reconciles or says why"
    assert counts.not_deleted == [], "every object deletes"
    assert counts.refusals_naming_nothing == [], "every refusal names the field"
    assert counts.tracebacks == 0 and counts.operator_alive
    assert yaml.safe_load(operator.cluster.kubectl("get", "infsvc", "-n", ns, "-o", "yaml").stdout)["items"] == []


def test_numbers_json_cannot_carry_are_sent_as_the_largest_json_numbers():
    """In process, no cluster. JSON has no NaN or infinity (json.dumps writes `NaN`, which the
    API server refuses as unparsable without naming a field, and kubectl refuses before sending):
    the generator sends them as +-1e308, still hostile. Which documents Hypothesis draws depends
    on the modules the process loaded, so `make test` drew infinities a lone run did not."""
    import json
    import math

    doc = {"spec": {"a": [math.nan, -math.inf, 1.5], "b": {"c": math.inf}, "d": "x"}}
    assert adversarial.json_numbers(doc) == {"spec": {"a": [1e308, -1e308, 1.5], "b": {"c": 1e308}, "d": "x"}}
    for d in adversarial.generate(250):
        json.dumps(d, allow_nan=False)   # raises on NaN or infinity
