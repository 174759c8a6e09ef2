"""What passes between the host and the guest runner: its one definition.

Into the guest, a case directory (mounted read-only) holds the solution (SOLUTION), or a
program compiled on the host to run in its place (PROGRAM: a static position-independent
executable, with the name it runs by in PROGRAM_NAME), its input (STDIN) and, when the
request has files to write or fetch, FILES: a JSON object {"write": [[path, index], ...],
"fetch": [path, ...]}, each file to write in file_name(index). Paths are the request's, and
only the guest resolves them.

Out of the guest, hluk's console is a terminal the guest shares with whatever else prints there
(hluk's driver, a solution writing to the console around its streams), so the runner's reports
are lines of their own, marked with a nonce the host chose for the case:

    <nonce> refused BASE64      the case cannot run as asked (a request file that cannot be
                                written), and why; it comes instead of start
    <nonce> start               the solution starts: run_timeout runs from here
    <nonce> end STATUS ELAPSED LIMIT OUT ERR FILES
                                the solution has ended: its exit status, its wall time, the
                                stream that passed the output limit (or -), the sizes of the
                                output copied out next, and of each file to fetch (comma-
                                separated sizes or FILE_* values; - when none are asked for);
                                the host's clock stops here
    <nonce> stdout BASE64, <nonce> stderr BASE64, <nonce> file INDEX BASE64
                                the output and the fetched files, in chunks of at most CHUNK
    <nonce> done [last]         the output is complete; `last` when the guest ends next
                                (the solution ended its process: os._exit, a signal, the
                                output limit), which a notebook's host must not wait for

A notebook (the code tool's, ``runner.notebook``) keeps one guest up across calls and
reads each call from the console's input, which hluk hands the guest as text: a request is
the base64 of a JSON object {"nonce": NONCE, "code": TEXT}, in lines of at most
REQUEST_LINE characters, then a line holding REQUEST_END. Base64 survives any decoding of the
input, and its echo (the console echoes what the guest reads) cannot make a frame. Each call
is reported as a case is, with the call's nonce; the notebook's own nonce reports, once, that
it is ready for calls (start, end, done).

A ready guest (``runner.await_case``) is a case's guest started before its case: its case
directory is mounted while still empty, and it reads nothing of it until the host, having
written the case there, sends GO on the console's input; it then runs the case as any other.

This module is loaded into the guest with the runner (it uses nothing outside the standard
library) and imported by the host, so both sides read the same definitions.
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
# What one console write of the report carries at most: one hluk host call. The report's
# frames (its end, the outputs' frames, done) go out together up to it, so that the host,
# woken once per write, is woken once for a small case's whole report, not once per frame.
CONSOLE_WRITE = 64 * 1024
# What a request may move through files, decoded: in, all its files together; out, all the
# fetched files together (one past it, and those after it, are left out); and how many of each.
FILES_IN_LIMIT = 32 * 1024 * 1024
FILES_OUT_LIMIT = 16 * 1024 * 1024
MAX_FILES = 1000
# What became of a file to fetch, instead of its size.
FILE_MISSING = -1  # not a regular file in the guest
FILE_LEFT_OUT = -2  # past FILES_OUT_LIMIT

# The line that starts a ready guest's case: its files are written.
GO = b"go"

# A notebook's requests: base64 lines this long at most (far below what a terminal holds in a
# line, 4 KiB), ended by a line of its own.
REQUEST_LINE = 1024
REQUEST_END = b"."

SOLUTION = "solution.py"
PROGRAM = "program"
PROGRAM_NAME = "program-name"
STDIN = "stdin"
FILES = "files.json"
FILE_PREFIX = "file-"  # of the request's files, numbered (file_name)

REFUSED = b"refused"
START = b"start"
END = b"end"
STDOUT = b"stdout"
STDERR = b"stderr"
FILE = b"file"
DONE = b"done"
LAST = b"last"
STREAMS = {STDOUT: "stdout", STDERR: "stderr"}
# The longest line a frame makes: a file frame (nonce, kind, index and base64 of a full chunk).
MAX_FRAME_LINE = 128 + (CHUNK + 2) // 3 * 4


@dataclass(frozen=True)
class End:
    """The runner's report of how the solution ended."""

    status: int
    elapsed: float
    limit_hit: str | None  # "stdout" or "stderr" when one passed OUTPUT_LIMIT
    sizes: tuple[int, int]  # the bytes of stdout and stderr that follow
    files: tuple[int, ...] = ()  # of each file to fetch: its bytes that follow, or a FILE_*

    @property
    def copied(self) -> int:
        """The bytes that follow: the output and the fetched files."""
        return sum(self.sizes) + sum(size for size in self.files if size > 0)


def file_name(index: int) -> str:
    """The case directory's name for the request's file `index`."""
    return f"{FILE_PREFIX}{index}"


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
        b",".join(b"%d" % size for size in end.files) or b"-",
    )


def parse_end(fields: list[bytes]) -> End:
    """The End an end frame's fields describe; ValueError if they are not the runner's."""
    if len(fields) != 6:
        raise ValueError("an end frame has six fields")
    limit = fields[2].decode("ascii")
    if limit not in ("-", "stdout", "stderr"):
        raise ValueError(f"unknown stream {limit!r}")
    sizes = (int(fields[3]), int(fields[4]))
    if not all(0 <= size <= OUTPUT_LIMIT for size in sizes):
        raise ValueError("an output size beyond the limit")
    files = () if fields[5] == b"-" else tuple(int(size) for size in fields[5].split(b","))
    if len(files) > MAX_FILES or not all(size >= FILE_LEFT_OUT for size in files):
        raise ValueError("not the files of a request")
    if sum(size for size in files if size > 0) > FILES_OUT_LIMIT:
        raise ValueError("fetched files beyond the limit")
    return End(int(fields[0]), float(fields[1]), None if limit == "-" else limit, sizes, files)


def request_lines(nonce: str, code: str) -> bytes:
    """A notebook's request as the host writes it to the console's input."""
    import base64
    import json

    data = base64.b64encode(json.dumps({"nonce": nonce, "code": code}).encode("utf-8"))
    lines = [data[i : i + REQUEST_LINE] for i in range(0, len(data), REQUEST_LINE)]
    return b"\n".join([*lines, REQUEST_END]) + b"\n"
