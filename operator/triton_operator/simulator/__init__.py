"""A trace-driven simulator of autoscaling (pure, seeded, deterministic): workloads, a model of
Triton + TensorRT-LLM replicas with cold starts, the metrics path (Triton summaries, Prometheus
scrapes, outages), the baselines users would otherwise pick (HPA, KEDA, Knative KPA), an oracle,
and the operator's own policy through the very `decide` the live loop calls.

`report_files` (report.md, plots, CSV) and `simulate_command` (the CLI shell) do I/O; everything else
here is pure."""
