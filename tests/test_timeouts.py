"""run_timeout counts from the solution's start inside the guest, not from hluk's spawn, and
execution_time is the solution's own wall time."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from verl_hyperlight import run_code


def run(code: str, timeout: float) -> dict:  # type: ignore[type-arg]
    response, error = run_code("hyperlight://", code, "", 10, timeout, 1024)
    assert error is None, error
    assert response is not None
    return response


def make_the_restore_slow(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Warm the guest up, then make every later restore take `seconds` before the guest runs."""
    run("pass", 10)  # the warm-up, before the restore is made slow
    monkeypatch.setenv("HLUK_STANDIN_RESTORE_SECONDS", str(seconds))


def test_a_slow_restore_is_not_charged_to_the_solutions_timeout(
    hluk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_the_restore_slow(monkeypatch, 2)
    # Within its 1 s once it runs, past it if the 2 s restore before it were counted.
    response = run("import time\ntime.sleep(0.5)\nprint('done')", 1)
    assert response["status"] == "Success", response
    assert response["run_result"]["stdout"] == "done\n"


def test_a_solution_past_its_timeout_is_stopped_and_answered_time_limit_exceeded(
    hluk: Path,
) -> None:
    # Left alone, the solution would end after 30 s with Success: the answer shows it was stopped.
    response = run("import time\nprint('partial', flush=True)\ntime.sleep(30)\nprint('end')", 1)
    assert response["status"] == "Failed"
    run_result = response["run_result"]
    assert run_result["status"] == "TimeLimitExceeded"
    assert run_result["return_code"] is None
    assert run_result["execution_time"] >= 1  # a timed-out solution ran at least its timeout


def test_execution_time_is_the_solutions_own_wall_time_without_the_restore(
    hluk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    restore = 1.0
    make_the_restore_slow(monkeypatch, restore)
    # The solution times itself (rounded to the microsecond, as the runner reports its time).
    code = (
        "import time\nstarted = time.monotonic()\ntime.sleep(0.3)\n"
        "print(f'{time.monotonic() - started:.6f}')\n"
    )
    called = time.monotonic()
    response = run(code, 10)
    call_span = time.monotonic() - called
    assert response["status"] == "Success", response
    own_span = float(response["run_result"]["stdout"])
    execution_time = response["run_result"]["execution_time"]
    # All of the solution's time is in it, and none of the restore that ran first in the call.
    assert own_span <= execution_time
    assert execution_time + restore <= call_span


MIB = 1024 * 1024
# A solution that ends well within a 1 s run_timeout and leaves 3 MiB of output (4 MiB on the
# console, base64): through a console passing 2 MiB/s, as hluk's may (a VM exit and a print
# per write), copying it out takes about 2 s.
LARGE_OUTPUT_EARLY = "import sys, time\ntime.sleep(0.3)\nsys.stdout.write('c' * (3 * 2**20))\n"


def test_copying_the_output_out_is_not_charged_to_run_timeout(
    hluk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run("pass", 10)
    monkeypatch.setenv("HLUK_STANDIN_CONSOLE_BYTES_PER_SECOND", str(2 * MIB))
    run_timeout = 1
    called = time.monotonic()
    response = run(LARGE_OUTPUT_EARLY, run_timeout)
    call_span = time.monotonic() - called
    assert response["status"] == "Success", response["run_result"]
    assert response["run_result"]["stdout"] == "c" * (3 * MIB)
    assert response["run_result"]["execution_time"] < run_timeout
    # The copy-out ran far past the solution's run_timeout: charged to it, this was a timeout.
    assert call_span >= 2 * run_timeout


def test_a_copy_out_past_its_own_budget_is_a_sandbox_error(
    hluk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl_hyperlight import deadlines

    run("pass", 10)
    monkeypatch.setenv("HLUK_STANDIN_CONSOLE_BYTES_PER_SECOND", str(2 * MIB))
    monkeypatch.setattr(deadlines, "COPY_OUT_SECONDS", 0.5)
    monkeypatch.setattr(deadlines, "COPY_OUT_BYTES_PER_SECOND", 100 * MIB)
    response = run(LARGE_OUTPUT_EARLY, 10)
    assert response["status"] == "SandboxError"
    assert "did not copy the solution's output" in response["message"]
