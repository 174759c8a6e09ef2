"""One solution's test cases in a compiled language, as verl sends them: kept compiles against
each case compiling, in one run.

verl scores a solution by sending each of its test cases as a request of its own, the same
code, at once (its sandbox_fusion utils, a thread per case). Here a C++ solution that includes
<bits/stdc++.h> (as most contest solutions do) with CASES test cases, through run_code on the
stand-in hluk, alternated SOLUTIONS times: each solution a new source (a comment makes it one),
with the process's kept compiles (case/builds.py, the default) and with each case compiling
its own (builds bypassed: what Sandbox Fusion does). For each: the compiles run, the wall time
per solution (all its cases answered) and the host CPU per solution of the compilers
(bubblewrap and what runs in it, reaped children of this process; hluk's runs are the same on
both sides and counted too), and the ratio of the two sides.

Usage: python benchmarks/bench_compiles.py [--cases N] [--solutions N]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_run_code import standin_environment

SOLUTION = """// solution {n}
#include <bits/stdc++.h>
using namespace std;
int main() {{ long long a, b; cin >> a >> b; vector<long long> v{{a, b}};
  sort(v.begin(), v.end()); cout << v[0] * v[1] << "\\n"; }}
"""


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=8, help="test cases per solution")
    parser.add_argument("--solutions", type=int, default=3, help="solutions per side")
    args = parser.parse_args()
    os.environ.update(standin_environment(Path(tempfile.mkdtemp(prefix="bench-compiles-"))))
    from verl_hyperlight import run_code
    from verl_hyperlight.case import builds, compiled

    build = compiled.build
    compiles = [0]

    def counted(*call: object) -> compiled.Build:
        compiles[0] += 1
        return build(*call)  # type: ignore[arg-type]

    compiled.build = counted  # type: ignore[assignment]
    kept = builds.build

    def one(code: str, n: int) -> None:
        response, error = run_code("hyperlight://", code, f"{n} 3\n", 60, 10, 1024, "cpp")
        assert error is None and response is not None, error
        assert response["run_result"]["stdout"] == f"{3 * n}\n", response

    def solution(number: int) -> None:
        code = SOLUTION.format(n=number)
        with ThreadPoolExecutor(args.cases) as pool:
            list(pool.map(lambda n: one(code, n), range(args.cases)))

    one(SOLUTION.format(n=-1), 1)  # the guest warm, the toolchain found
    sides = {"kept compiles": kept, "each case compiles": compiled.build}
    walls: dict[str, list[float]] = {side: [] for side in sides}
    cpus: dict[str, list[float]] = {side: [] for side in sides}
    counts = dict.fromkeys(sides, 0)
    number = 0
    for _ in range(args.solutions):
        for side, way in sides.items():
            builds.build = way  # type: ignore[assignment]
            builds.forget()
            number += 1
            before, cpu, started = compiles[0], children_cpu(), time.perf_counter()
            solution(number)
            walls[side].append(time.perf_counter() - started)
            cpus[side].append(children_cpu() - cpu)
            counts[side] += compiles[0] - before
    builds.build = kept  # type: ignore[assignment]
    print(
        f"a C++ solution of {args.cases} test cases sent at once, {args.solutions} solutions a "
        "side, alternated; per solution:"
    )
    print(f"{'':20} {'compiles':>8} {'wall s':>8} {'host CPU s':>10}")
    for side in sides:
        print(
            f"{side:20} {counts[side] / args.solutions:8.1f} "
            f"{statistics.median(walls[side]):8.3f} {statistics.median(cpus[side]):10.3f}"
        )
    ours, theirs = "kept compiles", "each case compiles"
    wall = statistics.median(walls[ours]) / statistics.median(walls[theirs])
    cpu = statistics.median(cpus[ours]) / statistics.median(cpus[theirs])
    print(f"ratio kept / each: wall {wall:.2f}, host CPU {cpu:.2f}")


if __name__ == "__main__":
    main()
