"""hluks whose runner's report is whole, awaited to their end off their cases' path.

Once the report is whole the case is answered: what is left of hluk's run is its guest's
teardown and its exit, which tell the case nothing. Each such hluk is handed here. Nothing
wakes for its exit: each hluk run, as it starts (``collect``), reaps those handed before that
have exited since (one poll(2) that does not wait, over their exit descriptors: cases back to
back reap each other's hluks, before the run, while the worker's caches are warm from the last
case rather than cold from the guest's run), and one thread of the process wakes only at the
earliest deadline, `grace` seconds after a report, when it reaps those that have exited and
kills and reaps those still running, their overrun logged once per process as an operator's
matter (a hluk slow to tear its guest down holds a micro-VM's memory meanwhile). So an exited
hluk waits at most its grace to be reaped (a zombie meanwhile, its descriptors kept), and a
case costs no thread a wake-up (on a nested VM, a wake-up costs more of the host's CPU than the
rest of the reaping). Once nothing is left to end, the thread waits LINGER_SECONDS for the next
hand-off before it ends, so that cases back to back do not each start one. `wait` ends them
all, and the thread (serve's stop, a worker's close), and a worker that exits kills and reaps
those still ending.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import select
import threading
import time
from dataclasses import dataclass

from ..errors import CauseCounts
from .spawn import Process

logger = logging.getLogger("verl_hyperlight")

# Said once per process: a hluk killed because it outlived its grace after a whole report.
_overruns = CauseCounts()
# How long the thread, with nothing left to end, waits for the next hand-off before it ends.
LINGER_SECONDS = 1.0


@dataclass
class _Ending:
    proc: Process
    grace: float
    deadline: float
    path: str
    taken: bool = False  # being ended, by one thread


class _Enders:
    """The hluks being ended, by their exit descriptors (also in a poll set, looked at without
    waiting), and the thread that ends them at their deadlines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ending: dict[int, _Ending] = {}
        self._poller = select.poll()
        self._changed = threading.Condition(self._lock)  # an ending ended: for `wait`
        self._woken = threading.Condition(self._lock)  # for the thread: a sooner deadline
        self._thread: threading.Thread | None = None
        self._leave = False  # `wait` asks the thread to end once nothing is left to end
        self._wakes_at = math.inf  # when the thread's wait ends, while it waits
        self._hands = 0  # hand-offs so far

    def hand(self, proc: Process, grace: float, path: str) -> None:
        """Have `proc` (its report whole) reaped once it exits, killed if it has not within
        `grace` seconds."""
        proc.answered()
        deadline = time.monotonic() + grace
        with self._lock:
            self._ending[proc.exit_fd] = _Ending(proc, grace, deadline, path)
            self._hands += 1
            self._poller.register(proc.exit_fd, proc.exit_events)
            self._leave = False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="verl-hyperlight-ender", daemon=True
                )
                self._thread.start()
            elif deadline < self._wakes_at:
                self._woken.notify()

    def wait(self, seconds: float) -> bool:
        """Wait for every hluk handed so far to be ended, at most `seconds`; whether they
        were."""
        deadline = time.monotonic() + seconds
        while True:
            self._collect(overdue=False)
            with self._lock:
                pending = [fd for fd, one in self._ending.items() if not one.taken]
                events = {fd: one.proc.exit_events for fd, one in self._ending.items()}
                if not self._ending:
                    thread = self._thread
                    self._leave = True
                    self._woken.notify()
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if not pending:  # another thread ends them now
                    self._changed.wait(left)
                    continue
            # Their exits, waited for here (the thread wakes only at their deadlines).
            poller = select.poll()
            for fd in pending:
                poller.register(fd, events[fd])
            poller.poll(math.ceil(min(left, 0.1) * 1000))
        if thread is not None and thread is not threading.current_thread():
            # Its thread ends now that nothing is left to end: gone too when this returns.
            thread.join(max(0.0, deadline - time.monotonic()))
        return True

    def collect(self) -> None:
        """Reap those handed that have exited (no wait)."""
        if self._ending:  # read without the lock: a hint, as most processes have none
            self._collect(overdue=False)

    def end_now(self) -> None:
        """Kill and reap every hluk still ending (a worker that exits leaves none behind, nor
        to the kernel's pace of its process group's death)."""
        with self._lock:
            pending = list(self._ending.values())
        for one in pending:
            one.proc.stop()

    def _collect(self, overdue: bool) -> None:
        """End those that have exited, and with `overdue` those past their deadline."""
        with self._lock:
            if not self._ending:
                return
            ready = {fd for fd, _ in self._poller.poll(0)}
            now = time.monotonic()
            done = []
            for fd, one in self._ending.items():
                if one.taken:
                    continue
                exited = fd in ready and one.proc.exited()
                if exited or (overdue and one.deadline <= now):
                    one.taken = True
                    # before its descriptor is closed and its number reused
                    self._poller.unregister(fd)
                    done.append((fd, one, not exited))
        if not done:
            return
        for _, one, killed in done:
            self._end(one, killed)
        with self._lock:
            for fd, one, _ in done:
                if self._ending.get(fd) is one:
                    del self._ending[fd]
            self._changed.notify_all()

    def _loop(self) -> None:
        lingering_since: int | None = None  # the hand-offs counted as its linger began
        while True:
            with self._lock:
                now = time.monotonic()
                if self._ending:
                    lingering_since = None
                    self._wakes_at = min(one.deadline for one in self._ending.values())
                elif self._leave or lingering_since == self._hands:
                    self._thread, self._wakes_at = None, math.inf
                    return
                else:
                    # Lingering: a hand-off within LINGER_SECONDS keeps the thread, also one
                    # whose hluk a later case reaped meanwhile.
                    lingering_since = self._hands
                    self._wakes_at = now + LINGER_SECONDS
                self._woken.wait(max(0.0, self._wakes_at - now))
                self._wakes_at = -math.inf  # a hand-off now finds it awake
            self._collect(overdue=True)

    @staticmethod
    def _end(one: _Ending, killed: bool) -> None:
        status = one.proc.stop()
        if killed and _overruns.first("exit-grace"):
            logger.warning(
                "verl-hyperlight: %s had not ended %.0f s after its guest's report was whole "
                "and was killed (its cases were answered at the report; a hluk slow to tear "
                "its micro-VM down holds its memory meanwhile; said once per process)",
                one.path,
                one.grace,
            )
        elif status is not None and status < 0:
            logger.debug(
                "verl-hyperlight: %s ended by signal %d after its report", one.path, -status
            )


_enders = _Enders()


@atexit.register
def _end_at_exit() -> None:
    _enders.end_now()


def _forget_in_child() -> None:
    """A forked worker ends its own hluks: the parent's are the parent's to end."""
    global _enders
    _enders = _Enders()


os.register_at_fork(after_in_child=_forget_in_child)


def hand(proc: Process, grace: float, path: str) -> None:
    """See _Enders.hand."""
    _enders.hand(proc, grace, path)


def collect() -> None:
    """See _Enders.collect: each hluk run starting reaps those ended since."""
    _enders.collect()


def wait(seconds: float) -> bool:
    """See _Enders.wait."""
    return _enders.wait(seconds)
