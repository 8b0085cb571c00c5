"""The Kubernetes floor: domain-free plumbing every part of the operator stands on. `client` (one
lean HTTP client: reads, watches, server-side apply, status patches, Events), `store` (the
watch-fed store and its key), `informer` (list then watch into the store), `queue` (client-go's
work queue), `events` (what an Event says, and the series that aggregates repeats), `failures`
(bounded logging of repeated failures), `leader` (Lease election) and `standby` (a replica's
probes before it leads). Nothing here knows an InferenceService: the controller gives the client
its own kinds (`api.kinds`) and the store its owner index."""
