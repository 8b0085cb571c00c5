"""`triton-operator check-install`, what the chart's `helm test` pod runs: its retry loop, its
HTTP checks against a real loopback server (with --resolve), and its refusals. The checks against
a real API server, with the test pod's RBAC, are in e2e/test_chart.py."""

from __future__ import annotations

import http.server
import threading
from typing import Iterator

import pytest

from triton_operator import checkinstall as ci
from triton_operator.cli import main


@pytest.fixture
def server() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200 if self.path == "/healthz" else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def test_failing_checks_are_retried_until_they_pass_or_the_wait_is_over():
    now = [0.0]
    calls = {"flaky": 0, "fine": 0, "broken": 0}

    def check(name, passes_after):
        def run():
            calls[name] += 1
            return [ci.Result(calls[name] > passes_after, name, f"try {calls[name]}")]
        return run

    def sleep(s):
        now[0] += s
    results = ci.run_checks([check("fine", 0), check("flaky", 2), check("broken", 10**6)], wait=10,
                            clock=lambda: now[0], sleep=sleep, interval=2)
    assert [r.line() for r in results] == ["ok: fine: try 1", "ok: flaky: try 3", "FAILED: broken: try 6"]
    assert calls == {"fine": 1, "flaky": 3, "broken": 6}   # a passing check is not asked again
    assert now[0] == 10


def test_urls_are_checked_for_200_and_resolve_sends_a_host_elsewhere(server, capsys):
    pins = {"gw.triton-system.svc.cluster.local": f"127.0.0.1:{server}", "10.0.0.7": f"127.0.0.1:{server}"}
    assert ci.http_ok("http://gw.triton-system.svc.cluster.local:9090/healthz", pins).line() == \
        "ok: http://gw.triton-system.svc.cluster.local:9090/healthz: HTTP 200"
    assert ci.http_ok("http://10.0.0.7:8080/readyz", pins).line() == "FAILED: http://10.0.0.7:8080/readyz: HTTP 503"
    assert main(["check-install", "--url", f"http://127.0.0.1:{server}/healthz", "--url",
                 f"http://127.0.0.1:{server}/nope", "--wait", "0"]) == 1
    assert capsys.readouterr().out.splitlines() == [f"ok: http://127.0.0.1:{server}/healthz: HTTP 200",
                                                    f"FAILED: http://127.0.0.1:{server}/nope: HTTP 503"]
    assert main(["check-install", "--url", f"http://127.0.0.1:{server}/healthz", "--wait", "0"]) == 0


@pytest.mark.parametrize("args, message", [
    (["--url", "http://x/healthz", "--resolve", "x"], "--resolve takes HOST=ADDRESS:PORT, found 'x'"),
    (["--namespace", "triton-system"], "--namespace and --operator-selector go together"),
    ([], "nothing to check: give --crd, --operator-selector or --url"),
    (["--crd", "a.b", "--kubeconfig", "/nonexistent/kubeconfig"], "no Kubernetes credentials: "),
    (["--url", "http://[::1"], "--url 'http://[::1' is not a URL: Invalid IPv6 URL"),
    (["--url", "notaurl"], "--url takes an http:// or https:// URL with a host"),
    (["--url", "file:///etc/passwd"], "--url takes an http:// or https:// URL with a host"),
    (["--url", "http://x/healthz", "--wait", "nan"], "--wait takes a number of seconds from 0 to 86400, got nan"),
    (["--url", "http://x/healthz", "--wait", "inf"], "--wait takes a number of seconds from 0 to 86400, got inf"),
])
def test_bad_arguments_are_refused_in_one_line(args, message, capsys):
    assert main(["check-install", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"triton-operator: {message}") and len(err.strip().splitlines()) == 1, err
