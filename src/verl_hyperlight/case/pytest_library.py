"""pytest for the guest: the host's pytest (the `pytest` extra pins it) and its dependencies,
copied once into a directory of their own that `language: "pytest"` guests mount read-only.

hluk's python image holds the standard library only. pytest and what it imports are pure
Python, so the guest can import them from a mount, before its warm snapshot is taken: a case
pays nothing for them. A copy, not the host's site-packages: the guest sees these packages and
their metadata and nothing else of the host, so no plugin of the host's is loaded.

The copies are shared by every process that shares hluk's cache: the workers of a node, and
pods whose caches are one hostPath (their process ids are no one's to tell apart). So:
- a copy is written into a directory of a random name and renamed into place whole, the
  `WHOLE` file in it written last; a directory of a copy's name without that file is not one,
  and is made again;
- each process that may mount a copy holds its lock file shared (flock) for the rest of its
  life; `COPYING_LOCK`, held exclusively, is taken to make a copy and to remove what is left:
  the copies no process holds (pytest upgraded, its old copy unused), and the `.part`
  directories of copiers that died (a live one would hold `COPYING_LOCK`);
- a cache this process cannot write (pre-built, mounted read-only) is used as it is, without
  locks, when its copy is whole: nothing of ours can remove it there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.metadata
import importlib.util
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from .. import diagnosis, settings
from ..errors import BackendError, Diagnosis

# What `pytest` imports on the guest's CPython 3.12 (exceptiongroup and tomli only before
# 3.11), by their top-level names; `py` is pytest's shim of the old pylib module.
PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py")
# The distributions these come from: their versions name the copy (another installation is
# another copy), and their metadata goes with it (pytest reads pluggy's version there).
DISTRIBUTIONS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")
# A copy's directory is named PREFIX + the versions; its lock file is that name + LOCK_SUFFIX,
# the directory it is written in that name, a random part and PART_SUFFIX (see above).
PREFIX = "pytest-"
LOCK_SUFFIX = ".lock"
PART_SUFFIX = ".part"
WHOLE = ".whole"
COPYING_LOCK = "copying-pytest.lock"
# A copy that failed (a full disk, a cache that cannot be written) is tried again after this
# long: meanwhile pytest cases are answered with its failure at once, rather than each writing
# megabytes to fail again; a disk freed is seen within this long.
RETRY_SECONDS = 60.0


class Missing(Exception):
    """pytest cannot be given to the guest: its `diagnosis` says what to install."""

    def __init__(self, diagnosis: Diagnosis) -> None:
        super().__init__(str(diagnosis))
        self.diagnosis = diagnosis


@dataclass(frozen=True)
class _Copy:
    """The copy this process's pytest names in one hluk cache, and the directories holding the
    distributions' metadata as they were when it was chosen: pip changes them when it upgrades
    one (the old version's .dist-info goes, the new one's comes)."""

    cache: str
    path: str
    sites: tuple[str, ...]
    installed: tuple[tuple[int, int], ...]

    def serves(self, cache: str) -> bool:
        """Whether a case in `cache` mounts this copy: a stat call for each directory of
        metadata (one, mostly) and one for the copy's WHOLE file, not the distributions'
        metadata looked up again (milliseconds in an environment of a hundred packages)."""
        return (
            cache == self.cache
            and _stat_all(self.sites) == self.installed
            and os.path.isfile(os.path.join(self.path, WHOLE))
        )


@dataclass(frozen=True)
class _Failed:
    """A copy into `cache` that failed, and when to try it again."""

    cache: str
    failure: BackendError
    retry_at: float


# This process's knowledge of the copies (the one it mounts, the last failure to make one, the
# lock files it holds shared, by path, for its life): changed under _lock only, by one thread
# at a time; `library` reads _current without it, a reference read whole.
_lock = threading.Lock()
_current: _Copy | None = None
_failed: _Failed | None = None
_held: dict[str, int] = {}


def _remake_lock_in_child() -> None:
    """A thread of the parent's may have held the lock when it forked: the child, where that
    thread does not exist, gets a lock of its own. The lock files held stay held: the child
    holds them with the parent, and may mount their copies."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_remake_lock_in_child)


def library() -> str:
    """The directory holding pytest for the guest, made on first use (beside hluk's cache);
    Missing if this node has no pytest, BackendError if the directory cannot be made."""
    cache = settings.hluk_cache_directory()
    current = _current
    if current is not None and current.serves(cache):
        return current.path
    with _lock:
        return _choose(cache)


def _choose(cache: str) -> str:
    """The copy for `cache`, made if it is not whole, and remembered (under _lock)."""
    global _current, _failed
    failed = _failed
    if failed is not None and failed.cache == cache and time.monotonic() < failed.retry_at:
        raise BackendError(failed.failure.diagnosis)
    distributions = _distributions()
    sites = tuple(sorted({str(d.locate_file("")) for d in distributions}))
    installed = _stat_all(sites)
    versions = "-".join(f"{d.name}{d.version}" for d in distributions)
    path = os.path.join(cache, "verl-hyperlight", PREFIX + versions)
    if ":" in path:  # hluk splits --mount at its first colon
        raise diagnosis.pytest_library_unmountable(path)
    try:
        _make(path, distributions)
    except BackendError as failure:
        _failed = _Failed(cache, failure, time.monotonic() + RETRY_SECONDS)
        raise
    _failed = None
    _current = _Copy(cache, path, sites, installed)
    return path


def _stat_all(paths: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
    found = []
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError:
            found.append((0, 0))
        else:
            found.append((stat.st_ino, stat.st_mtime_ns))
    return tuple(found)


def _sources() -> list[str]:
    """Each package's host path: a package's directory, or a module's file."""
    found = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None:
            raise Missing(diagnosis.pytest_missing(f"the {name!r} module is missing"))
        locations = spec.submodule_search_locations
        path = locations[0] if locations else spec.origin
        if path is None:
            raise Missing(
                Diagnosis(
                    f"language 'pytest': the {name!r} module has no files to give the guest",
                    "",
                    "pytest-missing",
                )
            )
        found.append(path)
    return found


def _distributions() -> list[importlib.metadata.Distribution]:
    try:
        return [importlib.metadata.distribution(name) for name in DISTRIBUTIONS]
    except importlib.metadata.PackageNotFoundError as exc:
        raise Missing(diagnosis.pytest_missing(f"{exc.name} is not installed")) from None


def _metadata_directory(distribution: importlib.metadata.Distribution) -> str:
    """A distribution's .dist-info directory: pytest reads its dependencies' versions there."""
    for file in distribution.files or ():
        if file.parts[0].endswith(".dist-info"):
            return str(distribution.locate_file(file.parts[0]))
    raise Missing(
        Diagnosis(
            f"language 'pytest': {distribution.name} has no .dist-info directory",
            "",
            "pytest-missing",
        )
    )


def _whole(path: str) -> bool:
    return os.path.isfile(os.path.join(path, WHOLE))


def _make(path: str, distributions: list[importlib.metadata.Distribution]) -> None:
    """Hold the copy at `path` for this process's life, and make it if it is not whole; then
    remove what no process holds."""
    directory = os.path.dirname(path)
    newly_held = path + LOCK_SUFFIX not in _held
    try:
        os.makedirs(directory, exist_ok=True)
        _hold(path + LOCK_SUFFIX)
    except OSError as exc:
        if _whole(path):
            return  # a cache this process cannot write: nothing of ours removes its copy
        raise _unwritable(path, exc) from None
    if _whole(path):
        if newly_held:
            # Only if no other process copies or removes at the moment, and come what may:
            # what is left is no case's business.
            with contextlib.suppress(OSError), _copying(directory, wait=False) as alone:
                if alone:
                    _remove_unheld(directory, keep=path)
        return
    try:
        with _copying(directory, wait=True):
            _remove_unheld(directory, keep=path)
            if not _whole(path):  # else made by the process that held the lock before
                # Not whole, so no process mounts it, and no copier writes it: the lock is ours.
                shutil.rmtree(path, ignore_errors=True)
                _copy(distributions, path)
    except OSError as exc:
        raise _unwritable(path, exc) from None


def _unwritable(path: str, exc: OSError) -> BackendError:
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return diagnosis.pytest_library_unwritable(path, exc, full=full, retry_seconds=RETRY_SECONDS)


def _hold(lock_file: str) -> None:
    """Hold `lock_file` shared for the rest of this process's life (once). A lock file is
    removed only under its exclusive lock: one opened before its removal is opened again."""
    while lock_file not in _held:
        descriptor = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH)
            held, named = os.fstat(descriptor), os.stat(lock_file)
        except FileNotFoundError:
            os.close(descriptor)
            continue
        except BaseException:
            os.close(descriptor)
            raise
        if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino):
            _held[lock_file] = descriptor
        else:
            os.close(descriptor)


@contextlib.contextmanager
def _copying(directory: str, *, wait: bool) -> Iterator[bool]:
    """COPYING_LOCK held exclusively (True); or, not `wait`ing, False if another holds it."""
    descriptor = os.open(os.path.join(directory, COPYING_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(descriptor)  # and the lock with it


def _remove_unheld(directory: str, keep: str) -> None:
    """Remove (under COPYING_LOCK) the `.part` directories, whose copiers died (a live one
    would hold the lock), and the copies other than `keep` that no process holds."""
    copies = set()
    for name in os.listdir(directory):
        if not name.startswith(PREFIX):
            continue
        entry = os.path.join(directory, name)
        if name.endswith(PART_SUFFIX):
            shutil.rmtree(entry, ignore_errors=True)
        else:
            copies.add(entry.removesuffix(LOCK_SUFFIX))
    copies.discard(keep)
    for copy in sorted(copies):
        lock_file = copy + LOCK_SUFFIX
        try:
            descriptor = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(copy, ignore_errors=True)
            os.unlink(lock_file)  # under its lock, which _hold sees
        except OSError:
            pass  # held by a process that may mount the copy (or not ours to remove): left
        finally:
            os.close(descriptor)


def _copy(distributions: list[importlib.metadata.Distribution], path: str) -> None:
    """Copy pytest into `path`, through a `.part` directory of a name no other process can
    choose, renamed into place whole (under COPYING_LOCK: no other copier is at work)."""
    sources = [*_sources(), *map(_metadata_directory, distributions)]
    part = f"{path}.{secrets.token_hex(8)}{PART_SUFFIX}"
    try:
        os.mkdir(part)
        for source in sources:
            destination = os.path.join(part, os.path.basename(source))
            if os.path.isdir(source):
                shutil.copytree(source, destination, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copyfile(source, destination)
        with open(os.path.join(part, WHOLE), "x"):
            pass
        os.rename(part, path)
    finally:
        shutil.rmtree(part, ignore_errors=True)
