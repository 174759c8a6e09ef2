"""What a process leaves behind when it dies, ended by a grandchild of its own: the cleaner.

A worker killed mid-case (SIGKILL, the OOM killer) cannot end its hluks nor remove its case
directories. So a child process, started before the first hluk or case directory, holds a pipe
from this process and a pidfd of it; once either says this process has gone (however it went),
it kills every process whose environment carries this process's token (`environment`: hluk
is started with it, and passes it to what it starts) with the process group each leads, and
removes every directory named with the token (`token`) in the roots it was told of. A case
tells it nothing: a root is told once, the first time a case directory is made there (each
record written to the pipe would wake the cleaner, which costs a case's thread more than the
write and the cleaner a read), and hluk's environment, which the kernel keeps, is the list of
its processes.

The pidfd is for a worker that forks: its child inherits the pipe (and keeps it open after
the parent's death), not the pidfd's meaning. The process this one starts opens the pidfd,
forks the cleaner and waits for it: Ray, ending a worker, SIGKILLs the worker's direct
children first (``CoreWorker::KillChildProcs``), which the cleaner, a grandchild, outlives to
see the worker end. The token and the told roots are per-process state, set under a lock; a
forked child has a cleaner and a token of its own.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import threading

from .. import diagnosis, settings
from .pipes import carry_lines

logger = logging.getLogger("verl_hyperlight")

_CODE = r"""
import os, select, shutil, signal, sys
token, worker = os.fsencode(sys.argv[1]), int(sys.argv[2])
marker = os.fsencode(sys.argv[3]) + b"=" + token + b"\0"
try:
    pidfd = os.pidfd_open(worker)
except (AttributeError, OSError):
    pidfd = -1
gone = os.getppid() != worker  # the worker died before the pidfd was open
if child := os.fork():
    os.close(0)
    os.waitpid(child, 0)
    os._exit(0)
roots, rest = set(), b""
def take(chunk):
    global rest
    *records, rest = (rest + chunk).split(b"\0")
    roots.update(records)
poller = select.poll()
poller.register(0, select.POLLIN)
if pidfd >= 0:
    poller.register(pidfd, select.POLLIN)
while not gone:
    events = dict(poller.poll())
    if 0 in events:
        chunk = os.read(0, 65536)
        take(chunk)
        gone = not chunk
    gone = gone or pidfd in events
os.set_blocking(0, False)
try:
    while chunk := os.read(0, 65536):
        take(chunk)
except OSError:
    pass
me = os.getpid()
for _ in range(10):  # until none is left: one may have been starting as the last was killed
    found = 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as environ:
                if marker not in b"\0" + environ.read():
                    continue
        except OSError:
            continue
        found += 1
        pid = int(name)
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if not found:
        break
for root in roots:
    try:
        names = os.listdir(root)
    except OSError:
        continue
    for name in names:
        if name.startswith(token):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
"""


class _Cleaner:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = False
        self._process: subprocess.Popen[bytes] | None = None  # kept: its pipe must stay open
        self._roots: set[str] = set()
        # What this process's case directories' names start with, and its hluks'
        # environment carries.
        self.token = f"verl-hyperlight-{secrets.token_hex(8)}-"
        self.environment = {settings.WORKER_TOKEN: self.token}

    def running(self) -> bool:
        """Start the cleaner unless it was started; whether it runs (or ran: it is not
        watched after its start)."""
        if not self._started:
            with self._lock:
                if not self._started:
                    self._process = self._start()
                    self._started = True
        return self._process is not None

    def watch(self, root: str) -> None:
        """Have the cleaner remove this process's directories in `root`: told once per root."""
        if root in self._roots:
            return
        self.running()
        with self._lock:
            if root in self._roots:
                return
            if self._process is not None and self._process.stdin is not None:
                try:
                    os.write(self._process.stdin.fileno(), os.fsencode(root) + b"\0")
                except (OSError, ValueError):
                    pass  # the cleaner is gone: cases still remove their own directories
            self._roots.add(root)

    def _start(self) -> subprocess.Popen[bytes] | None:
        null = -1
        try:
            # Our own /dev/null, opened before the pipe: Python 3.10's Popen leaks the pipe it
            # made when its DEVNULL cannot be opened after it (EMFILE).
            null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            argv = [sys.executable, "-I", "-S", "-c", _CODE, self.token, str(os.getpid())]
            process = subprocess.Popen(
                [*argv, settings.WORKER_TOKEN],
                stdin=subprocess.PIPE,
                stdout=null,
                stderr=null,
                close_fds=True,
                start_new_session=True,  # a signal to the worker's group must not stop it early
                env=settings.spawner_environment(),
            )
            if process.stdin is not None:
                carry_lines(process.stdin.fileno())
            return process
        except OSError as exc:
            logger.warning("verl-hyperlight: %s", diagnosis.no_cleaner(exc))
            return None
        finally:
            if null >= 0:
                os.close(null)


_cleaner = _Cleaner()


def _forget_in_child() -> None:
    """A forked worker names its directories and hluks with a token of its own, and has them
    ended by a cleaner of its own (its parent's ends the parent's when the parent is gone)."""
    global _cleaner
    _cleaner = _Cleaner()


os.register_at_fork(after_in_child=_forget_in_child)


def running() -> bool:
    """See _Cleaner.running."""
    return _cleaner.running()


def watch(root: str) -> None:
    """See _Cleaner.watch."""
    _cleaner.watch(root)


def token() -> str:
    """This process's token: its case directories' names start with it."""
    return _cleaner.token


def environment() -> dict[str, str]:
    """What hluk's environment carries so that the cleaner finds it (do not change it)."""
    return _cleaner.environment
