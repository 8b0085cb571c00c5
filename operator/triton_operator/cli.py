"""The command line: run the operator, print the CRDs, render manifests offline, plan a fit,
simulate autoscaling."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from . import __version__, crdgen, kubeyaml
from .api import API_VERSION, MAX_REPLICAS, GPUClass, InferenceService, first_error
from .planning import choice
from .planning.assign import assign
from .render import RenderError, dump, render
from .settings import SettingsError, from_env

log = logging.getLogger(__name__)


class CliError(Exception):
    """Bad input: printed as one line, exit code 2 (1 for a spec that cannot be rendered)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


# etcd refuses objects over 1.5 MiB (the API server answers 500); a file may hold many objects.
MAX_OBJECT_BYTES = 1536 * 1024
MAX_FILE_BYTES = 64 * 1024 * 1024


def _one_line(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= limit else text[:limit] + "..."


def _load_docs(path: str) -> list[dict[str, Any]]:
    """The objects of a YAML file as `kubectl apply -f` would send them."""
    try:
        raw = sys.stdin.buffer.read(MAX_FILE_BYTES + 1) if path == "-" else Path(path).read_bytes()
    except OSError as e:
        raise CliError(f"{path}: {e.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise CliError(f"{path}: is larger than {MAX_FILE_BYTES // 2**20} MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CliError(f"{path}: is not UTF-8 text (byte {e.start})") from None
    try:
        docs = kubeyaml.load_all(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise CliError(f"{path}:{where} is not valid YAML: {_one_line(getattr(e, 'problem', None) or e, 200)}") from None
    except kubeyaml.KubeYAMLError as e:
        raise CliError(f"{path}: {e}") from None
    for d in docs:
        if not isinstance(d, dict):
            raise CliError(f"{path}: every document must be a mapping, found {type(d).__name__}")
        size = len(json.dumps(d, ensure_ascii=False, default=str).encode())
        if size > MAX_OBJECT_BYTES:
            raise CliError(f"{path}: an object of {size} bytes is larger than etcd stores (1.5 MiB)")
    return docs


def _describe(e: ValidationError) -> str:
    more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    return first_error(e) + more


def _parse(doc: dict[str, Any], path: str) -> InferenceService | GPUClass:
    kind, version = doc.get("kind"), doc.get("apiVersion")
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    label = f"{path}: {_one_line(kind)} {_one_line(name) if isinstance(name, str) and name else '<unnamed>'}"
    if version != API_VERSION or kind not in ("InferenceService", "GPUClass"):
        raise CliError(f"{label}: expected apiVersion {API_VERSION} and kind InferenceService or GPUClass, "
                       f"found {_one_line(version)} {_one_line(kind)}")
    model = InferenceService if kind == "InferenceService" else GPUClass
    try:
        return model.model_validate(doc)
    except ValidationError as e:
        raise CliError(f"{label}: {_one_line(_describe(e), 1000)}") from None


def default_catalog() -> list[dict[str, Any]]:
    text = resources.files("triton_operator").joinpath("catalog/gpuclasses.yaml").read_text()
    return list(yaml.safe_load_all(text))


def _objects(path: str) -> list[InferenceService | GPUClass]:
    """The InferenceServices and GPUClasses of a YAML file, validated."""
    return [_parse(d, path) for d in _load_docs(path)]


def _classes(args: argparse.Namespace, objects: list[InferenceService | GPUClass]) -> dict[str, GPUClass]:
    """The GPUClasses to plan, render and simulate against: --gpu-class-file (else the built-in
    catalog), plus any GPUClass in the input file."""
    return _catalog(args, objects)[0]


def _catalog(args: argparse.Namespace, objects: list[InferenceService | GPUClass]) -> tuple[dict[str, GPUClass], str]:
    """(the classes as `_classes`, where the catalog came from: for messages)."""
    if args.gpu_class_file:
        catalog_docs, catalog_path = _load_docs(args.gpu_class_file), args.gpu_class_file
    else:
        catalog_docs, catalog_path = default_catalog(), "<built-in catalog>"
    classes = {}
    for doc in catalog_docs:
        obj = _parse(doc, catalog_path)
        if not isinstance(obj, GPUClass):
            raise CliError(f"{catalog_path}: holds a {obj.kind}; only GPUClasses belong there")
        classes[obj.name] = obj
    classes.update({o.name: o for o in objects if isinstance(o, GPUClass)})
    return classes, catalog_path


def _placement(text: str | None) -> dict[str, int] | None:
    """--placement h100=2,h200=1 -> {"h100": 2, "h200": 1}."""
    if not text:
        return None
    out: dict[str, int] = {}
    for part in text.split(","):
        name, sep, n = part.strip().partition("=")
        if not sep or not name or not (n.isascii() and n.isdigit()) or len(n) > 6:
            raise CliError("--placement: expected CLASS=REPLICAS[,CLASS=REPLICAS...], e.g. h100=2,h200=1; "
                           f"got {_one_line(part)}")
        out[name] = int(n)
    # Bounded as spec.replicas is: the Deployments' replicas are int32, the total a service's.
    if sum(out.values()) > MAX_REPLICAS:
        raise CliError(f"--placement: at most {MAX_REPLICAS} replicas in all, as spec.replicas")
    return out


def cmd_render(args: argparse.Namespace) -> int:
    objects = _objects(args.file)
    classes = _classes(args, objects)
    placement = _placement(args.placement)
    settings = from_env()
    out: list[dict[str, Any]] = []
    for obj in objects:
        if isinstance(obj, GPUClass):
            out.append(obj.wire())
            continue
        assignment = assign(obj, classes, replicas=args.replicas, placement=placement)
        try:
            rendered = render(obj, classes, settings, assignment)
        except RenderError as e:
            raise CliError(f"{args.file}: InferenceService {obj.name}: {e.reason}: {e.message}", code=1) from None
        unused = [c for c in placement or {} if c not in rendered.deployments]
        if unused:
            raise CliError(f"--placement: InferenceService {obj.name} cannot use GPU class {', '.join(unused)} "
                           f"(it may use {', '.join(assignment.candidates.usable_names())})")
        out.extend(rendered.manifests)
    if not objects:
        raise CliError(f"{args.file}: no InferenceService or GPUClass found")
    sys.stdout.write(dump(out))
    return 0


def cmd_crds(args: argparse.Namespace) -> int:
    crds = crdgen.all_crds()
    if args.output_dir:
        out = Path(args.output_dir)
        try:
            out.mkdir(parents=True, exist_ok=True)
            for filename, crd in crds.items():
                (out / filename).write_text(dump([crd]))
        except OSError as e:
            raise CliError(f"--output-dir {args.output_dir}: {e.strerror or e}") from None
    else:
        sys.stdout.write(dump(list(crds.values())))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    objects = _objects(args.file)
    classes = _classes(args, objects)
    services = [o for o in objects if isinstance(o, InferenceService)]
    if not services:
        raise CliError(f"{args.file}: no InferenceService found")
    for i, obj in enumerate(services):
        if i:
            print()
        _print_plan(obj, classes)
    return 0


def _print_plan(obj: InferenceService, classes: dict[str, GPUClass]) -> None:
    """Every GPU class for one service: what it needs there, what it costs, and whether it is
    used (the planner's ranking for class auto; the preferred class and spill targets otherwise)."""
    spec = obj.spec
    cands = assign(obj, classes).candidates
    if spec.gpu.auto:
        options = list(cands.ranking)
    else:
        options = [choice.check(spec, name, c.spec, spec.gpu.count, constrained=name != spec.gpu.class_)
                   for name, c in sorted(classes.items())]
    used = cands.usable_names()
    rows = []
    for o in options:
        role = ("chosen" if spec.gpu.auto else "preferred") if used[:1] == [o.gpu_class] else (
            f"spill #{used.index(o.gpu_class)}" if o.gpu_class in used else "-")
        lay = o.layout
        rows.append((obj.name, o.gpu_class, o.count, lay.nodes if lay else None, lay.parallelism if lay else None,
                     o.weights_gib, o.available_gib,
                     lay.kv_cache_per_gpu_gib if lay and lay.kv_cache_per_gpu_gib is not None and
                     lay.kv_cache_per_gpu_gib > 0 else None,
                     "yes" if o.usable else o.reason, o.decode_tokens_per_s_bound, o.ms_per_token_bound,
                     o.cost_per_hour, role))
    header = ("SERVICE", "CLASS", "GPUS", "NODES", "LAYOUT", "WEIGHTS_GIB", "USABLE_GIB", "KV_GIB/GPU", "FITS",
              "MAX_TOK/S/STREAM", "MIN_MS/TOKEN", "COST/H", "USE")
    table = [header, *[tuple("-" if v is None else str(v) for v in r) for r in rows]]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    if cands.error is not None:
        print(f"{obj.name}: {cands.error.reason}: {cands.error.message}")
    elif spec.gpu.auto:
        best = cands.preferred
        limits = []
        if spec.gpu.max_price_per_hour is not None:
            limits.append(f"within {spec.gpu.max_price_per_hour}/h")
        if spec.gpu.max_time_per_output_token_ms is not None:
            limits.append(f"at most {spec.gpu.max_time_per_output_token_ms} ms per token")
        print(f"{obj.name}: class auto chooses {best.count} x {best.gpu_class}: the cheapest where the model fits"
              + (" " + " and ".join(limits) if limits else "")
              + (f"; spill order: {', '.join(used[1:])}" if len(used) > 1 else ""))
    for o in options:
        if not o.usable:
            print(f"  {o.gpu_class}: {o.message}")


def cmd_run(args: argparse.Namespace) -> int:
    import kopf  # the shell only: offline commands need no cluster libraries loaded

    from . import telemetry
    from .controller import handlers  # noqa: F401  (registers the start-up and clean-up)

    settings = from_env()
    if args.namespace:
        settings = settings.model_copy(update={"namespaces": list(args.namespace)})
    kopf.configure(verbose=args.verbose)
    if settings.log_format == "json":
        from . import logs

        logs.use("json")
    if not args.verbose:
        # The liveness probe's own lines, every few seconds, drown what matters.
        for name in ("aiohttp.access", "kopf.activities.probe"):
            logging.getLogger(name).setLevel(logging.WARNING)
    # Every replica serves its metrics from the start, leader or not (triton_operator_leader says which).
    if settings.metrics_port:
        from .kube.plain_http import serve_metrics

        try:
            serve_metrics(settings.metrics_address, settings.metrics_port)
        except OSError as e:
            raise CliError(f"cannot serve metrics on {settings.metrics_address}:{settings.metrics_port}: "
                           f"{e.strerror or e} (TRITON_OPERATOR_METRICS_PORT)", code=1) from None
    # kopf stops when this is set: by the clean-up on SIGTERM, or when the lease is lost.
    stop_flag = threading.Event()
    leadership = None
    if args.leader_elect:
        from .kube.leader import campaign, wait_to_lead
        from .kube.standby import StandbyHealth

        leadership, leading = campaign(args.leader_elect_namespace or _own_namespace())
        # Until it leads, the replica answers the chart's probes itself (kopf serves them once it runs).
        standby = StandbyHealth(args.liveness, lambda: not leadership.lost.is_set()).start()
        # SIGTERM or SIGINT before kopf installs its own handlers (while waiting, during a rollout or a
        # scale-down, or in the moment the lease is won): a flag, never an exception, so the hand-over
        # below cannot be cut in the middle. kopf sees the flag and stops at once.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop_flag.set())
        try:
            leads = wait_to_lead(leadership, leading, stop_flag)
        finally:
            standby.stop()
        if not leads:
            log.info("stopped while waiting to lead")
            leadership.release()  # in case the lease was won in the same instant
            return 0
        telemetry.LEADER.set(1)
        threading.Thread(target=lambda: leadership.lost.wait() and stop_flag.set(), name="leadership-watch",
                         daemon=True).start()
    else:
        telemetry.LEADER.set(1)
    # kopf hosts the process (signals, logging, liveness); it watches nothing itself: the
    # controller's informers do, in the namespaces the settings name.
    kopf.run(standalone=True, clusterwide=True, liveness_endpoint=args.liveness, stop_flag=stop_flag,
             memo=kopf.Memo(settings=settings, stop_flag=stop_flag))
    if leadership is not None:
        if leadership.lost.is_set():
            _exit_at_once(1, "lost the leader lease; exiting so that a new election starts")
        leadership.release()
    return 0


def _exit_at_once(code: int, message: str) -> None:
    """Exit without the interpreter's shutdown, as client-go's leader election exits: the
    informers' threads may sit in a read the lost API server never answers, and tearing the
    interpreter down under them aborted the process (SIGABRT, not the exit code). The log and a
    coverage measurement of this process (the test suite's) are written first."""
    print(f"triton-operator: {message}", file=sys.stderr)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    coverage = sys.modules.get("coverage")
    measuring = coverage.Coverage.current() if coverage is not None else None
    if measuring is not None:
        measuring.stop()
        measuring.save()
    os._exit(code)


def _own_namespace() -> str:
    """The pod's namespace: from the downward API (POD_NAMESPACE, as the chart sets it), else the
    ServiceAccount's namespace file."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if path.exists():
        return path.read_text().strip()
    raise CliError("--leader-elect needs --leader-elect-namespace (or POD_NAMESPACE) outside a pod")


def cmd_simulate(args: argparse.Namespace) -> int:
    from .simulator import simulate_command

    return simulate_command.run(args, _objects, _catalog, CliError)


def cmd_gateway(args: argparse.Namespace) -> int:
    from .gateway import gateway_command

    return gateway_command.run(args, CliError)


def cmd_check_install(args: argparse.Namespace) -> int:
    from . import checkinstall

    return checkinstall.run(args, CliError)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="triton-operator", description=__doc__)
    p.add_argument("--version", action="version", version=f"triton-operator {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("render", help="print the manifests the operator would apply, for review")
    r.add_argument("-f", "--file", required=True, help="InferenceService (and GPUClass) YAML; - for stdin")
    r.add_argument("--gpu-class-file", help="GPUClass catalog YAML (default: the built-in catalog)")
    r.add_argument("--replicas", type=int, help="override spec.replicas, as the autoscaler would")
    r.add_argument("--placement", metavar="CLASS=N,...",
                   help="replicas per GPU class, as spill-over would place them (e.g. h100=2,h200=1): "
                        "one Deployment per class")
    r.set_defaults(func=cmd_render)

    c = sub.add_parser("crds", help="print the CustomResourceDefinitions")
    c.add_argument("--output-dir", help="write one file per CRD into this folder instead")
    c.set_defaults(func=cmd_crds)

    pl = sub.add_parser("plan", help="show whether a model fits each GPU class, what it costs, and which class "
                                     "class auto chooses and why")
    pl.add_argument("-f", "--file", required=True)
    pl.add_argument("--gpu-class-file", help="GPUClass catalog YAML (default: the built-in catalog)")
    pl.set_defaults(func=cmd_plan)

    from .simulator.simulate_command import add_parser as add_simulate
    add_simulate(sub, cmd_simulate)

    from .gateway.gateway_command import add_parser as add_gateway
    add_gateway(sub, cmd_gateway)

    from .checkinstall import add_parser as add_check_install
    add_check_install(sub, cmd_check_install)

    run = sub.add_parser("run", help="run the operator")
    run.add_argument("-n", "--namespace", action="append", help="watch only this namespace (repeatable)")
    run.add_argument("--leader-elect", action="store_true",
                     help="act only while holding the Lease triton-operator (for several replicas)")
    run.add_argument("--leader-elect-namespace", help="namespace of the Lease (default: the pod's own)")
    run.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL")
    run.add_argument("-v", "--verbose", action="store_true")
    run.set_defaults(func=cmd_run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    replicas = getattr(args, "replicas", None)
    if replicas is not None and not 0 <= replicas <= MAX_REPLICAS:
        print(f"triton-operator: --replicas must be between 0 and {MAX_REPLICAS}, as spec.replicas", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except (CliError, SettingsError) as e:
        print(f"triton-operator: {e}", file=sys.stderr)
        return getattr(e, "code", 2)
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001 - a bug; the offline commands still answer in one line
        if args.command == "run":
            raise
        print(f"triton-operator: internal error ({type(e).__name__}: {_one_line(str(e), 200)}); "
              "please report it with the input", file=sys.stderr)
        return 70


if __name__ == "__main__":
    raise SystemExit(main())
