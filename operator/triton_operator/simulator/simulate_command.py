"""`triton-operator simulate`: the shell around the simulator (reads files, prints, writes the
report). Every error a user can cause is a one-line CliError."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

from ..api import SLO_LATENCIES, GPUClass, InferenceService, SLOSpec
from ..planning import fit
from . import policies, reader, recommend, replica, report_files, results, workload
from .simulation import SimulationSettings

MAX_COLD_START_S = 3600.0   # --cold-start at most (an hour)


def add_parser(sub: Any, func: Callable[[argparse.Namespace], int]) -> None:
    s = sub.add_parser("simulate", help="replay a trace against autoscaling policies and compare SLO and GPU-hours")
    s.add_argument("-f", "--file", required=True, help="InferenceService YAML (the first one with autoscaling is used)")
    s.add_argument("--gpu-class-file", help="GPUClass catalog YAML (default: the built-in catalog)")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="CSV with TIMESTAMP,ContextTokens,GeneratedTokens (the Azure LLM trace format)")
    src.add_argument("--generate", metavar="SPEC",
                     help="a generated workload, e.g. poisson:rate=5,duration=3600 | step:low=2,high=8,at=900 | "
                          "diurnal:mean=5,amplitude=0.8,period=3600 | spike:base=3,peak=15,at=1200,width=300 | "
                          "mmpp:low=3,high=12,mean_low_s=300,mean_high_s=60")
    s.add_argument("--policy", action="append",
                   help="repeatable (default: ours): ours | oracle[:headroom=H] | fixed:N | "
                        "hpa[:metric=M,target=N,stabilization=S] | "
                        "keda[:metric=M,target=N,activation=A,polling=S,cooldown=S] | "
                        "kpa[:target=N,utilization=U,window=S]; M: queue|inflight|occupancy|concurrency; "
                        "keys left out take the upstream defaults")
    s.add_argument("--rate-scale", type=float, default=1.0, help="multiply the request rate, keeping the duration")
    s.add_argument("--time-scale", type=float, default=1.0, help="multiply arrival times (0.5 = twice as fast)")
    s.add_argument("--slo-ms", type=float, help="a request meets the SLO when its latency is at most this "
                                                 "(default: spec.autoscaling.slo.latencyMs or targetP99LatencyMs); "
                                                 "ours aims at the SLO measured")
    s.add_argument("--slo-latency", choices=list(SLO_LATENCIES),
                   help="which latency the SLO bounds (default: spec.autoscaling.slo.latency, else endToEnd)")
    s.add_argument("--slo-target", type=float,
                   help="share of requests that must meet the SLO (default: spec.autoscaling.slo.attainment, else 0.99)")
    s.add_argument("--no-recommend", action="store_true",
                   help="skip the warm-floor recommendation (ours with minReplicas raised, and fixed pools, run too)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--scrape-interval", type=float, default=5.0, help="Prometheus scrape interval, seconds")
    s.add_argument("--outage", metavar="START:SECONDS", help="a metrics outage: scrapes fail from START for SECONDS")
    s.add_argument("--outage-kind", choices=["scrape", "prometheus"], default="scrape",
                   help="scrape: targets fail, series go stale (empty results); prometheus: every query errors")
    s.add_argument("--cold-start", metavar="SECONDS", type=float, help="model load time (default: by model size)")
    s.add_argument("--replica-model", choices=list(replica.REPLICA_MODELS), default="planner",
                   help="TensorRT-LLM replicas: planner (the planner's step model, what ours is told) or curved "
                        "(a different shape: decode slower in full batches, slower prefill, less KV cache)")
    s.add_argument("--service-time-ms", type=float, default=20.0, help="non-LLM models: mean service time")
    s.add_argument("--service-time-dist", choices=list(replica.SERVICE_DISTRIBUTIONS), default="exponential")
    s.add_argument("--batch-size", type=int, default=1, help="non-LLM models: requests a replica serves at once")
    s.add_argument("--report", metavar="DIR", help="write report.md, replicas.png and latency.png here")
    s.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    s.add_argument("--requests-out", metavar="FILE",
                   help="CSV per request (arrival,start,first_token,finish,replica,gpu_class); "
                        "with several policies, one file per policy (FILE with the policy name added)")
    s.add_argument("--replicas-out", metavar="FILE",
                   help="CSV per pod (replica,gpu_class,gpus,created,ready,deleted,stopped), named as --requests-out; "
                        "bench/recompute.py recomputes GPU-hours, scale events and SLO attainment from the two")
    s.set_defaults(func=func)


def _recommendation(requests: Any, perf: Any, cold: Any, auto: Any, settings: SimulationSettings, class_name: str,
                    planner: Any) -> recommend.Recommendation:
    """Ours with minReplicas raised, and fixed pools, on the same workload (recommend.py)."""
    def run(name: str, floor: int) -> results.Summary:
        spec = auto.model_copy(update={"min_replicas": floor, "max_replicas": max(floor, auto.max_replicas)})
        st = SimulationSettings(**{**settings.__dict__, "min_replicas": floor,
                                   "max_replicas": max(floor, settings.max_replicas),
                                   "initial_replicas": max(floor, settings.initial_replicas or 0)})
        return results.summarize(policies.run_policy(name, requests, perf, cold, spec, st, class_name, planner))

    return recommend.recommend(run, auto.min_replicas, auto.max_replicas, settings.slo_target)


def _slug(policy: str) -> str:
    """A policy's text as part of a file name: hpa:metric=inflight,target=48 -> hpa-metric-inflight-target-48."""
    return "".join(c if c.isalnum() or c in "._" else "-" for c in policy)


def _positive(value: float | None, flag: str, allow_zero: bool = False) -> None:
    if value is None:
        return
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{flag} must be a number {'>= 0' if allow_zero else '> 0'}, got {value}")


# The CLI's readers (cli._objects, cli._catalog): validated objects of a file; the GPU classes of
# --gpu-class-file or the built-in catalog with those of the file, and where the catalog came from.
LoadObjects = Callable[[str], list[Any]]
LoadCatalog = Callable[[argparse.Namespace, list[Any]], "tuple[dict[str, GPUClass], str]"]


def run(args: argparse.Namespace, load_objects: LoadObjects, load_catalog: LoadCatalog, error: type[Exception]) -> int:
    try:
        return _run(args, load_objects, load_catalog, error)
    except (workload.WorkloadError, policies.PolicyError, ValueError) as e:
        if isinstance(e, error):
            raise
        raise error(str(e)) from None


def _run(args: argparse.Namespace, load_objects: LoadObjects, load_catalog: LoadCatalog, error: type[Exception]) -> int:
    for value, flag in ((args.rate_scale, "--rate-scale"), (args.time_scale, "--time-scale"),
                        (args.slo_ms, "--slo-ms"), (args.scrape_interval, "--scrape-interval"),
                        (args.service_time_ms, "--service-time-ms")):
        _positive(value, flag)
    _positive(args.cold_start, "--cold-start", allow_zero=True)
    # The ranges spec.autoscaling.slo takes (SLOSpec), and bounds that keep a run finite.
    if args.slo_ms is not None and not 1 <= args.slo_ms <= 3_600_000:
        raise error(f"--slo-ms must be from 1 to 3600000 (an hour), got {args.slo_ms:g}")
    if args.slo_target is not None and not 0.5 <= args.slo_target < 1:
        raise error(f"--slo-target must be at least 0.5 and below 1, got {args.slo_target}")
    if args.cold_start is not None and args.cold_start > MAX_COLD_START_S:
        raise error(f"--cold-start must be at most {MAX_COLD_START_S:g} seconds (an hour), got {args.cold_start:g}")
    if args.scrape_interval is not None and not 1 <= args.scrape_interval <= 300:
        raise error(f"--scrape-interval must be from 1 to 300 seconds, got {args.scrape_interval:g}")
    if args.batch_size < 1:
        raise error(f"--batch-size must be 1 or more, got {args.batch_size}")
    names = [policies.parse_policy(p) for p in (args.policy or ["ours"])]
    repeated = sorted({p.name for p in names if [q.name for q in names].count(p.name) > 1})
    if repeated:
        raise error(f"--policy {repeated[0]} is given twice")
    outage = None
    if args.outage:
        start, _, length = args.outage.partition(":")
        try:
            outage = (float(start), float(length))
        except ValueError:
            raise error(f"--outage must be START:SECONDS, e.g. 1200:300, got {args.outage!r}") from None
        if not all(math.isfinite(x) and x >= 0 for x in outage) or outage[1] == 0:
            raise error(f"--outage must be START:SECONDS with START >= 0 and SECONDS > 0, got {args.outage!r}")

    objects = load_objects(args.file)
    services = [o for o in objects if isinstance(o, InferenceService)]
    if not services:
        raise error(f"{args.file}: no InferenceService found")
    svc = next((s for s in services if s.spec.autoscaling is not None), services[0])
    if svc.spec.autoscaling is None:
        raise error(f"{args.file}: InferenceService {svc.name} has no spec.autoscaling to simulate")
    auto = svc.spec.autoscaling
    policies.check_min_replicas(names, auto)
    classes, catalog_path = load_catalog(args, objects)
    class_name = next((c for c in svc.spec.gpu.candidates() if c in classes), None)
    if class_name is None:
        raise error(f"{args.file}: none of the GPU classes {', '.join(svc.spec.gpu.candidates())} is in {catalog_path}")
    gpu = classes[class_name].spec
    # What render refuses (a model that does not fit the GPUs, ...), simulate refuses too: a replica
    # that cannot exist has no figures (and its KV cache, of no tokens, admitted no request, forever).
    problem = next(iter(fit.problems(svc.spec.model, class_name, gpu, svc.spec.gpu.count)), None)
    if problem is not None:
        raise error(f"{args.file}: {svc.name} on {class_name}: {problem.message}")

    is_llm = svc.spec.model.format == "tensorrt-llm"
    if is_llm:
        if svc.spec.model.parameter_count() is None:
            raise error(f"{args.file}: spec.model.parameters is needed to model a TensorRT-LLM replica")
        perf: replica.Performance = replica.replica_model(args.replica_model, replica.llm_performance(svc.spec, gpu))
    else:
        perf = replica.ServiceTime(args.service_time_ms / 1000.0, args.batch_size, args.service_time_dist)
    cold = replica.default_cold_start(svc.spec)
    if args.cold_start is not None:
        cold = replica.ColdStart(cold.schedule_s, cold.pull_s, args.cold_start, cold.readiness_period_s)

    if args.trace:
        try:
            with open(args.trace, newline="", encoding="utf-8-sig") as f:   # a spreadsheet's byte-order mark too
                requests = reader.parse_trace(f, args.trace, need_tokens=is_llm)
        except OSError as e:
            raise error(f"{args.trace}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise error(f"{args.trace}: not a text CSV file") from None
        duration = None
    else:
        requests = workload.generate(args.generate, args.seed)
        duration = workload.duration_of(args.generate)
    workload.check_size(requests, args.rate_scale, args.time_scale, duration)
    requests = workload.rescale(requests, args.rate_scale, args.time_scale, args.seed)
    if duration is not None:
        duration *= args.time_scale
    if not requests:
        raise error(f"{args.trace or '--generate ' + args.generate}: no requests to simulate"
                    + (f" at --rate-scale {args.rate_scale:g}" if args.rate_scale != 1 else " (rate 0?)"))

    level = auto.service_level()
    slo_ms = args.slo_ms if args.slo_ms is not None else (level.latency_ms if level is not None else None)
    if slo_ms is None:
        raise error("set --slo-ms or spec.autoscaling.slo (or targetP99LatencyMs): the SLO to measure against")
    latency = args.slo_latency or (level.latency if level is not None else "endToEnd")
    target = args.slo_target if args.slo_target is not None else (level.attainment if level is not None else 0.99)
    # ours aims at the service level measured here
    auto = auto.model_copy(update={"target_p99_latency_ms": None,
                                   "slo": SLOSpec(latency_ms=slo_ms, latency=latency, attainment=target)})
    settings = SimulationSettings(min_replicas=auto.min_replicas, max_replicas=auto.max_replicas,
                        gpus_per_replica=svc.spec.gpu.count, price_per_gpu_hour=gpu.price_per_hour,
                        slo_s=slo_ms / 1000.0, slo_target=target, slo_latency=latency, seed=args.seed,
                        scrape_interval=args.scrape_interval, outage=outage, outage_kind=args.outage_kind,
                        duration=duration)
    settings = policies.warm_start(requests, perf, settings)
    # What ours is told about a replica: the planner's estimate from the spec and the GPUClass, as
    # the live loop computes it (the simulated engine is never handed to a policy).
    planner = replica.llm_performance(svc.spec, gpu) if is_llm else None
    runs = [policies.run_policy(n, requests, perf, cold, auto, settings, class_name, planner) for n in names]
    summaries = [results.summarize(r) for r in runs]

    source = args.trace or f"--generate {args.generate}"
    details = (f"{svc.name}: {svc.spec.model.parameters or ''} {svc.spec.model.format} "
               f"{svc.spec.model.precision} on {svc.spec.gpu.count} x {class_name}; workload {source} "
               f"(rate x{args.rate_scale:g}, time x{args.time_scale:g}, {len(requests)} requests); "
               f"SLO: latency <= {slo_ms:g} ms; replica model {args.replica_model if is_llm else 'service time'}; cold start {cold.ready_after():g} s; "
               f"scrape every {args.scrape_interval:g} s; seed {args.seed}"
               + (f"; metrics outage {outage[0]:g}s+{outage[1]:g}s ({args.outage_kind})" if outage else ""))
    for flag, base_name, write in (("--requests-out", args.requests_out, report_files.write_requests),
                                   ("--replicas-out", args.replicas_out, report_files.write_replicas)):
        if not base_name:
            continue
        base = Path(base_name)
        for r in runs:
            path = base if len(runs) == 1 else base.with_name(f"{base.stem}-{_slug(r.policy)}{base.suffix}")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write(r, path)
            except OSError as e:
                raise error(f"{flag} {path}: {e.strerror}") from None
    advice = None
    if any(p.family == "ours" for p in names) and not args.no_recommend and args.outage is None:
        advice = _recommendation(requests, perf, cold, auto, settings, class_name, planner)
    if args.json:
        out: dict[str, Any] = {"details": details, "policies": [s.as_dict() for s in summaries]}
        if advice is not None:
            out["recommendation"] = {"minReplicas": advice.min_replicas, "fixedPool": advice.pool,
                                     "attainmentTarget": advice.target,
                                     "floors": {n: s.as_dict() for n, s in advice.floors},
                                     "pools": {n: s.as_dict() for n, s in advice.pools}}
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(details)
        print(results.text_table(summaries))
        if advice is not None:
            print(advice.text(auto.min_replicas))
    if args.report:
        try:
            written = report_files.write_report(Path(args.report), runs, summaries, f"Autoscaling simulation: {svc.name}", details)
        except OSError as e:
            raise error(f"{args.report}: {e.strerror}") from None
        if not args.json:
            print(f"wrote {', '.join(str(Path(args.report) / w) for w in written)}")
            if not report_files.have_matplotlib():
                print(report_files.PLOTS_HINT)
    elif not args.json and not report_files.have_matplotlib():
        print(f"({report_files.PLOTS_HINT})")
    return 0
