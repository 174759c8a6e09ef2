"""Ready guests (case/ready.py): a case's micro-VM started before the case arrives, against the
stand-in, whose mounts are bind mounts (a live view, as hluk's are) and whose start (bubblewrap
and an interpreter) is spent before the case comes, as hluk's restore is."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hostside import (
    URL,
    Host,
    fail_with,
    option,
    processes_running,
    processes_with,
    result,
    sandbox_error,
    wait_for,
)

from verl_hyperlight import deadlines, settings
from verl_hyperlight.case import api, ready
from verl_hyperlight.case import gate as _gate
from verl_hyperlight.case.guests import guest_for
from verl_hyperlight.hluk.binary import hluk_path
from verl_hyperlight.outcome import Ending, RawOutcome

# A case whose answer shows its input, its files, its own random draw and its exit.
CASE = textwrap.dedent(
    """
    import os, random, sys
    data = sys.stdin.read()
    print("stdin", data.strip())
    print("file", open("in/a.txt").read())
    open("out.txt", "w").write(data.upper())
    print("random", random.random())
    print("cwd", os.getcwd(), sorted(os.listdir(".")))
    print("to stderr", file=sys.stderr)
    sys.exit(3)
    """
)
FILES = {"in/a.txt": "aGVsbG8="}  # "hello"


@pytest.fixture
def on(host: Host, monkeypatch: pytest.MonkeyPatch) -> Host:
    """The host fixture with ready guests on, at most four per guest."""
    monkeypatch.setenv(settings.READY_GUESTS.name, "4")
    return host


def pool(memory: object = None) -> ready.ReadyGuests:
    """The ready guests of the python guest (of `memory`) on the stand-in."""
    return _gate.gate(hluk_path(), guest_for(URL, memory)).ready_guests


def case(stdin: str, memory: object = None) -> dict[str, object]:
    response, error = api.run_code(
        URL, CASE, stdin, None, 10, memory, files=FILES, fetch_files=["out.txt"]
    )
    assert error is None and response is not None, error
    return response


def ready_runs(host: Host) -> list[list[str]]:
    return [argv for argv in host.runs() if ".await_case(" in (option(argv, "--exec") or "")]


def ready_hluks(host: Host) -> list[int]:
    """The stand-in hluks waiting as ready guests of this test (their case directories are in
    its tmpfs): the hluk itself, not the bwrap and guest below it; not one whose case was
    answered (its directory removed), which tears its guest down meanwhile."""
    found = []
    # Not the child a stand-in hluk forks for its guest, which shows the hluk's argv until it
    # execs (its preexec_fn runs first; seen once in CI): processes_running leaves it out.
    for pid in processes_running(str(host.tmpfs)):
        try:  # a process may end between the listing and the read
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        mounted = re.search(rb"--mount\0([^\0]*):/case", command)
        if (
            b".await_case(" in command
            and b"/standin/hluk\0" in command
            and mounted is not None
            and os.path.isdir(mounted.group(1))
        ):
            found.append(pid)
    return found


def waiting_for(count: int, memory: object = None) -> None:
    assert wait_for(lambda: pool(memory).count() == count), pool(memory).count()


def comparable(response: dict[str, object]) -> tuple[object, ...]:
    """A response less what differs between any two runs: times, and the random draw."""
    status, run_status, code, stdout, stderr = result(response)  # type: ignore[arg-type]
    lines = [line for line in stdout.splitlines() if not line.startswith("random ")]
    return status, run_status, code, lines, stderr, response["files"]


def test_a_case_in_a_ready_guest_answers_as_in_one_started_for_it(
    on: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = case("one")  # starts its own, and one in its place for the next
    waiting_for(1)
    before = pool().taken
    second = case("two")
    assert pool().taken == before + 1
    assert comparable(second) == comparable(case("two")) != comparable(first)
    monkeypatch.setenv(settings.READY_GUESTS.name, "0")
    _gate.forget()
    off = case("two")
    assert pool().taken == 0 and pool().count() == 0
    assert comparable(off) == comparable(second)
    status, run_status, code, stdout, stderr = result(second)  # type: ignore[arg-type]
    assert (status, run_status, code) == ("Failed", "Finished", 3)
    assert "stdin two\nfile hello\n" in stdout and stderr == "to stderr\n"
    assert second["files"] == {"out.txt": "VFdP"}  # "TWO"


def test_each_guest_draws_its_own_random_state_after_its_line(on: Host) -> None:
    draws = set()
    case("warm")
    for _ in range(5):
        waiting_for(1)
        stdout = result(case("x"))[3]
        draws.add(next(line for line in stdout.splitlines() if line.startswith("random ")))
    assert pool().taken >= 5 and len(draws) == 5


def test_the_case_files_are_written_after_the_guest_started_and_read_live(on: Host) -> None:
    case("warm")
    waiting_for(1)
    # Its argv is logged by the stand-in as it runs, after the spawn that counts it waiting.
    (waiting,) = wait_for(lambda: ready_runs(on)[-1:])  # type: ignore[misc]
    mount = option(waiting, "--mount")
    assert mount is not None
    directory = Path(mount.split(":")[0])
    assert directory.is_dir() and list(directory.iterdir()) == []  # mounted empty
    assert result(case("late"))[3].startswith("stdin late\nfile hello\n")
    assert not directory.exists()  # removed with its case


def test_ready_guests_follow_the_demand_up_to_the_limit(on: Host) -> None:
    case("warm")
    waiting_for(1)
    most = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            most[0] = max(most[0], pool().count())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(8) as threads:
            answers = list(threads.map(lambda i: result(case(str(i)))[3], range(24)))
    finally:
        stop.set()
        sampler.join()
    assert all(text.startswith(f"stdin {i}\n") for i, text in enumerate(answers))
    assert 1 < most[0] <= 4  # rose with the demand, never past the limit
    assert pool().taken > 0


def test_each_guest_kind_and_size_has_ready_guests_of_its_own(on: Host) -> None:
    for memory in (None, 1024):
        case("warm", memory)
        waiting_for(1, memory)
    pytest_url = api.run_code(URL, "def test_x():\n    pass\n", None, None, 10, None, "pytest")
    assert pytest_url[0] is not None and pytest_url[0]["status"] == "Success", pytest_url
    runs = ready_runs(on)
    assert sorted(option(argv, "--scratch-mb") or "default" for argv in runs) == [
        "1536",
        "default",
        "default",
    ]
    (pytest_ready,) = [argv for argv in runs if argv.count("--mount") == 2]
    assert "prepare_pytest" in (option(pytest_ready, "--warm-exec") or "")
    # One taken by its own kind only: the python guest's is still there after pytest's case.
    assert pool().count() == 1 and pool(1024).count() == 1


def test_a_re_warm_ends_the_ready_guests_and_none_is_used_after_it(on: Host) -> None:
    case("warm")
    waiting_for(1)
    (old,) = ready_hluks(on)
    taken = pool().taken
    subprocess.run([hluk_path(), "cache", "clean", "--snapshots"], check=True, capture_output=True)
    assert result(case("after"))[3].startswith("stdin after\n")
    assert pool().taken == taken  # the case ran in a hluk started after the re-warm
    assert wait_for(lambda: old not in ready_hluks(on))
    assert len(on.warm_ups()) == 2


def test_a_ready_guest_that_died_waiting_is_passed_over_and_charged_to_no_case(
    on: Host, caplog: pytest.LogCaptureFixture
) -> None:
    case("warm")
    waiting_for(1)
    (waiting,) = ready_hluks(on)
    os.killpg(waiting, signal.SIGKILL)
    assert wait_for(lambda: waiting not in ready_hluks(on))
    gate = _gate.gate(hluk_path(), guest_for(URL, None))
    caplog.set_level(logging.WARNING, "verl_hyperlight")
    assert result(case("next"))[3].startswith("stdin next\n")
    assert pool().died == 1 and gate.failures_in_a_row == 0
    assert gate.state is _gate.State.CLOSED and caplog.records == []
    waiting_for(1)  # replaced


def test_a_ready_guest_that_hangs_at_its_line_is_the_guests_failure_not_the_cases(
    on: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One that takes the line and never starts the case (stopped, as a guest that hung while
    it waited): nothing of the case ran, so the case starts its own in the same attempt, and
    the gate is told nothing; the hang says the node is slow, so none is started ahead."""
    case("warm")
    waiting_for(1)
    (waiting,) = ready_hluks(on)
    os.killpg(waiting, signal.SIGSTOP)
    monkeypatch.setenv(settings.STARTUP_TIMEOUT.name, "2")
    gate = _gate.gate(hluk_path(), guest_for(URL, None))
    caplog.set_level(logging.INFO, "verl_hyperlight")
    before = time.monotonic()
    assert result(case("next"))[3].startswith("stdin next\n")
    assert pool().died == 1 and pool().taken == 0
    assert gate.failures_in_a_row == 0 and gate.state is _gate.State.CLOSED
    assert wait_for(lambda: waiting not in ready_hluks(on))  # killed, not left stopped
    said = [r.getMessage() for r in caplog.records]
    assert any("did not start the case within 2 s" in m for m in said), said
    assert not any("retrying" in m for m in said), said
    assert pool().slow_until >= before + settings.READY_IDLE.value()
    started = len(ready_runs(on))
    case("during the pause")
    assert len(ready_runs(on)) == started


def test_a_gate_that_opens_ends_its_ready_guests_and_starts_none_while_open(
    on: Host, monkeypatch: pytest.MonkeyPatch, fail_file: Path
) -> None:
    case("warm")
    waiting_for(1)
    (waiting,) = ready_hluks(on)
    subprocess.run([hluk_path(), "cache", "clean", "--snapshots"], check=True, capture_output=True)
    fail_with(monkeypatch, fail_file, "failed to open /dev/kvm: Permission denied", 100)
    for _ in range(_gate.OPEN_AFTER + 1):
        assert "/dev/kvm" in sandbox_error(case("x"))
    gate = _gate.gate(hluk_path(), guest_for(URL, None))
    assert gate.state is _gate.State.OPEN
    assert wait_for(lambda: waiting not in ready_hluks(on))
    started = len(ready_runs(on))
    assert "answered at once" in sandbox_error(case("y"))
    assert len(ready_runs(on)) == started and pool().count() == 0


def test_a_change_of_hluks_environment_counts_from_the_next_case(
    on: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    case("warm")
    waiting_for(1)
    (before,) = ready_hluks(on)
    # hluk's environment now names another argv log: the case's hluk must write there.
    changed = Host(on.cache, tmp_path / "changed.jsonl", on.tmpdir, on.tmpfs)
    monkeypatch.setenv("HLUK_STANDIN_ARGV_LOG", str(changed.argv_log))
    assert result(case("x"))[3].startswith("stdin x\n")
    execs = [option(argv, "--exec") or "" for argv in changed.runs()]
    assert pool().taken == 0 and any(".main(" in code for code in execs), execs
    assert wait_for(lambda: before not in ready_hluks(on))


def test_a_hluk_replaced_in_place_starts_the_next_case_anew(on: Host) -> None:
    case("warm")
    waiting_for(1)
    (before,) = ready_hluks(on)
    wrapper = Path(hluk_path())
    replaced = wrapper.with_name("hluk.new")
    replaced.write_text(wrapper.read_text() + "# upgraded\n")
    replaced.chmod(0o755)
    replaced.replace(wrapper)  # as a package manager installs a new hluk over the old
    assert result(case("x"))[3].startswith("stdin x\n")
    assert pool().taken == 0
    assert wait_for(lambda: before not in ready_hluks(on))


def test_a_cancelled_case_in_a_ready_guest_kills_it(on: Host) -> None:
    case("warm")
    waiting_for(1)
    (waiting,) = ready_hluks(on)
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    response, error = api.run_code(
        URL, "import time\ntime.sleep(60)", None, None, 100, None, cancel=cancel
    )
    assert error is None and response is not None
    assert api.CASE_CANCELLED in sandbox_error(response)
    assert pool().taken == 1
    assert wait_for(lambda: waiting not in processes_with(str(on.tmpfs)))


def test_ready_guests_that_wait_past_the_idle_limit_are_ended(
    on: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(settings.READY_IDLE.name, "1")
    # A loaded machine's slow first start would pause starting ahead for that same second, and
    # no guest would be started to expire: the pause has tests of its own.
    monkeypatch.setattr(ready, "SLOW_START_SHARE", 1000.0)
    before = api.ready_guests()
    case("warm")
    # The warm case started one guest ahead while its own ran. On a loaded node (CI's) the
    # case itself can run on past the idle second after that start, so the guest may be
    # gone before it is seen waiting: what shows its expiry is that it was started, is gone
    # (its hluk and its directory with it) and was neither taken by a case nor found dead.
    assert wait_for(lambda: len(ready_runs(on)) == 1)
    assert wait_for(lambda: pool().count() == 0 and not ready_hluks(on), 15)
    after = api.ready_guests()
    assert (after.taken, after.died) == (before.taken, before.died)
    assert len(ready_runs(on)) == 1  # and none was started since
    assert wait_for(lambda: on.case_dirs() == [])


def test_off_starts_none(host: Host) -> None:
    assert settings.READY_GUESTS.value() == 0  # the host fixture's
    for stdin in ("a", "b"):
        assert result(case(stdin))[3].startswith(f"stdin {stdin}\n")
    assert ready_runs(host) == [] and api.ready_guests().waiting == 0


def test_sixty_four_cases_at_once_with_four_ready_guests(on: Host) -> None:
    case("warm")
    with ThreadPoolExecutor(64) as threads:
        answers = list(threads.map(lambda i: result(case(str(i))), range(64)))
    for i, (status, run_status, code, stdout, _) in enumerate(answers):
        assert (status, run_status, code) == ("Failed", "Finished", 3)
        assert stdout.startswith(f"stdin {i}\nfile hello\n")
    assert pool().count() <= 4 and len(ready_hluks(on)) <= 4
    _gate.forget()  # ends them, and waits
    assert ready_hluks(on) == [] and on.case_dirs() == []


def test_a_forked_child_uses_none_of_its_parents(on: Host) -> None:
    case("warm")
    waiting_for(1)
    (waiting,) = ready_hluks(on)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's exit status is the test
        ok = api.ready_guests().waiting == 0 and result(case("child"))[3].startswith(
            "stdin child\n"
        )
        os._exit(0 if ok and pool().taken == 0 else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert waiting in ready_hluks(on) and pool().count() == 1
    assert result(case("parent"))[3].startswith("stdin parent\n") and pool().taken == 1


WORKER = """
import os, sys, time
from verl_hyperlight import run_code
from verl_hyperlight.case import api
response, error = run_code("hyperlight://", "print(1)", None, None, 10, None)
assert error is None and response["status"] == "Success", (response, error)
while api.ready_guests().waiting == 0:
    time.sleep(0.05)
print("waiting", flush=True)
time.sleep(600)
"""


def test_none_is_left_after_the_worker_is_killed(on: Host) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER],
        stdout=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(on.tmpdir), settings.CASE_DIR.name: str(on.tmpfs)},
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline() == b"waiting\n"
        assert ready_hluks(on) != []
    finally:
        worker.kill()
        worker.wait()
    assert wait_for(lambda: processes_with(str(on.tmpfs)) == [], 15)
    assert wait_for(lambda: on.case_dirs() == [], 15)  # the worker's cleaner removed them


def test_a_worker_that_exits_ends_its_ready_guests_first(on: Host) -> None:
    exiting = WORKER.replace("time.sleep(600)", "sys.exit(0)")
    worker = subprocess.run(
        [sys.executable, "-c", exiting],
        capture_output=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(on.tmpdir), settings.CASE_DIR.name: str(on.tmpfs)},
    )
    assert worker.returncode == 0 and worker.stdout == b"waiting\n", worker.stderr
    # At once: not left to the cleaner, which removes a killed worker's after it.
    assert on.case_dirs() == [] and processes_with(str(on.tmpfs)) == []


def an_outcome(ending: Ending, startup_seconds: float | None) -> RawOutcome:
    """A hluk run's outcome of `ending`, its start having taken `startup_seconds`."""
    nothing = memoryview(b"")
    return RawOutcome(
        ending=ending,
        started=startup_seconds is not None,
        end=None,
        stdout=nothing,
        stderr=nothing,
        fetched={},
        hluk_status=None,
        hluk_error="",
        hluk_stderr="",
        preamble=b"",
        refusal="",
        restored=None,
        host_elapsed=0.0,
        limit=60.0,
        startup_seconds=startup_seconds,
    )


def test_a_start_past_its_deadline_ends_no_ready_guest(on: Host) -> None:
    """Load, not a new snapshot: the case is retried after a probe, and the micro-VMs started
    ahead from the snapshot, which is the same, keep waiting for their cases."""
    case("warm")
    waiting_for(1)
    (waiting,) = ready_hluks(on)
    gate = _gate.gate(hluk_path(), guest_for(URL, None))
    runs = iter([an_outcome(Ending.STARTUP_TIMEOUT, None), an_outcome(Ending.FINISHED, 0.01)])
    outcome = gate.run_case(lambda: next(runs), deadlines.for_case(10))
    assert outcome.ending is Ending.FINISHED  # tried again, after the probe that closed it
    assert gate.state is _gate.State.CLOSED
    assert pool().count() == 1 and ready_hluks(on) == [waiting]
    assert result(case("next"))[3].startswith("stdin next\n") and pool().taken == 1


def test_a_snapshot_that_changed_ends_the_ready_guests_started_from_the_old_one(
    on: Host,
) -> None:
    case("warm")
    waiting_for(1)
    (waiting,) = ready_hluks(on)
    subprocess.run([hluk_path(), "cache", "clean", "--snapshots"], check=True, capture_output=True)
    assert result(case("x"))[3].startswith("stdin x\n")
    assert pool().taken == 0  # it came from the snapshot that is gone
    assert wait_for(lambda: waiting not in ready_hluks(on))


def test_while_starts_are_slow_no_guest_is_started_ahead_and_cases_start_their_own(
    on: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A case whose start took a quarter of its start-up deadline says the node is short of
    CPU: for as long as a ready guest may idle, none is started (each would be one more start
    on a node already slow to start), then they are again."""
    caplog.set_level(logging.INFO, "verl_hyperlight")
    # Long enough that the three cases below run inside the pause on a loaded CI machine (CI
    # saw 2 s run out under them, and a guest started ahead, as it should once it is over).
    monkeypatch.setenv(settings.READY_IDLE.name, "8")
    guests = pool()
    limits = deadlines.for_case(10)
    slow = an_outcome(Ending.FINISHED, 0.3 * limits.startup)
    assert guests.run_case([], limits, None, lambda started: slow) is slow
    paused_until = time.monotonic() + 8
    for stdin in ("a", "b", "c"):
        assert result(case(stdin))[3].startswith(f"stdin {stdin}\n")
    assert ready_runs(on) == [] and pool().taken == 0
    said = [
        r.getMessage() for r in caplog.records if "no micro-VM is started ahead" in r.getMessage()
    ]
    assert len(said) == 1 and f"took {0.3 * limits.startup:.1f} s to start" in said[0]
    # The pause over: a case asks for one again, and the next takes it.
    time.sleep(max(0.0, paused_until - time.monotonic()) + 0.5)
    case("after")
    waiting_for(1)
    assert result(case("then"))[3].startswith("stdin then\n") and pool().taken == 1
