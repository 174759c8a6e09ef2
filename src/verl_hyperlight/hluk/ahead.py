"""A case's hluk started ahead of its case (a ready guest's, ``case.ready``): up and waiting
until its case is written into its mounted directory, then watched as any case's run."""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable

from ..deadlines import Deadlines
from ..guest import protocol
from ..outcome import RawOutcome
from . import ending, spawn
from .watch import run_started


class AheadProcess:
    """A case's hluk started before its case: its guest restores and waits
    (``runner.await_case``) for the line that `go` sends once the case is written into its
    mounted directory; from then on it is watched as ``watch.run`` watches a case, to its
    end. Until `go`, nothing reads its pipes:
    hluk writes nothing there while its guest waits (what it might, the pipes hold). Made and
    handed over by one thread at a time; `stop` may come from any."""

    __slots__ = ("nonce", "path", "proc", "started_at")

    def __init__(self, argv: list[str], nonce: str, cwd: str | None) -> None:
        self.path, self.nonce = argv[0], nonce
        self.proc = spawn.start(argv, cwd, stdin=True)
        self.started_at = time.monotonic()

    def up(self) -> bool:
        """Whether hluk is still running (a poll, no wait): a guest that died while it waited
        is not one to hand a case to."""
        poller = select.poll()
        poller.register(self.proc.exit_fd, self.proc.exit_events)
        return not (poller.poll(0) and self.proc.exited())

    def go(
        self,
        deadlines: Deadlines,
        cancel: threading.Event | None,
        meanwhile: Callable[[], None],
    ) -> RawOutcome | None:
        """Start the case written for it, do `meanwhile` while its solution starts, and watch
        it to its end (as a case, the start-up deadline counted from the line); None, hluk
        stopped, when it had ended before it could take the line (nothing of the case ran)."""
        stdin = self.proc.stdin
        assert stdin is not None
        ending.collect()
        began = time.monotonic()  # the run's clock starts with its line
        try:
            os.write(stdin, protocol.GO + b"\n")  # a pipe takes a short write whole
        except OSError:
            self.proc.stop()
            return None
        self.proc.close_stdin()  # then its input ends, as a case's from /dev/null does
        try:
            meanwhile()
        except BaseException:
            self.proc.stop()
            raise
        return run_started(self.proc, self.path, self.nonce, deadlines, cancel, began)

    def stop(self) -> None:
        """End it, unused (once): nothing of its group outlives the call."""
        self.proc.stop()

    def forget(self) -> None:
        """In a forked child, which must not end its parent's hluk: close the child's copies of
        its descriptors."""
        proc = self.proc
        for fd in (proc.stdout, proc.stderr, proc.stdin, proc.exit_fd):
            if fd is not None and fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
