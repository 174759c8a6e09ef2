"""The CPython that plays the guest's interpreter, chosen in one place.

The stand-in hluk runs its guests with it, and the conformance tests run their reference with
it, so a program is always compared against the interpreter it ran on. hluk's python image is
CPython 3.12: a 3.12 is preferred, found where a plain environment (PATH and HOME only) finds it.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping


def find_python(environ: Mapping[str, str] | None = None) -> str:
    """The guest interpreter's real path, as a process with `environ` (default: this one's)
    chooses it: HLUK_STANDIN_PYTHON, else a CPython 3.12, else the running interpreter."""
    environ = os.environ if environ is None else environ
    chosen = environ.get("HLUK_STANDIN_PYTHON")
    if chosen:
        return chosen
    home = environ.get("HOME") or os.path.expanduser("~")
    candidates = sorted(glob.glob(os.path.join(home, ".pyenv/versions/3.12*/bin/python3.12")))
    candidates += ["/usr/bin/python3.12", "/usr/local/bin/python3.12"]
    for candidate in candidates:
        if os.access(candidate, os.X_OK):
            return os.path.realpath(candidate)
    # Last, a python3.12 on PATH, which may be a version manager's shim that does not run.
    candidate = shutil.which("python3.12", path=environ.get("PATH", os.defpath))
    if candidate:
        try:
            works = subprocess.run(
                [candidate, "-c", "pass"], capture_output=True, env=dict(environ), timeout=60
            )
        except (OSError, subprocess.TimeoutExpired):
            works = None
        if works is not None and works.returncode == 0:
            return os.path.realpath(candidate)
    return os.path.realpath(sys.executable)
