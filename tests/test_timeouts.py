"""run_timeout counts from the solution's start inside the guest, not from hluk's spawn, and
execution_time is the solution's own wall time."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_hyperlight import run_code


def run(code: str, timeout: float) -> dict:  # type: ignore[type-arg]
    response, error = run_code("hyperlight://", code, "", 10, timeout, 1024)
    assert error is None, error
    assert response is not None
    return response


def test_a_slow_restore_is_not_charged_to_the_solution(
    hluk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run("pass", 10)  # the warm-up, before the restore is made slow
    monkeypatch.setenv("HLUK_STANDIN_RESTORE_SECONDS", "2")
    response = run("import time\ntime.sleep(0.5)\nprint('done')", 1)
    assert response["status"] == "Success", response
    assert response["run_result"]["stdout"] == "done\n"
    # The solution's 0.5 s, not the 2 s restore before it.
    assert 0.5 <= response["run_result"]["execution_time"] < 2


def test_a_solution_past_its_timeout_is_stopped_after_about_its_timeout(hluk: Path) -> None:
    response = run("import time\nprint('partial', flush=True)\ntime.sleep(30)", 1)
    assert response["status"] == "Failed"
    run_result = response["run_result"]
    assert run_result["status"] == "TimeLimitExceeded"
    assert run_result["return_code"] is None
    assert 1 <= run_result["execution_time"] < 30


def test_execution_time_is_the_solutions_own_wall_time(hluk: Path) -> None:
    quick = run("pass", 10)["run_result"]["execution_time"]
    slow = run("import time\ntime.sleep(0.3)", 10)["run_result"]["execution_time"]
    assert 0 <= quick < slow
    assert slow >= 0.3
