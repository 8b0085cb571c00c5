"""Which KServe v2 requests the gateway passes through to a model, and to which upstream path
(pure).

The pass-through exists so that a key holder can call *its* model with the KServe v2 protocol:
metadata, readiness, config, inference and the generate extension. It must never become a way
into the rest of Triton's HTTP API (the model repository's load/unload, shared-memory
registration, logging, trace settings, statistics, another model on the same server): those are
the first steps of the published attacks on Triton (CVE-2025-23319/23320/23334 start from the
shared-memory API). So the check is an allow-list over the path *as the client sent it*
(`request.raw_path`, before any decoding), made before the request is routed:

- only the characters a model name and the fixed route words use (no `%` escape at all, so an
  encoded `/`, `.`, `?` or `\\` cannot be smuggled, no dot segment, no empty segment, no `;`);
- no query string (no v2 route takes one);
- the tail after `/v2/models/NAME` is one of the routes below, optionally under
  `/versions/N`;
- the method fits the route, else 405 with `Allow`.

The upstream path is then built from the service's own Triton model name (never the client's
text) and the canonical tail, already encoded, so nothing downstream re-normalises it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..api import RESERVED_MODEL_NAMES, TRITON_MODEL_NAME, TRITON_MODEL_NAME_MAX_LENGTH

# Routes under /v2/models/NAME[/versions/N] and the methods each answers (Triton server
# docs/protocol: KServe v2 "Model Metadata", "Model Ready", "Model Configuration" (extension
# model_configuration), "Inference", and the generate extension (extension_generate.md)).
ROUTES: dict[str, tuple[str, ...]] = {
    "": ("GET",),
    "/ready": ("GET",),
    "/config": ("GET",),
    "/infer": ("POST",),
    "/generate": ("POST",),
    "/generate_stream": ("POST",),
}
PREFIX = "/v2/models/"
# Paths Triton's HTTP dispatcher matches exactly before its model routes (src/http_server.cc,
# HTTPAPIServer::Handle, r26.07): a model named "stats" cannot have its metadata read there, and
# the gateway must never send a request that lands on the statistics of every model. The CRD
# refuses such names (api.RESERVED_MODEL_NAMES); this holds for objects made before that rule.
TRITON_EXACT_PATHS = frozenset(PREFIX + name for name in RESERVED_MODEL_NAMES)
_MODEL_NAME = re.compile(TRITON_MODEL_NAME)
# The name the client puts after /v2/models/: an InferenceService name (a DNS-1123 label).
SERVICE_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
PATH_CHARACTERS = re.compile(r"[A-Za-z0-9/._-]*")
VERSION = re.compile(r"[1-9][0-9]{0,17}")   # Triton's model versions are positive int64s


def is_model_name(name: str) -> bool:
    """A Triton model name as the CRD allows it (api.TRITON_MODEL_NAME: ModelSpec.name,
    OpenAISpec.model): never "." or "..", because it starts with a letter, digit or underscore."""
    return len(name) <= TRITON_MODEL_NAME_MAX_LENGTH and _MODEL_NAME.fullmatch(name) is not None


class PathRefused(Exception):
    """A v2 request refused before routing: HTTP status, a fixed message, and the methods allowed
    (for a 405)."""

    def __init__(self, status: int, message: str, code: str, allow: tuple[str, ...] = ()):
        super().__init__(message)
        self.status, self.message, self.code, self.allow = status, message, code, allow


@dataclass(frozen=True)
class V2Call:
    service: str        # the InferenceService name the client addressed
    version: str | None  # a model version, when the client named one
    route: str          # one of ROUTES' keys

    def upstream_path(self, model: str) -> str:
        """The path on the replica: the service's Triton model (checked here too: the gateway
        does not trust what it reads from the cluster to be a safe path segment)."""
        if not is_model_name(model):
            raise PathRefused(502, "the service's Triton model name is not a valid model name", "bad_model_name")
        version = f"/versions/{self.version}" if self.version else ""
        path = f"{PREFIX}{model}{version}{self.route}"
        if path in TRITON_EXACT_PATHS:
            raise PathRefused(502, f"the service's Triton model is named {model!r}, which Triton's HTTP API keeps for "
                                   f"another route", "bad_model_name")
        return path


ABSOLUTE_FORM = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*")   # scheme://authority of an absolute-form target


def check(raw_path: str, method: str) -> V2Call:
    """The v2 call `raw_path` (request.raw_path: path and query as sent) asks for, or PathRefused.
    A target in absolute form (`http://host/v2/...`, which a server must accept, RFC 9112 3.2.2)
    is checked as the path it holds, as sent: no dot segment or escape is resolved first."""
    absolute = ABSOLUTE_FORM.match(raw_path)
    if absolute:
        raw_path = raw_path[absolute.end():]
    path, question, query = raw_path.partition("?")
    if question:
        raise PathRefused(400, "query strings are not accepted on the /v2 routes", "bad_path")
    if not path.startswith(PREFIX):
        raise PathRefused(404, "not a /v2/models route", "not_found")
    if "%" in path:
        raise PathRefused(400, "percent-encoded characters are not accepted in /v2 paths", "bad_path")
    if not PATH_CHARACTERS.fullmatch(path):
        raise PathRefused(400, "a /v2 path may hold only letters, digits, '/', '.', '_' and '-'", "bad_path")
    segments = path[len(PREFIX):].split("/")
    name, rest = segments[0], segments[1:]
    if any(s in ("", ".", "..") for s in segments):
        raise PathRefused(400, "empty or dot segments are not accepted in /v2 paths", "bad_path")
    if not SERVICE_NAME.fullmatch(name):
        raise PathRefused(400, "the model name in a /v2 path must be an InferenceService name "
                               "(lower-case letters, digits and '-')", "bad_path")
    version = None
    if rest[:1] == ["versions"]:
        if len(rest) < 2 or not VERSION.fullmatch(rest[1]):
            raise PathRefused(400, "a model version must be a positive integer: /v2/models/NAME/versions/N",
                              "bad_path")
        version, rest = rest[1], rest[2:]
    route = "".join("/" + s for s in rest)
    methods = ROUTES.get(route)
    if methods is None:
        raise PathRefused(404, "the gateway passes through only a model's metadata, ready, config, infer, "
                               "generate and generate_stream routes", "route_not_allowed")
    allowed = methods + (("HEAD",) if "GET" in methods else ())
    if method not in allowed:
        raise PathRefused(405, f"{method} is not allowed on this route; use {', '.join(methods)}",
                          "method_not_allowed", allow=methods)
    return V2Call(name, version, route)
