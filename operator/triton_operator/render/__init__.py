"""Rendering (pure): (InferenceService, GPU classes, settings) -> the manifests to apply.

No I/O and no clock: the reconcile loop and `triton-operator render` call the same function, so
what a GitOps reviewer sees offline is what the operator applies. The caller decides
(`planning.assign`: the class choice, the replicas per class, which classes' models are prepared)
and hands the Assignment down; rendering only writes it out, and imports none of the modules that
decide (an import-linter contract holds that). This module is the face: `deployment` (one class's
Deployment), `server` (the Triton container and how the model reaches it), `scheduling` (nodes
and resources of a class), `names` (names, labels, owner), `llm` (TensorRT-LLM preparation and
serving), `group` (replicas across nodes), `runtime` (runtime/'s containers), `templates`
(jinja2 and YAML); an InferencePool where spec.routing asks for one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..api import GPUClass, InferenceService
from ..labels import selector_labels
from ..planning.assignment import Assignment, Candidates
from ..planning.fit import Problem
from ..settings import Settings
from . import group, llm
from .deployment import deployment
from .names import deployment_name, labels_for, owner_reference
from .runtime import NO_RETRY_EXIT_CODES, PROGRAM, TRITON_UID
from .scheduling import node_scheduling
from .server import (ADMIN_HEADER, ADMIN_KEY_ENV, ADMIN_KEY_FROM_POD, CLIENT_PORTS, GRPC_PORT, HTTP_PORT, METRICS_PORT,
                     RESTRICTED_ARGS)
from .templates import dump, render_template

__all__ = ["ADMIN_HEADER", "ADMIN_KEY_ENV", "ADMIN_KEY_FROM_POD", "NO_RETRY_EXIT_CODES", "PROGRAM", "RESTRICTED_ARGS",
           "TRITON_UID", "RenderError", "Rendered", "dump", "preparation_jobs", "render", "with_count"]


class RenderError(Exception):
    """The spec cannot be rendered; reason is CamelCase, message tells the user what to do."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Rendered:
    gpu_class: str                                  # the preferred class
    manifests: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    deployments: dict[str, str] = field(default_factory=dict)  # GPU class -> its workload's name (a Deployment,
    #                                                            or a LeaderWorkerSet for replicas across nodes)

    def by_kind(self, kind: str) -> dict[str, Any]:
        return next(m for m in self.manifests if m["kind"] == kind)


def preparation_jobs(isvc: InferenceService, classes: Mapping[str, GPUClass], settings: Settings,
                     candidates: Candidates) -> list[dict[str, Any]]:
    """The Job that prepares a tensorrt-llm service's model (empty for other formats, and while
    no GPU class can run it). `candidates`: the class choice the caller made."""
    if isvc.spec.model.format != "tensorrt-llm":
        return []
    usable = candidates.usable()
    if not usable:
        return []
    first = usable[0]
    # A model served across nodes is prepared on one node's GPUs.
    isvc_for = with_count(isvc, min(first.count, classes[first.gpu_class].spec.gpus_per_node))
    return [llm.preparation_job(isvc_for, classes, [o.gpu_class for o in usable], settings,
                                labels_for(isvc, "model-prepare"), owner_reference(isvc), node_scheduling,
                                lambda name, ctx: render_template(name, **ctx))]


def with_count(isvc: InferenceService, count: int) -> InferenceService:
    """The service as if gpu.count were `count` (the planner's count for class auto, per class)."""
    if isvc.spec.gpu.count == count:
        return isvc
    gpu = isvc.spec.gpu.model_copy(update={"count": count})
    return isvc.model_copy(update={"spec": isvc.spec.model_copy(update={"gpu": gpu})})


def render(isvc: InferenceService, classes: Mapping[str, GPUClass], settings: Settings, assignment: Assignment,
           jobs: list[dict[str, Any]] | None = None) -> Rendered:
    """Manifests for one InferenceService, as `assignment` (planning.assign) decided: one
    Deployment per GPU class in its replicas, the preferred class always; the serving pods of a
    class whose model is not prepared held at 0 replicas. `jobs` are the preparation_jobs() a
    caller already computed (to learn their state), so they are not rendered twice."""
    cands = assignment.candidates
    if cands.error is not None or cands.preferred is None:
        problem = cands.error or Problem("GPUClassNotFound", "no GPU class")
        raise RenderError(problem.reason, problem.message)
    preferred = cands.preferred.gpu_class
    prepared = assignment.prepared
    wanted = dict(assignment.replicas)
    notes = list(cands.notes)
    deployments: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    multi_node = False
    for option in cands.usable():
        if option.gpu_class not in wanted:
            continue
        name = deployment_name(isvc.name, option.gpu_class, preferred)
        layout = option.layout
        if layout is not None and layout.nodes > 1:
            # A replica across nodes: a group of one pod a node, each on a node's GPUs.
            pod = deployment(with_count(isvc, layout.tensor), option.gpu_class, classes[option.gpu_class].spec,
                             settings, wanted[option.gpu_class], name, spill=option.gpu_class != preferred,
                             prepared=prepared, pipeline=layout.pipeline)
            set_name = group.group_name(name)
            if len(set_name) > group.MAX_NAME:
                raise RenderError("NameTooLongForGroups", (
                    f"replicas of {option.count} GPUs span {layout.nodes} nodes and run as LeaderWorkerSet "
                    f"{set_name}, {len(set_name)} characters: its groups' StatefulSets need it to have at most "
                    f"{group.MAX_NAME}; shorten the InferenceService's name by {len(set_name) - group.MAX_NAME}"))
            deployments.append(group.leader_worker_set(pod, layout, group.ssh_secret_name(isvc.name),
                                                       classes[option.gpu_class].spec.group_topology_key))
            multi_node = True
        else:
            deployments.append(deployment(with_count(isvc, option.count), option.gpu_class,
                                           classes[option.gpu_class].spec, settings, wanted[option.gpu_class], name,
                                           spill=option.gpu_class != preferred, prepared=prepared))
        names[option.gpu_class] = deployments[-1]["metadata"]["name"]
    notes += [f"placement names GPU class {c}, which this service cannot use; ignored" for c in wanted if c not in names]
    labels = labels_for(isvc, "server")
    context = {"name": isvc.name, "namespace": isvc.namespace, "labels": labels,
               "selector": selector_labels(isvc.name), "owner": owner_reference(isvc),
               "ports": {"http": HTTP_PORT, "grpc": GRPC_PORT, "metrics": METRICS_PORT}}
    # Across nodes, the disruption budget and the network policy cover every pod of the groups:
    # an eviction of any pod of a group takes the whole group down (one at a time), and the
    # group's pods talk among themselves on ports MPI and NCCL choose.
    pods = {"matchLabels": selector_labels(isvc.name)} if not multi_node else group.group_selector(isvc.name)
    # One Service and one PodDisruptionBudget (and NetworkPolicy) select the pods of every class.
    shared = [render_template("service.yaml.j2", **context), render_template("pdb.yaml.j2", **context, pods=pods)]
    policy = settings.network_policy
    if policy.enabled:
        ingress = [{"from": peers, "ports": [{"port": port, "protocol": "TCP"} for port in ports]}
                   for peers, ports in ((policy.clients, CLIENT_PORTS), (policy.metrics, ("metrics",))) if peers]
        if multi_node:
            ingress.append({"from": [{"podSelector": group.group_selector(isvc.name)}]})
        shared.append(render_template("networkpolicy.yaml.j2", **context, ingress=ingress, pods=pods))
    pool = isvc.spec.routing.inference_pool if isvc.spec.routing is not None else None
    if pool is not None:
        # For a gateway of the Gateway API Inference Extension: the serving pods (the groups'
        # leaders) on Triton's HTTP port, as the Service selects them.
        shared.append(render_template("inferencepool.yaml.j2", **context, pool=pool))
    return Rendered(gpu_class=preferred, manifests=deployments + shared + (
        preparation_jobs(isvc, classes, settings, cands) if jobs is None else jobs), notes=notes, deployments=names)
