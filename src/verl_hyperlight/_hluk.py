"""How to run it: one hluk process, owned for its whole life.

hluk runs in a process group of its own that is killed whole on a timeout, and it gets
SIGKILL when the thread that started it dies, so a reward worker that is killed takes its
micro-VMs with it. Its console (the guest's merged stdout and stderr) is read as it arrives,
bounded, and parsed for the runner's frames; its stderr carries hluk's own messages.
"""

from __future__ import annotations

import base64
import ctypes
import os
import re
import selectors
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

from ._errors import BackendError
from .guest import runner

MINIMUM_VERSION = (0, 19, 0)
INSTALL_HINT = "install it (curl -fsSL <hyperlight-unikraft>/install.sh | sh) or set HLUK_PATH"
# The console carries both streams base64-encoded, with framing; beyond this the guest is
# misbehaving and is stopped.
CONSOLE_LIMIT = 2 * (runner.OUTPUT_LIMIT * 4 // 3) + (1 << 20)
HLUK_STDERR_LIMIT = 64 * 1024
# After the runner's exit frame hluk only has to tear the VM down.
EXIT_GRACE_SECONDS = 10.0
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class RawOutcome:
    """What one hluk run produced, before it is shaped into a response."""

    started: bool  # the runner reported that the solution started
    timed_out: bool  # the solution ran past run_timeout and was killed
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


def check_version(path: str) -> str:
    """Run `hluk --version` and refuse a hluk older than 0.19.0; returns the version."""
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        raise BackendError(
            f"hluk was not found at {path}: {INSTALL_HINT}", "hluk-missing"
        ) from None
    except PermissionError:
        raise BackendError(
            f"hluk at {path} is not executable: chmod +x it, or point HLUK_PATH at hluk itself",
            "hluk-not-executable",
        ) from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(
            f"hluk at {path} did not answer --version: {exc}", "hluk-broken"
        ) from None
    text = done.stdout.decode(errors="replace").strip()
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if done.returncode != 0 or match is None:
        detail = (done.stderr.decode(errors="replace") or text).strip()[:500]
        raise BackendError(f"hluk at {path} failed on --version: {detail}", "hluk-broken")
    version = tuple(int(part) for part in match.groups())
    if version < MINIMUM_VERSION:
        raise BackendError(
            f"hluk at {path} is version {match.group(0)}; verl-hyperlight needs 0.19.0 or later: "
            "upgrade it by running its installer again",
            "hluk-too-old",
        )
    return match.group(0)


def die_with_parent() -> None:
    """In the child before exec: a group of its own, and SIGKILL when its parent dies."""
    os.setpgid(0, 0)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


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
        """The streams, the exit frame's fields and the text that was not a frame."""
        streams = {"stdout": bytearray(), "stderr": bytearray()}
        exit_fields: list[bytes] = []
        noise = bytearray()
        prefix = self.nonce + b" "
        for line in bytes(self.data).split(b"\n"):
            line = line.removesuffix(b"\r")
            if not line.startswith(prefix):
                if line:
                    noise += line + b"\n"
                continue
            fields = line[len(prefix) :].split(b" ")
            kind = fields[0].decode("ascii", "replace")
            if kind in streams and len(fields) == 2:
                streams[kind] += base64.b64decode(fields[1])
            elif kind == "exit":
                exit_fields = fields[1:]
        return streams, exit_fields, bytes(noise)


def run(argv: list[str], nonce: str, run_timeout: float, startup_timeout: float) -> RawOutcome:
    """Run hluk with `argv` until the runner reports the case done, the solution exceeds
    `run_timeout` (counted from its start in the guest), or nothing starts within
    `startup_timeout`."""
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - nothing else sets PDEATHSIG
        )
    except FileNotFoundError:
        raise BackendError(
            f"hluk was not found at {argv[0]}: {INSTALL_HINT}", "hluk-missing"
        ) from None
    except PermissionError:
        raise BackendError(
            f"hluk at {argv[0]} is not executable: chmod +x it, or point HLUK_PATH at hluk itself",
            "hluk-not-executable",
        ) from None
    spawned = time.monotonic()
    console = _Console(nonce)
    stderr = bytearray()
    timed_out = False
    started_at: float | None = None
    deadline = spawned + startup_timeout
    assert proc.stdout is not None and proc.stderr is not None
    with proc, selectors.DefaultSelector() as selector:
        try:
            selector.register(proc.stdout, selectors.EVENT_READ)
            selector.register(proc.stderr, selectors.EVENT_READ)
            while selector.get_map():
                now = time.monotonic()
                if now >= deadline:
                    timed_out = console.started and not console.exited
                    break
                for key, _ in selector.select(deadline - now):
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
                if len(console.data) > CONSOLE_LIMIT:
                    break
        finally:
            # Whatever ended the loop, nothing of this group outlives the call.
            _kill_group(proc)
            proc.wait()
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
    if status is None and len(console.data) > CONSOLE_LIMIT:
        limit_hit = "console"
    return RawOutcome(
        started=console.started,
        timed_out=timed_out,
        status=status,
        elapsed=elapsed,
        stdout=bytes(streams["stdout"]),
        stderr=bytes(streams["stderr"]),
        limit_hit=limit_hit,
        hluk_status=proc.returncode if not timed_out else None,
        hluk_stderr=stderr.decode(errors="replace"),
        console=noise[-4096:],
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
    return BackendError(
        f"hluk at {path} failed (status {status}): {message[:500] or 'no message'}",
        "hluk-failed",
    )
