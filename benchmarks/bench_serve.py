"""What `verl-hyperlight serve` adds to a case, against run_code in-process, in one run.

The same case (a solution summing its input) is run at concurrency 1, 8 and 32, through
run_code in this process and over HTTP through a server on a loopback port; both use an
instant hluk double (bench_run_code.instant_hluk: it prints the runner's frames at once, no
guest), so the difference is the server's own cost: HTTP, validation, admission, the worker
thread, JSON. It prints cases/s, p50 and p99 latency for each, and the server's added cost per
case at p50 as a difference and a ratio. The server is started with --max-concurrent 32 (so
admission never waits here) and its access log at WARNING (as an operator may, to spare the
disk; the line costs about as much as the rest).

Usage: python benchmarks/bench_serve.py [--cases N] [--standin] (--standin: the stand-in hluk
instead of the double, whose ~0.2 s per run hides the server's cost)
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run_code import (
    EXPECTED,
    SOLUTION,
    STDIN,
    instant_hluk,
    use_standin_unless_configured,
)

from verl_hyperlight import run_code

LEVELS = (1, 8, 32)
SERVER = (
    "import logging, sys\n"
    "from verl_hyperlight.cli import main\n"
    "logging.getLogger('verl_hyperlight.access').setLevel(logging.WARNING)\n"
    "sys.exit(main(['serve', *sys.argv[1:]]))\n"
)
BODY = {"code": SOLUTION, "stdin": STDIN, "language": "python", "run_timeout": 10,
        "memory_limit_MB": 1024}  # fmt: skip


def in_process() -> None:
    response, error = run_code("hyperlight://", SOLUTION, STDIN, 10, 10, 1024)
    assert error is None and response is not None and response["run_result"]["stdout"] == EXPECTED


def over_http(client: httpx.Client) -> Callable[[], None]:
    def call() -> None:
        reply = client.post("/run_code", json=BODY)
        assert reply.status_code == 200 and reply.json()["run_result"]["stdout"] == EXPECTED

    return call


def measure(task: Callable[[], None], concurrency: int, cases: int) -> tuple[float, list[float]]:
    """Cases per second and each case's latency, with `concurrency` callers."""

    def timed(_: int) -> float:
        started = time.perf_counter()
        task()
        return time.perf_counter() - started

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        latencies = list(pool.map(timed, range(cases)))
    return cases / (time.perf_counter() - started), latencies


def p(latencies: list[float], q: int) -> float:
    return statistics.quantiles(latencies, n=100)[q - 1] * 1000


def start_server(
    scratch: Path, options: tuple[str, ...] = ("--max-concurrent", "32")
) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (scratch / "serve.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER, "--port", str(port), *options],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                return process, base
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the server did not become ready:\n{(scratch / 'serve.log').read_text()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=400, help="cases per measurement")
    parser.add_argument("--standin", action="store_true", help="the stand-in, not the double")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="verl-hyperlight-bench-"))
    try:
        if args.standin:
            backend = use_standin_unless_configured(scratch)
        else:
            os.environ["HLUK_PATH"] = str(instant_hluk(scratch))
            os.environ["HLUK_CACHE_DIR"] = str(scratch / "cache")
            backend = "an instant hluk double (no guest: orchestration alone)"
        print(f"backend: {backend}; {os.cpu_count()} CPUs; {args.cases} cases per figure")
        in_process()  # the warm-up, outside the measurements
        process, base = start_server(scratch)
        try:
            with httpx.Client(base_url=base, timeout=60, limits=httpx.Limits(
                max_connections=64, max_keepalive_connections=64
            )) as client:  # fmt: skip
                http = over_http(client)
                http()
                print(f"\n{'':14}{'cases/s':>9}{'p50 ms':>9}{'p99 ms':>9}")
                for level in LEVELS:
                    ours_rate, ours = measure(in_process, level, args.cases)
                    http_rate, served = measure(http, level, args.cases)
                    for name, rate, latencies in (("run_code", ours_rate, ours),
                                                  ("serve", http_rate, served)):  # fmt: skip
                        print(
                            f"  c={level:<3} {name:9}{rate:8.1f}{p(latencies, 50):9.2f}"
                            f"{p(latencies, 99):9.2f}"
                        )
                    added = p(served, 50) - p(ours, 50)
                    print(
                        f"  c={level:<3} serve adds {added:+.2f} ms per case at p50 "
                        f"(ratio {p(served, 50) / p(ours, 50):.2f}); throughput ratio "
                        f"{http_rate / ours_rate:.2f}"
                    )
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
