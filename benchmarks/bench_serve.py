"""What `verl-hyperlight serve` adds to a case, against run_code in-process, in one run.

The same case (a solution summing its input) is run at concurrency 1, 8 and 32, through
run_code in this process and over HTTP through a server on a loopback port; both use an
instant hluk double (bench_run_code.instant_hluk: it prints the runner's frames at once, no
guest), so the difference is the server's own cost: HTTP, validation, admission, the worker
thread, JSON. It prints cases/s, p50 and p99 latency for each, and the server's added cost per
case at p50 as a difference and a ratio. Beside them, the floor of any HTTP server on this
machine: a bare ASGI app under the same uvicorn (uvloop and httptools when installed, as serve
takes them) answering each POST with the case's answer, measured in the same rounds, so that
serve's own part of what it adds is told apart from what HTTP over loopback costs here. The
server is started with --max-concurrent 32 (so admission never waits here) and its access log
at WARNING (as an operator may, to spare the disk; the line costs about as much as the rest).

The CPU time per case is that of the process running run_code (this one, or the server):
unlike wall time on a busy machine, what the server adds there does not depend on the load.

With --baseline SRC (another checkout's src directory, e.g. made by `git worktree add
/tmp/serve-base <commit>`), a second server runs that checkout's serve, measured in the same
run, so before and after are compared on the same machine at the same moment: it prints what
each adds and the ratio of the two.

Usage: python benchmarks/bench_serve.py [--cases N] [--standin] [--baseline SRC]
(--standin: the stand-in hluk instead of the double, whose ~0.2 s per run hides the server's
cost)
"""

from __future__ import annotations

import argparse
import json
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
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run_code import (
    EXPECTED,
    SOLUTION,
    STDIN,
    instant_hluk,
    use_standin_unless_configured,
)

from verl_hyperlight import run_code, settings

LEVELS = (1, 8, 32)
FLOOR = "bare HTTP"
SERVER = (
    "import logging, sys\n"
    "from verl_hyperlight.cli import main\n"
    "logging.getLogger('verl_hyperlight.access').setLevel(logging.WARNING)\n"
    "sys.exit(main(['serve', *sys.argv[1:]]))\n"
)
BODY = {"code": SOLUTION, "stdin": STDIN, "language": "python", "run_timeout": 10,
        "memory_limit_MB": 1024}  # fmt: skip


# The floor: an ASGI app that reads the request and answers with the case's answer, nothing else.
FLOOR_APP = """
ANSWER = {answer!r}


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json")]
    await send({{"type": "http.response.start", "status": 200, "headers": headers}})
    await send({{"type": "http.response.body", "body": ANSWER}})
"""


def in_process() -> dict[str, Any]:
    """The case through run_code in this process; its answer."""
    response, error = run_code("hyperlight://", SOLUTION, STDIN, 10, 10, 1024)
    assert error is None and response is not None and response["run_result"]["stdout"] == EXPECTED
    return dict(response)


def over_http(client: httpx.Client) -> Callable[[], None]:
    def call() -> None:
        reply = client.post("/run_code", json=BODY)
        assert reply.status_code == 200 and reply.json()["run_result"]["stdout"] == EXPECTED

    return call


def measure(task: Callable[[], object], concurrency: int, cases: int) -> tuple[float, list[float]]:
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


def free_port() -> int:
    """A port free on the loopback now, for a server to take."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(
    scratch: Path, src: Path | None = None, options: tuple[str, ...] = ("--max-concurrent", "32")
) -> tuple[subprocess.Popen[bytes], str]:
    """A server of this checkout, or of the one whose src directory is `src`, with `options`."""
    port = free_port()
    log = (scratch / f"serve-{port}.log").open("wb")
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER, "--port", str(port), *options],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(3000):
        try:
            ready = httpx.get(f"{base}/readyz", timeout=5)
            # Ready, and Go's cache not being built (a baseline's serve may not say).
            if ready.status_code == 200 and ready.json().get("compiles") != "warming":
                return process, base
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the server did not become ready:\n{log.name}")


def start_floor(scratch: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The bare ASGI app of FLOOR_APP under uvicorn, answering with run_code's answer."""
    answer = json.dumps(in_process()).encode()
    (scratch / "floor_app.py").write_text(FLOOR_APP.format(answer=answer))
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "--app-dir", str(scratch), "floor_app:app"]
    command += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            httpx.post(base, json=BODY, timeout=5)
            return process, base
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("the bare ASGI app did not start")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def report(level: int, name: str, rate: float, latencies: list[float], cpu: str = "") -> None:
    print(f"  c={level:<3} {name:9}{rate:8.1f}{p(latencies, 50):9.2f}{p(latencies, 99):9.2f}{cpu}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=400, help="cases per measurement")
    parser.add_argument("--rounds", type=int, default=4, help="rounds each measurement is cut in")
    parser.add_argument("--standin", action="store_true", help="the stand-in, not the double")
    parser.add_argument("--baseline", type=Path, help="another checkout's src, served beside")
    args = parser.parse_args()
    # serve warms Go's build cache in the background (a minute of go building, once per node):
    # the node's own, kept as it is, so that no build competes with the measurements.
    os.environ.setdefault("VERL_HYPERLIGHT_COMPILE_CACHE_DIR", settings.compile_cache_dir())
    scratch = Path(tempfile.mkdtemp(prefix="verl-hyperlight-bench-"))
    servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        if args.standin:
            backend = use_standin_unless_configured(scratch)
        else:
            os.environ["HLUK_PATH"] = str(instant_hluk(scratch))
            os.environ["HLUK_CACHE_DIR"] = str(scratch / "cache")
            backend = "an instant hluk double (no guest: orchestration alone)"
        print(f"backend: {backend}; {os.cpu_count()} CPUs; {args.cases} cases per figure")
        in_process()  # the warm-up, outside the measurements
        servers["serve"] = start_server(scratch, None)
        servers[FLOOR] = start_floor(scratch)
        if args.baseline is not None:
            servers["baseline"] = start_server(scratch, args.baseline)
            print(f"baseline: the serve of {args.baseline}")
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        clients = {name: httpx.Client(base_url=base, timeout=60, limits=limits)
                   for name, (_, base) in servers.items()}  # fmt: skip
        tasks = {"run_code": in_process} | {
            name: over_http(client) for name, client in clients.items()
        }
        for task in tasks.values():
            task()
        print(f"\n{'':14}{'cases/s':>9}{'p50 ms':>9}{'p99 ms':>9}  CPU ms per case")
        for level in LEVELS:
            # The measurements take turns, round by round, so that the machine's load drifts
            # across all of them alike.
            seconds = dict.fromkeys(tasks, 0.0)
            latencies: dict[str, list[float]] = {name: [] for name in tasks}
            cpu = dict.fromkeys(tasks, 0.0)
            for _ in range(args.rounds):
                for name, task in tasks.items():
                    pid = servers[name][0].pid if name in servers else os.getpid()
                    before, started = cpu_seconds(pid), time.perf_counter()
                    _, measured = measure(task, level, args.cases // args.rounds)
                    seconds[name] += time.perf_counter() - started
                    latencies[name] += measured
                    cpu[name] += cpu_seconds(pid) - before
            cases = args.rounds * (args.cases // args.rounds)
            rates = {name: cases / seconds[name] for name in tasks}
            ours = latencies["run_code"]
            report(
                level,
                "run_code",
                rates["run_code"],
                ours,
                f"{cpu['run_code'] / cases * 1000:13.2f}",
            )
            floor = p(latencies[FLOOR], 50)
            floor_cpu = f"{cpu[FLOOR] / cases * 1000:13.2f}"
            report(level, FLOOR, rates[FLOOR], latencies[FLOOR], floor_cpu)
            added = {}
            for name in servers:
                if name == FLOOR:
                    continue
                per_case = f"{cpu[name] / cases * 1000:13.2f}"
                report(level, name, rates[name], latencies[name], per_case)
                added[name] = p(latencies[name], 50) - p(ours, 50)
                print(
                    f"  c={level:<3} {name} adds {added[name]:+.2f} ms per case at p50 "
                    f"(ratio {p(latencies[name], 50) / p(ours, 50):.2f}), "
                    f"{(cpu[name] - cpu['run_code']) / cases * 1000:+.2f} ms of CPU; "
                    f"throughput ratio {rates[name] / rates['run_code']:.2f}"
                )
                print(
                    f"  c={level:<3} {name} adds {added[name] - floor:+.2f} ms per case at p50 "
                    f"beyond a bare HTTP round trip ({floor:.2f} ms at p50)"
                )
            if "baseline" in servers:
                own = {name: cpu[name] - cpu["run_code"] for name in servers}
                print(
                    f"  c={level:<3} serve / baseline: {added['serve'] / added['baseline']:.2f} "
                    f"of the time added at p50, {own['serve'] / own['baseline']:.2f} of the CPU "
                    "time added"
                )
        for client in clients.values():
            client.close()
    finally:
        for process, _ in servers.values():
            process.send_signal(signal.SIGTERM)
            process.wait(60)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
