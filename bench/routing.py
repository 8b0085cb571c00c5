"""make bench-routing: what routing by a request's beginning does for time to first token, on real
replicas.

Three replicas of the real `llm` model (SmolLM2-135M-Instruct on llama.cpp, each its own CPU
tritonserver, one thread, its prefix cache kept to --cache-mib: a replica's KV cache holds a few
tenants' prompts, not all of them) behind the real gateway (a separate process routing from a fixed
table: discovery only changes the table), driven through /v1/chat/completions with streaming at a
fixed concurrency. Workloads:
- tenants: --tenants tenants, each with its own system prompt of about 500 tokens, short questions;
- conversations: multi-turn chats, --turns turns each, that resend their history on every turn (as
  many under way at once as requests in flight, unless --open says more: then a chat's next turn
  waits behind the other chats' current ones, as a chat service's users' turns do);
- control: prompts of about 500 tokens that share nothing.
- chat (not in the default run): chats of --turns turns (5) under one product's system prompt, each turn
  resending the history (answers of about 60 words standing for the model's), --open of them
  under way at once, their turns interleaved as a chat service's users' are (a chat's next turn
  comes after the others' current ones); with --requests 144 --cache-mib 96 a replica's cache
  holds the product's prompt and a few chats, and the chats' first turns are under a tenth of
  the requests (bench/results/routing-chat.md). Conversations at a steady state, with --turns 15
  --open 12: bench/results/routing-conversations.md.
Routing: leastInFlight (the default), prefix (spec.routing.policy prefix: what each replica holds as
the gateway sent it), kvEvents (as the replicas' engines report it), each also behind two gateway
replicas (two gateway processes with no state shared, requests alternating between them, as
a Service in front of the gateway's Deployment spreads them: each sees only its own requests in
flight, and with kvEvents the engines' events every answer brings) and random (for reference: a random replica per request, within the same load bound). Every run starts with fresh
replicas (empty caches). Reported per run: TTFT p50/p90 (first streamed token), requests/s, and the
hit rate (prompt tokens the replicas' caches held / prompt tokens, from their
triton_llm_prompt_tokens_cached_total and triton_llm_prompt_tokens_total).

On 2 shared cores three replicas, the gateway and the client compete for CPU: the figures are this
machine's. Writes bench/results/routing.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "results"
POLICIES = ("leastInFlight", "prefix", "prefix x2", "kvEvents", "kvEvents x2", "random", "leastInFlight x2")
GATEWAYS = {"prefix x2": 2, "kvEvents x2": 2, "leastInFlight x2": 2}   # gateway replicas a run (1 unless named)
LABELS = {"prefix x2": "prefix, 2 gateways", "kvEvents x2": "kvEvents, 2 gateways",
          "leastInFlight x2": "leastInFlight, 2 gateways"}
WORKLOADS = ("tenants", "conversations", "control")   # the default run
CHOICES = WORKLOADS + ("chat",)
TURNS = 5                      # turns in a conversation
_Turn = list[dict[str, str]]   # the messages one request sends
WORDS = ("billing support refund invoice account plan upgrade shipping order warranty return policy customer "
         "device network password security privacy contract renewal discount payment delivery storage backup").split()


def serve_gateway(port: int, keys: str, policy: str, ports: list[int]) -> None:
    """The gateway process: one service `smol` over the replicas at `ports`."""
    from triton_operator.gateway import gateway_command, openai_proxy, routing
    from triton_operator.gateway.config import GatewaySettings
    from triton_operator.gateway.server import Gateway

    if policy == "random":   # a random order per request, within prefix routing's bound, knowing no prompt
        openai_proxy.beginning_of = (  # type: ignore[assignment]
            lambda req, key, answer=0, precise=False, scope="": routing.Beginning(random.getrandbits(64), (), 0, answer))
    if os.environ.get("BENCH_AFFINITY_LOAD"):   # --affinity-load: the load bound's factor, for its sensitivity
        routing.AFFINITY_LOAD = float(os.environ["BENCH_AFFINITY_LOAD"])
    gw = Gateway(GatewaySettings(address="127.0.0.1", port=port, metrics_port=0, key_files=[keys],
                                 requests_per_minute=1e9), None)
    gw.router.set_service({"metadata": {"name": "smol", "namespace": "bench"},
                           "spec": {"model": {"format": "tensorrt-llm", "source": "hf://x/y"},
                                    "engine": {"maxBatchSize": 1},   # llama.cpp runs one sequence at a time
                                    "routing": {"policy": {"random": "prefix"}.get(policy, policy.split()[0])}}})
    for i, p in enumerate(ports):
        gw.router.set_slice({"metadata": {"name": f"smol-{i}", "namespace": "bench",
                                          "labels": {"kubernetes.io/service-name": "smol"}},
                             "ports": [{"name": "http", "port": p}],
                             "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]})
    gateway_command.run_loop(gateway_command.serve(gw))


def system_prompt(rng: random.Random, tenant: int) -> str:
    rules = " ".join(f"Rule {k}: for {rng.choice(WORDS)} questions about {rng.choice(WORDS)}, "
                     f"mention the {rng.choice(WORDS)} team." for k in range(30))
    return f"You are the assistant of company {tenant}. {rules}"


def workload(name: str, tenants: int, requests: int, seed: int, turns: int = TURNS) -> list[list[_Turn]]:
    """Sessions: each a list of turns, each turn the messages sent (a conversation's turns resend
    its history: the earlier questions, each followed by a fixed reply standing for its answer)."""
    rng = random.Random(seed)
    if name == "tenants":
        systems = [system_prompt(rng, t) for t in range(tenants)]
        return [[[{"role": "system", "content": systems[rng.randrange(tenants)]},
                  {"role": "user", "content": f"Question {i}: what about my {rng.choice(WORDS)}?"}]]
                for i in range(requests)]
    if name in ("conversations", "chat"):
        product = system_prompt(rng, 1000) if name == "chat" else None   # chat: one product's, every user's
        sessions = []
        for c in range(requests // turns):
            history = [{"role": "system", "content": product or system_prompt(rng, 1000 + c)}]
            session = []
            for k in range(turns):
                history = history + [{"role": "user", "content": f"Turn {k}: tell me about {rng.choice(WORDS)}."}]
                session.append(list(history))
                answer = (f"About turn {k} of chat {c}: " + " ".join(rng.choice(WORDS) for _ in range(60)) + "."
                          if product else f"Here is what I know about turn {k}.")   # standing for the model's
                history = history + [{"role": "assistant", "content": answer}]
            sessions.append(session)
        return sessions
    return [[[{"role": "user", "content": system_prompt(rng, 5000 + i) + " Summarise rule 1."}]] for i in range(requests)]


async def run_sessions(urls: list[str], key: str, sessions: list[list[_Turn]], concurrency: int,
                       open_at_once: int) -> tuple[list[tuple[str, float]], float]:
    """Each request's system prompt (its first sentence: the tenant or the chat) with its TTFT, in the
    order they were answered, and the wall time. `open_at_once` sessions are
    under way at once (a new one starts when one ends); `concurrency` requests are in flight at
    once, each a turn of the session that has waited longest since its last turn was answered,
    so a session's next turn follows the other sessions' current ones and may leave on any
    connection. Requests alternate over `urls` (one per gateway)."""
    answered: list[tuple[str, float]] = []
    sent = 0
    total = sum(len(s) for s in sessions)
    ready: asyncio.Queue[tuple[list[_Turn], int] | None] = asyncio.Queue()
    waiting = list(sessions)
    for _ in range(min(open_at_once, len(waiting))):
        ready.put_nowait((waiting.pop(0), 0))
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        while (item := await ready.get()) is not None:
            turns, k = item
            url = urls[sent % len(urls)]
            sent += 1
            body = json.dumps({"model": "smol", "messages": turns[k], "max_tokens": 8, "temperature": 0,
                               "stream": True}).encode()
            started = time.perf_counter()
            first = None
            async with session.post(url, data=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                async for line in resp.content:
                    if first is None and line.startswith(b"data: {") and b'"content":"' in line \
                            and b'"content":""' not in line:
                        first = time.perf_counter() - started
            answered.append((str(turns[k][0]["content"]).split(".")[0],
                             first if first is not None else time.perf_counter() - started))
            if k + 1 < len(turns):
                ready.put_nowait((turns, k + 1))
            elif waiting:
                ready.put_nowait((waiting.pop(0), 0))
            if len(answered) == total:
                for _ in range(concurrency):
                    ready.put_nowait(None)

    t0 = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return answered, time.perf_counter() - t0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def one_run(policy: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    from e2e.cluster import wait_for
    from e2e.harness import free_port, http_ok
    from e2e.harness.llm import LLMTriton

    replicas = [LLMTriton(threads=1, n_ctx=2048, prefix_cache_bytes=args.cache_mib << 20) for _ in range(args.replicas)]
    gateways: list[subprocess.Popen[bytes]] = []
    keys = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    key = "sk-bench-" + secrets.token_urlsafe(32)
    keys.write(f"keys:\n  - {{name: bench, key: {key}, namespaces: [bench]}}\n")
    keys.close()
    try:
        for r in replicas:
            r.start()
        ports = [free_port() for _ in range(GATEWAYS.get(policy, 1))]
        for port in ports:
            gateways.append(subprocess.Popen(
                [sys.executable, __file__, "--serve-gateway", str(port), keys.name, policy,
                 ",".join(str(r.http_port) for r in replicas)], start_new_session=True,
                env={**os.environ, "BENCH_AFFINITY_LOAD": str(args.affinity_load or "")}))
        for port in ports:
            url = f"http://127.0.0.1:{port}/healthz"
            wait_for(f"the gateway at {url}", lambda: http_ok(url, timeout=2), timeout=60, interval=0.2)
        sessions = workload(name, args.tenants, args.requests, args.seed, args.turns)
        open_at_once = (args.open or 6) if name == "chat" else (args.open or args.concurrency)
        answered, wall = asyncio.run(run_sessions([f"http://127.0.0.1:{port}/v1/chat/completions" for port in ports],
                                                  key, sessions, args.concurrency, open_at_once))
        ttfts, n = [t for _, t in answered], len(answered)
        prompt = sum(sum(v for _, v in r.metric_samples("triton_llm_prompt_tokens_total")) for r in replicas)
        cached = sum(sum(v for _, v in r.metric_samples("triton_llm_prompt_tokens_cached_total")) for r in replicas)
        return {"policy": policy, "gateways": len(ports), "workload": name, "requests": n, "ttft_p50": pct(ttfts, 0.5),
                "ttft_p90": pct(ttfts, 0.9), "ttft_mean": statistics.mean(ttfts), "rps": n / wall,
                "hit_rate": cached / prompt if prompt else 0.0, "wall_s": wall,
                "answered": [[first, round(t, 3)] for first, t in answered]}
    finally:
        for gateway in gateways:
            gateway.terminate()
            gateway.wait(10)
        for r in replicas:
            r.stop()
        os.unlink(keys.name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--tenants", type=int, default=12)
    p.add_argument("--requests", type=int, default=72, help="requests per workload (conversations, chat: --turns each)")
    p.add_argument("--turns", type=int, default=TURNS, help="conversations, chat: turns in a chat")
    p.add_argument("--concurrency", type=int, default=3)
    p.add_argument("--open", type=int, default=None,
                   help="conversations, chat: chats under way at once (default: conversations as many as "
                        "--concurrency, chat 6)")
    p.add_argument("--cache-mib", type=int, default=48, help="each replica's prefix-cache budget")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workload", action="append", choices=CHOICES)
    p.add_argument("--policy", action="append", choices=POLICIES)
    p.add_argument("--affinity-load", type=float, default=None,
                   help="the load bound's factor (the gateway's AFFINITY_LOAD), to measure what it does")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--serve-gateway", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_gateway:
        port, keys, policy, ports = args.serve_gateway
        serve_gateway(int(port), keys, policy, [int(x) for x in ports.split(",")])
        return
    from bench.common import machine
    from triton_operator.gateway import routing as gateway_routing

    started = datetime.now(timezone.utc)
    rows = []
    for name in args.workload or WORKLOADS:
        for policy in args.policy or POLICIES:
            row = one_run(policy, name, args)
            rows.append(row)
            print(f"{name:14s} {LABELS.get(policy, policy):19s} TTFT p50 {row['ttft_p50']:6.2f}s p90 {row['ttft_p90']:6.2f}s "
                  f"{row['rps']:5.2f} req/s hit rate {row['hit_rate']:5.1%} ({row['requests']} requests, "
                  f"{row['wall_s']:.0f}s)", flush=True)
    lines = [
        "# Routing by a request's beginning, on real replicas",
        "",
        f"`make bench-routing` (`python bench/routing.py`), {started:%Y-%m-%d %H:%M} UTC, on this machine "
        f"({machine()}; the cores shared by the replicas, the gateway and the client); {args.replicas} replicas of "
        f"SmolLM2-135M-Instruct (llama.cpp, one thread each, a {args.cache_mib} MiB prefix cache each), "
        f"{args.tenants} tenants, {args.requests} requests per workload, concurrency {args.concurrency}"
        + (f", {args.turns} turns a chat" if args.turns != TURNS else "")
        + (f", {args.open or 6} chats under way at once" if "chat" in (args.workload or WORKLOADS) else
           f", {args.open} conversations under way at once" if args.open else "")
        + f", 8 tokens per answer, seed {args.seed}"
        + (f", the load bound at {args.affinity_load:g}x the mean in flight (the gateway's is "
           f"{gateway_routing.AFFINITY_LOAD:g}x)" if args.affinity_load else "") + ". Each run starts from empty caches.",
        "",
        "| workload | routing | TTFT p50 (s) | TTFT p90 (s) | requests/s | cache hit rate |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['workload']} | {LABELS.get(r['policy'], r['policy'])} | {r['ttft_p50']:.2f} | {r['ttft_p90']:.2f} | "
                     f"{r['rps']:.2f} | {r['hit_rate']:.1%} |")
    by = {(r["workload"], r["policy"]): r for r in rows}
    lines.append("")
    for name in args.workload or WORKLOADS:
        for policy in ("prefix", "kvEvents"):
            a, b = by.get((name, policy)), by.get((name, "leastInFlight"))
            if a and b:
                lines.append(f"- {name}: {policy} routing's TTFT p90 is {a['ttft_p90'] / b['ttft_p90']:.2f}x "
                             f"leastInFlight's, at {a['rps'] / b['rps']:.2f}x its throughput.")
            two = by.get((name, f"{policy} x2"))
            if a and two and a["hit_rate"] > 0:
                lines.append(f"- {name}: behind two gateways {policy} routing's hit rate is {two['hit_rate']:.1%} "
                             f"against {a['hit_rate']:.1%} behind one ({two['hit_rate'] / a['hit_rate']:.2f}x), TTFT "
                             f"p90 {two['ttft_p90']:.2f} s against {a['ttft_p90']:.2f} s.")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "routing.md").write_text("\n".join(lines) + "\n")
    (out / "routing.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
