"""One hluk run watched to its end, under its deadlines.

hluk's console (the guest's merged stdout and stderr) is read as it arrives and scanned for the
runner's frames (``guest/protocol.py``; ``console`` decodes them), decoding the output as it
comes, so a case holds its output once; its stderr carries hluk's own messages, of which the end
is kept. One deadline holds at a time, the phase's (start-up, the solution's run, the copy-out
of its output), and a watch ends once the runner's report is whole, a deadline passes, or the
caller cancels (a ``cancel.Cancel`` wakes the watch when set). How the run ended is decided
once, in ``_decide``, from what hluk and the runner said; whose that ending is, in
``outcome``; what a backend failure means and how to fix it, in ``diagnosis``.
"""

from __future__ import annotations

import math
import os
import re
import select
import threading
import time
from collections.abc import Callable

from .. import cancel as cancels
from .. import diagnosis
from ..deadlines import Deadlines
from ..guest import protocol
from ..outcome import GUEST_EXIT, Ending, RawOutcome
from . import ending, spawn
from .console import READ_SIZE, Console

# The console carries both streams base64-encoded, with framing; beyond this the guest is
# misbehaving (writing to the console around the runner) and is stopped.
CONSOLE_LIMIT = 2 * (protocol.OUTPUT_LIMIT * 4 // 3) + (1 << 20)
# Of hluk's stderr, the end is kept: its decisive `error:` line comes last.
HLUK_STDERR_LIMIT = 64 * 1024
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# What hluk logs of the snapshot at --log-level info: restored from it, or taken.
_RESTORED = re.compile(r"\brestored=(true|false)\b")
# hluk's last line when the guest kernel aborts (hyperlight's GuestAborted, which hluk prints
# as `error: Guest aborted: <code> <message>` and exits 1).
_GUEST_ABORTED = "error: Guest aborted:"


class Tail:
    """The last `limit` bytes written to a pipe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > 2 * self.limit:
            del self.data[: -self.limit]

    def text(self) -> str:
        return _ANSI.sub("", bytes(self.data[-self.limit :]).decode(errors="replace"))

    def pulling(self) -> bool:
        """Whether hluk announced an image pull it has not said the end of. Off a terminal it
        writes `pulling IMAGE...` as the pull begins, then nothing until `pulled IMAGE ...`
        (hyperlight-unikraft's src/cli/rootfs.rs): a pull is silent while it progresses."""
        return _line_at(self.data, b"pulling ") > _line_at(self.data, b"pulled ")


def _line_at(data: bytearray, start: bytes) -> int:
    """Where the last line of `data` beginning with `start` begins (-1: none does)."""
    found = data.rfind(b"\n" + start)
    if found >= 0:
        return found + 1
    return 0 if data.startswith(start) else -1


def final_error(stderr: str) -> str:
    """hluk's decisive message: its last `error:` line (hluk writes it last), else a panic."""
    if stderr.startswith("error: "):
        return stderr.strip()
    index = stderr.rfind("\nerror: ")
    if index >= 0:
        return stderr[index + 1 :].strip()
    index = stderr.find("panicked at")
    if index >= 0:
        return stderr[stderr.rfind("\n", 0, index) + 1 :].strip()[:1000]
    return ""


def run(
    argv: list[str],
    nonce: str,
    deadlines: Deadlines,
    cwd: str | None = None,
    cancel: threading.Event | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> RawOutcome:
    """Run hluk with `argv` (in `cwd`) until the runner reports the case done, a phase passes
    its deadline (the start-up, the solution's run counted from its start in the guest to its
    end, the copy-out; with `deadlines.stall`, hluk must also show progress before the start:
    a run that writes nothing for that long, other than during an image pull it announced, is
    stopped as not started in time), or `cancel` is set. `meanwhile` is done once hluk is
    started, while it starts the guest. The run's clock starts before anything else: before
    hluk is spawned."""
    began = time.monotonic()
    ending.collect()
    proc = spawn.start(argv, cwd)
    if meanwhile is not None:
        try:
            meanwhile()
        except BaseException:
            proc.stop()
            raise
    return run_started(proc, argv[0], nonce, deadlines, cancel, began)


def run_started(
    proc: spawn.Process,
    path: str,
    nonce: str,
    deadlines: Deadlines,
    cancel: threading.Event | None,
    began: float,
) -> RawOutcome:
    """`run`, of a hluk started: watched from now on, its deadlines counted from `began` (when
    it was started, or sent its case), and stopped at the end."""
    stderr = Tail(HLUK_STDERR_LIMIT)
    try:
        watched = watch(proc, Console(nonce), stderr, deadlines, cancel, began=began)
    except BaseException:
        proc.stop()
        raise
    if watched.stopped is None and watched.console.done and not watched.exited:
        # The report is whole: the case is answered now, and hluk's teardown and exit are
        # awaited off its path (killed past exit_grace).
        ending.hand(proc, deadlines.exit_grace, path)
        return watched.outcome(path, None, stderr)
    # Whatever else ended the watch, nothing of this group outlives the call.
    return watched.outcome(path, proc.stop(), stderr)


class _Clock:
    """How long a watch waits for hluk, and what passing that means. One deadline holds at a
    time, the phase's (`deadlines`): the start-up (from the watch's start), the solution's run
    (from its start frame), the copy-out of its output (its own budget, from its end frame),
    each replacing the last; `limit` is its seconds. Once hluk is ending (its report whole, its
    pipes ended, its exit seen), the deadline is cut to what that state still needs. Before the
    start, with `deadlines.stall`, hluk must also show progress: `stall_at` runs from its last
    output, but not through an image pull it announced (silent while it progresses)."""

    # Made for every case, and read on each of its wake-ups.
    __slots__ = (
        "at", "deadlines", "ended_at", "last_output", "limit", "spawned", "stall_at",
        "started_at",
    )  # fmt: skip

    def __init__(self, deadlines: Deadlines, began: float | None = None) -> None:
        self.deadlines = deadlines
        self.spawned = time.monotonic() if began is None else began
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.last_output = self.spawned
        self.limit = deadlines.startup
        self.at = self.spawned + deadlines.startup
        stall = deadlines.stall
        self.stall_at = math.inf if stall is None else self.spawned + stall

    def overrun(self) -> Ending:
        """The limit hluk passed, when the deadline passes while it runs on."""
        if self.started_at is None:
            return Ending.STARTUP_TIMEOUT
        if self.ended_at is None:
            return Ending.TIMED_OUT
        return Ending.COPY_OUT_TIMEOUT

    def follow(self, now: float, pipes: _Pipes, output: bool) -> None:
        """Move the deadlines on with what hluk and the runner just said (`output`: anything)."""
        console = pipes.console
        if output:
            self.last_output = now
        deadlines = self.deadlines
        if self.started_at is None and console.started:
            self.started_at, self.limit = now, deadlines.run
            self.at = now + deadlines.run
        if self.ended_at is None and console.end is not None:
            # The solution has ended: its clock stops, the copy-out has its own.
            self.ended_at, self.limit = now, deadlines.copy_out_budget(console.end.copied)
            self.at = now + self.limit
        if pipes.exited:
            self.at = min(self.at, now + deadlines.drain)
        elif not pipes.reading:
            # Its pipes have ended, so its exit is on its way: cheaper waited for than
            # killed.
            self.at = min(self.at, now + deadlines.exit_notice)
        if (
            deadlines.stall is None
            or self.started_at is not None
            or not pipes.reading
            or pipes.exited
            or pipes.stderr.pulling()
        ):
            self.stall_at = math.inf
        else:
            self.stall_at = self.last_output + deadlines.stall


_NOTHING = memoryview(b"")


class _Pipes:
    """hluk's console and stderr, read as they come, and its exit, polled with them; and a
    notebook call's request, written to hluk's stdin as it takes it (hluk reads its stdin as
    the guest reads, 4 KiB at a time), so that no pipe needs to hold a request whole."""

    # made per case
    __slots__ = ("console", "exited", "poller", "proc", "reading", "stderr", "unwritten", "woken")

    def __init__(
        self, proc: spawn.Process, console: Console, stderr: Tail, request: bytes = b""
    ) -> None:
        self.proc = proc
        self.console = console
        self.stderr = stderr
        self.exited = False
        # poll(2), not epoll: for three descriptors it needs no kernel object made, filled and
        # closed per case; nor select(2), which fails past descriptor 1023.
        self.poller = select.poll()
        self.reading = {proc.stdout, proc.stderr}
        for fd in self.reading:
            self.poller.register(fd, select.POLLIN)
        self.poller.register(proc.exit_fd, proc.exit_events)
        self.woken = -1  # readable once the case's cancel is set (cancel.wake_descriptor)
        self.unwritten = memoryview(request) if request else _NOTHING
        if request:
            assert proc.stdin is not None
            self.poller.register(proc.stdin, select.POLLOUT)

    def running(self) -> bool:
        """Whether hluk runs on: its report not whole, its pipes open, its exit not seen."""
        return bool(self.reading) and not (self.exited or self.console.done)

    def read(self, wait: float) -> bool:
        """Read what hluk writes within `wait` seconds, and see whether it exited; whether it
        wrote anything."""
        output = False
        for fd, _ in self.poller.poll(math.ceil(min(wait, 86400.0) * 1000)):
            if fd == self.proc.exit_fd:
                if self.proc.exited():
                    self.poller.unregister(fd)
                    self.exited = True
                continue
            if fd == self.proc.stdin:
                self._write(fd)
                continue
            if fd == self.woken:
                continue  # the case's cancel, set: the watch looks at it next
            if fd == self.proc.stdout:
                ended = not self.console.read(fd)
            elif chunk := os.read(fd, READ_SIZE):
                self.stderr.add(chunk)
                ended = False
            else:
                ended = True
            if ended:
                self.poller.unregister(fd)
                self.reading.discard(fd)
            else:
                output = True
        return output

    def _write(self, fd: int) -> None:
        """Write to hluk's stdin what its pipe takes of the request: nothing more once all is
        written, or once the pipe has no reader (hluk's end then shows on its other pipes)."""
        try:
            self.unwritten = self.unwritten[os.write(fd, self.unwritten) :]
        except BlockingIOError:
            return
        except OSError:
            self.poller.unregister(fd)
            return
        if not self.unwritten:
            self.poller.unregister(fd)


class _Watched:
    """One report watched for on a hluk's console: its clocks, why the watch stopped hluk
    (`stopped`, None when it did not), whether hluk's exit was seen, and whether the request
    (a notebook call's) was written whole."""

    # made per case
    __slots__ = ("clock", "console", "exited", "proc", "stopped", "written")

    def __init__(self, pipes: _Pipes, clock: _Clock, stopped: Ending | None) -> None:
        self.proc = pipes.proc
        self.console = pipes.console
        self.exited = pipes.exited
        self.written = not pipes.unwritten
        self.clock = clock
        self.stopped = stopped

    @property
    def guest_waits(self) -> bool:
        """Whether a notebook's guest waits for its next call: the report whole, hluk left
        running, and the guest not ending."""
        return (
            self.console.whole
            and self.written
            and self.stopped is None
            and not (self.console.last or self.exited)
        )

    def outcome(self, path: str, status: int | None, stderr: Tail) -> RawOutcome:
        """What the run produced; `status` hluk's exit status once it was stopped (None while
        it runs on: a notebook's report is whole and its guest waits for the next call)."""
        proc, console, stopped, clock = self.proc, self.console, self.stopped, self.clock
        if proc.error:
            raise diagnosis.cannot_start(path, proc.error, proc.error_number)
        if proc.lost and stopped is None:
            stopped = Ending.SPAWNER_DIED
        finished = clock.ended_at if clock.ended_at is not None else time.monotonic()
        hluk_stderr = stderr.text()
        hluk_error = final_error(hluk_stderr)
        hluk_status = None if stopped is not None else status
        restored = _RESTORED.findall(hluk_stderr)
        began = clock.started_at if clock.started_at is not None else clock.spawned
        preamble = console.preamble()
        outcome = RawOutcome(
            ending=_decide(console, stopped, hluk_status, hluk_error),
            started=console.started,
            end=console.end,
            stdout=console.stream("stdout"),
            stderr=console.stream("stderr"),
            fetched={index: output.view() for index, output in console.files.items()},
            hluk_status=hluk_status,
            hluk_error=hluk_error,
            hluk_stderr=hluk_stderr,
            preamble=preamble,
            refusal=console.refusal or "",
            restored=restored[-1] == "true" if restored else None,
            host_elapsed=finished - began,
            limit=clock.limit,
            startup_seconds=None if clock.started_at is None else clock.started_at - clock.spawned,
        )
        console.release()
        return outcome


def watch(
    proc: spawn.Process,
    console: Console,
    stderr: Tail,
    deadlines: Deadlines,
    cancel: threading.Event | None = None,
    request: bytes = b"",
    began: float | None = None,
) -> _Watched:
    """Read hluk's console and stderr until the runner's report on `console` is done, or a
    limit or `cancel` stops it (see run), writing `request` to hluk's stdin meanwhile. hluk is
    left running: its caller ends it, or keeps it for a notebook's next call."""
    clock = _Clock(deadlines, began)
    pipes = _Pipes(proc, console, stderr, request)
    stopped = _read_until_over(pipes, clock, cancel)
    return _Watched(pipes, clock, stopped)


def _read_until_over(pipes: _Pipes, clock: _Clock, cancel: threading.Event | None) -> Ending | None:
    """Read hluk's pipes until the watch is over; why it stops hluk, if it does."""
    if cancel is None:  # most cases (verl's): nothing to wake the watch but hluk
        return _read_until_stopped(pipes, clock, None, False)
    with cancels.wake_descriptor(cancel) as woken:
        if woken >= 0:
            pipes.woken = woken
            pipes.poller.register(woken, select.POLLIN)
        try:
            return _read_until_stopped(pipes, clock, cancel, woken >= 0)
        finally:
            if woken >= 0:
                pipes.poller.unregister(woken)  # before its number is another's


def _read_until_stopped(
    pipes: _Pipes, clock: _Clock, cancel: threading.Event | None, woken: bool
) -> Ending | None:
    """_read_until_over's loop; `woken`: whether setting `cancel` wakes its poll."""
    console = pipes.console
    while pipes.reading or not pipes.exited:
        now = time.monotonic()
        if now >= clock.at:
            # Once hluk is ending, its deadline only bounds how long its end is waited for.
            return clock.overrun() if pipes.running() else None
        if now >= clock.stall_at:
            assert clock.deadlines.stall is not None
            clock.limit = clock.deadlines.stall
            return Ending.STARTUP_TIMEOUT
        if cancel is not None and cancel.is_set():
            return Ending.CANCELLED
        wait = cancels.longest_sleep(cancel, woken, min(clock.at, clock.stall_at) - now)
        output = pipes.read(wait)
        clock.follow(time.monotonic(), pipes, output)
        if console.done:
            return None  # the whole report: hluk's teardown and exit add nothing to it
        if console.total > CONSOLE_LIMIT:
            return Ending.CONSOLE_LIMIT
        if console.refusal is not None:
            return None
    return None


def _decide(
    console: Console, stopped: Ending | None, hluk_status: int | None, error: str
) -> Ending:
    """How the run ended: the one place that decides it."""
    if console.done:
        # The runner's whole report, whatever hluk did after it; unless an output came short
        # of what the end frame announced (the console lost part of it).
        return Ending.FINISHED if console.whole else Ending.SHORT_OUTPUT
    if console.refusal is not None:
        return Ending.REFUSED
    if stopped is Ending.CONSOLE_LIMIT and not console.started:
        return Ending.NOT_STARTED  # a flood before the start is hluk's or its driver's
    if stopped is not None:
        return stopped
    if hluk_status is not None and hluk_status < 0:
        return Ending.KILLED
    if not console.started:
        return Ending.NOT_STARTED
    # After the start only hluk's own stderr decides, never the console the solution wrote.
    if GUEST_EXIT.match(error):
        return Ending.GUEST_DIED
    if error.startswith("error: the guest is deadlocked"):
        return Ending.DEADLOCKED
    if error.startswith(_GUEST_ABORTED):
        return Ending.GUEST_ABORTED
    if error:
        return Ending.HLUK_FAILED
    # hluk exits silently with the status of a failed call: the runner's call failed after
    # the solution started, which only the solution can have caused.
    return Ending.BROKEN
