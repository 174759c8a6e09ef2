"""How to run it: one hluk process, owned for its whole life.

hluk runs in a process group of its own that is killed whole on a timeout, and it gets
SIGKILL when the thread that started it dies, so a reward worker that is killed takes its
micro-VMs with it. Its console (the guest's merged stdout and stderr) is read as it arrives,
bounded, and parsed for the runner's frames; its stderr carries hluk's own messages.
"""

from __future__ import annotations

import base64
import ctypes
import enum
import functools
import math
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._errors import BackendError
from .guest import runner

MINIMUM_VERSION = (0, 19, 0)
INSTALL_HINT = "install it (curl -fsSL <hyperlight-unikraft>/install.sh | sh) or set HLUK_PATH"
# The console carries both streams base64-encoded, with framing; beyond this the guest is
# misbehaving and is stopped.
CONSOLE_LIMIT = 2 * (runner.OUTPUT_LIMIT * 4 // 3) + (1 << 20)
HLUK_STDERR_LIMIT = 64 * 1024
# Of the console text that is not a frame (driver tracebacks, hluk notes), the end is kept for
# failure messages.
NOISE_LIMIT = 4096
# After the runner's exit frame hluk only has to tear the VM down.
EXIT_GRACE_SECONDS = 10.0
# Once hluk has exited, what is left in its pipes is read for this long; a descendant that
# kept them open (a wrapper that did not exec) is not waited for.
DRAIN_SECONDS = 1.0
# Without pidfds (Linux < 5.3), how often hluk's exit is polled.
EXIT_POLL_SECONDS = 0.2
PR_SET_PDEATHSIG = 1
VERSION_TIMEOUT_SECONDS = 30.0

_libc = ctypes.CDLL(None, use_errno=True)


class Ending(enum.Enum):
    """How a hluk run ended, decided once from what it printed."""

    NOT_STARTED = "not-started"  # no start frame: nothing of the solution ran
    FINISHED = "finished"  # the runner's exit frame: the solution's own ending
    TIMED_OUT = "timed-out"  # the solution ran past run_timeout and was killed
    DEADLOCKED = "deadlocked"  # hluk found every guest thread blocked forever
    GUEST_DIED = "guest-died"  # the guest process ended outside the runner (e.g. OOM-killed)
    CONSOLE_LIMIT = "console-limit"  # the console passed CONSOLE_LIMIT and the run was stopped
    HLUK_FAILED = "hluk-failed"  # hluk itself failed after the solution started


@dataclass(frozen=True)
class RawOutcome:
    """What one hluk run produced, before it is shaped into a response."""

    ending: Ending
    status: int | None  # the solution's exit status, from the runner's exit frame
    elapsed: float | None  # the solution's wall time, as measured in the guest
    stdout: bytes
    stderr: bytes
    limit_hit: str | None  # the stream that exceeded the output limit, if one did
    hluk_status: int | None
    hluk_stderr: str
    console: bytes  # console text that was not a frame (driver tracebacks, hluk notes)
    host_elapsed: float  # wall time since the start frame, or since spawn if none came


def hluk_path() -> str:
    """The hluk to run: HLUK_PATH, else the one on PATH."""
    chosen = os.environ.get("HLUK_PATH")
    if chosen:
        return chosen
    found = shutil.which("hluk")
    if found is None:
        raise BackendError(f"hluk was not found on PATH: {INSTALL_HINT}", "hluk-missing")
    return found


def run_to_exit(argv: list[str], timeout: float) -> RawOutcome | None:
    """Run hluk for something other than a case (--version, a warm-up): until it exits, or
    None if it has not within `timeout`. Its console is in ``console`` (the last 4 KiB)."""
    # A nonce no output contains: the run is never "started", so `timeout` bounds all of it.
    outcome = run(argv, secrets.token_hex(16), math.inf, timeout)
    if outcome.hluk_status is None or outcome.hluk_status < 0:
        return None
    return outcome


def check_version(path: str) -> str:
    """Run `hluk --version` and refuse a hluk older than 0.19.0; returns the version."""
    done = run_to_exit([path, "--version"], VERSION_TIMEOUT_SECONDS)
    if done is None:
        raise BackendError(
            f"hluk at {path} did not answer --version within {VERSION_TIMEOUT_SECONDS:.0f} s",
            "hluk-broken",
        )
    text = done.console.decode(errors="replace").strip()
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if done.hluk_status != 0 or match is None:
        detail = (done.hluk_stderr or text).strip()[:500]
        raise BackendError(f"hluk at {path} failed on --version: {detail}", "hluk-broken")
    version = tuple(int(part) for part in match.groups())
    if version < MINIMUM_VERSION:
        raise BackendError(
            f"hluk at {path} is version {match.group(0)}; verl-hyperlight needs 0.19.0 or later: "
            "upgrade it by running its installer again",
            "hluk-too-old",
        )
    return match.group(0)


def _die_with_parent(parent: int) -> Callable[[], None]:
    """For preexec_fn: in the child, a process group of its own, and SIGKILL when `parent`
    (the spawning process) dies, also if it died before the request took effect."""

    def in_child() -> None:
        os.setpgid(0, 0)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return in_child


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits, where the kernel has them."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class _Console:
    """The frames in hluk's stdout, found as they arrive."""

    def __init__(self, nonce: str) -> None:
        self.data = bytearray()
        self.start_mark = f"{nonce} start".encode()
        self.exit_mark = f"{nonce} exit ".encode()
        self.nonce = nonce.encode()
        self.started = False
        self.exited = False
        self._scanned = 0

    def feed(self, chunk: bytes) -> None:
        self.data += chunk
        # Frames are whole lines; only look at what has not been looked at, with overlap.
        begin = max(0, self._scanned - len(self.exit_mark))
        if not self.started and self.data.find(self.start_mark, begin) >= 0:
            self.started = True
        if self.started and self.data.find(self.exit_mark, begin) >= 0:
            self.exited = True
        self._scanned = len(self.data)

    def parse(self) -> tuple[dict[str, bytearray], list[bytes], bytes]:
        """The streams, the exit frame's fields and the last NOISE_LIMIT bytes of the text that
        was not a frame."""
        # The runner starts every frame on a line of its own, so frames are found by searching
        # for a newline and the nonce: a guest that floods the console with empty lines then
        # costs one pass over the buffer, not a Python object per line (seconds and hundreds
        # of MiB per case when the console was split into lines).
        streams = {"stdout": bytearray(), "stderr": bytearray()}
        exit_fields: list[bytes] = []
        noise = bytearray()
        data = self.data
        marker = b"\n" + self.nonce + b" "
        position = 0
        while position < len(data):
            found = data.find(marker, position)
            text_end = len(data) if found < 0 else found
            noise += data[max(position, text_end - NOISE_LIMIT) : text_end]
            del noise[:-NOISE_LIMIT]
            if found < 0:
                break
            line_end = data.find(b"\n", found + len(marker))
            if line_end < 0:
                line_end = len(data)
            fields = bytes(data[found + len(marker) : line_end]).removesuffix(b"\r").split(b" ")
            position = line_end
            kind = fields[0].decode("ascii", "replace")
            if kind in streams and len(fields) == 2:
                try:
                    streams[kind] += base64.b64decode(fields[1], validate=True)
                except ValueError:
                    continue  # not the runner's: a solution that forged a frame gets nothing
            elif kind == "exit":
                exit_fields = fields[1:]
        return streams, exit_fields, bytes(noise).replace(b"\r\n", b"\n")


@functools.lru_cache(maxsize=1)
def _setpriv() -> str | None:
    """util-linux's setpriv, if it can set the parent-death signal (2.33 and later)."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    try:
        done = subprocess.run([path, "--help"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if b"--pdeathsig" in done.stdout else None


def _spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    """Start hluk in a process group of its own, to get SIGKILL when this process dies.

    Through setpriv where there is one: Python then spawns with vfork, whose cost does not
    grow with the reward worker's memory. A preexec_fn forces fork(), which copies the page
    tables of the whole worker with the GIL held (about 100 ms per case for 2 GiB here).
    """
    path = argv[0]
    if not os.path.exists(path):
        raise BackendError(f"hluk was not found at {path}: {INSTALL_HINT}", "hluk-missing")
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise BackendError(
            f"hluk at {path} is not executable: chmod +x it, or point HLUK_PATH at hluk itself",
            "hluk-not-executable",
        )
    setpriv = _setpriv()
    pipes: dict[str, Any] = {
        "stdin": subprocess.DEVNULL,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
        "close_fds": True,
    }
    try:
        if setpriv is not None:
            command = [setpriv, "--pdeathsig", "KILL", "--", *argv]
            return subprocess.Popen(command, start_new_session=True, **pipes)
        return subprocess.Popen(
            argv,
            preexec_fn=_die_with_parent(os.getpid()),  # noqa: PLW1509 - no setpriv: no other way
            **pipes,
        )
    except OSError as exc:
        raise BackendError(f"hluk at {path} could not start: {exc}", "hluk-broken") from None


def run(argv: list[str], nonce: str, run_timeout: float, startup_timeout: float) -> RawOutcome:
    """Run hluk with `argv` until the runner reports the case done, the solution exceeds
    `run_timeout` (counted from its start in the guest), or nothing starts within
    `startup_timeout`."""
    proc = _spawn(argv)
    spawned = time.monotonic()
    console = _Console(nonce)
    stderr = bytearray()
    timed_out = False
    hluk_exited = False
    started_at: float | None = None
    deadline = spawned + startup_timeout
    assert proc.stdout is not None and proc.stderr is not None
    with proc, selectors.DefaultSelector() as selector:
        exit_fd = _pidfd(proc.pid)
        try:
            selector.register(proc.stdout, selectors.EVENT_READ)
            selector.register(proc.stderr, selectors.EVENT_READ)
            if exit_fd is not None:
                selector.register(exit_fd, selectors.EVENT_READ)
            while len(selector.get_map()) > (0 if hluk_exited or exit_fd is None else 1):
                now = time.monotonic()
                if now >= deadline:
                    timed_out = console.started and not console.exited and not hluk_exited
                    break
                wait = (
                    deadline - now
                    if exit_fd is not None
                    else min(deadline - now, EXIT_POLL_SECONDS)
                )
                for key, _ in selector.select(wait):
                    if key.fileobj == exit_fd:
                        selector.unregister(exit_fd)
                        hluk_exited = True
                        continue
                    chunk = os.read(key.fd, 1 << 20)
                    if not chunk:
                        selector.unregister(key.fileobj)
                    elif key.fileobj is proc.stdout:
                        console.feed(chunk)
                    elif len(stderr) < HLUK_STDERR_LIMIT:
                        stderr += chunk[: HLUK_STDERR_LIMIT - len(stderr)]
                if started_at is None and console.started:
                    started_at = time.monotonic()
                    deadline = started_at + run_timeout
                if console.exited:
                    deadline = min(deadline, time.monotonic() + EXIT_GRACE_SECONDS)
                if exit_fd is None and not hluk_exited and proc.poll() is not None:
                    hluk_exited = True
                if hluk_exited:
                    deadline = min(deadline, time.monotonic() + DRAIN_SECONDS)
                if len(console.data) > CONSOLE_LIMIT:
                    break
        finally:
            # Whatever ended the loop, nothing of this group outlives the call.
            _kill_group(proc)
            proc.wait()
            if exit_fd is not None:
                os.close(exit_fd)
    host_elapsed = time.monotonic() - (started_at if started_at is not None else spawned)
    streams, exit_fields, noise = console.parse()
    status: int | None = None
    elapsed: float | None = None
    limit_hit: str | None = None
    try:
        status, elapsed = int(exit_fields[0]), float(exit_fields[1])
        limit_hit = None if exit_fields[2] == b"-" else exit_fields[2].decode()
    except (IndexError, ValueError):
        status = elapsed = None  # no exit frame: the guest died or never finished
    hluk_stderr = stderr.decode(errors="replace")
    if not console.started:
        ending = Ending.NOT_STARTED
    elif status is not None:
        ending = Ending.FINISHED
    elif timed_out:
        ending = Ending.TIMED_OUT
    elif len(console.data) > CONSOLE_LIMIT:
        ending = Ending.CONSOLE_LIMIT
    elif "error: the guest exited with status" in hluk_stderr:
        ending = Ending.GUEST_DIED
    elif "deadlocked" in hluk_stderr:
        ending = Ending.DEADLOCKED
    else:
        ending = Ending.HLUK_FAILED
    return RawOutcome(
        ending=ending,
        status=status,
        elapsed=elapsed,
        stdout=bytes(streams["stdout"]),
        stderr=bytes(streams["stderr"]),
        limit_hit=limit_hit,
        hluk_status=proc.returncode if not timed_out else None,
        hluk_stderr=hluk_stderr,
        console=noise,
        host_elapsed=host_elapsed,
    )


def failure_from(outcome: RawOutcome, path: str) -> BackendError:
    """The backend failure an unsuccessful case run stands for."""
    console = outcome.console.decode(errors="replace")
    return classify(outcome.hluk_stderr, outcome.hluk_status, path, console)


def classify(stderr: str, status: int | None, path: str, console: str = "") -> BackendError:
    """The backend failure hluk's messages describe, with what an operator can do about it."""
    message = stderr.strip() or console.strip()
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
    )
