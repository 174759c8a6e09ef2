"""A case is answered at its whole report: what hluk's teardown costs a case, against a bare
spawn of the same hluk that waits for its end, measured in one run.

For each teardown (the stand-in's HLUK_STANDIN_TEARDOWN_SECONDS: how long its micro-VM takes
to tear down once its guest has ended), trivial cases one after another, alternated in chunks:
through run_code (each case's own hluk, ready guests off) and through `subprocess.run` of the
same stand-in with the same argv (what a worker without run_code waits for: hluk's exit). The
table gives each side's p50 and p90 and their ratio. With answers at the report, run_code's
latency does not grow with the teardown, where the bare spawn's grows by all of it.

The stand-in's own start (a CPython and bubblewrap, ~0.1-0.2 s) is in both sides alike.
Figures are noisy on a shared machine: compare the ratios of one run.
Usage: python benchmarks/bench_teardown.py [--cases N] [--chunk N] [--teardowns 0,0.02,0.1]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run_code import (
    EXPECTED,
    MEMORY_MB,
    SOLUTION,
    STDIN,
    URL,
    percentile,
    stand_in_directly,
    standin_environment,
)

from verl_hyperlight import run_code
from verl_hyperlight.case import api

TEARDOWN = "HLUK_STANDIN_TEARDOWN_SECONDS"


def through_run_code() -> float:
    """The case bench_run_code's bare spawn runs: its solution, input and guest."""
    started = time.perf_counter()
    response, error = run_code(URL, SOLUTION, STDIN, None, 10, MEMORY_MB)
    elapsed = time.perf_counter() - started
    assert error is None and response is not None, error
    assert response["run_result"]["stdout"] == EXPECTED, response
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=60, help="cases per side and teardown")
    parser.add_argument("--chunk", type=int, default=10, help="cases per side in a row")
    parser.add_argument(
        "--teardowns", default="0,0.02,0.1", help="the teardowns to measure, in seconds"
    )
    args = parser.parse_args()
    teardowns = [float(value) for value in args.teardowns.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        scratch = Path(directory)
        os.environ.update(standin_environment(scratch))
        os.environ["VERL_HYPERLIGHT_READY_GUESTS"] = "0"
        through_run_code()  # the warm-up: the snapshot taken before either side is timed
        stand_in_directly(scratch)
        print("answer at the report: trivial cases one after another, p50 / p90 in ms")
        print(f"{'teardown':>9} {'run_code':>17} {'bare spawn':>17} {'ratio p50':>10}")
        for teardown in teardowns:
            os.environ[TEARDOWN] = str(teardown)
            ours: list[float] = []
            bare: list[float] = []
            while len(ours) < args.cases:
                ours += [through_run_code() for _ in range(args.chunk)]
                bare += [stand_in_directly(scratch) for _ in range(args.chunk)]
            api.close()  # the hluks still tearing down, awaited outside the timings
            mine = (percentile(ours, 0.5) * 1000, percentile(ours, 0.9) * 1000)
            theirs = (percentile(bare, 0.5) * 1000, percentile(bare, 0.9) * 1000)
            print(
                f"{teardown * 1000:>7.0f}ms {mine[0]:>8.1f} / {mine[1]:<6.1f} "
                f"{theirs[0]:>8.1f} / {theirs[1]:<6.1f} {mine[0] / theirs[0]:>10.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
