"""Case directories: where a case's files wait on the host for its micro-VM to mount them.

Each case gets a directory of its own, made and written before hluk starts and removed when
the case ends. Where: VERL_HYPERLIGHT_CASE_DIR when it is set, exactly there; else the tmpfs
/dev/shm, where making, writing and removing them costs a fraction of a journaled file
system's, falling back to the temporary directory (TMPDIR) for a case the tmpfs has no room
for, and for every case when there is no usable tmpfs.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass

from .. import diagnosis, settings
from ..errors import CauseCounts
from ..guest import protocol
from ..hluk import cleaner

logger = logging.getLogger("verl_hyperlight")

# The usual tmpfs of a Linux host (and of a container: Docker and Kubernetes mount one there).
TMPFS = "/dev/shm"
# The tmpfs is memory shared with others (torch's and NCCL's shared memory, Ray's object
# store), which fail when it fills: case directories never take it past half full.
TMPFS_KEEP_FREE = 0.5
FULL = frozenset((errno.ENOSPC, errno.EDQUOT))
MIB = 1024 * 1024


class _Warnings(CauseCounts):
    """Why cases leave the tmpfs for TMPDIR, said once per cause per process: a node whose
    tmpfs is small says so once, not once per case."""

    def once(self, cause: str, why: str) -> None:
        if self.first(cause):
            logger.warning(
                "verl-hyperlight: %s", diagnosis.tmpfs_passed_over(why, tempfile.gettempdir())
            )


_warnings = _Warnings()


def files_of(
    code: bytes,
    stdin: bytes,
    files: tuple[tuple[str, bytes], ...],
    fetch: tuple[str, ...],
    program_name: str | None = None,
) -> list[tuple[str, bytes]]:
    """What the case directory the guest mounts holds, by name (see guest/protocol.py): the
    request's paths are data in it, never paths on the host. With `program_name`, `code` is a
    compiled program, run by that name."""
    if program_name is None:
        found = [(protocol.SOLUTION, code), (protocol.STDIN, stdin)]
    else:
        found = [
            (protocol.PROGRAM, code),
            (protocol.PROGRAM_NAME, program_name.encode()),
            (protocol.STDIN, stdin),
        ]
    if files or fetch:
        found += [(protocol.file_name(index), data) for index, (_, data) in enumerate(files)]
        manifest = {
            "write": [[path, index] for index, (path, _) in enumerate(files)],
            "fetch": list(fetch),
        }
        found.append((protocol.FILES, json.dumps(manifest).encode()))
    return found


@dataclass(frozen=True)
class CaseDir:
    """A case directory, written: its path and the names of the files in it."""

    path: str
    names: tuple[str, ...]

    @property
    def parent(self) -> str:
        """The directory holding this one."""
        return os.path.dirname(self.path)

    @property
    def workdir(self) -> str | None:
        """Where hluk must run for its `mount` (None: anywhere, the mount's path is
        absolute)."""
        return self.parent if ":" in self.path else None

    def mount(self, target: str) -> str:
        """hluk's --mount of this directory, read-only at `target` in the guest."""
        # hluk splits --mount at its first colon: a case directory whose path has one is named
        # relative to the directory hluk runs in (its parent).
        source = os.path.basename(self.path) if ":" in self.path else self.path
        return f"{source}:{target}:ro"

    def remove(self) -> None:
        """Remove the directory and the files written in it."""
        _remove_case(self.path, self.names)


def make(files: list[tuple[str, bytes]], room: int = 0) -> CaseDir:
    """A new case directory, only ours, holding `files`; BackendError when none can be made
    or written, with what to do. `room`: the bytes that will be written in it beyond `files`
    (a compile's program and objects), counted where it is placed (on the tmpfs only while
    that leaves it half free)."""
    chosen = settings.CASE_DIR.value()
    size = sum(len(data) for _, data in files)
    if chosen:
        root = settings.absolute(chosen)
    else:
        if _tmpfs_has_room(size + room, "a compile's directory" if room else "a case"):
            try:
                return _make_in(TMPFS, files)
            except OSError as exc:
                if exc.errno in diagnosis.OUT_OF_DESCRIPTORS:  # the worker's want, not the tmpfs's
                    raise diagnosis.case_directory_unusable(
                        TMPFS, exc, size, full=False, chosen=False
                    ) from None
                full = "full" if exc.errno in FULL else "unusable"
                _warnings.once(
                    f"tmpfs-{exc.errno}",
                    f"the tmpfs {TMPFS} is {full} for case directories ({exc.strerror})",
                )
        root = tempfile.gettempdir()
    try:
        return _make_in(root, files)
    except OSError as exc:
        raise diagnosis.case_directory_unusable(
            root, exc, size, full=exc.errno in FULL, chosen=bool(chosen)
        ) from None


def make_empty() -> CaseDir:
    """A new case directory, only ours and empty, for a guest started before its case (filled
    by `fill`): made where `make` makes a small case's; OSError when it cannot be."""
    chosen = settings.CASE_DIR.value()
    if chosen:
        root = settings.absolute(chosen)
    else:
        root = TMPFS if _tmpfs_has_room(0) else tempfile.gettempdir()
    return _make_in(root, [])


def takes(made: CaseDir, size: int) -> bool:
    """Whether a case of `size` bytes may be written into `made`, a directory of `make_empty`:
    as `make` would place it (on the tmpfs only while that leaves it half free)."""
    return made.parent != TMPFS or bool(settings.CASE_DIR.value()) or _tmpfs_has_room(size)


def fill(made: CaseDir, files: list[tuple[str, bytes]]) -> CaseDir:
    """`made`, a directory of `make_empty`, holding `files`, written in place (a guest that
    mounted it sees them); OSError when they cannot all be written, the directory then
    removed."""
    filled = CaseDir(made.path, tuple(name for name, _ in files))
    try:
        _write_case(made.path, files)
    except OSError:
        filled.remove()
        raise
    return filled


def free_bytes(made: CaseDir) -> int | None:
    """The bytes free for us on the file system holding `made` (None: it cannot be told)."""
    try:
        found = os.statvfs(made.path)
    except OSError:
        return None
    return found.f_bavail * found.f_frsize


def _tmpfs_has_room(size: int, what: str = "a case") -> bool:
    """Whether `what` (a case, a compile) of `size` bytes fits on the tmpfs and leaves it at
    least half free."""
    try:
        found = os.statvfs(TMPFS)
    except OSError as exc:
        _warnings.once("tmpfs-missing", f"there is no tmpfs at {TMPFS} ({exc.strerror})")
        return False
    total = found.f_blocks * found.f_frsize
    free = found.f_bavail * found.f_frsize
    if size > total * (1 - TMPFS_KEEP_FREE):
        _warnings.once(
            f"tmpfs-too-small-for-{what}",
            f"the tmpfs {TMPFS} ({total / MIB:.0f} MiB) is too small for {what} of "
            f"{size / MIB:.1f} MiB (case directories keep it at least half free)",
        )
        return False
    if free - size < total * TMPFS_KEEP_FREE:
        _warnings.once(
            "tmpfs-full",
            f"the tmpfs {TMPFS} has {free / MIB:.0f} MiB free of {total / MIB:.0f} MiB "
            "(case directories keep it at least half free)",
        )
        return False
    return True


def _make_in(root: str, files: list[tuple[str, bytes]]) -> CaseDir:
    """A case directory in `root` holding `files`; OSError, leaving nothing behind, when it
    cannot be made or written."""
    # As mkdtemp makes one, less its name's eight random.choice calls: 64 random bits do not
    # collide.
    cleaner.watch(root)  # before the directory is made: a death after leaves none behind
    made = CaseDir(
        f"{root.rstrip('/')}/{cleaner.token()}{secrets.token_hex(8)}",
        tuple(name for name, _ in files),
    )
    os.mkdir(made.path, 0o700)
    try:
        _write_case(made.path, files)
    except OSError:
        made.remove()
        raise
    return made


def _write_case(case_dir: str, files: list[tuple[str, bytes]]) -> None:
    # Unbuffered, straight from the request's bytes: a file object costs more than the write.
    # The mode is open()'s, as the guest has always seen it; a program's is executable.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    for name, data in files:
        mode = 0o777 if name == protocol.PROGRAM else 0o666
        fd = os.open(f"{case_dir}/{name}", flags, mode)  # a name of protocol's, no join
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


def _remove_case(case_dir: str, names: tuple[str, ...]) -> None:
    """Remove a case directory: the files written in it, then it (a walk of the tree costs
    more than that); the walk only when that fails (a case whose files were not all written)."""
    try:
        for name in names:
            os.unlink(f"{case_dir}/{name}")
        os.rmdir(case_dir)
    except OSError:
        shutil.rmtree(case_dir, ignore_errors=True)
