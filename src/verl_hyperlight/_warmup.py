"""Warm-up: a case runs only once its guest's warm snapshot is in hluk's cache.

The first run of a guest pulls its image and takes the warm snapshot; that must never be
charged to a case, and concurrent first runs of one snapshot break each other (hluk writes it
through one `<slot>.part` directory that each removes first). So each guest is seen warm by a
probe (a warm run of an empty case: a restore, milliseconds) under a file lock beside hluk's
cache, which also takes the snapshot when it is missing while every other case waits.

The snapshot, not a marker, is the warm state: it can go away behind this process's back
(`hluk cache clean`; hluk prunes a snapshot when its image is pulled again or the local rootfs
is rebuilt). Every case therefore compares hluk's cache directories with what they were when
the guest was last seen warm (two stat calls), and probes again when they changed.

The same probe tells whether hluk starts the guest at all: after a run that failed before the
guest started, cases wait for one probe rather than each for its own deadline, and a guest
that keeps failing to start is failed fast (see Gate).
"""

from __future__ import annotations

import enum
import functools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from . import _diagnosis, _hluk, _outcome
from ._errors import ZEROES_REWARDS, BackendError, FailingFast, worth_logging
from ._guest import Guest, hluk_argv, probe_code

logger = logging.getLogger("verl_hyperlight")

# While a guest's gate is open, one case tries it again after a back-off: the first this long,
# each next one twice the last, up to the longest. A gate opened by a chance run of one-off
# failures (or a stall just longer than a probe) thus costs a second of cases, not the longest
# back-off's worth; a backend that stays down is still tried only every BACK_OFF_MAX_SECONDS.
BACK_OFF_FIRST_SECONDS = 1.0
BACK_OFF_MAX_SECONDS = 30.0
# Failures to start a guest in a row (cases and probes, no start between) that open its gate.
OPEN_AFTER = 3
# A probe may pull the image and boot the guest first (VERL_HYPERLIGHT_WARM_UP_TIMEOUT
# overrides it).
WARM_UP_TIMEOUT_SECONDS = 900.0
WARM_UP_TIMEOUT_ENV = "VERL_HYPERLIGHT_WARM_UP_TIMEOUT"
PROBE_RUN_TIMEOUT_SECONDS = 60.0
# hluk's settings that change what it runs for one set of arguments: part of a warm state.
IDENTITY_SETTINGS = ("HLUK_REGISTRY", "HLUK_IMAGE_VERSION")
# Where hluk keeps what a warm run needs, beneath its cache directory.
CACHE_PARTS = ("snapshots", "rootfs")


def cache_root() -> Path:
    """hluk's cache directory, as hluk finds it."""
    return Path(_cache_directory())


def _cache_directory() -> str:
    # A string, not a Path: every case looks at the cache (_cache_state), and path objects
    # cost more than the stat calls do.
    chosen = os.environ.get("HLUK_CACHE_DIR")
    if not chosen:
        parent = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        chosen = os.path.join(parent, "hluk")
    return chosen if os.path.isabs(chosen) else os.path.join(os.getcwd(), chosen)


@dataclass(frozen=True)
class Warmth:
    """What a probe found: the snapshot restored (True), taken now (False), or hluk did not
    say (None); and how long the probe took."""

    restored: bool | None
    seconds: float


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
    hluk run, seconds or minutes) runs outside it, by the one thread that `_admit` chose."""

    def __init__(self, path: str, guest: Guest) -> None:
        self.path, self.guest = path, guest
        self._lock = threading.Lock()
        self._probed = threading.Condition(self._lock)  # notified when a probe has ended
        self.state = State.SUSPECT
        # hluk's cache directories as they were when the guest was last seen warm.
        self.seen: tuple[object, ...] | None = None
        self.failures_in_a_row = 0  # runs and probes that failed to start the guest, since one did
        self.failure: BackendError | None = None  # why the gate is open (OPEN, HALF_OPEN)
        self.opened_at = 0.0
        self.retry_at = 0.0
        self.back_off = 0.0  # the open gate's current back-off
        self.answered_at_once = 0  # cases (not readiness checks) since the gate opened
        self.retried: dict[str, int] = {}  # cases tried again, by the cause of their failure

    def run_case(
        self, attempt: Callable[[], _outcome.RawOutcome], startup_timeout: float
    ) -> _outcome.RawOutcome:
        """Run one case's hluk run, `attempt`, through the gate: pass it first (BackendError,
        at once while it is open), report what the run showed, and run it once more when it
        failed before the guest started (nothing of the solution ran), after the probe that
        such a failure calls for. The last run's outcome."""
        outcome = self._attempt(attempt, startup_timeout)
        if outcome.verdict is _outcome.Verdict.BACKEND_BEFORE_START:
            self._retrying(_diagnosis.failure(outcome, self.path))
            outcome = self._attempt(attempt, startup_timeout)
        return outcome

    def _retrying(self, failure: BackendError) -> None:
        """Say that a case is tried again: once per cause, then at every power of ten, as
        failures are logged (a stall that a batch of 64 meets is one line, not 64)."""
        with self._lock:
            count = self.retried[failure.cause] = self.retried.get(failure.cause, 0) + 1
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

    def ensure_ready(self, startup_timeout: float | None = None) -> Warmth | None:
        """Return once the guest is warm (what a probe found, or None when nothing changed since
        it was last seen warm); BackendError if it cannot be, at once while the gate is open.
        For a readiness check (serve, doctor, `warm-up`): not counted as a case answered at once.
        `startup_timeout` bounds a probe of a guest seen warm before whose cache is untouched
        (None: VERL_HYPERLIGHT_STARTUP_TIMEOUT, as for cases)."""
        return self._pass(startup_timeout, case=False)

    def _attempt(
        self, attempt: Callable[[], _outcome.RawOutcome], startup_timeout: float
    ) -> _outcome.RawOutcome:
        self._pass(startup_timeout, case=True)
        outcome = attempt()
        self._record_run(outcome.verdict)
        return outcome

    def _pass(self, startup_timeout: float | None, case: bool) -> Warmth | None:
        while True:
            # The clock, and hluk's cache where it decides (a closed gate, seen as a hint: the
            # decision is made under the lock), are read before the lock: two stat calls need
            # none, and an open gate answers at once without them.
            now = time.monotonic()
            cache = _cache_state() if self.state is State.CLOSED else None
            with self._lock:
                step = self._admit(now, cache)
                if step is _Step.AT_ONCE:
                    if case:
                        self.answered_at_once += 1
                    raise self._answer_at_once()
                if step is _Step.WAIT:
                    self._probed.wait()
                    continue
                if step is _Step.PASS:
                    return None
                seen = self.seen  # only this thread's probe changes it, from now on
            # A guest seen warm whose cache is untouched needs a restore, not a pull and a boot:
            # held to the start-up deadline, not the warm-up's.
            return self._probe(startup_timeout, seen is not None and seen == _cache_state())

    def _admit(self, now: float, cache: tuple[object, ...] | None) -> _Step:
        """The one place that decides what an arriving case or check does (under the lock).
        `cache`: hluk's cache as read before the lock, when the gate was closed then."""
        if self.state is State.CLOSED:
            if (_cache_state() if cache is None else cache) == self.seen:
                return _Step.PASS
            self._move(State.SUSPECT)  # the snapshot may have gone: see it again
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

    def _probe(self, startup_timeout: float | None, restore: bool) -> Warmth:
        """Run the probe `_admit` chose this thread for, outside the lock, and record it."""
        try:
            if restore and startup_timeout is None:
                startup_timeout = _seconds(_hluk.STARTUP_TIMEOUT_ENV, _hluk.DEFAULT_STARTUP_TIMEOUT)
            warmth = _warm_up(self.path, self.guest, startup_timeout if restore else None)
        except BackendError as failure:
            with self._lock:
                self._record_probe_failure(failure)
            raise
        except BaseException:
            # Not hluk's doing (this package's, or the thread stopped): nothing learnt, but the
            # gate must not stay PROBING, or every later case would wait for a probe that is over.
            with self._lock:
                self._move(State.OPEN if self.failure is not None else State.SUSPECT)
                self._probed.notify_all()
            raise
        # As the probe left them: a snapshot it took changed the directories.
        cache = _cache_state()
        with self._lock:
            self._record_probe_success(cache)
        return warmth

    def _record_run(self, verdict: _outcome.Verdict) -> None:
        """What a case's hluk run showed of the backend."""
        with self._lock:
            if verdict is _outcome.Verdict.BACKEND_BEFORE_START:
                # The snapshot may have gone (`hluk cache clean`, concurrent cold boots broke it),
                # or hluk may have stopped starting guests: the next case probes first.
                self.failures_in_a_row += 1
                if self.state is State.CLOSED:
                    self._move(State.SUSPECT)
            elif verdict is not _outcome.Verdict.CANCELLED and self.failure is None:
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
        self._probed.notify_all()

    def _record_probe_success(self, cache: tuple[object, ...]) -> None:
        if self.failure is not None:
            logger.warning(
                "verl-hyperlight: %s starts again; the gate was open %.0f s, %d cases were "
                "answered SandboxError at once meanwhile",
                self.guest.image.label,
                time.monotonic() - self.opened_at,
                self.answered_at_once,
            )
        self._move(State.CLOSED)
        self.seen, self.failure = cache, None
        self.failures_in_a_row = 0
        self._probed.notify_all()

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
            f"{failure} (answered at once: hluk failed to start {self.guest.image.label} "
            f"{_times(self.failures_in_a_row)}; a case tries it again within "
            f"{self.back_off:.0f} s)",
            failure.cause,
        )


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times in a row"


# The one piece of global state: a gate per guest, keyed by the guest's identity. Guarded by
# _registry_lock; each gate's state by its own lock, so cases waiting for one guest's probe do
# not block another's.
_registry: dict[tuple[object, ...], Gate] = {}
_registry_lock = threading.Lock()


def _identity(path: str, guest: Guest) -> tuple[object, ...]:
    """What one warm snapshot serves: hluk, its cache, the settings that change what it runs,
    the guest's arguments, and a local rootfs's size and mtime (hluk's snapshot of a rebuilt
    rootfs is a new one)."""
    settings = tuple(os.environ.get(name, "") for name in IDENTITY_SETTINGS)
    rootfs: tuple[int, int] | None = None
    if guest.image.local_rootfs is not None:
        try:
            stat = os.stat(guest.image.local_rootfs)
            rootfs = (stat.st_size, stat.st_mtime_ns)
        except OSError:
            rootfs = None  # hluk will say what is wrong with it
    return (path, _cache_directory(), settings, rootfs, *guest.args())


def _cache_state() -> tuple[object, ...]:
    """hluk's snapshot and image directories, as far as a removal or a new snapshot changes
    them."""
    state: list[object] = []
    root = _cache_directory()
    for part in CACHE_PARTS:
        try:
            stat = os.stat(os.path.join(root, part))
        except OSError:
            state.append(None)
        else:
            state.append((stat.st_ino, stat.st_mtime_ns, stat.st_nlink))
    return tuple(state)


def gate(path: str, guest: Guest) -> Gate:
    """The gate of `guest` run by the hluk at `path`."""
    key = _identity(path, guest)
    with _registry_lock:
        found = _registry.get(key)
        if found is None:
            found = _registry[key] = Gate(path, guest)
        return found


def ensure_ready(path: str, guest: Guest, startup_timeout: float | None = None) -> Warmth | None:
    """Return once `guest` is warm on this node (see Gate.ensure_ready): a readiness check,
    never counted as a case."""
    return gate(path, guest).ensure_ready(startup_timeout)


def forget() -> None:
    """Drop what this process knows of prepared guests (for tests and after hluk upgrades)."""
    with _registry_lock:
        _registry.clear()


def _lock() -> FileLock:
    """The file lock that serializes the probes of every guest across the node's processes:
    two guests of one image pull it, and a pull that lands second changes the image file,
    which makes hluk prune the snapshot the first took."""
    directory = cache_root() / "verl-hyperlight"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cache_unusable(exc) from None
    return FileLock(str(directory / "warm-up.lock"))


def _cache_unusable(exc: OSError) -> BackendError:
    return BackendError(
        f"hluk's cache directory {cache_root()} is not usable ({exc}): point HLUK_CACHE_DIR "
        "at a writable directory with a few GiB free",
        "cache-dir",
    )


def _probe(
    path: str, guest: Guest, startup_timeout: float, stall_timeout: float | None
) -> _outcome.RawOutcome:
    nonce = secrets.token_hex(16)
    argv = hluk_argv(path, guest, probe_code(nonce), log_level="info")
    return _hluk.run(
        argv, nonce, PROBE_RUN_TIMEOUT_SECONDS, startup_timeout, stall_timeout=stall_timeout
    )


def _seconds(name: str, default: float) -> float:
    """The seconds setting `name` gives; a bad value is logged (once) and `default` used."""
    seconds, bad = _hluk.seconds_setting(name, default)
    if bad is not None:
        _bad_setting(name, bad, default)
    return seconds


@functools.lru_cache(maxsize=8)
def _bad_setting(name: str, value: str, default: float) -> None:
    logger.warning(
        "verl-hyperlight: %s=%r is not a positive number of seconds; using %.0f",
        name,
        value,
        default,
    )


def _warm_up(path: str, guest: Guest, restore_within: float | None) -> Warmth:
    """Probe `guest`, held to `restore_within` seconds to start when only a restore is due,
    else judged by its progress (a pull and a boot): hung once hluk writes nothing for the
    start-up deadline outside a pull it announced, and held to the warm-up's deadline in all."""
    warm_up_timeout = _seconds(WARM_UP_TIMEOUT_ENV, WARM_UP_TIMEOUT_SECONDS)
    startup_timeout = warm_up_timeout if restore_within is None else restore_within
    stall_timeout = None
    if restore_within is None:
        stall_timeout = _seconds(_hluk.STARTUP_TIMEOUT_ENV, _hluk.DEFAULT_STARTUP_TIMEOUT)
    _hluk.check_version(path)
    lock = _lock()
    try:
        lock.acquire()
    except OSError as exc:
        raise _cache_unusable(exc) from None
    try:
        started = time.monotonic()
        outcome = _probe(path, guest, startup_timeout, stall_timeout)
        if outcome.ending in (_outcome.Ending.NOT_STARTED, _outcome.Ending.KILLED):
            # As a case is: a case of another process that cold-booted at that moment (its
            # view of the cache was stale) may have removed the snapshot being written.
            outcome = _probe(path, guest, startup_timeout, stall_timeout)
    finally:
        lock.release()
    seconds = time.monotonic() - started
    if outcome.ending is _outcome.Ending.STARTUP_TIMEOUT and outcome.limit == stall_timeout:
        raise BackendError(
            f"hluk wrote nothing for {stall_timeout:.0f} s while warming up "
            f"{guest.image.label}, before its guest started and outside an image pull: it is "
            f"hung (a boot slower than that needs a larger {_hluk.STARTUP_TIMEOUT_ENV}); run "
            "`verl-hyperlight warm-up` to see what hluk says, and check the node's load",
            "warm-up-stalled",
            persistent=False,
        )
    if outcome.ending is _outcome.Ending.STARTUP_TIMEOUT and restore_within is None:
        raise BackendError(
            f"warming up {guest.image.label} took more than {warm_up_timeout:.0f} s "
            f"({WARM_UP_TIMEOUT_ENV}): check the node's network to the image registry and "
            "hluk's cache",
            "warm-up-timeout",
        )
    if outcome.ending is not _outcome.Ending.FINISHED:
        raise _diagnosis.failure(outcome, path)
    if outcome.restored is False:
        logger.info("%s warmed up in %.1f s (pull and snapshot)", guest.image.label, seconds)
    else:
        logger.info("%s is warm (probed in %.0f ms)", guest.image.label, seconds * 1000)
    return Warmth(outcome.restored, seconds)
