"""A notebook's hluk: its guest runs calls read from its stdin, one after another, and stays
up between them (``agent.notebook`` keeps it)."""

from __future__ import annotations

import dataclasses
import math
import os
import threading

from ..deadlines import Deadlines
from ..outcome import Ending, RawOutcome
from . import spawn
from .console import Console
from .watch import HLUK_STDERR_LIMIT, Tail, watch


class NotebookProcess:
    """A hluk whose guest runs calls read from its stdin (``runner.notebook``), one after
    another, each reported on the console as a case is. Its watch per call is a case's
    (``_watch``), which writes the call's request to hluk's stdin as the guest reads it; it
    stays up between calls, and is stopped by the first call that does not end with a whole
    report and the guest still running.

    Its calls are made by one thread at a time, its owner's; `stop` may come from any thread.
    Its state (alive, stopped) changes under its lock, as CPython guards a Popen's wait
    (``subprocess.Popen._waitpid_lock``): of two threads ending it, one kills and reaps it, and
    the other returns once that is done, with the same status."""

    # The largest request a call takes (protocol.request_lines: code of about 768 KiB). It is
    # written as the guest reads it, through a pipe of one page.
    capacity = 1024 * 1024
    # hluk keeps every console write of its guest in memory for as long as it runs (its
    # HostPrint appends each to a string that `run`'s drive loop never drains: hyperlight-
    # unikraft's src/lib.rs, GuestConfig::register; src/main.rs, drive). A notebook's hluk
    # lives across its calls, so past this much of its console (the calls' output, base64 in
    # frames) it is ended, and its notebook starts a new one, said to the model as any restart.
    console_limit = 64 * 1024 * 1024

    def __init__(self, argv: list[str]) -> None:
        self.path = argv[0]
        self.proc = spawn.start(argv, None, stdin=True)
        self.stderr = Tail(HLUK_STDERR_LIMIT)
        self._lock = threading.Lock()
        self._alive = True
        self.console_bytes = 0  # what hluk holds of its console, since it started
        assert self.proc.stdin is not None
        os.set_blocking(self.proc.stdin, False)

    @property
    def alive(self) -> bool:
        """Whether it is up: not stopped yet."""
        return self._alive

    @property
    def spent(self) -> bool:
        """Whether hluk holds `console_limit` of its console: time for a new one."""
        return self.console_bytes >= self.console_limit

    def await_up(
        self, nonce: str, deadlines: Deadlines, cancel: threading.Event | None = None
    ) -> RawOutcome:
        """Wait, within `deadlines.startup`, for the guest's report that it is up (the
        notebook's nonce): finished when it is, and the process is stopped when it is not."""
        return self._watch(Console(nonce), deadlines.for_run(math.inf), cancel)

    def call(
        self, nonce: str, request: bytes, deadlines: Deadlines, cancel: threading.Event | None
    ) -> RawOutcome:
        """Hand the guest one request (protocol.request_lines, at most `capacity` bytes) and
        watch for its report. A call whose code does not start within its run's deadline (the
        guest did not read it all: the notebook's earlier code keeps the guest busy) has timed
        out, as one that runs past it."""
        assert self.alive
        call = deadlines.for_run(deadlines.run, startup=deadlines.run)
        outcome = self._watch(Console(nonce), call, cancel, request)
        if outcome.ending is Ending.STARTUP_TIMEOUT:
            outcome = dataclasses.replace(outcome, ending=Ending.TIMED_OUT, started=True)
        return outcome

    def _watch(
        self,
        console: Console,
        deadlines: Deadlines,
        cancel: threading.Event | None,
        request: bytes = b"",
    ) -> RawOutcome:
        try:
            watched = watch(
                self.proc,
                console,
                self.stderr,
                deadlines,
                cancel,
                request=request,
            )
        except BaseException:
            self.stop()
            raise
        finally:
            self.console_bytes += console.total
        if watched.guest_waits:
            return watched.outcome(self.path, None, self.stderr)
        return watched.outcome(self.path, self.stop(), self.stderr)

    def stop(self) -> int | None:
        """End it (once): nothing of its group outlives the call."""
        with self._lock:
            self._alive = False
            return self.proc.stop()
