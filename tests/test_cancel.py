"""A case's cancel (verl_hyperlight/cancel.py): a `Cancel` wakes what waits for the case the
moment it is set, so that nothing waiting on one wakes to look at it (issue 36: "nothing should
poll"); a plain threading.Event, as a caller of run_code may pass, is still honoured, looked at
every POLL_SECONDS. How often a waiting thread woke is read from the kernel: the voluntary
context switches of that thread, counted over a stretch of its wait."""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable

import pytest
from hostside import Host, WaitingCase, descendants_of, noting_the_start, processes_with, wait_for

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
