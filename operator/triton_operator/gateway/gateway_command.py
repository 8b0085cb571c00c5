"""`triton-operator gateway`: run the gateway until SIGTERM or SIGINT.

On a stop signal the gateway turns unready (so its pod leaves its Service), answers requests it
holds with 503 and Retry-After at once, lets answers in progress finish for up to
--shutdown-timeout seconds, then cuts them: a client sees an error, never a hang.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import signal
from typing import Any

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the server (and its metrics) load only when the gateway runs, not with every command
    from .server import Gateway

from .. import logs

log = logging.getLogger(__name__)


def add_parser(sub: Any, handler: Any) -> None:
    g = sub.add_parser("gateway", help="run the OpenAI-compatible gateway in front of the InferenceServices")
    g.add_argument("--address", help="address to listen on (default 0.0.0.0)")
    g.add_argument("--port", type=int, help="port of the OpenAI and KServe v2 routes (default 8080)")
    g.add_argument("--metrics-port", type=int, help="port of /metrics, /healthz, /readyz (default 9090; 0: the API port)")
    g.add_argument("-n", "--namespace", action="append", help="serve only this namespace (repeatable)")
    g.add_argument("--key-file", action="append", help="API key list, YAML (repeatable); see gateway/keys.py")
    g.add_argument("--kubeconfig", help="kubeconfig to use outside a cluster (default: in-cluster, then ~/.kube/config)")
    g.add_argument("--endpoint-slice-selector", help="label selector of the EndpointSlices to route to")
    g.add_argument("--resolve", action="append", metavar="HOST=ADDRESS",
                   help="pin a host name of FQDN endpoints to an address, as curl --resolve (repeatable)")
    g.add_argument("--hold-timeout", type=float, help="seconds a request waits for a replica (default 300)")
    g.add_argument("--shutdown-timeout", type=float, help="seconds answers may finish after SIGTERM (default 10)")
    g.add_argument("--check-keys", action="store_true", help="validate the key files, print their digests, exit")
    g.add_argument("--log-format", choices=logs.FORMATS, help="text (default) or json")
    g.add_argument("-v", "--verbose", action="store_true")
    g.set_defaults(func=handler)


def run(args: argparse.Namespace, cli_error: type[Exception]) -> int:
    from . import keys as keys_core
    from .auth import Auth
    from .config import GatewaySettingsError, from_env
    from ..kube.aio import ApiServer
    from ..kube.client import load_config
    from .server import Gateway

    pins = None
    if args.resolve:
        bad = [p for p in args.resolve if "=" not in p or not p.split("=", 1)[1]]
        if bad:
            raise cli_error(f"--resolve takes HOST=ADDRESS, found {bad[0]!r}")
        pins = dict(p.split("=", 1) for p in args.resolve)
    try:
        settings = from_env(resolve=pins,
            address=args.address, port=args.port, metrics_port=args.metrics_port, namespaces=args.namespace,
            key_files=args.key_file, endpoint_slice_selector=args.endpoint_slice_selector,
            hold_timeout_seconds=args.hold_timeout, shutdown_timeout_seconds=args.shutdown_timeout,
            log_format=args.log_format)
    except GatewaySettingsError as e:
        raise cli_error(str(e)) from None
    if args.check_keys:
        auth = Auth(settings)
        auth.load_keys()
        if auth.keys_error is not None:
            raise cli_error(auth.keys_error)
        print(keys_core.to_json(auth.grants))
        return 0
    # Key files that cannot be used do not stop the gateway (a pod would crash-loop): it serves the
    # keys of the other files, refuses the rest with 503 keys_unavailable (triton_gateway_key_files_valid
    # 0), and takes the broken file's keys as soon as it is fixed (Auth.refresh_keys).
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # one line per request is too many
    logs.use(settings.log_format)
    from . import tracing
    try:
        traces = tracing.from_env()   # off without OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT
    except tracing.TracingError as e:
        raise cli_error(str(e)) from None
    try:
        configuration = load_config(args.kubeconfig)
    except Exception as e:  # noqa: BLE001 - the kubernetes loaders raise many kinds
        raise cli_error(f"no Kubernetes credentials: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not settings.key_files:
        log.warning("no --key-file given: every request will be refused with 401")
    gateway = Gateway(settings, ApiServer(configuration), tracing=traces)
    try:
        run_loop(serve(gateway))
    except OSError as e:
        raise cli_error(f"cannot listen: {e.strerror or e}") from None
    return 0


def return_large_buffers_to_the_os() -> None:
    """Request bodies are large, short-lived buffers. glibc serves blocks of 128 KiB and more with
    mmap, but raises that threshold (up to 32 MiB) each time such a block is freed, after which
    bodies come from the heap and their pages stay with the process when they are freed: measured
    with make bench-gateway, 1.7 MiB of RSS per held 1 MiB request, 1.08 MiB with the threshold
    fixed at 128 KiB (M_MMAP_THRESHOLD, which also stops the adjustment). Not glibc: nothing."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    except (OSError, AttributeError):
        pass


M_MMAP_THRESHOLD = -3   # glibc malloc.h


def run_loop(main: Any) -> None:
    """Run (with return_large_buffers_to_the_os) on uvloop (libuv, the loop uvicorn uses) where it is installed: it cut the gateway's
    CPU per proxied request by about a third here (bench/results/gateway.md); asyncio's own loop
    otherwise."""
    return_large_buffers_to_the_os()
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


async def serve(gateway: Gateway, stop: asyncio.Event | None = None) -> None:
    """Serve until `stop` is set (or a signal arrives), then shut down as the module says."""
    s = gateway.settings
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread (tests)
            pass
    await gateway.start()
    runners = [gateway.api_runner(with_health=not s.metrics_port)]
    if s.metrics_port:
        runners.append(gateway.health_runner())
    try:
        await runners[0].setup()
        await gateway.api_site(runners[0], s.address, s.port).start()
        if s.metrics_port:
            await runners[1].setup()
            await gateway.health_site(runners[1], s.address, s.metrics_port).start()
        log.info("gateway listening on %s:%d (metrics and probes on %d); %d API key(s)", s.address, s.port,
                 s.metrics_port or s.port, len(gateway.auth.grants))
        await stop.wait()
        log.info("stopping: held requests are answered 503, answers in progress get %.0fs",
                 s.shutdown_timeout_seconds)
    finally:
        await gateway.on_shutdown(None)  # type: ignore[arg-type]
        for runner in runners:
            await runner.cleanup()
