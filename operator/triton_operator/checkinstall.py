"""`triton-operator check-install`: what the chart's `helm test` pod runs (and what anyone can run
against a release): the CRDs are Established, every running operator pod answers its health
endpoint, and each --url answers 200. One line per check; exit 0 when all pass, 1 otherwise.

Failing checks are retried until --wait seconds have passed (a release just installed may still be
starting). The API reads are a GET of each named CRD and a LIST of pods in one namespace: the test
pod's ServiceAccount may do exactly that (charts/triton-operator/templates/tests/).
"""

from __future__ import annotations

import argparse
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

import urllib3

HTTP_TIMEOUT = 5.0


@dataclass
class Result:
    ok: bool
    what: str
    detail: str

    def line(self) -> str:
        return f"{'ok' if self.ok else 'FAILED'}: {self.what}: {self.detail}"


def add_parser(sub: Any, handler: Any) -> None:
    c = sub.add_parser("check-install", help="check a release: CRDs Established, the operator's and the gateway's "
                                             "health endpoints answer (what `helm test` runs)")
    c.add_argument("--crd", action="append", default=[], help="a CRD that must be Established (repeatable)")
    c.add_argument("--namespace", help="namespace of the operator's pods")
    c.add_argument("--operator-selector", help="label selector of the operator's pods; each running one must answer")
    c.add_argument("--operator-port", type=int, default=8080, help="the operator's health port (default 8080)")
    c.add_argument("--operator-path", default="/healthz", help="the operator's health path (default /healthz)")
    c.add_argument("--url", action="append", default=[], help="a URL that must answer 200, e.g. the gateway's "
                                                              "/healthz (repeatable)")
    c.add_argument("--resolve", action="append", default=[], metavar="HOST=ADDRESS:PORT",
                   help="send requests for HOST (a pod IP or a Service's name) to ADDRESS:PORT instead "
                        "(repeatable; for a cluster whose pods are simulated)")
    c.add_argument("--wait", type=float, default=60.0, help="seconds to retry failing checks (default 60)")
    c.add_argument("--kubeconfig", help="kubeconfig outside a cluster (default: in-cluster, then ~/.kube/config)")
    c.set_defaults(func=handler)


def _pins(items: list[str], cli_error: type[Exception]) -> dict[str, str]:
    pins = {}
    for item in items:
        host, sep, target = item.partition("=")
        if not sep or not host or ":" not in target:
            raise cli_error(f"--resolve takes HOST=ADDRESS:PORT, found {item!r}")
        pins[host] = target
    return pins


def http_ok(url: str, pins: dict[str, str]) -> Result:
    parts = urllib.parse.urlsplit(url)
    target = pins.get(parts.hostname or "")
    sent = parts._replace(netloc=target).geturl() if target else url
    try:
        with urllib.request.urlopen(sent, timeout=HTTP_TIMEOUT) as r:
            return Result(r.status == 200, url, f"HTTP {r.status}")
    except urllib.error.HTTPError as e:
        return Result(False, url, f"HTTP {e.code}")
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return Result(False, url, f"no answer ({reason})")


def crd_established(api: Any, name: str) -> Result:
    from kubernetes.client.exceptions import ApiException

    what = f"CRD {name}"
    try:
        crd = api.read_custom_resource_definition(name)
    except ApiException as e:
        return Result(False, what, "not found" if e.status == 404 else f"cannot read it (HTTP {e.status})")
    except urllib3.exceptions.HTTPError as e:
        return Result(False, what, f"cannot reach the API server ({type(e).__name__})")
    conditions = {c.type: c for c in (crd.status.conditions if crd.status else None) or []}
    established = conditions.get("Established")
    if established is not None and established.status == "True":
        return Result(True, what, "Established")
    reason = f"{established.reason}: {established.message}" if established is not None else "no Established condition"
    return Result(False, what, f"not Established ({reason})")


def operator_pods(core: Any, namespace: str, selector: str, port: int, path: str,
                  pins: dict[str, str]) -> list[Result]:
    from kubernetes.client.exceptions import ApiException

    what = f"operator pods {selector} in {namespace}"
    try:
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    except ApiException as e:
        return [Result(False, what, f"cannot list them (HTTP {e.status})")]
    except urllib3.exceptions.HTTPError as e:
        return [Result(False, what, f"cannot reach the API server ({type(e).__name__})")]
    running = [p for p in pods if p.status and p.status.phase == "Running" and not p.metadata.deletion_timestamp]
    if not running:
        return [Result(False, what, f"none running ({len(pods)} found)")]
    out = []
    for pod in running:
        result = http_ok(f"http://{pod.status.pod_ip}:{port}{path}", pins) if pod.status.pod_ip else \
            Result(False, "", "no pod IP yet")
        out.append(Result(result.ok, f"operator pod {pod.metadata.name} {path}", result.detail))
    return out


def run_checks(checks: list[Callable[[], list[Result]]], wait: float,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
               interval: float = 2.0) -> list[Result]:
    """Every check, the failing ones again every `interval` until they pass or `wait` has passed;
    the last result of each."""
    deadline = clock() + wait
    results: list[list[Result]] = [check() for check in checks]
    while not all(r.ok for rs in results for r in rs) and clock() < deadline:
        sleep(interval)
        results = [rs if all(r.ok for r in rs) else check() for rs, check in zip(results, checks)]
    return [r for rs in results for r in rs]


def _check_urls(urls: list[str], cli_error: type[Exception]) -> None:
    for url in urls:
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port   # raises on a port that is no number
        except ValueError as e:
            raise cli_error(f"--url {url!r} is not a URL: {e}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or (port is not None and not 0 < port < 65536):
            raise cli_error(f"--url takes an http:// or https:// URL with a host, e.g. http://gateway:9090/healthz, "
                            f"got {url!r}")


def run(args: argparse.Namespace, cli_error: type[Exception]) -> int:
    pins = _pins(args.resolve, cli_error)
    _check_urls(args.url, cli_error)
    if not (math.isfinite(args.wait) and 0 <= args.wait <= 86400):
        raise cli_error(f"--wait takes a number of seconds from 0 to 86400, got {args.wait}")
    if bool(args.namespace) != bool(args.operator_selector):
        raise cli_error("--namespace and --operator-selector go together")
    if not (args.crd or args.operator_selector or args.url):
        raise cli_error("nothing to check: give --crd, --operator-selector or --url")
    checks: list[Callable[[], list[Result]]] = []
    if args.crd or args.operator_selector:
        from kubernetes import client, config

        try:
            if args.kubeconfig:
                config.load_kube_config(config_file=args.kubeconfig)
            else:
                try:
                    config.load_incluster_config()
                except config.ConfigException:
                    config.load_kube_config()
        except Exception as e:  # noqa: BLE001 - the kubernetes loaders raise many kinds
            raise cli_error(f"no Kubernetes credentials: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                            ) from None
        extensions, core = client.ApiextensionsV1Api(), client.CoreV1Api()
        for name in args.crd:
            checks.append(lambda name=name: [crd_established(extensions, name)])
        if args.operator_selector:
            checks.append(lambda: operator_pods(core, args.namespace, args.operator_selector, args.operator_port,
                                                args.operator_path, pins))
    for url in args.url:
        checks.append(lambda url=url: [http_ok(url, pins)])
    results = run_checks(checks, args.wait)
    for r in results:
        print(r.line(), flush=True)
    return 0 if all(r.ok for r in results) else 1
