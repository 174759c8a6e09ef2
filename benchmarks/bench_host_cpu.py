"""The host CPU of a trivial case on the stand-in hluk: run_code against a bare spawn, in one run.

In one worker (this process), trivial cases back to back through run_code on the stand-in
hluk (tests/standin, in bubblewrap), with ready guests off and on, then the same number of
bare `subprocess.run` of the stand-in with a case's argv from the same worker, which is what
a user's worker would write without run_code; and between them the least a case can do in
plain Python (`least_case`: the same case directory, spawn, console and answer, with none of
run_code's checks, deadlines or errors), the floor of any pure-Python run_code. For each: the
CPU per case of the worker (all its threads) and of its long-lived helpers (the cleaner; the
spawner and its guard on that way), hluk and its guest not counted; the context switches per
case of each, since a thread's sleep and wake-up is what costs most here (a nested VM's timer
and IPI exits); and the ratio of the total to the bare spawn's. Last, the lines of Python each
runs per case (traced, all threads): a count that does not change from run to run
(docs/performance.md says how the CPU follows it).

With --stages, last, where run_code's own CPU goes (ready guests off): the CPU of the case's
thread in each step of its path (each step's function timed with the thread's CPU clock, steps
within steps indented), per case and as a share of the whole run_code call; the other threads'
share (the ender's reaping) apart.

Usage: python benchmarks/bench_host_cpu.py [--cases N] [--stages]
"""

from __future__ import annotations

import argparse
import binascii
import functools
import os
import resource
import secrets
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from bench_run_code import _children, case_argv, standin_environment

ROOT = Path(__file__).resolve().parent.parent
READY_ENV = "VERL_HYPERLIGHT_READY_GUESTS"


def helpers() -> dict[int, tuple[int, int]]:
    """This process's helpers, live, by pid: (CPU ns, context switches)."""
    found = {}
    for child in _children("self"):
        for pid in [child, *_children(child)]:
            try:
                cpu = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            switches = sum(
                int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line
            )
            found[int(pid)] = (cpu, switches)
    return found


def own() -> tuple[float, int]:
    """This process's CPU seconds and context switches (all its threads, ended ones too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw + usage.ru_nivcsw


def measured(task: Callable[[], None], cases: int) -> tuple[float, float, float, float]:
    """CPU ms and switches per case of this process and of its helpers over `cases` runs."""
    before_helpers, (cpu, switches) = helpers(), own()
    for _ in range(cases):
        task()
    time.sleep(0.5)  # what a case leaves to its helpers and to the ender is done
    after_cpu, after_switches = own()
    after_helpers = helpers()
    common = [pid for pid in after_helpers if pid in before_helpers]
    helper_cpu = sum(after_helpers[p][0] - before_helpers[p][0] for p in common) / 1e6
    helper_switches = sum(after_helpers[p][1] - before_helpers[p][1] for p in common)
    return (
        (after_cpu - cpu) * 1000 / cases,
        (after_switches - switches) / cases,
        helper_cpu / cases,
        helper_switches / cases,
    )


def lines_per_case(task: Callable[[], None], cases: int = 20) -> float:
    """The lines of Python `task` runs (all threads, traced), per case."""
    count = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        count += event == "line"
        return trace

    threading.settrace(trace)
    sys.settrace(trace)
    try:
        for _ in range(cases):
            task()
    finally:
        sys.settrace(None)
        threading.settrace(None)
    return count / cases


def least_case(argv: list[str], nonce: str, case_dir: Path) -> Callable[[], None]:
    """The least a case can do in plain Python, none of run_code's in it: a case directory
    made and removed, hluk started by posix_spawn in a session of its own, its console read
    to the done frame, the frames decoded, hluk reaped, an answer built. No validation, no
    deadline but one poll's, no error handled: a floor, not a way to run cases."""
    mount = argv.index("--mount") + 1
    case_root = os.environ.get("VERL_HYPERLIGHT_CASE_DIR") or (
        "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    )
    environment = dict(os.environ)

    def task() -> None:
        token = secrets.token_hex(16)
        directory = f"{case_root}/verl-hyperlight-least-{token[:16]}"
        os.mkdir(directory, 0o700)
        with open(f"{directory}/solution.py", "w") as file:
            file.write("print(1)")
        with open(f"{directory}/stdin", "w"):
            pass
        command = argv[:]
        command[mount] = command[mount].replace(str(case_dir), directory)
        command[-1] = command[-1].replace(nonce, token)
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        stdout, child_stdout = os.pipe2(os.O_CLOEXEC)
        stderr, child_stderr = os.pipe2(os.O_CLOEXEC)
        pid = os.posix_spawn(
            command[0],
            command,
            environment,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, null, 0),
                (os.POSIX_SPAWN_DUP2, child_stdout, 1),
                (os.POSIX_SPAWN_DUP2, child_stderr, 2),
            ],
            setsid=True,
        )
        for fd in (null, child_stdout, child_stderr):
            os.close(fd)
        poller = select.poll()
        poller.register(stdout, select.POLLIN)
        poller.register(stderr, select.POLLIN)
        done, console = f"\n{token} done".encode(), b""
        while done not in console:
            for fd, _ in poller.poll(10_000):
                chunk = os.read(fd, 65536)
                console += chunk if fd == stdout else b""
                if not chunk:
                    poller.unregister(fd)
        outputs, end = {b"stdout": b"", b"stderr": b""}, [b"1", b"0"]
        for frame in console.split(f"\n{token} ".encode())[1:]:
            kind, _, rest = frame.split(b"\n", 1)[0].rstrip(b"\r").partition(b" ")
            if kind in outputs:
                outputs[kind] += binascii.a2b_base64(rest)
            elif kind == b"end":
                end = rest.split(b" ")
        os.waitpid(pid, 0)
        os.close(stdout)
        os.close(stderr)
        os.unlink(f"{directory}/solution.py")
        os.unlink(f"{directory}/stdin")
        os.rmdir(directory)
        answer = {
            "status": "Success",
            "run_result": {
                "status": "Finished",
                "return_code": int(end[0]),
                "execution_time": float(end[1]),
                "stdout": outputs[b"stdout"].decode(),
                "stderr": outputs[b"stderr"].decode(),
            },
        }
        assert answer["run_result"]["stdout"] == "1\n", console

    return task


# run_code's path, step by step: (depth, label, module, attribute), in the order a case takes
# them; each is timed where its caller looks it up (a module's function, a class's method).
STAGES = [
    (0, "run_code", "verl_hyperlight.case.api", "answer"),
    (1, "the request validated", "verl_hyperlight.case.api", "_validate"),
    (1, "the gate passed and the case run", "verl_hyperlight.case.gate", "run_through_gate"),
    (2, "the case directory written", "verl_hyperlight.case.casedir", "make"),
    (2, "the last cases' hluks reaped", "verl_hyperlight.hluk.ending", "collect"),
    (2, "hluk started", "verl_hyperlight.hluk.spawn", "start"),
    (2, "its console read to the report", "verl_hyperlight.hluk.watch", "watch"),
    (3, "hluk's pipes read", "verl_hyperlight.hluk.watch", "_Pipes.read"),
    (4, "the frames decoded", "verl_hyperlight.hluk.console", "Console.read"),
    (2, "hluk handed to its ender", "verl_hyperlight.hluk.ending", "hand"),
    (2, "the outcome made", "verl_hyperlight.hluk.watch", "_Watched.outcome"),
    (1, "the response shaped", "verl_hyperlight.case.api", "response_for"),
    (1, "the case directory removed", "verl_hyperlight.case.casedir", "CaseDir.remove"),
]


def _timed(function: Callable[..., Any], spent: list[int]) -> Callable[..., Any]:
    """`function`, adding its thread's CPU ns and its calls to `spent`."""

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.thread_time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            spent[0] += time.thread_time_ns() - began
            spent[1] += 1

    return timed


def stages(task: Callable[[], None], cases: int) -> list[tuple[int, str, float, float]]:
    """Each step of STAGES over `cases` runs of `task`: (depth, label, CPU ms of the case's
    thread per case, calls per case), then the other threads' CPU per case (depth -1)."""
    import importlib

    spent: dict[str, list[int]] = {label: [0, 0] for _, label, _, _ in STAGES}
    restore = []
    for _, label, module_name, attribute in STAGES:
        owner: Any = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = owner.__dict__[name]
        setattr(owner, name, _timed(original, spent[label]))
        restore.append((owner, name, original))
    try:
        before = own()[0]
        for _ in range(cases):
            task()
        time.sleep(0.5)  # the ender's share is done
        process = (own()[0] - before) * 1000 / cases
    finally:
        for owner, name, original in restore:
            setattr(owner, name, original)
    found = [
        (depth, label, spent[label][0] / 1e6 / cases, spent[label][1] / cases)
        for depth, label, _, _ in STAGES
    ]
    return [*found, (-1, "other threads (the ender)", process - found[0][2], 0.0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200, help="cases per figure")
    parser.add_argument(
        "--stages", action="store_true", help="then where run_code's CPU goes, step by step"
    )
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="verl-hyperlight-host-cpu-"))
    os.environ.update(standin_environment(scratch))
    from verl_hyperlight import run_code
    from verl_hyperlight.hluk import ending

    def case() -> None:
        response, error = run_code("hyperlight://", "print(1)", "", None, 10, 1024)
        assert error is None and response is not None and response["status"] == "Success"

    argv, nonce = case_argv(scratch / "case")

    def bare() -> None:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True)
        assert done.returncode == 0 and nonce.encode() in done.stdout, done.stderr

    least = least_case(argv, nonce, scratch / "case")

    print(f"{args.cases} trivial cases each, stand-in hluk; CPU ms and context switches per case")
    print(f"{'':32} {'worker':>8} {'switches':>8} {'helpers':>8} {'switches':>8} {'total':>7}")
    figures, lines = {}, {}
    sides: list[tuple[str, Callable[[], None], str | None]] = [
        ("run_code, ready guests off", case, "0"),
        ("run_code, ready guests on", case, "2"),
        ("least case in plain Python", least, None),
        ("bare subprocess.run", bare, None),
    ]
    for label, task, ready in sides:
        if ready is not None:
            os.environ[READY_ENV] = ready
        for _ in range(10):  # warm: the snapshot, the spawner, the cleaner, ready guests
            task()
        ending.wait(30)
        worker, worker_switches, helper, helper_switches = measured(task, args.cases)
        figures[label] = worker + helper
        lines[label] = lines_per_case(task)
        ending.wait(30)
        print(
            f"{label:32} {worker:8.3f} {worker_switches:8.1f} {helper:8.3f} "
            f"{helper_switches:8.1f} {worker + helper:7.3f}"
        )
    base = figures["bare subprocess.run"]
    for label, total in figures.items():
        if label != "bare subprocess.run":
            print(f"ratio {label} / bare: {total / base:.2f} (+{total - base:.3f} ms)")
    print("lines of Python run per case: " + "; ".join(f"{k} {v:.0f}" for k, v in lines.items()))
    if args.stages:
        os.environ[READY_ENV] = "0"
        for _ in range(10):
            case()
        ending.wait(30)
        found = stages(case, args.cases)
        whole = found[0][2]
        print("where run_code's CPU goes, ready guests off (the case's thread; ms per case)")
        for depth, label, spent, calls in found:
            name = "  " * max(depth, 0) + label
            times = f" x{calls:.0f}" if calls > 1 else ""
            print(f"  {name:44} {spent:7.3f} {100 * spent / whole:5.1f}%{times}")
        ending.wait(30)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
