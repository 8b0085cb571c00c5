"""make bench-autoscaling: ours at its default settings against the cost/violation frontier of
swept baselines (HPA, KEDA and Knative at a range of targets, fixed pools), on the workloads ours
was tuned on, on held-out ones and on real traces (Azure code completion, Mooncake long-context
conversation), at cold starts of 50, 150 and 325 s and on a replica shaped unlike the plan; several
seeds; ours at three attainment targets; a fluid lower bound. Writes bench/results/autoscaling.md,
one frontier plot per workload and condition, and the autoscaling table of the documentation's
autoscaling page, docs/autoscaling.md (between its bench-autoscaling markers).

Next to the bound, plans with foresight (`oracle:headroom=H` over a range of H: the simulator's
oracle, which knows every arrival and starts pods one cold start early) run through the same
simulation. Not baselines (no one can deploy them) and not a bound (one headroom for every
bucket): they split ours' distance to the fluid bound into what a plan that sees the future
still pays here (queueing, batching, whole pods, its one headroom) and, roughly, the price of
not seeing the future. bench/foresight.py searches plans a minute at a time instead.

Every autoscaling policy starts from the same state: the warm replicas that serve the first
minute's arrivals at 80 % of a replica's saturated throughput (policies.warm_start), HPA and KEDA
with that count as their first recommendation (as ours), Knative with empty windows that fill
from the first second. A `fixed:N` pool runs its N replicas warm from the start (a pool sized in
advance; it never pays a cold start).

Uses bench/data/azure-llm-trace-2023/conv.csv and azure-llm-trace-2023-code/code.csv: Azure LLM
inference trace 2023 (conversation, code), CC-BY 4.0, Patel et al., "Splitwise", ISCA 2024; and
bench/data/mooncake-conversation/conversation.csv: Mooncake trace, Apache-2.0, Qin et al.,
"Mooncake", FAST 2025 (attributions in the READMEs beside them). The generated tuned workloads draw
their token counts from the conversation trace's rows; the held-out ones from the mixes in
workload.TOKEN_MIXES.

`--fast` runs a reduced sweep (one short workload, one seed, a few configurations) into --out,
for the unit test; the full bench only through `make bench-autoscaling`."""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import frontier as fr  # noqa: E402
from triton_operator.api import GPUClass, InferenceService, SLOSpec  # noqa: E402
from triton_operator.simulator import policies, reader, replica, results, workload  # noqa: E402
from triton_operator.simulator.simulation import SimulationSettings  # noqa: E402
from triton_operator.cli import default_catalog  # noqa: E402

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results"
# The documentation page whose table (between the markers) this bench rewrites.
PAGE = ROOT.parent / "docs" / "autoscaling.md"
SPEC = ROOT / "specs/llama3-8b-h100.yaml"
TRACE = ROOT / "data/azure-llm-trace-2023/conv.csv"
MARK_BEGIN, MARK_END = "<!-- bench-autoscaling:begin -->", "<!-- bench-autoscaling:end -->"


@dataclass(frozen=True)
class Workload:
    label: str
    spec: str | tuple[str, ...] | None   # generator spec(s), merged; None: a trace (the Azure one at 8x by default)
    slo_ms: float
    held_out: bool
    duration: float = 3600.0
    trace: str | None = None             # a real trace under bench/data, replayed at `rate` x
    rate: float = 8.0
    service: str | None = None           # the InferenceService under bench/specs (default: SPEC)
    conditions: tuple[str, ...] | None = None   # only these conditions (default: all)
    seeds: tuple[int, ...] | None = None        # only these seeds (default: the condition's)
    repeat: int = 1                      # the trace played this many times back to back (`duration` is all of it)
    blocks_s: float | None = None        # the trace cut into blocks this long, replayed in an order drawn by the seed


WORKLOADS = (
    Workload("azure-conv x8", None, 8000, False),
    Workload("step 30->90 req/s", "step:low=30,high=90,at=1200,duration=3600", 8000, False),
    Workload("diurnal 55 req/s +-80%", "diurnal:mean=55,amplitude=0.8,period=3600,duration=3600", 8000, False),
    Workload("spike 40->120 req/s 5 min", "spike:base=40,peak=120,at=1800,width=300,duration=3600", 8000, False),
    Workload("code completion (prefill-heavy)",
             "diurnal:mean=50,amplitude=0.5,period=3600,duration=3600,mix=code", 4000, True),
    Workload("long-context RAG", "mmpp:low=6,high=16,mean_low_s=600,mean_high_s=300,duration=3600,mix=rag",
             10000, True),
    Workload("mixed tenants (chat + code burst)",
             ("diurnal:mean=30,amplitude=0.6,period=3600,duration=3600,mix=chat",
              "spike:base=10,peak=50,at=1500,width=600,duration=3600,mix=code"), 8000, True),
    # Real traces (bench/data/*/README.md has each one's source and licence): bursty code completion at
    # 3.1x its rate (8 req/s), looked at while tuning; long-context conversation (prompts of 12k tokens
    # on average) on a 128k-context service, held out.
    Workload("Azure code trace x3.1 (real)", None, 4000, False, 3437.0, trace="azure-llm-trace-2023-code/code.csv",
             rate=3.1, conditions=("cold start 50 s", "cold start 325 s")),
    Workload("Mooncake conversation (real)", None, 20000, True, 3540.0, trace="mooncake-conversation/conversation.csv",
             rate=1.0, service="llama31-8b-h100-128k.yaml", conditions=("cold start 50 s", "cold start 325 s"),
             seeds=(1,)),
    # The same hours twice over: a service that has served this traffic before meets its bursts with
    # what it learned (the first hour's first burst meets a service that has seen nothing).
    Workload("Azure code trace x3.1, two hours (real)", None, 4000, False, 2 * 3437.0,
             trace="azure-llm-trace-2023-code/code.csv", rate=3.1, conditions=("cold start 50 s", "cold start 325 s"),
             repeat=2),
    Workload("Mooncake conversation, two hours (real)", None, 20000, True, 2 * 3540.0,
             trace="mooncake-conversation/conversation.csv", rate=1.0, service="llama31-8b-h100-128k.yaml",
             conditions=("cold start 50 s", "cold start 325 s"), seeds=(1,), repeat=2),
)
# The same real traces at rates the table above does not replay (`--rates`, bench/results/autoscaling-rates.md):
# a policy tuned at one rate must not lose to a constant at another. At `simulate`'s default start-up, on two
# seeds (the reshuffled hours on more), against the same swept baselines; no plans with foresight (what is
# asked here is only whether a constant or a tuned HPA, KEDA or Knative beats ours).
RATE_WORKLOADS = (
    *(Workload(f"Azure code trace x{r:g} (real)", None, 4000, False, 3437.0, trace="azure-llm-trace-2023-code/code.csv",
               rate=r, seeds=(1, 2)) for r in (1.0, 2.0, 5.0, 8.0)),
    *(Workload(f"Azure conversation trace x{r:g} (real)", None, 8000, False, 3600.0,
               trace="azure-llm-trace-2023/conv.csv", rate=r, seeds=(1, 2)) for r in (2.0, 4.0, 16.0)),
    *(Workload(f"Mooncake conversation x{r:g} (real)", None, 20000, True, 3540.0,
               trace="mooncake-conversation/conversation.csv", rate=r, service="llama31-8b-h100-128k.yaml",
               seeds=(1,)) for r in (0.5, 2.0)),
    # Hours the traces never had: each cut into 5-minute blocks, replayed in an order each seed draws
    # (`reshuffle`). The bursts, their sizes and the quiet between them within a block are the trace's;
    # which burst follows which quiet, and what a new service meets first, are new. Never tuned on.
    Workload("Azure code trace x3.1, reshuffled (real)", None, 4000, False, 3437.0,
             trace="azure-llm-trace-2023-code/code.csv", rate=3.1, seeds=tuple(range(1, 9)), blocks_s=300.0),
    Workload("azure-conv x8, reshuffled (real)", None, 8000, False, 3600.0, trace="azure-llm-trace-2023/conv.csv",
             rate=8.0, seeds=(1, 2, 3, 4), blocks_s=300.0),
    Workload("Mooncake conversation, reshuffled (real)", None, 20000, True, 3540.0,
             trace="mooncake-conversation/conversation.csv", rate=1.0, service="llama31-8b-h100-128k.yaml",
             seeds=(1, 2), blocks_s=300.0),
)
# Ours at other attainment targets (spec.autoscaling.slo.attainment; the default is 0.99), on each
# workload-condition's first seed: the point it picks on the cost/SLO curve.
TARGETS = (0.9, 0.95)
FAST_WORKLOAD = Workload("spike (fast)", "spike:base=20,peak=60,at=300,width=200,duration=900", 8000, False, 900.0)

# Cold starts: schedule 5 s, image pull, model load, readiness period 5 s (replica.ColdStart).
COLD_STARTS = {50: (5.0, 30.0, 15.0, 5.0), 150: (5.0, 60.0, 85.0, 5.0), 325: (5.0, 120.0, 200.0, 5.0)}


@dataclass(frozen=True)
class Condition:
    label: str
    cold_s: int
    model: str
    seeds: tuple[int, ...]


CONDITIONS = (
    Condition("cold start 50 s", 50, "planner", (1, 2, 3)),
    Condition("cold start 325 s", 325, "planner", (1, 2, 3)),
    Condition("curved replica, cold start 50 s", 50, "curved", (1, 2, 3)),
    Condition("cold start 150 s", 150, "planner", (1, 2, 3)),
)
FAST_CONDITIONS = (Condition("cold start 50 s", 50, "planner", (1,)),)
RATE_CONDITIONS = (Condition("cold start 50 s", 50, "planner", tuple(range(1, 9))),)

# The baselines swept: each family's target over a wide range (per pod: requests in flight plus
# waiting for the HPA and KEDA, Knative's concurrency), the HPA on the queue at the service's
# targetQueueDepth, and fixed pools around the fluid need (chosen per workload).
SWEEP = ([f"hpa:metric=concurrency,target={t}" for t in (8, 16, 24, 32, 48)]
         + [f"keda:metric=concurrency,target={t}" for t in (16, 32)]
         + [f"kpa:target={t}" for t in (8, 16, 32)])
FAST_SWEEP = ["hpa:metric=concurrency,target=8", "hpa:metric=concurrency,target=32", "kpa:target=16"]
# Headrooms of the foresight plans: fine where attainment turns (-20 % to 0 on the generated workloads),
# up to 1.0 for bursty real traffic (a minute's average hides its bursts).
FORESIGHT = [f"oracle:headroom={h:g}" for h in (-0.4, -0.3, -0.2, -0.15, -0.1, -0.05, 0, 0.1, 0.2, 0.4, 0.7, 1.0)]
FAST_FORESIGHT = ["oracle:headroom=-0.2", "oracle:headroom=0.2"]


def is_foresight(name: str) -> bool:
    return name.startswith("oracle")


def seeds_of(w: Workload, c: Condition) -> tuple[int, ...]:
    return tuple(s for s in c.seeds if w.seeds is None or s in w.seeds) or c.seeds[:1]


@lru_cache(maxsize=4)
def service(name: str | None = None) -> tuple[InferenceService, Any]:
    path = SPEC if name is None else ROOT / "specs" / name
    svc = InferenceService.model_validate(yaml.safe_load(path.read_text()))
    classes = {d["metadata"]["name"]: GPUClass.model_validate(d) for d in default_catalog()}
    return svc, classes[svc.spec.gpu.class_].spec


@lru_cache(maxsize=1)
def azure() -> list[Any]:
    return reader.parse_trace(TRACE.open(), str(TRACE))


@lru_cache(maxsize=8)
def trace(name: str) -> list[Any]:
    path = ROOT / "data" / name
    return reader.parse_trace(path.open(), str(path))


def reshuffle(requests: list[Any], block_s: float, seed: int) -> list[Any]:
    """The requests cut into blocks of `block_s` seconds over the span they cover (the last block
    shorter), replayed in an order drawn from `seed`, each block's arrivals keeping their offsets
    within it. The quiet after the last arrival is not a block: the Azure conversation trace ends
    98 s before its hour does, and that silence, moved mid-hour, is an outage the trace never had."""
    span = max((r.arrival for r in requests), default=0.0) + 1e-6
    count = max(1, math.ceil(span / block_s))
    blocks: list[list[Any]] = [[] for _ in range(count)]
    for r in requests:
        blocks[min(count - 1, int(r.arrival // block_s))].append(r)
    order = list(range(count))
    random.Random(seed).shuffle(order)
    out, start = [], 0.0
    for b in order:
        out += [replace(r, arrival=r.arrival - b * block_s + start) for r in blocks[b]]
        start += min(block_s, span - b * block_s)
    return out


@lru_cache(maxsize=4)
def requests_for(w: Workload, seed: int) -> list[Any]:
    if w.trace is not None:
        once = workload.rescale(trace(w.trace), rate_scale=w.rate, seed=seed)
        if w.blocks_s is not None:
            once = reshuffle(once, w.blocks_s, seed)
        period = w.duration / w.repeat
        return [replace(r, arrival=r.arrival + k * period) for k in range(w.repeat) for r in once]
    if w.spec is None:
        return workload.rescale(azure(), rate_scale=8, seed=seed)
    mix = workload.mix_tokens([(r.prompt_tokens, r.output_tokens) for r in azure()])
    specs = (w.spec,) if isinstance(w.spec, str) else w.spec
    return workload.merge(*(workload.generate(s, seed * 100 + i, None if "mix=" in s else mix)
                            for i, s in enumerate(specs)))


def setup(w: Workload, c: Condition, seed: int) -> tuple[list[Any], Any, Any, Any, Any, SimulationSettings]:
    svc, gpu = service(w.service)
    planned = replica.llm_performance(svc.spec, gpu)
    perf = replica.replica_model(c.model, planned)
    cold = replica.ColdStart(*COLD_STARTS[c.cold_s])
    auto = svc.spec.autoscaling.model_copy(update={"target_p99_latency_ms": w.slo_ms})
    reqs = requests_for(w, seed)
    cfg = policies.warm_start(reqs, perf, SimulationSettings(
        min_replicas=auto.min_replicas, max_replicas=auto.max_replicas, gpus_per_replica=svc.spec.gpu.count,
        price_per_gpu_hour=gpu.price_per_hour, slo_s=w.slo_ms / 1000.0, seed=seed, duration=w.duration))
    return reqs, perf, planned, cold, auto, cfg


def run_one(task: tuple[Workload, Condition, int, str]) -> tuple[tuple[str, str, int, str], dict[str, Any]]:
    w, c, seed, name = task
    reqs, perf, planned, cold, auto, cfg = setup(w, c, seed)
    started = time.perf_counter()
    policy = name
    if name.startswith("ours@"):   # ours at another attainment target
        policy = "ours"
        auto = auto.model_copy(update={"target_p99_latency_ms": None, "slo": SLOSpec(
            latency_ms=w.slo_ms, attainment=float(name.partition("@")[2]))})
    s = results.summarize(policies.run_policy(policy, reqs, perf, cold, auto, cfg, "h100", planned))
    return (w.label, c.label, seed, name), {**s.as_dict(), "seconds": time.perf_counter() - started}


def fluid_info(w: Workload, c: Condition, seed: int) -> dict[str, Any]:
    """The workload's saturated capacity per replica, initial replicas, and fixed pools to sweep."""
    reqs, perf, _, cold, _, cfg = setup(w, c, seed)
    capacity = policies.saturated_throughput(reqs, perf, cfg)
    per_minute = [0] * max(1, math.ceil(w.duration / 60))
    for r in reqs:
        per_minute[min(len(per_minute) - 1, int(r.arrival // 60))] += 1
    mean_need = len(reqs) / w.duration / capacity
    peak_need = max(per_minute) / 60 / capacity
    lo, hi = max(1, math.ceil(mean_need)), min(cfg.max_replicas, math.ceil(peak_need * 1.1) + 1)
    # One pool below the mean need too (when there is one): it anchors the frontier's cheap end,
    # so a policy cheaper than the smallest pool that keeps up is still compared at equal GPU-h.
    fixed = sorted({max(1, lo - 1), lo, lo + (hi - lo) // 3, lo + 2 * (hi - lo) // 3, hi})
    return {"capacity": capacity, "initial": cfg.initial_replicas, "cold": cold.ready_after(),
            "arrivals": [r.arrival for r in reqs], "fixed": [f"fixed:{n}" for n in fixed],
            "min_replicas": cfg.min_replicas, "requests": len(reqs), "service": w.service}


def fluid_at(info: dict[str, Any], duration: float, violations: float) -> float:
    """The fluid bound's GPU-hours for a workload (its `fluid_info`) leaving `violations` unserved."""
    svc, _ = service(info.get("service"))
    return fr.fluid_bound(info["arrivals"], info["capacity"], duration, info["cold"], info["initial"],
                          info["min_replicas"], violations, gpus_per_replica=svc.spec.gpu.count)


def machine() -> str:
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in subprocess.run(
            ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "")
    except OSError:
        pass
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return f"{nproc} CPUs, {model or platform.processor()}, Python {platform.python_version()}"


def _pct(x: float | None) -> str:
    if x is not None and math.isinf(x):
        return "none (the frontier has 0 there)"
    if x is not None and x < 0:
        return f"none ({1 - x:.1f}x the frontier's)"
    return "-" if x is None else f"{x:.0%}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _spread(values: list[float | None], fmt: Any) -> str:
    got = [v for v in values if v is not None and math.isfinite(v)]
    if not got:
        return "-"
    if len(got) == 1 and len(values) == 1:
        return fmt(got[0])
    mean = sum(got) / len(got)
    if any(v < 0 for v in got) and fmt is _pct:
        return ", ".join(fmt(v) for v in got)
    text = f"{fmt(mean)} ({fmt(min(got))}..{fmt(max(got))})"
    return text if len(got) == len(values) else text + f" [{len(values) - len(got)} of {len(values)} n/a]"


def _reach(per_seed: list[list[str]], plans: int) -> str:
    """'yes (k of n headrooms)' when some plan with foresight meets the goal on every seed, 'no' when
    none does on any, else on how many seeds; '-' without plans."""
    if not plans:
        return "-"
    hit = sum(1 for r in per_seed if r)
    if hit == len(per_seed):
        return "yes (" + ", ".join(str(len(r)) for r in per_seed) + f" of {plans} headrooms)"
    return "no" if hit == 0 else f"on {hit} of {len(per_seed)} seeds"


def plot_frontier(path: Path, title: str, points: list[fr.Point], ours: list[fr.Point],
                  fluid: list[tuple[float, float]], foresight: list[fr.Point]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    markers = {"hpa": "o", "keda": "s", "kpa": "^", "fixed": "D"}
    for family, marker in markers.items():
        pts = [p for p in points if p.name.startswith(family)]
        if pts:
            ax.scatter([p.gpu_hours for p in pts], [max(1, p.violations) for p in pts], marker=marker,
                       label=family, alpha=0.6, s=28)
    front = fr.frontier(points)
    ax.plot([p.gpu_hours for p in front], [max(1, p.violations) for p in front], color="grey", linewidth=1,
            label="baseline frontier")
    if fluid:
        ax.plot([g for g, _ in fluid], [max(1, v) for _, v in fluid], color="green", linestyle=":",
                label="fluid lower bound")
    seen = fr.frontier(foresight)
    if seen:
        ax.plot([p.gpu_hours for p in seen], [max(1, p.violations) for p in seen], color="purple",
                linestyle="--", marker=".", linewidth=1, label="plans with foresight (oracle)")
    ax.scatter([p.gpu_hours for p in ours], [max(1, p.violations) for p in ours], marker="*", s=160,
               color="red", label="ours (default settings)", zorder=5)
    ax.set_yscale("log")
    ax.set_xlabel("GPU-hours")
    ax.set_ylabel("SLO-violating requests (log)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-").replace("--", "-")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fast", action="store_true", help="a reduced sweep (one short workload, one seed) for tests")
    p.add_argument("--rates", action="store_true",
                   help="the real traces at other rates (RATE_WORKLOADS) -> autoscaling-rates.md, the page's table unchanged")
    p.add_argument("--jobs", type=int, default=2, help="simulations run in parallel (processes)")
    p.add_argument("--out", default=str(OUT), help="directory for autoscaling.md and the plots")
    p.add_argument("--no-page", action="store_true", help="do not rewrite the table of docs/autoscaling.md")
    p.add_argument("--condition", action="append", help="only these conditions (by label; repeatable)")
    p.add_argument("--workload", action="append", help="only these workloads (by label; repeatable)")
    p.add_argument("--seeds", help="comma-separated seeds instead of each condition's")
    p.add_argument("--baselines-only", action="store_true", help="with --reuse-baselines: only fill the file")
    p.add_argument("--reuse-baselines", metavar="FILE",
                   help="a JSON file of baseline runs to reuse and extend (development only: ours always runs; "
                        "the committed results never use it)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    loads = (FAST_WORKLOAD,) if args.fast else RATE_WORKLOADS if args.rates else WORKLOADS
    conditions = FAST_CONDITIONS if args.fast else RATE_CONDITIONS if args.rates else CONDITIONS
    sweep = FAST_SWEEP if args.fast else SWEEP
    foresight = FAST_FORESIGHT if args.fast else [] if args.rates else FORESIGHT
    partial = bool(args.condition or args.workload or args.seeds)
    if args.condition:
        conditions = tuple(c for c in conditions if c.label in args.condition)
    if args.workload:
        loads = tuple(w for w in loads if w.label in args.workload)
    if args.seeds:
        seeds = tuple(int(x) for x in args.seeds.split(","))
        conditions = tuple(Condition(c.label, c.cold_s, c.model, seeds) for c in conditions)
    if not conditions or not loads:
        raise SystemExit("no condition or workload left to run")
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()

    infos: dict[tuple[str, str, int], dict[str, Any]] = {}
    tasks = []
    for c in conditions:
        for w in loads:
            if w.conditions is not None and c.label not in w.conditions:
                continue
            for seed in seeds_of(w, c):
                info = infos[(w.label, c.label, seed)] = fluid_info(w, c, seed)
                fixed = info["fixed"][::3] if args.fast else info["fixed"]
                tasks += [(w, c, seed, name) for name in ["ours", *sweep, *fixed, *foresight]]
                if seed == seeds_of(w, c)[0] and not args.fast and not args.rates:
                    tasks += [(w, c, seed, f"ours@{t:g}") for t in TARGETS]
    figures: dict[tuple[str, str, int, str], dict[str, Any]] = {}
    cache_path = Path(args.reuse_baselines) if args.reuse_baselines else None
    cached: dict[str, dict[str, Any]] = json.loads(cache_path.read_text()) if cache_path and cache_path.exists() else {}
    if cached:
        partial = True
        for task in list(tasks):
            key = "|".join(map(str, (task[0].label, task[1].label, task[2], task[3])))
            if not task[3].startswith("ours") and key in cached:
                figures[(task[0].label, task[1].label, task[2], task[3])] = cached[key]
                tasks.remove(task)
    if args.baselines_only:
        tasks = [t for t in tasks if not t[3].startswith("ours")]
    tasks.sort(key=lambda t: (t[2], conditions.index(t[1])))   # seed 1 of every condition first
    print(f"{len(tasks)} simulations", file=sys.stderr)

    def keep(key: tuple[str, str, int, str], s: dict[str, Any]) -> None:
        figures[key] = s
        print(f"{key} {s['seconds']:.1f}s", file=sys.stderr)
        if cache_path and not key[3].startswith("ours"):
            cached["|".join(map(str, key))] = s
            cache_path.write_text(json.dumps(cached))

    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            for key, s in pool.map(run_one, tasks, chunksize=1):
                keep(key, s)
    else:
        for task in tasks:
            keep(*run_one(task))
    if args.baselines_only:
        return 0

    svc, gpu = service()
    auto = svc.spec.autoscaling
    summary_rows, target_rows, sections, verdicts = [], [], [], []
    for c in conditions:
        sections += [f"## {c.label} (seeds {', '.join(map(str, c.seeds))})", ""]
        for w in loads:
            if w.conditions is not None and c.label not in w.conditions:
                continue
            seeds = seeds_of(w, c)
            comps, ours_pts, ours_rows = [], [], []
            for seed in seeds:
                info = infos[(w.label, c.label, seed)]
                runs = {k[3]: v for k, v in figures.items() if k[:3] == (w.label, c.label, seed)}
                ours = runs.pop("ours")
                at_targets = {n: runs.pop(n) for n in [n for n in runs if n.startswith("ours@")]}
                points = [fr.Point(n, v["gpu_hours"], v["slo_violations"]) for n, v in runs.items()
                          if not is_foresight(n)]
                plans = [fr.Point(n, v["gpu_hours"], v["slo_violations"]) for n, v in runs.items()
                         if is_foresight(n)]
                me = fr.Point("ours", ours["gpu_hours"], ours["slo_violations"])
                fluid = fluid_at(info, w.duration, ours["slo_violations"])
                comp = fr.compare(points, me, fluid, plans)
                reach = fr.plans_meeting_goal(points, plans)
                comps.append(comp)
                ours_pts.append(me)
                ours_rows.append((seed, ours, fluid, comp, reach))
                if seed == seeds[0]:
                    first_points, first_plans, first_info = points, plans, info
                    targets_here = [(0.99, ours, comp), *(
                        (float(n.partition("@")[2]), v,
                         fr.compare(points, fr.Point(n, v["gpu_hours"], v["slo_violations"]), fluid, plans))
                        for n, v in sorted(at_targets.items()))]
            beats = all(cp.beats_baselines() for cp in comps)
            near = all(cp.near_foresight() for cp in comps)
            reachable = bool(first_plans) and all(r[4] for r in ours_rows)
            tag = " (held out)" if w.held_out else ""
            summary_rows.append(
                f"| {w.label}{tag} | {c.label} | "
                + _spread([r[1]["slo_attainment"] for r in ours_rows], lambda x: f"{x:.2%}") + " | "
                + _spread([r[1]["gpu_hours"] for r in ours_rows], lambda x: f"{x:.2f}") + " | "
                + _spread([cp.ratio for cp in comps], _x) + " | "
                + _spread([cp.fewer for cp in comps], _pct) + " | "
                + (", ".join(sorted({d for cp in comps for d in cp.dominated})) or "no") + " | "
                + _spread([cp.foresight_ratio for cp in comps], _x) + " | "
                + _spread([cp.foresight_fluid_ratio for cp in comps], _x) + " | "
                + _spread([cp.fluid_ratio for cp in comps], _x) + " | "
                + _reach([r[4] for r in ours_rows], len(first_plans)) + " | "
                + ("**yes**" if beats else "no") + " | " + ("-" if not foresight else "**yes**" if near else "no") + " |")
            if len(targets_here) > 1:
                target_rows.append(f"| {w.label}{tag} | {c.label} | " + " | ".join(
                    f"{v['slo_attainment']:.2%} / {v['gpu_hours']:.2f}"
                    + (" (met)" if v["slo_attainment"] >= t else "")
                    + ("; dominated" if cp.dominated else "; beats the baselines" if cp.beats_baselines() else "")
                    for t, v, cp in sorted(targets_here, key=lambda x: x[0])) + " |")
            # the first seed's sweep, in full
            fluid_curve = []
            for share in (0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0):
                allowed = (1 - share) * first_info["requests"]
                fluid_curve.append((fluid_at(first_info, w.duration, allowed), allowed))
            name = f"frontier-{slug(w.label)}-{slug(c.label)}.png"
            try:
                plot_frontier(out / name, f"{w.label}{tag}, {c.label}, seed {seeds[0]}", first_points,
                              ours_pts, fluid_curve, first_plans)
                plot = [f"![frontier]({name})", ""]
            except ImportError:
                plot = ["(plots need matplotlib)", ""]
            rows = sorted(((n, v) for n, v in figures.items() if n[:3] == (w.label, c.label, seeds[0])
                           and not is_foresight(n[3]) and not n[3].startswith("ours@")),
                          key=lambda kv: kv[1]["gpu_hours"])
            plan_rows = sorted(((n[3], v) for n, v in figures.items()
                                if n[:3] == (w.label, c.label, seeds[0]) and is_foresight(n[3])),
                               key=lambda kv: float(kv[0].rpartition("=")[2]))
            plan_line = ["Plans with foresight (seed " + str(seeds[0]) + "; headroom: SLO met / GPU-h): "
                         + "; ".join(f"{n.rpartition('=')[2]}: {v['slo_attainment']:.2%} / {v['gpu_hours']:.2f}"
                                     for n, v in plan_rows), ""] if plan_rows else []
            front_names = {pt.name for pt in fr.frontier(first_points)}
            table = ["| policy | SLO met | violations | GPU-h | scales | p99 ms | on the frontier |",
                     "| --- | --- | --- | --- | --- | --- | --- |"]
            for (_, _, _, n), v in rows:
                table.append(f"| {'**ours**' if n == 'ours' else n} | {v['slo_attainment']:.2%} | {v['slo_violations']} | "
                             f"{v['gpu_hours']:.2f} | {v['scale_events']} | {v['latency_p99_ms']:.0f} | "
                             f"{'yes' if n in front_names else ''} |")
            per_seed = [f"- seed {seed}: ours {o['slo_attainment']:.2%} / {o['gpu_hours']:.2f} GPU-h; frontier at "
                        f"equal attainment {_x(cp.ratio)}, at equal GPU-h {_pct(cp.fewer)} fewer violations; "
                        f"dominated by {', '.join(cp.dominated) or 'none'}; "
                        + (f"plans with foresight at equal attainment "
                           f"{_x(cp.foresight_ratio)} (they are {_x(cp.foresight_fluid_ratio)} the fluid bound of "
                           f"{fl:.2f} GPU-h); " if foresight else f"the fluid bound {fl:.2f} GPU-h; ")
                        + f"beats the baselines: {'yes' if cp.beats_baselines() else 'no'}"
                        + (f"; within 1.15x of foresight: {'yes' if cp.near_foresight() else 'no'} "
                           f"(plans with foresight that beat the baselines: "
                           f"{'at headroom ' + ', '.join(n.rpartition('=')[2] for n in reach) if reach else 'none'})"
                           if foresight else "")
                        for seed, o, fl, cp, reach in ours_rows]
            source = (f"{w.trace} at {w.rate:g}x" if w.trace else "the Azure conversation trace at 8x" if w.spec is None
                      else "generated")
            sections += [f"### {w.label}{tag}: {first_info['requests']} requests ({source}), SLO {w.slo_ms:g} ms, "
                         f"{first_info['capacity']:.1f} req/s per saturated replica, {first_info['initial']} warm "
                         "replicas at the start", "", *per_seed, "", *plot, *table, "", *plan_line]
            verdicts.append((w, c, beats, near, not any(cp.dominated for cp in comps), reachable))

    total = time.perf_counter() - t0
    met_count = sum(1 for _, _, b, n, _, _ in verdicts if b and n)
    beat_count = sum(1 for _, _, b, _, _, _ in verdicts if b)
    near_count = sum(1 for _, _, _, n, _, _ in verdicts if n)
    per_condition = []
    for c in conditions:
        mine = [(w, b, n, free, r) for w, cc, b, n, free, r in verdicts if cc is c]
        line = (f"- {c.label}: not dominated on {sum(1 for *_, f, _ in mine if f)} of {len(mine)} workloads "
                f"(on every seed), beats the baselines on {sum(1 for _, b, *_ in mine if b)}")
        if foresight:
            line += (f", within 1.15x of the plans with foresight on {sum(1 for _, _, n, *_ in mine if n)}"
                     f"; a plan with foresight beats the baselines on {sum(1 for *_, r in mine if r)}")
        per_condition.append(line)
    reach_line = []
    if foresight:
        reach_count = sum(1 for *_, r in verdicts if r)
        text = (f"Plans with foresight (below; each judged against the baselines like ours, at its own attainment) "
                f"beat the baselines on {reach_count} of {len(verdicts)} workload-conditions")
        if reach_count < len(verdicts):
            text += (f" on every seed; on the other {len(verdicts) - reach_count} not even a plan that knows every "
                     "arrival (and starts warm with what its first start-up needs) does on every seed here")
        reach_line = [text + ".", ""]
    target_table = [
        "Ours at three attainment targets (spec.autoscaling.slo.attainment; first seed of each row; SLO met / "
        "GPU-h, whether it met its target, and how it stands against the baselines):", "",
        "| workload | condition | " + " | ".join(f"target {t:g}" for t in (*TARGETS, 0.99)) + " |",
        "| --- | --- | " + " | ".join("---" for _ in (*TARGETS, 0.99)) + " |", *target_rows, ""] if target_rows else []
    head_table = [
        "| workload | condition | ours: SLO met | ours: GPU-h | GPU-h vs frontier at equal attainment | "
        "fewer violations than frontier at equal GPU-h | dominated by | GPU-h vs plans with foresight at equal "
        "attainment | plans with foresight vs fluid bound | GPU-h vs fluid bound | a plan with foresight beats "
        "the baselines | beats the baselines | within 1.15x of foresight |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", *summary_rows]
    command = ("make bench-autoscaling-rates (python bench/autoscaling.py --rates)" if args.rates and not partial
               else "make bench-autoscaling (python bench/autoscaling.py)" if not args.fast and not partial
               else "python " + " ".join(["bench/autoscaling.py", *(argv if argv is not None else sys.argv[1:])]))
    head = [
        ("# Autoscaling benchmark at other rates and in other orders: the real traces replayed faster and slower "
         "than in bench/results/autoscaling.md, and in 5-minute blocks reshuffled" if args.rates else
         "# Autoscaling benchmark: ours against the frontier of tuned baselines"), "",
        *(["The rows below were not tuned on; the record at the end says what was looked at on them, and "
           "how.", ""] if args.rates else []),
        f"Command: `{command}`. Date: {started:%Y-%m-%d %H:%M} UTC. Machine: {machine()}. "
        f"Wall time {total / 60:.1f} min for {len(tasks)} simulations ({args.jobs} processes).", "",
        f"Service: {SPEC.relative_to(ROOT.parent)} ({svc.spec.model.parameters} {svc.spec.model.precision} "
        f"TensorRT-LLM on {svc.spec.gpu.count} x {svc.spec.gpu.class_}, max batch 64, replicas "
        f"{auto.min_replicas}-{auto.max_replicas}); the SLO is end-to-end latency per request, and ours' "
        "targetP99LatencyMs is set to it. Ours runs at its default settings, told the planner's estimate of a "
        "replica (never the simulated engine). Every autoscaling policy starts from the same warm replica count "
        "(the first minute's arrivals at 80 % of a replica's saturated throughput); a `fixed:N` pool runs its N "
        "replicas warm from the start, as a pool sized in advance does (it pays no cold start, so its N is chosen "
        "with hindsight); Prometheus scrapes every 5 s.", "",
        "Swept baselines per workload and condition: " + ", ".join(f"`{s}`" for s in sweep)
        + ", and `fixed:N` pools around the fluid need (from one below the mean need to the peak). The "
        "frontier is their Pareto set (GPU-h, violations), joined by straight lines; comparisons interpolate "
        "on it (bench/frontier.py). The fluid lower bound provisions whole replicas per 60 s bucket at "
        "saturated throughput, at ours' attainment, charging a replica added one cold start of GPU time and "
        "a replica needed again after a gap the lesser of the gap and a cold start; 'frontier vs "
        "fluid bound' is the frontier's GPU-h at ours' attainment over it: how far the best swept "
        "configuration, chosen with hindsight, is from the bound. Plans with foresight (the simulator's "
        "`oracle:headroom=H`, H in " + ", ".join(f"{n.rpartition('=')[2]}" for n in foresight) + ") know every "
        "arrival, provision each 60 s bucket's arrivals at saturated throughput times 1 + H one cold start "
        "early, and start warm with what their first start-up needs; they run through the same simulation "
        "(queueing, batching, cold starts) but are neither baselines nor a bound. Their frontier at ours' "
        "attainment over the fluid bound is what a plan that sees the future still pays over the bound here "
        "(queueing, batching, whole pods, one headroom for every bucket); ours over it is about the price of "
        "not seeing the future. `make bench-foresight` searches plans a minute at a time instead, on the rows "
        "where these sit furthest from the bound (bench/results/foresight.md). Equal-attainment ratio '-' means no swept "
        "configuration (or no plan) reaches ours' attainment; equal-GPU-h '-' means ours is cheaper than every swept "
        "configuration. Several seeds: the mean, then (min..max).", "",
        "The goal, per workload and condition, on every seed: (1) beat the baselines: not dominated by any "
        "swept configuration, and at most 0.85x the frontier's GPU-hours at equal attainment or at least 30 % "
        "fewer violations at equal GPU-hours (on every row); (2) stay within 1.15x the GPU-hours of the plans with "
        "foresight at equal attainment (on at least 24 of the 28 generated rows). The fluid bound is shown, not "
        "judged: with long prompts a replica misses the SLO well below saturation, which the bound does not model.",
        "",
        (f"Ours beats the baselines on {beat_count} of {len(verdicts)} workload-conditions, and is within 1.15x of "
         f"the plans with foresight on {near_count} (both on {met_count})." if foresight else
         f"Ours beats the baselines on {beat_count} of {len(verdicts)} workload-conditions (no plans with foresight "
         "are run here: goal (2) is judged in bench/results/autoscaling.md)."), "", *reach_line, *per_condition, "",
        *head_table, "", *target_table,
        "What was held out, and how far that holds:", "",
        "- Ours' constants were chosen looking at the four tuned workloads at a 50 s cold start (seed 1), and at "
        "two of the three workloads marked held out: code completion (where the cause of ours' loss to fixed "
        "pools was found: prefill) and long-context RAG (which motivated the latency limit and the learned band).",
        "- How far a trend is carried ahead (at most the span of the trail it is fitted on) was chosen on the "
        "four tuned workloads at 150 s and 325 s (seed 1), between two variants; the held-out ones at those cold "
        "starts were run for both (both lost attainment on mixed tenants at 325 s: 91.5 % before, 80.1 % after) "
        "and not tuned on.",
        "- Every later change was judged on ours' figures on all 28 workload-conditions (seed 1, held-out rows "
        "included), so from there on 'held out' only means a workload was not in the first tuning set. Kept: "
        "not trending or judging a new service's first minute (found on azure at 325 s), fitting the trend over "
        "the start-up when that is longer (diurnal at 325 s), draining a backlog within a start-up when that is "
        "longer than DRAIN_S. Rejected: weighting the learned rises by their rate, UTILIZATION 1.0, a hold of "
        "two start-ups.",
        "- After the simulator's rate() was made to read a gone pod's samples as Prometheus does, on the same "
        "table. Kept: the last tick's arrivals only while requests wait, the tolerance applied to a need just "
        "over the current replicas while nothing waits (both found on the step at 50 s flapping 4<->5), the "
        "trend's slope capped while requests wait by how far the last tick leads the minute (found on the step "
        "at 150 s; azure on the curved replica lost 93.9 -> 91.7 %), a hold of one rate window when the rate "
        "falls beyond its band (diurnal at 325 s), the learned band kept under the highest rate seen within its "
        "memory (the step at 150 s; mixed tenants at 325 s lost 2 points). Rejected: the rise band over one "
        "maximum per start-up; a rise quantile of 0.8 (RAG at 150 s 82.7 -> 69.5 %); no trend at all while "
        "requests wait; not holding the replicas a drained backlog asked for (the curved replica lost 1.3-1.4 "
        "points on azure and mixed tenants).",
        "- Sixth session, on the same table. Kept: the trend carried less half a standard error of its slope "
        "(TREND_Z; found on the step at 150 s flapping 4<->5; 1.0 was measured too and cost more attainment), "
        "a burst seen once not hedged once it has passed (the spike at 325 s held 6 replicas where 2 served; "
        "azure at 325 s lost 0.5 points), the upper band without the trail's scatter around its trend (a step "
        "is not noise; diurnal at 325 s lost 1.5 points, RAG on the curved replica 3.5), that same band as the "
        "threshold of a fall that shortens the hold, the queue counted as growing only when it grew on two "
        "ticks in a row, and the tolerance holding while fewer requests wait than replicas run (both found on "
        "the step at 325 s and 150 s flapping 4<->5), the last tick's lead over the minute counted beyond the "
        "tick's counting noise (the step at 325 s: a ninth replica up after the backlog it was for). Rejected: the slope's standard error in the tolerance "
        "alone (little change), a backlog tolerated up to the latency budget (the spike on the curved replica "
        "lost 3.4 points), the last tick's arrivals with nothing queued (GPU-h up on RAG), a rise quantile of "
        "0.95 (GPU-h up on most rows), a one-tick delay within the tolerance (diurnal at 50 s 99.88 -> 99.47 %), the trend capped by the "
        "slope of the last minute alone (RAG at 150 s no longer dominated, but diurnal at 325 s lost 2.4 "
        "points and the spike on the curved replica 2.9).",
        "- Seventh session, on the same table. Kept: the trend carried no faster than the rate rose over the "
        "last rate window plus its counting noise, waiting or not (found on RAG at 150 s, 9 replicas asked at "
        "every switch where 5 served; RAG at 150 s no longer dominated; the spike on the curved replica lost "
        "2.9 points, RAG on the curved replica 1.3), and the capacity measured in saturated minutes bounding "
        "the one extrapolated from half-full batches (found on the curved replica's decision logs: the "
        "extrapolation read x0.69-0.94 where saturated minutes measured x0.61-0.65; diurnal on the curved "
        "replica 91.8 -> 98.9 %, azure at 325 s +7 % GPU-h). Rejected: the trend capped at a rate that "
        "recurred (little change but on RAG at 325 s), the rise over the last 30 s as the cap (azure and diurnal on the "
        "curved replica lost 0.7-0.9 points more), a saturated minute replacing the estimate outright, and a "
        "saturated figure forgotten after 10 or 30 minutes (less of the curved replica's gain).",
        "- Eighth session: the decision logs of azure at 325 s, the spike at 50 s and RAG at 150 s, and four "
        "changes measured on the same table, none kept: scale-down judged at the lowest capacity (token mix) "
        "seen within a start-up (azure at 325 s 98.74 -> 99.23 % but still dominated; azure on the curved "
        "replica then dominated by fixed:4), the saturated capacity used only near the token mix it was "
        "measured at (a move along the curve on azure on the curved replica), the rate read from the batches "
        "when a load falls (no change: the hold, not the demand, kept the spike's replicas), and a shortest "
        "hold of 30 s or 10 s (the spike at 50 s -2 % GPU-h; azure on the curved replica +12 % GPU-h and "
        "dominated; at 10 s the spike at 325 s lost 7 points).",
        "- Ninth session: no change to ours. The plans with foresight were added as a reference; nothing was "
        "tuned on them.",
        "- Tenth session: no change to ours. The decision logs of RAG and azure at 325 s (seed 1) were read, and two "
        "variants measured on the table (seed 1), neither kept: the trend carried no higher than the highest rate "
        "logged more than a start-up ago (RAG at 325 s +0.24 GPU-h, RAG at 150 s -0.18; the rest unchanged), and a "
        "replica's capacity taken over the token mix of the last start-up rather than the last minute (azure at "
        "325 s -0.25 GPU-h but still dominated by fixed:3; azure at 50 s 99.69 -> 98.03 %; azure on the curved "
        "replica then dominated by fixed:4, RAG at 150 s by fixed:5). The plans with foresight are now judged by "
        "the goal too.",
        "- Eleventh session: the break-even keep-alive, priced by the attainment target and only while the target "
        "is missed, and shared batches never called service time. Tuned on the table's seed 1 (the first two "
        "variants, holding replicas never seen needed again for a restart's whole cost, added 0.3-3.4 GPU-h on "
        "the step and spike rows for under 1.5 points; a price by how long a need lasted, then by how long it found "
        "requests waiting, then the gate on the measured attainment, each measured on the 28 rows) and on the Azure "
        "code trace (its per-minute arrivals, violations and replicas were read to see the first bursts, which "
        "no reactive policy meets). Kept: the last. The Mooncake conversation trace was run twice, for its "
        "summary line, and never looked into: it is held out.",
        "- Twelfth session: the keep-alive's prior and its evidence. A need seen once is held for a restart's cost "
        "(ski rental), gaps the idle time has already outlasted are no evidence, a need first asked for with "
        "requests waiting costs a whole start-up, and the needs are what the arrivals asked for (not the "
        "replicas asked to drain a backlog). Tuned on the table's seed 1 and on the Azure code trace through "
        "`simulate` at its defaults (per-minute violations and replicas, and the decision log of its first 15 "
        "minutes, were read); six variants were measured on the rows, one of them (no attainment gate) also on "
        "the Mooncake trace at 325 s, whose scale moves were read for it and for the kept variant; the gate "
        "stayed. The Mooncake rows' summary lines were seen in each comparison.",
        "- Thirteenth session: no change to ours. The Azure code trace was read through `simulate` (maxReplicas "
        "24) at targets 0.9, 0.95 and 0.99: per-minute violations of ours, fixed:2 "
        "and fixed:3, and ours' replica timeline; two variants were measured on the rows (seed 1), "
        "neither kept: a restart priced at one replica-second per second short (beats the baselines on "
        "18 of 32 rows at 0.99, 37 of 64 at 0.9 and 0.95, against 17 and 40) and the attainment gate judged over "
        "the hour rather than the last 10 minutes (13 of 32 at 0.99). The Mooncake rows' summary lines were seen "
        "in each comparison.",
        "- Fourteenth session: a restart priced as a whole start-up short, always (kept), and the two-hour rows "
        "added. The Azure code trace was played twice through `simulate` at its defaults: ours' second hour was "
        "94.0 % at 3.33 GPU-h, dominated by fixed:3 (96.4 % at 2.86), its per-minute violations, replica timeline "
        "and decision log read: the keep-alive priced a restart by whether past needs found requests waiting, "
        "which they did not when the keep-alive had held the replica, so it released the replica before the next "
        "burst (priced in full: 98.5 % at 3.52). Measured on the table's seed 1 against the recorded baselines, "
        "with the Mooncake rows' summary lines seen: 25 of 32 rows not dominated and 18 beating the baselines, "
        "against 24 and 17. Five variants measured and not kept: the price read from whether the replica was "
        "already running when a need began (second hour 95.9 %), the attainment gate held for 30 or 60 minutes "
        "after a miss (14-17 of 32 not dominated), a gate that keeps replicas while a restart's violations would "
        "not fit the window's remaining allowance (13-16), and needs read from the minute's rate rather than the "
        "tick's (the code trace's first hour dominated by fixed:2). The two-hour rows' first hours are the "
        "one-hour rows; the Mooncake two-hour row is held out like the one-hour one.",
        "- Fifteenth session: the quiet before a replica's first need within the hour counted as a gap between its "
        "needs (kept). Found on the Azure code trace played twice (its second hour's per-minute violations, "
        "replica timeline and decision log read): its largest burst asked for 7 replicas where 3 had served the "
        "hour, and the keep-alive held them 12 minutes as a need never seen. Measured on the table's seed 1 against "
        "the recorded baselines, with the Mooncake rows' summary lines seen: 27 of 36 rows not dominated, 18 "
        "beating the baselines and 23 within 1.15x of the plans with foresight, against 26, 18 and 20. Six "
        "variants measured and not kept: a restart priced by how long the layer's needs lasted (the code trace's "
        "first hour then released its third replica between bursts), the p99 within its tolerance no longer "
        "holding the replicas while demand is in charge (the first hour dominated by fixed:2), the last tick's "
        "arrivals not used while requests wait (17 beating), no attainment gate (10), and the gate held 30 or 60 "
        "minutes after a miss (15 and 12). The Azure code trace's first hour at 50 s and RAG at 50 s were read "
        "minute by minute (ours and fixed pools).",
        "- The two sessions after: the keep-alive also while the target is met, a restart then priced "
        "at its start-up alone (kept; found on azure at 325 s), then the target counted as met only when the "
        "share's one-sided 95 % lower bound over the window's requests reaches it (kept). The second was found "
        "on the Azure code trace through `simulate` at its defaults, seeds 0 to 6 (ours against fixed:2 on each; "
        "per-minute violations and replicas of ours, fixed:2 and fixed:3 and the decision logs on seeds 0 and 4), "
        "and measured on the table's seed 1 against the recorded baselines, with the Mooncake rows' summary "
        "lines seen: every generated row within 0.02 GPU-h and 1.3 points. Four variants measured and not kept: "
        "a restart always priced in full (the code trace 92.4 % at 2.76 GPU-h on seed 0; azure at 50 s no longer "
        "beating the baselines, diurnal at 50 s dominated by an HPA, RAG at 50 s and the code trace's two hours "
        "by fixed pools), the price scaled by how much of one replica's start-up of requests the window's "
        "spare allowance leaves uncovered (the same), that allowance set against the learned band over a "
        "start-up instead (the code trace's two hours dominated by fixed:3), and the bound at one standard "
        "deviation (the code trace on seed 1 at 89.8 %, worse than without it).",
        "- Then no change to ours: the real traces at other rates were replayed (`--rates`, "
        "bench/results/autoscaling-rates.md; the code and conversation traces also through `simulate` at a 4 s "
        "SLO), their per-minute violations and ours' decision logs read (the code trace at 5x, the conversation "
        "trace at 16x), and three variants measured on them and on this table's seed 1, none kept: no scale-down "
        "while p99 is over target with the batches shared (azure on the curved replica 94.7 -> 98.5 % for less, "
        "still dominated by fixed:4; beating the baselines on 16 rows of 36 where 18 did; the conversation trace "
        "at 16x still dominated), the latency limit learned as p99 over the mean time in the batch (the "
        "conversation trace at 4x and 8x at 2.7x and 3.2x the GPU-hours: its long prompts' tail is service time, which "
        "does not fall with load), and the keep-alive's needs taken at a capacity averaged over ticks (no change).",
        "- Then: a new service's band is at least one replica until ten rises are logged (kept). Found on the "
        "Azure code trace through `simulate` at its defaults, seeds 0 to 23 (ours against fixed:2, fixed:3 and "
        "fixed:4 on each; per-minute violations and replicas of ours and fixed:3 on seeds 0, 4, 5, 10 and 21, and "
        "their decision and keep-alive logs): its first burst met the one replica the first minute asked for. "
        "Measured on the table's seed 1 against the recorded baselines and on `--rates` (seeds 1 and 2), with the "
        "Mooncake rows' summary lines seen. Variants measured and not kept: the headroom shrinking with each rise "
        "logged (the code trace's mean 90.8 %, four seeds dominated by fixed:2), one replica over the demand "
        "with the keep-alive not counting it as a need (the code trace's mean 94.9 %: the replicas it had held "
        "between the first bursts went), the restart priced at a tenth of the full price while the target is met "
        "(no code-trace seed dominated, but azure at 50 s then dominated by fixed:3 and more GPU-hours on most "
        "rows), priced by the share of the violation budget spent or by how often the target was missed over "
        "the hour (more GPU-hours, less attainment on the code trace), and a replica's usable rate raised to the "
        "highest per-replica load served within the latency target (no row changed but one, by 0.01 GPU-h).",
        "- Then no change to ours: the start-up's share of the violations read on every row at 50 s (seed 1; over a "
        "tenth only on the conversation trace at 16x, 3,225 of 4,329 in the first three minutes, and on RAG, 1,333 "
        "of 3,855), the code trace at 5x read against fixed:4 minute by minute (ours lost on its first burst and on "
        "a burst after a quiet minute, when the last ten minutes' attainment, 99.9 %, priced a restart at the "
        "start-up alone), and one variant measured on this table's 50 s and 325 s rows (seed 1, the recorded "
        "baselines) and on `--rates` (seed 1), not kept: the target counted as met only when about the last hour's "
        "attainment met it too (RAG at 50 s 89.8 -> 96.4 % at 4.81 -> 6.19 GPU-h, then dominated by fixed:5; the "
        "code trace at 5x 91.3 -> 93.7 % at 3.94 -> 4.61, still dominated by fixed:4; the code trace played twice "
        "at 50 s no longer beating the baselines; 9 of the 22 rows beating them where 10 had).",
        "- Then no change to ours: the decision logs of RAG at 50 s and of azure, the step and the Mooncake trace at "
        "325 s read (seed 1), and four variants measured on this table's 50 s and 325 s rows (seed 1, the "
        "recorded baselines), none kept: the keep-alive's needs without the rising trend (the code trace at 50 s "
        "97.4 -> 95.5 %, no longer beating the baselines), the restart's price while the target is missed halved "
        "(RAG at 50 s 89.8 -> 86.0 %, the code trace no longer beating them), a replica needed by less than the "
        "tolerance over the one below not counted as a need (the Mooncake trace at 325 s 96.3 -> 98.4 %, still "
        "dominated by fixed:3; mixed tenants at 50 s +0.27 GPU-h; 10 rows beating the baselines, as before), and the restart priced in full, target met or not, for a replica "
        "needed again within the attainment's window (RAG at 50 s 89.8 -> 93.5 % at 4.81 -> 5.06 GPU-h, then "
        "dominated by fixed:5; azure at 50 s +0.45 GPU-h, no longer beating the baselines; 8 of 22 rows beating "
        "them where 10 had).",
        "- Then no change to ours: where the GPU-hours of seven rows at 325 s go, read from ours' decisions (seed 1; the "
        "replicas held over what the tick asked for, by the stabilization window and by the keep-alive: 0.5 to 1.8 "
        "replica-hours of 3.2 to 6.8), and one variant measured on this table's 50 s and 325 s rows (seed 1, the "
        "recorded baselines; at 325 s also seeds 2 and 3, the baselines run again for the rows it changed), on the "
        "150 s and curved-replica rows (seed 1) and on `--rates`, not kept: no replica started for a need whose "
        "remembered runs (three or more) all ended within half a start-up, or a whole one, while the current run has "
        "not outlasted them (started, it is ready after the burst). It changed two rows only, both at 325 s: RAG "
        "76.8 -> 75.7 % at 6.56 -> 6.26 GPU-h, still dominated by fixed pools, and the code trace's two hours 93.4 -> "
        "92.0 % at 7.03 -> 6.03, seed 1 no longer dominated, seeds 2 and 3 still by fixed:3. Where a start-up is "
        "50 s, some run of every layer outlasts it, and the rule never fired.",
        "- Then no change to ours: what a new service's one replica of headroom costs, measured by turning it off on "
        "this table's 50 s and 325 s rows (seed 1, the recorded baselines): 0.07 to 0.24 GPU-h less on every generated "
        "row, but the code trace at 50 s 97.4 -> 91.7 % and no longer beating the baselines (its two hours 97.6 -> "
        "94.6 %), diurnal at 325 s 99.9 -> 94.0 %. One variant measured there and on `--rates` (seeds 1 and 2), not "
        "kept: the headroom dropped once the minute rates seen over at least three minutes and a start-up all stay "
        "within 2.5 standard deviations of a minute's counting noise around their mean (a steady stream). Only "
        "generated rows are that steady (no real trace at any rate was, and none changed but Mooncake's, "
        "at 50 s +0.9 points for +0.11 GPU-h and at 0.5x -0.7 points); at 50 s they saved 0.07 to 0.18 GPU-h for at "
        "most 0.2 points (the spike 2.83 -> 2.69, mixed tenants 3.88 -> 3.70; neither then within 1.15x of the plans "
        "with foresight), at 325 s the step lost 2.6 points for 0.27 GPU-h more (the replica held for the headroom "
        "had been there when the step came). Read with it: the conversation trace at 16x (seed 1) loses 3,209 of its "
        "4,329 violations in its first two minutes, where its rate climbs from 51 to 88 req/s; a new service's first "
        "ticks read its rate low (series younger than the rate window: 3 to 22 req/s where 50 arrived) and its "
        "capacity high (the token mix of the requests completed first, the short ones: 80 req/s a replica at 10 s, "
        "41 at 40 s, 25 from two minutes on). Neither alone is the cause: the first 150 s told the whole trace's "
        "token mix moved that row by 51 violations (more) and 0.03 GPU-h (less), and the rate read as the "
        "completions' scaled to the series' age plus what the service holds over that age (a new service held "
        "nothing when it began) left it as it was; a warm start of three replicas for a load that needs five "
        "within two minutes is what the first minutes pay for.",
        "- Then no change to ours: the real traces reshuffled (`--rates`; cut into 5-minute blocks over the span they "
        "cover, replayed in an order each seed draws: hours the traces never had). On the code trace at 3.1x ours is "
        "dominated on 5 of 8 orders: by fixed:2 on three, where bursts after a quiet stretch met one replica (83.3 to "
        "88.8 %), by fixed:3 on two, where it spent more than fixed:3 for less attainment. On the conversation trace "
        "at 8x it is dominated on all 4, by fixed:3 (99.80 % at 3.00 GPU-h; ours 99.15 to 99.55 % at 3.10 to 3.29): "
        "a load between two and three replicas, where a pool of three is the answer. Mooncake, held out, is not "
        "dominated. Five variants measured on other orders than the bench's (12 of the code trace, 6 of the "
        "conversation trace; ours as it is: 4 and 5 dominated, 91.3 % mean on the code orders) and three of them on "
        "this table's 50 s and 325 s rows (seed 1, the recorded baselines), none kept: a restart always priced in "
        "full (the code orders 95.2 % for 9 % more GPU-hours, 8 of 12 dominated, now by fixed:3; the conversation "
        "orders 1 of 6; this table beating the baselines on 8 of 22 rows where 10 did, 9 dominated where 7 were), "
        "priced in full for the share of a layer's onsets of load that no recommendation a start-up before had "
        "covered (8 of 12 and 0 of 6; this table 8 beating, 8 dominated), priced in full for a layer whose need "
        "recurred (7 of 12 and 0 of 6; 6 beating, 11 dominated), a floor of the fewest replicas that, with what was recommended a start-up before, would have "
        "served all but the target's allowance of the hour's load (9 of 12 dominated), and minReplicas 2 set ahead, "
        "a bound on what a floor can buy (4 of 12, by fixed:3: ours ran about a replica over the floor for 3.7 "
        "points where fixed:3's third replica buys 6.5). Holding more moves the code orders from fixed:2's side "
        "to fixed:3's: a reactive policy that starts from one warm replica meets the first bursts short, and the "
        "replicas it starts for a burst shorter than its start-up are ready after it.",
        "- Then: bursts inside a minute learned from a 20 s rate (kept), and a tick's surge counted as far as this "
        "service's surges lasted a start-up (kept). Tuned on orders of the code and conversation traces that the "
        "`--rates` rows do not replay (the reshuffle's seeds 11 to 18 and 11 to 16): per-minute arrivals, 10 s peaks, "
        "violations and replicas of ours against fixed:2, fixed:3 and fixed:4 (code seed 12), ours' decisions around "
        "its losses; each variant judged there, then on this table's 50 s and 325 s rows (seed 1, the recorded "
        "baselines) and on `--rates`. One bench order was read too, once the band was kept (the code trace's seed 8, "
        "its per-minute replicas and the decisions of minutes 9 to 13: a release before a burst, which the restart's "
        "price variant below did not fix). On the tuning orders: 89.1 % at 2.77 GPU-h, 6 of 8 dominated, before; "
        "92.9 % at 2.74, 2 of 8, after. Not kept: a floor of the highest 20 s rate that recurred, at 0.5, 0.7 and 1.0 "
        "of its replicas (4, 6 and 6 of 8 dominated, fixed:3 now, at up to 3.8 GPU-h), the band's ceiling read over "
        "20 s as well (8 of 8 dominated by fixed:3 at 3.21 GPU-h), a restart always priced in full with the new band "
        "(the code orders 95.5 % at 3.11 GPU-h, 6 of 8 dominated; the conversation orders none, at 3.68 GPU-h where "
        "fixed:3 costs 3.00), the 20 s rate less 1.65 or 2.5 standard deviations of its noise rather than 3 (the "
        "conversation trace at 8x at 50 s, at 3.01 GPU-h, dominated by fixed:3 by 0.01), every surge counted rather "
        "than those beyond 3 standard deviations of the tick's noise (RAG at 50 s 89.8 -> 88.4 %: its noise surges, "
        "gone a minute later, taught it that its steps pass too), and surges weighted by their size (no change). "
        "On `--rates` the code orders go from 89.5 % at 2.82 GPU-h to 92.2 % at 2.81, dominated on 5 of 8 as "
        "before (fixed:3 on three, at 2.92 to 3.03 GPU-h; fixed:2 on two, at 88.4 and 89.1 %), the conversation "
        "orders on 3 of 4 where 4 were; Mooncake, held out, is unchanged.",
        "- Then no change to ours. Variants measured on the code and conversation traces' tuning orders (the "
        "reshuffle's seeds 11 to 18 and 11 to 16), on this table's rows at every cold start (seed 1, the recorded "
        "baselines) and on the real traces at other rates (seed 1, summary lines; the first variant also on the "
        "code trace's eight bench orders, summary lines only), none kept. (1) While the target is missed, a "
        "restart priced for as long as the replica's needs lasted, at most a start-up, instead of a whole "
        "start-up: the tuning orders 92.9 -> 92.5 % at 2.74 -> 2.68 GPU-h, 1 of 8 dominated where 2 were; but the "
        "code trace at 50 s 97.4 -> 95.5 %, and its two hours at 50 s then dominated by fixed:3. A burst shorter "
        "than a start-up leaves a backlog longer than itself, and only a replica held warm serves it. (2) The "
        "same price scaled by how far into the replica the forecast's needs went: the same two rows, the same "
        "way. (3) A new service's first minute read at its 20 s rate (its minute rate reads low while its series "
        "are young): the conversation trace at 16x unchanged, the code trace at 8x 91.7 -> 90.6 % for 0.4 GPU-h "
        "less. (4) The capacity extrapolated from unsaturated minutes capped at the plan's: the code trace at 5x "
        "92.6 -> 92.9 % for 0.1 GPU-h less, at 8x 91.7 -> 91.3 % for 0.1 more, the conversation trace's orders "
        "0.04 GPU-h more. (5) Twelve constants moved one step either way, on the tuned workloads at every cold "
        "start and the tuning orders (30 rows, 9 dominated as they are). UTILIZATION 1.0 (7 dominated) was then "
        "run on the whole table: every row cheaper and lower, 16 rows beating the baselines where 17 did, 21 "
        "within 1.15x of foresight where 20 were, azure at 150 s dominated by fixed:3, mixed tenants at 50 s 94.0 "
        "-> 92.6 %. RISE_MEMORY_S 3600 (8 dominated): the code trace at 50 s 0.1 GPU-h more, its two hours at 50 "
        "s 97.7 -> 97.0 % for 0.23 more. PREFILL_UTILIZATION 0.8, RISE_QUANTILE 0.8, BAND_Z 1.0 and DRAIN_S 120 "
        "(8 each) cost 0.2 to 0.6 points of attainment; the rest left 9 to 13 dominated.",
        "- Then no change to ours again. The pre-warm half of the hybrid-histogram policy (\"Serverless in the "
        "Wild\") measured in four forms on the same 53 rows (seed 1, summary lines): a replica no longer needed "
        "released at once and started again one start-up before the shortest remaining gap seen, held to the gap "
        "break-even picks, where that costs less than holding it through the gaps (a gap shorter than the start-up "
        "paying part of a restart). Rows of one burst or one step came out cheaper at the same attainment (the "
        "spike at 150 s 3.82 -> 3.12 GPU-h, mixed tenants at 325 s 5.43 -> 4.60, the step at 325 s 4.18 -> 3.96 "
        "and no longer dominated): the keep-alive holds a replica needed once for a restart's cost, the pre-warm "
        "releases it and would start it again only after the quiet seen before its need. Every form lost on the "
        "real code trace: at 50 s 97.5 -> 91.0 % (pre-warm on every gap), 95.3 % (a next gap shorter than any seen "
        "counted as 0.3 of a restart), 93.5 % (only while one gap longer than the idle time remained) and 93.5 % "
        "(only for a replica needed once); its two hours at 50 s then dominated by fixed:3 in all but the first, "
        "the code orders 90.1-93.0 % at 2.56-2.69 GPU-h where they are at 92.9 % for 2.74 (fixed:2 89.7 % at 1.91, "
        "fixed:3 96.4 % at 2.87). Its bursts come at irregular gaps: the shortest seen is no lower bound on the "
        "next, and a need seen once after a quiet is the first of a run (the reason a need seen once is held). "
        "Long-context RAG, held out, at 50 s 89.8 -> 86.0-89.5 %.",
        "- Two more, measured the same way, neither kept. (1) While the target is met, a restart priced at its "
        "start-up plus a twentieth of what it costs while the target is missed (the 5 % chance, at the 95 % bound "
        "that judges it met, that it is in fact missed), or at the chance of a miss that the window's count gives: "
        "the code orders 92.9 -> 93.5 % at 2.74 -> 2.73 GPU-h (1 of 8 dominated where 2 were), but 0.01-0.43 GPU-h "
        "more on 41 of the 53 rows, azure on the curved replica then dominated by fixed:4 and mixed tenants at 325 "
        "s by an HPA; the chance from the count (under a thousandth once thousands of requests are counted) "
        "changed nothing. The conversation trace's order 15, which loses most of its hour's violations to one "
        "release, was not moved by either: that release is demand's, on a capacity extrapolated from unsaturated "
        "minutes at x1.16 the plan's. (2) A replica's usable rate capped by the latency seen at the load it serves "
        "(the rate a replica serves times the latency target over the p99, both less the plan's time alone in a "
        "batch, after a minute at the same ready replicas, with nothing queued and the p99 over half the target): "
        "the code orders at 8.78 GPU-h (7 of 8 dominated; long prompts put the p99 far over the plan's time alone "
        "in a batch at any load), the conversation orders 3.05 -> 3.18 GPU-h for 0.02 points.",
        "- And the plan's line learned as two factors, not one: the unsaturated minutes' time in the batch "
        "(Little's law) fitted, by least squares that forget a fiftieth a sample and lean on the plan as five "
        "samples' worth, as a factor on the plan's time alone in a batch plus a factor on its time per busy slot, "
        "and a full batch's rate read from that line. On the conversation trace's order 15 it found the replica "
        "faster than planned alone (x0.78) and slower per slot (x1.48), a full batch at x0.82 the plan where one "
        "factor had read x1.16, and the release that cost that hour most of its violations was not made (98.8 -> "
        "99.5 %, the same GPU-h). Weighted by the batch's occupancy, as the one factor is, it lost elsewhere: on "
        "the seed-1 rows 21 beat the baselines where 23 do, code completion (held out) on the curved replica 99.3 "
        "-> 93.4 %, the real code trace at 50 s 97.5 -> 96.6 % and its two hours 97.7 -> 95.6 % for less (5.22 "
        "GPU-h where 6.09), the conversation orders 0.01-0.12 GPU-h more, azure at 150 s dominated by fixed:3. "
        "Unweighted, the code trace's few requests in flight (prompts of thousands of tokens, whose prefills stall "
        "the batch) read the time alone at x2-x30 the plan's, and its orders ran at 2.92 GPU-h, 4 of 8 dominated.",
        "- And a replica's planned capacity taken at the heaviest token mix the service sent over the last "
        "start-up and a minute, not the last minute's (a light minute released a replica that the next asked "
        "back): on the tuning rows 14 of 30 dominated where 9 are, the code orders 92.4 % at 2.96 GPU-h (6 of 8 "
        "dominated), the conversation orders 0.08 GPU-h more at the same attainment, and the conversation trace's "
        "order 15 released the same replica all the same (at the heaviest mix its capacity still read 34 req/s a "
        "replica, where about 25 meet the SLO).",
        "- And two readings of the last misses, measured on the 53 rows that the variants before were (every "
        "table row at seed 1 at all four cold starts, the `--rates` rows at seed 1, the code and conversation "
        "traces' tuning orders), against the recorded baselines; neither kept. (1) A restart priced as if the "
        "target were missed, even while it is met, for a replica whose last restart within the hour found the p99"
        " over target while it started (the conversation trace's order 14 lost its violations to two such "
        "releases of its third replica, the release at minute 12 asked back at 16, the one at 51 at 53): 20 rows "
        "beat the baselines where 23 do and 20 are dominated where 16 are; the conversation orders 0.08-0.57 "
        "GPU-h more (3 of 6 dominated by fixed:3 where 4 were), the code orders 0.05-0.35 more (4 of 8 dominated "
        "where 2 were), RAG at 50 s 89.8 -> 93.3 % at 4.81 -> 5.22 GPU-h, then dominated by fixed:5. A restart "
        "that missed once is held for at the missed price, where the target is met over the window, and the hours"
        " then hold replicas a fixed pool does without. (2) The rising trend capped at the last window's climb "
        "without the allowance for its counting noise (at 16 req/s the allowance is 1.2 req/s a minute, about 6 "
        "req/s carried over a 325 s start-up: on long-context RAG's flat high phase the trend forecast +4 to +11 "
        "req/s, and it held 9 replicas where 5 served): azure at 325 s 3.76 -> 3.56 GPU-h and RAG at 325 s 6.78 "
        "-> 6.60, both still dominated; RAG at 150 s 85.6 -> 84.0 % for 0.15 GPU-h more, mixed tenants at 325 s "
        "72.4 -> 71.7 %, code completion on the curved replica 99.3 -> 98.9 %; 23 beating and 15 dominated where "
        "23 and 16 are. The same cap less that allowance: 22 beating, 16 dominated.",
        "- And a restart priced while the target is met by how much of the window's violation budget was used "
        "(one less the attainment's lower bound, over one less the target), times a share of the missed price, so"
        " that the price rises towards the gate instead of jumping twentyfold at it (on the code trace's order 12"
        " the window's attainment went from 98.2 to 99.5 % as a burst's minute left it, the third replica was "
        "released at its start-up's price, and the next burst, ten seconds later, found two: 508 violations more "
        "than a pool of three had there). Measured on the 53 rows, then on the table's seeds 2 and 3 (64 rows, "
        "summary lines only); none kept. At the whole missed price: 20 rows beating, 19 dominated (23 and 16 "
        "now); the code orders 92.9 -> 94.7 % at 2.74 -> 2.88 GPU-h, 3 of 8 dominated. At 0.3 of it: 23 beating "
        "and 16 dominated on the 53 rows, the code orders 92.9 -> 94.0 % at 2.74 -> 2.76 GPU-h (1 of 8 "
        "dominated), the real code trace at 50 s 97.5 -> 97.7 % for 0.04 GPU-h more; but on seeds 2 and 3, 33 of "
        "64 beating where 37 do and 21 dominated where 18, at a lower mean attainment. At 0.1: 22 and 16; seeds 2"
        " and 3, 37 and 20. At 0.5: 21 and 17; seeds 2 and 3, 31 and 22. The share used squared, or cubed, at the"
        " whole price: 21 beating with 17 and 16 dominated.",
        "- And the capacity learned from unsaturated minutes weighted towards full batches. Read first, per "
        "minute, on three rows (the sample's ratio of the plan's line to the time Little's law gives, binned by "
        "how full the batch was): on the conversation trace's order 15 it falls as batches fill (x1.14 at a tenth"
        " to a fifth full, x1.00 at a fifth to three tenths, x0.89 at half full), and so it does on code "
        "completion on the curved replica (x0.93, x0.84, x0.75 over the first three tenths); on the code trace's "
        "order 12 it is x0.25 to x3.7 in nearly empty batches and x0.26-0.32 in the few fuller ones (bursts whose"
        " prefills queue inside the batch; an M/D/1 wait for the prefill added to the line moved none of these by"
        " more than 0.04). Measured on the 53 rows, neither kept: (1) each sample weighted by the square of its "
        "batch's fill, not the fill: conversation order 15 98.8 -> 99.5 % at the same GPU-h, but the code orders "
        "92.9 -> 90.4 % at 2.74 -> 2.36 GPU-h (the capacity stays near the plan's, learned more slowly), 21 rows "
        "beating and 18 dominated where 23 and 16 are; (2) no sample from a minute whose prefill, by the plan, "
        "kept the replica busy over 70 % of the time: one row moved (code completion at 50 s, 99.67 -> 99.66 % at"
        " 4.67 -> 4.64 GPU-h).",
        "- And the gate with hysteresis: once the window's attainment has missed the target, it counts as met "
        "again only when its lower bound clears the target by half (or three tenths) of the violations the target"
        " allows, so that a bad minute leaving the window does not flip a restart's price from the missed one to "
        "a start-up's at once (the flip that released the code trace's order 12's third replica ten seconds "
        "before a burst). Measured on the 53 rows (the same gate without the margin reproduced every row as it "
        "is): at a half, 21 rows beating and 17 dominated where 23 and 16 are, the code orders 92.9 -> 93.3 % at "
        "2.74 -> 2.81 GPU-h, the real code trace at 50 s 97.5 -> 97.4 % at 2.82 -> 2.92; at three tenths, 21 and "
        "17, the code orders at the same attainment for 0.03 GPU-h more. Not kept.",
        "- And a missed restart's price raised while the target stays missed, as a dual price would be (the "
        "penalty's multiplier grows by e every ten minutes of ticks that miss the target, shrinks as fast while "
        "it is met, at least 1, at most 4 or 16: the same runs, the holds it buys reach the longest gaps seen "
        "before 4). Measured on the 53 rows (at most 1, every row as it is): 21 rows beating and 20 dominated "
        "where 23 and 16 are; the code orders 92.9 -> 93.4 % at 2.74 -> 2.88 GPU-h, 5 of 8 dominated where 2 "
        "were, the spike at 50 s 0.29 GPU-h more for no attainment, RAG at 50 s 0.41 more, then dominated by "
        "fixed:5. Misses that releases did not cause (a burst on replicas already running, a step seen a start-up"
        " late) raise it as much as those they did, and it buys holds where nothing is gained. Not kept.",
        "- And one price for a restart whatever the window's attainment, with no gate: a constant price of "
        "violations is what an efficient trade of GPU-hours for attainment over the hour would pay, where the "
        "gate sells them at nothing in a window that met the target and buys them at twenty start-ups in one that"
        " missed it. A restart at one start-up times 1 + k x attainment / (1 - attainment), k from 0.02 to 0.1 "
        "(the missed price is k = 0.2), measured on the 53 rows and then on the table's seeds 2 and 3 (64 rows, "
        "summary lines only). k = 0.03 was the best of them: 14 of 53 rows dominated where 16 are, 15 of 64 where"
        " 18 are, the code orders 92.9 % at 2.74 -> 2.62 GPU-h with none dominated (2 now), the conversation "
        "orders one fewer dominated; but 22 of 53 rows beating the baselines where 23 do, 35 of 64 where 37 do, "
        "and the real code trace at 50 s 97.5 -> 91.9 % at 2.82 -> 2.66 GPU-h (its two hours 97.7 -> 92.9 %, then"
        " dominated by fixed:3), RAG at 50 s 89.8 -> 85.9 %. The code trace's hour is held by the missed price "
        "between its bursts, which no constant this low pays. k = 0.02: 22 beating, 16 dominated; 0.04: 22, 13 "
        "(seeds 2 and 3: 33, 18); 0.05: 20, 11 (34, 21); 0.1: 18, 20. Not kept.",
        "- And three more prices for the keep-alive's restart, measured on the 53 rows (seed 1 of the table's "
        "rows, the code and conversation orders, the real traces at other rates), none kept. (1) The share of the"
        " replica that the arrivals needed (the forecast level over the usable capacity, at its highest within "
        "the hour, less the replicas below it, from 0 to 1) times the missed price, with no gate, so that a "
        "replica held only as headroom is released at its start-up's price and one the rate needs is held at the "
        "target's: 16 rows beating the baselines where 23 do, 23 dominated where 16 are, 4.10 GPU-h on average "
        "where 3.88 are. The real code trace at 50 s went 97.5 -> 87.2 % (dominated by fixed:2): its bursts are "
        "ten-second surges that the level does not count as a replica's need. Smooth loads held each replica a "
        "restart's cost after every decline (diurnal at 50 s 3.19 -> 3.75 GPU-h, dominated by "
        "`hpa:metric=concurrency,target=48`); RAG at 50 s went 89.8 -> 95.9 % at 4.81 -> 5.25 GPU-h, dominated by"
        " fixed:5. (2) The price fixed when a replica's gap begins (met or missed as the window stood at its last"
        " need), so that a bad minute leaving the window cannot release a replica in the middle of a gap: 21 "
        "beating, 24 dominated, 4.18 GPU-h. A replica's last need falls in the minutes that missed, so nearly "
        "every gap was priced as missed. (3) The met test's bound at 2.5 and 3.5 standard deviations instead of "
        "1.645: 22 beating and 16 or 17 dominated, all within a few hundredths of a GPU-hour; the code order 12's"
        " release ten seconds before its largest burst came at either. Traces sought for the held-out set and not"
        " obtained here: BurstGPT and Mooncake's tool-and-agent trace (their files are not in the copies of the "
        "repositories reachable from this machine), Azure's 2024 week-long traces (hosted outside the "
        "repository), and ServeGen (Alibaba Model Studio: per-client rates and fitted inter-arrival laws for each"
        " 10-minute window, no arrival times).",
        "- And a restart priced by the violations that restarts cost this service: each scale-up is judged one "
        "start-up and a minute later by how many violations the gateway's window gained meanwhile (per replica "
        "added), and the keep-alive prices a restart at its start-up plus their average over the hour, each "
        "violation at k x attainment / (1 - attainment) times a request's share of a replica's usable second (the"
        " GPU time of k x 99 requests at 0.99), so that a service whose scale-ups come in time releases cheaply "
        "and one whose bursts arrive faster than replicas start holds them. Measured on the 53 rows. Without the "
        "gate, k = 0.2: 13 rows beating the baselines where 23 do, 28 dominated where 16 are, 4.37 GPU-h on "
        "average where 3.88 are (k = 1: 10 and 31): a one-off step or spike costs many violations while replicas "
        "start, and its replicas were then held a restart's whole (and now large) cost: the spike at 50 s 2.83 ->"
        " 4.32 GPU-h, mixed tenants at 50 s 3.88 -> 5.42. Behind the gate (measured only while the window misses "
        "the target), k = 0.2: 20 beating, 17 dominated; k = 0.05: 21 and 18; the real code trace at 50 s 97.5 ->"
        " 91.7 and 87.6 %. Not kept.",
        "- And a scale-down held while the p99, scaled by the load each remaining replica would take on (current "
        "over desired replicas), would pass the latency target: under in-flight batching a replica's batch grows "
        "with its share of the load, so a p99 already at two thirds of the target crosses it when three replicas "
        "become two. Read first on the conversation trace's order 15, whose violations are nearly all the two "
        "minutes after its third replica was released at 710 s (p99 5.5 s against 8 s, 44 req/s on three "
        "replicas; two then met 54 to 67 req/s): the guard held it 30 s, until the next minute's p99 read 4.2 s, "
        "and the release came then (98.83 % as before). Measured on the 53 rows: 22 rows beating the baselines "
        "and 17 dominated where 23 and 16 are, 3.94 GPU-h where 3.88 (mixed tenants on the curved replica 89.8 ->"
        " 93.4 % at 5.08 -> 6.15 GPU-h, the real code trace at 5x 4.18 -> 4.51 GPU-h, still dominated by fixed:4,"
        " azure on the curved replica newly dominated by fixed:4). A minute's p99 of a bursty load moves by half "
        "between minutes, and a guard read from it holds or releases by that noise.",
        "- And six more readings, measured on the 53 rows (and the last two also on the table's seeds 2 and 3, 64"
        " rows, summary lines only); none kept. First, where the code trace's orders lose once learning is over: "
        "in their second half-hours ours spends about what fixed:3 does (1.18 to 1.52 GPU-h against 1.43) and "
        "misses more on six of eight (790 violations against 108 on order 14, 1,701 against 892 on order 18): a "
        "misallocation of the same GPU time, not the cost of learning. On order 14 a quiet minute's light token "
        "mix read a replica's usable rate as 13.4 req/s where the minute before read 8.7, and the third replica "
        "went 30 s before a burst (583 violations where fixed:3 had 60). (1) The capacity at the SLO learned as "
        "the line of each minute's p99 over the load per replica (least squares, then Theil-Sen, then on the "
        "minute's 20 s peak): the conversation trace's p99 does not rise with load below saturation (3.7 s at 21 "
        "req/s a replica, 5.4 s at 12: its long prompts' tail), and the code trace's follows its bursts, so the "
        "line asked for twice the GPU-hours there (the code orders 94.9 to 99.2 % at 4.2 to 7.1 GPU-h, where they"
        " are at 2.6 to 2.9); used only to hold a scale-down, 22 rows beating the baselines where 23 do. (2) The "
        "capacity taken at the plan while no saturated minute had measured it, where unsaturated minutes read it "
        "faster: 23 beating and 16 dominated, as now. (3) The trend's cap without the counting noise carried over"
        " a start-up (the noise of a minute's rise, carried 325 s, added 6.7 req/s on RAG), and carried no longer"
        " than the rate has risen: 22 or 23 beating and 15 or 16 dominated; on seeds 2 and 3, 37 and 18, as now. "
        "(4) A restart priced as missed, while the target is met, for a replica without which the window's "
        "arrivals over the replicas below it would have missed it: 18 beating, 21 dominated. (5) A floor at the "
        "median, 75th or 90th percentile of what the last 30 minutes' ticks asked for: 20, 16 and 13 beating, 17,"
        " 19 and 26 dominated. (6) The token mix a replica is planned for taken over the last 10, 20 or 30 "
        "minutes' requests, not the last minute's: 25 beating and 16, 15 and 15 dominated on the 53 rows (at 20 "
        "minutes the conversation orders 13 and 14 no longer dominated, order 15 98.8 -> 99.8 %; the code orders "
        "92.9 -> 92.2 %), but 31 and 36 beating and 21 and 19 dominated on seeds 2 and 3 where 37 and 18 are (RAG"
        " at 50 s then dominated by fixed:5): no gain over the 117 rows.",
        "- And one more mechanism, measured on the 53 rows, not kept: a floor found in hindsight. Each tick's "
        "load (the larger of the minute's and the last 20 s arrival rate, over a replica's usable rate) was "
        "remembered for an hour; from 15 minutes on, a fluid queue over those loads gave the fewest replicas of a"
        " fixed pool that would have met the target (a request missing when the backlog per replica passed half "
        "the latency target), and that pool was held as a floor whenever it cost no more than ours had spent over"
        " the same span. 20 rows beating the baselines where 23 do, 18 dominated where 16 are. The conversation "
        "orders 13, 14 and 16 were no longer dominated by fixed:3 (order 14: 99.77 -> 99.86 % at 3.09 -> 3.14 "
        "GPU-h), but order 12 was; RAG at 50 s went 89.8 -> 96.2 % at 4.81 -> 5.35 GPU-h and was dominated by "
        "fixed:5; mixed tenants at 325 s kept 72.4 % for 5.43 -> 6.16 GPU-h (the floor came after the bursts it "
        "was learned on). Variants: the floor only where the pool cost at most 0.95 of ours, 21 beating and 18 "
        "dominated; a request missing only past the whole latency target, 19 and 18; a 30-minute memory, 20 and "
        "18; above the floor only the load measured now (no band), or 1.2 times it, 20 and 22, 20 and 19. Once a "
        "floor holds, ours pays the pool and the bursts above it, so it trades the pool's misses for GPU-hours "
        "rather than undercutting it.",
        "- And two more readings on the 53 rows, none kept. (1) The quantile of the learned rises that the upper "
        "band covers, 0.8 and 0.95 instead of 0.9 (so the first 5 or 20 rises learned by their maximum): 22 rows "
        "beating the baselines where 23 do, 16 and 19 dominated where 16 are, 3.81 and 3.97 GPU-h on average "
        "where 3.88 are. (2) The needs the keep-alive remembers taken without the trend (the level and its band),"
        " without the band too (the level alone, plus a new service's replica), or without the band but with the "
        "trend: 22, 20 and 20 beating, 15, 17 and 16 dominated. Read on long-context RAG at 150 s, dominated by "
        "fixed:5 (85.6 % at 5.92 GPU-h against 99.4 % at 5.00): its rate switches between about 6 and 16 req/s, a"
        " switch asks for 8 replicas where 5 serve 16 req/s, and with the target missed after the switch a "
        "restart is priced at 20.8 start-ups (52 minutes at 150 s), so the eighth replica was held 35 minutes; "
        "none of the three changed that row. Needs without the trend, on the table's seeds 2 and 3 (64 rows): 36 beating and 19"
        " dominated where 37 and 18 are.",
        "- The keep-alive's hold capped at an absolute time, measured on these rows before it was adopted (the "
        "policy the tables above measure caps it at scaleDownStabilizationSeconds; the figures here are the "
        "policy before it, and with it). While the target is missed a restart is priced at 20.8 start-ups, so a "
        "replica asked for in a burst or a level switch was held up to 52 minutes at 150 s (long-context RAG "
        "above). Capped at 300 s (the default scaleDownStabilizationSeconds, and HPA's down-stabilization), 24 "
        "rows beat the baselines where 23 do and 14 are dominated where 16 are, at 3.79 GPU-h on average where "
        "3.88 are (attainment 93.7 % where 94.1 %); on the table's seeds 2 and 3, 41 beating and 13 dominated "
        "where 37 and 18 are; on eight Mooncake rows (the real trace at four rates and cold starts, and three "
        "reshuffled orders) no change. Among the rows it moves: the real code trace at 325 s 94.2 % at 3.19 GPU-h"
        " (dominated by fixed:3) -> 91.4 % at 2.85 (not dominated), at 50 s 97.5 % at 2.82 -> 97.2 % at 2.55; RAG"
        " at 150 s 5.92 -> 5.54 GPU-h (still dominated by fixed:5); the conversation trace x8 at 50 s 97.9 % at "
        "4.00 -> 96.6 % at 3.85. The cap's shape on the 53 rows: 180 s 22 beating and 16 dominated, 240 s 23 and "
        "14, 360 s 25 and 15, 450 s 24 and 16, 600 s and 1,200 s 23 and 16 (on seeds 2 and 3: 240 s 42 and 15, "
        "360 s 41 and 15). Capped in start-ups instead (2, 4 or 6 start-ups): 22, 21 and 23 beating, 16, 17 and "
        "15 dominated; holding one or three start-ups only when no longer gap was seen: 21 and 22 beating, 16 "
        "dominated.",
        "- With the cap adopted, one more reading on the tuning rows (seed 1 of the table and the rows at other "
        "rates and orders, 48 in all), not kept: a replica's capacity taken at the heaviest token mix planned "
        "over the last start-up (a light minute's mix released a replica that the next minute asked back, on the "
        "conversation trace at 16x and at 325 s). 24 rows beat the baselines, as with the cap alone; 15 are "
        "dominated where 14 are; 4.12 GPU-h on average where 4.03 are (attainment 94.0 % where 93.8 %). The code "
        "trace at 325 s ran 91.5 % at 3.41 GPU-h, dominated by fixed:3, where it runs 91.4 % at 2.85. Mooncake "
        "was seen in the summary lines only: 98.4 % at 3.23 GPU-h at 325 s, still dominated by fixed:3. The "
        "conversation trace x8 at 325 s was read minute by minute with the cap: most of its misses are its first "
        "five minutes (two warm replicas where three serve, a 325 s start-up away) and one scale-down to the edge "
        "of the planned capacity at minute 42, after which requests waited a start-up.",
        "- Then three more readings on the same 48 rows, none kept. (1) After a one-off burst, the band capped at "
        "the RISE_QUANTILE of the rises logged outside it rather than at the highest rate outside it (on the "
        "conversation trace x8 at 325 s the band was +1.5 req/s, its counting noise alone, at the scale-down to "
        "two replicas at minute 42, after which requests waited a start-up): 22 rows beat the baselines where 24 do, "
        "15 are dominated where 14 are, at 4.17 GPU-h on average where 4.03 are. That row went 98.8 -> 99.3 % at "
        "3.77 -> 3.71 GPU-h, still dominated by fixed:3; the real code trace at 50 s 97.2 % at 2.55 -> 2.86 "
        "GPU-h, no longer beating the baselines, and at 325 s 2.85 -> 3.47, then dominated by fixed:3; RAG at 150 "
        "s then dominated by fixed:6 as well (5.54 -> 6.40 GPU-h). (2) The keep-alive's hold capped at the longer "
        "of scaleDownStabilizationSeconds and one start-up (releasing an idle replica sooner than a start-up can "
        "cost more than holding it), and (3) at the longer of the window and two start-ups: only the 325 s rows "
        "move; 24 beating and 15 dominated, at 4.03 and 4.07 GPU-h; the code trace at 325 s is then dominated by "
        "fixed:3 (91.4 % at 2.87, and 94.2 % at 3.08), the conversation trace x8 and Mooncake at 325 s stay "
        "dominated. Two decision logs were read, nothing changed after: long-context RAG at 50 s (at 16 req/s its "
        "demand asks for 4.6 to 5.05 replicas, and a sixth asked for at 5.05 is kept by the keep-alive 300 s at a "
        "time: six replicas for most of its second high phase where fixed:5 serves 99.4 %), and Mooncake at 325 s "
        "minute by minute, while the last two readings ran (its misses are its first six minutes, two warm "
        "replicas where three serve, and a scale-down to two at minute 46 when a lighter minute's token mix read "
        "a replica's full rate as 2.6 req/s where 2.0 had been read).",
        "- And (4), after those logs: the replicas the arrivals ask for counted as a need for one replica fewer "
        "where they ask for no more than the tolerance over it (RAG's 5.05 a need for five, not six): 25 rows "
        "beat the baselines where 24 do and 15 are dominated where 14 are, at 4.01 GPU-h on average where 4.03 "
        "are. The step at 325 s is no longer dominated (3.96 GPU-h where fixed:4 costs 4.00), RAG on the curved "
        "replica now beats the baselines; but the real code trace at 325 s goes 91.4 -> 89.0 %, then dominated by "
        "fixed:2 and fixed:3, and at 8x by fixed:5; RAG at 50 s 87.4 -> 86.1 % for 0.10 GPU-h less. Not kept.",
        "- And (5), the same with an absolute margin: the replicas the arrivals ask for counted one fewer where "
        "they ask for no more than a tenth of a replica over the count below (5.05 a need for five; 2.15 still "
        "for three). On the 48 rows 25 beat the baselines and 13 are dominated, where 24 and 14 are, at 4.02 "
        "GPU-h on average where 4.03 are (attainment 93.81 % where 93.79 %): the step at 325 s no longer "
        "dominated (3.96 GPU-h), azure-conv on the curved replica 96.6 -> 97.8 %, RAG on the curved replica now "
        "beating the baselines; the real code trace unchanged at every rate but 8x (6.33 -> 6.29 GPU-h); Mooncake "
        "x2, held out, 97.3 -> 96.8 % at 5.01 GPU-h, dominated by fixed:5 as before. On the table's seeds 2 and 3 "
        "(68 rows, summary lines only) 40 beat the baselines and 14 are dominated where 41 and 15 are: the step "
        "at 150 s on seed 3 no longer dominated, azure-conv at 150 s on seed 2 no longer beating the baselines, "
        "RAG at 325 s on seed 3 60.3 -> 54.0 %. Better on the whole by a little; not adopted here, for want of "
        "the full bench run that adopting it needs.",
        "- Then (5) was adopted (NEED_SLACK, autoscaling/policy.py), on the full three-seed runs of both "
        "pages. Per workload and condition the counts are those before it: 19 of 36 beat the baselines on "
        "every seed, 20 are within 1.15x of the plans with foresight, 5 of 11 are not dominated at 325 s. Per "
        "seed, 81 of the table's 100 rows are not dominated where 79 were (the step at 325 s on seed 1, 3.96 "
        "GPU-h, and at 150 s on seed 3) and 61 beat the baselines as before (RAG on the curved replica on "
        "seed 1 gained, azure-conv at 150 s on seed 2 lost); azure-conv at 325 s 98.79 -> 99.27 % at 3.77 -> "
        "3.65 GPU-h, still dominated by fixed:3; RAG at 325 s 75.0 -> 72.9 % on average (seed 3 60.3 -> 54.0 "
        "%). On the rates page 16 of 30 rows are not dominated, as before, and 8 beat the baselines where 9 "
        "did: Mooncake reshuffled (held out), its second order, 99.28 -> 98.85 % at 2.86 GPU-h.",
        "- With (5) adopted, one decision log read and four readings on the 48 tuning rows (seed 1 of the table "
        "and the rows at other rates and orders), none kept; the policy as it is: 25 rows beating the baselines, "
        "13 dominated, 4.02 GPU-h on average, 93.81 % attainment. The log: long-context RAG at 50 s, where 4,681 "
        "of its 4,766 violations fall in the two minutes after each of its four switches up (16 req/s meeting the"
        " two or three replicas of the low level for a start-up), and where its high phases ran six or seven "
        "replicas where fixed:5 serves 99.4 %: a p99 within the tolerance of the target (9.5-9.8 s against 10 s) "
        "recommends the current replicas, and that recommendation, not demand's, holds the scale-down for the "
        "whole stabilization window and renews the top replica's need for the keep-alive. (1) The keep-alive's "
        "cap lifted (a replica held for the restart's whole price): 22 beating, 15 dominated, 4.12 GPU-h, 94.29 "
        "%; RAG at 50 s 87.4 -> 89.8 % at 4.81 GPU-h, the code trace at 50 s 97.2 % at 2.55 -> 97.5 % at 2.82 and"
        " at 325 s then dominated by fixed:3, the step at 325 s dominated by fixed:4, three rows on the curved "
        "replica or at 150 s no longer beating the baselines. (2) No p99 hold while demand is in charge (the p99 "
        "reported only, as over the target): 24 beating, 13 dominated, 3.98 GPU-h, 93.69 %; RAG at 325 s 6.37 -> "
        "5.97 GPU-h, mixed tenants at 325 s 5.05 -> 4.76, Mooncake at 325 s 96.5 -> 97.7 % (still dominated by "
        "fixed:3), Mooncake x2 no longer dominated; but the code trace over two hours at 50 s 97.6 -> 96.5 %, no "
        "longer beating the baselines, at 5x 92.6 -> 89.7 %, and azure-conv at 150 s dominated by fixed:3. (3) "
        "The hold kept, but not counted as a need by the keep-alive: 24 beating, 13 dominated, 3.99 GPU-h; the "
        "code trace over two hours 97.6 -> 96.2 % at 50 s and 92.2 -> 90.1 % at 325 s, at 5x 89.7 %. (4) The hold"
        " dropped only where the p99 is left by a queue drained within two latency windows: 25 beating, 14 "
        "dominated, 4.00 GPU-h; RAG unchanged, azure-conv at 150 s dominated by fixed:3, the code trace at 5x "
        "89.7 %. What the hold buys shows on the code trace: each reading that took it away, in part or whole, "
        "lost 1 to 3 points there. Mooncake at 325 s (held out) was then read minute by minute again, nothing "
        "changed after: the new service's band of one replica asked for a fourth at 180 s, held to 1,140 s (0.27 "
        "GPU-h where fixed:3 runs three), and a lighter token mix read a replica's full rate as 2.6 req/s at "
        "2,780 s, released the third, and 238 of the hour's 421 violations fell between that release and the "
        "third's return 8.5 minutes later.",
        "- Then the cap lifted only for a replica whose need recurs, on the same 48 rows, not kept: (5) where its"
        " gaps seen number two or more, (6) four or more (the quiet before its first need counting as one), so "
        "that a level that keeps coming back is held through its quiet by break-even while a one-off step or "
        "burst is still released after the window. (5): 24 beating, 15 dominated, 4.07 GPU-h, 94.21 %; RAG at 50 "
        "s 87.4 -> 89.8 % at 4.80 -> 4.72 GPU-h, but the code trace at 325 s 91.4 % at 2.85 -> 94.2 % at 3.19, "
        "dominated by fixed:3, and the step at 325 s by fixed:4. (6): 24 beating, 13 dominated, 4.03 GPU-h, 94.06"
        " %; RAG at 50 s 90.4 % at 4.68 GPU-h, RAG on the curved replica 82.1 -> 87.1 % at 5.50 -> 5.54, Mooncake"
        " at 325 s 96.5 -> 98.4 % and over two hours 97.1 -> 99.0 % (both still dominated by fixed:3); azure-conv"
        " on the curved replica 97.8 -> 97.4 % at 3.88 -> 3.97, no longer beating the baselines. (6) on the "
        "table's seeds 2 and 3 (68 rows, summary lines only): 39 beating and 14 dominated where 40 and 14 are, "
        "4.28 GPU-h on average where 4.25 are, attainment 92.57 % where 92.32 %; RAG at 150 s 85.9 -> 88.5 % "
        "(seed 2) and 86.9 -> 90.2 % (seed 3), RAG at 325 s on seed 3 54.0 -> 60.4 %, azure-conv on the curved "
        "replica no longer beating the baselines on seed 3 either. About even on the counts, a quarter of a point"
        " more attainment for under 1 % more GPU-hours: a candidate for a full three-seed run, not adopted "
        "without one.",
        "- Then the simulator's p99 for an LLM was read as the live loop reads it: histogram_quantile(0.99) "
        "over the engine's request-duration buckets summed over the service's pods for the last minute, "
        "interpolated inside a bucket, where it had read each pod's exact p99 and taken the largest (the "
        "policy unchanged; both pages run again in full). Per workload and condition 18 of 36 beat the "
        "baselines where 19 did, 20 are within 1.15x of the plans with foresight as before, and 4 of 11 are "
        "not dominated at 325 s where 5 were; per seed, 77 of the table's 100 rows are not dominated where 81 "
        "were and 60 beat the baselines where 61 did, at 4.278 GPU-h and 92.33 % on average where 4.276 and "
        "92.33 % were. Every row whose verdict it changed is the code trace's or RAG's: the code trace at 325 "
        "s 91.77 -> 93.15 % at 2.85 -> 2.93 GPU-h, now dominated by fixed:3 on every seed; over two hours at "
        "50 s, seed 1, 97.57 -> 95.80 % at 5.74 -> 5.88, dominated by fixed:3; RAG at 150 s, seed 3, 5.85 -> "
        "6.02 GPU-h, dominated by fixed:6 as well. The other rows moved by less, the most on the curved "
        "replica: azure-conv 97.55 -> 96.57 % at 3.86 -> 3.81 GPU-h, diurnal 96.39 -> 95.51 % at 4.35 -> "
        "4.40. On the rates page 17 of 30 rows are not dominated where 16 were (the code trace's fourth "
        "reshuffled order, 93.37 % at 2.93 -> 2.81 GPU-h) and 8 beat the baselines as before. `simulate` on "
        "the code trace at its defaults, seeds 0-23: 97.45 % at 2.60 GPU-h on average where it was 97.43 % at "
        "2.58.",
        "- Then, after one decision log (the code trace at 325 s, seed 1: a p99 read at 3,981 ms against the "
        "4 s target, within the tolerance, recommended the current replicas and held four of them to 1,230 "
        "s), the p99's hold within the tolerance was dropped while demand sizes the service (the keep-alive "
        "decides what stays); both pages run again in full. Per workload and condition 19 of 36 beat the "
        "baselines where 18 did and 21 are within 1.15x of the plans with foresight where 20 were; not "
        "dominated at 50 s on 10 of 11 (9), at 325 s on 5 of 11 (4), at 150 s on 4 of 7 (5). Per seed, 78 of "
        "the table's 100 rows are not dominated where 77 were and 60 beat the baselines as before, at 4.230 "
        "GPU-h and 92.13 % on average where 4.278 and 92.33 % were. The code trace at 325 s 93.05-93.23 -> "
        "91.44-91.68 % at 2.90-2.98 -> 2.85 GPU-h, no longer dominated on any seed; over two hours at 50 s, "
        "seed 1, 95.80 -> 96.52 % at 5.88 -> 5.69, no longer dominated, and seed 2 97.66 -> 96.25 % at 5.76 "
        "-> 5.67, no longer beating the baselines; mixed tenants at 150 s, seed 2, now beating them (86.33 % "
        "at 4.53 GPU-h); azure-conv at 150 s 99.86 -> 99.77 % at 3.32 -> 3.28, dominated by fixed:3 on every "
        "seed. RAG at 325 s, seed 3, 53.99 -> 43.39 % at 5.87 -> 5.59 GPU-h (held out, dominated before and "
        "after: on a start-up that long, where its random high phases fall decides much); Mooncake at 325 s "
        "(held out) 96.76 -> 97.71 %, still dominated by fixed:3; the step on the curved replica, seed 3, "
        "93.19 -> 95.19 % at 5.63 -> 5.03 GPU-h. On the rates page 17 of 30 rows are not dominated and 8 beat "
        "the baselines, as before, at 2.970 GPU-h and 95.70 % on average where 2.995 and 96.09 % were: "
        "Mooncake x2 (held out) 96.76 % at 5.04 -> 96.57 % at 4.90, no longer dominated; the code trace at 5x "
        "92.63 -> 89.67 % and at 8x 91.62 -> 89.40 %, at about the same GPU-hours, and its first reshuffled "
        "order 91.35 % at 2.69 -> 88.79 % at 2.50, dominated by fixed:2. A variant that keeps the hold while "
        "the p99 is at or over its target (dropped only under it), measured on seed 1 of the table and on the "
        "rates page against the recorded baselines, not kept: it keeps the code trace's attainment at 5x and "
        "8x and on the reshuffled order, but the code trace over two hours at 50 s stays dominated (95.80 % "
        "at 5.88) and so does Mooncake x2 (97.21 % at 5.02 GPU-h): 44 of those 66 rows not dominated, where "
        "the change has 45 and the hold had 44.",
        "- Then two decision logs read (seed 1, the rule above against the hold), nothing changed after. The "
        "code trace at 5x (rates page): the replicas the first burst asked for at 230-240 s were held by the "
        "keep-alive to 540-570 s (its bound, the stabilization window after the last need) and released 10-40 "
        "s before the next burst, which asked for them again at 580-620 s; the hold had kept five replicas to "
        "1,530 s (92.66 % at 4.06 GPU-h against 89.56 % at 3.93). azure-conv at 150 s: from 1,400 s, demand "
        "asked for three replicas and four ran; at 1,530 s a p99 of 7,354 ms against 8 s released the fourth, "
        "and the p99 went over the target (9,557 and 9,732 ms) each time it ran three, so the fourth was "
        "released three times and started again twice between 1,530 and 2,010 s, where the hold had kept it "
        "to 1,870 s. A p99 near its target there says the replicas demand releases are still needed; after "
        "the code trace's first burst at 325 s it was a minute's window still holding the burst.",
        "- Then one candidate from those logs, measured on seed 1 of the table and on the rates page against "
        "the recorded baselines: the hold kept while demand sizes the service unless the load has fallen "
        "since the p99's minute (completions over the last 20 s under the minute's by more than the "
        "tolerance). The table's seed 1: 27 of 36 rows not dominated (the change above 28, the hold 27), 20 "
        "beating as with both, 4.326 GPU-h at 92.83 % (4.282 at 92.81 %, 4.333 at 92.86 %); the code trace at "
        "325 s held as with the hold (93.05 % at 2.98, dominated by fixed:3), azure-conv at 150 s not "
        "dominated (99.86 % at 3.32). The rates page: 18 of 30 not dominated (17 with both), 8 beating, 2.986 "
        "GPU-h at 96.17 % (2.970 at 95.70 %, 2.995 at 96.09 %): the code trace at 5x and 8x as with the hold, "
        "its eighth reshuffled order no longer dominated (90.06 % at 2.60), Mooncake x2 dominated again "
        "(96.76 % at 5.02). Then run in full on three seeds (both pages, 38.2 + 2.8 min, not committed): per "
        "workload and condition 19 of 36 beat the baselines and 20 are within 1.15x of foresight (the change "
        "above: 19 and 21), not dominated at 50 s on 9 of 11 (10), at 325 s on 4 of 11 (5), at 150 s on 5 of "
        "7 (4); per seed 77 of 100 rows not dominated (78) and 61 beating (60), 4.271 GPU-h at 92.31 % (4.230 "
        "at 92.13 %); the rates page 18 of 30 not dominated (17), 8 beating. As many rows not dominated over "
        "both pages (95), for a fifth of a point more attainment at 1 % more GPU-hours: not kept.",
        "- Seeds 2 and 3 were only looked at in these summary tables, never one decision log at a time, until the "
        "tenth session read RAG at 325 s on both, after its first three-seed run, to explain seed 3's 38 % (nothing changed "
        "after); the curved replica was, in the seventh session (azure and the spike, for the capacity it learned). "
        "The "
        "mixed-tenants workload was, once, in the sixth session (its decisions at 325 s, after the code burst, "
        "showed the band holding a one-off burst).", "",
        "Azure traces (conversation, code): CC-BY 4.0, Patel et al., Splitwise, ISCA 2024 "
        "(bench/data/azure-llm-trace-2023/README.md, bench/data/azure-llm-trace-2023-code/README.md). Mooncake "
        "conversation trace: Apache-2.0, Qin et al., Mooncake, FAST 2025 (bench/data/mooncake-conversation/README.md).",
        "",
    ]
    (out / ("autoscaling-rates.md" if args.rates else "autoscaling.md")).write_text("\n".join(head + sections))
    if not args.fast and not args.no_page and not partial and not args.rates:
        update_autoscaling_page(head_table + [""] + target_table, beat_count, near_count, len(verdicts), started, per_condition)
    print(f"beats the baselines on {beat_count}"
          + (f", within 1.15x of foresight on {near_count}" if foresight else "")
          + f", of {len(verdicts)}; {total / 60:.1f} min", file=sys.stderr)
    return 0


def update_autoscaling_page(table: list[str], beat: int, near: int, total: int, started: datetime,
                  per_condition: list[str]) -> None:
    text = PAGE.read_text()
    if MARK_BEGIN not in text or MARK_END not in text:
        raise SystemExit(f"{PAGE}: the {MARK_BEGIN} / {MARK_END} markers are missing")
    block = [MARK_BEGIN,
             f"Generated by `make bench-autoscaling` on {started:%Y-%m-%d} (bench/results/autoscaling.md, "
             f"which has every swept configuration and the frontier plots): ours beats the baselines on {beat} of "
             f"{total} workload-conditions on every seed, and is within 1.15x of the plans with foresight on {near}.",
             "", *per_condition, "", *table, MARK_END]
    a, b = text.index(MARK_BEGIN), text.index(MARK_END) + len(MARK_END)
    PAGE.write_text(text[:a] + "\n".join(block) + text[b:])


if __name__ == "__main__":
    raise SystemExit(main())
