"""A case's cancel: `Cancel`, an Event that wakes what waits on it the moment it is set.

What waits for a case (its hluk's pipes, its compile, a probe of its guest) sleeps until
something happens to it, and never wakes only to look at its cancel: `Cancel.set` runs the
wakers that waits register (`on_set`), and `wake_descriptor` gives a wait on descriptors one
more, which the set makes readable. The package's own cancels (serve's, the agent tool's,
selftest's, a gate's probe's) are Cancels. A plain threading.Event, which a caller of
run_code may pass, can wake no one: what waits on one looks at it every POLL_SECONDS.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import overload

# How often a wait looks at a cancel that cannot wake it (a plain threading.Event).
POLL_SECONDS = 0.2


class Cancel(threading.Event):
    """An Event whose `set` also runs the wakers registered with `on_set`."""

    def __init__(self) -> None:
        super().__init__()
        self._wakers_lock = threading.Lock()
        self._wakers: list[Callable[[], None]] = []

    def set(self) -> None:
        super().set()
        # Under the lock: a waker whose `on_set` block has ended never runs after it, so
        # what it touches (a descriptor) may be closed then.
        with self._wakers_lock:
            for waker in self._wakers:
                waker()


@contextlib.contextmanager
def on_set(cancel: threading.Event | None, waker: Callable[[], None]) -> Iterator[bool]:
    """Run `waker` when `cancel` is set while in the block; whether it will (not for None or a
    plain Event: the wait then looks every POLL_SECONDS). It runs in the setting thread, under
    the cancel's lock: quick, never raising, and taking no lock that is held while a block of
    this cancel ends. A wait looks at `cancel` after this (a set before it woke no one)."""
    if not isinstance(cancel, Cancel):
        yield False
        return
    with cancel._wakers_lock:
        cancel._wakers.append(waker)
    try:
        yield True
    finally:
        with cancel._wakers_lock:
            cancel._wakers.remove(waker)


@contextlib.contextmanager
def wake_descriptor(cancel: threading.Event | None) -> Iterator[int]:
    """A descriptor, for poll(2) with a wait's others, that is readable once `cancel` is set
    while in the block; -1 when `cancel` cannot wake a wait (None, a plain Event), or when no
    descriptor is free (EMFILE): the wait then looks every POLL_SECONDS."""
    if not isinstance(cancel, Cancel):
        yield -1
        return
    try:
        fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    except OSError:
        yield -1
        return
    try:
        with on_set(cancel, lambda: os.eventfd_write(fd, 1)):
            yield fd
    finally:
        os.close(fd)


@overload
def longest_sleep(cancel: threading.Event | None, woken: bool, wait: float) -> float: ...
@overload
def longest_sleep(cancel: threading.Event | None, woken: bool, wait: None) -> float | None: ...
def longest_sleep(cancel: threading.Event | None, woken: bool, wait: float | None) -> float | None:
    """How long a wait of `wait` seconds (None: until woken) may sleep at once: all of it, but
    for a cancel that cannot wake it (`woken` False): POLL_SECONDS at most."""
    if cancel is None or woken:
        return wait
    return POLL_SECONDS if wait is None else min(wait, POLL_SECONDS)
