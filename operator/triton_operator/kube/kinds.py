"""Where a kind lives in the API: the built-in kinds the operator reads and writes, and a registry
of those a client may apply (its user adds its own, as the controller does with its CRDs). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote


@dataclass(frozen=True)
class Kind:
    """Where a kind lives in the API."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name, safe='')}"
        if subresource:
            base += f"/{subresource}"
        return base


DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments")
SERVICE = Kind("v1", "Service", "services")
PDB = Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
JOB = Kind("batch/v1", "Job", "jobs")
NETWORK_POLICY = Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies")
POD = Kind("v1", "Pod", "pods")
NODE = Kind("v1", "Node", "nodes", namespaced=False)
EVENT = Kind("v1", "Event", "events")
ENDPOINT_SLICE = Kind("discovery.k8s.io/v1", "EndpointSlice", "endpointslices")
SECRET = Kind("v1", "Secret", "secrets")
# Not built in: LeaderWorkerSet (sigs.k8s.io/lws), present where the cluster installed it.
LEADER_WORKER_SET = Kind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets")
# Not built in: InferencePool (Gateway API Inference Extension), present where the cluster installed it.
INFERENCE_POOL = Kind("inference.networking.k8s.io/v1", "InferencePool", "inferencepools")
BUILTIN_KINDS = (DEPLOYMENT, SERVICE, PDB, JOB, NETWORK_POLICY, POD, NODE, EVENT, SECRET)


class Kinds:
    """The kinds a client may apply, by (apiVersion, kind): the built-in ones and those its user adds."""

    def __init__(self, kinds: tuple[Kind, ...]):
        self._by_id = {(k.api_version, k.kind): k for k in kinds}

    def __getitem__(self, ident: tuple[str, str]) -> Kind:
        return self._by_id[ident]

    def of(self, manifest: dict[str, Any]) -> Kind:
        try:
            return self._by_id[(manifest["apiVersion"], manifest["kind"])]
        except KeyError:
            raise ValueError(f"the operator does not manage {manifest.get('apiVersion')} {manifest.get('kind')}") from None
