"""What the baselines and the --policy parser share (pure): the error a bad --policy raises and
the per-pod figures an HPA or KEDA can scale on."""

from __future__ import annotations

from ..metrics_path import Sample


class PolicyError(ValueError):
    pass


# The per-pod figures a user can scale on (each a Prometheus series of the llm model, through
# prometheus-adapter for the HPA or a KEDA Prometheus trigger):
# - queue: requests waiting (triton_llm_queued_requests); 0 until a replica's batch is full;
# - inflight: requests inside the engine's batch (triton_llm_active_requests);
# - concurrency: both (what waits plus what runs: Knative's notion of concurrency);
# - occupancy: the batch's busy share in percent (inflight / maxBatchSize x 100), the way a
#   Utilization target reads.
METRICS = ("queue", "inflight", "occupancy", "concurrency")


def pod_metric(sample: Sample, metric: str, slots: float) -> float:
    if metric == "queue":
        return sample.pending
    if metric == "inflight":
        return float(sample.active)
    if metric == "concurrency":
        return sample.pending + sample.active
    return 100.0 * sample.active / slots
