"""hluks whose runner's report is whole, awaited to their end off their cases' path.

Once the report is whole the case is answered: what is left of hluk's run is its guest's
teardown and its exit, which tell the case nothing. Each such hluk is handed here, where one
thread of the process awaits the exits of all of them (an epoll set, which a hand-off joins
without waking the thread): a hluk that exits is reaped (`stop`, which closes its
descriptors), one still running `grace` seconds after its report is killed and reaped, its
overrun logged once per process as an operator's matter (a hluk slow to tear its guest down
holds a micro-VM's memory meanwhile). Once nothing is left to end, the thread waits
LINGER_SECONDS for the next hand-off before it ends, so that cases back to back do not each
start one (a thread's start is a tenth of a case's host CPU). `wait` ends them all, and the
thread (serve's stop, a worker's close), and a worker that exits kills and reaps those still
ending.
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


class _Enders:
    """The hluks being ended, and the thread that awaits their exits: their exit descriptors
    are in an epoll set, to which a hand-off adds one without waking the thread (it is woken
    only when the new hluk's deadline comes before the end of its wait)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ending: dict[int, _Ending] = {}
        self._changed = threading.Condition(self._lock)
        # Made with the first hand-off: the epoll set, and what wakes the thread in it (an
        # eventfd: one descriptor, no pipe's buffer).
        self._epoll: select.epoll | None = None
        self._wake = -1
        self._thread: threading.Thread | None = None
        self._leave = False  # `wait` asks the thread to end once nothing is left to end
        self._wakes_at = math.inf  # when the thread's wait ends, while it waits

    def hand(self, proc: Process, grace: float, path: str) -> None:
        """Have `proc` (its report whole) reaped once it exits, killed if it has not within
        `grace` seconds."""
        proc.answered()
        deadline = time.monotonic() + grace
        with self._lock:
            if self._epoll is None:
                self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
                self._epoll = select.epoll()
                self._epoll.register(self._wake, select.EPOLLIN)
            self._ending[proc.exit_fd] = _Ending(proc, grace, deadline, path)
            self._epoll.register(proc.exit_fd, proc.exit_events)
            self._leave = False
            wake = deadline < self._wakes_at
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="verl-hyperlight-ender", daemon=True
                )
                self._thread.start()
                wake = False
        if wake:
            os.eventfd_write(self._wake, 1)

    def wait(self, seconds: float) -> bool:
        """Wait for every hluk handed so far to be ended, at most `seconds`; whether they
        were."""
        deadline = time.monotonic() + seconds
        with self._lock:
            while self._ending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            thread = self._thread
            self._leave = True
        if thread is not None and thread is not threading.current_thread():
            # Its thread ends now that nothing is left to end: gone too when this returns.
            os.eventfd_write(self._wake, 1)
            thread.join(max(0.0, deadline - time.monotonic()))
        return True

    def end_now(self) -> None:
        """Kill and reap every hluk still ending (a worker that exits leaves none behind, nor
        to the kernel's pace of its process group's death)."""
        with self._lock:
            pending = list(self._ending.values())
        for one in pending:
            one.proc.stop()

    def _loop(self) -> None:
        assert self._epoll is not None
        epoll = self._epoll
        while True:
            now = time.monotonic()
            with self._lock:
                if self._ending:
                    self._wakes_at = min(one.deadline for one in self._ending.values())
                elif self._leave:
                    self._thread, self._wakes_at = None, math.inf
                    return
                else:  # lingering: a hand-off within LINGER_SECONDS keeps the thread
                    self._wakes_at = now + LINGER_SECONDS
                wait = max(0.0, self._wakes_at - now)
                lingering = not self._ending
            events = epoll.poll(wait)
            with self._lock:
                self._wakes_at = -math.inf  # a hand-off now finds it awake
                if lingering and not self._ending and not events:
                    self._thread, self._wakes_at = None, math.inf
                    return
            exited = []
            for fd, _ in events:
                if fd == self._wake:
                    try:
                        os.eventfd_read(self._wake)
                    except BlockingIOError:
                        pass
                    continue
                with self._lock:
                    one = self._ending.get(fd)
                if one is not None and one.proc.exited():
                    exited.append(fd)
            now = time.monotonic()
            with self._lock:
                overdue = [
                    fd
                    for fd, one in self._ending.items()
                    if fd not in exited and one.deadline <= now
                ]
                done = [(fd, self._ending[fd]) for fd in exited + overdue]
            for fd, one in done:
                try:  # before its descriptor is closed and its number reused
                    epoll.unregister(fd)
                except OSError:
                    pass  # closed already: end_now stopped it as the worker exits
                self._end(one, killed=fd in overdue)
                with self._lock:
                    del self._ending[fd]
                    self._changed.notify_all()

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


def wait(seconds: float) -> bool:
    """See _Enders.wait."""
    return _enders.wait(seconds)
