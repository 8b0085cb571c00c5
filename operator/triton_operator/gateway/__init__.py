"""The front door: an OpenAI-compatible gateway in front of the InferenceServices.

`triton-operator gateway` serves
- the OpenAI routes (GET /v1/models, POST /v1/chat/completions and /v1/completions, streaming or
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

Layout: `keys` (API keys, grants, rate limits) and `translate` (OpenAI <-> generate, chat
templates, error bodies) and `routing` (services, endpoints, least-in-flight choice) are pure;
`discovery` (asyncio watches of InferenceServices and EndpointSlices), `server` (the aiohttp
application) and `gateway_command` (the console entry) are the shell.
"""
