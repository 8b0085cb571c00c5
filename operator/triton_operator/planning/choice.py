"""Which GPU classes a service may run on (pure): the preferred class and, in order, the classes
its replicas may spill over to, each with its GPUs per replica; for `gpu.class: auto`, the
planner's ranking of every GPUClass. A class that cannot serve the model is kept with the reason,
so that status and `triton-operator plan` can say why it is not used.

The rules for class auto: among the GPUClasses present, the cheapest replica (pricePerHour x GPUs)
where the model fits in memory, the precision runs, and the decode speed bound (bandwidth x GPUs /
weight bytes) meets maxTimePerOutputTokenMs, within maxPricePerHour. With count 0 the planner
tries 1, 2, 4, ... GPUs up to a node's worth (for TensorRT-LLM then 2, 4, ... whole nodes) and keeps the fewest that qualify on each class.
Ties go to the faster class. Classes without a price rank after priced ones.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from ..api import GPUClass, GPUClassSpec, InferenceServiceSpec
from .assignment import Candidates, Option
from .fit import MIG_PREFIX, Problem, fit, layout, problems


def check(spec: InferenceServiceSpec, name: str, cls: GPUClassSpec, count: int,
          constrained: bool = True) -> Option:
    """The option of running on `count` GPUs of class `name`: usable, or the first reason not.
    `constrained` applies gpu.maxPricePerHour and gpu.maxTimePerOutputTokenMs (a class the user
    named as gpu.class is exempt: they chose it)."""
    p = fit(spec.model, cls, count)
    base = Option(name, count, cost_per_hour=p.cost_per_hour, decode_tokens_per_s_bound=p.decode_tokens_per_s_bound,
                  weights_gib=p.weights_gib, available_gib=p.available_gib, layout=layout(spec.model, cls, count))
    found = problems(spec.model, name, cls, count)
    if found:
        return _with(base, found[0].reason, " ".join(x.message for x in found))
    if not constrained:
        return base
    gpu = spec.gpu
    if gpu.max_price_per_hour is not None:
        if p.cost_per_hour is None:
            return _with(base, "NoPrice", f"GPUClass {name} has no pricePerHour, so maxPricePerHour "
                                          f"{_fmt(gpu.max_price_per_hour)} cannot be checked")
        if p.cost_per_hour > gpu.max_price_per_hour + 1e-9:
            return _with(base, "OverPriceCap", f"{count} x {name} cost {_fmt(p.cost_per_hour)}/h, over "
                                               f"maxPricePerHour {_fmt(gpu.max_price_per_hour)}")
    target = gpu.max_time_per_output_token_ms
    if target is not None and base.ms_per_token_bound is not None and base.ms_per_token_bound > target + 1e-9:
        return _with(base, "TooSlow", f"decode on {count} x {name} takes at least {base.ms_per_token_bound} ms per "
                                      f"token (bandwidth bound), over maxTimePerOutputTokenMs {_fmt(target)}")
    return base


def _with(o: Option, reason: str, message: str) -> Option:
    return replace(o, reason=reason, message=message)


def _fmt(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


MAX_GPUS = 64   # gpu.count's bound


def counts_to_try(cls: GPUClassSpec, across_nodes: bool = False) -> list[int]:
    """1, 2, 4, ... up to a node's GPUs (tensor-parallel degrees divide attention heads, which
    are powers of two in the models served here), and the node's own count; `across_nodes`
    (TensorRT-LLM), then 2, 4, ... whole nodes."""
    out, n = [], 1
    while n <= cls.gpus_per_node:
        out.append(n)
        n *= 2
    if cls.gpus_per_node not in out:
        out.append(cls.gpus_per_node)
    nodes = 2
    while across_nodes and not cls.resource_name.startswith(MIG_PREFIX) and nodes * cls.gpus_per_node <= MAX_GPUS:
        out.append(nodes * cls.gpus_per_node)
        nodes *= 2
    return out


def best_count(spec: InferenceServiceSpec, name: str, cls: GPUClassSpec) -> Option:
    """The fewest GPUs of the class that qualify; when none does, the reason at the first count
    where the model fits (a constraint it fails), else why it never fits."""
    if spec.gpu.count > 0:
        return check(spec, name, cls, spec.gpu.count)
    tried = [check(spec, name, cls, n) for n in counts_to_try(cls, spec.model.format == "tensorrt-llm")]
    for o in tried:
        if o.usable:
            return o
    constrained = [o for o in tried if o.reason in ("OverPriceCap", "NoPrice", "TooSlow")]
    if constrained:
        return constrained[0]
    # Too big even on a node's worth of GPUs: say so at that count; any other reason at one GPU.
    return tried[-1] if tried[-1].reason == "ModelDoesNotFit" else tried[0]


def _rank_key(o: Option) -> tuple:
    return (o.cost_per_hour is None, o.cost_per_hour or 0.0, -(o.decode_tokens_per_s_bound or 0.0), o.gpu_class)


def rank(spec: InferenceServiceSpec, classes: Mapping[str, GPUClass]) -> list[Option]:
    """Every GPUClass at its best count: usable ones cheapest first, then the rest by name."""
    options = [best_count(spec, name, c.spec) for name, c in classes.items()]
    usable = sorted((o for o in options if o.usable), key=_rank_key)
    return usable + sorted((o for o in options if not o.usable), key=lambda o: o.gpu_class)


def candidates(spec: InferenceServiceSpec, classes: Mapping[str, GPUClass]) -> Candidates:
    """Where the service may run: class (or the first fallbackClass that exists) first, then with
    gpu.spill the fallbackClasses that can serve it; for class auto, the ranking."""
    spill_on = spec.gpu.spill is not None
    if spec.gpu.auto:
        ranking = rank(spec, classes)
        usable = [o for o in ranking if o.usable]
        if not usable:
            why = "; ".join(f"{o.gpu_class}: {o.message}" for o in ranking) or "there are no GPUClasses"
            return Candidates(None, ranking=tuple(ranking), skipped=tuple(ranking),
                              error=Problem("NoGPUClassQualifies", f"gpu.class auto found no GPUClass for the model: {why}."))
        rest = tuple(usable[1:]) if spill_on else ()
        return Candidates(usable[0], rest, tuple(o for o in ranking if not o.usable), tuple(ranking))

    names = spec.gpu.candidates()
    existing = [n for n in names if n in classes]
    if not existing:
        known = ", ".join(sorted(classes)) or "none"
        return Candidates(None, error=Problem(
            "GPUClassNotFound",
            f"GPUClass {' or '.join(names)} does not exist (existing classes: {known}); create it or change spec.gpu.class."))
    first = existing[0]
    notes = tuple(f"GPUClass {m} does not exist; using fallback {first}" for m in names[:names.index(first)][:1])
    preferred = check(spec, first, classes[first].spec, spec.gpu.count, constrained=False)
    if not preferred.usable:
        return Candidates(None, error=Problem(preferred.reason, preferred.message), notes=notes)
    if not spill_on:
        return Candidates(preferred, notes=notes)
    spill, skipped = [], []
    for name in names[names.index(first) + 1:]:
        if name not in classes:
            skipped.append(Option(name, spec.gpu.count, "GPUClassNotFound", f"GPUClass {name} does not exist"))
            continue
        o = check(spec, name, classes[name].spec, spec.gpu.count)
        (spill if o.usable else skipped).append(o)
    return Candidates(preferred, tuple(spill), tuple(skipped), notes=notes)
