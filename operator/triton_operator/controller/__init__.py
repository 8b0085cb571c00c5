"""The controller: kopf handlers (start-up and clean-up), the manager that wires informers, queue
and workers over the `kube` floor, the reconcile pass, the read model over the store (`views`),
what is kept of each kind (`trim`), the operator's kinds and the GPUClass catalog. `status`,
`desired` and `series` are pure; the rest is the shell."""
