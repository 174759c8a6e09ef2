"""How to run it: one hluk process, owned for its whole life.

hluk runs in a process group of its own that is killed whole on a timeout, and it dies with the
reward worker, however the worker dies (``_spawn`` starts it), so a reward worker that is
killed takes its micro-VMs with it. It gets the environment it needs and nothing else of the
worker's. Its console (the guest's merged stdout and stderr) is read as it arrives and scanned
for the runner's frames (``guest/protocol.py``; ``_console`` decodes them), decoding the
output as it comes, so a case holds its output once; its stderr carries hluk's own messages,
of which the end is kept. How the run ended is decided once, in ``_decide``, from what hluk and
the runner said; whose that ending is, in ``_outcome``; what a backend failure means and how to
fix it, in ``_diagnosis``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import math
import os
import re
import secrets
import select
import shutil
import threading
import time

from . import _diagnosis
from . import _spawn as _spawn_module
from ._console import READ_SIZE, Console
from ._errors import BackendError
from ._outcome import GUEST_EXIT, Ending, RawOutcome
from .guest import protocol

MINIMUM_VERSION = (0, 19, 0)
# The console carries both streams base64-encoded, with framing; beyond this the guest is
# misbehaving (writing to the console around the runner) and is stopped.
CONSOLE_LIMIT = 2 * (protocol.OUTPUT_LIMIT * 4 // 3) + (1 << 20)
# Of hluk's stderr, the end is kept: its decisive `error:` line comes last.
HLUK_STDERR_LIMIT = 64 * 1024
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
# hluk's last line when the guest kernel aborts (hyperlight's GuestAborted, which hluk prints
# as `error: Guest aborted: <code> <message>` and exits 1).
_GUEST_ABORTED = "error: Guest aborted:"


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
        raise BackendError(f"hluk was not found on PATH: {_diagnosis.INSTALL_HINT}", "hluk-missing")
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
        raise _diagnosis.failure(done, path)
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


def _spawn(argv: list[str], cwd: str | None, stdin: bool = False) -> _spawn_module.Process:
    """Start hluk (see ``_spawn``): in a process group of its own, dying with this process."""
    try:
        return _spawn_module.spawn(argv, cwd, environment(), stdin)
    except OSError as exc:
        raise _diagnosis.cannot_start(argv[0], str(exc)) from None


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
    stderr = _Tail(HLUK_STDERR_LIMIT)
    try:
        watched = _watch(
            proc, Console(nonce), stderr, run_timeout, startup_timeout, cancel, stall_timeout
        )
    finally:
        # Whatever ended the watch, nothing of this group outlives the call.
        status = proc.stop()
    return watched.outcome(argv[0], status, stderr)


class _Watched:
    """One report watched for on a hluk's console: its clocks, and why the watch stopped."""

    def __init__(self, proc: _spawn_module.Process, console: Console) -> None:
        self.proc = proc
        self.console = console
        self.spawned = time.monotonic()
        self.stopped: Ending | None = None
        self.exited = False
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.limit = 0.0

    def outcome(self, path: str, status: int | None, stderr: _Tail) -> RawOutcome:
        """What the run produced; `status` hluk's exit status once it was stopped (None while
        it runs on: a session's report is whole and its guest waits for the next call)."""
        proc, console, stopped = self.proc, self.console, self.stopped
        if proc.error:
            raise _diagnosis.cannot_start(path, proc.error)
        if proc.lost and stopped is None:
            stopped = Ending.SPAWNER_DIED
        finished = self.ended_at if self.ended_at is not None else time.monotonic()
        hluk_stderr = stderr.text()
        hluk_error = final_error(hluk_stderr)
        hluk_status = None if stopped is not None else status
        restored = re.findall(r"\brestored=(true|false)\b", hluk_stderr)
        began = self.started_at if self.started_at is not None else self.spawned
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
            host_elapsed=finished - began,
            limit=self.limit,
        )


def _watch(
    proc: _spawn_module.Process,
    console: Console,
    stderr: _Tail,
    run_timeout: float,
    startup_timeout: float,
    cancel: threading.Event | None = None,
    stall_timeout: float | None = None,
    until_done: bool = False,
) -> _Watched:
    """Read hluk's console and stderr until the runner's report on `console` is done (and, but
    `until_done`, hluk has exited), or a limit or `cancel` stops it (see run). `until_done`
    leaves a session's hluk running once its report is whole."""
    watched = _Watched(proc, console)
    last_output = watched.spawned
    output = False
    watched.limit = startup_timeout
    deadline = watched.spawned + startup_timeout
    # poll(2), not epoll: for three descriptors it needs no kernel object made, filled and
    # closed per case; nor select(2), which fails past descriptor 1023.
    poller = select.poll()
    reading = {proc.stdout, proc.stderr}
    for fd in reading:
        poller.register(fd, select.POLLIN)
    poller.register(proc.exit_fd, proc.exit_events)
    while reading or not watched.exited:
        now = time.monotonic()
        stall_at = math.inf
        waiting = watched.started_at is None and reading and not watched.exited
        if stall_timeout is not None and waiting and not stderr.pulling():
            stall_at = last_output + stall_timeout
        if now >= stall_at and now < deadline:
            assert stall_timeout is not None
            watched.stopped, watched.limit = Ending.STARTUP_TIMEOUT, stall_timeout
            break
        if now >= deadline:
            if reading and not (watched.exited or console.done):
                watched.stopped = (
                    Ending.STARTUP_TIMEOUT
                    if watched.started_at is None
                    else Ending.TIMED_OUT
                    if watched.ended_at is None
                    else Ending.COPY_OUT_TIMEOUT
                )
            break
        if cancel is not None and cancel.is_set():
            watched.stopped = Ending.CANCELLED
            break
        wait = min(deadline, stall_at) - now
        if cancel is not None:
            wait = min(wait, CANCEL_POLL_SECONDS)
        for fd, _ in poller.poll(math.ceil(min(wait, 86400.0) * 1000)):
            if fd == proc.exit_fd:
                if proc.exited():
                    poller.unregister(fd)
                    watched.exited = True
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
        if watched.started_at is None and console.started:
            watched.started_at, watched.limit = now, run_timeout
            deadline = now + run_timeout
        if watched.ended_at is None and console.end is not None:
            # The solution has ended: its clock stops, the copy-out has its own.
            watched.ended_at, watched.limit = now, _copy_out_budget(console.end)
            deadline = now + watched.limit
        if console.done:
            if not reading or until_done:
                break  # the whole report, and all hluk said: its exit adds nothing
            deadline = min(deadline, now + EXIT_GRACE_SECONDS)
        if watched.exited:
            deadline = min(deadline, now + DRAIN_SECONDS)
        elif not reading:
            # Its pipes have ended, so its exit is on its way: cheaper waited for than
            # killed.
            deadline = min(deadline, now + EXIT_NOTICE_SECONDS)
        if console.total > CONSOLE_LIMIT and not console.done:
            watched.stopped = Ending.CONSOLE_LIMIT
            break
        if console.refusal is not None:
            break
    return watched


class SessionProcess:
    """A hluk whose guest runs calls read from its stdin (``runner.session``), one after
    another, each reported on the console as a case is. Its watch per call is a case's
    (``_watch``); it stays up between calls, and is stopped by the first call that does not end
    with a whole report and the guest still running."""

    # Its stdin pipe is made this large, so that a call's request is written at once, whole.
    PIPE_SIZE = 1024 * 1024

    def __init__(self, argv: list[str]) -> None:
        self.path = argv[0]
        self.proc = _spawn(argv, None, stdin=True)
        self.stderr = _Tail(HLUK_STDERR_LIMIT)
        self.alive = True
        assert self.proc.stdin is not None
        try:
            fcntl.fcntl(self.proc.stdin, fcntl.F_SETPIPE_SZ, self.PIPE_SIZE)
        except OSError:
            pass  # past the system's pipe-max-size: the size it has
        self.capacity = fcntl.fcntl(self.proc.stdin, fcntl.F_GETPIPE_SZ)
        os.set_blocking(self.proc.stdin, False)

    def ready(
        self,
        nonce: str,
        startup_timeout: float,
        cancel: threading.Event | None = None,
        stall_timeout: float | None = None,
    ) -> RawOutcome:
        """Wait for the guest's report that it is ready (the session's nonce): finished when
        it is, and the process is stopped when it is not."""
        return self._watch(Console(nonce), math.inf, startup_timeout, cancel, stall_timeout)

    def call(
        self, nonce: str, request: bytes, run_timeout: float, cancel: threading.Event | None
    ) -> RawOutcome:
        """Hand the guest one request (protocol.request_lines, at most `capacity` bytes) and
        watch for its report. A call whose code does not start within `run_timeout` (the
        session's earlier code keeps the guest busy) has timed out, as one that runs past it."""
        assert self.alive and self.proc.stdin is not None
        try:
            written = os.write(self.proc.stdin, request)
        except BlockingIOError:
            written = 0
        except OSError:
            written = -1  # the guest is gone: the watch sees hluk's end
        if 0 <= written < len(request):
            # Its earlier input is still unread: the guest is stuck, as past a time limit.
            self.stop()
            raise BackendError("the session's guest did not read its input", "session-stuck")
        outcome = self._watch(Console(nonce), run_timeout, run_timeout, cancel, None)
        if outcome.ending is Ending.STARTUP_TIMEOUT:
            outcome = dataclasses.replace(outcome, ending=Ending.TIMED_OUT, started=True)
        return outcome

    def _watch(
        self,
        console: Console,
        run_timeout: float,
        startup_timeout: float,
        cancel: threading.Event | None,
        stall_timeout: float | None,
    ) -> RawOutcome:
        try:
            watched = _watch(
                self.proc,
                console,
                self.stderr,
                run_timeout,
                startup_timeout,
                cancel,
                stall_timeout,
                until_done=True,
            )
        except BaseException:
            self.stop()
            raise
        if console.done and not (console.last or watched.exited) and watched.stopped is None:
            return watched.outcome(self.path, None, self.stderr)
        return watched.outcome(self.path, self.stop(), self.stderr)

    def stop(self) -> int | None:
        """End it (once): nothing of its group outlives the call."""
        self.alive = False
        return self.proc.stop()


def _decide(
    console: Console, stopped: Ending | None, hluk_status: int | None, error: str
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
    if GUEST_EXIT.match(error):
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
