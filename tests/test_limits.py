"""Limits: output capped at 16 MiB per stream and answered as the solution's failure, host
memory per case bounded whatever the guest prints, and memory_limit_mb turned into the
micro-VM's memory."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time

import pytest
from hostside import Host, option, result, run

from verl_hyperlight import _hluk
from verl_hyperlight.guest.runner import OUTPUT_LIMIT, OUTPUT_LIMIT_STATUS

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
    print(f"\nCONSOLE_LIMIT = {_hluk.CONSOLE_LIMIT / MIB:.1f} MiB")
    for name, found in measured.items():
        extra = (found["peak_kib"] - baseline) / 1024
        print(
            f"peak RSS, case that {name}: {found['peak_kib'] / 1024:.1f} MiB ({extra:+.1f}); "
            f"ru_maxrss {found['ru_maxrss_kib'] / 1024:.1f} MiB"
        )

    assert measured["prints 100 MB"]["answer"] == ["Failed", OUTPUT_LIMIT_STATUS, OUTPUT_LIMIT]
    for name in ("floods the console", "floods the console with newlines"):
        assert measured[name]["answer"] == ["Failed", OUTPUT_LIMIT_STATUS, 0]
    # What a case holds at most: the console buffer (CONSOLE_LIMIT and one read), the streams
    # decoded from it and their text: within twice the console limit.
    for name, found in measured.items():
        assert (found["peak_kib"] - baseline) * 1024 < 2 * _hluk.CONSOLE_LIMIT, name


@pytest.mark.parametrize(("limit", "scratch"), [(128, "171"), (1000, "1334"), (1024, "1366")])
def test_memory_limit_gives_the_micro_vm_a_third_more_as_scratch_mb(
    host: Host, limit: int, scratch: str
) -> None:
    assert result(run("print('ok')", memory=limit))[:4] == ("Success", "Finished", 0, "ok\n")
    assert [option(argv, "--scratch-mb") for argv in host.case_runs()] == [scratch]


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


def test_a_guest_that_exhausts_its_memory_is_killed_with_status_137(host: Host) -> None:
    response = run(f"data = b'x' * {1024 * MIB}\nprint('survived')", memory=128)
    status, run_status, return_code, stdout, stderr = result(response)
    assert (status, run_status, return_code, stdout) == ("Failed", "Finished", 137, "")
    assert "the guest exited with status 137" in stderr
