"""Autoscaling: the pure policy (`policy`), the live tick (`loop`) and Triton's metrics read from
Prometheus (`prometheus`). The simulator calls the same `policy.decide` as the live loop."""
