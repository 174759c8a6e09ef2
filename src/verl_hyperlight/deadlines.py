"""Every limit a case, a warm-up and a request are held to, named by phase in one typed object,
as httpx's Timeout names its phases: made from the settings when the work begins
(`for_case`), and passed down, so that each phase reads its own limit from one place.

A case's phases follow one another, one limit holding at a time (``hluk.watch``): the start-up
(from hluk's start to the solution's), the solution's run (its run_timeout), the copy-out of
its output (a budget of its own, never run_timeout), then hluk's end (a grace, then its pipes'
drain). A warm-up is held to `warm_up` in all, and before its guest starts to `stall` of
silence outside an image pull. serve reads a request's body within `body_read`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from . import settings

# Copying the output out after the solution ended has a budget of its own, never run_timeout:
# this long, and a second more per MiB announced (at most 58 s for two full streams and the
# fetched files' 16 MiB).
COPY_OUT_SECONDS = 10.0
COPY_OUT_BYTES_PER_SECOND = 1024 * 1024
# After the runner's report hluk only has to tear the VM down (milliseconds): it is answered
# at the report and given this long to end by itself, off the case's path (hluk/ending.py),
# then killed, so that a worker holds a micro-VM past its case for this long at most.
EXIT_GRACE_SECONDS = 2.0
# Once hluk has exited, what is left in its pipes is read for this long; a descendant that
# kept them open (a wrapper that did not exec) is not waited for.
DRAIN_SECONDS = 1.0
# Once its pipes have ended, how long hluk's exit is waited for before it is killed.
EXIT_NOTICE_SECONDS = 0.1
# A warm-up's probe runs an empty case: its run is bounded all the same.
PROBE_RUN_SECONDS = 60.0


@dataclass(frozen=True)
class Deadlines:
    """The limit of each phase, in seconds (`stall`: None when silence is not watched)."""

    startup: float  # hluk's start to the solution's (the micro-VM's start)
    run: float  # the solution's run: its run_timeout
    copy_out: float  # the copy-out of the output, beyond a second per copy_out_rate bytes
    copy_out_rate: float  # bytes a second the copy-out is allowed on top of copy_out
    stall: float | None  # before the start: the longest silence outside an image pull
    exit_grace: float  # hluk's end, once the runner's report is whole
    drain: float  # what is left in hluk's pipes once it has exited
    exit_notice: float  # hluk's exit, once its pipes have ended
    warm_up: float  # a whole warm-up: an image pull and the warm snapshot
    body_read: float  # serve: a request's body, from its arrival to its last byte

    def copy_out_budget(self, copied: int) -> float:
        """The copy-out's limit for `copied` bytes of output and files announced."""
        return self.copy_out + copied / self.copy_out_rate

    def for_run(self, run: float, startup: float | None = None) -> Deadlines:
        """These deadlines for a run of `run` seconds (and a start-up of `startup`)."""
        return replace(self, run=run, startup=self.startup if startup is None else startup)


def for_case(run: float = math.inf) -> Deadlines:
    """The deadlines of the settings now, for a solution that may run `run` seconds."""
    return Deadlines(
        startup=settings.STARTUP_TIMEOUT.value(),
        run=run,
        copy_out=COPY_OUT_SECONDS,
        copy_out_rate=COPY_OUT_BYTES_PER_SECOND,
        stall=None,
        exit_grace=EXIT_GRACE_SECONDS,
        drain=DRAIN_SECONDS,
        exit_notice=EXIT_NOTICE_SECONDS,
        warm_up=settings.WARM_UP_TIMEOUT.value(),
        body_read=settings.BODY_READ_TIMEOUT.value(),
    )


def for_warm_up(restore_within: float | None) -> Deadlines:
    """A warm-up probe's deadlines: held to `restore_within` seconds to start when only a
    restore is due; else a pull and a boot, judged by their progress (the start-up deadline
    of silence, outside a pull) and held to the warm-up's deadline in all."""
    deadlines = for_case(PROBE_RUN_SECONDS)
    if restore_within is not None:
        return replace(deadlines, startup=restore_within)
    return replace(deadlines, startup=deadlines.warm_up, stall=deadlines.startup)


def only(seconds: float) -> Deadlines:
    """Deadlines that hold a command (hluk --version) to `seconds` in all."""
    return replace(for_case(), startup=seconds)
