"""Limits: output capped at 16 MiB per stream and answered as the solution's failure, host
memory per case bounded whatever the guest prints, and memory_limit_mb turned into the
micro-VM's memory."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hostside import Host, option, result, run

from verl_hyperlight.guest.protocol import OUTPUT_LIMIT, OUTPUT_LIMIT_STATUS
from verl_hyperlight.hluk import watch as _watch

pytestmark = pytest.mark.once

MIB = 1024 * 1024
# Find the console among the solution's descriptors (the runner keeps it open) and write to it
# directly, around the runner's capped streams.
CONSOLE_FLOOD = (
    "import os\n"
    "console = [fd for fd in range(3, 256) if os.isatty(fd)][0]\n"
    "while True:\n"
    "    os.write(console, {chunk!r} * 65536)\n"
)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def timed_run(code: str, run_timeout: float = 60) -> tuple[dict[str, object], float]:
    started = time.monotonic()
    response = run(code, run_timeout=run_timeout)
    return response, time.monotonic() - started


def test_endless_output_is_stopped_at_16_mib_as_the_solutions_failure(host: Host) -> None:
    run("pass")
    lines = OUTPUT_LIMIT // 1001 + 1
    exact, exact_wall = timed_run(
        f"import sys\nsys.stdout.write((('x' * 1000 + '\\n') * {lines})[:{OUTPUT_LIMIT}])\n"
    )
    endless, endless_wall = timed_run("while True:\n    print('x' * 1000)\n")
    print(
        f"\n16 MiB then exit: {exact_wall:.2f} s; endless output: {endless_wall:.2f} s; "
        f"from exceeding the cap to the response: {endless_wall - exact_wall:+.2f} s"
    )
    first_16_mib = (("x" * 1000 + "\n") * lines)[:OUTPUT_LIMIT]
    assert result(exact)[:3] == ("Success", "Finished", 0)
    assert digest(result(exact)[3]) == digest(first_16_mib)

    status, run_status, return_code, stdout, stderr = result(endless)
    assert (status, run_status, return_code) == ("Failed", "Finished", OUTPUT_LIMIT_STATUS)
    assert len(stdout) == OUTPUT_LIMIT and digest(stdout) == digest(first_16_mib)
    assert "stdout exceeded 16 MiB; it was stopped" in stderr


def test_a_solution_flooding_the_console_itself_is_stopped_as_output_over_the_limit(
    host: Host,
) -> None:
    response = run(CONSOLE_FLOOD.format(chunk=b"y"), run_timeout=60)
    status, run_status, return_code, _, stderr = result(response)
    assert (status, run_status, return_code) == ("Failed", "Finished", OUTPUT_LIMIT_STATUS)
    assert "console output exceeded its limit" in stderr


# In a fresh process: one case, then the process's peak resident memory and the answer. The
# peak is VmHWM, that of this process image alone: Linux carries ru_maxrss over fork and exec,
# so there it would be the test process's own peak.
PEAK_RSS = """
import json, resource, sys
from verl_hyperlight import run_code
response, error = run_code("hyperlight://", sys.argv[1], "", None, 60, None)
run = response["run_result"] or {}
with open("/proc/self/status") as status:
    peak = [int(line.split()[1]) for line in status if line.startswith("VmHWM:")][0]
print(json.dumps({
    "peak_kib": peak,
    "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "answer": [response["status"], run.get("return_code"), len(run.get("stdout") or "")],
}))
"""


def test_host_memory_per_case_stays_bounded_whatever_the_guest_prints(host: Host) -> None:
    run("pass")  # warm: the measured processes only run their case
    solutions = {
        "prints nothing": "pass",
        "prints 100 MB": "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 2**20)\n",
        "floods the console": CONSOLE_FLOOD.format(chunk=b"y"),
        "floods the console with newlines": CONSOLE_FLOOD.format(chunk=b"\n"),
    }
    measured = {}
    for name, code in solutions.items():
        done = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, code], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        measured[name] = json.loads(done.stdout)
    baseline = measured["prints nothing"]["peak_kib"]
    print(f"\nCONSOLE_LIMIT = {_watch.CONSOLE_LIMIT / MIB:.1f} MiB")
    for name, found in measured.items():
        extra = (found["peak_kib"] - baseline) / 1024
        print(
            f"peak RSS, case that {name}: {found['peak_kib'] / 1024:.1f} MiB ({extra:+.1f}); "
            f"ru_maxrss {found['ru_maxrss_kib'] / 1024:.1f} MiB"
        )

    assert measured["prints 100 MB"]["answer"] == ["Failed", OUTPUT_LIMIT_STATUS, OUTPUT_LIMIT]
    for name in ("floods the console", "floods the console with newlines"):
        assert measured[name]["answer"] == ["Failed", OUTPUT_LIMIT_STATUS, 0]
    # What a case holds at most: its output once as bytes (decoded as it came off the console)
    # and once as the response's text, plus a frame's worth of reading; of a console flood,
    # nothing.
    extra = {name: (found["peak_kib"] - baseline) * 1024 for name, found in measured.items()}
    assert extra["prints 100 MB"] < 2 * OUTPUT_LIMIT + 4 * MIB
    assert extra["floods the console"] < 4 * MIB
    assert extra["floods the console with newlines"] < 4 * MIB


@pytest.mark.parametrize(
    ("limit", "scratch"),
    [(128, "192"), (145, "256"), (1000, "1536"), (1024, "1536"), (1153, "2048")],
)
def test_memory_limit_gives_the_micro_vm_a_third_more_rounded_up_as_scratch_mb(
    host: Host, limit: int, scratch: str
) -> None:
    assert result(run("print('ok')", memory=limit))[:4] == ("Success", "Finished", 0, "ok\n")
    assert [option(argv, "--scratch-mb") for argv in host.case_runs()] == [scratch]


def test_nearby_memory_limits_share_one_guest_and_one_warm_up(host: Host) -> None:
    # Each distinct --scratch-mb is a guest of its own (a cold boot and a warm snapshot under
    # the node-wide lock): 1025 to 1100 MiB, as a client sweeping limits sends them, share one.
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda limit: run("print('ok')", memory=limit), range(1025, 1101)))
    assert all(result(answer)[:4] == ("Success", "Finished", 0, "ok\n") for answer in answers)
    assert [option(argv, "--scratch-mb") for argv in host.warm_ups()] == ["1536"]
    assert {option(argv, "--scratch-mb") for argv in host.case_runs()} == {"1536"}
    assert len(host.case_runs()) == 76


def test_no_memory_limit_leaves_the_image_default(host: Host) -> None:
    for limit in (None, -1, 0):
        assert result(run("print('ok')", memory=limit))[:3] == ("Success", "Finished", 0)
    assert len(host.case_runs()) == 3
    assert all("--scratch-mb" not in argv for argv in host.runs())


@pytest.mark.parametrize(
    ("url", "limit", "minimum"),
    [
        ("hyperlight://", 127, 128),
        ("hyperlight://", 1, 128),
        ("hyperlight://agent", 719, 720),
        ("hyperlight://registry.example/org/agent:1", 512, 720),
    ],
)
def test_a_memory_limit_below_what_the_image_boots_in_is_refused(
    host: Host, url: str, limit: int, minimum: int
) -> None:
    from verl_hyperlight import run_code

    response, error = run_code(url, "print(1)", "", None, 10, limit)
    assert response is None and error is not None
    assert error.startswith(f"Invalid request: memory_limit_mb={limit} is below")
    assert f"use at least {minimum}" in error
    assert host.runs() == []


@pytest.mark.parametrize("limit", [-5, -1.5, -1024])
def test_a_negative_memory_limit_is_told_what_a_size_is_not_to_use_another_negative(
    host: Host, limit: float
) -> None:
    from verl_hyperlight import run_code

    response, error = run_code("hyperlight://", "print(1)", "", None, 10, limit)  # type: ignore[arg-type]
    assert response is None
    assert error == (
        f"Invalid request: memory_limit_mb={limit} is not a memory size: give at least 128 "
        "(MiB, what the python image boots in), or None (or 0, or -1) for the image's default"
    )
    assert host.runs() == []
    assert run_code("hyperlight://", "print(1)", "", None, 10, -1)[0] is not None


def test_a_guest_that_exhausts_its_memory_is_answered_failed_as_an_oom_kill(host: Host) -> None:
    # hluk has no handling of a guest out of memory: its kernel aborts (`error: Guest aborted`).
    # The solution's doing: answered as Sandbox Fusion answers an OOM kill, with 137.
    response = run(f"data = b'x' * {1024 * MIB}\nprint('survived')", memory=128)
    status, run_status, return_code, stdout, stderr = result(response)
    assert (status, run_status, return_code, stdout) == ("Failed", "Finished", 137, "")
    assert stderr.startswith("error: Guest aborted:")
    assert "exhausted the micro-VM's memory" in stderr


# Ways out that bypass the solution's stream objects: each must honour the limit as print does.
AROUND_THE_STREAMS = {
    "os.write": f"import os\nos.write(1, b'x' * {OUTPUT_LIMIT + 4096})\n",
    "a dup of stdout": (
        f"import os\nfd = os.dup(1)\nos.write(fd, b'x' * {OUTPUT_LIMIT + 1})\nprint('more')\n"
    ),
    "a child process": (
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c',\n"
        f"                'import os; os.write(1, b\"x\" * {OUTPUT_LIMIT + 1})'])\n"
    ),
}


@pytest.mark.parametrize("way", AROUND_THE_STREAMS)
def test_output_past_the_limit_by_any_way_out_is_stopped_with_153(host: Host, way: str) -> None:
    status, run_status, return_code, stdout, stderr = result(
        run(AROUND_THE_STREAMS[way], run_timeout=60)
    )
    assert (status, run_status, return_code) == ("Failed", "Finished", OUTPUT_LIMIT_STATUS)
    assert stdout == "x" * OUTPUT_LIMIT
    assert "stdout exceeded 16 MiB; it was stopped" in stderr


def test_output_of_exactly_the_limit_by_os_write_is_kept_whole(host: Host) -> None:
    response = run(f"import os\nos.write(1, b'z' * {OUTPUT_LIMIT})\n", run_timeout=60)
    assert result(response)[:3] == ("Success", "Finished", 0)
    assert response["run_result"]["stdout"] == "z" * OUTPUT_LIMIT


# A daemon thread that ends the solution with os._exit once the main thread is already copying
# the output out (it watches the runner for that): the report the main thread began stands.
EXIT_DURING_THE_COPY = """
import os, sys, threading, time
runner = [m for name, m in list(sys.modules.items())
          if 'verl_hyperlight' in name and hasattr(m, '_Case')][0]
case = runner._case

def reporting():
    lock = getattr(case, 'reporting', None)
    return lock.locked() if lock is not None else getattr(case, 'finished', False)

def exit_during_the_copy():
    while not reporting():
        time.sleep(0.0005)
    os._exit(3)

threading.Thread(target=exit_during_the_copy, daemon=True).start()
sys.stdout.write('w' * (8 * 2**20))
"""


def test_a_daemon_thread_exiting_while_the_output_is_copied_out_changes_nothing(
    host: Host,
) -> None:
    response = run(EXIT_DURING_THE_COPY, run_timeout=60)
    assert result(response)[:3] == ("Success", "Finished", 0), response["run_result"]["stderr"]
    assert response["run_result"]["stdout"] == "w" * (8 * 2**20)


def test_a_daemon_thread_exiting_first_decides_the_ending(host: Host) -> None:
    code = (
        "import os, threading, time\n"
        "print('kept', flush=True)\n"
        "threading.Thread(target=os._exit, args=(5,), daemon=True).start()\n"
        "time.sleep(30)\n"
    )
    assert result(run(code, run_timeout=60))[:4] == ("Failed", "Finished", 5, "kept\n")


@pytest.mark.parametrize("over", [1, 100_000_000])
def test_a_memory_limit_past_half_the_nodes_memory_is_refused_before_any_micro_vm(
    host: Host, over: int
) -> None:
    """As serve and the commands refuse it: one rule (node.most_case_memory_mb)."""
    from verl_hyperlight import run_code
    from verl_hyperlight.node import most_case_memory_mb

    limit = most_case_memory_mb() + over
    response, error = run_code("hyperlight://", "print(1)", "", None, 10, limit)
    assert response is None
    assert error == (
        f"Invalid request: memory_limit_mb={limit} is more than half this node's memory "
        f"({most_case_memory_mb()} MiB), the most a case may ask for: the limit is the micro-VM's "
        "memory, in MiB (verl's default is 1024)"
    )
    assert host.runs() == []
