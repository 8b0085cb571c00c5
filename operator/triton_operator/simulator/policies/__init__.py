"""Autoscaling policies the simulator can run (pure), one module each:

- ours.py: the operator's own policy, through the very `decide` the live loop calls;
- hpa.py, keda.py, knative.py: the baselines users would otherwise pick (Kubernetes HPA, KEDA,
  Knative's KPA), with the upstream defaults for the settings left out;
- fixed.py: a fixed pool; oracle.py: the plan with foresight, the reference for GPU-hours;
- parse.py: the --policy text as users write it; runner.py: from it to a simulated run;
- common.py: what they share (PolicyError, the per-pod metrics a baseline scales on).

This face re-exports what the simulator's command, the benchmarks and the tests use.
"""

from .common import PolicyError, pod_metric
from .fixed import Fixed
from .hpa import HPA, HPABehavior, hpa_pods_metric
from .keda import KEDA
from .knative import KPA
from .oracle import saturated_throughput
from .ours import LIVE_TICK_S, Ours, live_signals
from .parse import PolicySpec, check_min_replicas, parse_policy
from .runner import build_policy, run_policy, warm_start

__all__ = [
    "HPA", "KEDA", "KPA", "LIVE_TICK_S", "Fixed", "HPABehavior", "Ours", "PolicyError", "PolicySpec",
    "build_policy", "check_min_replicas", "hpa_pods_metric", "live_signals", "parse_policy", "pod_metric",
    "run_policy", "saturated_throughput", "warm_start",
]
