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
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from . import _hluk
from ._errors import BackendError
from ._guest import Guest, probe_code

logger = logging.getLogger("verl_hyperlight")

# A failed warm-up is tried again on a case after this long, not on every case.
RETRY_AFTER_SECONDS = 30.0
# A probe may pull the image and boot the guest first.
WARM_UP_TIMEOUT_SECONDS = 900.0
PROBE_RUN_TIMEOUT_SECONDS = 60.0
# hluk's settings that change what it runs for one set of arguments: part of a warm state.
IDENTITY_SETTINGS = ("HLUK_REGISTRY", "HLUK_IMAGE_VERSION")
# Where hluk keeps what a warm run needs, beneath its cache directory.
CACHE_PARTS = ("snapshots", "rootfs")


def cache_root() -> Path:
    """hluk's cache directory, as hluk finds it."""
    if os.environ.get("HLUK_CACHE_DIR"):
        return Path(os.environ["HLUK_CACHE_DIR"]).absolute()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).absolute() / "hluk"
    return Path.home() / ".cache" / "hluk"


@dataclass(frozen=True)
class Warmth:
    """What a probe found: the snapshot restored (True), taken now (False), or hluk did not
    say (None); and how long the probe took."""

    restored: bool | None
    seconds: float


@dataclass
class _Prepared:
    lock: threading.Lock = field(default_factory=threading.Lock)
    # hluk's cache directories as they were when the guest was last seen warm; None: not seen.
    seen: tuple[object, ...] | None = None
    failure: BackendError | None = None
    retry_at: float = 0.0


# The one piece of global state: what this process knows of each guest's warm state, keyed by
# its identity. Guarded by _registry_lock; each entry by its own lock, so cases waiting for one
# guest's probe do not block another's.
_registry: dict[tuple[object, ...], _Prepared] = {}
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
    return (path, str(cache_root()), settings, rootfs, *guest.args())


def _cache_state() -> tuple[object, ...]:
    """hluk's snapshot and image directories, as far as a removal or a new snapshot changes
    them."""
    state: list[object] = []
    root = cache_root()
    for part in CACHE_PARTS:
        try:
            stat = os.stat(root / part)
        except OSError:
            state.append(None)
        else:
            state.append((stat.st_ino, stat.st_mtime_ns, stat.st_nlink))
    return tuple(state)


def ensure_ready(path: str, guest: Guest) -> Warmth | None:
    """Return once `guest` is warm on this node (what a probe found, or None when nothing
    changed since it was last seen warm); BackendError if it cannot be."""
    key = _identity(path, guest)
    with _registry_lock:
        entry = _registry.setdefault(key, _Prepared())
    if entry.seen is not None and entry.seen == _cache_state():
        return None
    with entry.lock:
        if entry.seen is not None and entry.seen == _cache_state():
            return None
        if entry.failure is not None and time.monotonic() < entry.retry_at:
            raise entry.failure
        try:
            warmth = _warm_up(path, guest)
        except BackendError as failure:
            entry.failure = failure
            entry.retry_at = time.monotonic() + RETRY_AFTER_SECONDS
            raise
        # As the probe left it: a snapshot it took changed the directories.
        entry.seen, entry.failure = _cache_state(), None
        return warmth


def invalidate(path: str, guest: Guest) -> None:
    """Have the next case of `guest` see it warm again first."""
    with _registry_lock:
        entry = _registry.get(_identity(path, guest))
    if entry is not None:
        entry.seen = None


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


def _probe(path: str, guest: Guest) -> _hluk.RawOutcome:
    nonce = secrets.token_hex(16)
    argv = [path, "--log-level", "info", "run", *guest.args(), "--exec", probe_code(nonce)]
    return _hluk.run(argv, nonce, PROBE_RUN_TIMEOUT_SECONDS, WARM_UP_TIMEOUT_SECONDS)


def _warm_up(path: str, guest: Guest) -> Warmth:
    _hluk.check_version(path)
    lock = _lock()
    try:
        lock.acquire()
    except OSError as exc:
        raise _cache_unusable(exc) from None
    try:
        started = time.monotonic()
        outcome = _probe(path, guest)
        if outcome.ending in (_hluk.Ending.NOT_STARTED, _hluk.Ending.KILLED):
            # As a case is: a case of another process that cold-booted at that moment (its
            # view of the cache was stale) may have removed the snapshot being written.
            outcome = _probe(path, guest)
    finally:
        lock.release()
    seconds = time.monotonic() - started
    if outcome.ending is _hluk.Ending.STARTUP_TIMEOUT:
        raise BackendError(
            f"warming up {guest.image.label} took more than {WARM_UP_TIMEOUT_SECONDS:.0f} s: "
            "check the node's network to the image registry and hluk's cache",
            "warm-up-timeout",
        )
    if outcome.ending is not _hluk.Ending.FINISHED:
        raise _hluk.failure(outcome, path)
    if outcome.restored is False:
        logger.info("%s warmed up in %.1f s (pull and snapshot)", guest.image.label, seconds)
    else:
        logger.info("%s is warm (probed in %.0f ms)", guest.image.label, seconds * 1000)
    return Warmth(outcome.restored, seconds)
