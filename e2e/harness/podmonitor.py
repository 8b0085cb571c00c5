"""What a Prometheus Operator makes of a PodMonitor, without a cluster.

Two halves, so that a real Prometheus can evaluate a chart's PodMonitor against a real target:

- :func:`scrape_config` turns a PodMonitor (as ``helm template`` prints it) into the scrape
  config the Prometheus Operator generates for it: the same relabel rules, in the same order,
  mirrored from prometheus-operator v0.93.0, ``pkg/prometheus/promcfg.go``
  (``generatePodMonitorConfig``: ``initRelabelings``, ``generateRunningFilter``, the ``keep``
  rules of ``spec.selector`` and of the endpoint's port, the namespace/container/pod labels,
  the ``job`` and ``endpoint`` labels, then the endpoint's own ``relabelings``). Not mirrored:
  sharding (one shard keeps every target), scrape classes and an enforced namespace label
  (unset by default), and authentication. Kubernetes service discovery is replaced by the
  targets the caller gives (``static_configs``), and ``spec.namespaceSelector`` is checked by
  :func:`selects_namespace` since it becomes the discovery's namespace list, not a rule.
- :func:`pod_targets` gives the targets Prometheus's Kubernetes discovery (role ``pod``) makes
  of a pod: one per container port, with the ``__meta_kubernetes_*`` labels of prometheus
  v3 ``discovery/kubernetes/pod.go`` (``buildPod``, ``podLabels``) and ``kubernetes.go``
  (``addObjectMetaLabels``). ``__address__`` is the pod IP and port unless ``addresses`` maps
  the container port to the address of a real server (a local Triton) to scrape instead.

Label names are sanitised as both projects do: every character outside ``[a-zA-Z0-9_]``
becomes ``_``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def sanitize(name: str) -> str:
    return _INVALID.sub("_", name)


def _relabel(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A monitoring.coreos.com/v1 RelabelConfig (camelCase) as Prometheus's relabel_config. The
    CRD defaults ``action`` to ``replace``; regex, replacement and separator default the same in
    Prometheus, so they are passed on only when set."""
    keys = {"sourceLabels": "source_labels", "separator": "separator", "targetLabel": "target_label",
            "regex": "regex", "modulus": "modulus", "replacement": "replacement", "action": "action"}
    unknown = set(rule) - set(keys)
    if unknown:
        raise ValueError(f"relabeling fields not understood here: {sorted(unknown)}")
    out = {keys[k]: v for k, v in rule.items()}
    out["action"] = str(out.get("action", "replace")).lower()
    return out


def scrape_config(podmonitor: Mapping[str, Any], endpoint: int = 0,
                  targets: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The scrape config for ``spec.podMetricsEndpoints[endpoint]`` of ``podmonitor``, with
    ``targets`` (label sets from :func:`pod_targets`) as its static targets."""
    meta, spec = podmonitor["metadata"], podmonitor["spec"]
    ep = spec["podMetricsEndpoints"][endpoint]
    selector = spec.get("selector") or {}
    rules: list[dict[str, Any]] = [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
    ]
    if ep.get("filterRunning", True):
        rules.append({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
                      "regex": "(Failed|Succeeded)"})
    for key in sorted(selector.get("matchLabels") or {}):
        rules.append({"action": "keep",
                      "source_labels": [f"__meta_kubernetes_pod_label_{sanitize(key)}",
                                        f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"],
                      "regex": f"({selector['matchLabels'][key]});true"})
    for exp in selector.get("matchExpressions") or []:
        label = f"__meta_kubernetes_pod_label_{sanitize(exp['key'])}"
        present = f"__meta_kubernetes_pod_labelpresent_{sanitize(exp['key'])}"
        op = exp["operator"]
        if op in ("In", "NotIn"):
            rules.append({"action": "keep" if op == "In" else "drop", "source_labels": [label, present],
                          "regex": f"({'|'.join(exp['values'])});true"})
        elif op in ("Exists", "DoesNotExist"):
            rules.append({"action": "keep" if op == "Exists" else "drop", "source_labels": [present],
                          "regex": "true"})
    if ep.get("port"):
        rules.append({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                      "regex": ep["port"]})
    elif ep.get("portNumber"):
        rules.append({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_number"],
                      "regex": str(ep["portNumber"])})
    rules += [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]
    for label in spec.get("podTargetLabels") or []:
        rules.append({"source_labels": [f"__meta_kubernetes_pod_label_{sanitize(label)}"],
                      "target_label": sanitize(label), "regex": "(.+)", "replacement": "${1}"})
    rules.append({"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"})
    if spec.get("jobLabel"):
        rules.append({"source_labels": [f"__meta_kubernetes_pod_label_{sanitize(spec['jobLabel'])}"],
                      "target_label": "job", "regex": "(.+)", "replacement": "${1}"})
    if ep.get("port"):
        rules.append({"target_label": "endpoint", "replacement": ep["port"]})
    rules += [_relabel(r) for r in ep.get("relabelings") or []]

    config: dict[str, Any] = {
        "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{endpoint}",
        "static_configs": [{"targets": [t["__address__"]], "labels": {k: v for k, v in t.items() if k != "__address__"}}
                           for t in targets or []],
        "relabel_configs": rules,
    }
    if ep.get("interval"):
        config["scrape_interval"] = ep["interval"]
    if ep.get("scrapeTimeout"):
        config["scrape_timeout"] = ep["scrapeTimeout"]
    if ep.get("path"):
        config["metrics_path"] = ep["path"]
    if ep.get("honorLabels"):
        config["honor_labels"] = True
    if ep.get("metricRelabelings"):
        config["metric_relabel_configs"] = [_relabel(r) for r in ep["metricRelabelings"]]
    return config


def selects_namespace(podmonitor: Mapping[str, Any], namespace: str) -> bool:
    """Whether the PodMonitor's discovery covers ``namespace`` (its namespaceSelector; without
    one, only the PodMonitor's own namespace)."""
    sel = podmonitor["spec"].get("namespaceSelector") or {}
    if sel.get("any"):
        return True
    names = sel.get("matchNames") or [podmonitor["metadata"]["namespace"]]
    return namespace in names


def pod_targets(pod: Mapping[str, Any], *, pod_ip: str = "127.0.0.2", phase: str = "Running",
                ready: bool = True, node: str = "node-1",
                addresses: Mapping[int, str] | None = None) -> list[dict[str, str]]:
    """The targets of one pod (``metadata`` with name, namespace, labels, annotations; ``spec``
    with containers and initContainers), as Kubernetes discovery labels them."""
    meta, spec = pod["metadata"], pod["spec"]
    common = {
        "__meta_kubernetes_namespace": meta["namespace"],
        "__meta_kubernetes_pod_name": meta["name"],
        "__meta_kubernetes_pod_ip": pod_ip,
        "__meta_kubernetes_pod_ready": "true" if ready else "false",
        "__meta_kubernetes_pod_phase": phase,
        "__meta_kubernetes_pod_node_name": node,
        "__meta_kubernetes_pod_host_ip": pod_ip,
        "__meta_kubernetes_pod_uid": meta.get("uid", "00000000-0000-0000-0000-000000000000"),
    }
    for key, value in (meta.get("labels") or {}).items():
        common[f"__meta_kubernetes_pod_label_{sanitize(key)}"] = value
        common[f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"] = "true"
    for key, value in (meta.get("annotations") or {}).items():
        common[f"__meta_kubernetes_pod_annotation_{sanitize(key)}"] = value
        common[f"__meta_kubernetes_pod_annotationpresent_{sanitize(key)}"] = "true"
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    if owner:
        common["__meta_kubernetes_pod_controller_kind"] = owner["kind"]
        common["__meta_kubernetes_pod_controller_name"] = owner["name"]

    targets = []
    containers = [(c, False) for c in spec.get("containers") or []] + \
                 [(c, True) for c in spec.get("initContainers") or []]
    for container, is_init in containers:
        base = {**common, "__meta_kubernetes_pod_container_name": container["name"],
                "__meta_kubernetes_pod_container_image": container.get("image", ""),
                "__meta_kubernetes_pod_container_init": "true" if is_init else "false"}
        if not container.get("ports"):
            targets.append({**base, "__address__": pod_ip})
            continue
        for port in container["ports"]:
            number = int(port["containerPort"])
            targets.append({
                **base,
                "__address__": (addresses or {}).get(number, f"{pod_ip}:{number}"),
                "__meta_kubernetes_pod_container_port_number": str(number),
                "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
            })
    return targets
