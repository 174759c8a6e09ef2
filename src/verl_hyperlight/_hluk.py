"""How to run it: one hluk process, owned for its whole life.

hluk runs in a process group of its own that is killed whole on a timeout, and it dies with the
reward worker, however the worker dies (``_spawn`` starts it), so a reward worker that is
killed takes its micro-VMs with it. It gets the environment it needs and nothing else of the
worker's. Its console (the guest's merged stdout and stderr) is read as it arrives and scanned
for the runner's frames (``guest/protocol.py``), decoding the output as it comes, so a case
holds its output once; its stderr carries hluk's own messages, of which the end is kept. How
the run ended is decided once, in ``_decide``, from what hluk and the runner said.
"""

from __future__ import annotations

import binascii
import ctypes
import enum
import math
import mmap
import os
import re
import secrets
import select
import shutil
import signal
import threading
import time
from dataclasses import dataclass

from . import _spawn as _spawn_module
from ._errors import BackendError
from .guest import protocol

MINIMUM_VERSION = (0, 19, 0)
INSTALL_COMMAND = (
    "curl -fsSL https://raw.githubusercontent.com/hyperlight-dev/hyperlight-unikraft/main/"
    "install.sh | sh"
)
INSTALL_HINT = f"install it ({INSTALL_COMMAND}) or set HLUK_PATH"
# The console carries both streams base64-encoded, with framing; beyond this the guest is
# misbehaving (writing to the console around the runner) and is stopped.
CONSOLE_LIMIT = 2 * (protocol.OUTPUT_LIMIT * 4 // 3) + (1 << 20)
READ_SIZE = 64 * 1024
# Of hluk's stderr, the end is kept: its decisive `error:` line comes last.
HLUK_STDERR_LIMIT = 64 * 1024
# Of the console text before the solution starts (hluk's driver, the runner's set-up), the end
# is kept for failure messages; nothing the console shows after the start is ever used.
PREAMBLE_LIMIT = 4096
# Copying the output out after the solution ended has a budget of its own, never run_timeout:
# this long, and a second more per MiB announced (at most 58 s for two full streams and the
# fetched files' 16 MiB).
COPY_OUT_SECONDS = 10.0
COPY_OUT_BYTES_PER_SECOND = 1024 * 1024
# After the runner's report hluk only has to tear the VM down.
EXIT_GRACE_SECONDS = 10.0
# Once hluk has exited, what is left in its pipes is read for this long; a descendant that
# kept them open (a wrapper that did not exec) is not waited for.
DRAIN_SECONDS = 1.0
# Once its pipes have ended, how long hluk's exit is waited for before it is killed.
EXIT_NOTICE_SECONDS = 0.1
# How often a case's `cancel` is looked at.
CANCEL_POLL_SECONDS = 0.2
PR_SET_PDEATHSIG = 1
VERSION_TIMEOUT_SECONDS = 30.0
# How long a case's guest may take to start (STARTUP_TIMEOUT_ENV overrides it).
DEFAULT_STARTUP_TIMEOUT = 60.0
STARTUP_TIMEOUT_ENV = "VERL_HYPERLIGHT_STARTUP_TIMEOUT"
# What hluk reads of its environment (hyperlight-unikraft's source): its cache directory
# (HLUK_CACHE_DIR, else XDG_CACHE_HOME, else HOME), its documented settings, RUST_LOG with
# --log-level, and, through its HTTP client and log formatter, the proxy settings and
# NO_COLOR. Nothing else of the worker's environment (tokens, keys) reaches it.
HLUK_SETTINGS = ("HLUK_CACHE_DIR", "HLUK_REGISTRY", "HLUK_IMAGE_VERSION", "HLUK_PROFILE")
PASSED_ENVIRONMENT = (
    "PATH", "HOME", "XDG_CACHE_HOME", *HLUK_SETTINGS, "RUST_LOG", "NO_COLOR",
    "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy",
    "NO_PROXY", "no_proxy",
)  # fmt: skip
# Path-valued: made absolute, as hluk runs in the case directory's parent.
PATH_VARIABLES = ("HOME", "XDG_CACHE_HOME", "HLUK_CACHE_DIR")
# An operator's additions: comma-separated names, or prefixes ending in `*`.
EXTRA_ENVIRONMENT = "VERL_HYPERLIGHT_HLUK_ENV"

_libc = ctypes.CDLL(None, use_errno=True)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?")
_GUEST_EXIT = re.compile(r"error: the guest exited with status (-?\d+)")
# hluk's last line when the guest kernel aborts (hyperlight's GuestAborted, which hluk prints
# as `error: Guest aborted: <code> <message>` and exits 1).
_GUEST_ABORTED = "error: Guest aborted:"
_BASE64 = re.compile(rb"[A-Za-z0-9+/]*={0,2}")


class Ending(enum.Enum):
    """How a hluk run ended, decided once (``_decide``)."""

    # The solution's own endings, answered as Sandbox Fusion answers them.
    FINISHED = "finished"  # the runner reported the end and copied the whole output out
    TIMED_OUT = "timed-out"  # the solution ran past run_timeout and was stopped
    DEADLOCKED = "deadlocked"  # hluk found every guest thread blocked forever
    GUEST_DIED = "guest-died"  # the guest process ended outside the runner (killed in the guest)
    # The guest kernel aborted while the solution ran: hluk has no handling of a guest out of
    # memory, and a guest that exhausts its memory ends this way (`error: Guest aborted: ...`)
    GUEST_ABORTED = "guest-aborted"
    CONSOLE_LIMIT = "console-limit"  # the console passed CONSOLE_LIMIT and was stopped
    # hluk ended with the status of the runner's failed call and no report: the solution broke
    # the runner (replaced or closed what it reports with)
    BROKEN = "broken"
    # Neither the solution's nor the backend's: the case was not run as asked (a request file
    # the guest cannot write), or its caller cancelled it.
    REFUSED = "refused"
    CANCELLED = "cancelled"
    # Failures of the backend.
    NOT_STARTED = "not-started"  # hluk exited before the solution started
    STARTUP_TIMEOUT = "startup-timeout"  # the solution did not start within its deadline
    HLUK_FAILED = "hluk-failed"  # hluk's own error (an `error:` line, a panic) after the start
    KILLED = "killed"  # hluk was killed by a signal this package did not send
    COPY_OUT_TIMEOUT = "copy-out-timeout"  # the output was not copied out within its budget
    SPAWNER_DIED = "spawner-died"  # the spawner that started hluk died (hluk was killed then)


_SOLUTION_ENDINGS = frozenset(
    [
        Ending.FINISHED,
        Ending.TIMED_OUT,
        Ending.DEADLOCKED,
        Ending.GUEST_DIED,
        Ending.GUEST_ABORTED,
        Ending.CONSOLE_LIMIT,
        Ending.BROKEN,
    ]
)


class Verdict(enum.Enum):
    """Whose an ending is, which is all that the case path, the guest's gate and the response
    need to know of it (``verdict``)."""

    # Answered from the outcome, as Sandbox Fusion answers the solution's doing.
    SOLUTIONS = "the solution's"
    # Answered SandboxError; neither retried, nor logged as a failure, nor a sign of the backend.
    REFUSED = "refused"
    CANCELLED = "cancelled"
    # hluk failed before the solution started: answered SandboxError after one more try (nothing
    # of the solution ran), and counted toward the gate (hluk may have stopped starting guests).
    BACKEND_BEFORE_START = "backend failure before the start"
    # hluk failed once the solution ran: answered SandboxError, never retried (the solution
    # ran, and may have had effects); the guest did start, so hluk does start guests.
    BACKEND_AFTER_START = "backend failure after the start"


@dataclass(frozen=True)
class RawOutcome:
    """What one hluk run produced, before it is shaped into a response."""

    ending: Ending
    started: bool  # the runner's start frame came: the solution ran
    end: protocol.End | None  # the runner's report of the solution's end
    stdout: memoryview  # the output copied out (whole when FINISHED)
    stderr: memoryview
    fetched: dict[int, memoryview]  # the fetched files copied out, by their index
    hluk_status: int | None  # hluk's exit status (-N: killed by signal N); None if stopped
    hluk_error: str  # hluk's final `error:` line, or its panic, else ""
    hluk_stderr: str  # the end of hluk's stderr, as hluk wrote it
    # The end of the console text before the start: the driver's and the runner's own, never
    # the solution's.
    preamble: bytes
    refusal: str  # why the runner refused the case (REFUSED)
    restored: bool | None  # hluk's `restored=` log line, when run with --log-level info
    host_elapsed: float  # from the start frame (or the spawn) to the end frame or the stop
    limit: float  # the seconds of the deadline the run was held to last

    @property
    def verdict(self) -> Verdict:
        """Whose the ending is (see ``verdict``)."""
        return verdict(self.ending, self.started)

    @property
    def guest_status(self) -> int | None:
        """The status of `the guest exited with status N`, when hluk said that."""
        match = _GUEST_EXIT.search(self.hluk_error)
        return int(match.group(1)) if match else None


def seconds_setting(name: str, default: float) -> tuple[float, str | None]:
    """The seconds environment variable `name` gives (`default` if it is not set), and its
    value when that is not a positive number of seconds (the default is used then)."""
    value = os.environ.get(name)
    if value is None:
        return default, None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if math.isfinite(seconds) and seconds > 0:
        return seconds, None
    return default, value


def hluk_path() -> str:
    """The hluk to run: HLUK_PATH, else the one on PATH (absolute either way)."""
    chosen = os.environ.get("HLUK_PATH")
    if chosen:
        return os.path.abspath(chosen)
    found = shutil.which("hluk")
    if found is None:
        raise BackendError(f"hluk was not found on PATH: {INSTALL_HINT}", "hluk-missing")
    return os.path.abspath(found)


def environment() -> dict[str, str]:
    """The environment hluk runs with: what it reads, and what the operator adds."""
    global _chosen
    # Which variables those are is worked out again only when os.environ has changed (its
    # bytes, which every change through os.environ updates): working it out is lookups, most
    # of variables that are not set, and costs tens of microseconds per case.
    current = os.environ._data  # type: ignore[attr-defined]
    chosen = _chosen
    if chosen is None or chosen[0] != current:
        snapshot = dict(current)  # taken first: a change while choosing is seen next time
        chosen = _chosen = (snapshot, _choose_environment())
    passed = dict(chosen[1])
    for name in PATH_VARIABLES:  # relative to the working directory of now
        if passed.get(name):
            passed[name] = os.path.abspath(passed[name])
    return passed


def _choose_environment() -> dict[str, str]:
    names = set(PASSED_ENVIRONMENT)
    prefixes = []
    for entry in os.environ.get(EXTRA_ENVIRONMENT, "").split(","):
        entry = entry.strip()
        if entry.endswith("*"):
            prefixes.append(entry[:-1])
        elif entry:
            names.add(entry)
    if prefixes:
        names.update(name for name in os.environ if name.startswith(tuple(prefixes)))
    return {name: os.environ[name] for name in names if name in os.environ}


# os.environ's bytes when environment() last chose, and what it chose then.
_chosen: tuple[dict[bytes, bytes], dict[str, str]] | None = None


def run_to_exit(argv: list[str], timeout: float) -> RawOutcome:
    """Run hluk for something other than a case (--version): until it exits, or `timeout`
    (ending STARTUP_TIMEOUT). What it printed on its console is in ``preamble``."""
    # A nonce no output contains: the run is never "started", so `timeout` bounds all of it.
    return run(argv, secrets.token_hex(16), math.inf, timeout)


def parse_version(text: str) -> tuple[tuple[int, ...], str] | None:
    """hluk's version in `text`, as a key that orders it (a pre-release sorts before its
    release, as semantic versioning orders them) and as written."""
    match = _VERSION.search(text)
    if match is None:
        return None
    release = tuple(int(part) for part in match.groups()[:3])
    return (*release, 0 if match.group(4) else 1), match.group(0)


def check_version(path: str) -> str:
    """Run `hluk --version` and refuse a hluk older than 0.19.0; returns the version."""
    done = run_to_exit([path, "--version"], VERSION_TIMEOUT_SECONDS)
    if done.ending is Ending.STARTUP_TIMEOUT:
        raise BackendError(
            f"hluk at {path} did not answer --version within {VERSION_TIMEOUT_SECONDS:.0f} s",
            "hluk-broken",
        )
    if done.ending is Ending.KILLED:
        raise failure(done, path)
    text = done.preamble.decode(errors="replace").strip()
    version = parse_version(text)
    if done.hluk_status != 0 or version is None:
        detail = (done.hluk_error or text).strip()[:500]
        raise BackendError(f"hluk at {path} failed on --version: {detail}", "hluk-broken")
    key, written = version
    if key < (*MINIMUM_VERSION, 1):
        kind = "a pre-release" if key[3] == 0 else "version"
        raise BackendError(
            f"hluk at {path} is {kind} {written}; verl-hyperlight needs 0.19.0 or later: "
            "upgrade it by running its installer again",
            "hluk-too-old",
        )
    return written


class _Output:
    """One stream's output, as the runner announced its size: written once, where it ends up.
    Large ones live in a mapping of their own, returned to the system when the case is done
    rather than kept by the allocator of whichever thread ran the case."""

    MAPPED_FROM = 64 * 1024

    def __init__(self, size: int) -> None:
        self.buffer: bytearray | mmap.mmap = (
            mmap.mmap(-1, size) if size >= self.MAPPED_FROM else bytearray(size)
        )
        self.size = size
        self.length = 0

    def add(self, data: bytes) -> None:
        end = self.length + len(data)
        if end <= self.size:  # more than announced is not the runner's
            self.buffer[self.length : end] = data
            self.length = end

    def view(self) -> memoryview:
        return memoryview(self.buffer)[: self.length]


_NO_OUTPUT = memoryview(b"")


class _Console:
    """The runner's frames in hluk's stdout, found and decoded as they arrive.

    Only what a frame needs is kept: the line of a frame being received (at most a frame's
    length) and, before the start, the end of the other text; the output goes straight into
    its stream. Reads land in one buffer, frame lines in another, both made once per case, so
    a case allocates little besides its output (a worker's allocator then has nothing to
    fragment over thousands of cases), and holds about its output once, whatever the guest
    writes."""

    def __init__(self, nonce: str) -> None:
        self.nonce = nonce.encode("ascii")
        self.marker = b"\n" + self.nonce + b" "
        self.total = 0
        self.started = False
        self.refusal: str | None = None
        self.end: protocol.End | None = None
        self.done = False
        self.outputs: dict[str, _Output] = {}
        self.files: dict[int, _Output] = {}
        # Unscanned text that may begin a marker stays at the head of the buffer (_kept bytes)
        # and the next read lands after it.
        self._buffer = bytearray(READ_SIZE + len(self.marker))
        self._kept = 0
        self._line = bytearray(protocol.MAX_FRAME_LINE)
        self._line_length: int | None = None  # None: not within a frame line
        self._preamble = bytearray()

    def read(self, fd: int) -> int:
        """Read what `fd` has (at most READ_SIZE bytes) and scan it; 0 at its end."""
        count = os.readv(fd, [memoryview(self._buffer)[self._kept :]])
        self.total += count
        self._scan(self._kept + count)
        return count

    def feed(self, chunk: bytes) -> None:
        """Scan `chunk` as if read."""
        for offset in range(0, len(chunk), READ_SIZE):
            piece = chunk[offset : offset + READ_SIZE]
            self._buffer[self._kept : self._kept + len(piece)] = piece
            self.total += len(piece)
            self._scan(self._kept + len(piece))

    def _scan(self, end: int) -> None:
        data, view = self._buffer, memoryview(self._buffer)
        self._kept = 0
        position = 0
        while position < end:
            if self._line_length is not None:
                newline = data.find(b"\n", position, end)
                stop = end if newline < 0 else newline
                length = self._line_length + stop - position
                if length > protocol.MAX_FRAME_LINE:
                    self._line_length = None  # too long for a frame: not the runner's
                else:
                    self._line[self._line_length : length] = view[position:stop]
                    self._line_length = length
                    if newline >= 0:
                        self._frame(memoryview(self._line)[:length])
                        self._line_length = None
                if newline < 0:
                    return
                position = newline  # the newline may begin the next frame
                continue
            found = data.find(self.marker, position, end)
            if found < 0:
                # The marker may straddle this read and the next: its possible start is kept.
                keep = max(position, end - len(self.marker) + 1)
                self._text(view[position:keep])
                self._kept = end - keep
                data[: self._kept] = view[keep:end]
                return
            self._text(view[position:found])
            self._line_length = 0
            position = found + len(self.marker)

    def _text(self, text: memoryview) -> None:
        if not self.started and text:
            self._preamble += text
            del self._preamble[:-PREAMBLE_LIMIT]

    def _frame(self, line: memoryview) -> None:
        if line and line[-1] == ord("\r"):
            line = line[:-1]
        space = bytes(line[:16]).find(b" ")
        kind = bytes(line if space < 0 else line[:space])
        if kind == protocol.START:
            self.started = True
        elif kind == protocol.REFUSED and not self.started and self.refusal is None:
            self.refusal = _base64_text(line[space + 1 :]) if space >= 0 else ""
        elif not self.started or self.done:
            return
        elif kind == protocol.END and self.end is None:
            try:
                self.end = protocol.parse_end(bytes(line).split(b" ")[1:])
            except ValueError:
                return  # not the runner's: a frame a solution forged
            for name, size in zip(("stdout", "stderr"), self.end.sizes, strict=True):
                self.outputs[name] = _Output(size)
            for index, size in enumerate(self.end.files):
                if size >= 0:
                    self.files[index] = _Output(size)
        elif kind in protocol.STREAMS and self.end is not None and space >= 0:
            data = _base64(line[space + 1 :])
            if data is not None:
                self.outputs[protocol.STREAMS[kind]].add(data)
        elif kind == protocol.FILE and self.end is not None and space >= 0:
            index_and_data = bytes(line[space + 1 : space + 16]).split(b" ", 1)[0]
            output = self.files.get(int(index_and_data)) if index_and_data.isdigit() else None
            data = _base64(line[space + 2 + len(index_and_data) :])
            if output is not None and data is not None:
                output.add(data)
        elif kind == protocol.DONE and self.end is not None:
            self.done = True

    def stream(self, name: str) -> memoryview:
        output = self.outputs.get(name)
        return _NO_OUTPUT if output is None else output.view()

    def preamble(self) -> bytes:
        """The end of the text before the start, once hluk's stdout has ended."""
        self._text(memoryview(self._buffer)[: self._kept])
        self._kept = 0
        # The \r of the console's \r\n before the start frame is the console's, not text.
        return bytes(self._preamble).replace(b"\r\n", b"\n").removesuffix(b"\r")


def _base64(text: memoryview) -> bytes | None:
    """What a frame's base64 field holds; None if it is not base64 (not the runner's)."""
    return binascii.a2b_base64(text) if _BASE64.fullmatch(text) is not None else None


def _base64_text(text: memoryview) -> str:
    data = _base64(text)
    return "" if data is None else data.decode(errors="replace")


class _Tail:
    """The last `limit` bytes written to a pipe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > 2 * self.limit:
            del self.data[: -self.limit]

    def text(self) -> str:
        return _ANSI.sub("", bytes(self.data[-self.limit :]).decode(errors="replace"))

    def pulling(self) -> bool:
        """Whether hluk announced an image pull it has not said the end of. Off a terminal it
        writes `pulling IMAGE...` as the pull begins, then nothing until `pulled IMAGE ...`
        (hyperlight-unikraft's src/cli/rootfs.rs): a pull is silent while it progresses."""
        return _line_at(self.data, b"pulling ") > _line_at(self.data, b"pulled ")


def _line_at(data: bytearray, start: bytes) -> int:
    """Where the last line of `data` beginning with `start` begins (-1: none does)."""
    found = data.rfind(b"\n" + start)
    if found >= 0:
        return found + 1
    return 0 if data.startswith(start) else -1


def final_error(stderr: str) -> str:
    """hluk's decisive message: its last `error:` line (hluk writes it last), else a panic."""
    if stderr.startswith("error: "):
        return stderr.strip()
    index = stderr.rfind("\nerror: ")
    if index >= 0:
        return stderr[index + 1 :].strip()
    index = stderr.find("panicked at")
    if index >= 0:
        return stderr[stderr.rfind("\n", 0, index) + 1 :].strip()[:1000]
    return ""


def _spawn(argv: list[str], cwd: str | None) -> _spawn_module.Process:
    """Start hluk (see ``_spawn``): in a process group of its own, dying with this process."""
    try:
        return _spawn_module.spawn(argv, cwd, environment())
    except OSError as exc:
        raise _cannot_start(argv[0], str(exc)) from None


def _cannot_start(path: str, why: str) -> BackendError:
    """Why hluk could not start, looked into only when it could not."""
    if not os.path.exists(path):
        return BackendError(f"hluk was not found at {path}: {INSTALL_HINT}", "hluk-missing")
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        return BackendError(
            f"hluk at {path} is not executable: chmod +x it, or point HLUK_PATH at hluk itself",
            "hluk-not-executable",
        )
    return BackendError(f"hluk at {path} could not start: {why}", "hluk-broken")


def _copy_out_budget(end: protocol.End) -> float:
    return COPY_OUT_SECONDS + end.copied / COPY_OUT_BYTES_PER_SECOND


def run(
    argv: list[str],
    nonce: str,
    run_timeout: float,
    startup_timeout: float,
    cwd: str | None = None,
    cancel: threading.Event | None = None,
    stall_timeout: float | None = None,
) -> RawOutcome:
    """Run hluk with `argv` (in `cwd`) until the runner reports the case done, the solution
    exceeds `run_timeout` (counted from its start in the guest to its end, never the copy-out),
    nothing starts within `startup_timeout`, or `cancel` is set. With `stall_timeout`, hluk
    must also show progress before the start: a run that writes nothing for that long, other
    than during an image pull it announced, is stopped as not started in time."""
    proc = _spawn(argv, cwd)
    spawned = last_output = time.monotonic()
    console = _Console(nonce)
    stderr = _Tail(HLUK_STDERR_LIMIT)
    stopped: Ending | None = None
    exited = output = False
    started_at: float | None = None
    ended_at: float | None = None
    limit = startup_timeout
    deadline = spawned + startup_timeout
    # poll(2), not epoll: for three descriptors it needs no kernel object made, filled and
    # closed per case; nor select(2), which fails past descriptor 1023.
    poller = select.poll()
    reading = {proc.stdout, proc.stderr}
    for fd in reading:
        poller.register(fd, select.POLLIN)
    poller.register(proc.exit_fd, proc.exit_events)
    try:
        while reading or not exited:
            now = time.monotonic()
            stall_at = math.inf
            waiting = started_at is None and reading and not exited
            if stall_timeout is not None and waiting and not stderr.pulling():
                stall_at = last_output + stall_timeout
            if now >= stall_at and now < deadline:
                assert stall_timeout is not None
                stopped, limit = Ending.STARTUP_TIMEOUT, stall_timeout
                break
            if now >= deadline:
                if reading and not (exited or console.done):
                    stopped = (
                        Ending.STARTUP_TIMEOUT
                        if started_at is None
                        else Ending.TIMED_OUT
                        if ended_at is None
                        else Ending.COPY_OUT_TIMEOUT
                    )
                break
            if cancel is not None and cancel.is_set():
                stopped = Ending.CANCELLED
                break
            wait = min(deadline, stall_at) - now
            if cancel is not None:
                wait = min(wait, CANCEL_POLL_SECONDS)
            for fd, _ in poller.poll(math.ceil(min(wait, 86400.0) * 1000)):
                if fd == proc.exit_fd:
                    if proc.exited():
                        poller.unregister(fd)
                        exited = True
                    continue
                if fd == proc.stdout:
                    ended = not console.read(fd)
                elif chunk := os.read(fd, READ_SIZE):
                    stderr.add(chunk)
                    ended = False
                else:
                    ended = True
                if ended:
                    poller.unregister(fd)
                    reading.discard(fd)
                else:
                    output = True
            now = time.monotonic()
            if output:
                last_output, output = now, False
            if started_at is None and console.started:
                started_at, limit = now, run_timeout
                deadline = started_at + run_timeout
            if ended_at is None and console.end is not None:
                # The solution has ended: its clock stops, the copy-out has its own.
                ended_at, limit = now, _copy_out_budget(console.end)
                deadline = now + limit
            if console.done:
                if not reading:
                    break  # the whole report, and all hluk said: its exit adds nothing
                deadline = min(deadline, now + EXIT_GRACE_SECONDS)
            if exited:
                deadline = min(deadline, now + DRAIN_SECONDS)
            elif not reading:
                # Its pipes have ended, so its exit is on its way: cheaper waited for than
                # killed.
                deadline = min(deadline, now + EXIT_NOTICE_SECONDS)
            if console.total > CONSOLE_LIMIT and not console.done:
                stopped = Ending.CONSOLE_LIMIT
                break
            if console.refusal is not None:
                break
    finally:
        # Whatever ended the loop, nothing of this group outlives the call.
        status = proc.stop(status_needed=not console.done)
    if proc.error:
        raise _cannot_start(argv[0], proc.error)
    if proc.lost and stopped is None:
        stopped = Ending.SPAWNER_DIED
    finished = ended_at if ended_at is not None else time.monotonic()
    hluk_stderr = stderr.text()
    hluk_error = final_error(hluk_stderr)
    hluk_status = None if stopped is not None else status
    restored = re.findall(r"\brestored=(true|false)\b", hluk_stderr)
    return RawOutcome(
        ending=_decide(console, stopped, hluk_status, hluk_error),
        started=console.started,
        end=console.end,
        stdout=console.stream("stdout"),
        stderr=console.stream("stderr"),
        fetched={index: output.view() for index, output in console.files.items()},
        hluk_status=hluk_status,
        hluk_error=hluk_error,
        hluk_stderr=hluk_stderr,
        preamble=console.preamble(),
        refusal=console.refusal or "",
        restored=restored[-1] == "true" if restored else None,
        host_elapsed=finished - (started_at if started_at is not None else spawned),
        limit=limit,
    )


def _decide(
    console: _Console, stopped: Ending | None, hluk_status: int | None, error: str
) -> Ending:
    """How the run ended: the one place that decides it."""
    if console.done:
        return Ending.FINISHED  # the runner's whole report, whatever hluk did after it
    if console.refusal is not None:
        return Ending.REFUSED
    if stopped is Ending.CONSOLE_LIMIT and not console.started:
        return Ending.NOT_STARTED  # a flood before the start is hluk's or its driver's
    if stopped is not None:
        return stopped
    if hluk_status is not None and hluk_status < 0:
        return Ending.KILLED
    if not console.started:
        return Ending.NOT_STARTED
    # After the start only hluk's own stderr decides, never the console the solution wrote.
    if _GUEST_EXIT.match(error):
        return Ending.GUEST_DIED
    if error.startswith("error: the guest is deadlocked"):
        return Ending.DEADLOCKED
    if error.startswith(_GUEST_ABORTED):
        return Ending.GUEST_ABORTED
    if error:
        return Ending.HLUK_FAILED
    # hluk exits silently with the status of a failed call: the runner's call failed after
    # the solution started, which only the solution can have caused.
    return Ending.BROKEN


def verdict(ending: Ending, started: bool) -> Verdict:
    """Whose `ending` (as ``_decide`` decided it) is, the solution having `started` or not:
    decided here only, beside the Ending it follows from."""
    if ending in _SOLUTION_ENDINGS:
        return Verdict.SOLUTIONS
    if ending is Ending.REFUSED:
        return Verdict.REFUSED
    if ending is Ending.CANCELLED:
        return Verdict.CANCELLED
    return Verdict.BACKEND_AFTER_START if started else Verdict.BACKEND_BEFORE_START


def failure(outcome: RawOutcome, path: str) -> BackendError:
    """The backend failure a run that did not end by the solution's doing stands for."""
    where = "while the solution ran" if outcome.started else "before the solution started"
    if outcome.ending is Ending.STARTUP_TIMEOUT:
        return BackendError(
            f"the micro-VM did not start within {outcome.limit:.0f} s "
            "(VERL_HYPERLIGHT_STARTUP_TIMEOUT); the node may be overloaded: lower "
            "max_concurrent or reward.num_workers",
            "startup-timeout",
            persistent=False,
        )
    if outcome.ending is Ending.SPAWNER_DIED:
        return BackendError(
            f"the spawner of hluk processes died {where}, and its hluk with it: check `dmesg` "
            "for the OOM killer or for who killed it (the next case starts another spawner; "
            f"{_spawn_module.SPAWN_ENV}=setpriv starts hluk without one)",
            "spawner-died",
            persistent=False,
        )
    if outcome.ending is Ending.KILLED:
        assert outcome.hluk_status is not None
        number = -outcome.hluk_status
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return BackendError(
            f"hluk at {path} was killed by {name} ({number}) {where}: a SIGBUS or SIGSEGV "
            "often means a truncated or corrupt warm snapshot (run `hluk cache clean "
            "--snapshots`, then `verl-hyperlight warm-up`); a SIGKILL, the kernel's OOM killer "
            "(check `dmesg`; lower max_concurrent or memory_limit_mb)",
            f"killed-{name}",
            persistent=False,
        )
    if outcome.ending is Ending.COPY_OUT_TIMEOUT:
        assert outcome.end is not None
        return BackendError(
            f"the micro-VM did not copy the solution's output ({outcome.end.copied} bytes) "
            f"out within {outcome.limit:.0f} s after it ended; the node may be overloaded: "
            "lower max_concurrent or reward.num_workers",
            "copy-out-timeout",
            persistent=False,
        )
    # hluk's own message decides; before the start, what its driver printed may say more.
    message = outcome.hluk_error
    if not message and not outcome.started:
        message = outcome.preamble.decode(errors="replace")
    return classify(message, outcome.hluk_status, path, persistent=not outcome.started)


def classify(message: str, status: int | None, path: str, persistent: bool) -> BackendError:
    """The backend failure hluk's message describes, with what an operator can do about it."""
    message = message.strip()
    lowered = message.lower()
    if "kvm" in lowered:
        return BackendError(
            f"hluk cannot use /dev/kvm ({message[:300]}): run the reward workers where KVM is "
            "available and add their user to the kvm group (usermod -aG kvm $USER, then log in "
            "again)",
            "kvm",
        )
    if "no runtime image called" in lowered or "manifest unknown" in lowered:
        return BackendError(
            f"hluk does not know the image ({message[:300]}): check the sandbox URL; "
            "hyperlight:// and hyperlight://agent name the published images",
            "unknown-image",
        )
    if "pull" in lowered or "registry" in lowered:
        return BackendError(
            f"hluk could not pull the image ({message[:300]}): check that this node reaches the "
            "image registry, or pull once by hand with `verl-hyperlight warm-up`",
            "image-pull",
        )
    if "snapshot" in lowered:
        return BackendError(
            f"hluk could not take or restore a snapshot ({message[:300]}): check free space "
            "and permissions in hluk's cache (HLUK_CACHE_DIR, else ~/.cache/hluk)",
            "snapshot",
        )
    # What is left is hluk itself failing (a crash, an unexpected message): say where to look.
    return BackendError(
        f"hluk at {path} failed (status {status}): {message[:500] or 'no message'}; check that "
        "`verl-hyperlight warm-up` succeeds on this node, upgrade hluk if it keeps failing, and "
        "report the message to hyperlight-unikraft",
        "hluk-failed",
        persistent=persistent,
    )
