"""Fail fast while the backend is down: a guest's gate (see _gate.Gate).

When hluk stops starting guests, cases must not each wait out the start-up deadline; a brief
failure, even one that every case of a batch meets at once, must not fail the batch. Whether a
case waited is read from what ran: a case answered at once started no hluk process."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hostside import KVM_FAILURE, URL, GateClock, Host, fail_with, result, run, sandbox_error

from verl_hyperlight.case import failures as _failures
from verl_hyperlight.case import gate as _gate
from verl_hyperlight.case.guests import guest_for
from verl_hyperlight.errors import BackendError, Diagnosis, FailingFast
from verl_hyperlight.hluk import binary as _binary

pytestmark = pytest.mark.once

AT_ONCE = "answered at once"
OPENED = "so its cases are answered SandboxError at once"
CLOSED = "starts again"
# Long enough for the stand-in to start on a loaded machine: only hung runs wait it out.
DEADLINE = 5


@pytest.fixture(autouse=True)
def clock(gate_clock: GateClock) -> GateClock:
    """Stopped: a case that should be answered at once is, however slow the machine."""
    return gate_clock


def in_threads(count: int, threads: int, case: Callable[[int], Any]) -> list[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(case, range(count)))


def logged(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


@pytest.fixture
def hang_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Write N to it and the stand-in's next N runs hang before the guest starts. The deadline
    is longer: every run must reach the point where it hangs before it, or the next takes its
    hang."""
    path = tmp_path / "hang"
    path.write_text("0")
    monkeypatch.setenv("HLUK_STANDIN_HANG_FILE", str(path))
    monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", str(2 * DEADLINE))
    return path


def test_while_hluk_hangs_later_cases_are_answered_at_once_without_running_hluk(
    host: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="verl_hyperlight")
    run("pass")
    cases, probes = len(host.case_runs()), len(host.warm_ups())
    monkeypatch.setenv("HLUK_STANDIN_HANG", "1")
    monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", str(DEADLINE))

    messages = in_threads(24, 8, lambda i: sandbox_error(run(f"print({i})")))

    # The first wave of 8 waited for its start; one probe, which those 8 then waited for,
    # hung too and opened the gate; every later case was answered without running hluk.
    assert len(host.case_runs()) - cases == 8
    assert len(host.warm_ups()) - probes == 1
    waited = [m for m in messages if AT_ONCE not in m]
    assert len(waited) == 1
    assert all(f"did not start within {DEADLINE} s" in m for m in messages)
    assert len(logged(caplog, OPENED)) == 1


def test_a_brief_stall_that_every_case_of_a_batch_meets_fails_none_of_them(
    host: Host, hang_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run("pass")
    # Each of the 8 first runs hangs past its deadline; the stall is over by the probe.
    hang_file.write_text("8")
    responses = in_threads(16, 8, lambda i: run(f"print({i})"))
    assert [result(r)[:4] for r in responses] == [
        ("Success", "Finished", 0, f"{i}\n") for i in range(16)
    ]
    assert hang_file.read_text() == "0"  # the stall did happen
    assert logged(caplog, OPENED) == []


def test_a_hluk_crashing_before_the_guest_opens_the_gate_after_three_failures_in_a_row(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    run("pass")
    cases, probes = len(host.case_runs()), len(host.warm_ups())
    monkeypatch.setenv("HLUK_STANDIN_SIGNAL", "SEGV")

    messages = [sandbox_error(run(f"print({i})")) for i in range(6)]

    # First case: its run (1), then the probe before its retry (2, itself tried twice, as a
    # probe that found the snapshot gone is). Second case: a probe (3): the gate opens.
    assert len(host.case_runs()) - cases == 1
    assert len(host.warm_ups()) - probes == 4
    assert all("was killed by SIGSEGV" in m for m in messages)
    assert [AT_ONCE in m for m in messages] == [False, False, True, True, True, True]


def test_one_case_tries_an_open_gate_again_after_the_back_off_and_its_success_closes_it(
    host: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, clock: GateClock
) -> None:
    caplog.set_level(logging.INFO, logger="verl_hyperlight")
    run("pass")
    monkeypatch.setenv("HLUK_STANDIN_SIGNAL", "SEGV")
    for i in range(3):
        sandbox_error(run(f"print({i})"))
    assert AT_ONCE in sandbox_error(run("print(3)"))

    # Still down after the back-off: one case's probe fails, the gate stays open, quietly.
    clock.skip_back_off()
    probes = len(host.warm_ups())
    assert AT_ONCE not in sandbox_error(run("print(4)"))
    assert len(host.warm_ups()) - probes == 2  # the probe, tried twice
    assert AT_ONCE in sandbox_error(run("print(5)"))

    # Back up: after the back-off the next case probes, runs, and closes the gate.
    monkeypatch.delenv("HLUK_STANDIN_SIGNAL")
    clock.skip_back_off()
    probes = len(host.warm_ups())
    answers = [result(run(f"print({i})"))[:4] for i in range(6, 10)]
    assert answers == [("Success", "Finished", 0, f"{i}\n") for i in range(6, 10)]
    assert len(host.warm_ups()) - probes == 1
    assert len(logged(caplog, OPENED)) == 1
    [closed] = logged(caplog, CLOSED)
    assert "3 cases were answered SandboxError at once" in closed


def test_while_one_case_tries_an_open_gate_the_others_are_answered_at_once(
    host: Host, monkeypatch: pytest.MonkeyPatch, clock: GateClock
) -> None:
    run("pass")
    monkeypatch.setenv("HLUK_STANDIN_HANG", "1")
    monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", str(DEADLINE))
    in_threads(4, 4, lambda i: sandbox_error(run(f"print({i})")))
    clock.skip_back_off()
    cases, probes = len(host.case_runs()), len(host.warm_ups())

    messages = in_threads(8, 8, lambda i: sandbox_error(run(f"print({i})")))

    # One of them probed (a second, hung, deadline); none of the others ran or waited on it.
    assert len(host.case_runs()) - cases == 0
    assert len(host.warm_ups()) - probes == 1
    assert sum(AT_ONCE not in m for m in messages) == 1


def test_a_guest_that_never_started_opens_its_gate_after_three_failed_warm_ups(
    host: Host, monkeypatch: pytest.MonkeyPatch, fail_file: Path, clock: GateClock
) -> None:
    # Three cases' probes, each tried twice.
    fail_with(monkeypatch, fail_file, KVM_FAILURE, 6)
    messages = [sandbox_error(run(f"print({i})")) for i in range(5)]
    assert [AT_ONCE in m for m in messages] == [False, False, False, True, True]
    assert all("kvm group" in m for m in messages)
    assert len(host.warm_ups()) == 6
    assert host.case_runs() == []
    # The back-off over, and hluk working, one case's probe closes the gate.
    clock.skip_back_off()
    assert result(run("print('up')"))[:4] == ("Success", "Finished", 0, "up\n")


def test_the_back_off_starts_at_a_second_doubles_with_each_failed_probe_and_starts_over(
    host: Host, monkeypatch: pytest.MonkeyPatch, clock: GateClock
) -> None:
    run("pass")
    monkeypatch.setenv("HLUK_STANDIN_SIGNAL", "SEGV")
    for i in range(3):
        sandbox_error(run(f"print({i})"))
    for back_off in (1, 2, 4, 8, 16, 30, 30):
        message = sandbox_error(run("print('waits')"))
        assert f"{AT_ONCE}: hluk failed to start" in message
        assert f"a case tries it again within {back_off} s)" in message
        # Not yet: still answered at once, without a probe.
        probes = len(host.warm_ups())
        clock.skip(back_off / 2)
        assert AT_ONCE in sandbox_error(run("print('not yet')"))
        assert len(host.warm_ups()) == probes
        # Past the back-off: one case probes (twice, as a probe that found nothing started is),
        # fails, and the next back-off is twice as long, up to the longest.
        clock.skip(back_off)
        assert AT_ONCE not in sandbox_error(run("print('tries')"))
        assert len(host.warm_ups()) - probes == 2

    # Up again: the gate closes; opened again later, it starts over from the first back-off.
    monkeypatch.delenv("HLUK_STANDIN_SIGNAL")
    clock.skip_back_off()
    assert result(run("print('up')"))[:4] == ("Success", "Finished", 0, "up\n")
    monkeypatch.setenv("HLUK_STANDIN_SIGNAL", "SEGV")
    for i in range(3):
        sandbox_error(run(f"print({i})"))
    assert "a case tries it again within 1 s)" in sandbox_error(run("print('waits')"))


def test_readiness_checks_are_not_counted_as_cases_answered_at_once(
    host: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, clock: GateClock
) -> None:
    caplog.set_level(logging.INFO, logger="verl_hyperlight")
    run("pass")
    monkeypatch.setenv("HLUK_STANDIN_SIGNAL", "SEGV")
    messages = [sandbox_error(run(f"print({i})")) for i in range(6)]
    # serve's /readyz and doctor see the open gate too, at once, but they are no cases.
    path, guest = _binary.hluk_path(), guest_for(URL, None)
    for _ in range(5):
        with pytest.raises(FailingFast):
            _gate.ensure_ready(path, guest)

    monkeypatch.delenv("HLUK_STANDIN_SIGNAL")
    clock.skip_back_off()
    assert result(run("print('up')"))[:4] == ("Success", "Finished", 0, "up\n")
    at_once = sum(AT_ONCE in m for m in messages)
    assert at_once == 4
    [closed] = logged(caplog, CLOSED)
    assert f"{at_once} cases were answered SandboxError at once" in closed


class RaceClock:
    """The gate's clock, with the interleaving of a fail-fast check and a recovering probe made
    certain: the probing thread (and the probe's own, which it starts) sees the back-off over;
    every other thread that reads the clock while the probe runs lets it finish (the gate
    recovers) before it reads a time within the back-off. Bounded waits: a gate that holds a
    lock across the clock only slows this down."""

    def __init__(self, before: float, after: float) -> None:
        self.before, self.after = before, after
        self.prober: threading.Thread | None = None
        self.probe: threading.Thread | None = None
        self.probing = threading.Event()
        self.caught_mid_check = threading.Event()
        self.recovered = threading.Event()

    def monotonic(self) -> float:
        if threading.current_thread() in (self.prober, self.probe):
            return self.after
        if self.probing.is_set() and not self.recovered.is_set():
            self.caught_mid_check.set()
            self.recovered.wait(5)
        return self.before


def test_checks_racing_a_probe_that_recovers_get_an_answer_never_an_internal_error(
    host: Host, monkeypatch: pytest.MonkeyPatch, clock: GateClock
) -> None:
    path, guest = _binary.hluk_path(), guest_for(URL, None)
    gate = _gate.gate(path, guest)

    def down(*args: object) -> _gate.Warmth:
        raise BackendError(Diagnosis("hluk at x failed (status 1)", "", "hluk-failed"))

    monkeypatch.setattr(_gate, "warm_up", down)
    for _ in range(_gate.OPEN_AFTER):
        with pytest.raises(BackendError):
            gate.ensure_ready()
    with pytest.raises(FailingFast):
        gate.ensure_ready()

    race = RaceClock(clock.now, clock.now + _gate.BACK_OFF_MAX_SECONDS + 1)
    monkeypatch.setattr(_gate, "time", race)

    def up(*args: object) -> _gate.Warmth:
        race.probe = threading.current_thread()
        race.probing.set()
        race.caught_mid_check.wait(5)  # a check is between its reads of the gate's state
        return _gate.Warmth(True, 0.0)

    monkeypatch.setattr(_gate, "warm_up", up)
    errors: list[BaseException] = []

    def probe() -> None:
        gate.ensure_ready()
        race.recovered.set()

    def hammer() -> None:
        while True:
            done = race.recovered.is_set()
            try:
                gate.ensure_ready()
            except FailingFast:
                pass  # the gate still open: a right answer
            except BaseException as exc:  # an internal error, as run_code would answer it
                errors.append(exc)
                return
            if done:
                return

    race.prober = threading.Thread(target=probe)
    hammers = [threading.Thread(target=hammer) for _ in range(16)]
    for thread in [race.prober, *hammers]:
        thread.start()
    for thread in [race.prober, *hammers]:
        thread.join(30)
    assert race.caught_mid_check.is_set()  # the interleaving did happen
    assert errors == []
    assert gate.state is _gate.State.CLOSED
    assert gate.ensure_ready() is None


MEMORY_HUNGRY = (
    "import time\nhoard = []\nwhile True:\n    hoard.append(b'x' * (8 << 20))\n"
    "    time.sleep(0.002)\n"
)


def test_a_batch_of_memory_hungry_solutions_is_theirs_and_does_not_open_the_gate(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    run("pass", memory=128)
    cases, probes = len(host.case_runs()), len(host.warm_ups())

    responses = in_threads(16, 8, lambda i: run(MEMORY_HUNGRY, memory=128))

    # Each guest's kernel aborted once the solution ran: the solution's failure, answered as
    # Sandbox Fusion answers an OOM kill, never retried, probed for, counted or logged.
    for response in responses:
        status, run_status, return_code, stdout, stderr = result(response)
        assert (status, run_status, return_code, stdout) == ("Failed", "Finished", 137, "")
        assert stderr.startswith("error: Guest aborted:")
    assert len(host.case_runs()) - cases == 16
    assert len(host.warm_ups()) - probes == 0
    assert logged(caplog, OPENED) == []
    assert _failures.log.counts() == {}
    # And the correct solutions after them score.
    later = in_threads(8, 8, lambda i: run(f"print({i})", memory=128))
    assert [result(r)[:4] for r in later] == [
        ("Success", "Finished", 0, f"{i}\n") for i in range(8)
    ]


def test_a_guest_kernel_abort_before_the_start_is_a_backend_failure_that_opens_the_gate(
    host: Host, monkeypatch: pytest.MonkeyPatch, fail_file: Path
) -> None:
    run("pass")
    fail_with(monkeypatch, fail_file, "Guest aborted: 1 ", 100)
    messages = [sandbox_error(run(f"print({i})")) for i in range(4)]
    assert all("Guest aborted: 1" in m for m in messages)
    assert [AT_ONCE in m for m in messages] == [False, False, True, True]
