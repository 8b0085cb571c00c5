"""Planning (pure): the decisions made before anything is rendered. `assign` (the one entry: a
service's Assignment, which rendering writes out), `assignment` (the decisions as data: Option,
Candidates, Assignment), `fit` (does a model fit a GPU class, at what cost and decode speed bound),
`choice` (which classes a service may run on, and for class auto which one), `replicas` (how many
replicas a service wants), `placement` (spill-over: replicas per class and why), `capacity` (free
GPUs per class from the cluster's nodes and pods), `preparation` (the state of a model's
preparation per class) and `llm_performance` (the LLM performance model: a replica's throughput and
latency on a class)."""
