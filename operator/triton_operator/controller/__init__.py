"""The controller: watch-fed cache, work queue, reconcile, the Kubernetes edge, kopf handlers,
leader election and the GPUClass catalog. `status` and `desired` are pure; the rest is the shell."""
