"""The gate each run of a guest passes: is the guest warm, does hluk start it, and fail fast
while it does not. A circuit breaker (closed, suspect, probing, open, half-open: see State).

A case runs only once its guest is seen warm (``warmup``: a probe under the node's lock, which
pulls and snapshots when needed), and again whenever hluk's cache shows the snapshot may have
changed (``snapshots``). The same probe tells whether hluk starts the guest at all: after a
run that failed before the guest started, cases wait for one probe rather than each for its own
deadline, and a guest that keeps failing to start is failed fast.

Every wait honours the case's `cancel`: a cancelled case stops waiting for a probe (or for the
node's warm-up lock) at once, and a probe runs in a thread of its own for whoever waits for it,
cancelled once none does (see _Probe).
"""

from __future__ import annotations

import enum
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable

from .. import cancel as cancels
from .. import deadlines, diagnosis
from ..deadlines import Deadlines
from ..errors import (
    ZEROES_REWARDS,
    BackendError,
    Cancelled,
    CauseCounts,
    FailingFast,
    Refused,
    worth_logging,
)
from ..hluk.binary import identity
from ..outcome import RawOutcome, Verdict
from . import snapshots
from .guests import Guest, hluk_argv
from .ready import ReadyGuests, end_all
from .warmup import Warmth, warm_up

logger = logging.getLogger("verl_hyperlight")

# While a guest's gate is open, one case tries it again after a back-off: the first this long,
# each next one twice the last, up to the longest. A gate opened by a chance run of one-off
# failures (or a stall just longer than a probe) thus costs a second of cases, not the longest
# back-off's worth; a backend that stays down is still tried only every BACK_OFF_MAX_SECONDS.
BACK_OFF_FIRST_SECONDS = 1.0
BACK_OFF_MAX_SECONDS = 30.0
# Failures to start a guest in a row (cases and probes, no start between) that open its gate.
OPEN_AFTER = 3


class State(enum.Enum):
    """Where a guest's gate stands. Every transition goes through `Gate._move`, under the
    gate's lock: from `Gate._admit` (a case or a check arrives), or from what a run or a probe
    showed."""

    # Seen warm, hluk's cache untouched since: cases pass.
    CLOSED = "closed"
    # Not seen warm (yet, or since hluk's cache changed), or a run failed before the guest
    # started: the next case probes, and the others wait for its probe.
    SUSPECT = "suspect"
    # A suspect gate's probe runs: cases wait for it.
    PROBING = "probing"
    # hluk keeps failing to start the guest: cases are answered at once until the back-off ends.
    OPEN = "open"
    # The back-off over, one case probes the open gate: the others are still answered at once.
    HALF_OPEN = "half-open"


class _Probe:
    """A gate's probe under way, run in a thread of its own (`Gate._probe`) for the cases and
    checks that wait for it, the one that started it among them: a case that is cancelled
    stops waiting at once, and the probe goes on for the others. Once none waits it is
    cancelled (its hluk killed, the warm-up's lock given back): a probe nobody waits for would
    hold the node's warm-up lock, which every process's probes take, for up to the warm-up's
    deadline, and the next case probes again anyway. What it found: its Warmth, or why not."""

    __slots__ = ("cancel", "ended", "failure", "waiting", "warmth")

    def __init__(self) -> None:
        self.waiting = 0  # threads waiting for it (under the gate's lock)
        self.cancel = cancels.Cancel()
        self.ended = False
        self.warmth: Warmth | None = None
        self.failure: BaseException | None = None


class _Step(enum.Enum):
    """What `Gate._admit` tells the thread that arrives."""

    PASS = "pass"
    WAIT = "wait"  # for the running probe
    PROBE = "probe"  # this thread runs the probe
    AT_ONCE = "at-once"


class Gate:
    """What this process knows of one guest: whether it is warm, and whether hluk is starting
    it at all; a circuit breaker (closed, suspect, probing, open, half-open: see State) that
    every case passes before each hluk run.

    A guest's cases wait for one probe (of the guest's warm state, and of whether hluk starts
    it) whenever a case's run failed before the guest started; so a brief failure, even one
    that every case of a batch hit at once, costs the batch one probe and its retries, not its
    answers. When hluk keeps failing to start the guest (OPEN_AFTER failures in a row, cases
    and probes, with no start between), the gate opens: cases are answered SandboxError at once,
    without running hluk, and after a back-off (BACK_OFF_FIRST_SECONDS, doubled after each probe
    that fails, up to BACK_OFF_MAX_SECONDS) one case probes again while the others still fail
    fast; the first success closes it. Opening and closing are logged once each.

    The state is only read and changed under `_lock`, held for a few comparisons: a probe (a
    hluk run, seconds or minutes) runs outside it, in a thread of its own started by the one
    thread that `_admit` chose (see _Probe)."""

    def __init__(self, path: str, guest: Guest, binary: tuple[int, ...] = ()) -> None:
        self.path, self.guest = path, guest
        self.binary = binary  # the hluk file it was made for (binary.identity)
        self._lock = threading.Lock()
        self._probed = threading.Condition(self._lock)  # notified when a probe has ended
        self._running: _Probe | None = None  # while PROBING or HALF_OPEN
        self.state = State.SUSPECT
        # What of hluk's cache says whether the guest's snapshot is still there (see _watched),
        # and its state when the guest was last seen warm.
        self.watched = snapshots.whole_cache()
        self.seen: tuple[object, ...] | None = None
        self.failures_in_a_row = 0  # runs and probes that failed to start the guest, since one did
        self.failure: BackendError | None = None  # why the gate is open (OPEN, HALF_OPEN)
        self.opened_at = 0.0
        self.retry_at = 0.0
        self.back_off = 0.0  # the open gate's current back-off
        self.answered_at_once = 0  # cases (not readiness checks) since the gate opened
        self.retried = CauseCounts()  # cases tried again, by the cause of their failure
        # Its guest's micro-VMs started ahead of their cases: used only while it is closed.
        self.ready_guests = ReadyGuests(path, guest)

    def run_case(
        self,
        attempt: Callable[[], RawOutcome],
        limits: Deadlines,
        cancel: threading.Event | None = None,
    ) -> RawOutcome:
        """Run one case's hluk run, `attempt`, through the gate: pass it first (BackendError,
        at once while it is open), report what the run showed, and run it once more when it
        failed before the guest started (nothing of the solution ran), after the probe that
        such a failure calls for (held to the case's start-up deadline, `limits`). The last
        run's outcome; Cancelled when `cancel` is set while the case waits for a probe."""
        outcome = self._attempt(attempt, limits, cancel)
        if outcome.verdict is Verdict.BACKEND_BEFORE_START:
            self._retrying(diagnosis.failure(outcome, self.path))
            outcome = self._attempt(attempt, limits, cancel)
        return outcome

    def _retrying(self, failure: BackendError) -> None:
        """Say that a case is tried again: once per cause, then at every power of ten, as
        failures are logged (a stall that a batch of 64 meets is one line, not 64)."""
        count = self.retried.count(failure.cause)
        if count == 1:
            logger.warning(
                "verl-hyperlight: retrying a case that did not start: %s (later retries for "
                "this cause are counted, and said at every power of ten)",
                failure,
            )
        elif worth_logging(count):
            logger.warning(
                "verl-hyperlight: %d cases that did not start retried so far, with: %s",
                count,
                failure,
            )

    def ensure_ready(self) -> Warmth | None:
        """Return once the guest is warm (what a probe found, or None when nothing changed since
        it was last seen warm); BackendError if it cannot be, at once while the gate is open.
        For a readiness check (serve, doctor, `warm-up`): not counted as a case answered at once;
        a probe of a guest seen warm before whose cache is untouched is held to the start-up
        deadline of the settings, as a case's."""
        return self._pass(None, case=False, cancel=None)

    def _attempt(
        self,
        attempt: Callable[[], RawOutcome],
        limits: Deadlines,
        cancel: threading.Event | None,
    ) -> RawOutcome:
        self._pass(limits, case=True, cancel=cancel)
        outcome = attempt()
        self._record_run(outcome.verdict)
        return outcome

    def _pass(
        self, limits: Deadlines | None, case: bool, cancel: threading.Event | None
    ) -> Warmth | None:
        while True:
            # The clock, and hluk's cache where it decides (a closed gate, seen as a hint: the
            # decision is made under the lock), are read before the lock: two stat calls need
            # none, and an open gate answers at once without them.
            now = time.monotonic()
            cache = snapshots.state(self.watched) if self.state is State.CLOSED else None
            with self._lock:
                step = self._admit(now, cache)
                if step is _Step.AT_ONCE:
                    if case:
                        self.answered_at_once += 1
                    raise self._answer_at_once()
                if step is _Step.PASS:
                    return None
                if step is _Step.PROBE:
                    seen = self.seen  # only the probe started now changes it, from now on
                    self._running = _Probe()
                probe = self._running
                assert probe is not None  # set with PROBING and HALF_OPEN, cleared as they end
                probe.waiting += 1
            if step is _Step.PROBE:
                # A guest seen warm whose cache is untouched needs a restore, not a pull and a
                # boot: held to the start-up deadline, not the warm-up's.
                self._start(
                    probe, limits, seen is not None and seen == snapshots.state(self.watched)
                )
            self._wait_for(probe, cancel)
            if step is _Step.WAIT:
                continue  # see what the probe left
            if probe.failure is not None:
                raise probe.failure
            return probe.warmth

    def _wait_for(self, probe: _Probe, cancel: threading.Event | None) -> None:
        """Wait until `probe` has ended; Cancelled as soon as `cancel` is set (which wakes the
        wait). The last thread to stop waiting for a probe that runs on cancels it."""
        with cancels.on_set(cancel, self._wake_waiters) as woken, self._lock:
            try:
                while not probe.ended:
                    if cancel is not None and cancel.is_set():
                        label = self.guest.image.label
                        raise Cancelled(f"cancelled while {label} was probed")
                    self._probed.wait(cancels.longest_sleep(cancel, woken, None))
            finally:
                probe.waiting -= 1
                if probe.waiting == 0 and not probe.ended:
                    probe.cancel.set()

    def _wake_waiters(self) -> None:
        """A waiting case's cancel was set: the waits look at their cancels (under the lock,
        so that none is between its look and its sleep)."""
        with self._lock:
            self._probed.notify_all()

    def _admit(self, now: float, cache: tuple[object, ...] | None) -> _Step:
        """The one place that decides what an arriving case or check does (under the lock).
        `cache`: hluk's cache as read before the lock, when the gate was closed then."""
        if self.state is State.CLOSED:
            if (snapshots.state(self.watched) if cache is None else cache) == self.seen:
                return _Step.PASS
            # The snapshot may have gone, or be another: see it again, and end the micro-VMs
            # started ahead from the one seen (those alone: a run that failed to start, a
            # start-up past its deadline, is load or hluk's failure, not a new snapshot).
            self.ready_guests.clear()
            self._move(State.SUSPECT)
        if self.state is State.PROBING:
            return _Step.WAIT
        if self.state is State.HALF_OPEN:
            return _Step.AT_ONCE
        if self.state is State.OPEN:
            if now < self.retry_at:
                return _Step.AT_ONCE
            self._move(State.HALF_OPEN)
            return _Step.PROBE
        self._move(State.PROBING)
        return _Step.PROBE

    def _start(self, probe: _Probe, limits: Deadlines | None, restore: bool) -> None:
        """Start `probe`, the one `_admit` chose this thread for, in a thread of its own: a
        daemon, as a warm-up (a pull, a boot: up to 900 s) must never hold the process when it
        exits."""
        try:
            threading.Thread(
                target=self._probe,
                args=(probe, limits, restore),
                name=f"verl-hyperlight-probe-{self.guest.image.label}",
                daemon=True,
            ).start()
        except BaseException as exc:
            self._ended(probe, exc)
            raise

    def _probe(self, probe: _Probe, limits: Deadlines | None, restore: bool) -> None:
        """Run `probe` (in its own thread, outside the lock), record it, and wake who waits: a
        restore is held to the start-up deadline of `limits` (else of the settings now)."""
        try:
            restore_within = None
            if restore:
                restore_within = (limits or deadlines.for_case()).startup
            warmth = warm_up(self.path, self.guest, restore_within, probe.cancel)
        except BackendError as failure:
            with self._lock:
                self._record_probe_failure(failure)
                self._end(probe, failure=failure)
            return
        except BaseException as exc:
            self._ended(probe, exc)
            return
        # As the probe left them: the snapshot it took, if it took one.
        watched = snapshots.watched(self.guest)
        cache = snapshots.state(watched)
        with self._lock:
            self._record_probe_success(watched, cache)
            self._end(probe, warmth=warmth)

    def _ended(self, probe: _Probe, exc: BaseException) -> None:
        """A probe ended by no doing of hluk's (cancelled, this package's failure, no thread
        for it): nothing learnt, but the gate must not stay PROBING, or every later case would
        wait for a probe that is over."""
        with self._lock:
            self._move(State.OPEN if self.failure is not None else State.SUSPECT)
            self._end(probe, failure=exc)

    def _end(
        self, probe: _Probe, warmth: Warmth | None = None, failure: BaseException | None = None
    ) -> None:
        """Say what `probe` found, under the lock, and wake every thread waiting for it."""
        probe.warmth, probe.failure, probe.ended = warmth, failure, True
        self._running = None
        self._probed.notify_all()

    def _record_run(self, verdict: Verdict) -> None:
        """What a case's hluk run showed of the backend."""
        with self._lock:
            if verdict is Verdict.BACKEND_BEFORE_START:
                # The snapshot may have gone (`hluk cache clean`, concurrent cold boots broke it),
                # or hluk may have stopped starting guests: the next case probes first.
                self.failures_in_a_row += 1
                if self.state is State.CLOSED:
                    self._move(State.SUSPECT)
            elif verdict is not Verdict.CANCELLED and self.failure is None:
                # The guest started (or the runner in it refused the case): hluk starts it. An
                # open gate keeps the count that opened it (its answers say it) until a probe.
                self.failures_in_a_row = 0

    def _record_probe_failure(self, failure: BackendError) -> None:
        self.failures_in_a_row += 1
        # A failure alone, even of a first warm-up, may be a one-off: only failing again and
        # again, or still failing once open, fails cases at once.
        if self.failure is not None or self.failures_in_a_row >= OPEN_AFTER:
            self._open(failure)
        else:
            self._move(State.SUSPECT)

    def _record_probe_success(self, watched: tuple[str, ...], cache: tuple[object, ...]) -> None:
        if self.failure is not None:
            logger.warning(
                "verl-hyperlight: %s starts again; the gate was open %.0f s, %d cases were "
                "answered SandboxError at once meanwhile",
                self.guest.image.label,
                time.monotonic() - self.opened_at,
                self.answered_at_once,
            )
        if (watched, cache) != (self.watched, self.seen):
            self.ready_guests.clear()  # started from a snapshot that is not the one seen now
        self._move(State.CLOSED)
        self.watched, self.seen, self.failure = watched, cache, None
        self.failures_in_a_row = 0

    def _open(self, failure: BackendError) -> None:
        now = time.monotonic()
        if self.failure is None:
            self.opened_at, self.answered_at_once = now, 0
            self.back_off = BACK_OFF_FIRST_SECONDS
            logger.error(
                "verl-hyperlight: %s. hluk failed to start %s %s, so its cases are answered "
                "SandboxError at once (%s); one case tries it again after %.0f s, then after "
                "twice as long each time it fails, up to every %.0f s",
                failure,
                self.guest.image.label,
                _times(self.failures_in_a_row),
                ZEROES_REWARDS,
                self.back_off,
                BACK_OFF_MAX_SECONDS,
            )
        else:
            self.back_off = min(2 * self.back_off, BACK_OFF_MAX_SECONDS)
        failure.announced = True
        self._move(State.OPEN)
        self.failure, self.retry_at = failure, now + self.back_off

    def _move(self, state: State) -> None:
        """Every transition (under the lock), said at DEBUG: rare, but the story of a stall."""
        logger.debug(
            "verl-hyperlight: %s's gate: %s -> %s (%d failures to start in a row)",
            self.guest.image.label,
            self.state.value,
            state.value,
            self.failures_in_a_row,
        )
        self.state = state

    def _answer_at_once(self) -> FailingFast:
        failure = self.failure
        # Set with OPEN and cleared with CLOSED, under the lock this is called under; _admit
        # answers at once only while OPEN or HALF_OPEN.
        assert failure is not None
        return FailingFast(
            failure.diagnosis,
            f"answered at once: hluk failed to start {self.guest.image.label} "
            f"{_times(self.failures_in_a_row)}; a case tries it again within "
            f"{self.back_off:.0f} s",
        )


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times in a row"


# The one piece of global state: a gate per guest, keyed by the guest's identity. Guarded by
# _registry_lock; each gate's state by its own lock, so cases waiting for one guest's probe do
# not block another's.
_registry: dict[tuple[object, ...], Gate] = {}
_registry_lock = threading.Lock()
_replaced = CauseCounts()  # the hluk files seen replaced: said once each


def _forget_in_child() -> None:
    """A forked child knows nothing of its parent's gates: a thread of the parent's may have
    held the registry's lock or a gate's, or been probing, and it does not exist in the
    child, whose first case of each guest probes it (a restore, milliseconds)."""
    global _registry, _registry_lock
    _registry, _registry_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def gate(path: str, guest: Guest) -> Gate:
    """The gate of `guest` run by the hluk at `path`, as that file is now: hluk replaced in
    place (an upgrade) is a new gate, suspect until its first case's probe has seen the guest
    warm (one warm-up under the node's lock, the other cases waiting for it), and the gate of
    the hluk it replaced is retired, its ready guests ended."""
    key = snapshots.identity(path, guest)
    binary = identity(path)
    with _registry_lock:
        found = _registry.get(key)
        if found is not None and found.binary == binary:
            return found
        replaced, found = found, Gate(path, guest, binary)
        _registry[key] = found
    if replaced is not None:
        if _replaced.first(path):
            logger.warning(
                "verl-hyperlight: hluk at %s was replaced: %s is probed again (a warm-up if "
                "the new hluk needs one, once, under the node's warm-up lock), its micro-VMs "
                "started ahead by the old one ended",
                path,
                guest.image.label,
            )
        replaced.ready_guests.clear()
    return found


def ensure_ready(path: str, guest: Guest) -> Warmth | None:
    """Return once `guest` is warm on this node (see Gate.ensure_ready): a readiness check,
    never counted as a case."""
    return gate(path, guest).ensure_ready()


def forget() -> None:
    """Drop what this process knows of its guests, and end their ready guests (``api.close``):
    the next case of each guest probes it again."""
    with _registry_lock:
        _registry.clear()
    end_all()


def run_through_gate(
    path: str,
    guest: Guest,
    attempt: Callable[[Gate], RawOutcome],
    limits: Deadlines,
    cancelled: str,
    cancel: threading.Event | None = None,
) -> RawOutcome:
    """Run `guest` with the hluk at `path` through its gate (`Gate.run_case`): each
    attempt is the caller's `attempt(gate)`, a hluk run (see `fresh_run`). The last attempt's
    outcome; Refused with the text `cancelled` when the caller cancelled it (`cancel`, which
    its runs are given too), whether it was running or waiting to."""
    found = gate(path, guest)
    try:
        outcome = found.run_case(lambda: attempt(found), limits, cancel)
    except Cancelled:
        raise Refused(cancelled) from None
    if outcome.verdict is Verdict.CANCELLED:
        raise Refused(cancelled)
    return outcome


def fresh_run(
    path: str,
    guest: Guest,
    exec_code: Callable[[str], str],
    run: Callable[[list[str], str], RawOutcome],
    mount: str | None = None,
) -> RawOutcome:
    """A hluk run started for an attempt: the caller's `run(argv, nonce)` of the argv that runs
    `exec_code(nonce)` in `guest` (with `mount`), under a nonce of its own."""
    nonce = secrets.token_hex(16)
    return run(hluk_argv(path, guest, exec_code(nonce), mount=mount), nonce)
