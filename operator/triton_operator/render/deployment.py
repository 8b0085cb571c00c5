"""The Deployment of one GPU class: the Triton server container, the model's init containers, the
rollout strategy, and the class's scheduling."""

from __future__ import annotations

from typing import Any, Collection

from ..api import GPUClassSpec, InferenceService
from ..labels import LABEL_GPU_CLASS, selector_labels
from ..settings import Settings
from . import llm, runtime
from .names import engine_type_label, labels_for, model_name, owner_reference
from .runtime import TRITON_UID
from .scheduling import node_scheduling
from .scheduling import resources as container_resources
from .server import (ADMIN_KEY_FROM_POD, GRPC_PORT, HTTP_PORT, METRICS_PORT, model_delivery, server_args,
                     termination_grace_seconds)
from .templates import render_template


def deployment(isvc: InferenceService, class_name: str, cls: GPUClassSpec, settings: Settings, count: int,
                name: str, spill: bool, prepared: Collection[str] | None, pipeline: int = 1) -> dict[str, Any]:
    """`pipeline` > 1: the pod of one node of a replica that spans `pipeline` nodes (render.group
    makes the LeaderWorkerSet from it)."""
    spec = isvc.spec
    delivery = model_delivery(isvc, settings, pipeline)
    is_llm = spec.model.format == "tensorrt-llm"
    image = spec.server.image or (settings.llm_image if is_llm else settings.triton_image)
    if is_llm and spec.server.image:
        # The doctor checks the TensorRT-LLM version of the image that serves.
        delivery["init"] = [{**i, "image": image} if i["name"] == "doctor" else i for i in delivery["init"]]
    resources, init_resources = container_resources(isvc, cls)
    # An init container with the pod's GPUs (the doctor) gets the server's resources: the scheduler
    # reserves max(init, app) per resource, and the kubelet hands its GPUs on to the server.
    # Only the container that fetches gets the credentials Secret.
    init_containers = [{**i, "resources": resources if i.pop("gpu") else init_resources} for i in delivery["init"]]
    max_surge = spec.rollout.max_surge
    if max_surge is None:
        max_surge = 1 if cls.spare_gpus else 0
    max_unavailable = spec.rollout.max_unavailable
    if max_surge == 0 and max_unavailable == 0:
        max_unavailable = 1
    if is_llm and prepared is not None and class_name not in prepared:
        count = 0  # held back until the model is prepared
    labels = labels_for(isvc, "server")
    selector = selector_labels(isvc.name)
    if spill:
        # The preferred class's Deployment keeps the selector it always had (immutable; an upgrade
        # must not replace it), and it also matches these pods: harmless, as controllers adopt
        # only pods and ReplicaSets no other controller owns (ControllerRef; kubernetes
        # pkg/controller/controller_ref_manager.go). This Deployment selects its own class only.
        selector = {**selector, LABEL_GPU_CLASS: class_name}
        labels = {**labels, LABEL_GPU_CLASS: class_name}
    context = {
        "name": name,
        "namespace": isvc.namespace,
        "labels": labels,
        "pod_labels": {**spec.pod_labels, **labels_for(isvc, "server"), LABEL_GPU_CLASS: class_name,
                       **engine_type_label(isvc)},
        "pod_annotations": {
            **spec.pod_annotations,
            "prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
            "prometheus.io/path": "/metrics",
            "serving.triton-operator.io/model": model_name(isvc),
        },
        "selector": selector,
        "owner": owner_reference(isvc),
        "replicas": count,
        "max_surge": max_surge,
        "max_unavailable": max_unavailable,
        "image": image,
        "image_pull_policy": spec.server.image_pull_policy,
        "args": server_args(isvc, delivery["path"]),
        "termination_grace_seconds": termination_grace_seconds(isvc),
        "env": runtime.merge_env([*delivery.get("server_env", []), ADMIN_KEY_FROM_POD],
                                 [e.wire() for e in spec.server.env]),
        "resources": resources,
        "init_containers": init_containers,
        "image_pull_secrets": llm.pull_secrets(isvc, settings),
        "volumes": delivery["volumes"],
        "server_mounts": delivery["server_mounts"],
        "secret_on_server": delivery["secret_on_server"],
        "service_account_name": spec.service_account_name,
        "credentials_secret": spec.model.credentials_secret,
        "shm_size": spec.server.shm_size,
        "startup_failure_threshold": -(-spec.server.startup_timeout_seconds // 10),
        "uid": TRITON_UID,
        "ports": {"http": HTTP_PORT, "grpc": GRPC_PORT, "metrics": METRICS_PORT},
        **node_scheduling(cls),
    }
    return render_template("deployment.yaml.j2", **context)
