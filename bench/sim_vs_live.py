"""make bench-sim-vs-live: what `simulate` predicts against what live replicas do, on the same
slice of a real trace, with the operator's own autoscaling loop deciding.

Live:
- replicas of the real `llm` model (SmolLM2-135M-Instruct on llama.cpp, each its own CPU
  tritonserver, one thread, no prefix cache) behind the real gateway (a separate process, routing
  to the replica with the fewest requests in flight and counting the SLO);
- a real Prometheus scraping the replicas and the gateway every 5 s;
- the operator's autoscaling loop (autoscaling/loop.Autoscaler: its one Prometheus query, the
  pure policy, the report), ticking every 10 s as it does in the operator.
What a Deployment and the kubelet do is played by this script, because pods on the local cluster's
kwok nodes run no process: a replica asked for is created, waits --pull-s (the image pull), then
its tritonserver starts; it is Ready, and joins the gateway's table, once Triton's ready endpoints
answer. A replica removed (not-ready ones first, then the newest) leaves the table at once, finishes
what it holds, then stops. Replica-seconds run from creation to stop, as GPU time is paid.

Simulated: the simulator (simulator) on the same requests (the arrival times, the prompt and answer
tokens the live replicas reported) with a replica model measured on this machine around the live
run: the time to the first token as measured at the calibration's prompt sizes (linear in between),
a time per further token, one request at a time (llama.cpp's single sequence), the start-up
measured on the same replicas (plus --pull-s). The time per further token is measured twice, with
every replica busy and with one replica alone: the replicas share two cores and their memory
bandwidth, and a replica decodes faster alone (a GPU replica has its own). The simulation takes the
alone time plus, for the share of its own decoding during which another replica was busy, the
difference to the busy one, simulating again until that share settles (with_contention); the
live run's timing is not used. The calibration runs once before the live run and
once after it, and the prediction uses both together: a shared machine's speed drifts over ten
minutes, and a model taken on one side of the run alone predicts at that side's speed (the
simulations with each alone are reported too, with the replicas' own time per answer token during
the run, which no queue inflates, as the check of which speed the run had). `ours` there is the
same policy through the same signal rules (autoscaling/signals); neither side is given the
planner's sizing of a replica (no GPU class is involved).

Workload: slices of the Azure LLM inference trace 2023, code service
(bench/data/azure-llm-trace-2023-code; Azure Public Dataset, CC-BY 4.0; attribution as its authors
ask: Pratyush Patel, Esha Choukse, Chaojie Zhang, Aashaka Shah, Inigo Goiri, Saeed Maleki, Ricardo
Bianchini, "Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024): the
arrival times as recorded, thinned (a seeded draw) to what CPU replicas serve, prompts at 1/16 of
the recorded tokens (clipped), answers the recorded tokens clipped to --max-output. `make
bench-sim-vs-live` runs two slices: 360-960 s at 7 % (the load rises: one scale-up) and, as
sim-vs-live-fall, 2,520-3,420 s at 10 % (the load rises, falls and comes back: a replica released
and asked for again), found by simulating every minute-aligned 15-minute slice with a replica model
measured here and taking one where the policy scaled down and up again.

Reported: attainment, replica-seconds, scale moves and the replica timeline of both, and the gaps
(the goal: attainment within 3 points, replica-seconds within 10 %), and each side's reason at every
scale move. On 2 shared cores the replicas, the gateway, Prometheus and the client compete: the
figures are this machine's. Writes bench/results/NAME.md and NAME.json (--name, sim-vs-live).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "results"
TRACE = ROOT / "bench" / "data" / "azure-llm-trace-2023-code" / "code.csv"
NS, NAME = "bench", "smol"
SIZE_GAP = 15.0   # calibration prompts within this many tokens of each other are one prompt size
WORDS = ("function return value string index array loop parse error handler request response buffer "
         "thread socket config module import class method object list map filter reduce yield").split()


def service_object(args: argparse.Namespace) -> dict[str, Any]:
    """The InferenceService both sides scale: the autoscaling defaults, the SLO the user states."""
    return {
        "apiVersion": "serving.triton-operator.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"model": {"source": "hf://HuggingFaceTB/SmolLM2-135M-Instruct", "format": "tensorrt-llm"},
                 "gpu": {"class": "l4", "count": 1},
                 # As the simulator routes: to the least busy replica. Unset, an LLM service gets
                 # kvEvents, which sent both calibration streams to one replica half the time
                 # (their prompts share nothing, so every replica costs alike) and measured twice
                 # the service time.
                 "routing": {"policy": "leastInFlight"},
                 "autoscaling": {"minReplicas": 1, "maxReplicas": args.max_replicas,
                                 "slo": {"latencyMs": args.slo_ms, "latency": "endToEnd"}}},
    }


# ------------------------------------------------------------------------------------ workload
@dataclass
class Planned:
    arrival: float
    prompt_words: int
    max_tokens: int


def trace_slice(args: argparse.Namespace) -> tuple[list[Planned], float]:
    """The slice's requests and its mean arrival rate before thinning."""
    from triton_operator.simulator.reader import parse_trace

    with TRACE.open() as f:
        rows = [r for r in parse_trace(f, TRACE.name) if args.start <= r.arrival < args.start + args.duration]
    rng = random.Random(args.seed)
    kept = [r for r in rows if rng.random() < args.keep]
    return ([Planned(r.arrival - args.start, max(8, min(args.max_prompt, r.prompt_tokens // 16)),
                     min(args.max_output, r.output_tokens)) for r in kept],
            len(rows) / args.duration)


def prompt_text(words: int, i: int) -> str:
    rng = random.Random(i)
    return f"Request {i}. Complete this code: " + " ".join(rng.choice(WORDS) for _ in range(words))


# ------------------------------------------------------------------------------------ gateway
def serve_gateway(port: int, metrics_port: int, keys: str, table: str, service: str) -> None:
    """The gateway process: one service over the replicas listed in `table` (a JSON file of
    {slot: [port, ready]}), read again whenever it changes (what EndpointSlices do in a cluster)."""
    from triton_operator.gateway import gateway_command
    from triton_operator.gateway.config import GatewaySettings
    from triton_operator.gateway.server import Gateway

    gw = Gateway(GatewaySettings(address="127.0.0.1", port=port, metrics_port=metrics_port, key_files=[keys],
                                 requests_per_minute=1e9), None)
    gw.router.set_service(json.loads(Path(service).read_text()))

    def endpoint_slice(slot: str, p: int, ready: bool) -> dict[str, Any]:
        return {"metadata": {"name": f"{NAME}-{slot}", "namespace": NS, "labels": {"kubernetes.io/service-name": NAME}},
                "ports": [{"name": "http", "port": p}],
                "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready}}]}

    async def follow() -> None:
        seen = None
        listed: dict[str, dict[str, Any]] = {}   # slot -> the slice the router holds for it
        while True:
            try:
                text = Path(table).read_text()
            except OSError:
                text = seen
            if text and text != seen:
                seen = text
                changed = set()
                now = {slot: endpoint_slice(slot, p, ready) for slot, (p, ready) in json.loads(text).items()}
                for slot in set(listed) - set(now):
                    # a replica gone leaves the router, as its endpoint leaves the EndpointSlice (a
                    # slice left behind kept a stopped replica's port, and the next replica started
                    # in its slot was passed over while the gateway backed off from that port)
                    changed |= gw.router.set_slice(None, listed.pop(slot))
                for slot, obj in now.items():
                    changed |= gw.router.set_slice(obj)
                    listed[slot] = obj
                gw.watches.wakeups.wake(changed)
            await asyncio.sleep(0.1)

    async def main() -> None:
        task = asyncio.create_task(follow())
        try:
            await gateway_command.serve(gw)
        finally:
            task.cancel()

    gateway_command.run_loop(main())


class GatewayProcess:
    def __init__(self, workdir: Path, obj: dict[str, Any]):
        from e2e.harness import free_port, http_ok

        self.port, self.metrics_port = free_port(), free_port()
        self.key = "sk-bench-" + secrets.token_urlsafe(32)
        self.keys, self.table, self.service = workdir / "keys.yaml", workdir / "table.json", workdir / "service.json"
        self.keys.write_text(f"keys:\n  - {{name: bench, key: {self.key}, namespaces: [{NS}]}}\n")
        self.service.write_text(json.dumps(obj))
        self.set_table({})
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve-gateway", str(self.port), str(self.metrics_port),
                                      str(self.keys), str(self.table), str(self.service)], start_new_session=True)
        deadline = time.time() + 60
        while not http_ok(f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=2):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.2)

    def set_table(self, table: dict[str, tuple[int, bool]]) -> None:
        tmp = self.table.with_suffix(".tmp")
        tmp.write_text(json.dumps(table))
        tmp.replace(self.table)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# ------------------------------------------------------------------------------------ replicas
@dataclass
class Pod:
    name: str
    slot: int
    created: float
    ready_at: float = math.inf
    deleted_at: float = math.inf
    stopped_at: float = math.inf
    state: str = "loading"        # loading | ready | draining | gone
    server: Any = None
    startup_s: float | None = None


class Supervisor:
    """What the Deployment, its ReplicaSet and the kubelet do, for processes on this machine:
    replicas in fixed port slots (so Prometheus's static targets find them), created, started
    after the pull, Ready on Triton's ready endpoints, drained and stopped on scale-down."""

    def __init__(self, gateway: GatewayProcess, slots: list[tuple[int, int, int]], pull_s: float, t0: float):
        self.gateway, self.slots, self.pull_s, self.t0 = gateway, slots, pull_s, t0
        self.lock = threading.RLock()
        self.pods: list[Pod] = []
        self.desired = 0
        self.timeline: list[tuple[float, int, int, int, int]] = []
        self.decisions: list[tuple[float, int, int]] = []
        self.errors: list[str] = []
        self.seq = 0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def live(self) -> list[Pod]:
        return [p for p in self.pods if p.state in ("loading", "ready")]

    def scale_to(self, n: int) -> None:
        with self.lock:
            if n == self.desired:
                return
            self.decisions.append((self.now(), self.desired, n))
            live = self.live()
            if n > len(live):
                for _ in range(n - len(live)):
                    self._create()
            else:
                victims = sorted(live, key=lambda p: (p.state == "ready", -p.ready_at, -p.created))[:len(live) - n]
                for p in victims:
                    p.deleted_at = self.now()
                    p.state = "draining" if p.state == "ready" else "gone-soon"
                    threading.Thread(target=self._drain, args=(p,), daemon=True).start()
            self.desired = n
            self._changed()

    def _create(self) -> None:
        used = {p.slot for p in self.pods if p.state != "gone"}
        slot = next(i for i in range(len(self.slots)) if i not in used)
        self.seq += 1
        pod = Pod(f"{NAME}-{self.seq}", slot, self.now())
        self.pods.append(pod)
        threading.Thread(target=self._boot, args=(pod,), daemon=True).start()

    def _boot(self, pod: Pod) -> None:
        from e2e.harness.llm import LLMTriton

        deadline = time.monotonic() + self.pull_s
        while time.monotonic() < deadline:
            if pod.state != "loading":
                return self._gone(pod)
            time.sleep(0.05)
        server = LLMTriton(threads=1, n_ctx=2048, prefix_cache_bytes=0, metrics_interval_ms=1000)
        server.http_port, server.grpc_port, server.metrics_port = self.slots[pod.slot]
        pod.server = server
        started = time.monotonic()
        try:
            server.start(wait=False)
            server.wait_ready(300)
        except (RuntimeError, OSError) as e:
            self.errors.append(f"{pod.name}: {e}"[:400])
            return self._gone(pod)
        pod.startup_s = time.monotonic() - started
        with self.lock:
            if pod.state != "loading":   # removed while it started
                return self._gone(pod)
            pod.ready_at, pod.state = self.now(), "ready"
            self._changed()

    def _drain(self, pod: Pod) -> None:
        """A ready replica finishes what it holds, then stops; a starting one stops at once."""
        if pod.state == "draining" and pod.server is not None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and busy(pod.server):
                time.sleep(0.2)
        self._gone(pod)

    def _gone(self, pod: Pod) -> None:
        if pod.server is not None:
            pod.server.stop()
        with self.lock:
            if pod.state == "gone":
                return
            pod.stopped_at, pod.state = self.now(), "gone"
            self._changed()

    def _changed(self) -> None:
        with self.lock:
            table = {str(p.slot): (self.slots[p.slot][0], p.state == "ready") for p in self.pods
                     if p.state in ("loading", "ready")}
            self.gateway.set_table(table)
            states = [p.state for p in self.pods]
            self.timeline.append((self.now(), self.desired, states.count("loading"), states.count("ready"),
                                  states.count("draining")))

    def ready(self) -> int:
        return sum(p.state == "ready" for p in self.pods)

    def stop_all(self) -> None:
        for p in list(self.pods):
            if p.server is not None:
                p.server.stop()


def busy(server: Any) -> bool:
    """Anything queued or running on this replica (its engine's own gauges)."""
    try:
        text = server.metrics_text()
    except OSError:
        return False
    from e2e.harness.triton import parse_metrics

    return any(v > 0 for n, _, v in parse_metrics(text) if n in ("triton_llm_active_requests", "triton_llm_queued_requests"))


class ClusterView:
    """The autoscaler's `Services`: what its informer caches would hold (autoscaling/loop.py)."""

    def __init__(self, obj: dict[str, Any], supervisor: Supervisor):
        from triton_operator.api import InferenceService

        self.raw, self.obj, self.sup = obj, InferenceService.model_validate(obj), supervisor
        self.epoch = datetime.now(timezone.utc).timestamp() - supervisor.now()

    def fresh(self) -> bool:
        return True

    def autoscaled(self) -> list[tuple[tuple[str, str], Any, dict[str, Any]]]:
        return [((NS, NAME), self.obj, self.raw)]

    def scaling(self, key: tuple[str, str]) -> tuple[dict[str, Any], tuple[dict[str, Any], ...]]:
        from triton_operator.conditions import timestamp

        def at(t: float) -> str:
            return timestamp(datetime.fromtimestamp(self.epoch + t, timezone.utc))

        with self.sup.lock:
            pods = tuple({"metadata": {"name": p.name, "resourceVersion": p.state, "creationTimestamp": at(p.created)},
                          "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": at(p.ready_at)}]
                                     if p.state == "ready" else []}}
                         for p in self.sup.pods if p.state in ("loading", "ready"))
            dep = {"spec": {"replicas": self.sup.desired}, "status": {"readyReplicas": self.sup.ready()}}
        return dep, pods

    def gpu_classes(self) -> dict[str, Any]:
        return {}


# ------------------------------------------------------------------------------------ client
@dataclass
class Done:
    arrival: float
    first: float = math.nan
    finish: float = math.nan
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None


async def one(session: aiohttp.ClientSession, url: str, key: str, i: int, p: Planned, t0: float) -> Done:
    body = json.dumps({"model": NAME, "messages": [{"role": "user", "content": prompt_text(p.prompt_words, i)}],
                       "max_tokens": p.max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    d = Done(p.arrival)
    try:
        async with session.post(url, data=body, headers={"Authorization": f"Bearer {key}",
                                                         "Content-Type": "application/json"}) as resp:
            if resp.status != 200:
                d.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                d.finish = time.monotonic() - t0
                return d
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                if math.isnan(d.first) and any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                    d.first = time.monotonic() - t0
                if chunk.get("usage"):
                    d.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    d.output_tokens = chunk["usage"]["completion_tokens"]
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        d.error = type(e).__name__
    d.finish = time.monotonic() - t0
    if math.isnan(d.first):
        d.first = d.finish
    return d


async def replay(url: str, key: str, plan: list[Planned], t0: float) -> list[Done]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        async def at(i: int, p: Planned) -> Done:
            await asyncio.sleep(max(0.0, t0 + p.arrival - time.monotonic()))
            return await one(session, url, key, i, p, t0)
        return list(await asyncio.gather(*(at(i, p) for i, p in enumerate(plan))))


# ------------------------------------------------------------------------------------ the model
def ttft_curve(samples: list[Done]) -> tuple[tuple[float, float], ...]:
    """The time to the first token as measured: the calibration's requests grouped by prompt size
    (prompt tokens within SIZE_GAP of each other), the median of each group, never falling with
    the prompt. Measured, not fitted: on these replicas the time grows faster than linearly with
    the prompt (0.42 s at 50 tokens, 1.66 s at 228, 2.98 s at 362 on 2026-12-07), so a straight
    line through the calibration, held at a non-negative time for an empty prompt, read every
    prompt of 90-230 tokens 6-11 % slower than measured."""
    points = sorted((float(s.prompt_tokens), s.first - s.arrival) for s in samples)
    groups: list[list[tuple[float, float]]] = []
    for x, y in points:
        if groups and x - groups[-1][-1][0] <= SIZE_GAP:
            groups[-1].append((x, y))
        else:
            groups.append([(x, y)])
    curve: list[tuple[float, float]] = []
    for g in groups:
        y = statistics.median(p[1] for p in g)
        curve.append((statistics.median(p[0] for p in g), max(y, curve[-1][1] if curve else 0.0)))
    return tuple(curve)


def interpolate(curve: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise linear through the curve; below its first point in proportion to the prompt,
    beyond its last along its last segment."""
    if len(curve) == 1 or x <= curve[0][0]:
        return curve[0][1] * x / curve[0][0]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = curve[-2], curve[-1]
    return y1 + (y1 - y0) * (x - x1) / (x1 - x0)


def token_time(samples: list[Done]) -> float:
    """The median time per answer token after the first."""
    per = [(s.finish - s.first) / (s.output_tokens - 1) for s in samples if s.output_tokens > 1]
    return statistics.median(per) if per else math.nan


def measured_model(samples: list[Done], n_ctx: int, solo: list[Done] | None = None) -> Any:
    """The replica the simulator runs: the time to the first token as the calibration measured
    it (ttft_curve), then a time per further token; one request at a time. `token_s` is the
    time per token measured with every replica busy, `token_s_alone` with the others idle (from
    `solo`): on shared cores a replica decodes faster alone (decode reads the weights for every
    token: it wants memory bandwidth, which the replicas share), where a GPU replica has its own.
    with_contention() picks the time between them that the simulated run's own mix gives."""
    from triton_operator.simulator.replica import LLMPerformance

    @dataclass(frozen=True)
    class MeasuredCPU(LLMPerformance):
        first_token: tuple[tuple[float, float], ...] = ()
        token_s: float = 0.0
        token_s_alone: float = 0.0

        def decode_step_s(self, batch: int, kv_tokens: float) -> float:
            return self.token_s

        def prefill_s(self, tokens: float) -> float:
            return interpolate(self.first_token, tokens)

    shared = token_time(samples)
    shared = shared if math.isfinite(shared) else 0.02
    alone = token_time(solo or [])
    return MeasuredCPU(params=135e6, weight_bytes=0.0, kv_bytes_per_token=0.0, kv_capacity_tokens=float(n_ctx),
                       bandwidth=1.0, flops=1.0, layers=30, hidden=576, max_batch=1, max_input_len=n_ctx,
                       max_seq_len=n_ctx, first_token=ttft_curve(samples), token_s=shared,
                       token_s_alone=min(alone, shared) if math.isfinite(alone) else shared)


def overlap_share(start: list[float], first: list[float], finish: list[float], replica: list[int]) -> float:
    """The share of a run's decoding (each request from its first token to its finish) during
    which another replica was serving a request (from its start to its finish)."""
    done = [i for i in range(len(start)) if all(math.isfinite(x) for x in (start[i], first[i], finish[i]))]
    total = busy = 0.0
    for i in done:
        a, b = first[i], finish[i]
        if b <= a:
            continue
        others = sorted((max(a, start[j]), min(b, finish[j])) for j in done
                        if replica[j] != replica[i] and start[j] < b and finish[j] > a)
        covered, reach = 0.0, a
        for lo, hi in others:   # the union of the other replicas' busy spans inside [a, b]
            lo = max(lo, reach)
            if hi > lo:
                covered += hi - lo
                reach = hi
        total += b - a
        busy += covered
    return busy / total if total else 0.0


def with_contention(model: Any, run: Callable[[Any], Any], rounds: int = 6) -> tuple[Any, Any, float]:
    """The model whose time per token is the alone one plus the share of the simulated decoding
    that another replica was busy times the difference to the all-busy one, found by simulating
    again until that share settles (it moves with the scale moves it causes); the model, its run,
    and the share."""
    m = model
    for _ in range(rounds):
        sim = run(m)
        share = overlap_share(sim.start, sim.first_token, sim.finish, sim.replica)
        token_s = model.token_s_alone + share * (model.token_s - model.token_s_alone)
        if abs(token_s - m.token_s) < 1e-5:
            return m, sim, share
        m = dataclasses.replace(model, token_s=token_s)
    sim = run(m)   # not settled (a scale move flips with it): the last model, as simulated
    return m, sim, overlap_share(sim.start, sim.first_token, sim.finish, sim.replica)


def curve_text(curve: Any) -> str:
    return ", ".join(f"{x:.0f}: {y:.2f} s" for x, y in curve)


async def calibrate(url: str, key: str, streams: int, rounds: int, max_prompt: int, max_output: int,
                    first_id: int) -> list[Done]:
    """Requests of a spread of prompt sizes, `streams` at a time (as many replicas as serve), one
    after the other on each stream: a replica's service time under the load of its neighbours.
    Prompts are numbered from `first_id`, so no two calibrations send the same text."""
    sizes = [8 + (max_prompt - 8) * k // (rounds - 1) for k in range(rounds)]
    out: list[Done] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        async def stream(s: int) -> None:
            for k, words in enumerate(sizes):
                t0 = time.monotonic()
                d = await one(session, url, key, first_id + s * 100 + k, Planned(0.0, words, max_output), t0)
                if d.error is None:
                    out.append(d)
        await asyncio.gather(*(stream(s) for s in range(streams)))
    return out


def calibration(when: str, sup: Supervisor, url: str, key: str, args: argparse.Namespace,
                first_id: int) -> tuple[list[Done], list[Done]]:
    """As many replicas as may serve, idle, then each kept busy with a spread of prompt sizes; then
    one request at a time, the other replicas idle (a replica decoding alone on the shared cores)."""
    from e2e.cluster import wait_for

    sup.scale_to(args.max_replicas)
    wait_for("the calibration replicas", lambda: sup.ready() == args.max_replicas
             and not any(pd.state in ("draining", "gone-soon") for pd in sup.pods), 600)
    wait_for("the replicas idle", lambda: not any(busy(pd.server) for pd in sup.pods if pd.state == "ready"), 300)
    samples = asyncio.run(calibrate(url, key, args.max_replicas, args.calibration_rounds, args.max_prompt,
                                    args.max_output, first_id))
    for d in sorted(samples, key=lambda d: d.prompt_tokens):
        print(f"  calibration {when}: {d.prompt_tokens} prompt tokens, first token {d.first - d.arrival:.2f} s, "
              f"{d.output_tokens} answer tokens in {d.finish - d.arrival:.2f} s", flush=True)
    solo = asyncio.run(calibrate(url, key, 1, args.calibration_rounds // 2, args.max_prompt // 2, args.max_output,
                                 first_id + 5_000))
    m = measured_model(samples, 2048, solo)
    print(f"measured {when}: first token at prompt tokens {curve_text(m.first_token)}; "
          f"{m.token_s * 1000:.1f} ms/answer token with every replica busy, {m.token_s_alone * 1000:.1f} alone "
          f"({len(samples)} + {len(solo)} calibration requests)", flush=True)
    return samples, solo


# ------------------------------------------------------------------------------------ comparison
def clipped_seconds(spans: list[tuple[float, float]], end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, 0.0)) for a, b in spans)


def desired_at(decisions: list[tuple[float, int, int]], initial: int, t: float) -> int:
    n = initial
    for when, _, to in decisions:
        if when > t:
            break
        n = to
    return n


def ready_at(timeline: list[tuple[float, int, int, int, int]], t: float) -> int:
    n = 0
    for row in timeline:
        if row[0] > t:
            break
        n = row[3]
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--start", type=float, default=360.0, help="the slice's start in the trace, seconds")
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--keep", type=float, default=0.07, help="share of the trace's requests replayed")
    p.add_argument("--max-prompt", type=int, default=320, help="prompt words at most (1/16 of the trace's tokens)")
    p.add_argument("--max-output", type=int, default=24)
    p.add_argument("--max-replicas", type=int, default=2)
    p.add_argument("--slo-ms", type=float, default=4000.0)
    p.add_argument("--pull-s", type=float, default=20.0, help="seconds a created replica waits before it starts")
    p.add_argument("--calibration-rounds", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--name", default="sim-vs-live", help="the result files' name: NAME.md and NAME.json in --out")
    p.add_argument("--serve-gateway", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.command = " ".join(["python bench/sim_vs_live.py"] + [
        f"--{k.replace('_', '-')} {v:g}" if isinstance(v, float) else f"--{k.replace('_', '-')} {v}"
        for k, v in vars(args).items() if k not in ("out", "serve_gateway") and v != p.get_default(k)])
    if args.serve_gateway:
        port, metrics, keys, table, service = args.serve_gateway
        serve_gateway(int(port), int(metrics), keys, table, service)
        return
    run(args)


def run(args: argparse.Namespace) -> None:
    from bench.common import machine
    from e2e.cluster import wait_for
    from e2e.harness import free_port
    from e2e.harness.llm import ensure_llm
    from e2e.harness.prometheus import Prometheus, Target
    from triton_operator.api import InferenceService
    from triton_operator.autoscaling.loop import Autoscaler
    from triton_operator.autoscaling.prometheus import PrometheusSource
    from triton_operator.simulator.policies.ours import Ours, live_signals
    from triton_operator.simulator.replica import ColdStart
    from triton_operator.simulator.results import quantile, summarize
    from triton_operator.simulator.simulation import SimulationSettings, simulate
    from triton_operator.simulator.workload import Request
    from triton_operator.settings import Settings

    started_at = datetime.now(timezone.utc)
    ensure_llm()
    obj = service_object(args)
    plan, raw_rate = trace_slice(args)
    print(f"slice {args.start:.0f}-{args.start + args.duration:.0f} s of the code trace: {raw_rate:.2f} req/s recorded, "
          f"{len(plan)} requests replayed ({len(plan) / args.duration:.2f} req/s)", flush=True)
    work = Path(tempfile.mkdtemp(prefix="sim-vs-live-"))
    gateway = GatewayProcess(work, obj)
    slots = [(free_port(), free_port(), free_port()) for _ in range(2 * args.max_replicas)]
    prom = Prometheus([Target(f"127.0.0.1:{m}", {"namespace": NS, "inferenceservice": NAME, "pod": f"slot-{i}"})
                       for i, (_, _, m) in enumerate(slots)] + [Target(f"127.0.0.1:{gateway.metrics_port}", {})],
                      scrape_interval="5s")
    url = f"http://127.0.0.1:{gateway.port}/v1/chat/completions"
    sup = Supervisor(gateway, slots, 0.0, time.monotonic())
    autoscaler = None
    try:
        prom.start()
        before = calibration("before the run", sup, url, gateway.key, args, 10_000)
        startups = [pd.startup_s for pd in sup.pods if pd.startup_s is not None]
        load_s = statistics.mean(startups)
        print(f"start-up {load_s:.1f} s after the pull", flush=True)
        # The live run: one warm replica, the autoscaler in charge, the pull before each start.
        sup.scale_to(1)
        wait_for("the drain", lambda: not any(pd.state in ("draining", "gone-soon") for pd in sup.pods), 300)
        sup.pull_s = args.pull_s
        settings = Settings(prometheus_url=prom.url, autoscale_interval_seconds=10.0)
        time.sleep(15)   # Prometheus has seen the warm replica a few times
        t0 = time.monotonic()
        sup.t0, sup.timeline, sup.decisions = t0, [], []
        for pd in sup.pods:
            pd.created = pd.ready_at = pd.stopped_at = pd.deleted_at = -1.0
        sup.pods = [pd for pd in sup.pods if pd.state == "ready"]
        sup.pods[0].stopped_at = sup.pods[0].deleted_at = math.inf
        sup._changed()
        sup.timeline = [(0.0, *sup.timeline[-1][1:])]
        view = ClusterView(obj, sup)
        holder: dict[str, Autoscaler] = {}

        live_reasons: list[tuple[float, int, str]] = []   # every changed report: when, desired, why

        def enqueue(key: tuple[str, str]) -> None:
            report = holder["a"].report(key)
            if report is not None:
                live_reasons.append((sup.now(), report.desired, report.reason))
                sup.scale_to(report.desired)

        autoscaler = holder["a"] = Autoscaler(view, enqueue, None, settings, PrometheusSource(settings))
        autoscaler.start()
        done = asyncio.run(replay(url, gateway.key, plan, t0))
        end = args.duration
        time.sleep(max(0.0, t0 + end - time.monotonic()))   # the replicas run to the slice's end
        autoscaler.stop()
        live_pods = [(pd.created, pd.stopped_at if math.isfinite(pd.stopped_at) else sup.now()) for pd in sup.pods]
        live_timeline = list(sup.timeline)
        live_decisions = list(sup.decisions)
        errors = list(sup.errors)
        sup.pull_s = 0.0
        after = calibration("after the run", sup, url, gateway.key, args, 20_000)
    finally:
        if autoscaler is not None:
            autoscaler.stop()
        sup.stop_all()
        gateway.stop()
        prom.close()

    # The simulation of the same requests, with the replica measured around the run.
    requests = [Request(d.arrival, d.prompt_tokens or 30 + pl.prompt_words, d.output_tokens or pl.max_tokens)
                for d, pl in zip(done, plan)]
    perf = measured_model(before[0] + after[0], 2048, before[1] + after[1])
    sides = {"before": (before, measured_model(before[0], 2048, before[1])),
             "after": (after, measured_model(after[0], 2048, after[1]))}
    in_run_token_s = token_time([d for d in done if d.error is None])
    print(f"time per answer token with every replica busy (alone): {sides['before'][1].token_s * 1000:.1f} "
          f"({sides['before'][1].token_s_alone * 1000:.1f}) ms before the run, {in_run_token_s * 1000:.1f} ms during "
          f"it, {sides['after'][1].token_s * 1000:.1f} ({sides['after'][1].token_s_alone * 1000:.1f}) ms after",
          flush=True)
    spec = InferenceService.model_validate(obj).spec

    def no_sizing(v: Any, pf: Any) -> Any:
        return dataclasses.replace(live_signals(v, pf), capacity_hint=None, solo_latency_s=None, batch_slots=None,
                                   prefill_s=None)

    # Ready when the model is: this script polls Triton's ready endpoints continuously.
    cold = ColdStart(schedule_s=0.0, pull_s=args.pull_s, load_s=load_s, readiness_period_s=0.1)
    sim_settings = SimulationSettings(min_replicas=1, max_replicas=args.max_replicas, initial_replicas=1,
                                      slo_s=args.slo_ms / 1000, slo_target=spec.autoscaling.service_level().attainment,
                                      seed=args.seed, scrape_interval=5.0, duration=args.duration)

    def run_sim(model: Any) -> Any:
        return simulate(requests, model, cold, Ours(spec.autoscaling, planner=model, signals=no_sizing), sim_settings)

    def predict(model: Any) -> tuple[Any, Any, dict[str, float]]:
        used, sim, share = with_contention(model, run_sim)
        summary = summarize(sim)
        return sim, summary, {"attainment": summary.slo_attainment, "scale_moves": len(sim.decisions),
                              "replica_seconds": clipped_seconds([(pod[1], pod[3]) for pod in sim.pods], args.duration),
                              "per_answer_token_s": used.token_s, "busy_share": share}

    sim, summary, predicted = predict(perf)

    slo_s = args.slo_ms / 1000
    live_met = sum(1 for d in done if d.error is None and d.finish - d.arrival <= slo_s)
    live_att = live_met / len(done) if done else 1.0
    live_rs = clipped_seconds(live_pods, end)
    sim_rs = predicted["replica_seconds"]
    sim_decisions = [(t, a, b) for t, a, b, _ in sim.decisions]
    grid = list(range(0, int(end) + 1, 30))
    live_ready = [ready_at(live_timeline, t) for t in grid]
    sim_ready = [ready_at(sim.timeline, t) for t in grid]
    lat_live = sorted(d.finish - d.arrival for d in done if d.error is None)
    result = {
        "date": f"{started_at:%Y-%m-%d %H:%M} UTC", "machine": machine(), "args": vars(args),
        "requests": len(done), "errors": sum(d.error is not None for d in done),
        "model": {"first_token": perf.first_token, "per_answer_token_busy_s": perf.token_s,
                  "per_answer_token_alone_s": perf.token_s_alone, "per_answer_token_s": predicted["per_answer_token_s"],
                  "busy_share": predicted["busy_share"], "startup_s": load_s, "pull_s": args.pull_s,
                  "calibration_requests": sum(len(x) for x in before + after),
                  "sides": {side: {"first_token": m.first_token, "per_answer_token_busy_s": m.token_s,
                                   "per_answer_token_alone_s": m.token_s_alone,
                                   "calibration_requests": sum(len(x) for x in samples), **predict(m)[2]}
                            for side, (samples, m) in sides.items()},
                  "in_run_per_answer_token_s": in_run_token_s},
        "live": {"attainment": live_att, "replica_seconds": live_rs, "scale_moves": len(live_decisions),
                 "p50_s": quantile(lat_live, 0.5), "p99_s": quantile(lat_live, 0.99), "decisions": live_decisions,
                 "replica_errors": errors, "reasons": live_reasons},
        "simulated": {**predicted, "p50_s": summary.latency_p50_ms / 1000,
                      "p99_s": summary.latency_p99_ms / 1000, "decisions": sim_decisions,
                      "reasons": [(t, why) for t, why in sim.reasons]},
        # Each request on both sides, for reading where they part: arrival, prompt and answer
        # tokens, then live first token, finish and error, then simulated start of service,
        # first token, finish and replica.
        "per_request": [[round(q.arrival, 3), q.prompt_tokens, q.output_tokens, round(d.first, 3), round(d.finish, 3),
                         d.error, round(sim.start[i], 3), round(sim.first_token[i], 3), round(sim.finish[i], 3),
                         sim.replica[i]]
                        for i, (q, d) in enumerate(zip(requests, done))],
        "timeline": {"t": grid, "live_ready": live_ready, "simulated_ready": sim_ready,
                     "live_desired": [desired_at(live_decisions, 1, t) for t in grid],
                     "simulated_desired": [desired_at(sim_decisions, 1, t) for t in grid]},
    }
    result["gap"] = {"attainment_points": 100 * (result["simulated"]["attainment"] - live_att),
                     "replica_seconds": (sim_rs - live_rs) / live_rs if live_rs else math.nan,
                     "ready_replicas_mean_abs": statistics.mean(abs(a - b) for a, b in zip(live_ready, sim_ready))}
    write(result, Path(args.out))


def reason_at(reasons: list[Any], t: float) -> str:
    """The last reason given at or before `t` ("-" before any)."""
    said = [why for at, *_, why in reasons if at <= t + 1e-6]
    return said[-1] if said else "-"


def why_lines(r: dict[str, Any]) -> list[str]:
    """Each side's reason at every scale move of either side: where the two part, why."""
    live, sim = r["live"].get("reasons") or [], r["simulated"].get("reasons") or []
    moves = sorted([(t, "live") for t, *_ in r["live"]["decisions"]] + [(t, "simulated") for t, *_ in r["simulated"]["decisions"]])
    if not moves or not (live or sim):
        return []
    lines = ["", "The policy's reason on each side at every scale move (the live loop's at the move, the simulated "
             "policy's last tick at or before it):", "", "| t (s) | moved | live | simulated |", "| --- | --- | --- | --- |"]
    for t, side in moves:
        lines.append(f"| {t:.0f} | {side} | {reason_at(live, t)} | {reason_at(sim, t)} |".replace("\n", " "))
    return lines


def request_lines(r: dict[str, Any]) -> list[str]:
    """Request by request: how far the two sides' latencies are apart, how closely the replica
    model matches a request the simulation served at once (no wait: its latency is the model's
    alone), and the requests that met the SLO on one side only, which make the attainment gap."""
    from triton_operator.simulator.results import quantile

    rows = r.get("per_request") or []
    done = [row for row in rows if row[5] is None]
    if not done:
        return []
    slo = r["args"]["slo_ms"] / 1000
    apart = sorted(abs((lfin - a) - (sfin - a)) for a, _, _, _, lfin, _, _, _, sfin, _ in done)
    at_once = [(lfin - a) / (sfin - a) for a, _, _, _, lfin, _, ss, _, sfin, _ in done if ss - a < 0.05 and sfin > a]
    live_only = [(lfin - a, sfin - a) for a, _, _, _, lfin, _, _, _, sfin, _ in done if lfin - a <= slo < sfin - a]
    sim_only = [(lfin - a, sfin - a) for a, _, _, _, lfin, _, _, _, sfin, _ in done if sfin - a <= slo < lfin - a]

    def pairs(xs: list[tuple[float, float]]) -> str:
        return ", ".join(f"{x:.2f}/{y:.2f}" for x, y in sorted(xs)) or "none"

    return ["", f"Request by request ({len(done)} answered live): live and simulated latency "
            f"{statistics.median(apart):.2f} s apart at the median, {quantile(apart, 0.9):.2f} s at the 90th "
            f"percentile (which replica, and in which order, differs between the sides). "
            + (f"The {len(at_once)} requests the simulation served at once took live x{statistics.median(at_once):.3f} "
               f"the simulated latency at the median (the replica model alone). " if at_once else "")
            + f"Met the SLO on one side only: {len(live_only)} live (live/simulated s: {pairs(live_only)}) and "
            f"{len(sim_only)} simulated ({pairs(sim_only)})."]


def write(r: dict[str, Any], out: Path) -> None:
    a = r["args"]
    live, sim, gap, m = r["live"], r["simulated"], r["gap"], r["model"]
    lines = [
        "# The simulator against live replicas",
        "",
        f"`make bench-sim-vs-live` (`{a.get('command', 'python bench/sim_vs_live.py')}`), {r['date']}, on this machine ({r['machine']}, "
        f"shared by the replicas, the gateway, Prometheus and the client).",
        "",
        f"Slice {a['start']:.0f}-{a['start'] + a['duration']:.0f} s of the Azure LLM inference trace 2023 (code; "
        f"CC-BY 4.0, Patel et al., Splitwise, ISCA 2024), {r['requests']} requests ({a['keep']:.0%} of the recorded "
        f"ones), prompts 1/16 of the recorded tokens (at most {a['max_prompt']} words), answers at most "
        f"{a['max_output']} tokens; SmolLM2-135M-Instruct replicas on llama.cpp (one thread each), 1 to "
        f"{a['max_replicas']} replicas, SLO {a['slo_ms'] / 1000:.0f} s end to end, a {a['pull_s']:.0f} s pull before "
        f"each start. Replica model measured before and after the run: the first token after (prompt tokens: "
        f"seconds) {curve_text(m['first_token'])}, in between linear; a further token "
        f"{m['per_answer_token_busy_s'] * 1000:.1f} ms with every replica busy, {m['per_answer_token_alone_s'] * 1000:.1f} "
        f"ms alone, so {m['per_answer_token_s'] * 1000:.1f} ms as simulated (another replica was busy for "
        f"{m['busy_share']:.0%} of the simulated decoding); start-up {m['startup_s']:.1f} s after the pull "
        f"({m['calibration_requests']} calibration requests).",
        "",
        "| | attainment | replica-seconds | scale moves | p50 (s) | p99 (s) |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| live | {live['attainment']:.1%} | {live['replica_seconds']:.0f} | {live['scale_moves']} | "
        f"{live['p50_s']:.2f} | {live['p99_s']:.2f} |",
        f"| simulated | {sim['attainment']:.1%} | {sim['replica_seconds']:.0f} | {sim['scale_moves']} | "
        f"{sim['p50_s']:.2f} | {sim['p99_s']:.2f} |",
        "",
        f"Gap (simulated - live): attainment {gap['attainment_points']:+.1f} points (goal: within 3), replica-seconds "
        f"{gap['replica_seconds']:+.1%} (goal: within 10 %), ready replicas off by {gap['ready_replicas_mean_abs']:.2f} "
        f"on average over the 30 s marks. Failed live requests: {r['errors']}.",
        "",
        "The machine's speed around the run, and what the simulator predicts with the replica measured on one "
        f"side of it only (the replicas took {m['in_run_per_answer_token_s'] * 1000:.1f} ms per answer token during "
        "the run):",
        "",
        "| replica measured | first token (prompt tokens: seconds) | per answer token: all busy, alone, as simulated "
        "| simulated attainment | simulated replica-seconds | scale moves |",
        "| --- | --- | --- | --- | --- | --- |",
        *(f"| {side} the run | {curve_text(x['first_token'])} | {x['per_answer_token_busy_s'] * 1000:.1f}, "
          f"{x['per_answer_token_alone_s'] * 1000:.1f}, {x['per_answer_token_s'] * 1000:.1f} ms | {x['attainment']:.1%} | "
          f"{x['replica_seconds']:.0f} | {x['scale_moves']} |" for side, x in m["sides"].items()),
        "",
        "Ready replicas every 30 s (live / simulated):",
        "",
        "| t (s) | " + " | ".join(str(t) for t in r["timeline"]["t"]) + " |",
        "| --- | " + " | ".join("---" for _ in r["timeline"]["t"]) + " |",
        "| live | " + " | ".join(str(x) for x in r["timeline"]["live_ready"]) + " |",
        "| simulated | " + " | ".join(str(x) for x in r["timeline"]["simulated_ready"]) + " |",
        "",
        "Scale moves (t, from, to): live " + ", ".join(f"({t:.0f}, {x}, {y})" for t, x, y in live["decisions"])
        + "; simulated " + ", ".join(f"({t:.0f}, {x}, {y})" for t, x, y in sim["decisions"]) + ".",
        *why_lines(r),
        *request_lines(r),
    ]
    out.mkdir(parents=True, exist_ok=True)
    name = a.get("name") or "sim-vs-live"
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    (out / f"{name}.json").write_text(json.dumps(r, indent=1, default=str) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
