"""What the autoscaling policy remembers of one service between ticks (pure): the
recommendations within the stabilization window, the capacity learned, the arrival-rate trail
and its forecast's errors, what the service held, the replicas each tick asked for. policy.py
says what each is for; `seed` is the History of a service first seen."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from operator import itemgetter, mul
from typing import Any, TypeVar

from .signals import Signals

CAPACITY_WEIGHT = 0.2      # weight of a new capacity sample in the running average
TREND_WINDOW_S = 120.0     # arrival-rate history used for the trend (at least; the start-up time if longer)
DEFAULT_STARTUP_S = 60.0   # pod start-up time assumed when the loop does not measure it
RATE_WINDOW_S = 60.0       # the window of the throughput query (and of the arrival rate)
BAND_Z = 1.65              # the forecast's upper band: this many standard deviations over the forecast
TREND_Z = 0.5              # a rising trend is carried less this many standard errors of its slope
RISE_QUANTILE = 0.9        # the upper band covers this quantile of the rises seen over one start-up
RISE_MEMORY_S = 1800.0     # how long rises are remembered
LEARNING_RISES = round(1 / (1 - RISE_QUANTILE))  # fewer rises than this, and their quantile is their maximum
SHORT_WINDOW_S = 20.0      # the recent throughput's window (settings.recent_throughput_query): bursts inside a minute
SURGE_Z = 3.0              # a short rate or a tick's arrivals counts only beyond this many standard deviations of its noise
STARTUP_WEIGHT = 0.5       # weight of a new start-up observation in the learned start-up time

_RATE_WINDOW = timedelta(seconds=RATE_WINDOW_S)
_SHORT_WINDOW = timedelta(seconds=SHORT_WINDOW_S)
_RATE_WINDOW_SHORT, _RATE_WINDOW_LONG = 0.75 * _RATE_WINDOW, 1.5 * _RATE_WINDOW  # a trail point that can stand for it
_TWO_RATE_WINDOWS = 2 * _RATE_WINDOW
_TREND_WINDOW = timedelta(seconds=TREND_WINDOW_S)
_RISE_MEMORY = timedelta(seconds=RISE_MEMORY_S)


_T = TypeVar("_T")
_first = itemgetter(0)
_third = itemgetter(2)
_E = TypeVar("_E", bound=tuple)  # type: ignore[type-arg]


def evolve(obj: _T, **changes: Any) -> _T:
    """`dataclasses.replace` for the frozen records here (no __post_init__, no slots) without its
    per-call look at the fields: the tick makes thousands of these, a tenth of its CPU before."""
    if not hasattr(obj, "__dict__"):
        return replace(obj, **changes)  # type: ignore[type-var]   # the slotted records (rare paths)
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new


@dataclass(frozen=True)
class History:
    """What the policy remembers between ticks: recommendations within the stabilization window
    (oldest first, each with the rule that made it), what was learned about a replica's capacity,
    the arrival-rate trail for the trend, what the service held (for the arrival rate and the
    batch occupancy), and when requests last waited."""

    recommendations: tuple[tuple[datetime, int, str], ...] = ()
    capacity: float | None = None      # measured requests/s per saturated replica (no plan to scale)
    efficiency: float | None = None    # measured capacity / planned capacity
    full_efficiency: float | None = None  # the same, from saturated minutes alone
    rates: tuple[tuple[datetime, float, float], ...] = ()   # (t, req/s, t in epoch seconds)
    saturated_since: datetime | None = None
    contents: tuple[tuple[datetime, float, float | None], ...] = ()   # (t, queued, in batches)
    queued_at: datetime | None = None
    ready_since: tuple[int, datetime] | None = None   # the ready count, and since when it holds
    idle_since: datetime | None = None  # first tick of the current run without any use (minReplicas 0)
    startup: float | None = None       # learned seconds from pod creation to Ready (this service's class)
    minutes: tuple[tuple[datetime, float, float], ...] = ()  # once a minute: rate, its forecast a start-up ahead
    rises: tuple[tuple[datetime, float], ...] = ()     # how far the rate went over that forecast, once a minute
    rise_band: float = 0.0             # their RISE_QUANTILE, kept with them (the tick reads it, once a minute writes it)
    since: datetime | None = None      # the first tick with an arrival rate (its first minute is not trended)
    needs: tuple[tuple[datetime, int], ...] = ()   # (t, replicas asked for), NEED_MEMORY_S long
    new: bool = False                  # a new service whose bursts are not learned yet (one replica of headroom)
    peaks: tuple[tuple[datetime, float], ...] = ()   # once a minute: its highest short-window arrival rate
    peak_now: float = 0.0              # the highest short-window arrival rate since the last entry in peaks
    surges: tuple[tuple[datetime, float, float], ...] = ()  # (t, minute rate, a tick's arrivals over it), RISE_MEMORY_S

    def add(self, now: datetime, replicas: int, window: timedelta, source: str = "") -> History:
        kept = trail_since(self.recommendations, now - window, keep_equal=False)
        return evolve(self, recommendations=kept + ((now, replicas, source),))

    def highest(self, since: datetime | None = None) -> int | None:
        return max((r for t, r, _ in self.recommendations if since is None or t > since), default=None)

    def all_from(self, source: str, since: datetime) -> bool:
        """Every recommendation since `since` came from `source`, and there is one older than
        `since` (the record covers the whole span)."""
        recent = [s for t, _, s in self.recommendations if t > since]
        return bool(recent) and all(s == source for s in recent) and any(
            t <= since for t, _, _ in self.recommendations)

    def capacity_for(self, signals: Signals) -> tuple[float, str] | None:
        """Requests/s one saturated replica completes, and where the figure comes from."""
        hint = signals.capacity_hint
        if hint is not None and math.isfinite(hint) and hint > 0:
            if self.efficiency is None:
                return hint, "planned"
            if self.full_efficiency is not None and self.full_efficiency < self.efficiency:
                # A saturated minute measured what full replicas do; the rest extrapolates a
                # partial batch along the plan's line, which the engine need not follow.
                return hint * self.full_efficiency, f"planned x{self.full_efficiency:.2f} as measured full"
            return hint * self.efficiency, f"planned x{self.efficiency:.2f} as measured"
        if self.capacity is not None:
            return self.capacity, "measured"
        return None

    def learn(self, now: datetime, signals: Signals) -> History:
        """Capacity samples, the trail of what the service held, the arrival-rate trail, and
        when requests last waited."""
        queue = signals.queue_depth or 0.0
        saturated = signals.ready > 0 and queue >= signals.ready
        since = (self.saturated_since or now) if saturated else None
        ready_since = self.ready_since if self.ready_since and self.ready_since[0] == signals.ready else (
            signals.ready, now)
        cutoff = now - _TWO_RATE_WINDOWS
        contents = trail_since(self.contents, cutoff) + ((now, queue, signals.in_flight),)
        startup = self.startup
        s = signals.startup_s
        if s is not None and math.isfinite(s) and s > 0:
            startup = _average(startup, s, STARTUP_WEIGHT)
        hist = evolve(self, saturated_since=since, contents=contents, ready_since=ready_since,
                       queued_at=now if queue >= 1 else self.queued_at, startup=startup)
        hist = hist._sample(now, signals)
        short = hist.short_arrivals(now, signals)
        if short is not None:
            if not hist.peaks or now - hist.peaks[-1][0] >= _RATE_WINDOW:
                peak = max(hist.peak_now, short)
                hist = evolve(hist, peaks=trail_since(hist.peaks, now - _RISE_MEMORY) + ((now, peak),), peak_now=0.0)
            elif short > hist.peak_now:
                hist = evolve(hist, peak_now=short)
        rate = hist.arrival_rate(now, signals)
        if rate is not None:
            # Rates from the first minute with a rate are neither trended nor judged as
            # forecasts: for a new service every series is younger than the rate window and reads
            # low, so they rise as the series age (a trend of +35 req/s at 325 s start-up) and the
            # first forecast, a fraction of the load, stood as a rise of the whole load for 30 min.
            born = self.since or now
            full = now - born >= _RATE_WINDOW
            span = max(_TREND_WINDOW, timedelta(seconds=startup or 0.0))
            cutoff = max(now - span, born + _RATE_WINDOW)
            hist = evolve(hist, since=born,
                           rates=trail_since(self.rates, cutoff) + ((now, rate, now.timestamp()),))
            if full and (not self.minutes or now - self.minutes[-1][0] >= _RATE_WINDOW):
                hist = hist._rise(now, rate)
            recent = hist.recent_arrivals(signals)
            if full and recent is not None and recent - rate > SURGE_Z * math.sqrt(recent / hist.last_tick_s()):
                hist = evolve(hist, surges=trail_since(hist.surges, now - _RISE_MEMORY) + ((now, rate, recent - rate),))
        return hist

    def _rise(self, now: datetime, rate: float) -> History:
        """Once a minute: log the rate with what the forecast said it would be one start-up later
        (the rate plus its rising trend), and for the entry logged one start-up ago, how far the
        highest rate since then went over that forecast (0 when it stayed under): the forecast's
        errors, which the upper band covers. The highest rate is read over SHORT_WINDOW_S as well
        as over the minute: latency is lost to bursts inside a minute, which a minute's rate
        averages away (on the real code-completion trace, minutes of 15 req/s held bursts of 45
        over ten seconds, and the band learned from minutes held one replica where such a burst
        needed three)."""
        memory = now - _RISE_MEMORY
        lead_s = self.startup if self.startup is not None else DEFAULT_STARTUP_S
        slope, scatter = self.forecast()
        ahead = self.rising(self.significant(self.still_rising(slope), scatter, rate), lead_s)[0]
        minutes = trail_since(self.minutes, memory) + ((now, rate, rate + ahead),)
        rises = trail_since(self.rises, memory)
        start = bisect_left(minutes, now - timedelta(seconds=lead_s), key=_first)
        if start > 0:
            _, _, predicted = minutes[start - 1]   # the last entry logged before the start-up began
            since = minutes[start][0]
            high = max(max(r for _, r, _ in minutes[start:]), self.peak_now,
                       max((r for t, r in self.peaks if t >= since), default=0.0))
            rises += ((now, max(0.0, high - predicted)),)
        band = 0.0
        if rises:
            values = sorted(r for _, r in rises)
            band = values[min(len(values) - 1, math.ceil(RISE_QUANTILE * len(values)) - 1)]
        return evolve(self, minutes=minutes, rises=rises, rise_band=band,
                       new=self.new and len(rises) < LEARNING_RISES)

    def recurring_peak(self, level: float, startup_s: float) -> float:
        """The highest rate logged within RISE_MEMORY_S that recurred: the rates over the midpoint
        between it and `level` came in at least two bursts more than a start-up apart. After a
        single burst, the highest rate outside it (and a start-up either side of it). A burst seen
        once within the memory is not hedged once it has passed: after a one-off spike at 325 s
        start-up, the band held 6 replicas where 2 served for the rest of the half hour."""
        minutes = self.minutes
        peak = max((r for _, r, _ in minutes), default=level)
        if peak <= level:
            return level
        threshold = (peak + level) / 2
        apart = timedelta(seconds=startup_s) + _RATE_WINDOW   # the log's minutes either side of the gap
        bursts: list[list[datetime]] = []    # [first, last] minute over the threshold
        for t, r, _ in minutes:
            if r < threshold:
                continue
            if bursts and t - bursts[-1][1] <= apart:
                bursts[-1][1] = t
            else:
                bursts.append([t, t])
        if len(bursts) > 1:
            return peak
        (first, last), = bursts
        return max((r for t, r, _ in minutes if t < first - apart or t > last + apart), default=level)

    def rise(self) -> float:
        """The RISE_QUANTILE of the forecast's errors seen within RISE_MEMORY_S (0 without)."""
        return self.rise_band

    def _sample(self, now: datetime, signals: Signals) -> History:
        """One capacity sample per tick, when the last rate window was run by the same ready
        replicas throughout (a pod just ready has not completed a full minute):
        - saturated for the whole window (requests waiting, so every replica was full):
          throughput / ready is what one replica does;
        - otherwise, with a plan: Little's law gives the time a request spent in the batch,
          occupancy / throughput per replica, at the occupancy observed; the plan's line at that
          occupancy over the observed time is how much faster the engine runs than planned. The
          fuller the batches, the shorter the extrapolation to a full batch, the more it counts.
        Saturated minutes are also averaged alone, and where they measured less the capacity is
        theirs: a decode step that grows with the batch, or a KV cache that fills before it, makes
        a full batch slower than the line through a half-full one says (on the curved replica the
        extrapolation read x0.69-0.94 where saturated minutes measured x0.61-0.65, and the service
        ran a replica short at every rise; the planner's own engine measured x0.87-0.90 saturated
        on the azure trace, its plan being an approximation of it too).
        """
        window = _RATE_WINDOW
        ready, x = signals.ready, signals.throughput
        if (ready <= 0 or x is None or not math.isfinite(x) or x <= 0 or self.ready_since is None
                or now - self.ready_since[1] < window):
            return self
        if signals.reporting is not None and signals.reporting < ready:
            return self   # a pod's figures are missing: the throughput understates the replicas
        per_replica = x / ready
        hint = signals.capacity_hint
        planned = hint is not None and math.isfinite(hint) and hint > 0
        if self.saturated_since is not None and now - self.saturated_since >= window:
            if planned:
                sample = per_replica / hint
                return evolve(self, efficiency=_average(self.efficiency, sample, CAPACITY_WEIGHT),
                               full_efficiency=_average(self.full_efficiency, sample, CAPACITY_WEIGHT))
            return evolve(self, capacity=_average(self.capacity, per_replica, CAPACITY_WEIGHT))
        solo, slots = signals.solo_latency_s, signals.batch_slots
        if not planned or solo is None or not slots or signals.in_flight is None or self.saturated_since is not None:
            return self
        inside = [b for t, _, b in self.contents if now - t < window and b is not None]
        occupancy = min(float(slots), sum(inside) / len(inside) / ready)
        if occupancy <= 0:
            return self
        observed = occupancy / per_replica                    # seconds in the batch (Little)
        slope = (slots / hint - solo) / slots                 # the plan's seconds per busy slot
        ratio = (solo + slope * occupancy) / observed
        return evolve(self, efficiency=_average(self.efficiency if self.efficiency is not None else 1.0, ratio,
                                                 CAPACITY_WEIGHT * occupancy / slots))

    def arrival_rate(self, now: datetime, signals: Signals) -> float | None:
        """Requests/s received over about the last minute: given, or completions plus the growth
        of what the service holds (arrivals = completions + held now - held then)."""
        if signals.arrival_rate is not None:
            return signals.arrival_rate if math.isfinite(signals.arrival_rate) else None
        x = signals.throughput
        if x is None or not math.isfinite(x):
            return None
        # The trail point nearest a window ago, among those 0.75 to 1.5 windows old (oldest first).
        trail, aim = self.contents, now - _RATE_WINDOW
        lo = bisect_left(trail, now - _RATE_WINDOW_LONG, key=_first)
        hi = bisect_right(trail, now - _RATE_WINDOW_SHORT, lo, key=_first)
        if lo >= hi:
            return x   # no trail yet (a restart): completions alone; the drain term covers a backlog
        j = bisect_left(trail, aim, lo, hi, key=_first)
        t, queued, inside = min(trail[max(lo, j - 1):min(hi, j + 1)], key=lambda h: abs(h[0] - aim))
        grown = _grown((t, queued, inside), self.contents[-1], (now - t).total_seconds())
        if grown is None:
            return x   # the batches' figure came or went: the two ends do not compare
        return max(0.0, x + grown)

    def short_arrivals(self, now: datetime, signals: Signals) -> float | None:
        """Requests/s received over about the last SHORT_WINDOW_S (completions over it plus the
        growth of what the service holds), less SURGE_Z standard deviations of its counting noise:
        what it shows beyond a minute's rate is a burst, not the noise of a short window (at 60
        req/s a 20 s rate reads +-1.7 req/s; counted as bursts, they cost the conversation trace at
        8x 0.13 GPU-h more). None without the recent throughput."""
        x = signals.recent_throughput
        if x is None or not math.isfinite(x):
            return None
        trail = self.contents
        i = bisect_right(trail, now - _SHORT_WINDOW, key=_first) - 1
        grown = _grown(trail[i], trail[-1], (now - trail[i][0]).total_seconds()) if i >= 0 else None
        if grown is not None:
            x = max(0.0, x + grown)
        return max(0.0, x - SURGE_Z * math.sqrt(x / SHORT_WINDOW_S))

    def persistence(self, now: datetime, lead_s: float) -> float:
        """The share of a surge (a tick's arrivals over the minute's rate, beyond SURGE_Z standard
        deviations of the tick's counting noise, while requests waited) still there one start-up
        later, averaged over the surges remembered (RISE_MEMORY_S) that a start-up has passed
        since: the minute's rate then over the rate at the surge, as a share of the surge. 1 (all
        of it) until three have been seen through. Bursts shorter than a start-up are gone when
        replicas started for them are ready (on the real code-completion trace, a ten-second burst
        of 117 req/s asked for five replicas more, ready a minute after it)."""
        lead = timedelta(seconds=lead_s)
        minutes = self.minutes
        shares = []
        for t, rate, excess in self.surges:
            if t > now - lead:
                break
            j = bisect_left(minutes, t + lead, key=_first)
            if j < len(minutes):
                shares.append(min(1.0, max(0.0, (minutes[j][1] - rate) / excess)))
        return sum(shares) / len(shares) if len(shares) >= 3 else 1.0

    def queue_growth(self) -> float:
        """Requests/s the queue grew by on each of the last two ticks, the slower (0 unless it grew
        on both). One tick's growth is as often noise (0 -> 2 requests in 10 s at 90 req/s);
        carried over a 325 s start-up it was a backlog of 67 and a fifth replica, taken back five
        minutes later."""
        if len(self.contents) < 3:
            return 0.0
        (t0, q0, _), (t1, q1, _), (t2, q2, _) = self.contents[-3:]
        first, second = (t1 - t0).total_seconds(), (t2 - t1).total_seconds()
        if first <= 0 or second <= 0:
            return 0.0
        return max(0.0, min((q1 - q0) / first, (q2 - q1) / second))

    def trend(self) -> float:
        """Least-squares slope of the arrival rate (requests/s per s) over the trail; 0 below
        three points."""
        return self.forecast()[0]

    def forecast(self) -> tuple[float, float]:
        """The arrival rate's least-squares slope (requests/s per s) over the trail and the
        standard deviation of the trail around that line (requests/s); (0, 0) below three points."""
        n = len(self.rates)
        if n < 3 or self.rates[-1][2] - self.rates[0][2] < TREND_WINDOW_S / 2:
            return 0.0, 0.0   # too short a trail to tell a trend from noise
        xs = [p[2] for p in self.rates]   # centred below: the epoch's size does not matter
        ys = [p[1] for p in self.rates]
        mx, my = sum(xs) / n, sum(ys) / n
        dx = [x - mx for x in xs]
        dy = [y - my for y in ys]
        var = sum(map(mul, dx, dx))
        cov = sum(map(mul, dx, dy))
        slope = 0.0 if var == 0 else cov / var
        # residual sum of squares of the fit: syy - slope x sxy
        residual = (sum(map(mul, dy, dy)) - slope * cov) / (n - 2)
        return slope, math.sqrt(max(0.0, residual))

    def still_rising(self, slope: float) -> float:
        """A rising `slope` (from `forecast`) capped at what the last rate window shows: the rate's
        rise since the trail's point a window back, plus BAND_Z standard deviations of that
        difference's counting noise, per second. Seen through a minute's window a step is a
        one-minute ramp; once the window has caught up the rate is flat, but the trail's fit, half
        the old level and half the climb, rises on: long-context RAG at 150 s start-up, at its high
        phase of 16 req/s, carried +10.8 req/s more and asked for 9 replicas where 5 served, at
        every switch. A steady ramp rises over the window as fast as over the trail."""
        if slope <= 0 or len(self.rates) < 2:
            return slope
        _, now_rate, now = self.rates[-1]
        i = bisect_right(self.rates, now - RATE_WINDOW_S, key=_third) - 1
        if i < 0:
            return slope   # no point a window back yet: the trail is all there is
        _, then_rate, then = self.rates[i]
        span = now - then
        # Two minute-rates `span` apart differ by the arrivals in the part of each window the
        # other does not cover: 2 x min(span, window) seconds of counts.
        noise = math.sqrt(2 * max(now_rate, then_rate) * min(span, RATE_WINDOW_S)) / RATE_WINDOW_S
        return min(slope, max(0.0, (now_rate - then_rate + BAND_Z * noise) / span))

    def significant(self, slope: float, scatter: float, level: float) -> float:
        """A rising slope (from `forecast`) less TREND_Z standard errors, 0 when that is not
        positive: the part of the trend that is not the counting noise of the rates it is fitted
        on. The trail holds a minute's rate per tick, so its points overlap and only about one per
        RATE_WINDOW_S is independent, each with the variance of a minute's rate (the scatter
        around the trend, and the counting noise level / RATE_WINDOW_S). A least-squares slope over
        n such points spread evenly over a span has a standard error of sigma x sqrt(12 / n) / span.
        At a steady 90 req/s, a slope of +1 req/s a minute over 150 s is within one standard error
        (1.1 req/s a minute); carried over a 150 s start-up it asked for a fifth replica, which
        the next minute took back."""
        if slope <= 0 or len(self.rates) < 2:
            return 0.0
        span = self.rates[-1][2] - self.rates[0][2]
        variance = scatter * scatter + max(0.0, level) / RATE_WINDOW_S
        error = math.sqrt(12.0 * RATE_WINDOW_S * variance) / span ** 1.5 if span > 0 else math.inf
        return max(0.0, slope - TREND_Z * error)

    def rising(self, slope: float, lead_s: float) -> tuple[float, float]:
        """How much the trend's `slope` (from `forecast`) adds to the rate lead_s ahead when it
        rises, and over how many seconds it is carried: at most as far as the trail it is fitted
        on spans (a trend seen for a minute is not carried five minutes ahead)."""
        if slope <= 0:
            return 0.0, 0.0
        carried = min(lead_s, self.rates[-1][2] - self.rates[0][2])
        return slope * carried, carried

    def last_tick_s(self) -> float:
        """Seconds between the last two ticks (inf before there are two)."""
        if len(self.contents) < 2:
            return math.inf
        return max(1e-9, (self.contents[-1][0] - self.contents[-2][0]).total_seconds())

    def recent_arrivals(self, signals: Signals) -> float | None:
        """Requests/s arriving now, while requests wait: completions plus what the service took on
        since the previous tick (a minute's rate lags a step by up to a minute). None with nothing
        queued: batches filling then are the replicas' share growing, not arrivals."""
        x = signals.throughput
        if x is None or not math.isfinite(x) or len(self.contents) < 2:
            return None
        then, latest = self.contents[-2], self.contents[-1]
        grown = _grown(then, latest, (latest[0] - then[0]).total_seconds())
        if grown is None or latest[1] < 1:
            return None
        return max(0.0, x + grown)


def _grown(then: tuple[datetime, float, float | None], latest: tuple[datetime, float, float | None],
           span: float) -> float | None:
    """Requests/s by which what the service holds (queued plus inside the batches) grew from one
    entry of the contents trail to a later one, `span` seconds apart; None when the batches' figure
    came or went between them (the two ends do not compare) or the span is not positive."""
    _, queued, inside = then
    _, queued_now, inside_now = latest
    if span <= 0 or (inside is None) != (inside_now is None):
        return None
    return (queued_now - queued + (inside_now or 0.0) - (inside or 0.0)) / span


def trail_since(trail: tuple[_E, ...], cutoff: datetime, keep_equal: bool = True) -> tuple[_E, ...]:
    """The entries of a trail (oldest first, the time first in each) from `cutoff` on (after it,
    with `keep_equal` False). Only the head is looked at: a tick drops about one entry."""
    i, n = 0, len(trail)
    while i < n and (trail[i][0] < cutoff or (not keep_equal and trail[i][0] == cutoff)):  # type: ignore[index]
        i += 1
    return trail[i:] if i else trail


def _average(old: float | None, sample: float, weight: float) -> float:
    return sample if old is None else (1 - weight) * old + weight * sample


def seed(now: datetime, current: int, new: bool = False) -> History:
    """History for a service first seen (e.g. after an operator restart): it counts as having
    recommended its current replicas just now, so nothing scales down before a full window.
    `new`: the service itself is new (not only to this process), so nothing is known of its
    bursts: it keeps one replica of headroom until they are learned (see _demand)."""
    return History(((now, current, "restart"),), new=new)
