"""The benchmark of run_code's host-side cost runs, and prints every figure it promises, on
every way of starting hluk this machine has (a few cases each: its figures are not judged)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hostside import Host

from verl_hyperlight.hluk import spawn as _spawn

pytestmark = pytest.mark.once

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_run_code.py"


def bench(script: str, *args: str, standin: bool = True) -> subprocess.CompletedProcess[str]:
    """benchmarks/`script` run with `args`, its output kept; it must succeed. With `standin`
    the host fixture's stand-in, else the benchmark's own (no HLUK_ variable passed)."""
    env = dict(os.environ)
    if not standin:
        env = {key: value for key, value in env.items() if not key.startswith("HLUK_")}
    done = subprocess.run(
        [sys.executable, str(BENCH.parent / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done


def test_bench_run_code_prints_each_concurrency_each_way_and_each_step(host: Host) -> None:
    done = bench(  # the host fixture's stand-in, for the stand-in comparison
        BENCH.name,
        *("--cases", "8", "--standin-cases", "2", "--worker-gib", "0.1", "--busy-loops", "200"),
    )
    rows = [line.split() for line in done.stdout.splitlines()]
    ways = ["direct", "spawner", *(["setpriv"] if _spawn.setpriv() else []), "fork"]
    for way in ways:
        # the realistic and the instant double, and the large worker
        assert sum(1 for row in rows if row[:1] == [way]) >= 3
    default = [row for row in rows if row[:1] == [ways[0]]]
    assert {row[1] for row in default} == {"1", "8", "64"}
    # c, 5 x (median, p99): run_code, 2 baselines and what it adds to each; 3 x CPU
    assert all(len(row) == 15 for row in default)
    for step in ("case directory", "spawn", "console read + scan", "removal"):
        assert step in done.stdout
    assert "run_code adds" in done.stdout and "python solution.py" in done.stdout


def ready_tables(script: str, *args: str) -> list[list[str]]:
    """The rows of `script`'s table of ready guests on and off (--only-ready, a quick start)."""
    done = bench(script, "--only-ready", "--start-ms", "2", *args)
    assert "ready guests o" in done.stdout
    # Nothing on stderr but what a starved machine may warn: c=64 back to back on 2 busy cores
    # can keep the spawner off the CPU past its 5 s (CI at 6f6a8a0, 3.10); the case is answered.
    starved = re.compile(r"verl-hyperlight: the spawner of hluk processes \(pid \d+\) did not say ")
    assert all(starved.match(line) for line in done.stderr.splitlines()), done.stderr
    return [line.split() for line in done.stdout.splitlines() if line.lstrip().startswith("c=")]


def test_bench_run_code_compares_ready_guests_on_and_off_at_each_concurrency(host: Host) -> None:
    rows = ready_tables("bench_run_code.py", "--cases", "6")
    assert [row[0] for row in rows] == ["c=1,", "c=1,", "c=8,", "c=64,"]
    for row in rows:  # 2 x (median, p99), their ratio, 2 x worker CPU, 2 x node CPU
        assert len(row) >= 9 and all(float(figure) >= 0 for figure in row[-9:]), row


def test_bench_tool_compares_ready_guests_on_and_off_at_each_concurrency(host: Host) -> None:
    rows = ready_tables("bench_tool.py", "--calls", "8")
    assert [row[0] for row in rows] == ["c=1", "c=8", "c=64"]
    assert all(len(row) == 6 and float(row[-1]) > 0 for row in rows), rows


def test_bench_versions_measures_both_checkouts_with_ready_guests_on_and_off(
    tmp_path: Path,
) -> None:
    """bench_versions.py against a baseline that is this checkout too (a worktree's src works
    alike): a row per setting with both figures and their ratio (its figures are not judged)."""
    done = bench(
        "bench_versions.py",
        *("--baseline", str(BENCH.parent.parent / "src"), "--cases", "20", "--rounds", "1"),
    )
    rows = {line.split()[0]: line.split()[-3:] for line in done.stdout.splitlines()[3:]}
    assert set(rows) == {"on", "off"}, done.stdout
    for now, base, ratio in rows.values():
        assert float(now) > 0 and float(base) > 0
        assert float(ratio) == pytest.approx(float(now) / float(base), abs=0.01)


def test_bench_teardown_prints_each_teardown_with_both_sides_and_their_ratio(
    tmp_path: Path,
) -> None:
    """bench_teardown.py: a row per teardown, run_code's p50 / p90 beside a bare spawn's and
    their ratio (its figures are not judged: they are one noisy run's)."""
    done = bench(
        "bench_teardown.py",
        *("--cases", "2", "--chunk", "1", "--teardowns", "0,0.05"),
        standin=False,
    )
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert [row[0] for row in rows] == ["0ms", "50ms"], done.stdout
    for row in rows:
        ours, bare, ratio = float(row[1]), float(row[4]), float(row[7])
        assert ratio == pytest.approx(ours / bare, abs=0.01)


def test_bench_compiles_prints_one_compile_per_solution_against_one_per_case() -> None:
    """bench_compiles.py: a C++ solution's cases at once, with kept compiles and with each
    case compiling: the compiles per solution (one against one per case), wall and CPU, and
    their ratios (the figures are not judged: they are one noisy run's)."""
    done = bench("bench_compiles.py", "--cases", "3", "--solutions", "1", standin=False)
    lines = done.stdout.splitlines()
    table = {line[:20].strip(): line[20:].split() for line in lines[2:4]}
    assert list(table) == ["kept compiles", "each case compiles"], done.stdout
    assert [float(row[0]) for row in table.values()] == [1.0, 3.0]
    wall, cpu = lines[4].removeprefix("ratio kept / each: wall ").split(", host CPU ")
    rows = [[float(figure) for figure in row[1:]] for row in table.values()]
    assert float(wall) == pytest.approx(rows[0][0] / rows[1][0], abs=0.01)
    assert float(cpu) == pytest.approx(rows[0][1] / rows[1][1], abs=0.01)


def test_bench_host_cpu_prints_each_side_and_the_ratios_to_the_bare_spawn() -> None:
    """bench_host_cpu.py: run_code (ready guests off and on), the least case in plain Python
    and the bare spawn, each with the worker's and the helpers' CPU and switches, and each
    ratio to the bare spawn (its figures are not judged: they are one noisy run's)."""
    done = bench("bench_host_cpu.py", "--cases", "4", "--stages", standin=False)
    lines, steps = done.stdout.split("where run_code's CPU goes", 1)
    lines = lines.splitlines()
    table = {line[:32].strip(): line[32:].split() for line in lines[2:6]}
    assert list(table) == [
        "run_code, ready guests off",
        "run_code, ready guests on",
        "least case in plain Python",
        "bare subprocess.run",
    ]
    totals = {label: float(row[4]) for label, row in table.items()}
    for row in table.values():
        assert float(row[4]) == pytest.approx(float(row[0]) + float(row[2]), abs=0.002)
    ratios = [line for line in lines[6:] if line.startswith("ratio ")]
    assert len(ratios) == 3
    for line, label in zip(ratios, list(table)[:3], strict=True):
        ratio = float(line.split(": ")[1].split()[0])
        assert ratio == pytest.approx(totals[label] / totals["bare subprocess.run"], rel=0.02)
    # and the Python each runs per case, traced: a count of each of the four
    counted = lines[-1].removeprefix("lines of Python run per case: ")
    assert counted != lines[-1]
    figures = dict(part.rsplit(" ", 1) for part in counted.split("; "))
    assert list(figures) == list(table) and all(int(n) > 0 for n in figures.values())
    # and with --stages, run_code's path step by step: each step's CPU within its caller's
    rows = re.findall(r"^  ( *)(\S.*?)\s+([\d.]+)\s+([\d.]+)%(?: x\d+)?$", steps, re.MULTILINE)
    assert [label for _, label, _, _ in rows][:3] == [
        "run_code",
        "the request validated",
        "the gate passed and the case run",
    ]
    assert rows[-1][1] == "other threads (the ender)" and len(rows) > 10
    whole = float(rows[0][2])
    assert whole > 0 and float(rows[0][3]) == 100.0
    for index, (indent, label, spent, share) in enumerate(rows[:-1]):
        assert float(share) == pytest.approx(100 * float(spent) / whole, abs=0.3), label
        depth = len(indent) // 2
        within = []
        for below_indent, _, below, _ in rows[index + 1 : -1]:
            if len(below_indent) // 2 <= depth:
                break
            if len(below_indent) // 2 == depth + 1:
                within.append(float(below))
        assert sum(within) <= float(spent) + 0.005, label


def test_bench_serve_prints_serve_beside_run_code_and_a_bare_http_round_trip() -> None:
    """bench_serve.py: at each concurrency, run_code, a bare ASGI app under the same uvicorn
    (the floor of any HTTP server here) and serve, then what serve adds to run_code and what
    it adds beyond the floor (its figures are not judged: they are one noisy run's)."""
    done = bench("bench_serve.py", "--cases", "16", "--rounds", "2", standin=False)
    rows = re.findall(r"^  c=(\d+)\s+(run_code|bare HTTP|serve)\s+([\d.]+)\s+([\d.]+)\s+"
                      r"([\d.]+)\s+([\d.]+)$", done.stdout, re.MULTILINE)  # fmt: skip
    assert [(level, name) for level, name, *_ in rows] == [
        (level, name) for level in ("1", "8", "32") for name in ("run_code", "bare HTTP", "serve")
    ]
    p50 = {(level, name): float(median) for level, name, _, median, _, _ in rows}
    beyond = re.findall(
        r"^  c=(\d+)\s+serve adds ([+-][\d.]+) ms per case at p50 beyond a bare HTTP round trip "
        r"\(([\d.]+) ms at p50\)$",
        done.stdout,
        re.MULTILINE,
    )
    assert [level for level, _, _ in beyond] == ["1", "8", "32"]
    for level, own, floor in beyond:
        assert float(floor) == pytest.approx(p50[(level, "bare HTTP")], abs=0.01)
        added = p50[(level, "serve")] - p50[(level, "run_code")]
        assert float(own) == pytest.approx(added - float(floor), abs=0.02)
