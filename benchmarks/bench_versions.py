"""The worker's CPU per case of this checkout against another's, in one run.

Each measurement is a fresh worker process that runs trivial cases back to back through
run_code against bench_run_code's instant hluk double (no guest: what is left is the host
side), and reads its own CPU time (all its threads: the case's, the ready-guest keeper's, the
watches') around them, with ready guests on (the default) and off. This checkout and the
baseline's alternate, round after round, so that whatever else the machine does falls on both;
it prints each one's median per setting, and the ratio now / baseline.

The double is this checkout's (it knows a ready guest's workload by its current name and by
the older one), made once, so both checkouts are measured against the same hluk.

Usage: python benchmarks/bench_versions.py --baseline SRC [--cases N] [--rounds R]
(SRC: another checkout's src directory, e.g. made by `git worktree add /tmp/base <commit>`)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_run_code import instant_hluk

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

# What runs in each worker: warm-up cases, then `cases` measured ones; prints CPU ms per case.
WORKER = """
import resource
from verl_hyperlight import run_code
def case():
    response, error = run_code("hyperlight://", "print(1)", "", None, 10, 1024)
    assert error is None and response["status"] == "Success", (response, error)
for _ in range(50):
    case()
usage = resource.getrusage(resource.RUSAGE_SELF)
before = usage.ru_utime + usage.ru_stime
for _ in range({cases}):
    case()
usage = resource.getrusage(resource.RUSAGE_SELF)
print((usage.ru_utime + usage.ru_stime - before) / {cases} * 1000)
"""


def measure(src: Path, hluk: Path, ready_guests: int, cases: int) -> float:
    """One worker of the checkout at `src`, on the double `hluk`: its CPU ms per case."""
    with tempfile.TemporaryDirectory(prefix="verl-hyperlight-versions-") as scratch:
        env = {
            **os.environ,
            "PYTHONPATH": str(src),
            "HLUK_PATH": str(hluk),
            "HLUK_CACHE_DIR": str(Path(scratch) / "cache"),
            "VERL_HYPERLIGHT_READY_GUESTS": str(ready_guests),
        }
        code = WORKER.format(cases=cases)
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
        )
    if done.returncode != 0:
        raise SystemExit(f"a worker of {src} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout's src")
    parser.add_argument("--cases", type=int, default=600, help="measured cases per worker")
    parser.add_argument("--rounds", type=int, default=3, help="workers of each, alternated")
    args = parser.parse_args()
    sides = {"now": SRC, "baseline": args.baseline.resolve()}
    found: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="verl-hyperlight-double-") as scratch:
        hluk = instant_hluk(Path(scratch))
        for _ in range(args.rounds):
            for ready in (8, 0):
                for name, src in sides.items():
                    cpu = measure(src, hluk, ready, args.cases)
                    found.setdefault((name, ready), []).append(cpu)
    print(f"{os.cpu_count()} CPUs; {args.cases} trivial cases per worker, {args.rounds} rounds")
    print(f"baseline: {sides['baseline']}")
    print("ready guests   now CPU ms/case   baseline CPU ms/case   now / baseline")
    for ready, label in ((8, "on (8)"), (0, "off")):
        now = statistics.median(found[("now", ready)])
        base = statistics.median(found[("baseline", ready)])
        print(f"{label:<12}{now:>18.3f}{base:>23.3f}{now / base:>17.2f}")


if __name__ == "__main__":
    main()
