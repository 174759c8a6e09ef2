"""The code tool's notebooks (`session: trajectory`), one per trajectory: at most
`max_sessions` up, a trajectory's calls one at a time in its own, each ended when its
trajectory ends (its trajectory object collected, or `release` of the key it is kept by), after
`idle_timeout` idle, to make room for another at `max_sessions` (the least recently used idle
one), or by a call that does not end cleanly; and what each trajectory's last call left, to
tell a trajectory whose state was lost so."""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import OrderedDict, deque
from concurrent.futures import Future
from dataclasses import dataclass
from queue import Empty, SimpleQueue

from ..case.response import Response
from ..case.url import parse_url
from .notebook import Notebook, RemoteNotebook


class Turn:
    """A notebook's calls one at a time, in the order they came, whatever thread or event loop
    they come from. A call's turn lasts from `wait` until `pass_on`, which the end of the
    call's thread calls (its job's done-callback), so the next call enters only once the
    thread of the one before has left, cancelled or not."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = False
        self._waiting: deque[Future[None]] = deque()

    def wait(self) -> Future[None]:
        """A future done once the turn is the caller's."""
        turn: Future[None] = Future()
        with self._lock:
            if self._held:
                self._waiting.append(turn)
                return turn
            self._held = True
        turn.set_result(None)
        return turn

    def pass_on(self) -> None:
        """The holder is done: the turn goes to the next caller still waiting."""
        with self._lock:
            while self._waiting:
                turn = self._waiting.popleft()
                if turn.set_running_or_notify_cancel():  # False: that caller gave up
                    break
            else:
                self._held = False
                return
        turn.set_result(None)

    def give_up(self, turn: Future[None]) -> None:
        """The caller of `wait` no longer waits (cancelled): its turn, if it was given, is
        passed on once it is."""
        if not turn.cancel():
            turn.add_done_callback(lambda _: self.pass_on())


# A micro-VM, named by its notebook's serial and the notebook's count of micro-VMs started.
MicroVM = tuple[int, int]


class PooledNotebook:
    """A trajectory's notebook in the pool. A call owns it from `take` until the call's thread
    has ended (or, for a call that never got a thread, until its coroutine gave up): `users`
    counts those calls (under the pool's lock), and the notebook is closed only once it is
    zero. The calls run in it in `turn`."""

    serials = itertools.count(1)

    def __init__(self, notebook: Notebook | RemoteNotebook) -> None:
        self.notebook = notebook
        self.serial = next(self.serials)
        self.turn = Turn()
        self.users = 0
        self.last_used = time.monotonic()
        self.released = False

    def micro_vm(self) -> MicroVM | None:
        """The micro-VM its state is in; None when none is up."""
        return (self.serial, self.notebook.generation) if self.notebook.alive else None


@dataclass(frozen=True)
class _Left:
    """What a trajectory's last call that ran left it: the micro-VM its state is in (None:
    none), whether that call's answer said its state was gone, and that call's cancel (set:
    the answer never reached the trajectory)."""

    micro_vm: MicroVM | None
    said_restarted: bool
    abandoned: threading.Event


# The trajectories whose last call is remembered, to tell one its state is gone (kept for
# every trajectory until its end is known; this bounds them where it never is).
TRAJECTORIES_REMEMBERED = 4096


class NotebookPool:
    """The process's notebooks, by key (a trajectory's): at most `max_sessions` up. At the cap
    the least recently used idle one is ended to make room; one idle past
    `session_idle_timeout`, or whose trajectory has ended (its `trajectory` object collected),
    is ended by a sweeping thread. Called from the event loop, so a notebook is closed (its
    micro-VM killed and reaped) in a thread, never there."""

    def __init__(
        self, url: str, memory_limit_mb: int | None, max_sessions: int, idle_timeout: float
    ) -> None:
        self.url, self.memory_limit_mb = url, memory_limit_mb
        self.max_sessions, self.idle_timeout = max_sessions, idle_timeout
        self.lock = threading.Lock()
        self.by_key: dict[str, PooledNotebook] = {}
        self.left: OrderedDict[str, _Left] = OrderedDict()
        # A trajectory object's key, by its id (checked against its weak reference).
        self.keys: dict[int, tuple[weakref.ref[object], str]] = {}
        self.serials = itertools.count(1)
        # Trajectories ended, (id, key), put by their finalizers (SimpleQueue.put may be called
        # from one, wherever the collector runs it), and None to stop the sweeper.
        self.ended: SimpleQueue[tuple[int, str] | None] = SimpleQueue()
        self.sweeper: threading.Thread | None = None

    def key_of(self, notebook_key: str, trajectory: object | None) -> str:
        """The key of a call's notebook: `notebook_key`, or, given the `trajectory` object (alive
        exactly as long as the trajectory), one of that object's own, whose notebook ends
        when the object is collected. An object that cannot be weakly referenced gives no
        such signal: its calls are kept by `notebook_key`."""
        if trajectory is None:
            return notebook_key
        with self.lock:
            known = self.keys.get(id(trajectory))
            if known is not None and known[0]() is trajectory:
                return known[1]
            try:
                reference = weakref.ref(trajectory)
            except TypeError:
                return notebook_key
            key = f"{notebook_key}#{next(self.serials)}"
            self.keys[id(trajectory)] = (reference, key)
            weakref.finalize(trajectory, self.ended.put, (id(trajectory), key)).atexit = False
            return key

    def _open(self) -> Notebook | RemoteNotebook:
        """A new notebook of the URL: on this node, or with ``?ray`` on the cluster's."""
        if parse_url(self.url).ray is not None:
            return RemoteNotebook(self.url, self.memory_limit_mb)
        return Notebook(self.url, self.memory_limit_mb)

    def take(self, key: str) -> PooledNotebook | None:
        """The notebook of `key`, owned by the caller until it puts it back; made if it has none
        (its micro-VM starts with its first call), ending the least recently used idle one
        when `max_sessions` are up; None when every one of those is in use."""
        with self.lock:
            pooled = self.by_key.get(key)
            if pooled is None:
                if len(self.by_key) >= self.max_sessions:
                    idle = [p for p in self.by_key.items() if not p[1].users]
                    if not idle:
                        return None
                    lru, _ = min(idle, key=lambda item: item[1].last_used)
                    self._close_in_background([self.by_key.pop(lru)])
                pooled = self.by_key[key] = PooledNotebook(self._open())
                if self.sweeper is None:
                    self.sweeper = threading.Thread(
                        target=self._sweep, name="verl-hyperlight-notebooks", daemon=True
                    )
                    self.sweeper.start()
            pooled.users += 1
            return pooled

    def put_back(self, key: str, pooled: PooledNotebook) -> None:
        """A call of `take` is done with it: its thread has ended, or it never had one."""
        with self.lock:
            pooled.users -= 1
            pooled.last_used = time.monotonic()
            # Released, or ended by a call (its micro-VM is gone): it holds no place among
            # max_sessions, and the key's next call makes a new one.
            ended = pooled.released or not pooled.notebook.alive
            if ended and not pooled.users and self.by_key.get(key) is pooled:
                del self.by_key[key]
                self._close_in_background([pooled])

    def run(
        self, key: str, pooled: PooledNotebook, code: str, timeout: float, cancel: threading.Event
    ) -> tuple[Response | None, str | None, bool]:
        """The call run in `pooled` (in its thread, in its turn), answered as run_code answers,
        and whether its answer says the trajectory's state is gone: lost by this call, or
        since the trajectory's last answer, whatever ended it (its idle time, room for
        another, a call whose answer it never got)."""
        with self.lock:
            left = self.left.get(key)
        response, error = pooled.notebook.run(code, timeout, cancel)
        ran = response is not None and response.get("run_result") is not None
        now = pooled.micro_vm()
        restarted = (ran and now is None) or (
            left is not None
            and (
                (left.micro_vm is not None and left.micro_vm != now)
                or (left.said_restarted and left.abandoned.is_set())
            )
        )
        with self.lock:
            if not pooled.released:  # else its trajectory is over: nothing is owed to it
                self.left[key] = _Left(now, restarted, cancel)
                self.left.move_to_end(key)
                if len(self.left) > TRAJECTORIES_REMEMBERED:
                    self.left.popitem(last=False)
        return response, error, restarted

    def release(self, key: str) -> None:
        """End `key`'s trajectory: its notebook now, or once the calls that own it are done.
        Blocks while it closes one: called in a thread of its own (tool.release), or the
        sweeper's."""
        with self.lock:
            self.left.pop(key, None)
            pooled = self.by_key.get(key)
            if pooled is None:
                return
            pooled.released = True
            if pooled.users:
                return
            del self.by_key[key]
        pooled.notebook.close()

    def _idle(self, now: float) -> list[PooledNotebook]:
        """Take out the notebooks idle past the timeout (under the lock)."""
        expired = [
            key
            for key, pooled in self.by_key.items()
            if not pooled.users and now - pooled.last_used >= self.idle_timeout
        ]
        return [self.by_key.pop(key) for key in expired]

    @staticmethod
    def _close(notebooks: list[PooledNotebook]) -> None:
        for pooled in notebooks:
            pooled.notebook.close()

    def _close_in_background(self, notebooks: list[PooledNotebook]) -> None:
        if notebooks:
            threading.Thread(
                target=self._close, args=(notebooks,), name="verl-hyperlight-close", daemon=True
            ).start()

    def _end(self, ident: int, key: str) -> None:
        """A trajectory object was collected: its trajectory is over."""
        with self.lock:
            known = self.keys.get(ident)
            if known is not None and known[1] == key:
                del self.keys[ident]
        self.release(key)

    def _sweep(self) -> None:
        period = min(30.0, max(0.05, self.idle_timeout / 4))
        sweep_at = time.monotonic() + period
        while True:
            try:
                ended = self.ended.get(timeout=max(0.0, sweep_at - time.monotonic()))
            except Empty:
                with self.lock:
                    expired = self._idle(time.monotonic())
                self._close(expired)
                sweep_at = time.monotonic() + period
                continue
            if ended is None:
                return
            self._end(*ended)

    def close(self) -> None:
        """End every notebook: an idle one now, one in use once the calls that own it are
        done."""
        self.ended.put(None)
        with self.lock:
            idle = [pooled for pooled in self.by_key.values() if not pooled.users]
            for pooled in self.by_key.values():
                pooled.released = True
            self.by_key = {key: pooled for key, pooled in self.by_key.items() if pooled.users}
        self._close(idle)
