"""The hluk executable: which one runs (HLUK_PATH, else the one on PATH), and whether it is
one this package drives (its --version, 0.19.0 or later)."""

from __future__ import annotations

import os
import re
import secrets
import shutil

from .. import deadlines, diagnosis, settings
from ..outcome import Ending, RawOutcome
from .watch import run

MINIMUM_VERSION = (0, 19, 0)
VERSION_TIMEOUT_SECONDS = 30.0
# hluk's own banner (clap's: the program's name, then its version), as the first thing it
# prints: another program's version (`python3 --version`: "Python 3.11.2") is not hluk's.
_VERSION = re.compile(r"hluk ((\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?)(?:\s|$)")


def hluk_path() -> str:
    """The hluk to run: HLUK_PATH, else the one on PATH (absolute either way)."""
    chosen = settings.HLUK_PATH.value()
    if chosen is not None:
        return settings.absolute(chosen)
    # Every case asks: the one PATH led to last is taken again while it is still there and
    # PATH is the same (a PATH walk is a stat per directory).
    search = settings.variables(("PATH",)).get("PATH")
    seen = _found_on_path.get(search)
    if seen is not None and os.access(seen, os.X_OK) and not os.path.isdir(seen):
        return seen
    found = shutil.which("hluk")
    if found is None:
        # Installed, but where the installer puts it, which PATH may not name yet.
        installed = os.path.join(settings.hluk_install_directory(), "hluk")
        raise diagnosis.not_on_path(installed if os.access(installed, os.X_OK) else None)
    found = os.path.abspath(found)
    _found_on_path.clear()
    _found_on_path[search] = found
    return found


# The hluk found on PATH last, by the PATH it was found on.
_found_on_path: dict[str | None, str] = {}


def identity(path: str) -> tuple[int, ...]:
    """The hluk file at `path` as it is now: replaced in place (an upgrade), it is another
    (device, inode, size and mtime); () when it cannot be seen (its start says why)."""
    try:
        found = os.stat(path)
    except OSError:
        return ()
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)


def run_to_exit(argv: list[str], timeout: float) -> RawOutcome:
    """Run hluk for something other than a case (--version): until it exits, or `timeout`
    (ending STARTUP_TIMEOUT). What it printed on its console is in ``preamble``."""
    # A nonce no output contains: the run is never "started", so `timeout` bounds all of it.
    return run(argv, secrets.token_hex(16), deadlines.only(timeout))


def parse_version(text: str) -> tuple[tuple[int, ...], str] | None:
    """hluk's version in `text`, as a key that orders it (a pre-release sorts before its
    release, as semantic versioning orders them) and as written."""
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    release = tuple(int(part) for part in match.groups()[1:4])
    return (*release, 0 if match.group(5) else 1), match.group(1)


def check_version(path: str) -> str:
    """Run `hluk --version` and refuse a hluk older than 0.19.0; returns the version."""
    done = run_to_exit([path, "--version"], VERSION_TIMEOUT_SECONDS)
    if done.ending is Ending.SPAWNER_DIED:
        # Lost with the spawner that started it: no answer of hluk's. Asked once more, of
        # another spawner (the dead one is handed out no more), as a case's run is retried.
        done = run_to_exit([path, "--version"], VERSION_TIMEOUT_SECONDS)
    if done.ending is Ending.STARTUP_TIMEOUT:
        raise diagnosis.version_unanswered(path, VERSION_TIMEOUT_SECONDS)
    if done.ending in (Ending.KILLED, Ending.SPAWNER_DIED):
        raise diagnosis.failure(done, path)
    text = done.preamble.decode(errors="replace").strip()
    version = parse_version(text)
    if done.hluk_status != 0 or version is None:
        printed = done.hluk_status == 0
        raise diagnosis.version_failed(path, done.hluk_error or text or done.hluk_stderr, printed)
    key, written = version
    if key < (*MINIMUM_VERSION, 1):
        raise diagnosis.too_old(path, written, key[3] == 0, MINIMUM_VERSION)
    return written
