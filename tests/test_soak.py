"""The fault soak (benchmarks/soak.py), short: a few hundred cases of known answers from 8
threads, in-process and through `verl-hyperlight serve`, while the stand-in hluk fails under
them. Every case must be answered, in Sandbox Fusion's shape, with its known answer or
SandboxError, and the worker must keep nothing of them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.once

SOAK = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"


def _load_soak():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


soak = _load_soak()

# Hangs too: a run or a probe that hangs waits out the start-up deadline, and no longer. The
# deadline is not low: a loaded CI machine starts the stand-in slowly.
FAULTS = "seed=11,fail=0.1,hang=0.02,die=0.03"
STARTUP_TIMEOUT = 10.0


@pytest.mark.parametrize(("via", "cases"), [("run_code", 80), ("serve", 50)])
def test_a_short_soak_answers_every_case_rightly_or_sandbox_error_and_leaks_nothing(
    tmp_path: Path, via: str, cases: int, compile_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # serve warms Go's build cache before the soak's cases: the session's, warm, not its own.
    monkeypatch.setenv("VERL_HYPERLIGHT_COMPILE_CACHE_DIR", str(compile_cache))
    report = soak.soak(
        via, 8, cases, seed=7, scratch=tmp_path, faults=FAULTS, startup_timeout=STARTUP_TIMEOUT
    )
    assert sum(report.judged.values()) == cases
    assert (report.judged["lost"], report.judged["ill-formed"], report.judged["mis-graded"]) == (
        0,
        0,
        0,
    ), report.examples
    assert report.leaked == (0, 0, 0, 0), report.threads_changed
    # Faults were injected (all 50 cases unfaulted: a chance of 1 in 1,000), and one-off faults
    # failed no case but their own: most were answered right. Except that at these rates (12%
    # of runs fail to start) three failures in a row come by chance now and then (CI saw it):
    # the guest's gate opens, as it should, and answers the cases sent meanwhile at once (all
    # the soak's rest: an answer at once takes milliseconds). That is allowed once, not twice.
    assert sum(report.faults.values()) > 0, report.errors
    assert report.gate_openings <= 1, report.errors
    assert report.answered_at_once == 0 or report.gate_openings == 1, report.errors
    assert report.judged["right"] + report.answered_at_once > cases // 2, report.errors


def test_a_backend_that_never_starts_a_guest_opens_the_gate_once_and_the_soak_counts_it(
    tmp_path: Path,
) -> None:
    report = soak.soak(
        "run_code", 4, 40, seed=7, scratch=tmp_path, faults="seed=1,fail=1", startup_timeout=10
    )
    assert report.judged == {"sandbox-error": 40}
    assert report.gate_openings == 1
    # The first cases ran hluk (three failures to start open the gate); the rest did not.
    assert 20 < report.answered_at_once < 40, report.errors
    assert report.leaked == (0, 0, 0, 0)


@pytest.mark.parametrize("kind", sorted(soak.KINDS))
def test_each_kind_of_case_is_drawn_and_its_code_is_unique(kind: str) -> None:
    cases = [soak.make_case(3, "t", index) for index in range(400)]
    assert any(case.kind == kind for case in cases)
    assert len({case.digest for case in cases}) == len(cases)


def test_a_wrong_output_or_status_is_a_mis_grade_and_sandbox_error_is_not() -> None:
    case = next(c for i in range(100) if (c := soak.make_case(1, "t", i)).kind == "right")
    expected = case.expected
    run = {
        "status": "Finished",
        "execution_time": 0.1,
        "return_code": 0,
        "stdout": expected.stdout,
        "stderr": "",
    }
    response = {
        "status": "Success",
        "message": "",
        "compile_result": None,
        "run_result": run,
        "executor_pod_name": None,
        "files": {},
    }
    assert soak.judge(case, response) == "right"
    assert soak.judge(case, {**response, "run_result": {**run, "stdout": "wrong\n"}}) == (
        "mis-graded"
    )
    failed = {**response, "status": "Failed", "run_result": {**run, "return_code": 1}}
    assert soak.judge(case, failed) == "mis-graded"
    error = {**response, "status": "SandboxError", "run_result": None}
    assert soak.judge(case, error) == "sandbox-error"
    assert soak.judge(case, {**response, "status": "Success", "run_result": None}) == "ill-formed"
    assert soak.judge(case, None) == "lost"


def test_a_soak_with_ready_guests_on_the_default_path_answers_every_case_and_leaks_nothing(
    tmp_path: Path,
) -> None:
    """The same faults with micro-VMs started ahead of their cases (the product's default):
    a ready guest that draws a fault before its case is passed over or fails that case with a
    SandboxError, never a wrong answer; ended at the worker's exit, nothing is left."""
    report = soak.soak(
        "run_code", 8, 80, seed=7, scratch=tmp_path, faults=FAULTS,
        startup_timeout=STARTUP_TIMEOUT, ready_guests=8,
    )  # fmt: skip
    assert sum(report.judged.values()) == 80
    judged = report.judged
    assert (judged["lost"], judged["ill-formed"], judged["mis-graded"]) == (0, 0, 0), (
        report.examples
    )
    assert report.leaked == (0, 0, 0, 0)
    assert sum(report.faults.values()) > 0, report.errors
    assert report.gate_openings <= 1, report.errors
    assert report.judged["right"] + report.answered_at_once > 80 // 2, report.errors


def test_a_thread_left_by_the_soak_counts_though_another_of_another_kind_ended() -> None:
    # In a test process an earlier test's thread may end during the soak (CI saw a count of
    # -1): threads are counted by kind there, so neither hides the other.
    kinds = soak.Counter
    before = soak.Holdings(frozenset(), 3, 10, 0, kinds(["MainThread", "verl-hyperlight-ender"]))
    ended = soak.Holdings(frozenset(), 2, 10, 0, kinds(["MainThread"]))
    swapped = soak.Holdings(frozenset(), 3, 10, 0, kinds(["MainThread", "Thread"]))
    assert ended.left_since(before) == (0, 0, 0, 0)
    assert swapped.left_since(before) == (0, 1, 0, 0)
    assert swapped.threads_changed(before) == "+1 Thread, -1 verl-hyperlight-ender"
    # Another process's (serve's) threads are known by their count alone.
    server_before = soak.Holdings(frozenset(), 12, 30, 0)
    assert soak.Holdings(frozenset(), 11, 30, 0).left_since(server_before) == (0, 0, 0, 0)
    assert soak.Holdings(frozenset(), 13, 30, 0).left_since(server_before) == (0, 1, 0, 0)
    assert soak.thread_kind("Thread-12 (run)") == "Thread"
    assert soak.thread_kind("ThreadPoolExecutor-3_0") == "ThreadPoolExecutor"
    assert soak.thread_kind("verl-hyperlight-probe-python") == "verl-hyperlight-probe-python"
