"""What one hluk run produced, and whose its ending is: the solution's, or the backend's.

``hluk.watch`` decides the Ending of a run, once; ``verdict`` says whose it is, which is all
that the case path, the guest's gate and the response need to know of it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from .guest import protocol

# hluk's last line when the guest process ended outside its driver.
GUEST_EXIT = re.compile(r"error: the guest exited with status (-?\d+)")


class Ending(enum.Enum):
    """How a hluk run ended, decided once (``_decide``)."""

    # The solution's own endings, answered as Sandbox Fusion answers them.
    FINISHED = "finished"  # the runner reported the end and copied the whole output out
    TIMED_OUT = "timed-out"  # the solution ran past run_timeout and was stopped
    DEADLOCKED = "deadlocked"  # hluk found every guest thread blocked forever
    GUEST_DIED = "guest-died"  # the guest process ended outside the runner (killed in the guest)
    # The guest kernel aborted while the solution ran: hluk has no handling of a guest out of
    # memory, and a guest that exhausts its memory ends this way (`error: Guest aborted: ...`)
    GUEST_ABORTED = "guest-aborted"
    CONSOLE_LIMIT = "console-limit"  # the console passed CONSOLE_LIMIT and was stopped
    # hluk ended with the status of the runner's failed call and no report: the solution broke
    # the runner (replaced or closed what it reports with)
    BROKEN = "broken"
    # Neither the solution's nor the backend's: the case was not run as asked (a request file
    # the guest cannot write), or its caller cancelled it.
    REFUSED = "refused"
    CANCELLED = "cancelled"
    # Failures of the backend.
    NOT_STARTED = "not-started"  # hluk exited before the solution started
    STARTUP_TIMEOUT = "startup-timeout"  # the solution did not start within its deadline
    HLUK_FAILED = "hluk-failed"  # hluk's own error (an `error:` line, a panic) after the start
    KILLED = "killed"  # hluk was killed by a signal this package did not send
    COPY_OUT_TIMEOUT = "copy-out-timeout"  # the output was not copied out within its budget
    # The report came whole, but an output held less than its end frame announced (the
    # console lost part of it)
    SHORT_OUTPUT = "short-output"
    SPAWNER_DIED = "spawner-died"  # the spawner that started hluk died (hluk was killed then)


_SOLUTION_ENDINGS = frozenset(
    [
        Ending.FINISHED,
        Ending.TIMED_OUT,
        Ending.DEADLOCKED,
        Ending.GUEST_DIED,
        Ending.GUEST_ABORTED,
        Ending.CONSOLE_LIMIT,
        Ending.BROKEN,
    ]
)


class Verdict(enum.Enum):
    """Whose an ending is, which is all that the case path, the guest's gate and the response
    need to know of it (``verdict``)."""

    # Answered from the outcome, as Sandbox Fusion answers the solution's doing.
    SOLUTIONS = "the solution's"
    # Answered SandboxError; neither retried, nor logged as a failure, nor a sign of the backend.
    REFUSED = "refused"
    CANCELLED = "cancelled"
    # hluk failed before the solution started: answered SandboxError after one more try (nothing
    # of the solution ran), and counted toward the gate (hluk may have stopped starting guests).
    BACKEND_BEFORE_START = "backend failure before the start"
    # hluk failed once the solution ran: answered SandboxError, never retried (the solution
    # ran, and may have had effects); the guest did start, so hluk does start guests.
    BACKEND_AFTER_START = "backend failure after the start"


@dataclass(frozen=True)
class RawOutcome:
    """What one hluk run produced, before it is shaped into a response."""

    ending: Ending
    started: bool  # the runner's start frame came: the solution ran
    end: protocol.End | None  # the runner's report of the solution's end
    stdout: memoryview  # the output copied out (whole when FINISHED)
    stderr: memoryview
    fetched: dict[int, memoryview]  # the fetched files copied out, by their index
    hluk_status: int | None  # hluk's exit status (-N: killed by signal N); None if stopped
    hluk_error: str  # hluk's final `error:` line, or its panic, else ""
    hluk_stderr: str  # the end of hluk's stderr, as hluk wrote it
    # The end of the console text before the start: the driver's and the runner's own, never
    # the solution's.
    preamble: bytes
    refusal: str  # why the runner refused the case (REFUSED)
    restored: bool | None  # hluk's `restored=` log line, when run with --log-level info
    host_elapsed: float  # from the start frame (or the spawn) to the end frame or the stop
    limit: float  # the seconds of the deadline the run was held to last
    # From hluk's start (or its line) to the solution's start frame; None when it did not start
    startup_seconds: float | None = None

    @property
    def verdict(self) -> Verdict:
        """Whose the ending is (see ``verdict``)."""
        return verdict(self.ending, self.started)

    @property
    def guest_status(self) -> int | None:
        """The status of `the guest exited with status N`, when hluk said that."""
        match = GUEST_EXIT.search(self.hluk_error)
        return int(match.group(1)) if match else None


def verdict(ending: Ending, started: bool) -> Verdict:
    """Whose `ending` (as ``_decide`` decided it) is, the solution having `started` or not:
    decided here only, beside the Ending it follows from."""
    if ending in _SOLUTION_ENDINGS:
        return Verdict.SOLUTIONS
    if ending is Ending.REFUSED:
        return Verdict.REFUSED
    if ending is Ending.CANCELLED:
        return Verdict.CANCELLED
    return Verdict.BACKEND_AFTER_START if started else Verdict.BACKEND_BEFORE_START
