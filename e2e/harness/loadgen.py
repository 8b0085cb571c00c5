"""A closed-loop load generator for the end-to-end tests, through tritonclient.

``LoadGenerator`` keeps ``concurrency`` requests in flight against one model (each worker thread
has its own client and sends its next request as soon as the last one answers) until ``stop()``,
its time limit or its request limit, whichever comes first: it is always bounded, even if the
test forgets to stop it. ``run_load()`` is the blocking one-shot form.

Targets must be loopback addresses (the harness's servers); the URL is tritonclient's
``host:port`` (a ``grpc://`` or ``http://`` prefix is accepted and chooses the protocol).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

DEFAULT_MAX_DURATION_S = 300.0
DEFAULT_MAX_REQUESTS = 1_000_000


@dataclass
class LoadResult:
    """What a load run measured. Latencies are client-side, in milliseconds."""

    successes: int = 0
    failures: int = 0
    duration_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    errors: Counter = field(default_factory=Counter, repr=False)

    @property
    def requests(self) -> int:
        return self.successes + self.failures

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (0-100) of successful requests' latency, None without any."""
        if not self.latencies_ms:
            return None
        return float(np.percentile(np.asarray(self.latencies_ms), q))

    @property
    def p50_ms(self) -> float | None:
        return self.percentile(50)

    @property
    def p99_ms(self) -> float | None:
        return self.percentile(99)

    @property
    def mean_ms(self) -> float | None:
        return float(np.mean(self.latencies_ms)) if self.latencies_ms else None

    @property
    def throughput_rps(self) -> float:
        return self.successes / self.duration_s if self.duration_s > 0 else 0.0

    def summary(self) -> str:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}ms"

        top = "; ".join(f"{n}x {e}" for e, n in self.errors.most_common(3))
        return (
            f"{self.successes} ok, {self.failures} failed in {self.duration_s:.1f}s "
            f"({self.throughput_rps:.1f}/s), p50 {ms(self.p50_ms)}, p99 {ms(self.p99_ms)}"
            + (f"; errors: {top}" if top else "")
        )


def _split_url(url: str, protocol: str | None) -> tuple[str, str]:
    for prefix in ("grpc://", "http://"):
        if url.startswith(prefix):
            return prefix[:-3], url[len(prefix) :]
    return (protocol or "grpc"), url


class LoadGenerator:
    """Keeps ``concurrency`` inferences in flight against ``model`` at ``url``.

    >>> with LoadGenerator(triton.grpc_address, "slow", concurrency=8, duration_s=20) as load:
    ...     ...                           # observe the system under load
    >>> load.result.summary()

    Bounds: ``duration_s`` (the generator stops itself after it; at most 300 s by default),
    ``max_requests`` (total sent), and ``timeout_s`` per request. ``set_concurrency()`` changes
    the number in flight while it runs.
    """

    def __init__(
        self,
        url: str,
        model: str,
        concurrency: int = 1,
        duration_s: float = 60.0,
        *,
        protocol: str | None = None,
        max_requests: int = DEFAULT_MAX_REQUESTS,
        timeout_s: float = 30.0,
        input_name: str = "INPUT0",
        output_name: str = "OUTPUT0",
        shape: tuple[int, ...] = (4,),
    ) -> None:
        if concurrency < 0:
            raise ValueError("concurrency must be >= 0")
        self.protocol, self.address = _split_url(url, protocol)
        if self.protocol not in ("grpc", "http"):
            raise ValueError(f"unknown protocol {self.protocol!r}")
        self.model = model
        self.duration_s = min(float(duration_s), DEFAULT_MAX_DURATION_S)
        self.max_requests = max_requests
        self.timeout_s = timeout_s
        self.input_name, self.output_name = input_name, output_name
        self.data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        self.result = LoadResult()
        self._concurrency = concurrency
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sent = 0
        self._started_at: float | None = None
        self._deadline = 0.0
        self._in_flight = 0

    # ------------------------------------------------------------------------------ control
    def start(self) -> "LoadGenerator":
        if self._started_at is not None:
            raise RuntimeError("a LoadGenerator runs once; make a new one")
        self._started_at = time.monotonic()
        self._deadline = self._started_at + self.duration_s
        self._grow(self._concurrency)
        return self

    def set_concurrency(self, n: int) -> None:
        """Changes the number of requests kept in flight (workers above n go idle)."""
        with self._lock:
            self._concurrency = max(0, n)
        if self._started_at is not None and not self._stop.is_set():
            self._grow(n)

    @property
    def concurrency(self) -> int:
        return self._concurrency

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def stop(self, timeout: float | None = None) -> LoadResult:
        """Stops sending, waits for the requests in flight, and returns the result."""
        self._stop.set()
        wait = self.timeout_s + 5 if timeout is None else timeout
        end = time.monotonic() + wait
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        self._finish()
        return self.result

    def wait(self) -> LoadResult:
        """Waits until the generator ends by itself (time or request limit)."""
        for t in self._threads:
            t.join(max(0.0, self._deadline - time.monotonic()) + self.timeout_s + 5)
        self._stop.set()
        self._finish()
        return self.result

    def snapshot(self) -> LoadResult:
        """A copy of the result so far (while running)."""
        with self._lock:
            return LoadResult(
                successes=self.result.successes,
                failures=self.result.failures,
                duration_s=time.monotonic() - (self._started_at or time.monotonic()),
                latencies_ms=list(self.result.latencies_ms),
                errors=Counter(self.result.errors),
            )

    def __enter__(self) -> "LoadGenerator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------------------ workers
    def _finish(self) -> None:
        if self._started_at is not None and self.result.duration_s == 0.0:
            self.result.duration_s = time.monotonic() - self._started_at

    def _grow(self, n: int) -> None:
        with self._lock:
            while len(self._threads) < n:
                t = threading.Thread(
                    target=self._worker, args=(len(self._threads),), daemon=True,
                    name=f"loadgen-{self.model}-{len(self._threads)}",
                )
                self._threads.append(t)
                t.start()

    def _take_ticket(self, index: int) -> bool | None:
        """True: send one; None: idle for now; False: this worker is done."""
        if self._stop.is_set() or time.monotonic() >= self._deadline:
            return False
        with self._lock:
            if index >= self._concurrency:
                return None
            if self._sent >= self.max_requests:
                return False
            self._sent += 1
            self._in_flight += 1
            return True

    def _worker(self, index: int) -> None:
        client, make_inputs, make_outputs = self._client()
        try:
            while True:
                ticket = self._take_ticket(index)
                if ticket is False:
                    return
                if ticket is None:
                    self._stop.wait(0.05)
                    continue
                started = time.monotonic()
                error = None
                try:
                    client.infer(
                        self.model, make_inputs(), outputs=make_outputs(),
                        **({"client_timeout": self.timeout_s} if self.protocol == "grpc" else {}),
                    )
                except Exception as e:  # every failure counts; the message is kept
                    error = f"{type(e).__name__}: {str(e)[:200]}"
                elapsed_ms = (time.monotonic() - started) * 1000.0
                with self._lock:
                    self._in_flight -= 1
                    if error is None:
                        self.result.successes += 1
                        self.result.latencies_ms.append(elapsed_ms)
                    else:
                        self.result.failures += 1
                        self.result.errors[error] += 1
                if error is not None:
                    # A down server fails fast: do not spin.
                    self._stop.wait(0.05)
        finally:
            try:
                client.close()
            except Exception:
                pass

    def _client(self):
        if self.protocol == "grpc":
            import tritonclient.grpc as tc

            client = tc.InferenceServerClient(self.address)
        else:
            import tritonclient.http as tc

            client = tc.InferenceServerClient(
                self.address, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
            )

        def make_inputs():
            inp = tc.InferInput(self.input_name, list(self.data.shape), "FP32")
            inp.set_data_from_numpy(self.data)
            return [inp]

        def make_outputs():
            return [tc.InferRequestedOutput(self.output_name)]

        return client, make_inputs, make_outputs


def run_load(
    url: str,
    model: str,
    concurrency: int,
    duration_s: float,
    *,
    protocol: str | None = None,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    timeout_s: float = 30.0,
) -> LoadResult:
    """Keeps ``concurrency`` requests in flight for ``duration_s`` seconds; returns the result."""
    gen = LoadGenerator(
        url, model, concurrency, duration_s,
        protocol=protocol, max_requests=max_requests, timeout_s=timeout_s,
    )
    gen.start()
    return gen.wait()
