"""The spawner (verl_hyperlight/spawner.py): what happens when it dies, cannot start, or was
started by a thread that ends; and the setting that chooses how hluk is started. What every
way must guarantee (process groups, death with the worker, nothing left) is in
test_process_control.py, run on each way."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hostside import (
    Host,
    children_of,
    noting_the_start,
    processes_running,
    processes_with,
    result,
    run,
    sandbox_error,
    wait_for,
)

from verl_hyperlight import settings as _settings
from verl_hyperlight.case import gate as _gate
from verl_hyperlight.errors import BackendError, CauseCounts
from verl_hyperlight.hluk import binary as _binary
from verl_hyperlight.hluk import ending as _ending
from verl_hyperlight.hluk import spawn as _spawn
from verl_hyperlight.hluk import spawners as _spawners

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_run_code.py"


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A process that starts hluk through spawners, with none yet, and one at most (the
    tests' own are put back after)."""
    monkeypatch.setenv(_settings.SPAWN.name, "spawner")
    monkeypatch.setattr(_spawners, "_spawners", {})
    monkeypatch.setattr(_spawners, "SPAWNERS", 1)
    monkeypatch.setattr(_spawners, "_starts", _spawners._Starts())
    # What earlier tests of the process said once (a spawner that did not answer in time, seen
    # in a loaded soak) is not said again: this test's own must be the first.
    monkeypatch.setattr(_spawners, "_unanswered", CauseCounts())
    yield
    for spawner in _spawners._spawners.values():
        if spawner.alive and spawner.process is not None:
            spawner.alive = False  # no news of its death: the test ends it
            spawner.process.kill()


def spawner_pid(slot: int = 0) -> int:
    """The spawner's own pid (the parent of its hluk; its guard is the worker's child)."""
    spawner = _spawners._spawners[slot]
    assert spawner.pid
    return spawner.pid


def guard_pid(slot: int = 0) -> int:
    spawner = _spawners._spawners[slot]
    assert spawner.process is not None
    return spawner.process.pid


def test_hluk_is_started_by_the_spawner_not_by_the_worker(host: Host, fresh: None) -> None:
    marker = str(host.tmpdir)  # in hluk's argv: the case directory it mounts
    code = "import time\ntime.sleep(30)\n"
    thread = threading.Thread(target=run, args=(code,), kwargs={"run_timeout": 5})
    thread.start()
    try:
        assert wait_for(lambda: processes_with(marker))
        guard, spawner = guard_pid(), spawner_pid()
        # The worker's child is the spawner's guard; the spawner, its child, starts hluk.
        assert guard in children_of(os.getpid()) and children_of(guard) == {spawner}
        hluks = children_of(spawner)
        assert hluks and not hluks & children_of(os.getpid())
        # Each in a group of its own; one of an earlier case (the warm-up's probe) may end
        # between the listing and the look at it.
        grouped = []
        for pid in hluks:
            with contextlib.suppress(ProcessLookupError):
                grouped.append(os.getpgid(pid) == pid)
        assert grouped and all(grouped)
    finally:
        thread.join()


def assert_the_next_case_starts_another_spawner(dead: int) -> None:
    # Once the dead spawner is known dead: to the thread that owns it, or to a case that lost
    # its run with it or found its socket ended (which retires it).
    assert wait_for(
        lambda: (
            spawner_pid() != dead
            or not _spawners._spawners[0].alive
            or _spawners._spawners[0].retired
        )
    )
    assert result(run("print(1)"))[3] == "1\n"
    assert spawner_pid() != dead and _spawners._spawners[0].alive


def test_a_spawner_killed_before_the_solution_started_is_retried_on_another(
    host: Host,
    fresh: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    run("pass")
    first = spawner_pid()
    marker = str(host.tmpdir)  # in hluk's argv: the case directory it mounts
    hang = tmp_path / "hang"
    hang.write_text("1")  # the next hluk hangs before its guest boots, until it is killed
    monkeypatch.setenv("HLUK_STANDIN_HANG_FILE", str(hang))
    answers: list[dict[str, object]] = []
    thread = threading.Thread(target=lambda: answers.append(run("print(5)", run_timeout=60)))
    thread.start()
    assert wait_for(lambda: processes_with(marker) and hang.read_text() == "0")
    os.kill(first, signal.SIGKILL)
    thread.join(120)
    # hluk was killed with it before the solution started: the case is retried once, on the
    # spawner the next run starts, and answers as if nothing had happened.
    assert not thread.is_alive()
    assert wait_for(lambda: len(processes_with(marker)) == 0)
    assert [result(answer)[:4] for answer in answers] == [("Success", "Finished", 0, "5\n")]
    assert_the_next_case_starts_another_spawner(first)
    assert any("spawner" in record.getMessage() for record in caplog.records)
    # The guard exits as the spawner did, killed by SIGKILL, and the log says so.
    assert wait_for(lambda: any("(status -9)" in r.getMessage() for r in caplog.records))


@contextlib.contextmanager
def stopped_guard_of_spawner() -> Iterator[int]:
    """The spawner's guard, stopped (SIGSTOP) for the test: it cannot reap a dead spawner nor
    exit, so the thread that owns the spawner does not learn of its death; continued after."""
    guard = guard_pid()
    os.kill(guard, signal.SIGSTOP)
    try:
        yield guard
    finally:
        os.kill(guard, signal.SIGCONT)


def killing_the_spawner(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """Have the next `times` hluk runs of binary.py (--version) lose their spawner, killed
    (SIGKILL) as soon as the run has been asked of it; the spawners killed, in order."""
    real = _binary.run
    killed: list[int] = []

    def run_losing_its_spawner(*args: Any, **options: Any) -> Any:
        if len(killed) < times:

            def kill() -> None:
                killed.append(spawner_pid())
                os.kill(killed[-1], signal.SIGKILL)

            options["meanwhile"] = kill
        return real(*args, **options)

    monkeypatch.setattr(_binary, "run", run_losing_its_spawner)
    return killed


def test_a_version_check_lost_with_its_spawner_asks_another_spawner_at_once(
    host: Host, fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A case retried after its spawner died checks hluk's version first (its gate probes): CI
    # saw that check lost too, sent to the dead spawner before the thread that owns it had seen
    # its guard exit, and read as a broken hluk (the case SandboxError). The guard is stopped
    # here so that the owning thread cannot learn of the death at all: the lost run must tell.
    run("pass")
    path = _binary.hluk_path()
    version = _binary.check_version(path)
    with stopped_guard_of_spawner():
        killed = killing_the_spawner(monkeypatch, times=1)
        assert _binary.check_version(path) == version
        # Asked again of a new spawner, not of the dead one nor through the next way.
        assert len(killed) == 1 and spawner_pid() != killed[0]
        assert _spawners._spawners[0].alive and not _spawners._spawners[0].retired
    assert result(run("print(3)"))[3] == "3\n"


def test_a_version_check_lost_twice_says_the_spawner_died_not_that_hluk_is_broken(
    host: Host, fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    run("pass")
    killing_the_spawner(monkeypatch, times=2)
    with pytest.raises(BackendError) as raised:
        _binary.check_version(_binary.hluk_path())
    assert raised.value.cause == "spawner-died", raised.value
    assert "--version" not in str(raised.value)


def sleeping_case(
    monkeypatch: pytest.MonkeyPatch, run_timeout: float
) -> tuple[threading.Thread, list[dict[str, object]]]:
    """A case whose solution sleeps for 30 s, run in a thread (its answer is put in the list),
    once the host has read the solution's start from the console (so that a test does not
    depend on how fast a loaded machine gets there)."""
    started = noting_the_start(monkeypatch)
    answers: list[dict[str, object]] = []
    code = "import time\ntime.sleep(30)\n"
    thread = threading.Thread(target=lambda: answers.append(run(code, run_timeout=run_timeout)))
    thread.start()
    assert started.wait(60)
    return thread, answers


def test_a_spawner_killed_while_the_solution_ran_takes_its_hluk_and_is_not_retried(
    host: Host, fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    run("pass")
    first = spawner_pid()
    marker = str(host.tmpdir)  # in hluk's argv: the case directory it mounts
    thread, answers = sleeping_case(monkeypatch, run_timeout=60)
    os.kill(first, signal.SIGKILL)
    thread.join(120)
    # hluk was killed with it once the solution had started: a sandbox error, not retried
    # (the solution may have done anything), said plainly; the next case starts a spawner.
    assert not thread.is_alive()
    assert wait_for(lambda: len(processes_with(marker)) == 0)
    assert len(answers) == 1
    assert "spawner of hluk processes died while the solution ran" in sandbox_error(answers[0])
    assert len(host.case_runs()) == 2  # the warm one and this one: no retry
    assert_the_next_case_starts_another_spawner(first)


def test_a_spawner_started_by_a_thread_that_ends_outlives_it(host: Host, fresh: None) -> None:
    # The parent-death signal follows the thread that started a process: the spawner is
    # started by a thread of its own, so a reward thread pool's threads may come and go.
    thread = threading.Thread(target=run, args=("pass",))
    thread.start()
    thread.join()
    spawner = spawner_pid()
    assert result(run("print(2)"))[3] == "2\n"
    assert spawner_pid() == spawner and guard_pid() in children_of(os.getpid())


def test_a_spawner_that_cannot_start_leaves_cases_to_the_next_way_with_one_warning(
    host: Host, fresh: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_spawners, "SPAWNER_SCRIPT", "/nonexistent/spawner.py")
    caplog.set_level(logging.WARNING, "verl_hyperlight")
    for _ in range(3):
        assert result(run("print(3)"))[3] == "3\n"
    warnings = [
        r.getMessage() for r in caplog.records if "cannot start the spawner" in r.getMessage()
    ]
    assert len(warnings) == 1 and "exited with status 2" in warnings[0]
    assert not any(spawner.alive for spawner in _spawners._spawners.values())


def hluk_parent_during(case: str, marker: str) -> int:
    """The parent of the hluk that runs `case` (a solution that sleeps), seen while it runs
    (once the hluks of the cases answered before it have ended: hluk/ending.py)."""
    assert _ending.wait(30)
    thread = threading.Thread(target=run, args=(case,), kwargs={"run_timeout": 1})
    thread.start()
    try:

        def running() -> dict[int, int]:
            """Each hluk of the case with its parent."""
            hluks = set(processes_with("/standin/hluk\0"))
            return {pid: p for pid, p in processes_running(marker).items() if pid in hluks}

        assert wait_for(running)
        ((_, parent),) = running().items()
        return parent
    finally:
        thread.join()


def test_a_spawner_start_that_fails_once_is_tried_again_and_later_cases_go_through_it(
    host: Host, fresh: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A passing EAGAIN of pids.max, ENOMEM, a slow start: the first start fails, the next
    # works. The back-off lasts while the start would fail, and is over once it would work.
    caplog.set_level(logging.WARNING, "verl_hyperlight")
    monkeypatch.setattr(_spawners, "SPAWNER_RETRY_SECONDS", 3600.0)
    script = _spawners.SPAWNER_SCRIPT
    monkeypatch.setattr(_spawners, "SPAWNER_SCRIPT", "/nonexistent/spawner.py")
    marker = str(host.tmpdir)  # in hluk's argv: the case directory it mounts
    sleeper = "import time\ntime.sleep(30)\n"
    for _ in range(2):
        assert hluk_parent_during(sleeper, marker) == os.getpid()  # through setpriv or a fork
    monkeypatch.setattr(_spawners, "SPAWNER_SCRIPT", script)
    monkeypatch.setattr(_spawners, "SPAWNER_RETRY_SECONDS", 0.0)
    assert result(run("print(1)"))[3] == "1\n"  # starts the retry, and takes the next way
    assert wait_for(lambda: 0 in _spawners._spawners and _spawners._spawners[0].alive)
    for _ in range(2):
        assert hluk_parent_during(sleeper, marker) == spawner_pid()
    said = [r.getMessage() for r in caplog.records if "spawner" in r.getMessage()]
    assert len(said) == 2, said
    assert "cannot start the spawner" in said[0] and "tried again" in said[0]
    assert "started again (1 starts had failed)" in said[1]


def test_a_frozen_spawner_holds_no_case_past_its_time_limit(
    host: Host,
    fresh: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(_spawners, "SPAWNER_STOP_SECONDS", 0.5)
    run("pass")
    spawner = spawner_pid()
    marker = str(host.tmpdir)  # in hluk's argv: the case directory it mounts
    thread, answers = sleeping_case(monkeypatch, run_timeout=1)
    try:
        os.kill(spawner, signal.SIGSTOP)  # the spawner hears of nothing until it is resumed
        thread.join(60)
        # The case is answered by its own time limit, and its hluk killed by the case.
        assert not thread.is_alive()
        assert [result(answer)[:2] for answer in answers] == [("Failed", "TimeLimitExceeded")]
        assert wait_for(lambda: not processes_with(marker)), processes_with(marker)
    finally:
        os.kill(spawner, signal.SIGCONT)
        thread.join()
    said = [r.getMessage() for r in caplog.records if "did not say within" in r.getMessage()]
    assert len(said) == 1 and f"pid {spawner}" in said[0]
    assert wait_for(lambda: not children_of(spawner))  # resumed, it reaps what it had
    assert result(run("print(12)"))[3] == "12\n"
    assert spawner_pid() == spawner


def test_an_unknown_way_is_logged_once_and_the_default_used(
    host: Host, fresh: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    setting = f"vfork-{uuid.uuid4().hex[:6]}"  # a new value: the choice is cached per value
    monkeypatch.setenv(_settings.SPAWN.name, setting)
    for _ in range(2):
        assert result(run("print(4)"))[3] == "4\n"
    errors = [r.getMessage() for r in caplog.records if setting in r.getMessage()]
    assert len(errors) == 1 and "direct, spawner, setpriv, fork" in errors[0]
    assert errors[0].endswith("using direct")
    assert _spawners._spawners == {}  # hluk was started directly


@pytest.mark.parametrize("way", _settings.SPAWN_WAYS)
def test_a_hluk_that_cannot_be_executed_is_a_backend_failure_on_every_way(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    if way == "setpriv" and _spawn.setpriv() is None:
        pytest.skip("no setpriv with --pdeathsig here")
    monkeypatch.setenv(_settings.SPAWN.name, way)
    run("pass")  # warm, so the failure is the case's own
    broken = tmp_path / "hluk"
    broken.write_bytes(b"\x7fELF not really")  # executable, but not a program
    broken.chmod(0o755)
    monkeypatch.setenv("HLUK_PATH", str(broken))
    response = run("print(1)")
    assert response["status"] == "SandboxError"
    assert "could not start" in response["message"] or "failed" in response["message"]


FORKING_WORKER = """
import os, sys
from verl_hyperlight import run_code
from verl_hyperlight.errors import CauseCounts
from verl_hyperlight.hluk import spawn as _spawn
from verl_hyperlight.hluk import spawners as _spawners
_spawners.SPAWNERS = 1
def case():
    response, error = run_code("hyperlight://", "print(5)", "", None, 10, None)
    assert response["run_result"]["stdout"] == "5\\n", (response, error)
    return _spawners._spawners[0].process.pid
parent_spawner = case()
child = os.fork()
if child == 0:
    child_spawner = case()
    with open(f"/proc/{child_spawner}/stat") as f:
        its_parent = int(f.read().rsplit(")", 1)[1].split()[1])
    print(parent_spawner, child_spawner, its_parent == os.getpid(), flush=True)
    os._exit(0)
os.waitpid(child, 0)
"""


def test_a_forked_worker_starts_a_spawner_of_its_own(host: Host) -> None:
    # The parent's spawner dies with the parent, and must not start the child's hluk.
    done = subprocess.run(
        [sys.executable, "-c", FORKING_WORKER],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, _settings.SPAWN.name: "spawner"},
    )
    assert done.returncode == 0, done.stderr
    parent_spawner, child_spawner, its_own = done.stdout.split()
    assert child_spawner != parent_spawner and its_own == "True"


def test_cases_one_at_a_time_use_one_spawner_and_many_at_once_take_more_in_turn(
    host: Host, fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ray worker runs one case at a time: one spawner, not SPAWNERS (64 workers of a node
    would keep four times as many idle Pythons). Many hluks running at once take turns."""
    monkeypatch.setattr(_spawners, "SPAWNERS", 2)
    monkeypatch.setattr(_spawners, "RUNNING_PER_SPAWNER", 4)
    for _ in range(6):
        assert result(run("print(6)"))[3] == "6\n"
    assert sorted(_spawners._spawners) == [0]
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda _: run("import time\ntime.sleep(1)\nprint(6)"), range(12)))
    assert all(result(answer)[3] == "6\n" for answer in answers)
    assert sorted(_spawners._spawners) == [0, 1] and spawner_pid(0) != spawner_pid(1)
    assert {guard_pid(0), guard_pid(1)} <= children_of(os.getpid())
    assert wait_for(lambda: _spawners.in_use() == 1)  # every hluk stopped: counted down


def test_a_request_larger_than_the_spawners_socket_takes_runs_through_it(
    host: Host, fresh: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # 300 KiB of variables an operator passes to hluk: more than one message of the socket
    # (about 208 KiB) holds.
    run("pass")
    spawner = spawner_pid()
    for index in range(300):
        monkeypatch.setenv(f"HLUK_STANDIN_OPERATORS_{index}", "x" * 1024)
    caplog.set_level(logging.WARNING, "verl_hyperlight")
    assert result(run("print(7)"))[3] == "7\n"
    assert _spawners._spawners[0].alive and spawner_pid() == spawner
    assert [r.getMessage() for r in caplog.records] == []


def test_a_spawner_that_answers_slowly_is_not_stopped(
    host: Host, fresh: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A very loaded node: the spawner does not run for a while. Only the case's own start-up
    # deadline bounds its answer; none of the package's own (the 30 s it once had, were it any
    # shorter) stops a spawner that is merely slow.
    monkeypatch.setattr(_spawners, "SPAWNER_ANSWER_SECONDS", 0.5, raising=False)
    run("pass")
    # That case's hluk reaped first: stopped, the spawner could not say it had exited, and
    # the ender would kill it past its grace, saying so.
    assert _ending.wait(30)
    spawner = spawner_pid()
    caplog.set_level(logging.WARNING, "verl_hyperlight")
    os.kill(spawner, signal.SIGSTOP)
    resume = threading.Timer(2.0, os.kill, (spawner, signal.SIGCONT))
    resume.start()
    try:
        assert result(run("print(8)"))[3] == "8\n"
    finally:
        resume.join()
    assert _spawners._spawners[0].alive and spawner_pid() == spawner
    assert [r.getMessage() for r in caplog.records] == []


def test_a_hluk_started_after_its_case_gave_up_is_killed_not_orphaned(
    host: Host, fresh: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    run("pass")
    spawner = spawner_pid()
    monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", "0.5")
    version_timeout = _binary.VERSION_TIMEOUT_SECONDS
    monkeypatch.setattr(_binary, "VERSION_TIMEOUT_SECONDS", 0.5)
    os.kill(spawner, signal.SIGSTOP)
    try:
        # The case, and the probe before its retry (hluk --version first), give up before
        # the spawner answers.
        sandbox_error(run("print(9)"))
    finally:
        os.kill(spawner, signal.SIGCONT)
    assert "did not start within" in caplog.text
    # Once it runs again it starts each hluk, finds no one reading its status, and kills and
    # reaps it.
    assert wait_for(lambda: not children_of(spawner)), children_of(spawner)
    assert _spawners._spawners[0].alive and spawner_pid() == spawner
    monkeypatch.delenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT")
    # the probe's own limit again: a loaded machine's can take longer than 0.5 s
    monkeypatch.setattr(_binary, "VERSION_TIMEOUT_SECONDS", version_timeout)
    _gate.forget()  # the gate those failures opened is another test's subject
    assert result(run("print(10)"))[3] == "10\n"


def test_a_spawner_killed_after_the_solution_started_is_its_own_failure_not_an_oom_kill(
    host: Host, fresh: None, caplog: pytest.LogCaptureFixture
) -> None:
    run("pass")
    spawner = spawner_pid()
    runs = len(host.case_runs())
    marker = uuid.uuid4().hex
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {marker}'])\n"
        "time.sleep(60)\n"
    )
    answers: list[dict[str, object]] = []
    thread = threading.Thread(target=lambda: answers.append(run(code, run_timeout=30)))
    thread.start()
    assert wait_for(lambda: processes_with(f"# {marker}"))  # the solution runs
    os.kill(spawner, signal.SIGKILL)
    thread.join(60)
    assert not thread.is_alive()
    message = sandbox_error(answers[0])
    assert "the spawner of hluk processes died while the solution ran" in message
    assert "was killed by SIGKILL" not in message  # not hluk killed by the OOM killer
    assert wait_for(lambda: not processes_with(marker)), processes_with(marker)
    logged = [r.getMessage() for r in caplog.records if "spawner" in r.getMessage()]
    assert logged and not any("fail as killed" in line for line in logged)
    assert len(host.case_runs()) == runs + 1  # it had started: not retried
    assert result(run("print(11)"))[3] == "11\n"


def test_many_cases_at_once_on_one_spawner_each_end_as_their_own(
    host: Host,
    fresh: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # hluk processes start and end on one spawner in the same moments, so a status pipe's
    # number is taken again at once: no case's hluk is killed for another's that ended.
    bench = importlib.util.spec_from_file_location("bench_run_code", BENCH)
    assert bench is not None and bench.loader is not None
    module = importlib.util.module_from_spec(bench)
    monkeypatch.setitem(sys.modules, "bench_run_code", module)
    bench.loader.exec_module(module)
    monkeypatch.setenv("HLUK_PATH", str(module.hluk_double(tmp_path)))  # answers at once
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: run(module.SOLUTION, module.STDIN), range(400)))
    assert [result(answer)[:4] for answer in answers] == [
        ("Success", "Finished", 0, module.EXPECTED)
    ] * 400
    assert [r.getMessage() for r in caplog.records] == []  # none retried


def test_a_case_costs_the_spawner_no_page_faults(host: Host, fresh: None) -> None:
    """Each request (57 KB: the guest runner rides in --warm-exec) was allocated and the heap
    trimmed after it, ten minor faults a case; the spawner keeps its heap (glibc's mallopt)."""
    if not hasattr(ctypes.CDLL(None), "mallopt"):
        pytest.skip("not glibc: the spawner leaves malloc as it is")
    for i in range(3):  # warm: the spawner's heap grown to what a case needs
        assert result(run(f"print({i})"))[3] == f"{i}\n"

    def faults() -> int:
        return int(Path(f"/proc/{spawner_pid()}/stat").read_text().rsplit(")", 1)[1].split()[7])

    before = faults()
    for i in range(20):
        assert result(run(f"print({i})"))[3] == f"{i}\n"
    assert faults() - before < 20, faults() - before
