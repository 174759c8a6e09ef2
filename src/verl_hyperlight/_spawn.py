"""How hluk is started: in a process group of its own, dying with the reward worker.

Three ways, the first that works here is used (VERL_HYPERLIGHT_SPAWN names one to use):

- ``spawner``: small long-lived processes (``spawner.py``; up to SPAWNERS per worker, taking
  cases in turn) start each hluk with posix_spawn. The worker sends one a message with three
  pipes and reads the pid back: no fork or exec of its own per case, so nothing per case grows
  with the worker's memory. A spawner ends every hluk it started when the worker dies (its
  parent-death signal) or closes its socket, and reports each exit through the case's status
  pipe, since only a parent can wait for a process; were the spawner itself killed, each case
  kills its own.
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

logger = logging.getLogger("verl_hyperlight")

SPAWN_ENV = "VERL_HYPERLIGHT_SPAWN"
PATHS = ("spawner", "setpriv", "fork")
PR_SET_PDEATHSIG = 1
# How long the spawner may take to start, and to answer a request with the pid.
SPAWNER_START_SECONDS = 30.0
SPAWNER_ANSWER_SECONDS = 30.0
INTERPRETER_ENVIRONMENT = ("LD_LIBRARY_PATH",)
SPAWNER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spawner.py")

_libc = ctypes.CDLL(None, use_errno=True)


class Process(Protocol):
    """A started hluk, as ``_hluk.run`` drives it."""

    pid: int
    stdout: int  # descriptors to read
    stderr: int

    @property
    def exit_fd(self) -> int | None:
        """Readable once it has exited (None: poll() it)."""

    def exit_notice(self) -> bool:
        """exit_fd was readable: whether that says it has exited."""

    def poll(self) -> bool:
        """Whether it has exited."""

    def kill(self) -> None:
        """SIGKILL its process group, unless it has been waited for."""

    def wait(self) -> int:
        """Wait for its exit; its status as subprocess gives it (-N: killed by signal N)."""

    def close(self) -> None:
        """Close what it holds (its pipes)."""


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
    """hluk started by subprocess (the setpriv and fork ways)."""

    def __init__(self, argv: list[str], cwd: str | None, env: dict[str, str], way: str) -> None:
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
            stdin=subprocess.DEVNULL,
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
        self.pid: int = self.popen.pid
        self.stdout, self.stderr = self.out.fileno(), self.err.fileno()
        try:
            self.exit_fd: int | None = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.exit_fd = None  # Linux < 5.3: polled

    def exit_notice(self) -> bool:
        return True

    def poll(self) -> bool:
        return self.popen.poll() is not None

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self) -> int:
        return self.popen.wait()

    def close(self) -> None:
        self.out.close()
        self.err.close()
        if self.exit_fd is not None:
            os.close(self.exit_fd)


class _SpawnerGone(Exception):
    """The spawner died or stopped answering."""


class _Spawned:
    """hluk started by the spawner: its exit and status come through the status pipe."""

    def __init__(self, spawner: _Spawner, stdout: int, stderr: int, status: int) -> None:
        self.spawner = spawner
        self.stdout, self.stderr, self.exit_fd = stdout, stderr, status
        self.pid = 0
        self.error = ""
        self.returncode: int | None = None
        self._pending = b""

    def _read(self) -> bool:
        """Read the status pipe once; False at its end."""
        data = os.read(self.exit_fd, 4096)
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
        return bool(data)

    def started(self) -> None:
        """Wait for the spawner's answer: the pid of the running hluk. OSError if it could
        not be started; _SpawnerGone if the spawner is."""
        while not self.pid:
            ready, _, _ = select.select([self.exit_fd], [], [], SPAWNER_ANSWER_SECONDS)
            if not ready:
                self.spawner.stop(f"did not answer within {SPAWNER_ANSWER_SECONDS:.0f} s")
                raise _SpawnerGone
            more = self._read()
            if self.error:
                raise OSError(self.error)
            if not more and not self.pid:
                raise _SpawnerGone

    def exit_notice(self) -> bool:
        if not self._read() and self.returncode is None:
            # The spawner ended without a word of this hluk: it was killed, so this kills it.
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
            self.returncode = -signal.SIGKILL
        return self.returncode is not None

    def poll(self) -> bool:
        return self.returncode is not None

    def kill(self) -> None:
        if self.returncode is None:
            self.spawner.send(b"k\0%d" % self.pid)

    def wait(self) -> int:
        while self.returncode is None:
            self.exit_notice()
        return self.returncode

    def close(self) -> None:
        for fd in (self.stdout, self.stderr, self.exit_fd):
            os.close(fd)


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
        ready, _, _ = select.select([self.socket], [], [], SPAWNER_START_SECONDS)
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
            logger.warning(
                "verl-hyperlight: the spawner of hluk processes (pid %d) exited with status "
                "%d; its cases in flight fail as killed and are retried, the next case starts "
                "another",
                self.process.pid,
                status,
            )

    def spawn(self, argv: list[str], cwd: str | None, env: dict[str, str]) -> _Spawned:
        where = os.fsencode(cwd or os.getcwd())  # as subprocess: this process's, by default
        fields = [b"r", where, b"%d" % len(argv), *map(os.fsencode, argv)]
        fields += [os.fsencode(f"{name}={value}") for name, value in env.items()]
        stdout_r, stdout_w = os.pipe2(os.O_CLOEXEC)
        stderr_r, stderr_w = os.pipe2(os.O_CLOEXEC)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        child = _Spawned(self, stdout_r, stderr_r, status_r)
        try:
            descriptors = array.array("i", [stdout_w, stderr_w, status_w])
            self.socket.sendmsg(
                [b"\0".join(fields)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, descriptors)]
            )
        except OSError:
            child.close()
            raise _SpawnerGone from None
        finally:
            for fd in (stdout_w, stderr_w, status_w):
                os.close(fd)
        try:
            child.started()
        except BaseException:
            child.close()
            raise
        return child

    def send(self, message: bytes) -> None:
        try:
            self.socket.send(message)
        except OSError:
            pass  # it is gone, and its children with it

    def stop(self, why: str) -> None:
        """Kill it: the next case starts another. Its socket stays open while a case may still
        use it (a descriptor closed under another thread could be reused by then)."""
        if self.alive:
            self.alive = False
            logger.warning("verl-hyperlight: the spawner of hluk processes %s; stopped", why)
        assert self.process is not None
        self.process.kill()


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


def spawn(argv: list[str], cwd: str | None, env: dict[str, str]) -> Process:
    """Start `argv` in `cwd` with `env` alone, stdin /dev/null, stdout and stderr pipes, in a
    process group of its own that dies with this process. OSError if it cannot be."""
    way = _chosen(os.environ.get(SPAWN_ENV))
    if way == "spawner":
        spawner = _current_spawner()
        if spawner is not None:
            try:
                return spawner.spawn(argv, cwd, env)
            except _SpawnerGone:
                # This case takes the next way; the next case starts another spawner.
                spawner.stop("ended before it answered a case")
        way = "setpriv"
    return _Popened(argv, cwd, env, way)
