"""The package's exceptions, and what a backend failure is (`Diagnosis`). None of them reaches
verl: run_code turns each into a value."""

import math
import threading
from dataclasses import dataclass, replace

# What a backend failure that lasts costs a training run, said where an operator reads it.
ZEROES_REWARDS = "every code reward is zero while this lasts"


def worth_logging(count: int) -> bool:
    """Whether the `count`th case of one cause is logged: the first, then every power of ten,
    so that a long run keeps saying it without a line per case."""
    return count == 1 or math.log10(count).is_integer()


class CauseCounts:
    """The cases of each cause seen so far in this process, counted under a lock (cases of one
    cause arrive from many threads at once). What is said once per cause asks ``first``; what
    is said the first time and then at every power of ten asks ``count`` and `worth_logging`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def count(self, cause: str) -> int:
        """Count one more case of `cause`; how many so far."""
        with self._lock:
            count = self._counts[cause] = self._counts.get(cause, 0) + 1
        return count

    def first(self, cause: str) -> bool:
        """Count one more case of `cause`; whether it is the first."""
        return self.count(cause) == 1

    def counts(self) -> dict[str, int]:
        """How many cases of each cause there were so far, as of one moment."""
        with self._lock:
            return dict(self._counts)


class HyperlightError(Exception):
    """Base of the errors verl-hyperlight raises internally."""


class InvalidRequest(HyperlightError):
    """The request cannot be run as given (a bad URL, argument type or limit)."""


class Refused(HyperlightError):
    """The request cannot run as asked in a way Sandbox Fusion answers with a SandboxError (bad
    base64 in `files`, a file the guest cannot write), or its caller cancelled it: no failure
    of the backend, and nothing to log or retry."""


class Cancelled(HyperlightError):
    """Its caller cancelled a case while it waited to run (for its guest's probe, or for the
    node's warm-up lock): nothing of it ran, and the caller says what that means for it."""


@dataclass(frozen=True)
class Diagnosis:
    """A backend failure, diagnosed (``diagnosis`` makes them): what went wrong, what fixes it,
    and what becomes of the cases meanwhile, kept apart, so that doctor, the logs and the
    responses each render them and nothing parses them back. `cause` names the kind of failure
    (failures are logged once per cause); `persistent` says whether it fails every case until
    an operator acts (no /dev/kvm, no hluk, an unknown image) or only the case at hand (a
    crash, a start-up that took too long). Said as one line: ``what: fix; after (note)``."""

    what: str
    fix: str
    cause: str
    persistent: bool = True
    after: str = ""  # what becomes of this case and of later ones, when it is not the usual
    note: str = ""  # how this answer came (answered at once, by an open gate)

    def __str__(self) -> str:
        text = f"{self.what}: {self.fix}" if self.fix else self.what
        if self.after:
            text = f"{text}; {self.after}"
        return f"{text} ({self.note})" if self.note else text


class BackendError(HyperlightError):
    """hluk or the micro-VM failed: its `diagnosis` says what, and what an operator should do."""

    def __init__(self, diagnosis: Diagnosis) -> None:
        super().__init__(str(diagnosis))
        self.diagnosis = diagnosis
        self.announced = False  # logged where it arose (a guest's gate opening): count it only

    @property
    def cause(self) -> str:
        return self.diagnosis.cause

    @property
    def persistent(self) -> bool:
        return self.diagnosis.persistent


class FailingFast(BackendError):
    """A case answered at once, with the diagnosis of the failure that opened its guest's gate
    (see case.gate.Gate) and a `note` saying so: hluk keeps failing to start the guest. The gate
    logged its opening."""

    def __init__(self, diagnosis: Diagnosis, note: str) -> None:
        super().__init__(replace(diagnosis, note=note))
        self.announced = True
