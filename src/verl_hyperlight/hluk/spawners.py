"""This process's spawners (``spawner.py``), as the worker sees them: up to SPAWNERS, taking
cases in turn, each asked to start a hluk with posix_spawn and to say when it has exited. A
process with few hluks running at once uses one (see `in_use`): a Ray worker, which runs one
case at a time, keeps one spawner, not SPAWNERS.

A spawner that dies is started again by the next case: one whose death a case saw (its hluk
run lost, its socket ended) is handed out no more from that moment (`_Spawner.retire`), not
from when the thread that owns it learns of it. One that cannot start (a passing EAGAIN
of pids.max, ENOMEM, a slow start, no descriptor free, or no usable Python at sys.executable)
leaves the process on the next way of starting hluk (``spawn``), said once, and is tried again
in the background after a back-off, its recovery said once too (``_Starts``).
"""

from __future__ import annotations

import array
import enum
import errno
import itertools
import logging
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from .. import diagnosis, node, settings
from ..errors import CauseCounts, worth_logging
from .pipes import carry_lines, close
from .spawner import MESSAGE_LIMIT

logger = logging.getLogger("verl_hyperlight")

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
SPAWNER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spawner.py")


class SpawnerGone(Exception):
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
        self._counted = True  # among _running
        self._pending = b""
        _running.change(1)

    def exited(self) -> bool:
        self._read()
        return self._ended

    def close_stdin(self) -> None:
        with self._lock:
            if self.stdin is not None and not self._stopped:
                os.close(self.stdin)
                self.stdin = None

    def answered(self) -> None:
        with self._lock:
            if self._counted:
                self._counted = False
                _running.change(-1)

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
            self.spawner.retire()
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
            if self._counted:
                self._counted = False
                _running.change(-1)
            self._read()
            if self.pid and not self._ended:
                # Waited for: a hluk is stopped once its case is over (or, its report whole,
                # off its case's path by hluk/ending.py), and a stop that returned first would
                # let a worker hold micro-VMs for as long as the spawner takes to reap them.
                self.spawner.send(b"k\0%d" % self.pid)
                if not self._await_status(SPAWNER_STOP_SECONDS):
                    self._kill_unanswered()
            # A hluk it has not started yet (its case gave up waiting), the spawner kills (and
            # reaps) once this end of the status pipe is closed: no message, no waiting here.
            close((self.stdout, self.stderr, self.exit_fd, self.stdin))
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
        spawner = self.spawner.pid
        if spawner and _parent_of(self.pid) == spawner:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
        if worth_logging(_unanswered.count("spawner-unanswered")):
            logger.warning(
                "verl-hyperlight: %s", diagnosis.spawner_unanswered(spawner, SPAWNER_STOP_SECONDS)
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
    """This process's spawner (spawner.py), whose guard (`process`, the child this process
    started) is started by a thread that lives as long as it, since the parent-death signal
    follows the thread that forked, not the process. `pid` is the spawner's own, the parent of
    its hluk processes."""

    def __init__(self) -> None:
        self.socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process: subprocess.Popen[bytes] | None = None
        self.pid = 0
        self.alive = True
        self.retired = False  # see retire
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
            word, _, pid = self.socket.recv(32).partition(b" ") if ready else (b"", b"", b"")
            if word == b"ready" and pid.isdigit():
                self.pid = int(pid)
            else:
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
            pid = self.pid or self.process.pid
            logger.error("verl-hyperlight: %s", diagnosis.spawner_died(pid, status))

    def retire(self) -> None:
        """Hand this spawner out no more: a run it took was lost without a word, or its socket
        has ended. That is its death, seen by a case before the thread that owns it sees its
        guard exit: meanwhile its socket may still take a request (the kernel is closing the
        dead spawner's descriptors one by one), which would be lost too, a retry's included.
        Its socket is shut as well, so that a spawner alive after all (a request it dropped)
        ends, with the hluk it started, rather than idle on unused."""
        self.retired = True
        try:
            self.socket.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # its peer has gone

    def spawn(self, argv: list[str], cwd: str | None, env: dict[str, str], stdin: bool) -> _Spawned:
        """Ask for hluk to be started (with a pipe to its stdin if `stdin`); its pid (or why it
        could not start) comes through the status pipe. SpawnerGone if the spawner has died."""
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
                    carry_lines(ours)
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
            close(kept)
            if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                self.retire()
                raise SpawnerGone from None
            raise
        finally:
            close(sent)
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
# One more spawner takes turns for each this many hluks running at once in the process (ready
# guests included): one spawner starts hluk far faster than a few cases of milliseconds end.
RUNNING_PER_SPAWNER = 8
_lock = threading.Lock()
_spawners: dict[int, _Spawner] = {}  # by slot, 0 to SPAWNERS - 1
_turn = itertools.count()


class _Running:
    """How many hluks this process's spawners started that are not stopped yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def change(self, by: int) -> None:
        with self._lock:
            self.count += by


_running = _Running()


def in_use() -> int:
    """How many spawners take turns now: one, and one more for each RUNNING_PER_SPAWNER hluks
    running at once, up to SPAWNERS. Those beyond it, once started, wait unused."""
    return min(SPAWNERS, 1 + max(0, _running.count) // RUNNING_PER_SPAWNER)


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

    def failed(self, exc: BaseException, now: float, fallback: Callable[[], str]) -> None:
        self.failure = str(exc) or type(exc).__name__
        self.failed_tries += 1
        self.failed_at = now
        if self.state is _StartState.STARTING:
            logger.warning(
                "verl-hyperlight: cannot start the spawner of hluk processes (%s): hluk is "
                "started %s instead, while the spawner is tried again in the background (in "
                "%.0f s, then less often, up to every %.0f s)",
                self.failure,
                fallback(),
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
    global _spawners, _lock, _starts, _running
    _spawners, _lock, _starts, _running = {}, threading.Lock(), _Starts(), _Running()


os.register_at_fork(after_in_child=_forget_in_child)


def current(fallback: Callable[[], str]) -> _Spawner | None:
    """The spawner whose turn it is, started if there is none (or it died); None while none
    can start (see _Starts; `fallback` says how hluk is started meanwhile)."""
    slot = next(_turn) % in_use()
    spawner = _spawners.get(slot)
    if spawner is not None and spawner.alive and not spawner.retired:
        return spawner
    with _lock:
        spawner = _spawners.get(slot)
        if spawner is not None and spawner.alive and not spawner.retired:
            return spawner
        if _starts.state is _StartState.STARTING:
            try:
                spawner = _spawners[slot] = _Spawner()
            except (OSError, ValueError) as exc:
                _starts.failed(exc, time.monotonic(), fallback)
                return None
            return spawner
        if _starts.retry_due(time.monotonic()):
            retry = threading.Thread(
                target=_retry,
                args=(slot, fallback),
                name="verl-hyperlight-spawner-retry",
                daemon=True,
            )
            try:
                retry.start()
            except RuntimeError as exc:  # no thread can start now: a later case tries again
                _starts.failed(exc, time.monotonic(), fallback)
        return None


def _retry(slot: int, fallback: Callable[[], str]) -> None:
    """Start the spawner of `slot` again, in a thread of its own: no case waits for it."""
    try:
        spawner = _Spawner()
    except (OSError, ValueError) as exc:
        with _lock:
            _starts.failed(exc, time.monotonic(), fallback)
        return
    with _lock:
        _spawners[slot] = spawner
        _starts.started()


def start_failure() -> tuple[str, int]:
    """Why spawners cannot start now ("" while they can), and the starts failed so far."""
    return _starts.failure, _starts.failed_tries
