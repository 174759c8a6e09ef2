"""The frames the guest runner writes on the console and the host reads: their one definition.

hluk's console is a terminal the guest shares with whatever else prints there (hluk's driver,
a solution writing to the console around its streams), so the runner's reports are lines of
their own, marked with a nonce the host chose for the case:

    \\n<nonce> start\\n                              the solution starts: run_timeout runs from here
    \\n<nonce> end STATUS ELAPSED LIMIT OUT ERR\\n     the solution has ended: its exit status, its
                                                   wall time, the stream that passed the output
                                                   limit (or -), and the sizes of the output
                                                   copied out next; the host's clock stops here
    \\n<nonce> stdout BASE64\\n, \\n<nonce> stderr BASE64\\n
                                                   the output, in chunks of at most CHUNK bytes
    \\n<nonce> done\\n                               the output is complete

This module is loaded into the guest with the runner (it uses nothing outside the standard
library) and imported by the host's parser, so both sides read the same definitions.
"""

from __future__ import annotations

from dataclasses import dataclass

# What the solution's stdout and stderr may each hold; past it the solution is stopped.
OUTPUT_LIMIT = 16 * 1024 * 1024
# The status of a solution stopped for its output: 128 + SIGXFSZ, what a process gets when it
# exceeds its file-size limit.
OUTPUT_LIMIT_STATUS = 153
# Output bytes per frame: its base64 line (44 KiB) fits one hluk host call (64 KiB), so each
# frame is one console write, and the host never holds more than a frame of undecoded text.
CHUNK = 32 * 1024

START = b"start"
END = b"end"
STDOUT = b"stdout"
STDERR = b"stderr"
DONE = b"done"
STREAMS = {STDOUT: "stdout", STDERR: "stderr"}
# The longest line a frame makes: an output frame (nonce, kind and base64 of a full chunk).
MAX_FRAME_LINE = 128 + (CHUNK + 2) // 3 * 4


@dataclass(frozen=True)
class End:
    """The runner's report of how the solution ended."""

    status: int
    elapsed: float
    limit_hit: str | None  # "stdout" or "stderr" when one passed OUTPUT_LIMIT
    sizes: tuple[int, int]  # the bytes of stdout and stderr that follow


def frame(nonce: bytes, kind: bytes, *fields: bytes) -> bytes:
    """One frame as the runner writes it: a line of its own, whatever preceded it."""
    return b"\n" + b" ".join((nonce, kind, *fields)) + b"\n"


def end_fields(end: End) -> tuple[bytes, ...]:
    return (
        b"%d" % end.status,
        b"%.6f" % end.elapsed,
        (end.limit_hit or "-").encode("ascii"),
        b"%d" % end.sizes[0],
        b"%d" % end.sizes[1],
    )


def parse_end(fields: list[bytes]) -> End:
    """The End an end frame's fields describe; ValueError if they are not the runner's."""
    if len(fields) != 5:
        raise ValueError("an end frame has five fields")
    limit = fields[2].decode("ascii")
    if limit not in ("-", "stdout", "stderr"):
        raise ValueError(f"unknown stream {limit!r}")
    sizes = (int(fields[3]), int(fields[4]))
    if not all(0 <= size <= OUTPUT_LIMIT for size in sizes):
        raise ValueError("an output size beyond the limit")
    return End(int(fields[0]), float(fields[1]), None if limit == "-" else limit, sizes)
