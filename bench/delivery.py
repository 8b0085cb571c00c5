"""What sending responses and checking for cancellation on the engine's token path costs, and what
moving them off it (runtime/triton_runtime/serving/delivery.py) gives back.

The GPU engine drains every request's tokens on one asyncio thread. Each token used to make two
calls into the Triton server process from that thread (`response_sender.is_cancelled()` and
`response_sender.send()`); now the thread notes the token and hands the send to an outbox thread,
and cancellation is a flag a watcher thread refreshes every 100 ms.

Measured here on the GPU engine's own code (serving/trtllm.py) driving TensorRT-LLM's LLM API
through the stand-in in tests/standins (no GPU here: every request decodes one token per
`--step-ms`), with response senders whose calls take `--call-us` microseconds each (a round trip
to the server process; the figure is a parameter, not a measurement of Triton's). For each number
of concurrent requests it prints the inter-token latency the clients see (p50, p99) and the
tokens delivered per second, both ways.

    make bench-delivery     (bench/results/delivery.md)
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "tests" / "standins"))

from triton_runtime.serving.chat import Piece  # noqa: E402
from triton_runtime.serving.delivery import CancelWatch, Outbox  # noqa: E402
from triton_runtime.serving.engine import Job, Sampling, Step  # noqa: E402
from triton_runtime.serving.trtllm import TrtllmEngine  # noqa: E402


class Sender:
    """A response sender whose every call costs `cost` seconds of waiting (the GIL released, as in
    an IPC wait); it records when each response arrived."""

    def __init__(self, cost: float) -> None:
        self.cost = cost
        self.arrivals: list[float] = []
        self.done = threading.Event()

    def send(self, final: bool) -> None:
        time.sleep(self.cost)
        self.arrivals.append(time.perf_counter())
        if final:
            self.done.set()

    def is_cancelled(self) -> bool:
        time.sleep(self.cost)
        return False


def run(engine: TrtllmEngine, requests: int, tokens: int, cost: float, off_path: bool) -> dict[str, float]:
    import tensorrt_llm

    tensorrt_llm.LLM.script = [f" t{i}" for i in range(tokens)]
    outbox = Outbox() if off_path else None
    watch = CancelWatch() if off_path else None
    senders = [Sender(cost) for _ in range(requests)]

    def job(sender: Sender) -> Job:
        if outbox is not None and watch is not None:
            check = watch.watch(sender)

            def emit(step: Step) -> None:
                final = step.finish_reason is not None
                if final:
                    watch.forget(check)
                outbox.put(lambda: sender.send(final))
            cancelled: Callable[[], bool] = check
        else:
            def emit(step: Step) -> None:
                sender.send(step.finish_reason is not None)
            cancelled = sender.is_cancelled
        return Job(prompt=[Piece("x", False)], sampling=Sampling(max_tokens=tokens, temperature=0), stops=(),
                   emit=emit, fail=lambda e: sender.done.set(), cancelled=cancelled)

    t0 = time.perf_counter()
    for s in senders:
        engine.submit(job(s))
    for s in senders:
        if not s.done.wait(120):
            raise TimeoutError("a request never finished")
    wall = time.perf_counter() - t0
    if outbox is not None and watch is not None:
        outbox.close()
        watch.close()
    gaps = sorted(b - a for s in senders for a, b in zip(s.arrivals, s.arrivals[1:]))
    return {"itl_p50_ms": 1000 * statistics.median(gaps), "itl_p99_ms": 1000 * gaps[int(0.99 * (len(gaps) - 1))],
            "tokens_per_s": sum(len(s.arrivals) for s in senders) / wall}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", default="1,16,64", help="concurrent requests (comma-separated)")
    p.add_argument("--tokens", type=int, default=64, help="tokens each request generates")
    p.add_argument("--step-ms", type=float, default=20.0, help="the engine's decode step (one token per request)")
    p.add_argument("--call-us", default="50,200", help="microseconds each call to the server takes (comma-separated)")
    p.add_argument("--out", default=str(ROOT / "results" / "delivery.md"))
    a = p.parse_args(argv)
    engine = TrtllmEngine("/models/bench", {})
    engine.llm.token_seconds = a.step_ms / 1000
    rows = []
    try:
        for call_us in (float(x) for x in a.call_us.split(",")):
            for n in (int(x) for x in a.requests.split(",")):
                on = run(engine, n, a.tokens, call_us / 1e6, off_path=False)
                off = run(engine, n, a.tokens, call_us / 1e6, off_path=True)
                rows.append((call_us, n, on, off))
                print(f"{call_us:5.0f} us/call {n:3d} requests: on the token path ITL p50 {on['itl_p50_ms']:.1f} ms "
                      f"p99 {on['itl_p99_ms']:.1f} ms {on['tokens_per_s']:.0f} tok/s; off it ITL p50 "
                      f"{off['itl_p50_ms']:.1f} ms p99 {off['itl_p99_ms']:.1f} ms {off['tokens_per_s']:.0f} tok/s",
                      flush=True)
    finally:
        engine.shutdown()
    command = "make bench-delivery" if argv is None and len(sys.argv) == 1 else "python bench/delivery.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    lines = [
        "# Sends and cancellation checks on and off the engine's token path", "",
        f"Command: `{command}`; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {platform.machine()}, "
        f"{platform.python_version()}, a 2-core shared VM.", "",
        f"The GPU engine's code (runtime/triton_runtime/serving/trtllm.py) on the LLM API stand-in (no GPU here): "
        f"each request decodes a token every {a.step_ms:g} ms and generates {a.tokens}; each call to the server "
        "process (send, is_cancelled) is modelled as a wait of the stated length. On the token path: both calls "
        "per token on the engine's drain thread. Off it: an outbox thread sends, a watcher polls every 100 ms.", "",
        "| call | requests | ITL p50 / p99 on the path | tok/s on the path | ITL p50 / p99 off it | tok/s off it |",
        "| --- | --- | --- | --- | --- | --- |"]
    for call_us, n, on, off in rows:
        lines.append(f"| {call_us:g} us | {n} | {on['itl_p50_ms']:.1f} / {on['itl_p99_ms']:.1f} ms | "
                     f"{on['tokens_per_s']:.0f} | {off['itl_p50_ms']:.1f} / {off['itl_p99_ms']:.1f} ms | "
                     f"{off['tokens_per_s']:.0f} |")
    Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
