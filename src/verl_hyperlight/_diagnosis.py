"""Backend failures diagnosed: what a run that did not end by the solution's doing stands
for, and what an operator can do about it. The one place that names, in a failure's message,
the settings and commands of verl and of this package that fix it.
"""

from __future__ import annotations

import os
import signal

from . import _spawn as _spawn_module
from ._errors import BackendError
from ._outcome import Ending, RawOutcome

INSTALL_COMMAND = (
    "curl -fsSL https://raw.githubusercontent.com/hyperlight-dev/hyperlight-unikraft/main/"
    "install.sh | sh"
)
INSTALL_HINT = f"install it ({INSTALL_COMMAND}) or set HLUK_PATH"


def cannot_start(path: str, why: str) -> BackendError:
    """Why hluk could not start, looked into only when it could not."""
    if not os.path.exists(path):
        return BackendError(f"hluk was not found at {path}: {INSTALL_HINT}", "hluk-missing")
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        return BackendError(
            f"hluk at {path} is not executable: chmod +x it, or point HLUK_PATH at hluk itself",
            "hluk-not-executable",
        )
    return BackendError(f"hluk at {path} could not start: {why}", "hluk-broken")


def failure(outcome: RawOutcome, path: str) -> BackendError:
    """The backend failure a run that did not end by the solution's doing stands for."""
    where = "while the solution ran" if outcome.started else "before the solution started"
    if outcome.ending is Ending.STARTUP_TIMEOUT:
        return BackendError(
            f"the micro-VM did not start within {outcome.limit:.0f} s "
            "(VERL_HYPERLIGHT_STARTUP_TIMEOUT); the node may be overloaded: lower "
            "max_concurrent or reward.num_workers",
            "startup-timeout",
            persistent=False,
        )
    if outcome.ending is Ending.SPAWNER_DIED:
        return BackendError(
            f"the spawner of hluk processes died {where}, and its hluk with it: check `dmesg` "
            "for the OOM killer or for who killed it (the next case starts another spawner; "
            f"{_spawn_module.SPAWN_ENV}=setpriv starts hluk without one)",
            "spawner-died",
            persistent=False,
        )
    if outcome.ending is Ending.KILLED:
        assert outcome.hluk_status is not None
        number = -outcome.hluk_status
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return BackendError(
            f"hluk at {path} was killed by {name} ({number}) {where}: a SIGBUS or SIGSEGV "
            "often means a truncated or corrupt warm snapshot (run `hluk cache clean "
            "--snapshots`, then `verl-hyperlight warm-up`); a SIGKILL, the kernel's OOM killer "
            "(check `dmesg`; lower max_concurrent or memory_limit_mb)",
            f"killed-{name}",
            persistent=False,
        )
    if outcome.ending is Ending.COPY_OUT_TIMEOUT:
        assert outcome.end is not None
        return BackendError(
            f"the micro-VM did not copy the solution's output ({outcome.end.copied} bytes) "
            f"out within {outcome.limit:.0f} s after it ended; the node may be overloaded: "
            "lower max_concurrent or reward.num_workers",
            "copy-out-timeout",
            persistent=False,
        )
    # hluk's own message decides; before the start, what its driver printed may say more.
    message = outcome.hluk_error
    if not message and not outcome.started:
        message = outcome.preamble.decode(errors="replace")
    return classify(message, outcome.hluk_status, path, persistent=not outcome.started)


def classify(message: str, status: int | None, path: str, persistent: bool) -> BackendError:
    """The backend failure hluk's message describes, with what an operator can do about it."""
    message = message.strip()
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
        persistent=persistent,
    )
