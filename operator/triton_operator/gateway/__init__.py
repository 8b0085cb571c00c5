"""The front door: an OpenAI-compatible gateway in front of the InferenceServices.

`triton-operator gateway` serves
- the OpenAI routes (GET /v1/models, POST /v1/chat/completions, /v1/completions and /v1/responses, streaming or
  not), translated to Triton's generate / generate_stream endpoints of the service's model;
- the KServe v2 routes (/v2/models/NAME/...), passed through for every model format;
behind API keys bound to namespaces or services, with a per-key rate limit. Requests go to the
ready replica with the fewest requests in flight; a request to a service scaled to zero is held
(bounded, with a timeout) while the held-request gauge asks the autoscaler for a replica.

Why aiohttp (server and client): kopf already brings it into the operator's environment, so the
gateway adds no HTTP stack of its own; one library serves the requests and makes the upstream
calls on the same event loop (streamed bodies pass through without threads or copies between two
stacks); it is mature, maintained by the aio-libs team, and its server measured well under the
2 ms p50 overhead budget here (bench/results/gateway.md). FastAPI/uvicorn with httpx would add
three dependencies and an ASGI layer for routes this small.

Layout. Pure: `keys` (API key lists, grants, rate limits), `limits` (each key's share of the
gateway), `openai_schema` (the OpenAI request bodies accepted and refused, error bodies), `translate`
(OpenAI <-> generate, chat templates), `routing` (services, endpoints, least-in-flight choice), `passthrough` (which v2 paths pass), `config`. The shell:
`auth` (the loaded keys, a request's key, what a key used), `admission` (a body within its key's
share), `resolution` (which service a model id names), `holding` (waiting for a ready replica),
`watches` (the InferenceServices and EndpointSlices, watched through `kube.aio`), `upstream` (calls
to the replicas), `openai_proxy` and `passthrough_proxy` (the two families of routes), `guard`
(connection limits), `telemetry` (its own Prometheus metrics), `tracing`, `server` (the `Gateway`,
which wires the parts into the aiohttp applications), `gateway_command` (the console entry).
"""
