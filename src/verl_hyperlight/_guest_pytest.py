"""pytest for the guest: the host's pytest (the `pytest` extra pins it) and its dependencies,
copied once into a directory of their own that `language: "pytest"` guests mount read-only.

hluk's python image holds the standard library only. pytest and what it imports are pure
Python, so the guest can import them from a mount, before its warm snapshot is taken: a case
pays nothing for them. A copy, not the host's site-packages: the guest sees these packages and
their metadata and nothing else of the host, so no plugin of the host's is loaded.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import threading

from ._errors import BackendError
from ._warmup import cache_root

EXTRA = "verl-hyperlight[pytest]"
# What `pytest` imports on the guest's CPython 3.12 (exceptiongroup and tomli only before
# 3.11), by their top-level names; `py` is pytest's shim of the old pylib module.
PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py")
# The distributions these come from: their versions name the copy (another installation is
# another copy), and their metadata goes with it (pytest reads pluggy's version there).
DISTRIBUTIONS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")

_lock = threading.Lock()


class Missing(Exception):
    """pytest cannot be given to the guest; the message says what to install."""


def _sources() -> list[str]:
    """Each package's host path: a package's directory, or a module's file."""
    found = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None:
            raise Missing(
                f"language 'pytest' needs pytest on this node (the {name!r} module is missing): "
                f"pip install '{EXTRA}' where verl-hyperlight runs"
            )
        locations = spec.submodule_search_locations
        path = locations[0] if locations else spec.origin
        if path is None:
            raise Missing(f"language 'pytest': the {name!r} module has no files to give the guest")
        found.append(path)
    return found


def _distributions() -> list[importlib.metadata.Distribution]:
    try:
        return [importlib.metadata.distribution(name) for name in DISTRIBUTIONS]
    except importlib.metadata.PackageNotFoundError as exc:
        raise Missing(
            f"language 'pytest' needs pytest on this node ({exc.name} is not installed): "
            f"pip install '{EXTRA}' where verl-hyperlight runs"
        ) from None


def _metadata_directory(distribution: importlib.metadata.Distribution) -> str:
    """A distribution's .dist-info directory: pytest reads its dependencies' versions there."""
    for file in distribution.files or ():
        if file.parts[0].endswith(".dist-info"):
            return str(distribution.locate_file(file.parts[0]))
    raise Missing(f"language 'pytest': {distribution.name} has no .dist-info directory")


def library() -> str:
    """The directory holding pytest for the guest, made on first use (beside hluk's cache);
    Missing if this node has no pytest, BackendError if the directory cannot be made."""
    distributions = _distributions()
    versions = "-".join(f"{d.name}{d.version}" for d in distributions)
    target = os.path.join(cache_root(), "verl-hyperlight", "pytest-" + versions)
    if ":" in target:  # hluk splits --mount at its first colon
        raise BackendError(
            f"cannot give pytest to the guest from {target}: hluk's mounts cannot name a path "
            "holding ':'; point HLUK_CACHE_DIR elsewhere",
            "pytest-library",
        )
    if os.path.isdir(target):
        return target
    with _lock:
        if not os.path.isdir(target):
            _copy([*_sources(), *map(_metadata_directory, distributions)], target)
    return target


def _copy(sources: list[str], target: str) -> None:
    # Written under another name and renamed: another process making the same copy at the same
    # moment, or one killed halfway, never leaves a guest a partial one.
    part = f"{target}.{os.getpid()}.part"
    try:
        shutil.rmtree(part, ignore_errors=True)
        os.makedirs(part)
        for path in sources:
            destination = os.path.join(part, os.path.basename(path))
            if os.path.isdir(path):
                shutil.copytree(path, destination, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copyfile(path, destination)
        try:
            os.rename(part, target)
        except OSError:
            if not os.path.isdir(target):
                raise
    except OSError as exc:
        raise BackendError(
            f"cannot copy pytest for the guest into {target} ({exc}): point HLUK_CACHE_DIR at "
            "a writable directory",
            "pytest-library",
        ) from None
    finally:
        shutil.rmtree(part, ignore_errors=True)
