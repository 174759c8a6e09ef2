"""The agent-loop code tool's calls: calls/s, p50 and p99 at 1, 8 and 64 concurrent calls, in
micro-VMs in-process and through `verl-hyperlight serve` over HTTP, in one run.

Each call runs `print(sum(range(1000)))` through the tool's core (``_tool.CodeRunner``, what
``tool.CodeInterpreterTool.execute`` awaits) with `num_workers` equal to the concurrency, once
with `sandbox_fusion_url: hyperlight://` and once with the URL of a server on a loopback port
(the tool's HTTP path, through verl's client when verl is installed, else a plain POST of the
same body). Against the instant hluk double (bench_run_code.instant_hluk: no guest, so the
figures are the tool's and the server's own cost) and against the stand-in hluk (a real Python
run per call; a stateless call's figure there is mostly the stand-in's own start of bubblewrap
and a Python, far more than a real hluk's restore). Stateless calls get a fresh micro-VM each;
with `session: trajectory` (in-process only: a Sandbox Fusion service keeps no state) each of
the concurrent calls belongs to a trajectory of its own whose notebook is up (started by a
first call outside the figures), so a call is one request to a live micro-VM.

Then stateless in-process calls with ready guests (case/ready.py) off and on, alternated,
against a double whose start costs what a new hluk's does (--start-ms, 7 by default).

Usage: python benchmarks/bench_tool.py [--calls N] [--standin-calls N] [--only-ready]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run_code import EXPECTED, READY_ENV, calibrated_double, instant_hluk, standin_environment
from bench_serve import p, start_server

from verl_hyperlight.agent.calls import CodeRunner, ServiceCall, ToolSettings

LEVELS = (1, 8, 64)
CODE = "print(sum(range(1000)))"


def service() -> tuple[ServiceCall, str]:
    """verl's client, else a POST of the body it sends."""
    try:
        from verl.utils.reward_score.sandbox_fusion.utils import call_sandbox_api
    except ImportError:
        client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=64))

        def post(**arguments: Any) -> tuple[dict[str, Any] | None, str | None]:
            body = {
                "code": arguments["code"],
                "stdin": arguments["stdin"],
                "compile_timeout": arguments["compile_timeout"],
                "run_timeout": arguments["run_timeout"],
                "memory_limit_MB": arguments["memory_limit_mb"],
                "language": arguments["language"],
            }
            reply = client.post(arguments["sandbox_fusion_url"], json=body)
            reply.raise_for_status()
            return reply.json(), None

        return post, "a plain POST (verl is not installed)"
    return call_sandbox_api, "verl's client"


def measure(
    url: str, concurrency: int, calls: int, http: ServiceCall, session: bool = False
) -> tuple[float, list[float]]:
    """Calls per second and each call's latency, `concurrency` calls at a time (with
    `session`, the i-th of each wave in trajectory i's notebook)."""
    config = {"sandbox_fusion_url": url, "num_workers": concurrency, "default_timeout": 30}
    if session:
        config.update(session="trajectory", max_sessions=concurrency)
    runner = CodeRunner(ToolSettings.from_config(config), http)

    async def timed(trajectory: int) -> float:
        started = time.perf_counter()
        text, _ = await runner.call({"code": CODE}, f"t{trajectory}" if session else None)
        assert text == EXPECTED, text
        return time.perf_counter() - started

    async def first() -> None:  # outside the figures: a first call, or each notebook's start
        await asyncio.gather(*(timed(i) for i in range(concurrency if session else 1)))

    asyncio.run(first())

    async def batch() -> list[float]:
        latencies: list[float] = []
        for offset in range(0, calls, concurrency):
            wave = min(concurrency, calls - offset)
            latencies += await asyncio.gather(*(timed(i) for i in range(wave)))
        return latencies

    try:
        started = time.perf_counter()
        latencies = asyncio.run(batch())
        return calls / (time.perf_counter() - started), latencies
    finally:
        runner.close()


def table(label: str, calls: int, base: str, http: ServiceCall) -> None:
    print(f"\n{label}, {calls} calls per figure")
    print(f"{'':14}{'calls/s':>9}{'p50 ms':>9}{'p99 ms':>9}")
    ways = (
        ("in-process", "hyperlight://", False),
        ("session", "hyperlight://", True),
        ("serve", f"{base}/run_code", False),
    )
    for level in LEVELS:
        rows: dict[str, tuple[float, list[float]]] = {}
        for name, url, session in ways:
            rate, latencies = measure(url, level, max(calls, level), http, session)
            rows[name] = (rate, latencies)
            print(
                f"  c={level:<3} {name:11}{rate:7.1f}{p(latencies, 50):9.2f}{p(latencies, 99):9.2f}"
            )
        ours, ours_latencies = rows["in-process"]
        for name in ("session", "serve"):
            rate, latencies = rows[name]
            print(
                f"  c={level:<3} {name}/in-process: throughput {rate / ours:.2f}, "
                f"p50 {p(latencies, 50) / p(ours_latencies, 50):.3f}"
            )


@contextmanager
def variables_set(variables: dict[str, str | None]) -> Iterator[None]:
    """This process's environment with `variables` set (None: unset), restored after."""

    def put(values: dict[str, str | None]) -> None:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    saved = {name: os.environ.get(name) for name in variables}
    try:
        put(variables)
        yield
    finally:
        put(saved)


def ready_table(scratch: Path, calls: int, start_ms: float, http: ServiceCall) -> None:
    """Stateless in-process calls with ready guests off and on (the default), alternated, on
    a double whose start costs what a new hluk's does."""
    double, spent = calibrated_double(scratch, start_ms)
    print(
        f"\nready guests off ({READY_ENV}=0) and on (unset), stateless in-process calls, a "
        f"double whose start costs {spent:.1f} ms of CPU; {calls} calls per figure"
    )
    print(f"{'':8}{'off p50':>9}{'p99':>9}{'on p50':>9}{'p99':>9}{'on/off p50':>12}")
    backend = {"HLUK_PATH": str(double), "HLUK_CACHE_DIR": str(scratch / "ready-cache")}
    with variables_set(backend):
        for level in LEVELS:
            found: dict[str, list[float]] = {"0": [], "": []}
            for _ in range(2):  # off, on, off, on
                for setting in found:
                    with variables_set({READY_ENV: setting or None}):
                        half = max(calls, level) // 2
                        found[setting] += measure("hyperlight://", level, half, http)[1]
            off, on = found["0"], found[""]
            print(
                f"  c={level:<3} {p(off, 50):9.2f}{p(off, 99):9.2f}{p(on, 50):9.2f}{p(on, 99):9.2f}"
                f"{p(on, 50) / p(off, 50):12.2f}"
            )


def with_backend(environment: dict[str, str], body: Callable[[str], None], scratch: Path) -> None:
    """Run `body` with this process and a server of its own on the backend `environment`."""
    with variables_set(dict(environment)):
        # As many micro-VMs as the most concurrent calls, each call's wait within its timeout.
        process, base = start_server(
            scratch, options=("--max-concurrent", "64", "--max-wait", "60")
        )
        try:
            body(base)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=256, help="calls per figure (the double)")
    parser.add_argument("--standin-calls", type=int, default=64, help="calls per figure (stand-in)")
    parser.add_argument(
        "--start-ms", type=float, default=7.0, help="the CPU a double's start costs (ready guests)"
    )
    parser.add_argument("--only-ready", action="store_true", help="ready guests on and off only")
    args = parser.parse_args()
    http, client = service()
    scratch = Path(tempfile.mkdtemp(prefix="verl-hyperlight-bench-"))
    try:
        print(f"{os.cpu_count()} CPUs; serve's calls through {client}")
        if args.only_ready:
            ready_table(scratch, args.calls, args.start_ms, http)
            return
        double = {
            "HLUK_PATH": str(instant_hluk(scratch)),
            "HLUK_CACHE_DIR": str(scratch / "cache"),
        }
        with_backend(
            double,
            lambda base: table("instant hluk double", args.calls, base, http),
            scratch,
        )
        with_backend(
            {**standin_environment(scratch), "HLUK_CACHE_DIR": str(scratch / "standin-cache")},
            lambda base: table("stand-in hluk", args.standin_calls, base, http),
            scratch,
        )
        ready_table(scratch, args.calls, args.start_ms, http)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
