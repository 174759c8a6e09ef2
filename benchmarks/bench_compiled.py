"""What a C++, Go or Rust case costs on the host beside a Python case, in one run.

The same program (read two numbers, print their sum) in each language. For each compiled
language: its compile, several times (wall time, and the CPU of the compiler's processes); then
its program's runs as cases, alternated with the Python solution's, one at a time, with the
host CPU each run costs this worker and the helpers it keeps (its spawner and case directory
cleaner: hluk and its guest are not counted, as for any case), and the ratio of each to the
Python case's. Sandbox Fusion charges a compile apart from the run, and so does this.

Usage: python benchmarks/bench_compiled.py [--cases N]  (the hluk on PATH or HLUK_PATH, else
the stand-in; g++, rustc and Go where they are installed)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run_code import use_standin_unless_configured

from verl_hyperlight.case import api, compiled
from verl_hyperlight.errors import BackendError

PYTHON = "a, b = map(int, input().split())\nprint(a + b)\n"
PROGRAMS = {
    "cpp": '#include <cstdio>\nint main() { long a, b; std::scanf("%ld %ld", &a, &b); '
    'std::printf("%ld\\n", a + b); }\n',
    "go": 'package main\n\nimport "fmt"\n\nfunc main() {\n\tvar a, b int\n\tfmt.Scan(&a, &b)\n'
    "\tfmt.Println(a + b)\n}\n",
    "rust": "use std::io::Read;\nfn main() { let mut s = String::new();\n"
    "    std::io::stdin().read_to_string(&mut s).unwrap();\n"
    "    let n: Vec<i64> = s.split_whitespace().map(|w| w.parse().unwrap()).collect();\n"
    '    println!("{}", n[0] + n[1]); }\n',
}
STDIN = b"19 23\n"
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def helpers_cpu() -> float:
    """The CPU seconds of this process's children that live on (its spawner, its cleaner)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICK


def host_cpu() -> float:
    return time.process_time() + helpers_cpu()


def compiler_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(case: api.Case) -> tuple[float, float]:
    """One case through the one path (no compile): its wall and host CPU seconds."""
    cpu, started = host_cpu(), time.perf_counter()
    response = api._run_case(api.hluk_path(), case, None)
    wall, used = time.perf_counter() - started, host_cpu() - cpu
    assert response["run_result"]["stdout"] == "42\n", response
    return wall, used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=30, help="runs of each language")
    parser.add_argument("--compiles", type=int, default=5, help="compiles of each language")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        print("hluk:", use_standin_unless_configured(Path(scratch)))
        python = api.Case(api.guest_for("hyperlight://", 1024), PYTHON.encode(), STDIN, 10)
        cases = {"python": python}
        compiles: dict[str, tuple[float, float, int]] = {}
        for language, source in PROGRAMS.items():
            try:
                compiled.warm()
                walls, cpus = [], []
                built = None
                for _ in range(args.compiles):
                    cpu, started = compiler_cpu(), time.perf_counter()
                    built = compiled.build(language, source.encode(), 60)
                    walls.append(time.perf_counter() - started)
                    cpus.append(compiler_cpu() - cpu)
                assert built is not None and built.program is not None, built
            except BackendError as exc:
                print(f"{language}: not measured ({exc})")
                continue
            compiles[language] = (
                statistics.median(walls),
                statistics.median(cpus),
                len(built.program),
            )
            cases[language] = dataclasses.replace(
                python, code=built.program, program_name=compiled.PROGRAM_NAMES[language]
            )
        for case in cases.values():
            run_once(case)  # the guest warm, the helpers started: charged to no case
        runs: dict[str, list[tuple[float, float]]] = {language: [] for language in cases}
        for _ in range(args.cases):
            for language, case in cases.items():
                runs[language].append(run_once(case))
    base_wall = statistics.median(w for w, _ in runs["python"])
    base_cpu = statistics.median(c for _, c in runs["python"])
    print(f"{args.cases} runs of each, alternated; {args.compiles} compiles of each")
    print(
        f"{'language':10}{'compile s':>11}{'compiler CPU s':>16}{'program MB':>12}"
        f"{'run wall ms':>13}{'host CPU ms':>13}{'wall ratio':>12}{'CPU ratio':>11}"
    )
    for language, measured in runs.items():
        wall = statistics.median(w for w, _ in measured)
        cpu = statistics.median(c for _, c in measured)
        compile_wall, compile_cpu, size = compiles.get(language, (0.0, 0.0, 0))
        rows.append(
            f"{language:10}{compile_wall:>11.2f}{compile_cpu:>16.2f}{size / 1e6:>12.2f}"
            f"{wall * 1e3:>13.1f}{cpu * 1e3:>13.2f}{wall / base_wall:>12.2f}{cpu / base_cpu:>11.2f}"
        )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
