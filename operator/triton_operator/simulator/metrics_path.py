"""The metrics path (pure): what Triton exposes, what Prometheus stores, what a query returns.

- Triton's p99 (`nv_inference_request_summary_us{quantile="0.99"}`) is a prometheus-cpp Summary
  created with the library defaults (triton-inference-server/core src/metric_model_reporter.cc
  adds it with only the quantiles): max_age 60 s over 5 age buckets. prometheus-cpp's
  TimeWindowQuantiles inserts every observation into all buckets and, every max_age/5, resets the
  current bucket and moves to the next (detail/time_window_quantiles.cc). A read therefore sees
  the observations since the current bucket's last reset: the last 48 to 60 s. No observation in
  that window reads as NaN. CKMS error (0.001 at p99) is below what the simulator resolves, so
  quantiles are exact here. It is the p99 of the models that are not LLMs.
- An LLM service's p99 is histogram_quantile(0.99) over the service's request-duration buckets
  (`triton_llm_request_duration_seconds_bucket`, at ENGINE_DURATION_BUCKETS) summed over its pods'
  rate over the last minute (settings.p99_query): one figure for the whole service, where a gone
  pod's requests of that minute still count, read from whole buckets and interpolated linearly
  inside the one the 99th percentile falls in (promql/quantile.go bucketQuantile). Modelled as
  that: with bounds at most 1.33x apart from 0.15 s up it reads within a third of the exact p99,
  furthest off where a minute holds few requests, and the policy's p99 rule rounds ready x p99 /
  target up to whole replicas, so a few tens of milliseconds decide a replica on an edge.
- The pending-request gauge is instantaneous; requests waiting in the service's queue are
  attributed evenly to the ready pods (every consumer sums or averages them).
- The gateway in front (simulation.py routes as it does) holds requests while no replica is ready:
  its `triton_gateway_held_requests` gauge is the service's queue then, and
  `triton_gateway_in_flight_requests` what it has sent to replicas and not finished. Prometheus
  scrapes it like a pod (a scrape outage makes its series stale too).
- Prometheus scrapes every ready pod every scrape interval. A failed scrape marks the target's
  series stale at once, and an instant query only looks back 5 minutes (Prometheus staleness
  handling), so during a scrape outage queries return an empty result. A Prometheus outage makes
  every query fail instead.
- Range vectors ignore staleness markers: `rate(x[1m])` still reads a series that went stale (a pod
  deleted after a scale-down) from the samples it had within the window, extrapolated half an
  interval past its last one. Summed over pods, a service's rate does not dip when one of its pods
  goes: the gone pod's share fades over the window as the others' grows.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator, Sequence

# The LLM engine's request-duration buckets (runtime/triton_runtime/serving/contract.py, which
# this package does not import; tests/test_simulator.py checks the two agree), in seconds.
ENGINE_DURATION_BUCKETS = (0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1, 1.25, 1.5, 2, 2.5, 3, 4,
                           5, 6, 7.5, 10, 12.5, 15, 20, 25, 30, 40, 50, 60, 80, 100, 120, 160, 200, 240, 320)
P99_RANGE_S = 60.0     # the p99 query's rate window (settings.p99_query)
SUMMARY_MAX_AGE_S = 60.0
SUMMARY_AGE_BUCKETS = 5
LOOKBACK_S = 300.0
SLO_WINDOW_S = 600.0   # the window of the service-level queries (settings.slo_met_query)


class WindowQuantiles:
    """prometheus-cpp's TimeWindowQuantiles with exact quantiles."""

    __slots__ = ("created", "interval", "buckets", "obs")

    def __init__(self, created: float, max_age: float = SUMMARY_MAX_AGE_S,
                 buckets: int = SUMMARY_AGE_BUCKETS):
        self.created, self.interval, self.buckets = created, max_age / buckets, buckets
        self.obs: deque[tuple[float, float]] = deque()

    def window_start(self, now: float) -> float:
        rotations = math.floor((now - self.created) / self.interval)
        # the current bucket was last reset (buckets - 1) rotations ago (never, early on)
        return self.created + max(0, rotations - (self.buckets - 1)) * self.interval

    def observe(self, now: float, value: float) -> None:
        self.obs.append((now, value))

    def quantile(self, now: float, q: float) -> float:
        start = self.window_start(now)
        obs = self.obs
        while obs and obs[0][0] < start:
            obs.popleft()
        if not obs:
            return math.nan
        values = sorted(v for _, v in obs)
        rank = max(0, min(len(values) - 1, math.ceil(q * len(values)) - 1))
        return values[rank]


def bucket_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float:
    """histogram_quantile over classic buckets (promql/quantile.go bucketQuantile): `cumulative`
    holds the count at or below each of `bounds` and, last, the +Inf bucket's. The rank q x total
    is found in the first bucket that reaches it and interpolated linearly between that bucket's
    bounds (the first bucket's lower bound is 0); a rank in the +Inf bucket reads the highest
    finite bound. NaN without observations."""
    # Rates extrapolated bucket by bucket can dip below a lower bucket's: made monotonic first.
    cumulative = list(itertools.accumulate(cumulative, max))
    total = cumulative[-1] if cumulative else 0.0
    if not total > 0:
        return math.nan
    rank = q * total
    b = bisect.bisect_left(cumulative, rank)
    if b >= len(bounds):
        return float(bounds[-1])
    lower = 0.0 if b == 0 else float(bounds[b - 1])
    below = 0.0 if b == 0 else cumulative[b - 1]
    inside = cumulative[b] - below
    return lower + (bounds[b] - lower) * ((rank - below) / inside if inside > 0 else 1.0)


@dataclass
class Sample:
    """One scrape of one pod."""

    t: float
    pending: float
    p99_ms: float       # the summary's p99 (NaN for an LLM's pod: no query reads its summary)
    success: int        # nv_inference_request_success (a counter)
    active: int         # requests in the batch (TensorRT-LLM's active request gauge)
    prompt_tokens: int = 0   # nv_llm_input_token_len_sum: prompt tokens of completed requests
    output_tokens: int = 0   # nv_llm_output_token_len_sum: output tokens of completed requests
    # triton_llm_request_duration_seconds_bucket: completed requests at or below each of
    # ENGINE_DURATION_BUCKETS, then all of them (+Inf); empty for models that are not LLMs
    durations: tuple[int, ...] = ()


@dataclass
class GatewaySample:
    """One scrape of the gateway, for this service."""

    t: float
    held: float         # triton_gateway_held_requests
    in_flight: float    # triton_gateway_in_flight_requests
    slo_met: int = 0    # triton_gateway_slo_requests_total{met="true"} (a counter)
    slo_counted: int = 0   # ... summed over met


@dataclass
class Prometheus:
    """Scraped samples per pod, and the instant queries the autoscalers make."""

    scrape_interval: float = 5.0
    outage: tuple[float, float] | None = None     # (start, end) in seconds
    outage_kind: str = "scrape"                   # scrape: targets fail; prometheus: queries fail
    latest: dict[int, Sample] = field(default_factory=dict)
    stale: set[int] = field(default_factory=set)
    history: dict[int, deque[Sample]] = field(default_factory=dict)
    first_seen: dict[int, float] = field(default_factory=dict)
    in_system: deque[tuple[float, float]] = field(default_factory=deque)  # sum(pending + active) per scrape
    gateway: GatewaySample | None = None          # the gateway's newest sample (None: stale)
    gateway_history: deque[GatewaySample] = field(default_factory=deque)   # the last SLO_WINDOW_S of them

    def in_outage(self, now: float) -> bool:
        return self.outage is not None and self.outage[0] <= now < self.outage[1]

    def scrape(self, now: float, samples: dict[int, Sample], gone: list[int],
               gateway: GatewaySample | None = None) -> None:
        for rid in gone:
            self.stale.add(rid)
        # A gone pod's samples past the lookback are reached by no range this simulation queries.
        # (The histories are the pods of the last few minutes; `stale` keeps every pod ever gone.)
        for rid in [r for r, h in self.history.items() if r in self.stale and h and h[-1].t < now - LOOKBACK_S]:
            del self.history[rid]
        if self.in_outage(now) and self.outage_kind == "scrape":
            self.stale.update(samples)
            self.gateway = None
            return
        self.gateway = gateway
        if gateway is not None:
            self.gateway_history.append(gateway)
            while self.gateway_history and self.gateway_history[0].t < now - SLO_WINDOW_S:
                self.gateway_history.popleft()
        for rid, sample in samples.items():
            self.latest[rid] = sample
            self.stale.discard(rid)
            self.first_seen.setdefault(rid, now)
            hist = self.history.setdefault(rid, deque())
            hist.append(sample)
            while hist and hist[0].t < now - 180:
                hist.popleft()
        self.in_system.append((now, sum(x.pending + x.active for x in samples.values())))
        while self.in_system and self.in_system[0][0] < now - 180:
            self.in_system.popleft()

    def query_error(self, now: float) -> str | None:
        if self.in_outage(now) and self.outage_kind == "prometheus":
            return "Prometheus unreachable: ConnectionError"
        return None

    def gateway_at(self, now: float) -> GatewaySample | None:
        """The gateway's series as an instant query at `now` sees them."""
        g = self.gateway
        return g if g is not None and now - g.t <= LOOKBACK_S else None

    def slo_increase(self, now: float) -> tuple[float, float] | None:
        """increase(triton_gateway_slo_requests_total[10m]), met and counted, from the gateway's
        samples in the window (their difference, without Prometheus's extrapolation to the window's
        edges: a share of the two is what is read, and extrapolation scales both alike); None
        without two samples."""
        inside = [g for g in self.gateway_history if now - SLO_WINDOW_S <= g.t <= now]
        if len(inside) < 2:
            return None
        return float(inside[-1].slo_met - inside[0].slo_met), float(inside[-1].slo_counted - inside[0].slo_counted)

    def fresh(self, now: float) -> dict[int, Sample]:
        """Per pod, the newest sample an instant query at `now` sees."""
        return {rid: s for rid, s in self.latest.items()
                if rid not in self.stale and now - s.t <= LOOKBACK_S}

    def in_system_at(self, t: float) -> float | None:
        """sum(pending + active) as an instant query at `t` sees it (`offset` in PromQL)."""
        best = None
        for ts, value in self.in_system:
            if ts <= t and t - ts <= LOOKBACK_S:
                best = value
        return best

    def rate(self, now: float, window: float, rids: set[int] | None = None,
             counter: str = "success") -> float | None:
        """sum(rate(counter[window])) over pods, as Prometheus computes it (promql/functions.go
        extrapolatedRate): per series, the increase between its first and last sample in the
        window, extrapolated to the window's edges where samples reach them (within 1.1 x the
        average interval), else by half an interval (never below the counter's zero), divided by
        the window. A series younger than the window therefore reads low: a pod ready 20 s ago
        shows about a third of its rate over 1m; a stale series (a pod gone) counts its samples
        still in the window (range vectors ignore staleness markers). None without two samples
        in the window."""
        total, found = 0.0, False
        for rid, inside in self._ranges(now, window):
            if rids is None or rid in rids:
                total += _extrapolated(inside, getattr(inside[0], counter), getattr(inside[-1], counter),
                                       now - window, now) / window
                found = True
        return total if found else None

    def duration_quantile(self, now: float, q: float, window: float = P99_RANGE_S) -> float | None:
        """histogram_quantile(q, sum by (le) (rate(triton_llm_request_duration_seconds_bucket[window])))
        in seconds: each pod's bucket counters' rates as `rate` computes them (a gone pod's samples
        still in the window count), summed, then bucket_quantile. NaN when the window holds no
        completed request; None without a series of two samples in the window (no such series)."""
        summed: list[float] | None = None
        for _, inside in self._ranges(now, window):
            first, last = inside[0].durations, inside[-1].durations
            if not last:
                continue
            if summed is None:
                summed = [0.0] * len(last)
            for k, (a, b) in enumerate(zip(first, last)):
                if b > a:
                    summed[k] += _extrapolated(inside, a, b, now - window, now)
        return None if summed is None else bucket_quantile(q, ENGINE_DURATION_BUCKETS, summed)

    def _ranges(self, now: float, window: float) -> Iterator[tuple[int, list[Sample]]]:
        """Per pod, its samples in (now - window, now] as a range vector holds them (stale or not),
        where they are two or more at different times."""
        start = now - window
        for rid, hist in self.history.items():
            if not hist or hist[-1].t < start:
                continue
            times = [s.t for s in hist]
            lo = bisect.bisect_left(times, start)
            inside = [s for s in list(hist)[lo:] if s.t <= now]
            if len(inside) >= 2 and inside[-1].t > inside[0].t:
                yield rid, inside


def _extrapolated(inside: list[Sample], first: float, last: float, start: float, end: float) -> float:
    """A counter's increase over [start, end] from its samples `inside` (first and last its values
    at the first and last of them), extrapolated as Prometheus does (promql/functions.go
    extrapolatedRate): to the window's edges where samples reach them (within 1.1 x the average
    interval), else by half an interval, never below the counter's zero."""
    increase = last - first
    sampled = inside[-1].t - inside[0].t
    average = sampled / (len(inside) - 1)
    to_start, to_end = inside[0].t - start, end - inside[-1].t
    if to_start >= 1.1 * average:
        to_start = average / 2
    if increase > 0 and first >= 0:
        to_start = min(to_start, sampled * first / increase)
    if to_end >= 1.1 * average:
        to_end = average / 2
    return increase * (sampled + to_start + to_end) / sampled
