"""Which InferenceService a model id names, for one API key: "NAME" among the services the key
may use, or "NAMESPACE/NAME" (403 for what the key may not use, existing or not; 404, 400 for an
ambiguous name), and the id /v1/models shows for a service."""

from __future__ import annotations

from . import keys as keys_core
from . import openai_schema as oai
from . import telemetry as m
from . import tracing as tr
from .routing import Router, Service


class Resolver:
    def __init__(self, router: Router, tracing: tr.Off | tr.On):
        self.router = router
        self.tracing = tracing

    def resolve(self, model: str, grant: keys_core.Grant, namespace: str | None = None,
                openai: bool = True, again: bool = False) -> Service:
        """The service a model id names, for this key: "NAME" (among the services the key may
        use) or "NAMESPACE/NAME". 403 for what the key may not use, existing or not. Traced as
        the span gateway.route, once a request (`again`: the same request looked at again, after
        its body came or after it waited)."""
        if again:
            return self._resolve(model, grant, namespace, openai)
        with self.tracing.span("gateway.route") as span:
            svc = self._resolve(model, grant, namespace, openai)
            span.set(tr.NAMESPACE, svc.key[0])
            span.set(tr.NAME, svc.key[1])
        self.tracing.annotate(tr.NAMESPACE, svc.key[0])
        self.tracing.annotate(tr.NAME, svc.key[1])
        return svc

    def _resolve(self, model: str, grant: keys_core.Grant, namespace: str | None, openai: bool) -> Service:
        ns, sep, name = model.partition("/")
        if sep:
            namespace = ns
        else:
            name = model
        if namespace is not None:
            if not grant.allows((namespace, name)):
                raise _forbidden(model)
            svc = self.router.services.get((namespace, name))
            candidates = [svc] if svc is not None else []
        else:
            candidates = [s for s in self.router.find(name) if grant.allows(s.key)]
            if not candidates and not grant.may_hold_name(name):
                raise _forbidden(model)
        if openai:
            candidates = [s for s in candidates if s.openai]
        if not candidates:
            m.REJECTED.labels("not_found").inc()
            raise oai.OpenAIError(404, f"model {model!r} does not exist" + (
                " or does not serve the OpenAI routes (spec.openai)" if openai else ""),
                code="model_not_found", param="model")
        if len(candidates) > 1:
            m.REJECTED.labels("bad_request").inc()
            where = ", ".join(sorted(s.key[0] for s in candidates))
            raise oai.OpenAIError(400, f"model {model!r} exists in namespaces {where}: name it NAMESPACE/{name}",
                                code="model_ambiguous", param="model")
        return candidates[0]

    def model_id(self, svc: Service, grant: keys_core.Grant) -> str:
        """The id /v1/models shows: the bare name unless the key sees that name twice."""
        same = [s for s in self.router.find(svc.key[1]) if s.openai and grant.allows(s.key)]
        return svc.key[1] if len(same) == 1 else svc.id


def _forbidden(model: str) -> oai.OpenAIError:
    m.REJECTED.labels("forbidden").inc()
    return oai.OpenAIError(403, f"this API key may not use model {model!r}", "permission_error",
                           code="model_not_allowed", param="model")
