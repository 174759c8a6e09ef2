"""What a case costs the reward worker in memory, against baselines measured in the same run.

1. Peak per concurrent flooding case: a fresh worker process runs K cases at once, each
   printing without end (stopped at the 16 MiB output limit); its peak resident memory
   (VmHWM) against a fresh worker running K cases that print nothing, divided by K.
2. Growth over many large-output cases: a worker runs N cases from 8 threads, each printing
   a few MiB, and its resident memory is read after every tenth of them; the growth from the
   first tenth (every thread's allocator warm) to the end, per 1,000 cases, against the same
   worker with glibc's mmap threshold pinned (MALLOC_MMAP_THRESHOLD_=262144: every large
   buffer returned to the system when freed, the flat reference). Memory a worker keeps after
   cases that are over is memory lost for good.

Both use the stand-in hluk from tests/ unless HLUK_PATH names a hluk; the package measured is
the one importable (PYTHONPATH=<checkout>/src measures another checkout, with its own
tests/standin when --standin names it). Usage:
    python benchmarks/bench_memory.py [--concurrent K] [--cases N] [--standin PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
FLOOD = "while True:\n    print('x' * 1000)\n"
LARGE = "import sys\nsys.stdout.write('y' * (3 * 2**20 + 12345))\n"

# One worker: THREADS threads run CASES cases of CODE between them, then it reports its peak
# and its resident memory, after the first round of THREADS cases and at the end.
WORKER = """
import json, sys, threading
from concurrent.futures import ThreadPoolExecutor
from verl_hyperlight import run_code

code, cases, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def status(name):
    with open("/proc/self/status") as f:
        return [int(line.split()[1]) for line in f if line.startswith(name + ":")][0]

def case(_):
    response, error = run_code("hyperlight://", code, "", None, 60, None)
    assert error is None and response["status"] != "SandboxError", (error, response)
    return len(response["run_result"]["stdout"])

run_code("hyperlight://", "pass", "", None, 60, None)  # warm: measured cases only run
base, rss, sizes = status("VmRSS"), [], []
tenth = max(cases // 10, threads)
with ThreadPoolExecutor(threads) as pool:
    for done in range(0, cases, tenth):
        sizes += pool.map(case, range(min(tenth, cases - done)))
        rss.append(status("VmRSS"))
print(json.dumps({"base": base, "rss": rss, "peak": status("VmHWM"),
                  "sizes": sorted(set(sizes))}))
"""


def use_standin(scratch: Path, standin: Path) -> dict[str, str]:
    if os.environ.get("HLUK_PATH"):
        return {}
    from bench_run_code import standin_environment

    return standin_environment(scratch, standin)


def worker(env: dict[str, str], code: str, cases: int, threads: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", WORKER, code, str(cases), str(threads)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(f"the worker failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def growth(env: dict[str, str], cases: int) -> tuple[list[float], float]:
    """Resident MiB after each tenth of the cases, and the growth per 1,000 cases."""
    found = worker(env, LARGE, cases, 8)
    rss = [kib / 1024 for kib in found["rss"]]
    return rss, (rss[-1] - rss[0]) * 1000 / (cases - cases // 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrent", type=int, default=4, help="K, flooding cases at once")
    parser.add_argument("--cases", type=int, default=400, help="N, large-output cases")
    parser.add_argument("--standin", type=Path, default=ROOT / "tests" / "standin" / "hluk")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="verl-hyperlight-bench-"))
    try:
        env = use_standin(scratch, args.standin)
        k = args.concurrent
        print(f"{os.cpu_count()} CPUs; package from {__import__('verl_hyperlight').__file__}")
        quiet = worker(env, "pass", k, k)
        flood = worker(env, FLOOD, k, k)
        per_case = (flood["peak"] - quiet["peak"]) / k / 1024
        print(f"\n1. peak resident memory, {k} concurrent cases")
        print(f"   printing nothing  {quiet['peak'] / 1024:8.1f} MiB")
        print(f"   printing forever  {flood['peak'] / 1024:8.1f} MiB  (stdout {flood['sizes']})")
        print(
            f"   per flooding case {per_case:+8.1f} MiB   ratio to the 16 MiB output limit: "
            f"{per_case * MIB / (16 * MIB):.2f}"
        )
        print(
            f"\n2. resident MiB after each tenth of {args.cases} cases of 3 MiB output, 8 threads"
        )
        rss, per_1000 = growth(env, args.cases)
        pinned = {**env, "MALLOC_MMAP_THRESHOLD_": "262144"}
        flat_rss, flat_per_1000 = growth(pinned, args.cases)
        print("   as is        " + " ".join(f"{mib:5.0f}" for mib in rss))
        print("   pinned mmap  " + " ".join(f"{mib:5.0f}" for mib in flat_rss))
        print(
            f"   growth per 1,000 cases after the first tenth: {per_1000:+.1f} MiB as is, "
            f"{flat_per_1000:+.1f} MiB with the mmap threshold pinned"
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
