"""How hluk is started: in a process group of its own, dying with the reward worker.

Three ways, the first that works here is used (VERL_HYPERLIGHT_SPAWN names one to use):

- ``spawner``: small long-lived processes (``spawner.py``; up to SPAWNERS per worker, taking
  cases in turn) start each hluk with posix_spawn. The worker sends one a message with three
  pipes: no fork or exec of its own per case, so nothing per case grows with the worker's
  memory. The spawner answers through the case's status pipe (the pid, then the exit status,
  since only a parent can wait for a process). It ends every hluk it started when the worker
  dies (its parent-death signal) or closes its socket, and the hluk of a case that closed its
  status pipe (it gave up, or no longer needs the status); were the spawner itself killed, each
  case kills its own and says so.
- ``setpriv``: util-linux's setpriv sets the parent-death signal and execs hluk; Python's spawn
  stays on vfork, at the cost of an extra exec per case.
- ``fork``: a preexec_fn sets it, which forces a fork of the whole worker (page tables copied
  with the GIL held: about 100 ms per case for 2 GiB).

A spawner that dies is started again by the next case. One that cannot start (a passing EAGAIN
of pids.max, ENOMEM, a slow start, no descriptor free, or no usable Python at sys.executable)
leaves the process on the next way, said once, and is tried again in the background after a
back-off, its recovery said once too (``_Starts``).

Pipes that carry lines only (hluk's stderr, a notebook's requests, the status pipe) are made
one page (``LINE_PIPE_SIZE``); only hluk's console keeps the default size. Who owns what: a
started hluk's state (stopped, its status) changes under its own lock, as CPython guards its
wait (``subprocess.Popen._waitpid_lock``), so that two threads ending it kill and reap it once.
"""

from __future__ import annotations

import array
import ctypes
import enum
import errno
import fcntl
import functools
import itertools
import logging
import math
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from .. import diagnosis, node, settings
from ..errors import CauseCounts, worth_logging
from .spawner import MESSAGE_LIMIT

logger = logging.getLogger("verl_hyperlight")

PR_SET_PDEATHSIG = 1
# How long the spawner may take to start. Its answers to requests have no deadline of their
# own: a case's start-up deadline bounds them, and a slow spawner on a loaded node is healthy.
SPAWNER_START_SECONDS = 30.0
# After a start failed, the next is tried this long after, then twice as long after each
# failed retry, up to the maximum: a retry costs one Python started in the background.
SPAWNER_RETRY_SECONDS = 1.0
SPAWNER_RETRY_MAX_SECONDS = 60.0
# How long a case waits for the spawner's word that it killed and reaped the case's hluk;
# past it (a spawner stopped or starved of CPU) the case kills hluk's group itself.
SPAWNER_STOP_SECONDS = 5.0
# A pipe's pages count toward its user's fs.pipe-user-pages-soft (16,384 pages across the node:
# 1,024 pipes of the default 16), past which every new pipe of that user, Ray's and torch's
# too, is made with 2 pages. Pipes that carry lines only are made this size, one page, so that
# a case holds 18 pages (its console's 16 and two of one) and a notebook 19.
LINE_PIPE_SIZE = 4096
SPAWNER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spawner.py")

_libc = ctypes.CDLL(None, use_errno=True)


class Process(Protocol):
    """A started hluk, as ``process.run`` drives it, whatever way started it: two pipes to read,
    one descriptor to poll for its exit (a pidfd, or the spawner's status pipe), and one call
    that ends it."""

    stdout: int  # descriptors to read
    stderr: int
    stdin: int | None  # hluk's stdin to write to, when it was asked for (else /dev/null)
    exit_fd: int  # polled for exit_events: then exited() may have something to say
    exit_events: int

    @property
    def error(self) -> str:
        """Why it could not be started, once exited() has said so (else "")."""

    @property
    def error_number(self) -> int:
        """The errno of `error` (0: it has none)."""

    @property
    def lost(self) -> bool:
        """Whether what started it died before it said how hluk ended (hluk's group was
        killed then)."""

    def exited(self) -> bool:
        """exit_fd was readable: whether hluk has now exited, could not start, or is lost."""

    def close_stdin(self) -> None:
        """End hluk's input (its stdin pipe, if it has one): its guest reads the end of it, as
        from /dev/null."""

    def stop(self) -> int | None:
        """Kill its process group unless it has been reaped, have it reaped, close its
        descriptors; once: nothing of its group outlives the call. Its status as subprocess
        gives it (-N: killed by signal N); None when not known: lost, or not started."""


@functools.lru_cache(maxsize=1)
def setpriv() -> str | None:
    """util-linux's setpriv, if it can set the parent-death signal (2.33 and later)."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    try:
        done = subprocess.run([path, "--help"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if b"--pdeathsig" in done.stdout else None


def _close(fds: Iterable[int | None]) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)


def _carry_lines(fd: int) -> None:
    """Make the pipe of `fd` LINE_PIPE_SIZE."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, LINE_PIPE_SIZE)
    except OSError:
        pass  # EBUSY: it holds more already (a hluk's first words): it keeps its size


def _die_with_parent(parent: int) -> None:
    """For preexec_fn: in the child, a process group of its own, and SIGKILL when `parent`
    (the spawning process) dies, also if it died before the request took effect."""
    os.setpgid(0, 0)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


class _Popened:
    """hluk started by subprocess (the setpriv and fork ways): its exit is a pidfd's."""

    exit_events = select.POLLIN

    def __init__(
        self, argv: list[str], cwd: str | None, env: dict[str, str], way: str, stdin: bool
    ) -> None:
        parent = os.getpid()
        command = argv
        preexec: Callable[[], None] | None = lambda: _die_with_parent(parent)  # noqa: E731
        if way == "setpriv" and (path := setpriv()) is not None:
            if os.path.isdir(argv[0]) or not os.access(argv[0], os.X_OK):
                # setpriv would only say so on hluk's stderr, after it started
                raise OSError(errno.EACCES, "not an executable file", argv[0])
            command, preexec = [path, "--pdeathsig", "KILL", "--", *argv], None
        # The pipes and /dev/null are made here, not by Popen: Python 3.10's Popen leaks
        # those it made when a later one cannot be (EMFILE at the worker's descriptor limit).
        ours: list[int] = []  # the ends kept here
        theirs: list[int] = []  # the child's, closed once it has them
        try:
            if stdin:
                child_stdin, to_stdin = os.pipe2(os.O_CLOEXEC)
                theirs.append(child_stdin)
                ours.append(to_stdin)
            else:
                child_stdin = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                theirs.append(child_stdin)
            for _ in ("stdout", "stderr"):
                read, write = os.pipe2(os.O_CLOEXEC)
                ours.append(read)
                theirs.append(write)
            self.popen = subprocess.Popen(
                command,
                stdin=child_stdin,
                stdout=theirs[-2],
                stderr=theirs[-1],
                close_fds=True,
                cwd=cwd,
                env=env,
                start_new_session=preexec is None,  # else preexec makes the group
                preexec_fn=preexec,  # noqa: PLW1509 - only the fork way has one
            )
        except BaseException:
            _close(ours)
            raise
        finally:
            _close(theirs)
        *to_child, self.stdout, self.stderr = ours
        self.stdin: int | None = to_child[0] if to_child else None
        self.error = ""
        self.error_number = 0
        self.lost = False
        self._lock = threading.Lock()  # stop's, as Popen's _waitpid_lock guards its wait
        self._stopped = False
        self.exit_fd = -1  # none yet
        try:
            for fd in (self.stderr, self.stdin):
                if fd is not None:
                    _carry_lines(fd)
            self.exit_fd = self._exit_descriptor()
        except BaseException:
            self.stop()  # a hluk started, whose exit cannot be watched: ended at once
            raise

    def _exit_descriptor(self) -> int:
        """A descriptor readable once hluk has exited: its pidfd."""
        try:
            return os.pidfd_open(self.popen.pid)
        except AttributeError:
            pass
        except OSError as exc:
            if exc.errno != errno.ENOSYS:
                raise  # EMFILE, ENFILE: the case's, which stop() ends
        # Linux < 5.3: a thread waits for it and ends a pipe, the same pollable exit.
        exit_fd, ended = os.pipe2(os.O_CLOEXEC)
        try:
            threading.Thread(target=self._await_exit, args=(ended,), daemon=True).start()
        except BaseException:
            _close((exit_fd, ended))
            raise
        return exit_fd

    def _await_exit(self, ended: int) -> None:
        self.popen.wait()
        os.close(ended)

    def exited(self) -> bool:
        return True

    def close_stdin(self) -> None:
        with self._lock:
            if self.stdin is not None and not self._stopped:
                os.close(self.stdin)
                self.stdin = None

    def stop(self) -> int | None:
        with self._lock:
            if self._stopped:
                return self.popen.returncode
            self._stopped = True
            # An exited hluk not yet reaped still holds its group's id: what it left there is
            # killed with no risk of reaching a reused id.
            if self.popen.returncode is None:
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            status = self.popen.wait()
            _close((self.stdout, self.stderr, self.stdin))
            if self.exit_fd >= 0:
                os.close(self.exit_fd)
            return status


class _SpawnerGone(Exception):
    """The spawner's socket has ended: it died."""


class _Spawned:
    """hluk started by the spawner: its pid, its exit and its status come through the status
    pipe, which the spawner closes once it has written the status, or ends by dying. Only that
    end is polled for (no event but the hang-up): the pid's line wakes no one."""

    exit_events = 0

    def __init__(
        self, spawner: _Spawner, stdout: int, stderr: int, status: int, stdin: int | None
    ) -> None:
        self.spawner = spawner
        self.stdout, self.stderr, self.exit_fd = stdout, stderr, status
        self.stdin = stdin
        os.set_blocking(status, False)
        self.pid = 0
        self.error = ""
        self.error_number = 0
        self.lost = False
        self.returncode: int | None = None
        self._ended = False  # the status pipe has ended
        self._lock = threading.Lock()  # stop's, as Popen's _waitpid_lock guards its wait
        self._stopped = False
        self._pending = b""

    def exited(self) -> bool:
        self._read()
        return self._ended

    def close_stdin(self) -> None:
        with self._lock:
            if self.stdin is not None and not self._stopped:
                os.close(self.stdin)
                self.stdin = None

    def _read(self) -> None:
        """Read what the status pipe holds, to its end if it has ended."""
        while not self._ended:
            try:
                data = os.read(self.exit_fd, 4096)
            except BlockingIOError:
                return
            lines = (self._pending + data).split(b"\n")
            self._pending = lines.pop()
            for line in lines:
                kind, value = line[:1], line[1:]
                if kind == b"p":
                    self.pid = int(value)
                elif kind == b"x":
                    number, _, text = value.partition(b" ")
                    self.error_number = int(number)
                    self.error = text.decode(errors="replace")
                elif kind == b"e":
                    self.returncode = int(value)
            if not data:
                self._ended = True
        if self._ended and self.returncode is None and not self.error and not self.lost:
            # The spawner died without a word of this hluk, which outlives it: killed here.
            self.lost = True
            if self.pid:
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except OSError:
                    pass

    def stop(self) -> int | None:
        with self._lock:
            if self._stopped:
                return self.returncode
            self._stopped = True
            self._read()
            if self.pid and not self._ended:
                # Waited for even when the runner's report is whole and hluk is on its way out:
                # returning first would let a worker run more micro-VMs than max_concurrent
                # for as long as the spawner takes to kill and reap this one.
                self.spawner.send(b"k\0%d" % self.pid)
                if not self._await_status(SPAWNER_STOP_SECONDS):
                    self._kill_unanswered()
            # A hluk it has not started yet (its case gave up waiting), the spawner kills (and
            # reaps) once this end of the status pipe is closed: no message, no waiting here.
            _close((self.stdout, self.stderr, self.exit_fd, self.stdin))
            return self.returncode

    def _await_status(self, seconds: float) -> bool:
        """Read the status pipe until it ends (hluk killed and reaped), at most `seconds`;
        whether it ended."""
        poller = select.poll()
        poller.register(self.exit_fd, self.exit_events)
        deadline = time.monotonic() + seconds
        while not self._ended:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller.poll(math.ceil(left * 1000))
            self._read()
        return True

    def _kill_unanswered(self) -> None:
        """The spawner did not say it killed and reaped this hluk (it is stopped, or starved of
        CPU): its group is killed from here, while hluk is still the spawner's child, not reaped,
        so its id cannot have been reused."""
        spawner = self.spawner.process
        if spawner is not None and _parent_of(self.pid) == spawner.pid:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
        if worth_logging(_unanswered.count("spawner-unanswered")):
            logger.warning(
                "verl-hyperlight: %s",
                diagnosis.spawner_unanswered(spawner.pid if spawner else 0, SPAWNER_STOP_SECONDS),
            )


_unanswered = CauseCounts()  # the cases whose spawner did not answer their hluk's stop


def _parent_of(pid: int) -> int:
    """The parent of `pid` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


class _Spawner:
    """This process's spawner (spawner.py), started by a thread that lives as long as it,
    since the parent-death signal follows the thread that forked, not the process."""

    def __init__(self) -> None:
        self.socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process: subprocess.Popen[bytes] | None = None
        self.alive = True
        # Set once its start is decided: an end before that is a start that failed (said by
        # the caller), never a death of a spawner that had started.
        self._decided = threading.Event()
        started = threading.Event()
        problem: list[BaseException] = []
        threading.Thread(
            target=self._own,
            args=(theirs, started, problem),
            name="verl-hyperlight-spawner",
            daemon=True,
        ).start()
        try:
            started.wait()
            if problem:
                raise problem[0]
            poller = select.poll()
            poller.register(self.socket, select.POLLIN)
            ready = poller.poll(SPAWNER_START_SECONDS * 1000)
            if not ready or self.socket.recv(16) != b"ready":
                self.alive = False
                assert self.process is not None
                self.process.kill()
                if ready:
                    raise OSError(f"{sys.executable} exited with status {self.process.wait()}")
                raise OSError(f"it did not say it was ready within {SPAWNER_START_SECONDS:.0f} s")
        finally:
            self._decided.set()

    def _own(
        self, theirs: socket.socket, started: threading.Event, problem: list[BaseException]
    ) -> None:
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", SPAWNER_SCRIPT, str(os.getpid())],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,  # a signal to the worker's group must not reach it
                # Nothing of the worker's (hluk gets its environment per request) but what a
                # Python built with a shared libpython may need to start.
                env=settings.spawner_environment(),
            )
        except (OSError, ValueError) as exc:
            problem.append(exc)
            return
        finally:
            theirs.close()
            started.set()
        status = self.process.wait()
        self._decided.wait()
        if self.alive:
            self.alive = False
            logger.error("verl-hyperlight: %s", diagnosis.spawner_died(self.process.pid, status))

    def spawn(self, argv: list[str], cwd: str | None, env: dict[str, str], stdin: bool) -> _Spawned:
        """Ask for hluk to be started (with a pipe to its stdin if `stdin`); its pid (or why it
        could not start) comes through the status pipe. _SpawnerGone if the spawner has died."""
        where = os.fsencode(cwd or os.getcwd())  # as subprocess: this process's, by default
        fields = [b"r", where, b"%d" % len(argv), *map(os.fsencode, argv)]
        fields += [os.fsencode(f"{name}={value}") for name, value in env.items()]
        request = b"\0".join(fields)
        kept: list[int] = []  # this process's ends: hluk's stdout, stderr, status (and stdin)
        sent: list[int] = []  # the spawner's ends of the same pipes
        try:
            for pipe in range(4 if stdin else 3):
                read_end, write_end = os.pipe2(os.O_CLOEXEC)
                ours, theirs = (write_end, read_end) if pipe == 3 else (read_end, write_end)
                kept.append(ours)
                sent.append(theirs)
                if pipe > 0:  # all but hluk's console carry lines
                    _carry_lines(ours)
            if len(request) > MESSAGE_LIMIT:
                # Beyond the socket's buffer (about 208 KiB) a message is refused (EMSGSIZE):
                # a large request (an operator's many VERL_HYPERLIGHT_HLUK_ENV variables)
                # travels in a memory file instead.
                sent.append(os.memfd_create("verl-hyperlight-request", os.MFD_CLOEXEC))
                view = memoryview(request)
                while view:
                    view = view[os.write(sent[-1], view) :]
                request = b"m"
            self.socket.sendmsg(
                [request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", sent))]
            )
        except OSError as exc:
            _close(kept)
            if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise _SpawnerGone from None
            raise
        finally:
            _close(sent)
        stdout, stderr, status = kept[:3]
        return _Spawned(self, stdout, stderr, status, kept[3] if stdin else None)

    def send(self, message: bytes) -> None:
        """Send `message`, never waiting: a spawner whose socket is full (it is stopped) does
        not get it, and the case that sent it does not wait for an answer."""
        try:
            self.socket.send(message, socket.MSG_DONTWAIT)
        except OSError:
            pass  # it is gone, and its children with it, or it is not reading


# posix_spawn holds a spawner until the child has exec'd (about 0.5 ms on our machines): one
# spawner starts at most a couple of thousand hluk a second, a worker's 64 cases of a few
# milliseconds can ask for more, so each worker has up to this many, taking cases in turn.
SPAWNERS = max(1, min(4, node.cpus()))
_lock = threading.Lock()
_spawners: dict[int, _Spawner] = {}  # by slot, 0 to SPAWNERS - 1
_turn = itertools.count()


class _StartState(enum.Enum):
    """Whether this process starts spawners now."""

    STARTING = "spawners are started as cases need them"
    BACKING_OFF = "a start failed: cases take the next way until the back-off has passed"
    RETRYING = "a spawner is being started again, in the background"


class _Starts:
    """This process's spawner starts, a state machine whose every transition is made under
    _lock, here. A start that fails leaves cases on the next way (BACKING_OFF); once the
    back-off has passed, the next case has a spawner started in a thread of its own (RETRYING),
    which no case waits for, and each failed retry doubles the back-off. The downgrade and the
    recovery are said once each; the retries between them are counted (for doctor)."""

    def __init__(self) -> None:
        self.state = _StartState.STARTING
        self.failure = ""  # why the last start failed, while none has started since
        self.failed_tries = 0
        self.failed_at = 0.0

    def failed(self, exc: BaseException, now: float) -> None:
        self.failure = str(exc) or type(exc).__name__
        self.failed_tries += 1
        self.failed_at = now
        if self.state is _StartState.STARTING:
            logger.warning(
                "verl-hyperlight: cannot start the spawner of hluk processes (%s): hluk is "
                "started %s instead, while the spawner is tried again in the background (in "
                "%.0f s, then less often, up to every %.0f s)",
                self.failure,
                _fallback(),
                SPAWNER_RETRY_SECONDS,
                SPAWNER_RETRY_MAX_SECONDS,
            )
        self.state = _StartState.BACKING_OFF

    def retry_due(self, now: float) -> bool:
        """Whether a retry starts now (it is then RETRYING, until it succeeds or fails)."""
        # Doubled with each failure; the exponent is bounded, for a float's sake, past the cap.
        doubled = SPAWNER_RETRY_SECONDS * 2 ** min(self.failed_tries - 1, 30)
        back_off = min(doubled, SPAWNER_RETRY_MAX_SECONDS)
        if self.state is _StartState.BACKING_OFF and now >= self.failed_at + back_off:
            self.state = _StartState.RETRYING
            return True
        return False

    def started(self) -> None:
        """A retry started a spawner: cases go through spawners again."""
        logger.warning(
            "verl-hyperlight: the spawner of hluk processes started again (%d starts had "
            "failed): hluk is started by spawners again",
            self.failed_tries,
        )
        self.state, self.failure, self.failed_tries = _StartState.STARTING, "", 0


_starts = _Starts()


def _forget_in_child() -> None:
    """A forked worker starts spawners of its own: the parent's die with the parent."""
    global _spawners, _lock, _starts
    _spawners, _lock, _starts = {}, threading.Lock(), _Starts()


os.register_at_fork(after_in_child=_forget_in_child)


def _current_spawner() -> _Spawner | None:
    """The spawner whose turn it is, started if there is none (or it died); None while none
    can start (see _Starts)."""
    slot = next(_turn) % SPAWNERS
    spawner = _spawners.get(slot)
    if spawner is not None and spawner.alive:
        return spawner
    with _lock:
        spawner = _spawners.get(slot)
        if spawner is not None and spawner.alive:
            return spawner
        if _starts.state is _StartState.STARTING:
            try:
                spawner = _spawners[slot] = _Spawner()
            except (OSError, ValueError) as exc:
                _starts.failed(exc, time.monotonic())
                return None
            return spawner
        if _starts.retry_due(time.monotonic()):
            retry = threading.Thread(
                target=_retry, args=(slot,), name="verl-hyperlight-spawner-retry", daemon=True
            )
            try:
                retry.start()
            except RuntimeError as exc:  # no thread can start now: a later case tries again
                _starts.failed(exc, time.monotonic())
        return None


def _retry(slot: int) -> None:
    """Start the spawner of `slot` again, in a thread of its own: no case waits for it."""
    try:
        spawner = _Spawner()
    except (OSError, ValueError) as exc:
        with _lock:
            _starts.failed(exc, time.monotonic())
        return
    with _lock:
        _spawners[slot] = spawner
        _starts.started()


def _fallback() -> str:
    if setpriv():
        return "through setpriv (an extra exec per case)"
    return "by a fork of the worker (its cost grows with the worker's memory)"


def describe() -> tuple[bool, str]:
    """Whether hluk is started the cheap way here, and how it is started (for doctor)."""
    way = settings.SPAWN.value()
    if way == "spawner":
        spawner = _current_spawner()
        if spawner is not None and spawner.process is not None:
            return True, (
                f"hluk is started by spawner processes (up to {SPAWNERS} per worker; "
                f"pid {spawner.process.pid} is one)"
            )
        return (
            False,
            f"the spawner cannot start ({_starts.failure}; {_starts.failed_tries} starts failed "
            f"so far, tried again in the background): hluk is started {_fallback()}",
        )
    if way == "setpriv" and setpriv():
        return True, f"hluk is started {_fallback()}, as {settings.SPAWN.name} asks"
    return False, f"hluk is started by a fork of the worker ({settings.SPAWN.name}={way})"


def raise_descriptor_limit() -> None:
    """Raise this process's soft limit of open descriptors to its hard limit, as servers do:
    the usual soft limit, 1,024, is kept for select(2), which nothing here uses, and each case
    in flight holds three descriptors (a notebook four), a client's connection one more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError):
            pass  # an unlimited hard limit is above the kernel's nr_open: the soft one stays


def spawn_paths() -> list[str]:
    """The ways this machine has to start hluk, the one used by default first."""
    return ["spawner", *(["setpriv"] if setpriv() else []), "fork"]


def spawn(argv: list[str], cwd: str | None, env: dict[str, str], stdin: bool = False) -> Process:
    """Start `argv` in `cwd` with `env` alone, stdin /dev/null (a pipe to write to if `stdin`),
    stdout and stderr pipes, in a process group of its own that dies with this process. Why
    it cannot be started is an OSError here, or the process's `error` once it has exited (the
    spawner's answer comes through its status pipe)."""
    way = settings.SPAWN.value()
    if way == "spawner":
        spawner = _current_spawner()
        if spawner is not None:
            try:
                return spawner.spawn(argv, cwd, env, stdin)
            except _SpawnerGone:
                # It died (the thread that owns it says so): this case takes the next way,
                # the next case starts another spawner.
                pass
        way = "setpriv"
    return _Popened(argv, cwd, env, way, stdin)
