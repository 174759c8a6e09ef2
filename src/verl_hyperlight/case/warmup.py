"""The warm-up: a guest's image pulled and its warm snapshot taken, under the node's lock, or
its snapshot seen restored, by a probe (a warm run of an empty case: a restore, milliseconds).

The first run of a guest pulls its image and takes the warm snapshot; that must never be
charged to a case, and concurrent first runs of one snapshot break each other (hluk writes it
through one `<slot>.part` directory that each removes first). So each guest is seen warm by a
probe under a file lock beside hluk's cache, which also takes the snapshot when it is missing
while every other case waits (its guest's gate, ``gate``, decides when a probe is due).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from .. import cancel as cancels
from .. import deadlines, diagnosis, settings
from ..deadlines import Deadlines
from ..errors import Cancelled
from ..hluk import watch
from ..hluk.binary import check_version
from ..outcome import Ending, RawOutcome
from .guests import Guest, hluk_argv, probe_code

logger = logging.getLogger("verl_hyperlight")


@dataclass(frozen=True)
class Warmth:
    """What a probe found: the snapshot restored (True), taken now (False), or hluk did not
    say (None); and how long the probe took."""

    restored: bool | None
    seconds: float


class _Unlocked:
    """The warm-up's lock where hluk's cache cannot be written (pre-built, mounted read-only):
    nothing to hold. What the lock serializes, a pull and a snapshot taken, hluk cannot do in
    such a cache, and a probe there only restores; nor would a lock anywhere else guard
    anything, as no directory that every process of the cache can write is shared by them all
    (a pod's /tmp is its own)."""

    def acquire(self, *args: object, **kwargs: object) -> None:
        """Return at once."""

    def release(self, *args: object, **kwargs: object) -> None:
        """Nothing to release."""


def _lock() -> FileLock | _Unlocked:
    """The file lock that serializes the probes of every guest across the node's processes:
    two guests of one image pull it, and a pull that lands second changes the image file,
    which makes hluk prune the snapshot the first took."""
    root = Path(settings.hluk_cache_directory())
    if root.is_dir() and not os.access(root, os.W_OK):
        return _Unlocked()
    directory = root / "verl-hyperlight"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise diagnosis.cache_unusable(root, exc) from None
    return FileLock(str(directory / "warm-up.lock"))


def _acquire(lock: FileLock | _Unlocked, cancel: threading.Event) -> None:
    """Take the node's warm-up lock, which another process's probe may hold for as long as a
    warm-up takes; Cancelled once `cancel` is set. filelock's wait polls the lock (flock has no
    wait that a cancel could end), so the cancel is looked at as often as a plain Event's."""
    while True:
        try:
            lock.acquire(timeout=cancels.POLL_SECONDS)
            return
        except Timeout:
            if cancel.is_set():
                raise Cancelled("cancelled while waiting for the warm-up lock") from None
        except OSError as exc:
            raise diagnosis.cache_unusable(Path(settings.hluk_cache_directory()), exc) from None


def _probe(path: str, guest: Guest, limits: Deadlines, cancel: threading.Event) -> RawOutcome:
    nonce = secrets.token_hex(16)
    argv = hluk_argv(path, guest, probe_code(guest, nonce), log_level="info")
    return watch.run(argv, nonce, limits, cancel=cancel)


def warm_up(
    path: str, guest: Guest, restore_within: float | None, cancel: threading.Event
) -> Warmth:
    """Probe `guest`, held to `restore_within` seconds to start when only a restore is due,
    else judged by its progress (a pull and a boot): hung once hluk writes nothing for the
    start-up deadline outside a pull it announced, and held to the warm-up's deadline in all.
    Cancelled, its hluk killed, once `cancel` is set."""
    limits = deadlines.for_warm_up(restore_within)
    check_version(path)
    lock = _lock()
    _acquire(lock, cancel)
    try:
        started = time.monotonic()
        outcome = _probe(path, guest, limits, cancel)
        if outcome.ending in (Ending.NOT_STARTED, Ending.KILLED):
            # As a case is: a case of another process that cold-booted at that moment (its
            # view of the cache was stale) may have removed the snapshot being written.
            outcome = _probe(path, guest, limits, cancel)
    finally:
        lock.release()
    if outcome.ending is Ending.CANCELLED:
        raise Cancelled(f"the probe of {guest.image.label} was cancelled: nobody waits for it")
    seconds = time.monotonic() - started
    if outcome.ending is Ending.STARTUP_TIMEOUT:
        if limits.stall is not None and outcome.limit == limits.stall:
            raise diagnosis.warm_up_stalled(guest.image.label, limits.stall)
        if restore_within is None:
            raise diagnosis.warm_up_timeout(guest.image.label, limits.warm_up)
    if outcome.ending is not Ending.FINISHED:
        raise diagnosis.failure(outcome, path)
    if outcome.restored is False:
        logger.info("%s warmed up in %.1f s (pull and snapshot)", guest.image.label, seconds)
    else:
        logger.info("%s is warm (probed in %.0f ms)", guest.image.label, seconds * 1000)
    return Warmth(outcome.restored, seconds)
