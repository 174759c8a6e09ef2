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

A spawner that dies is started again by the next case; one that cannot start (no usable
Python at sys.executable) leaves the process on the next way, with a warning.
"""

from __future__ import annotations

import array
import ctypes
import errno
import functools
import itertools
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Protocol

from .spawner import MESSAGE_LIMIT

logger = logging.getLogger("verl_hyperlight")

SPAWN_ENV = "VERL_HYPERLIGHT_SPAWN"
PATHS = ("spawner", "setpriv", "fork")
PR_SET_PDEATHSIG = 1
# How long the spawner may take to start. Its answers to requests have no deadline of their
# own: a case's start-up deadline bounds them, and a slow spawner on a loaded node is healthy.
SPAWNER_START_SECONDS = 30.0
INTERPRETER_ENVIRONMENT = ("LD_LIBRARY_PATH",)
SPAWNER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spawner.py")

_libc = ctypes.CDLL(None, use_errno=True)


class Process(Protocol):
    """A started hluk, as ``_hluk.run`` drives it, whatever way started it: two pipes to read,
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
    def lost(self) -> bool:
        """Whether what started it died before it said how hluk ended (hluk's group was
        killed then)."""

    def exited(self) -> bool:
        """exit_fd was readable: whether hluk has now exited, could not start, or is lost."""

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
        self.popen = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            cwd=cwd,
            env=env,
            start_new_session=preexec is None,  # else preexec makes the group
            preexec_fn=preexec,  # noqa: PLW1509 - only the fork way has one
        )
        assert self.popen.stdout is not None and self.popen.stderr is not None
        self.out, self.err = self.popen.stdout, self.popen.stderr
        self.stdout, self.stderr = self.out.fileno(), self.err.fileno()
        self.stdin = self.popen.stdin.fileno() if self.popen.stdin is not None else None
        self.error = ""
        self.lost = False
        self._stopped = False
        try:
            self.exit_fd = os.pidfd_open(self.popen.pid)
        except (AttributeError, OSError):
            # Linux < 5.3: a thread waits for it and ends a pipe, the same pollable exit.
            self.exit_fd, ended = os.pipe2(os.O_CLOEXEC)
            threading.Thread(target=self._await_exit, args=(ended,), daemon=True).start()

    def _await_exit(self, ended: int) -> None:
        self.popen.wait()
        os.close(ended)

    def exited(self) -> bool:
        return True

    def stop(self) -> int | None:
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
        self.out.close()
        self.err.close()
        if self.popen.stdin is not None:
            self.popen.stdin.close()
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
        self.lost = False
        self.returncode: int | None = None
        self._ended = False  # the status pipe has ended
        self._stopped = False
        self._pending = b""

    def exited(self) -> bool:
        self._read()
        return self._ended

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
                    self.error = value.decode(errors="replace")
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
        if not self._stopped:
            self._stopped = True
            self._read()
            if self.pid and not self._ended:
                # Waited for even when the runner's report is whole and hluk is on its way out:
                # returning first would let a worker run more micro-VMs than max_concurrent
                # for as long as the spawner takes to kill and reap this one.
                self.spawner.send(b"k\0%d" % self.pid)
                poller = select.poll()
                poller.register(self.exit_fd, self.exit_events)
                while not self._ended:  # its status comes once it is killed and reaped
                    poller.poll()
                    self._read()
            # A hluk it has not started yet (its case gave up waiting), the spawner kills (and
            # reaps) once this end of the status pipe is closed: no message, no waiting here.
            for fd in (self.stdout, self.stderr, self.exit_fd, self.stdin):
                if fd is not None:
                    os.close(fd)
        return self.returncode


class _Spawner:
    """This process's spawner (spawner.py), started by a thread that lives as long as it,
    since the parent-death signal follows the thread that forked, not the process."""

    def __init__(self) -> None:
        self.socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process: subprocess.Popen[bytes] | None = None
        self.alive = True
        started = threading.Event()
        problem: list[BaseException] = []
        threading.Thread(
            target=self._own,
            args=(theirs, started, problem),
            name="verl-hyperlight-spawner",
            daemon=True,
        ).start()
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
                env={
                    name: os.environ[name] for name in INTERPRETER_ENVIRONMENT if name in os.environ
                },
            )
        except (OSError, ValueError) as exc:
            problem.append(exc)
            return
        finally:
            theirs.close()
            started.set()
        status = self.process.wait()
        if self.alive:
            self.alive = False
            logger.error(
                "verl-hyperlight: the spawner of hluk processes (pid %d) died (status %d); "
                "the hluk it had started were killed with it: their cases are answered "
                "SandboxError, those whose solution had not started are retried, and the next "
                "case starts another spawner. Check `dmesg` for the OOM killer or who killed "
                "it; %s=setpriv starts hluk without spawners",
                self.process.pid,
                status,
                SPAWN_ENV,
            )

    def spawn(self, argv: list[str], cwd: str | None, env: dict[str, str], stdin: bool) -> _Spawned:
        """Ask for hluk to be started (with a pipe to its stdin if `stdin`); its pid (or why it
        could not start) comes through the status pipe. _SpawnerGone if the spawner has died."""
        where = os.fsencode(cwd or os.getcwd())  # as subprocess: this process's, by default
        fields = [b"r", where, b"%d" % len(argv), *map(os.fsencode, argv)]
        fields += [os.fsencode(f"{name}={value}") for name, value in env.items()]
        request = b"\0".join(fields)
        stdout_r, stdout_w = os.pipe2(os.O_CLOEXEC)
        stderr_r, stderr_w = os.pipe2(os.O_CLOEXEC)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        sent = [stdout_w, stderr_w, status_w]
        stdin_w = None
        if stdin:
            stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
            sent.append(stdin_r)
        try:
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
            for fd in (stdout_r, stderr_r, status_r, stdin_w):
                if fd is not None:
                    os.close(fd)
            if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise _SpawnerGone from None
            raise
        finally:
            for fd in sent:
                os.close(fd)
        return _Spawned(self, stdout_r, stderr_r, status_r, stdin_w)

    def send(self, message: bytes) -> None:
        try:
            self.socket.send(message)
        except OSError:
            pass  # it is gone, and its children with it


# posix_spawn holds a spawner until the child has exec'd (about 0.5 ms on our machines): one
# spawner starts at most a couple of thousand hluk a second, a worker's 64 cases of a few
# milliseconds can ask for more, so each worker has up to this many, taking cases in turn.
SPAWNERS = max(1, min(4, len(os.sched_getaffinity(0))))
_lock = threading.Lock()
_spawners: dict[int, _Spawner] = {}  # by slot, 0 to SPAWNERS - 1
_turn = itertools.count()
_spawner_failure = ""  # why one could not start, once one could not


def _forget_in_child() -> None:
    """A forked worker starts spawners of its own: the parent's die with the parent."""
    global _spawners, _lock
    _spawners, _lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def _current_spawner() -> _Spawner | None:
    """The spawner whose turn it is, started if there is none (or it died); None if one
    cannot start."""
    global _spawner_failure
    slot = next(_turn) % SPAWNERS
    spawner = _spawners.get(slot)
    if spawner is not None and spawner.alive:
        return spawner
    with _lock:
        spawner = _spawners.get(slot)
        if spawner is not None and spawner.alive:
            return spawner
        if _spawner_failure:
            return None
        try:
            spawner = _spawners[slot] = _Spawner()
        except (OSError, ValueError) as exc:
            _spawner_failure = str(exc) or type(exc).__name__
            logger.warning(
                "verl-hyperlight: cannot start the spawner of hluk processes (%s): hluk is "
                "started %s instead",
                _spawner_failure,
                _fallback(),
            )
            return None
        return spawner


def _fallback() -> str:
    if setpriv():
        return "through setpriv (an extra exec per case)"
    return "by a fork of the worker (its cost grows with the worker's memory)"


def describe() -> tuple[bool, str]:
    """Whether hluk is started the cheap way here, and how it is started (for doctor)."""
    way = _chosen(os.environ.get(SPAWN_ENV))
    if way == "spawner":
        spawner = _current_spawner()
        if spawner is not None and spawner.process is not None:
            return True, (
                f"hluk is started by spawner processes (up to {SPAWNERS} per worker; "
                f"pid {spawner.process.pid} is one)"
            )
        return (
            False,
            f"the spawner cannot start ({_spawner_failure}): hluk is started {_fallback()}",
        )
    if way == "setpriv" and setpriv():
        return True, f"hluk is started {_fallback()}, as {SPAWN_ENV} asks"
    return (
        False,
        f"hluk is started by a fork of the worker ({SPAWN_ENV}={os.environ.get(SPAWN_ENV)})",
    )


@functools.lru_cache(maxsize=8)
def _chosen(setting: str | None) -> str:
    if setting in PATHS:
        return setting
    if setting:
        logger.error(
            "verl-hyperlight: %s=%r is none of %s; the default is used",
            SPAWN_ENV,
            setting,
            ", ".join(PATHS),
        )
    return "spawner"


def spawn_paths() -> list[str]:
    """The ways this machine has to start hluk, the one used by default first."""
    return ["spawner", *(["setpriv"] if setpriv() else []), "fork"]


def spawn(argv: list[str], cwd: str | None, env: dict[str, str], stdin: bool = False) -> Process:
    """Start `argv` in `cwd` with `env` alone, stdin /dev/null (a pipe to write to if `stdin`),
    stdout and stderr pipes, in a process group of its own that dies with this process. Why
    it cannot be started is an OSError here, or the process's `error` once it has exited (the
    spawner's answer comes through its status pipe)."""
    way = _chosen(os.environ.get(SPAWN_ENV))
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
