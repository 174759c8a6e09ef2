"""How hluk is started: in a process group of its own, dying with the reward worker.

Four ways, the first that works here is used (VERL_HYPERLIGHT_SPAWN names one to use):

- ``direct``: the worker starts hluk with posix_spawn (a vfork: its cost does not grow with
  the worker's memory), in a session of its own; hluk's environment carries the worker's
  token, by which the cleaner (``cleaner.py``, a grandchild that outlives the worker) kills
  every hluk of the worker, with its process group, once the worker has died. No helper
  wakes for a case. A hluk that must run in another directory (posix_spawn cannot change
  it) is started by Popen. From Python 3.13 on, posix_spawn closes every other descriptor of
  the worker in hluk; before, hluk inherits those the worker made inheritable (Python makes
  none so, PEP 446; a C library that opens without O_CLOEXEC may). A cleaner that cannot
  start leaves the process on the next way.
- ``spawner``: small long-lived processes (``spawner.py``, as ``spawners`` keeps them: one per
  worker, up to SPAWNERS taking cases in turn when many hluks run at once) start each hluk
  with posix_spawn. The worker sends one a message with three pipes. The spawner answers
  through the case's status pipe (the pid, then the exit status, since only a parent can wait
  for a process). It ends every hluk it started when the worker dies (its parent-death
  signal) or closes its socket, and the hluk of a case that closed its status pipe (it gave
  up, or no longer needs the status); were the spawner itself killed, each case kills its own
  and says so. Each case wakes a spawner twice (its request, hluk's exit).
- ``setpriv``: util-linux's setpriv sets the parent-death signal and execs hluk; Python's spawn
  stays on vfork, at the cost of an extra exec per case.
- ``fork``: a preexec_fn sets it, which forces a fork of the whole worker (page tables copied
  with the GIL held: about 100 ms per case for 2 GiB).

A spawner that cannot start leaves the process on the next way until it can (``spawners``).
Pipes that carry lines only (hluk's stderr, a notebook's requests, the status pipe) are made
one page (``pipes``); only hluk's console keeps the default size. Who owns what: a
started hluk's state (stopped, its status) changes under its own lock, as CPython guards its
wait (``subprocess.Popen._waitpid_lock``), so that two threads ending it kill and reap it once.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import resource
import select
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Protocol

from .. import diagnosis, settings
from . import cleaner, spawners
from .pipes import carry_lines, close

logger = logging.getLogger("verl_hyperlight")

PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


class Process(Protocol):
    """A started hluk, as ``watch`` drives it, whatever way started it: two pipes to read,
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

    def answered(self) -> None:
        """Its case is answered, its end awaited off the case's path (ending.py): it no longer
        counts among the hluks that run cases, by which the spawners' pool is sized."""

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


def _die_with_parent(parent: int) -> None:
    """For preexec_fn: in the child, a process group of its own, and SIGKILL when `parent`
    (the spawning process) dies, also if it died before the request took effect."""
    os.setpgid(0, 0)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def _popen_way(argv: list[str], way: str) -> tuple[list[str], Callable[[], None] | None]:
    """What Popen starts on the setpriv and fork ways, and the fork way's preexec_fn (None:
    Popen makes the session)."""
    if way == "setpriv" and (path := setpriv()) is not None:
        if os.path.isdir(argv[0]) or not os.access(argv[0], os.X_OK):
            # setpriv would only say so on hluk's stderr, after it started
            raise OSError(errno.EACCES, "not an executable file", argv[0])
        return [path, "--pdeathsig", "KILL", "--", *argv], None
    parent = os.getpid()
    return argv, lambda: _die_with_parent(parent)


# posix_spawn's action that closes every descriptor from a number on (Python 3.13 and later,
# where the C library has it): none of the worker's reaches hluk.
_CLOSEFROM: int | None = getattr(os, "POSIX_SPAWN_CLOSEFROM", None)
_CLOSE_OTHERS: tuple[tuple[int, int], ...] = () if _CLOSEFROM is None else ((_CLOSEFROM, 3),)
# hluk starts as from a fresh exec, whatever the worker's thread has: every signal at its default
# action (a worker started in the background by a script ignores SIGINT and SIGQUIT, Python
# ignores SIGPIPE; an ignored signal is inherited through exec) and none blocked (a blocked one
# too). The spawner's way gives hluk the same (spawner.py). Popen's ways (setpriv, fork) reset
# only SIGPIPE and SIGXFSZ, as subprocess does.
DEFAULT_SIGNALS = frozenset(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}


class _Child:
    """A child started by posix_spawn, as much of subprocess.Popen as _Popened uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def wait(self) -> int:
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                # Reaped by the kernel (the worker ignores SIGCHLD): no status, as subprocess
                # says it (0).
                self.returncode = 0
            else:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class _Popened:
    """hluk started by this process (the direct, setpriv and fork ways): its exit is a
    pidfd's."""

    exit_events = select.POLLIN

    def __init__(
        self, argv: list[str], cwd: str | None, env: dict[str, str], way: str, stdin: bool
    ) -> None:
        preexec = None  # the direct way's, in another directory (Popen then starts it)
        if way != "direct":
            argv, preexec = _popen_way(argv, way)
        # The pipes and /dev/null are made here, not by Popen: Python 3.10's Popen leaks
        # those it made when a later one cannot be (EMFILE at the worker's descriptor limit).
        # Every case passes here: the direct way's steps are written out, not looped.
        ours: list[int] = []  # the ends kept here
        theirs: list[int] = []  # the child's, closed once it has them
        to_stdin: int | None = None
        try:
            if stdin:
                child_stdin, to_stdin = os.pipe2(os.O_CLOEXEC)
                theirs.append(child_stdin)
                ours.append(to_stdin)
            else:
                child_stdin = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                theirs.append(child_stdin)
            stdout, child_stdout = os.pipe2(os.O_CLOEXEC)
            ours.append(stdout)
            theirs.append(child_stdout)
            stderr, child_stderr = os.pipe2(os.O_CLOEXEC)
            ours.append(stderr)
            theirs.append(child_stderr)
            self.popen: subprocess.Popen[bytes] | _Child
            if way == "direct" and cwd is None:
                self.popen = _Child(
                    os.posix_spawn(
                        argv[0],
                        argv,
                        env,
                        file_actions=[
                            (os.POSIX_SPAWN_DUP2, child_stdin, 0),
                            (os.POSIX_SPAWN_DUP2, child_stdout, 1),
                            (os.POSIX_SPAWN_DUP2, child_stderr, 2),
                            *_CLOSE_OTHERS,
                        ],
                        setsid=True,
                        setsigmask=(),
                        setsigdef=DEFAULT_SIGNALS,
                    )
                )
            else:
                self.popen = subprocess.Popen(
                    argv,
                    stdin=child_stdin,
                    stdout=child_stdout,
                    stderr=child_stderr,
                    close_fds=True,
                    cwd=cwd,
                    env=env,
                    start_new_session=preexec is None,  # else preexec makes the group
                    preexec_fn=preexec,  # noqa: PLW1509 - only the fork way has one
                )
        except BaseException:
            close(ours)
            raise
        finally:
            close(theirs)
        self.stdout, self.stderr = stdout, stderr
        self.stdin = to_stdin
        self.error = ""
        self.error_number = 0
        self.lost = False
        self._lock = threading.Lock()  # stop's, as Popen's _waitpid_lock guards its wait
        self._stopped = False
        self.exit_fd = -1  # none yet
        try:
            carry_lines(stderr)
            if to_stdin is not None:
                carry_lines(to_stdin)
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
            close((exit_fd, ended))
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

    def answered(self) -> None:
        pass  # started without a spawner: nothing counts it

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
            close((self.stdout, self.stderr, self.stdin))
            if self.exit_fd >= 0:
                os.close(self.exit_fd)
            return status


def _fallback() -> str:
    if setpriv():
        return "through setpriv (an extra exec per case)"
    return "by a fork of the worker (its cost grows with the worker's memory)"


def _way() -> str:
    """The way hluk is started now: the setting's, less the direct way while the cleaner,
    which ends a dead worker's hluks, cannot start (then the spawner's)."""
    way = settings.SPAWN.value()
    if way == "direct" and not cleaner.running():
        return "spawner"
    return way


def describe() -> tuple[bool, str]:
    """Whether hluk is started the cheap way here, and how it is started (for doctor)."""
    way = _way()
    if way == "direct":
        return True, (
            "hluk is started by the worker itself (posix_spawn); the cleaner ends it if the "
            "worker dies"
        )
    first = ""
    if settings.SPAWN.value() == "direct":
        first = "the cleaner cannot start (the warning above says why), so "
    if way == "spawner":
        spawner = spawners.current(_fallback)
        if spawner is not None and spawner.process is not None:
            return not first, (
                f"{first}hluk is started by spawner processes (up to {spawners.SPAWNERS} per "
                f"worker; pid {spawner.process.pid} is one)"
            )
        failure, failed = spawners.start_failure()
        return (
            False,
            f"{first}the spawner cannot start ({failure}; {failed} starts failed "
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


def start(argv: list[str], cwd: str | None, stdin: bool = False) -> Process:
    """Start hluk (`argv`) in `cwd`, with the environment settings gives it, in a process group
    of its own that dies with this process (see `spawn`); BackendError saying why it cannot."""
    try:
        return spawn(argv, cwd, settings.hluk_environment(), stdin)
    except OSError as exc:
        raise diagnosis.cannot_start(argv[0], str(exc), exc.errno or 0) from None


def spawn(argv: list[str], cwd: str | None, env: dict[str, str], stdin: bool = False) -> Process:
    """Start `argv` in `cwd` with `env` alone, stdin /dev/null (a pipe to write to if `stdin`),
    stdout and stderr pipes, in a process group of its own that dies with this process. Why
    it cannot be started is an OSError here, or the process's `error` once it has exited (the
    spawner's answer comes through its status pipe)."""
    way = _way()
    if way == "direct":
        return _Popened(argv, cwd, {**env, **cleaner.environment()}, way, stdin)
    if way == "spawner":
        spawner = spawners.current(_fallback)
        if spawner is not None:
            try:
                return spawner.spawn(argv, cwd, env, stdin)
            except spawners.SpawnerGone:
                # It died (the thread that owns it says so): this case takes the next way,
                # the next case starts another spawner.
                pass
        way = "setpriv"
    return _Popened(argv, cwd, env, way, stdin)
