"""Ready guests: a case's micro-VM started, and restored, before its case arrives.

hluk's start (a new process, the snapshot loaded and restored: 6.5-9 ms on a real node) is most
of a trivial case's time. So a worker keeps a few of its guests' hluks started ahead, each with
a case directory of its own mounted while still empty, its runner waiting on the console's
input (``runner.await_case``). A case that finds one writes its files into that directory, sends the
line, and its solution starts at once; that guest runs that one case and ends, as every case's
does, so nothing passes from one case to another.

Why the case runs as it would in a micro-VM started for it (hyperlight-unikraft's source, as of
0.17, in the note of issue 26): a ``--mount`` is a live view, each guest file operation its own
host call, with no cache of a lookup that failed nor of a directory's listing, so files written
after the guest started are seen; hluk opens the mounted directory once, as it starts, so the
directory exists before hluk starts and is filled in place. The runner reads nothing of it
before its line, empties the import system's caches after it, and reseeds ``random`` as a case
does (the kernel reseeds its own generator at the restore). A guest blocked on its console's
input is inside a host call: it costs no CPU, hluk's deadlock check does not run, and hluk has
no limit on that wait; each one holds its micro-VM's memory while it waits.

The rules that keep this the one path: a case passes its guest's gate first, as every case
does, and only then takes a ready guest, so none is used while the gate fails cases fast; the
gate ends its ready guests when what they were started from is gone (the snapshot changed, or
hluk was replaced: a new gate), and only then: a start that failed or ran past its deadline is
load, or hluk's failure, and ending ready guests then would only add starts to a node short of
CPU. A ready guest that died while it waited is ended and passed over; the case finds another
or starts its own, its death charged to no case. Each gate keeps at most
``VERL_HYPERLIGHT_READY_GUESTS``, and no more than its guest's cases in flight at once lately
(`most_kept`); one that waits past ``VERL_HYPERLIGHT_READY_IDLE`` is ended. A case starts the
guests that replace the one it took (or that its demand asks for), in its own thread while its
solution, or its own hluk, starts, when that thread would only wait: no other thread wakes for
it (on a nested VM a thread's wake-up costs more of the host's CPU than the spawn). The keeper
thread ends guests: those that waited past the idle limit and those their gate let go of. The
cap holds at every moment (a start counts before it is made), and while cases' starts are
slow (a quarter of their start-up deadline, or past it) none is started, for as long as a
ready guest may idle. A forked child knows none of its parent's; a worker that
dies takes them with it, as it takes every hluk it started (``hluk.spawn``), and one that
exits ends them first.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .. import settings
from ..deadlines import Deadlines
from ..errors import BackendError, CauseCounts
from ..hluk.ahead import AheadProcess
from ..outcome import Ending, RawOutcome, Verdict
from . import casedir
from .guests import CASE_MOUNT, Guest, ahead_code, hluk_argv

logger = logging.getLogger("verl_hyperlight")

# A case whose start took this share of its start-up deadline (or ran past it) says the node is
# short of CPU: no guest is started ahead for a while (READY_IDLE), so as not to add to it.
SLOW_START_SHARE = 0.25


def most_kept(peak: int, limit: int | None = None) -> int:
    """The one rule for how many ready guests a worker keeps for one guest: as many as its
    cases of that guest in flight at once lately (`peak`; at most its max_concurrent), up to
    `limit` (VERL_HYPERLIGHT_READY_GUESTS when not given). doctor sizes a node's memory by
    it."""
    return min(settings.READY_GUESTS.value() if limit is None else limit, peak)


@dataclass(frozen=True)
class Counts:
    """A process's ready guests: waiting for a case now, cases run in one so far, and ready
    guests found dead before their case could start."""

    waiting: int
    taken: int
    died: int


def _start_key() -> tuple[object, ...]:
    """What a guest's start was made under, of what may change between two cases: hluk's
    environment, and the settings that place its case directory and start it (the hluk file
    itself is its gate's: a gate lives as long as the hluk it was made for). A ready guest
    started under another is not used: a change counts from the next case on."""
    return (settings.hluk_environment(), settings.CASE_DIR.value(), settings.SPAWN.value())


class _Ready:
    """A ready guest: its hluk, waiting, its case directory, empty, and what it was started
    under (see _start_key)."""

    __slots__ = ("case_dir", "key", "process")

    def __init__(
        self, process: AheadProcess, case_dir: casedir.CaseDir, key: tuple[object, ...]
    ) -> None:
        self.process, self.case_dir, self.key = process, case_dir, key

    def end(self) -> None:
        """End it, unused: its hluk stopped, its directory removed."""
        try:
            self.process.stop()
        finally:
            self.case_dir.remove()


class ReadyGuests:
    """One gate's ready guests: of its guest, on its hluk. Changed under `_lock`, held for a few
    operations on the deque: starting and ending guests (a spawn, a kill and its reaping) is
    done outside it."""

    def __init__(self, path: str, guest: Guest) -> None:
        self.path, self.guest = path, guest
        self._lock = threading.Lock()
        self._waiting: deque[_Ready] = deque()  # the oldest first
        self._starting = 0  # being started, not in _waiting yet
        # Bumped by `clear`: guests started for a generation that has ended are not kept.
        self.generation = 0
        self._in_flight = 0  # the guest's cases running now
        self._peak = 0  # the most at once since the demand last fell (see expire)
        self.started = CauseCounts()  # why ready guests could not be started, said once
        self.slow_until = 0.0  # no guest is started ahead before this (see _follow_starts)
        # Cases run in a ready guest, and ready guests found dead (read without the lock).
        self.taken = self.died = 0

    def run_case(
        self,
        files: list[tuple[str, bytes]],
        limits: Deadlines,
        cancel: threading.Event | None,
        own: Callable[[Callable[[], None]], RawOutcome],
    ) -> RawOutcome:
        """Run the case of `files` in a ready guest, or else by `own` (which starts the case's
        hluk and calls what it is given once hluk is started), starting guests meanwhile in the
        place of the one taken, and for a demand that rose."""
        limit = settings.READY_GUESTS.value()
        if limit == 0:
            self.clear()
            return own(_nothing)
        with self._lock:
            self._in_flight += 1
            self._peak = max(self._peak, self._in_flight)
            generation = self.generation

        def start_more() -> None:
            # In the case's thread, while its solution (or its own hluk) starts, when the
            # thread would only wait: no other thread wakes for it.
            try:
                self.start_more(generation, limit)
            except Exception:  # a start must not fail the case that asked for it
                logger.exception("verl-hyperlight: starting a ready guest failed")

        try:
            outcome = self._run_in_one(files, limits, cancel, start_more)
            # None: none was ready, or the one taken ended before its line (nothing of the
            # case ran in it, and nothing is charged to the case).
            if outcome is None:
                outcome = own(start_more)
            self._follow_starts(outcome, limits)
            return outcome
        finally:
            with self._lock:
                self._in_flight -= 1

    def _follow_starts(self, outcome: RawOutcome, limits: Deadlines) -> None:
        """Pause starting ahead when the case's start says the node is short of CPU."""
        took = outcome.startup_seconds
        slow = outcome.ending is Ending.STARTUP_TIMEOUT or (
            took is not None and took >= SLOW_START_SHARE * limits.startup
        )
        if slow:
            until = time.monotonic() + settings.READY_IDLE.value()
            with self._lock:
                first = self.slow_until <= time.monotonic()
                self.slow_until = max(self.slow_until, until)
            if first:
                logger.info(
                    "verl-hyperlight: a case of %s took %s to start: no micro-VM is started "
                    "ahead for %.0f s, so as not to add to the node's load",
                    self.guest.image.label,
                    "past its deadline" if took is None else f"{took:.1f} s",
                    settings.READY_IDLE.value(),
                )

    def _run_in_one(
        self,
        files: list[tuple[str, bytes]],
        limits: Deadlines,
        cancel: threading.Event | None,
        start_more: Callable[[], None],
    ) -> RawOutcome | None:
        taken = self._take(sum(len(data) for _, data in files), _start_key())
        if taken is None:
            return None
        try:
            filled = casedir.fill(taken.case_dir, files)
        except OSError:
            taken.process.stop()  # its directory was removed with what was written
            return None
        try:
            outcome = taken.process.go(limits, cancel, start_more)
        finally:
            filled.remove()
        if outcome is not None and _ended_unstarted(outcome):
            # It died waiting, unseen (between the look and the line), or taking the line, or
            # it hung there past the start-up deadline: nothing of the case ran, and the case's
            # own start shows what hluk does now. A hung one also says the node is slow.
            if outcome.ending is Ending.STARTUP_TIMEOUT:
                self._follow_starts(outcome, limits)
                self._say_died(f"it did not start the case within {limits.startup:g} s")
            else:
                self._say_died(outcome.hluk_error)
            outcome = None
        with self._lock:
            if outcome is None:
                self.died += 1
            else:
                self.taken += 1
        _tally.count("died" if outcome is None else "taken")
        return outcome

    def _take(self, size: int, key: tuple[object, ...]) -> _Ready | None:
        """The oldest ready guest still up, started under `key`, whose directory takes a case
        of `size` bytes (the ones found dead, or started under another key, are ended); None
        if there is none."""
        while True:
            with self._lock:
                if not self._waiting:
                    return None
                taken = self._waiting.popleft()
            if taken.key != key:
                _keeper.end([taken])
                continue
            if not casedir.takes(taken.case_dir, size):
                with self._lock:
                    self._waiting.appendleft(taken)  # for a smaller case
                return None
            if taken.process.up():
                return taken
            with self._lock:
                self.died += 1
            _tally.count("died")
            self._say_died("")
            taken.end()

    def _say_died(self, error: str) -> None:
        """A ready guest found dead: said once per hluk error (hluk's own word on why), at
        DEBUG when it had none (killed from outside)."""
        if error and self.started.first(f"died {error}"):
            logger.warning(
                "verl-hyperlight: a micro-VM of %s started ahead of its case ended before the "
                "case could start (%s); the case started its own",
                self.guest.image.label,
                error,
            )
        else:
            logger.debug("verl-hyperlight: a ready guest of %s died", self.guest.image.label)

    def start_more(self, generation: int, limit: int) -> None:
        """Start guests up to what the demand asks for (the most cases in flight at once
        lately, at most `limit`): none once `generation` has ended, nor while starts are slow.
        A failure to start one is said once per cause and fails no case. The case's, which
        asked."""
        while True:
            with self._lock:
                wanted = most_kept(self._peak, limit)
                if (
                    generation != self.generation
                    or len(self._waiting) + self._starting >= wanted
                    or self.slow_until > time.monotonic()
                ):
                    return
                self._starting += 1
            ready: _Ready | None = None
            try:
                ready = self._start()
            except (OSError, BackendError) as exc:
                if self.started.first(f"{type(exc).__name__} {getattr(exc, 'errno', '')}"):
                    logger.warning(
                        "verl-hyperlight: a micro-VM of %s could not be started ahead of its "
                        "case (%s); cases start their own meanwhile",
                        self.guest.image.label,
                        exc,
                    )
                return
            finally:
                with self._lock:
                    self._starting -= 1
                    if ready is not None and generation == self.generation:
                        self._waiting.append(ready)
                        ready = None
            if ready is not None:
                ready.end()
                return
            _keeper.watch(self, time.monotonic() + settings.READY_IDLE.value())

    def _start(self) -> _Ready:
        key = _start_key()
        case_dir = casedir.make_empty()
        nonce = secrets.token_hex(16)
        argv = hluk_argv(
            self.path,
            self.guest,
            ahead_code(self.guest, CASE_MOUNT, nonce),
            mount=case_dir.mount(CASE_MOUNT),
        )
        try:
            return _Ready(AheadProcess(argv, nonce, case_dir.workdir), case_dir, key)
        except BaseException:
            case_dir.remove()
            raise

    def clear(self, wait: bool = False) -> None:
        """End every ready guest, and those being started as they come: the gate has moved (its
        snapshot may be another, or hluk fails to start it), or they are turned off. By the
        keeper, or here with `wait`."""
        with self._lock:
            self.generation += 1
            ended, self._waiting = self._waiting, deque()
        if wait:
            for ready in ended:
                ready.end()
        else:
            _keeper.end(ended)

    def expire(self, now: float, idle: float) -> float | None:
        """Hand the keeper the guests that have waited `idle` seconds by `now`, to end; when the
        next one will have (None: none waits, nor is being started)."""
        with self._lock:
            expired = []
            while self._waiting and self._waiting[0].process.started_at + idle <= now:
                expired.append(self._waiting.popleft())
            if expired:
                self._peak = self._in_flight  # the demand fell: follow it from where it is
            next_at = self._waiting[0].process.started_at + idle if self._waiting else None
            if next_at is None and self._starting:
                next_at = now + idle  # one is on its way: it will be watched
        _keeper.end(expired)
        return next_at

    def count(self) -> int:
        """How many guests wait for a case now."""
        with self._lock:
            return len(self._waiting)

    def forget_in_child(self) -> None:
        """In a forked child: let go of the parent's guests (their descriptors closed, their
        hluks left to the parent) and know of none."""
        for ready in self._waiting:
            ready.process.forget()
        self._waiting = deque()
        self._lock = threading.Lock()
        self._starting = self._in_flight = self._peak = 0


def _ended_unstarted(outcome: RawOutcome) -> bool:
    """Whether a ready guest's run ended before its solution started: its hluk gone, or hung
    past the start-up deadline. Either is the ready guest's failure, not the case's: the guest
    was started long before (a start that hangs is one the case's own start may not repeat)."""
    return outcome.verdict is Verdict.BACKEND_BEFORE_START


def _nothing() -> None:
    """Nothing to start."""


class _Keeper:
    """The thread that ends ready guests: those that waited past the idle limit and those
    their gate let go of (ending one waits for its hluk to be reaped). One per process, a
    daemon started with the first guest; it sleeps until the next guest is due, or it is
    handed guests to end, or a guest comes while it sleeps with none sooner than the keeper
    would wake."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._woken = threading.Condition(self._lock)
        self._pools: set[ReadyGuests] = set()  # those holding guests, or being given one
        self._fresh: set[ReadyGuests] = set()  # given a guest since the keeper last looked
        self._to_end: list[_Ready] = []
        self._thread: threading.Thread | None = None
        self._due: float | None = None  # when it wakes next (None: only when woken)
        self._news = 0  # guests started since it last looked

    def watch(self, pool: ReadyGuests, due: float) -> None:
        """Keep an eye on `pool`, which has one more guest, to be ended at `due`: the keeper
        is woken when it would sleep past that."""
        with self._lock:
            self._pools.add(pool)
            self._fresh.add(pool)
            self._news += 1
            if self._due is None or due < self._due:
                self._woken.notify()
            self._ensure_running()

    def end(self, ready: deque[_Ready] | list[_Ready]) -> None:
        """End these guests, from the keeper's thread."""
        if not ready:
            return
        with self._lock:
            self._to_end.extend(ready)
            self._ensure_running()
            self._woken.notify()

    def drain(self) -> None:
        """End here the guests handed to the keeper and not ended yet."""
        with self._lock:
            to_end, self._to_end = self._to_end, []
        for ready in to_end:
            ready.end()

    def pools(self) -> list[ReadyGuests]:
        with self._lock:
            return list(self._pools)

    def _ensure_running(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="verl-hyperlight-ready-guests", daemon=True
            )
            self._thread.start()
            # A process that exits ends its ready guests itself, their directories removed
            # then (the cleaner would remove them later; a killed one leaves that to it).
            atexit.register(end_all)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._to_end and not self._news:
                    wait = None if self._due is None else max(0.0, self._due - time.monotonic())
                    self._woken.wait(wait)
                to_end, self._to_end = self._to_end, []
                pools, self._news = list(self._pools), 0
            for ready in to_end:
                try:
                    ready.end()
                except Exception:  # one guest's end must not stop the keeper
                    logger.exception("verl-hyperlight: ending a ready guest failed")
            now, idle = time.monotonic(), settings.READY_IDLE.value()
            due = {pool: pool.expire(now, idle) for pool in pools}
            upcoming = [at for at in due.values() if at is not None]
            with self._lock:
                self._due = min(upcoming) if upcoming else None
                # A pool that holds no guest is let go of (its gate may be gone), unless one
                # was started in it since: `watch` adds it back with each guest.
                for pool, at in due.items():
                    if at is None and pool not in self._fresh:
                        self._pools.discard(pool)
                self._fresh.clear()

    def forget_in_child(self) -> None:
        for pool in self._pools:
            pool.forget_in_child()
        for ready in self._to_end:
            ready.process.forget()
        self._lock = threading.Lock()
        self._woken = threading.Condition(self._lock)
        self._pools, self._fresh, self._to_end, self._thread = set(), set(), [], None
        self._due, self._news = None, 0


_keeper = _Keeper()
# This process's cases run in a ready guest, and ready guests found dead, since it started.
_tally = CauseCounts()


def _forget_in_child() -> None:
    """A forked child holds none of its parent's ready guests, and has run no case in one."""
    global _tally
    _keeper.forget_in_child()
    _tally = CauseCounts()


def end_all() -> None:
    """End every ready guest of this process, and wait until they are: when it exits, and when
    it lets go of what it knows of its guests (``gate.forget``, which ``api.close`` calls)."""
    for pool in _keeper.pools():
        pool.clear(wait=True)
    _keeper.drain()


def counts() -> Counts:
    """This process's ready guests, as of now (see Counts)."""
    pools = _keeper.pools()
    return Counts(
        waiting=sum(pool.count() for pool in pools),
        taken=_tally.counts().get("taken", 0),
        died=_tally.counts().get("died", 0),
    )


os.register_at_fork(after_in_child=_forget_in_child)
