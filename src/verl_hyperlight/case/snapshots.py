"""hluk's cache as this package reads it: what one warm snapshot serves, and whether a guest's
snapshot is still there.

The snapshot, not a marker, is the warm state: it can go away behind this process's back
(`hluk cache clean`; hluk prunes a snapshot when its image is pulled again or the local rootfs
is rebuilt). So a guest's gate compares the guest's own snapshot directory and the rootfs file
its stamp names with what they were when the guest was last seen warm (two stat calls, `state`
of `watched`), and probes again when they changed; other guests' snapshots, taken or removed,
are not its concern. Where no stamp says which snapshot is the guest's (a hluk whose cache is
laid out otherwise), hluk's whole snapshot and image directories are compared instead.
"""

from __future__ import annotations

import os

from .. import settings
from .guests import Guest

# hluk's settings that change what it runs for one set of arguments: part of a warm state.
IDENTITY_SETTINGS = (settings.HLUK_REGISTRY, settings.HLUK_IMAGE_VERSION)
# Where hluk keeps what a warm run needs, beneath its cache directory.
SNAPSHOTS, IMAGES = "snapshots", "rootfs"
# The file of a snapshot's directory holding hluk's stamp: what the snapshot was taken under,
# one `name=value` a line (hluk's snapshot key, the rootfs file's path, size and mtime, the
# memory, the entry point), the warm-exec last, to the end (hyperlight-unikraft's src/cli).
STAMP_FILE = "stamp"


def identity(path: str, guest: Guest) -> tuple[object, ...]:
    """What one warm snapshot serves: hluk, its cache, the settings that change what it runs,
    the guest's arguments, and a local rootfs's size and mtime (hluk's snapshot of a rebuilt
    rootfs is a new one)."""
    identity = tuple(setting.value() for setting in IDENTITY_SETTINGS)
    rootfs: tuple[int, int] | None = None
    if guest.image.local_rootfs is not None:
        try:
            stat = os.stat(guest.image.local_rootfs)
            rootfs = (stat.st_size, stat.st_mtime_ns)
        except OSError:
            rootfs = None  # hluk will say what is wrong with it
    return (path, settings.hluk_cache_directory(), identity, rootfs, *guest.args())


def state(paths: tuple[str, ...]) -> tuple[object, ...]:
    """The `paths`' state, as far as their removal, replacement or rewriting changes it."""
    state: list[object] = []
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError:
            state.append(None)
        else:
            state.append((stat.st_ino, stat.st_mtime_ns, stat.st_size, stat.st_nlink))
    return tuple(state)


def whole_cache() -> tuple[str, ...]:
    """hluk's snapshot and image directories: what a new snapshot or a removal changes."""
    root = settings.hluk_cache_directory()
    return (os.path.join(root, SNAPSHOTS), os.path.join(root, IMAGES))


def watched(guest: Guest) -> tuple[str, ...]:
    """What of hluk's cache says whether `guest`'s warm snapshot is still there: the directory
    of each snapshot whose stamp says it is the guest's and current, and the rootfs file the
    stamp names (pulled again or rebuilt, it makes the snapshot stale); hluk's whole snapshot
    and image directories when no stamp says so."""
    root = settings.hluk_cache_directory()
    snapshots = os.path.join(root, SNAPSHOTS)
    try:
        names = sorted(os.listdir(snapshots))
    except OSError:
        names = []
    args = guest.args()
    warm_exec = args[args.index("--warm-exec") + 1]
    found: list[str] = []
    for name in names:
        if "." in name:  # `<slot>.part`, a snapshot being written
            continue
        try:
            with open(os.path.join(snapshots, name, STAMP_FILE), encoding="utf-8") as file:
                stamp = file.read()
        except (OSError, UnicodeDecodeError):
            continue
        rootfs = _rootfs_of(stamp, guest, warm_exec, root)
        if rootfs is not None:
            found += [os.path.join(snapshots, name), rootfs]
    return tuple(found) or whole_cache()


def _rootfs_of(stamp: str, guest: Guest, warm_exec: str, root: str) -> str | None:
    """The rootfs file that a snapshot's `stamp` names, if the stamp is one hluk writes for
    `guest` (run with `warm_exec`) and is current: the file still has the size and mtime it
    records; else None."""
    head, found, tail = stamp.partition("\nwarm_exec=")
    if not found or tail != warm_exec + "\n":
        return None
    fields: dict[str, str] = {}
    for line in head.splitlines():
        key, _, value = line.partition("=")
        fields[key] = value
    rootfs = fields.get("rootfs", "")
    if fields.get("entry") != "" or fields.get("scratch_mb") != str(guest.memory_mb):
        return None
    if guest.image.local_rootfs is not None:
        if rootfs != os.path.realpath(guest.image.local_rootfs):
            return None
    else:
        # A published image is pulled to rootfs/<host>/<repository>/<tag>.cpio.
        images = os.path.join(os.path.realpath(root), IMAGES, "")
        name = guest.image.args[guest.image.args.index("--runtime") + 1]
        repository = name.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
        if not rootfs.startswith(images) or os.path.basename(os.path.dirname(rootfs)) != repository:
            return None
    try:
        stat = os.stat(rootfs)
    except OSError:
        return None
    if (fields.get("size"), fields.get("mtime")) != (str(stat.st_size), str(stat.st_mtime_ns)):
        return None
    return rootfs
