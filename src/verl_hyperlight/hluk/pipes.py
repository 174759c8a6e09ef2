"""Pipes to and from hluk, made as few pages as what they carry needs."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable

# A pipe's pages count toward its user's fs.pipe-user-pages-soft (16,384 pages across the node:
# 1,024 pipes of the default 16), past which every new pipe of that user, Ray's and torch's
# too, is made with 2 pages. Pipes that carry lines only are made this size, one page, so that
# a case holds 17 pages (its console's 16 and one of one; 18 through a spawner, whose status
# pipe is a third) and a notebook 18.
LINE_PIPE_SIZE = 4096


def close(fds: Iterable[int | None]) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)


def carry_lines(fd: int) -> None:
    """Make the pipe of `fd` LINE_PIPE_SIZE."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, LINE_PIPE_SIZE)
    except OSError:
        pass  # EBUSY: it holds more already (a hluk's first words): it keeps its size
