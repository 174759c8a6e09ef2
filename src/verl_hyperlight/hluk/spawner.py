"""The spawner: a small process per reward worker that starts its hluk processes.

A hluk must die with the reward worker that started it, however the worker dies. Set from
the worker, its parent-death signal costs either a fork of the worker (page tables of
gigabytes copied, with the GIL held) or an extra exec of setpriv per case. This process is
small and starts each hluk with posix_spawn (a vfork: nothing copied, no extra exec). It gets
SIGTERM when its guard dies, and then, or when its socket ends, kills every hluk group it
started and exits. It runs as a script, ``python -I -S spawner.py WORKER_PID``: standard
library only, single-threaded.

The process the worker starts is the spawner's guard, not the spawner: it forks the spawner
and waits for it, exiting as it exits. The guard dies with the worker (its parent-death
signal), and the spawner with the guard (its own). Ray, when it ends a worker
(``CoreWorker::KillChildProcs``, on by default: ``RAY_kill_child_processes_on_worker_exit``),
SIGKILLs the worker's direct children before the worker exits: a spawner that was one died
without a word and left its hluk running until they ended by themselves. The guard takes
that SIGKILL in its place, and the spawner, the worker's grandchild, hears of it.

Its stdin is a SOCK_SEQPACKET socket to the worker; its first message there is ``ready PID``
(the spawner's own pid, not its guard's).
Each message from the worker is one request:

- ``r\\0CWD\\0ARGC\\0ARG...\\0ENV...`` with three descriptors (hluk's stdout and stderr, and a
  status pipe): spawn ARGs in a process group of its own, in CWD (absolute), with ENV alone,
  stdin /dev/null, SIGPIPE and SIGXFSZ at their defaults (as subprocess restores them). The
  status pipe is written ``p<pid>`` once it runs, or ``x<errno> <message>`` if it could not
  be started (errno 0: none), and ``e<status>`` once it has exited (as subprocess gives it:
  -N for signal N), each line ending in a newline, then closed. What it left in its group is
  killed before it is reaped, while its pid (the group's id) cannot be reused. A hluk whose
  status pipe has no reader any more (the case gave up, or needs no status) is killed at once.
- the same with a fourth descriptor, hluk's stdin (a pipe the worker writes to: a notebook's
  requests), in place of /dev/null.
- ``m`` with one more descriptor, last, a memory file holding an ``r`` request too large for
  one message.
- ``k\\0PID``: kill PID's group, if PID is a child not yet reaped (so never a reused id).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import sys

PR_SET_PDEATHSIG = 1
# Larger requests come in a memory file (the worker reads this too); one read there is
# bounded too, far above what execve accepts.
MESSAGE_LIMIT = 64 * 1024
MAX_REQUEST = 64 * 1024 * 1024
DESCRIPTORS = 3
# hluk starts with every signal at its default action and none blocked, as from a fresh exec
# (spawn.DEFAULT_SIGNALS, which this script, run apart from the package, cannot import).
DEFAULT_SIGNALS = frozenset(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
_libc = ctypes.CDLL(None, use_errno=True)
# glibc's mallopt: each request (57 KB: hluk's --warm-exec carries the guest runner) was
# allocated, freed and the heap trimmed, ten page faults a case, about a tenth of the
# spawner's CPU per case; kept, it is reused. M_TRIM_THRESHOLD and M_MMAP_THRESHOLD.
MALLOPT = ((-1, 64 * 1024 * 1024), (-3, 4 * 1024 * 1024))


def _tell(status: int, line: bytes) -> bool:
    """Write to a status pipe; False if no one reads it any more."""
    try:
        os.write(status, line)
    except OSError:
        return False
    return True


class Spawner:
    def __init__(self, guard: int) -> None:
        self.children: dict[int, int] = {}  # pid -> its status pipe
        self.listening: dict[int, int] = {}  # status pipe -> pid, while the case reads it
        self.cwd = b""  # the directory it is in, once it has chdir'd
        signal.signal(signal.SIGTERM, self.end)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if hasattr(_libc, "mallopt"):  # glibc's; another libc keeps its own ways
            for parameter, value in MALLOPT:
                _libc.mallopt(parameter, value)
        if os.getppid() != guard:  # it died before the request took effect
            self.end()
        self.socket = socket.socket(fileno=0)
        self.devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        self.poller = select.poll()
        self.poller.register(self.socket, select.POLLIN)
        self.poller.register(self.wake_r, select.POLLIN)

    def end(self, *_: object) -> None:
        """The worker is gone: so is every hluk this started."""
        for pid in self.children:
            self.kill(pid)
        os._exit(0)

    def serve(self) -> None:
        self.socket.send(b"ready %d" % os.getpid())
        while True:
            events = self.poller.poll()
            # Status pipes whose reader has gone (registered for no event: only that error),
            # first, while each descriptor is still the pipe that was polled: a reap closes
            # them and a request makes new ones, which may take their numbers.
            for fd, _ in events:
                if fd in self.listening:
                    self.poller.unregister(fd)
                    self.kill(self.listening.pop(fd))
            for fd, _ in events:
                if fd == self.wake_r:
                    while True:
                        try:
                            os.read(self.wake_r, 4096)
                        except BlockingIOError:
                            break
                    self.reap()
                elif fd == self.socket.fileno() and not self.request():
                    self.end()

    def request(self) -> bool:
        """Serve one request; False once the socket has ended."""
        message, ancillary, flags, _ = self.socket.recvmsg(
            MESSAGE_LIMIT, socket.CMSG_SPACE((DESCRIPTORS + 2) * 4), socket.MSG_CMSG_CLOEXEC
        )
        fds: list[int] = []
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(data) - len(data) % 4
                fds += memoryview(data)[:usable].cast("i").tolist()
        if not message:
            return False
        if message == b"m" and len(fds) in (DESCRIPTORS + 1, DESCRIPTORS + 2):
            memory = fds.pop()
            size = os.fstat(memory).st_size
            message = os.pread(memory, size, 0) if size <= MAX_REQUEST else b"too large"
            os.close(memory)
            if message == b"too large":
                _tell(fds[2], b"x0 the request is larger than %d bytes\n" % MAX_REQUEST)
        fields = message.split(b"\0")
        whole = not flags & socket.MSG_TRUNC
        if fields[0] == b"r" and len(fds) in (DESCRIPTORS, DESCRIPTORS + 1) and whole:
            self.run(fields[1:], *fds)
            return True
        if fields[0] == b"k":
            self.kill(int(fields[1]))
        for fd in fds:
            os.close(fd)
        return True

    def run(
        self, request: list[bytes], stdout: int, stderr: int, status: int, stdin: int = -1
    ) -> None:
        cwd, argc = request[0], int(request[1])
        argv, env = request[2 : 2 + argc], request[2 + argc :]
        try:
            if cwd != self.cwd:  # posix_spawn has no chdir of its own: the child inherits this
                os.chdir(cwd)
                self.cwd = cwd
            pid = os.posix_spawn(
                argv[0],
                argv,
                dict(item.split(b"=", 1) for item in env),
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, self.devnull if stdin < 0 else stdin, 0),
                    (os.POSIX_SPAWN_DUP2, stdout, 1),
                    (os.POSIX_SPAWN_DUP2, stderr, 2),
                ],
                setpgroup=0,
                setsigmask=(),
                setsigdef=DEFAULT_SIGNALS,
            )
        except (OSError, ValueError) as exc:
            number = (exc.errno or 0) if isinstance(exc, OSError) else 0
            text = str(exc).encode(errors="replace").replace(b"\n", b" ")
            _tell(status, b"x%d %s\n" % (number, text))
            os.close(status)
        else:
            self.children[pid] = status
            if _tell(status, b"p%d\n" % pid):
                self.listening[status] = pid
                self.poller.register(status, 0)
            else:
                self.kill(pid)  # the case gave up waiting for it
        finally:
            for fd in (stdout, stderr, stdin):
                if fd >= 0:
                    os.close(fd)

    def kill(self, pid: int) -> None:
        if pid in self.children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass

    def reap(self) -> None:
        while True:
            try:
                # Seen, not yet reaped: while it is a zombie its group id cannot be reused.
                found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if found is None:
                return
            self.kill(found.si_pid)  # what it left in its group
            _, wait_status = os.waitpid(found.si_pid, 0)
            status = self.children.pop(found.si_pid, None)
            if status is not None:
                if self.listening.pop(status, None) is not None:
                    self.poller.unregister(status)
                _tell(status, b"e%d\n" % os.waitstatus_to_exitcode(wait_status))
                os.close(status)


def guard(worker: int) -> int:
    """Fork the spawner; in the guard (this process), wait for it and exit as it did. Returns
    the guard's pid, in the spawner only."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != worker:  # the worker died before the request took effect
        os._exit(0)
    me = os.getpid()
    spawner = os.fork()
    if spawner == 0:
        return me
    # Its copy of the socket closed: the spawner's end is the worker's only peer.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    _, wait_status = os.waitpid(spawner, 0)
    code = os.waitstatus_to_exitcode(wait_status)
    if code < 0:  # killed by a signal: the guard's status says the same
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # neither can be given an action
            signal.signal(-code, signal.SIG_DFL)
        os.kill(me, -code)
        code = 128 - code  # a signal whose default is not to end a process, as a shell says
    os._exit(code)


if __name__ == "__main__":
    Spawner(guard(int(sys.argv[1]))).serve()
