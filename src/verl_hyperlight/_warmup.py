"""Warm-up: each guest runs once per node before its first case, outside any case's time.

The first run of a guest pulls its image and takes the warm snapshot; that must never be
charged to a case. One process per node does it, under a file lock beside hluk's cache, and
leaves a marker there; the others wait on the lock and find the marker.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from . import _hluk
from ._errors import BackendError
from ._guest import Guest
from .guest import runner

logger = logging.getLogger("verl_hyperlight")

# A failed warm-up is tried again on a case after this long, not on every case.
RETRY_AFTER_SECONDS = 30.0
WARM_UP_TIMEOUT_SECONDS = 900.0
# The warm-up's workload: it fails unless the warm snapshot holds the runner.
PROBE = f"import sys; assert {runner.MODULE_NAME!r} in sys.modules"


def cache_root() -> Path:
    """hluk's cache directory, as hluk finds it."""
    if os.environ.get("HLUK_CACHE_DIR"):
        return Path(os.environ["HLUK_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "hluk"
    return Path.home() / ".cache" / "hluk"


@dataclass
class _Prepared:
    lock: threading.Lock = field(default_factory=threading.Lock)
    ready: bool = False
    failure: BackendError | None = None
    retry_at: float = 0.0


# The one piece of global state: which guests this process has prepared (or failed to), keyed
# by hluk path and guest arguments. Guarded by _registry_lock; each entry by its own lock, so
# threads waiting for one guest's warm-up do not block another's.
_registry: dict[tuple[str, ...], _Prepared] = {}
_registry_lock = threading.Lock()


def ensure_ready(path: str, guest: Guest) -> None:
    """Return once `guest` is warm on this node; BackendError if it cannot be."""
    key = (path, *guest.args())
    with _registry_lock:
        entry = _registry.setdefault(key, _Prepared())
    if entry.ready:
        return
    with entry.lock:
        if entry.ready:
            return
        if entry.failure is not None and time.monotonic() < entry.retry_at:
            raise entry.failure
        try:
            _warm_up(path, guest)
        except BackendError as failure:
            entry.failure = failure
            entry.retry_at = time.monotonic() + RETRY_AFTER_SECONDS
            raise
        entry.ready, entry.failure = True, None


def forget() -> None:
    """Drop what this process knows of prepared guests (for tests and after hluk upgrades)."""
    with _registry_lock:
        _registry.clear()


def _warm_up(path: str, guest: Guest) -> None:
    version = _hluk.check_version(path)
    args = guest.args()
    digest = hashlib.sha256("\0".join([os.path.realpath(path), version, *args]).encode())
    directory = cache_root() / "verl-hyperlight"
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / f"{digest.hexdigest()[:24]}.ready"
    with FileLock(str(marker.with_suffix(".lock"))):
        if marker.exists():
            return
        logger.info("warming up %s (pull and snapshot, once per node)", guest.image.label)
        started = time.monotonic()
        done = _hluk.run_to_exit([path, "run", *args, "--exec", PROBE], WARM_UP_TIMEOUT_SECONDS)
        if done is None:
            raise BackendError(
                f"warming up {guest.image.label} took more than {WARM_UP_TIMEOUT_SECONDS:.0f} s: "
                "check the node's network to the image registry and hluk's cache",
                "warm-up-timeout",
            )
        if done.hluk_status != 0:
            console = done.console.decode(errors="replace")
            raise _hluk.classify(done.hluk_stderr, done.hluk_status, path, console)
        marker.write_text(f"{version}\n")
        logger.info("%s is warm after %.1f s", guest.image.label, time.monotonic() - started)
