"""Helpers for the tests of run_code's host side: a stand-in hluk of the test's own, and the
counts that show what run_code left behind on the host.

conftest.py imports the ``host`` fixture from here.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from verl_hyperlight import deadlines as _deadlines
from verl_hyperlight import settings as _settings
from verl_hyperlight.case import api as _api
from verl_hyperlight.case import builds as _builds
from verl_hyperlight.case import casedir as _casedir
from verl_hyperlight.case import compiled as _compiled
from verl_hyperlight.case import failures as _failures
from verl_hyperlight.case import gate as _gate
from verl_hyperlight.errors import CauseCounts
from verl_hyperlight.guest.protocol import OUTPUT_LIMIT, OUTPUT_LIMIT_STATUS
from verl_hyperlight.hluk import console as _console
from verl_hyperlight.hluk import ending as _ending
from verl_hyperlight.hluk import spawners as _spawners

URL = "hyperlight://"


def typescript_missing() -> str | None:
    """Why this node cannot transpile TypeScript (None: it can). CI installs it; a
    developer's node may not have it."""
    try:
        _compiled.check("typescript")
    except Exception as exc:
        return f"TypeScript is missing here ({exc}); .ci/run installs it"
    return None


@dataclass(frozen=True)
class Host:
    """The stand-in as one test sees it: a cold cache of its own, the argv of every hluk run,
    and the directories run_code makes its case directories in: the tmpfs it prefers (a
    directory of the test's own standing for /dev/shm) and the temporary directory."""

    cache: Path
    argv_log: Path
    tmpdir: Path
    tmpfs: Path

    def runs(self) -> list[list[str]]:
        """The argv of every hluk run so far, --version included."""
        return logged_argvs(self.argv_log)

    def warm_ups(self) -> list[list[str]]:
        """The warm-up runs: those whose workload is the warm-up's probe."""
        return [argv for argv in self.runs() if ".probe(" in (option(argv, "--exec") or "")]

    def case_runs(self) -> list[list[str]]:
        """The case runs: those that mount a case directory."""
        return [argv for argv in self.runs() if "--mount" in argv]

    def case_dirs(self) -> list[Path]:
        """The case directories in the tmpfs and in the temporary directory."""
        return sorted(
            [*self.tmpfs.glob("verl-hyperlight-*"), *self.tmpdir.glob("verl-hyperlight-*")]
        )


def logged_argvs(log: Path) -> list[list[str]]:
    """The argv of each hluk run the stand-in has logged to `log` so far: whole lines only (a
    hluk starting now may be halfway through appending its line as this reads)."""
    if not log.exists():
        return []
    text = log.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def option(argv: list[str], name: str) -> str | None:
    """The value of `name` in a hluk argv, or None."""
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.fixture
def host(hluk: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Host]:
    """run_code pointed at the stand-in with a cold cache, no boot or pull delay, an argv log,
    case directories under the test's own tmpfs and temporary directories, and no memory of
    guests prepared or failures logged by earlier tests."""
    # The tmpfs stands inside the temporary directory, so that the temporary directory's path
    # is in the argv of every hluk that mounts a case directory, wherever it was made.
    tmpdir = tmp_path / "tmp"
    found = Host(tmp_path / "cache", tmp_path / "argv.jsonl", tmpdir, tmpdir / "shm")
    found.tmpfs.mkdir(parents=True)
    monkeypatch.setenv("HLUK_CACHE_DIR", str(found.cache))
    monkeypatch.setenv("HLUK_STANDIN_ARGV_LOG", str(found.argv_log))
    monkeypatch.setenv("HLUK_STANDIN_BOOT_SECONDS", "0")
    monkeypatch.setenv("HLUK_STANDIN_PULL_SECONDS", "0")
    monkeypatch.delenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(found.tmpdir))
    monkeypatch.setattr(_casedir, "TMPFS", str(found.tmpfs))
    # That tmpfs is a directory on a disk whose use is not the test's: none of it kept free.
    monkeypatch.setattr(_casedir, "TMPFS_KEEP_FREE", 0.0)
    monkeypatch.delenv(_settings.CASE_DIR.name, raising=False)
    # Each case's own hluk, started when it arrives: these tests count the runs, processes and
    # descriptors of a case, which ready guests (started ahead, held on purpose) would blur.
    # tests/test_ready.py tests those, and the corpus runs with them on and off.
    monkeypatch.setenv(_settings.READY_GUESTS.name, "0")
    monkeypatch.setattr(_casedir, "_warnings", _casedir._Warnings())
    monkeypatch.setattr(_failures, "log", _failures.FailureLog())
    monkeypatch.setattr(_settings, "_unusable", CauseCounts())
    _gate.forget()
    _builds.forget()  # each test compiles its sources itself (tests/test_builds.py: the kept)
    yield found
    # A spawner started again in the background (spawners._retry) ends here, under the test's
    # patches: left running, it put the spawner it started into the next test's patched pool
    # (CI saw doctor find a spawner in a test where none could start).
    for thread in threading.enumerate():
        if thread.name == "verl-hyperlight-spawner-retry":
            thread.join(60)
    _gate.forget()


class GateClock:
    """The guests' gates' clock, stopped: it moves only when a test moves it, so that "within
    the back-off" does not depend on how fast the machine runs the test."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def monotonic(self) -> float:
        return self.now

    def skip(self, seconds: float) -> None:
        self.now += seconds

    def skip_back_off(self) -> None:
        """Past the longest back-off."""
        self.skip(_gate.BACK_OFF_MAX_SECONDS + 1)


@pytest.fixture
def gate_clock(monkeypatch: pytest.MonkeyPatch) -> GateClock:
    found = GateClock()
    monkeypatch.setattr(_gate, "time", found)
    return found


@pytest.fixture
def fail_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The stand-in's fault injection: write N to it and the next N runs fail before the guest
    starts (empty: none do)."""
    path = tmp_path / "fail"
    path.write_text("0")
    monkeypatch.setenv("HLUK_STANDIN_FAIL_FILE", str(path))
    return path


def fail_with(monkeypatch: pytest.MonkeyPatch, fail_file: Path, message: str, runs: int) -> None:
    """The next `runs` hluk runs fail with `message` (the fixture `fail_file` in place)."""
    fail_file.write_text(str(runs))
    monkeypatch.setenv("HLUK_STANDIN_FAIL_MESSAGE", message)


KVM_FAILURE = "failed to open /dev/kvm: Permission denied"


def run(
    code: object,
    stdin: object = "",
    run_timeout: object = 10,
    memory: object = None,
    url: object = URL,
    language: object = "python",
    *,
    files: dict[str, str | None] | None = None,
    fetch_files: list[str] | None = None,
    compile_timeout: float | None = None,
) -> dict[str, Any]:
    """run_code with these arguments (any types, as a caller may pass); the response, which
    must be one rather than a request error."""
    response, error = _api.run_code(
        url,  # type: ignore[arg-type]
        code,  # type: ignore[arg-type]
        stdin,  # type: ignore[arg-type]
        compile_timeout,
        run_timeout,  # type: ignore[arg-type]
        memory,  # type: ignore[arg-type]
        language,  # type: ignore[arg-type]
        files=files,
        fetch_files=fetch_files,
    )
    assert error is None and response is not None, error
    return response


def result(response: dict[str, Any]) -> tuple[str, str | None, int | None, str, str]:
    """(status, run status, return code, stdout, stderr) of a response."""
    run_result = response["run_result"] or {}
    return (
        response["status"],
        run_result.get("status"),
        run_result.get("return_code"),
        run_result.get("stdout", ""),
        run_result.get("stderr", ""),
    )


@dataclass(frozen=True)
class Expect:
    """A response that is a hostile solution's own outcome: its status, run status and return code,
    its stdout (None: not checked) and a text its stderr holds."""

    status: str
    run_status: str
    return_code: int | None
    stdout: str | None = None
    stderr_holds: str = ""


@dataclass(frozen=True)
class Attack:
    code: str
    expect: Expect
    run_timeout: float = 10
    memory: int | None = None


def assert_own_outcome(response: dict[str, object], expect: Expect) -> None:
    status, run_status, return_code, stdout, stderr = result(response)  # type: ignore[arg-type]
    assert (status, run_status) == (expect.status, expect.run_status), response
    if expect.return_code is not None:
        assert return_code == expect.return_code, response
    if expect.stdout is not None:
        assert stdout == expect.stdout, response
    assert expect.stderr_holds in stderr, response


def assert_only_its_own(
    host: Host,
    attack: Attack,
    run_attack: Callable[[str, float], dict[str, Any]],
    then: Callable[[], None],
) -> None:
    """Run `attack`'s code (PORT: a port the host listens on) once: its answer is its own
    outcome, nothing of the guest's reaches the host's socket, the next case (`then`) is
    answered as ever, and the worker keeps the descriptors, threads, children and case
    directories it had, nothing left running."""
    before = Usage.now(host)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0)
        code = attack.code.replace("PORT", str(server.getsockname()[1]))
        response = run_attack(code, attack.run_timeout)
        with pytest.raises(BlockingIOError):
            server.accept()
    assert_own_outcome(response, attack.expect)
    then()
    assert Usage.now(host).minus(before) == Usage(0, 0, 0, 0)
    assert left_running(str(host.tmpdir)) == []


def assert_stopped_for_its_stdout(response: dict[str, Any]) -> None:
    """A solution that wrote past the output limit on its stdout: stopped, as one past its
    file-size limit is, the limit's worth kept and the notice on its stderr."""
    result = response["run_result"]
    assert (response["status"], result["status"], result["return_code"]) == (
        "Failed",
        "Finished",
        OUTPUT_LIMIT_STATUS,
    ), response["status"]
    assert len(result["stdout"]) == OUTPUT_LIMIT
    notice = "verl-hyperlight: the solution's stdout exceeded 16 MiB; it was stopped"
    assert result["stderr"].strip() == notice


def stdouts_in_ready_guests_and_fresh_ones(
    run_case: Callable[[], dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """The stdout of a case run three times with ready guests, then twice without."""
    answers = [run_case()["run_result"]["stdout"] for _ in range(3)]
    monkeypatch.setenv(_settings.READY_GUESTS.name, "0")
    return answers + [run_case()["run_result"]["stdout"] for _ in range(2)]


def standin_run(
    runtime: str, code: str, standin_env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[bytes]:
    """One `hluk run` of the stand-in in `runtime`'s image: `code` as its --exec, `extra`
    arguments before it."""
    return subprocess.run(
        [standin_env["HLUK_PATH"], "run", "--runtime", runtime, *extra, "--exec", code],
        capture_output=True,
        env={**os.environ, **standin_env},
        timeout=120,
    )


def console_lines(done: subprocess.CompletedProcess[bytes]) -> list[str]:
    """The lines a stand-in run wrote to its console (hluk's stdout, \r\n line ends)."""
    return done.stdout.decode().replace("\r\n", "\n").splitlines()


def sandbox_error(response: dict[str, Any]) -> str:
    """The message of a SandboxError response (and that it is one)."""
    assert (response["status"], response["run_result"]) == ("SandboxError", None), response
    message: str = response["message"]
    return message


def need_unshare() -> None:
    """Fail unless namespaces of a test's own can be made: root and util-linux's unshare."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("these tests need root and util-linux's unshare (for namespaces of their own)")


def in_mount_namespace(commands: str, argv: list[str]) -> list[str]:
    """`argv` run in a mount namespace of its own once the shell `commands` (mounts) ran
    there: what they mount is gone with it."""
    need_unshare()
    script = commands + ' && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv]


# ---------------------------------------------------------------------------------------------
# what is left on the host


def processes_with(text: str, exclude: tuple[int, ...] = ()) -> list[int]:
    """Live processes whose command line contains `text` (zombies have none)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def left_running(text: str, limit: float = 10.0) -> list[str]:
    """The processes whose command line contains `text` still there after at most `limit`
    seconds, each as its /proc stat line (state and parent): none, once each case's hluk is
    reaped, but for a moment. The stand-in's guest sandbox (bwrap's inner process, a session of
    its own, as a guest is no process of the host's on hluk) is not in hluk's group: it ends
    by its parent-death signal once hluk's group is killed, which a loaded machine can take
    a moment to deliver and the sandbox to tear down."""
    wait_for(lambda: not processes_with(text), limit)
    found = []
    for pid in processes_with(text):
        try:
            found.append(Path(f"/proc/{pid}/stat").read_text()[:200])
        except OSError:
            continue
    return found


def parent_of(pid: int) -> int | None:
    """The parent of `pid`; None once it has ended."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def processes_running(text: str) -> dict[int, int]:
    """Live processes whose command line contains `text`, each with its parent, less those
    whose parent is one of them: a process's child between its fork and its exec bears its
    command line too (a shell about to run `sleep`, the stand-in starting its guest)."""
    found = set(processes_with(text))
    parents = {pid: parent_of(pid) for pid in found}
    return {pid: p for pid, p in parents.items() if p is not None and p not in found}


def children_of(pid: int) -> set[int]:
    """The processes whose parent is `pid`, zombies included."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        if parent_of(int(entry)) == pid:
            found.add(int(entry))
    return found


def descendants_of(pid: int) -> dict[int, bytes]:
    """Every process below `pid`, with its command line."""
    found: dict[int, bytes] = {}
    stack = [pid]
    while stack:
        for child in children_of(stack.pop()):
            try:
                with open(f"/proc/{child}/cmdline", "rb") as f:
                    found[child] = f.read()
            except OSError:
                continue
            stack.append(child)
    return found


def still_running(processes: dict[int, bytes]) -> dict[int, bytes]:
    """Those of `processes` that still run the same command line."""
    alive = {}
    for pid, cmdline in processes.items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() == cmdline and cmdline:
                    alive[pid] = cmdline
        except OSError:
            continue
    return alive


def notebooks(pid: int | None = None) -> dict[int, bytes]:
    """The stand-in hluk processes below `pid` (this process by default) that run a code
    tool's notebook (their --exec calls runner.notebook), not the bwrap and guest below them;
    only this test's, though other suites run notebooks on the machine at the same time."""
    return {
        child: cmdline
        for child, cmdline in descendants_of(os.getpid() if pid is None else pid).items()
        if b".notebook(" in cmdline and b"/standin/hluk\0" in cmdline
    }


def wait_for(condition: Callable[[], object], limit: float = 10.0) -> object:
    """Poll `condition` until it is true or `limit` seconds pass; its last value."""
    deadline = time.monotonic() + limit
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(0.05)


@dataclass(frozen=True)
class Usage:
    """What this process holds that a case could leak, beside its spawners: a pool of up to
    SPAWNERS kept for the next cases, which grows while many hluks run at once (each holds a
    child, the thread that owns it and its socket)."""

    descriptors: int
    threads: int
    children: int
    case_dirs: int

    @classmethod
    def now(cls, found: Host) -> Usage:
        """Once the hluks of answered cases have ended (hluk/ending.py: within their grace)."""
        assert _ending.wait(_deadlines.EXIT_GRACE_SECONDS + 10), "a hluk outlived its grace"
        pool = sum(1 for spawner in list(_spawners._spawners.values()) if spawner.alive)
        return cls(
            descriptors=len(os.listdir("/proc/self/fd")) - pool,
            threads=threading.active_count() - pool,
            children=len(children_of(os.getpid())) - pool,
            case_dirs=len(found.case_dirs()),
        )

    def minus(self, other: Usage) -> Usage:
        return Usage(
            self.descriptors - other.descriptors,
            self.threads - other.threads,
            self.children - other.children,
            self.case_dirs - other.case_dirs,
        )


class WaitingCase:
    """run_code of `code` in a thread of its own, with `cancel` (`options` as run_code takes
    them), at `url`; its thread's native id is known once it has begun, its response
    once it has ended, and how often that thread woke over a stretch is read from the kernel
    (its voluntary context switches)."""

    def __init__(
        self,
        code: str,
        cancel: threading.Event,
        run_timeout: float = 60,
        url: str = URL,
        **options: object,
    ) -> None:
        self.cancel = cancel
        self.run_timeout = run_timeout
        self.url = url
        self.native_id = 0
        self.answers: list[tuple[object, object]] = []
        self.thread = threading.Thread(target=self._run, args=(code, options))
        self.thread.start()
        assert wait_for(lambda: self.native_id)

    def _run(self, code: str, options: dict[str, object]) -> None:
        self.native_id = threading.get_native_id()
        compile_timeout = options.pop("compile_timeout", None)
        answer = _api.run_code(
            self.url,
            code,
            None,
            compile_timeout,
            self.run_timeout,
            None,
            cancel=self.cancel,
            **options,  # type: ignore[arg-type]
        )
        self.answers.append(answer)

    def wake_ups(self, seconds: float) -> int:
        """How many times the case's thread woke (went back to sleep) over `seconds`."""
        before = self.switches()
        time.sleep(seconds)
        return self.switches() - before

    def switches(self) -> int:
        """The voluntary context switches of the case's thread so far."""
        status = Path(f"/proc/self/task/{self.native_id}/status").read_text()
        return int(status.split("voluntary_ctxt_switches:")[1].split()[0])

    def cancelled(self) -> str:
        """Set the cancel; the message of the case's answer (which must be SandboxError)."""
        self.cancel.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        [(response, error)] = self.answers
        assert error is None and isinstance(response, dict)
        return sandbox_error(response)


class Starts:
    """How many solutions' starts the host has read from the console (see noting_the_start)."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = threading.Condition()

    def wait(self, timeout: float, count: int = 1) -> bool:
        """Whether `count` starts have been read, waiting at most `timeout` seconds."""
        with self.changed:
            return self.changed.wait_for(lambda: self.count >= count, timeout)


def noting_the_start(monkeypatch: pytest.MonkeyPatch) -> Starts:
    """The starts the host reads from the console from now on, counted."""
    starts = Starts()
    frame = _console.Console._frame

    def noted(self: _console.Console, line: memoryview) -> None:
        was = self.started
        frame(self, line)
        if self.started and not was:
            with starts.changed:
                starts.count += 1
                starts.changed.notify_all()

    monkeypatch.setattr(_console.Console, "_frame", noted)
    return starts
