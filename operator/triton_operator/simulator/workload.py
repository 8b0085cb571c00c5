"""Workloads (pure, seeded): requests from a trace or from a generator, and the knobs that
stretch them (--rate-scale, --time-scale).

A request is an arrival time in seconds from the start plus its token counts. Non-LLM models
ignore the token counts.

Generators are non-homogeneous Poisson processes (thinning, Lewis & Shedler 1979) except the
MMPP, a two-state Markov-modulated Poisson process (Fischer & Meier-Hellstern 1993), the usual
model of bursty traffic. Token counts of generated requests are drawn from lognormals fitted to
the Azure LLM inference trace 2023 (conversation): prompt median 1020 / mean 1155 tokens, output
median 129 / mean 211 tokens (bench/data/azure-llm-trace-2023/, CC-BY 4.0, Patel et al.,
"Splitwise", ISCA 2024), unless the spec names fixed counts or a token mix is given.

Other token mixes (`mix=NAME` in a generator spec), lognormals clipped to a range, for workloads
unlike the conversation trace:
- `code`: code completion, prefill-heavy: prompts of 2-8k tokens (median 3,500), short answers
  (median 24, at most 256);
- `rag`: long-context retrieval-augmented answers: prompts of 4-14k tokens (median 9,000),
  answers of median 180;
- `chat`: decode-heavy chat: short prompts (median 300), long answers (median 450, at most 1,000).
Their shapes are chosen, not fitted to a trace (none ships with the project); `merge` overlays
workloads, e.g. two tenants of different mixes.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Sequence


class WorkloadError(ValueError):
    """Bad workload input; the message is one line a user can act on."""


@dataclass(frozen=True, slots=True)
class Request:
    arrival: float          # seconds from the start of the workload
    prompt_tokens: int = 0
    output_tokens: int = 1


# Lognormal fits (mu, sigma of log tokens) to the Azure conversation trace: median = e^mu,
# mean = e^(mu + sigma^2 / 2).
PROMPT_LOGNORMAL = (math.log(1020), math.sqrt(2 * math.log(1155 / 1020)))
OUTPUT_LOGNORMAL = (math.log(129), math.sqrt(2 * math.log(211 / 129)))
MAX_PROMPT, MAX_OUTPUT = 14050, 1000   # the trace's largest values: no generated outlier beyond them

TokenSampler = Callable[[random.Random], tuple[int, int]]


def azure_like_tokens(rng: random.Random) -> tuple[int, int]:
    prompt = min(MAX_PROMPT, max(1, round(rng.lognormvariate(*PROMPT_LOGNORMAL))))
    output = min(MAX_OUTPUT, max(1, round(rng.lognormvariate(*OUTPUT_LOGNORMAL))))
    return prompt, output


def _clipped(median: float, sigma: float, lo: int, hi: int) -> Callable[[random.Random], int]:
    mu = math.log(median)
    return lambda rng: min(hi, max(lo, round(rng.lognormvariate(mu, sigma))))


def lognormal_mix(prompt: Callable[[random.Random], int], output: Callable[[random.Random], int]) -> TokenSampler:
    return lambda rng: (prompt(rng), output(rng))


TOKEN_MIXES: dict[str, TokenSampler] = {
    "conv": azure_like_tokens,
    "code": lognormal_mix(_clipped(3500, 0.35, 2048, 8192), _clipped(24, 0.8, 1, 256)),
    "rag": lognormal_mix(_clipped(9000, 0.3, 4096, 14000), _clipped(180, 0.5, 16, 800)),
    "chat": lognormal_mix(_clipped(300, 0.6, 16, 2048), _clipped(450, 0.5, 32, 1000)),
}


def merge(*workloads: Sequence[Request]) -> list[Request]:
    """Several workloads arriving at the same service (tenants), in arrival order."""
    return sorted((r for w in workloads for r in w), key=lambda r: r.arrival)


def fixed_tokens(prompt: int, output: int) -> TokenSampler:
    return lambda _rng: (prompt, output)


def mix_tokens(pairs: Sequence[tuple[int, int]]) -> TokenSampler:
    """Draw (prompt, output) pairs from an observed mix, e.g. a trace's rows."""
    if not pairs:
        raise WorkloadError("the token mix is empty")
    return lambda rng: pairs[rng.randrange(len(pairs))]


def _thinning(rate: Callable[[float], float], peak: float, duration: float, rng: random.Random,
              tokens: TokenSampler) -> list[Request]:
    out: list[Request] = []
    if peak <= 0:
        return out
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= duration:
            return out
        if rng.random() * peak <= rate(t):
            out.append(Request(t, *tokens(rng)))


def poisson(rate: float, duration: float, rng: random.Random, tokens: TokenSampler) -> list[Request]:
    return _thinning(lambda _t: rate, rate, duration, rng, tokens)


def step(low: float, high: float, at: float, duration: float, rng: random.Random,
         tokens: TokenSampler) -> list[Request]:
    return _thinning(lambda t: high if t >= at else low, max(low, high), duration, rng, tokens)


def diurnal(mean: float, amplitude: float, period: float, duration: float, rng: random.Random,
            tokens: TokenSampler) -> list[Request]:
    """mean x (1 - amplitude x cos(2 pi t / period)): the trough at t = 0, the peak at period/2."""
    return _thinning(lambda t: mean * (1 - amplitude * math.cos(2 * math.pi * t / period)),
                     mean * (1 + amplitude), duration, rng, tokens)


def spike(base: float, peak: float, at: float, width: float, duration: float, rng: random.Random,
          tokens: TokenSampler) -> list[Request]:
    return _thinning(lambda t: peak if at <= t < at + width else base, max(base, peak), duration,
                     rng, tokens)


def mmpp(low: float, high: float, mean_low_s: float, mean_high_s: float, duration: float,
         rng: random.Random, tokens: TokenSampler) -> list[Request]:
    """Two-state MMPP: exponential sojourns in a quiet and a burst state."""
    out: list[Request] = []
    t, state_high = 0.0, False
    while t < duration:
        end = min(duration, t + rng.expovariate(1 / (mean_high_s if state_high else mean_low_s)))
        rate = high if state_high else low
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= end:
                break
            out.append(Request(t, *tokens(rng)))
        t, state_high = end, not state_high
    return out


MAX_REQUESTS = 20_000_000    # requests (or arrivals drawn) a simulated run holds
MAX_SPAN_S = 7 * 86400.0     # simulated time

# name -> (function, parameter names in call order, defaults)
GENERATORS: dict[str, tuple[Callable[..., list[Request]], tuple[str, ...], dict[str, float]]] = {
    "poisson": (poisson, ("rate", "duration"), {"duration": 3600}),
    "step": (step, ("low", "high", "at", "duration"), {"duration": 3600}),
    "diurnal": (diurnal, ("mean", "amplitude", "period", "duration"),
                {"amplitude": 0.8, "period": 3600, "duration": 3600}),
    "spike": (spike, ("base", "peak", "at", "width", "duration"), {"width": 300, "duration": 3600}),
    "mmpp": (mmpp, ("low", "high", "mean_low_s", "mean_high_s", "duration"),
             {"mean_low_s": 300, "mean_high_s": 60, "duration": 3600}),
}


def generate(spec: str, seed: int, tokens: TokenSampler | None = None) -> list[Request]:
    """A generator spec `NAME:key=value,...`, e.g. `step:low=2,high=8,at=900,duration=3600`.
    `prompt=N,output=M` fix the token counts of every request; `mix=conv|code|rag|chat` draws
    them from a named mix (TOKEN_MIXES)."""
    name, values, fixed, mix = _parse(spec)
    func, params, _ = GENERATORS[name]
    if fixed:
        sampler = fixed_tokens(fixed.get("prompt", 1024), fixed.get("output", 128))
    elif mix:
        sampler = TOKEN_MIXES[mix]
    else:
        sampler = tokens or azure_like_tokens
    return func(*(values[p] for p in params), rng=random.Random(seed), tokens=sampler)


def _parse(spec: str) -> tuple[str, dict[str, float], dict[str, int], str | None]:
    """A generator spec checked: its name, its parameters (defaults filled in), the fixed token
    counts and the named mix."""
    name, _, rest = spec.partition(":")
    if name not in GENERATORS:
        raise WorkloadError(f"unknown generator {name!r}; choose one of {', '.join(GENERATORS)}")
    _, params, defaults = GENERATORS[name]
    values: dict[str, float] = dict(defaults)
    fixed: dict[str, int] = {}
    mix: str | None = None
    for item in filter(None, rest.split(",")):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or (key not in params and key not in ("prompt", "output", "mix")):
            raise WorkloadError(f"generator {name}: expected key=value with keys "
                                f"{', '.join(params + ('prompt', 'output', 'mix'))}, got {item!r}")
        if key == "mix":
            if raw.strip() not in TOKEN_MIXES:
                raise WorkloadError(f"generator {name}: mix must be one of {', '.join(TOKEN_MIXES)}, got {raw.strip()!r}")
            mix = raw.strip()
            continue
        try:
            number = float(raw)
        except ValueError:
            raise WorkloadError(f"generator {name}: {key}={raw!r} is not a number") from None
        if not math.isfinite(number) or number < 0:
            raise WorkloadError(f"generator {name}: {key} must be a finite number >= 0, got {raw}")
        if key in ("prompt", "output"):
            if number < 1 or number != int(number):
                raise WorkloadError(f"generator {name}: {key} must be a whole number >= 1")
            fixed[key] = int(number)
        else:
            values[key] = number
    missing = [p for p in params if p not in values]
    if missing:
        raise WorkloadError(f"generator {name}: missing {', '.join(missing)} (e.g. {example(name)})")
    if values["duration"] <= 0:
        raise WorkloadError(f"generator {name}: duration must be > 0")
    for key in ("period", "mean_low_s", "mean_high_s"):
        if key in values and values[key] <= 0:
            raise WorkloadError(f"generator {name}: {key} must be > 0")
    if values["duration"] > MAX_SPAN_S:
        raise WorkloadError(f"generator {name}: duration must be at most {MAX_SPAN_S:g} seconds (a week), "
                            f"got {values['duration']:g}")
    # Arrivals are drawn at the highest rate and thinned, the phases of mmpp switched one by one:
    # bounded before drawing (spike:peak=1e7 drew for hours, mmpp:mean_low_s=1e-9 never ended).
    peak = max([values[k] for k in ("rate", "low", "high", "base", "peak") if k in values]
               + ([values["mean"] * (1 + values.get("amplitude", 0.0))] if "mean" in values else []))
    draws = peak * values["duration"] + sum(values["duration"] / values[k] for k in ("mean_low_s", "mean_high_s")
                                            if k in values)
    if draws > MAX_REQUESTS:
        raise WorkloadError(f"generator {name}: about {draws:.3g} arrivals or phases to draw (the highest rate times "
                            f"the duration); at most {MAX_REQUESTS:,} are simulated")
    if "amplitude" in values and values["amplitude"] > 1:
        raise WorkloadError(f"generator {name}: amplitude must be between 0 and 1")
    if fixed and mix:
        raise WorkloadError(f"generator {name}: give either prompt/output or mix, not both")
    return name, values, fixed, mix


def duration_of(spec: str) -> float:
    """The duration of a generator spec (its default when not given)."""
    return _parse(spec)[1]["duration"]


def check_size(requests: Sequence[Request], rate_scale: float = 1.0, time_scale: float = 1.0,
               duration: float | None = None) -> None:
    """Refuse a workload too large to simulate, before it is scaled: at most MAX_REQUESTS requests
    (each is held in memory: --rate-scale 1e9 took gigabytes) over at most MAX_SPAN_S (a run costs
    CPU per simulated second: a trace from 0 to 1e9 s would run for hours)."""
    expected = len(requests) * rate_scale
    if expected > MAX_REQUESTS:
        raise WorkloadError(f"about {expected:.3g} requests at --rate-scale {rate_scale:g}; at most "
                            f"{MAX_REQUESTS:,} are simulated")
    span = max(duration or 0.0, requests[-1].arrival if requests else 0.0) * time_scale
    if span > MAX_SPAN_S:
        raise WorkloadError(f"the workload spans {span:.3g} s" + (f" at --time-scale {time_scale:g}" if time_scale != 1
                                                                  else "") + f"; at most {MAX_SPAN_S:g} s (a week) "
                            "are simulated")


def example(name: str) -> str:
    return {
        "poisson": "poisson:rate=5,duration=3600",
        "step": "step:low=2,high=8,at=900",
        "diurnal": "diurnal:mean=5,amplitude=0.8,period=3600",
        "spike": "spike:base=3,peak=15,at=1200,width=300",
        "mmpp": "mmpp:low=3,high=12,mean_low_s=300,mean_high_s=60",
    }[name]


def rescale(requests: Sequence[Request], rate_scale: float = 1.0, time_scale: float = 1.0,
            seed: int = 0) -> list[Request]:
    """--time-scale multiplies every arrival time (0.5 replays the trace twice as fast, in half
    the time). --rate-scale keeps the duration and multiplies the rate: each request is replayed
    floor(k) or ceil(k) times (a seeded coin for the fraction), the extra copies placed uniformly
    in the gap to the next arrival, so the rate profile and the token mix are kept."""
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise WorkloadError(f"--rate-scale must be a number > 0, got {rate_scale}")
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise WorkloadError(f"--time-scale must be a number > 0, got {time_scale}")
    if rate_scale == 1 and time_scale == 1:
        return list(requests)
    rng = random.Random(seed)
    whole, frac = int(rate_scale), rate_scale - int(rate_scale)
    out: list[Request] = []
    for i, r in enumerate(requests):
        start = r.arrival * time_scale
        gap = ((requests[i + 1].arrival * time_scale) - start) if i + 1 < len(requests) else 0.0
        copies = whole + (1 if rng.random() < frac else 0)
        for c in range(copies):
            offset = 0.0 if c == 0 else rng.random() * gap
            out.append(Request(start + offset, r.prompt_tokens, r.output_tokens))
    out.sort(key=lambda r: r.arrival)
    return out
