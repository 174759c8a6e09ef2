"""A case's cancel (verl_hyperlight/cancel.py): a `Cancel` wakes what waits for the case the
moment it is set, so that nothing waiting on one wakes to look at it (issue 36: "nothing should
poll"); a plain threading.Event, as a caller of run_code may pass, is still honoured, looked at
every POLL_SECONDS. How often a waiting thread woke is read from the kernel: the voluntary
context switches of that thread, counted over a stretch of its wait."""

from __future__ import annotations

import errno
import os
import select
import threading
import time
from collections.abc import Callable

import pytest
from hostside import (
    Host,
    Usage,
    WaitingCase,
    descendants_of,
    noting_the_start,
    processes_with,
    wait_for,
)

from verl_hyperlight import cancel as cancels
from verl_hyperlight.case import api

URL = "hyperlight://"
# How long a waiting thread's wake-ups are counted: a plain Event's wait wakes 1 / POLL_SECONDS
# times a second (5), a Cancel's not at all but for what happens to the case.
STRETCH_SECONDS = 2.0


def test_a_waker_runs_when_its_cancel_is_set_and_never_after_its_block() -> None:
    cancel = cancels.Cancel()
    calls: list[str] = []
    with cancels.on_set(cancel, lambda: calls.append("inside")) as woken:
        assert woken
    with cancels.on_set(cancel, lambda: calls.append("second")):
        cancel.set()
    cancel.set()  # no block is open: nothing runs
    assert calls == ["second"]
    with cancels.on_set(threading.Event(), lambda: calls.append("plain")) as woken:
        assert not woken  # a plain Event cannot wake anyone: the wait looks at it
    with cancels.on_set(None, lambda: calls.append("none")) as woken:
        assert not woken
    assert calls == ["second"]


def test_a_wake_descriptor_is_readable_once_set_and_closed_after_its_block() -> None:
    cancel = cancels.Cancel()
    poller = select.poll()
    with cancels.wake_descriptor(cancel) as fd:
        assert fd >= 0
        poller.register(fd, select.POLLIN)
        assert poller.poll(0) == []
        threading.Timer(0.1, cancel.set).start()
        assert poller.poll(10_000) == [(fd, select.POLLIN)]
    with pytest.raises(OSError):
        os.fstat(fd)
    with cancels.wake_descriptor(threading.Event()) as fd:
        assert fd == -1
    with cancels.wake_descriptor(None) as fd:
        assert fd == -1


def test_the_wait_of_a_plain_event_is_bounded_and_of_a_cancel_is_not() -> None:
    assert cancels.longest_sleep(None, False, 30.0) == 30.0
    assert cancels.longest_sleep(cancels.Cancel(), True, None) is None
    assert cancels.longest_sleep(threading.Event(), False, None) == cancels.POLL_SECONDS
    assert cancels.longest_sleep(threading.Event(), False, 0.01) == 0.01


CANCELS: dict[str, Callable[[], threading.Event]] = {
    "Cancel": cancels.Cancel,
    "plain Event": threading.Event,
}


@pytest.mark.parametrize("kind", list(CANCELS))
def test_a_running_case_sleeps_until_its_cancel_and_then_ends_at_once(
    host: Host, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    api.run_code(URL, "pass", None, None, 10, None)  # warm: the wait watched is the run's
    started = noting_the_start(monkeypatch)
    case = WaitingCase("import time\ntime.sleep(60)", CANCELS[kind]())
    assert started.wait(30)
    woke = case.wake_ups(STRETCH_SECONDS)
    print(f"\n{kind}: the case's thread woke {woke} times in {STRETCH_SECONDS:.0f} s")
    if kind == "Cancel":
        assert woke <= 2  # the guest writes nothing meanwhile: nothing wakes the watch
    else:
        assert woke >= STRETCH_SECONDS / cancels.POLL_SECONDS / 2
    assert api.CASE_CANCELLED in case.cancelled()
    assert wait_for(lambda: not processes_with(str(host.tmpdir)))


@pytest.mark.parametrize("kind", list(CANCELS))
def test_a_case_waiting_for_its_guests_warm_up_sleeps_until_its_cancel(
    host: Host, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # A cold cache and a slow pull: the case waits in its gate for the probe.
    monkeypatch.setenv("HLUK_STANDIN_PULL_SECONDS", "30")
    case = WaitingCase("print(1)", CANCELS[kind]())
    assert wait_for(probes, limit=30)  # the probe runs
    woke = case.wake_ups(STRETCH_SECONDS)
    print(f"\n{kind}: the waiting case's thread woke {woke} times in {STRETCH_SECONDS:.0f} s")
    if kind == "Cancel":
        assert woke <= 2
    else:
        assert woke >= STRETCH_SECONDS / cancels.POLL_SECONDS / 2
    assert "cancelled" in case.cancelled()
    # The probe, which no case waits for any more, is cancelled too.
    assert wait_for(lambda: not probes(), limit=30)


def probes() -> list[int]:
    """This process's hluks that probe a guest (the warm-up's)."""
    return [pid for pid, argv in descendants_of(os.getpid()).items() if b".probe(" in argv]


def test_with_no_descriptor_free_for_its_wake_a_cancel_is_looked_at_as_a_plain_events(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker at its descriptor limit (a server's full queue past 1,024): the eventfd cannot
    # be made, the wait falls back to looking every POLL_SECONDS, and the case is cancelled.
    def no_descriptor(*_: object) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    api.run_code(URL, "pass", None, None, 10, None)
    monkeypatch.setattr(os, "eventfd", no_descriptor)
    started = noting_the_start(monkeypatch)
    case = WaitingCase("import time\ntime.sleep(60)", cancels.Cancel())
    assert started.wait(30)
    assert case.wake_ups(1.0) >= 1.0 / cancels.POLL_SECONDS / 2
    assert api.CASE_CANCELLED in case.cancelled()


@pytest.mark.once
def test_64_cases_in_flight_sleep_until_their_cancels_and_leave_nothing(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As serve holds them at --max-concurrent 64: each case's wait is one poll with an eventfd
    # more; none wakes while the guests sleep, all are cancelled at once, and every eventfd,
    # thread and hluk goes.
    api.run_code(URL, "pass", None, None, 10, None)
    before = Usage.now(host)
    starts = noting_the_start(monkeypatch)
    sleeping = "import time\ntime.sleep(600)"
    cases = [WaitingCase(sleeping, cancels.Cancel(), run_timeout=600) for _ in range(64)]
    assert starts.wait(300, count=64), f"{starts.count} of 64 started"
    woke = -sum(case.switches() for case in cases)
    time.sleep(STRETCH_SECONDS)
    woke += sum(case.switches() for case in cases)
    print(f"\n64 cases in flight: their threads woke {woke} times in {STRETCH_SECONDS:.0f} s")
    assert woke <= 64  # a plain Event's would be 64 x 10
    for case in cases:
        case.cancel.set()
    for case in cases:
        assert api.CASE_CANCELLED in case.cancelled()
    assert Usage.now(host).minus(before) == Usage(0, 0, 0, 0)
    assert wait_for(lambda: not processes_with(str(host.tmpdir)), limit=30)
