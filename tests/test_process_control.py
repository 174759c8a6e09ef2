"""Process control: hluk runs in a process group of its own, killed whole on a timeout; it dies
with the process that started it, even one killed by SIGKILL; and nothing of a case (thread,
descriptor, child process, directory) outlives it, whatever way the case ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hostside import (
    Host,
    Usage,
    children_of,
    descendants_of,
    left_running,
    processes_with,
    result,
    run,
    still_running,
    wait_for,
)

from verl_hyperlight import deadlines, run_code
from verl_hyperlight import settings as _settings
from verl_hyperlight.hluk import ending
from verl_hyperlight.hluk import spawn as _spawn


@pytest.fixture(params=_settings.SPAWN_WAYS)
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test here runs on each way of starting hluk (the spawner, setpriv, a fork)."""
    if request.param == "setpriv" and _spawn.setpriv() is None:
        pytest.skip("no setpriv with --pdeathsig here")
    monkeypatch.setenv(_settings.SPAWN.name, request.param)
    return str(request.param)


def sleeper(marker: str) -> str:
    """A solution line that starts a child process which outlives it unless it is killed."""
    return (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {marker}'])\n"
    )


def test_a_timeout_kills_the_whole_process_group(host: Host, way: str) -> None:
    marker = uuid.uuid4().hex
    response = run(sleeper(marker) + "while True:\n    pass\n", run_timeout=1)
    assert result(response)[:3] == ("Failed", "TimeLimitExceeded", None)
    assert wait_for(lambda: not processes_with(marker)), processes_with(marker)


# A reward worker with several cases in flight, each of which has started a child.
WORKER = """
import sys, threading, time
from verl_hyperlight import deadlines, run_code
for _ in range(int(sys.argv[2])):
    threading.Thread(
        target=run_code, args=("hyperlight://", sys.argv[1], "", None, 60, None), daemon=True
    ).start()
time.sleep(600)
"""


@pytest.mark.parametrize("children_first", [False, True], ids=["worker", "children-first"])
def test_hluk_and_the_case_directories_go_with_a_worker_killed_by_sigkill(
    host: Host, tmp_path: Path, way: str, children_first: bool
) -> None:
    """children-first: as Ray ends a worker (a force cancel, a worker it kills), its direct
    children SIGKILLed first (CoreWorker::KillChildProcs), then the worker."""
    run("pass")  # the node is warm: the worker goes straight to its cases
    marker = uuid.uuid4().hex
    worker_tmp = tmp_path / f"worker-tmp-{marker}"
    worker_tmp.mkdir()
    cases = 3
    code = sleeper(marker) + "import time\ntime.sleep(60)\n"
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, code, str(cases)],
        env={**os.environ, _settings.CASE_DIR.name: str(worker_tmp)},
    )
    try:
        # The sleepers, the deepest processes (the marker also names the case directories in
        # the argv of hluk and bwrap): once they all run, every process between them does.
        # A fresh worker imports the package and starts its cleaner and three stand-ins: CI's
        # loaded node once took past 10 s for it.
        sleeper_mark = f"# {marker}"
        sleepers = wait_for(
            lambda: len(processes_with(sleeper_mark, exclude=(worker.pid,))) == cases, limit=60
        )
        assert sleepers, "the worker's cases did not all start"
        started = descendants_of(worker.pid)
        assert len(list(worker_tmp.iterdir())) == cases
    finally:
        if children_first:
            for child in children_of(worker.pid):
                os.kill(child, signal.SIGKILL)
        worker.send_signal(signal.SIGKILL)
        worker.wait()

    # hluk, bwrap, the guests and the children they started: every process the worker had.
    assert wait_for(lambda: not still_running(started)), still_running(started)
    assert not processes_with(marker)
    assert wait_for(lambda: not list(worker_tmp.iterdir())), list(worker_tmp.iterdir())


# A reward worker whose C library forked a child before its cases (no at-fork handler of
# Python's runs in it, which would close it): the child holds the cleaner's pipe open after
# the worker's death.
FORKING_WORKER = """
import ctypes, sys, threading, time
from verl_hyperlight import run_code
run_code("hyperlight://", "pass", "", None, 60, None)  # the cleaner started
libc = ctypes.PyDLL(None)
if libc.fork() == 0:
    libc.pause()
for _ in range(int(sys.argv[2])):
    threading.Thread(
        target=run_code, args=("hyperlight://", sys.argv[1], "", None, 60, None), daemon=True
    ).start()
time.sleep(600)
"""


def test_hluk_goes_with_a_killed_worker_whose_forked_child_lives_on(
    host: Host, tmp_path: Path
) -> None:
    """The direct way: the cleaner sees the worker die by its pidfd, not only its pipe, which
    a child the worker forked keeps open; every hluk of the worker is killed with its group."""
    run("pass")
    marker = uuid.uuid4().hex
    code = sleeper(marker) + "import time\ntime.sleep(60)\n"
    worker = subprocess.Popen(
        [sys.executable, "-c", FORKING_WORKER, code, "2"],
        env={**os.environ, _settings.SPAWN.name: "direct"},
    )
    forked = 0
    try:
        own = wait_for(lambda: Path(f"/proc/{worker.pid}/cmdline").read_bytes())
        # The sleepers, beside the worker and its forked child (whose argv holds the marker)
        sleepers = wait_for(
            lambda: (
                [
                    pid
                    for pid in processes_with(f"# {marker}")
                    if Path(f"/proc/{pid}/cmdline").read_bytes() != own
                ]
                if len(processes_with(f"# {marker}")) == 4
                else []
            ),
            limit=60,  # a fresh worker's start and its cases', on a loaded node
        )
        assert sleepers, "the worker's cases did not all start"
        (forked,) = [
            pid
            for pid in children_of(worker.pid)
            if Path(f"/proc/{pid}/cmdline").read_bytes() == own
        ]
        started = {p: c for p, c in descendants_of(worker.pid).items() if p != forked}
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    try:
        assert wait_for(lambda: not still_running(started)), still_running(started)
        assert processes_with(f"# {marker}") == [forked]
    finally:
        if forked:
            os.kill(forked, signal.SIGKILL)


def test_nothing_is_left_behind_after_many_cases_including_failures(
    host: Host, monkeypatch: pytest.MonkeyPatch, fail_file: Path, way: str
) -> None:
    run("pass")
    before = Usage.now(host)
    cases = [
        *[("print(input())", "x\n", 10, "Success")] * 12,
        *[("raise ValueError(input())", "y\n", 10, "Failed")] * 4,
        *[("while True:\n    pass\n", "", 1, "Failed")] * 2,
        ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", "", 60, "Failed"),
        ("import os\nos._exit(7)\n", "", 10, "Failed"),
    ]
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda case: run(*case[:3]), cases))
    assert [response["status"] for response in responses] == [case[3] for case in cases]

    # A malformed request, and backend failures before and at the start of a case.
    _, error = run_code("hyperlight://", None, "", None, 1, None)  # type: ignore[arg-type]
    assert error is not None and error.startswith("Invalid request")
    fail_file.write_text("3")  # the case, then the probe before its retry, and its retry
    assert run("print(1)")["status"] == "SandboxError"
    monkeypatch.setenv("HLUK_STANDIN_HANG", "1")
    monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", "0.5")
    assert run("print(1)")["status"] == "SandboxError"

    leaked = Usage.now(host).minus(before)
    print(f"\nleaked after {len(cases) + 3} cases: {leaked}")
    assert leaked == Usage(descriptors=0, threads=0, children=0, case_dirs=0)
    assert left_running(str(host.tmpdir)) == []


def test_a_guest_death_is_answered_when_hluk_exits_though_a_descendant_holds_its_pipes(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    # A wrapper that leaves a process holding hluk's stdout and stderr (for 60 s, past the 30 s
    # run_timeout): hluk's exit, not the end of its pipes, says the run is over, so the guest's
    # death is answered as such, not as the TimeLimitExceeded that waiting for the pipes gives.
    marker = uuid.uuid4().hex
    wrapper = tmp_path / "hluk-with-a-lingering-child"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"{sys.executable} -c 'import time; time.sleep(60)  # {marker}' &\n"
        f'exec {os.environ["HLUK_PATH"]} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("HLUK_PATH", str(wrapper))
    # Its own group, not os.kill of itself, which the runner delivers without a guest death.
    code = "import os, signal\nprint('before', flush=True)\nos.killpg(0, signal.SIGKILL)\n"
    response = run(code, run_timeout=30)
    status, run_status, return_code, _, stderr = result(response)
    assert (status, run_status, return_code) == ("Failed", "Finished", 9)
    assert "the guest exited with status 9" in stderr
    assert wait_for(lambda: not processes_with(marker)), processes_with(marker)


# A hluk double that answers a case at once (its pid in PID_FILE before its report ends, when
# the case is answered), then closes its pipes and lingers (as a hluk tearing a micro-VM down
# does, for however long that takes).
LINGERING_HLUK = """#!/bin/sh
if [ "$1" = --version ]; then echo "hluk 0.19.0"; exit 0; fi
for last; do :; done
nonce=${last%\\')}; nonce=${nonce##*\\'}
case "$last" in
  *probe*) printf '\\r\\n%s start\\r\\n\\r\\n%s end 0 0.0 - 0 0 -\\r\\n\\r\\n%s done\\r\\n' \\
    "$nonce" "$nonce" "$nonce" ;;
  *) printf '\\r\\n%s start\\r\\n\\r\\n%s end 0 0.0001 - 3 0 -\\r\\n\\r\\n%s stdout b2sK\\r\\n' \\
    "$nonce" "$nonce" "$nonce"
    echo $$ >> "$PID_FILE"
    printf '\\r\\n%s done\\r\\n' "$nonce"
    exec >&- 2>&-
    exec sleep 30 ;;
esac
"""


def test_no_hluk_outlives_its_case_by_more_than_its_grace_though_it_lingers_after_the_report(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    # A case is answered at its report (tests/test_answer_at_report.py); a worker holds a
    # micro-VM past its case for hluk's grace at most: a hluk lingering after its report is
    # killed and reaped then, off the case's path.
    double = tmp_path / "lingering-hluk"
    double.write_text(LINGERING_HLUK)
    double.chmod(0o755)
    pids = tmp_path / "pids"
    monkeypatch.setenv("HLUK_PATH", str(double))
    monkeypatch.setenv("PID_FILE", str(pids))
    monkeypatch.setenv("VERL_HYPERLIGHT_HLUK_ENV", "PID_FILE")
    monkeypatch.setattr(deadlines, "EXIT_GRACE_SECONDS", 0.2)
    for _ in range(10):
        response = run("print('ok')")
        assert result(response)[:4] == ("Success", "Finished", 0, "ok\n")
        pid = int(pids.read_text().split()[-1])
        assert ending.wait(5)
        assert not os.path.exists(f"/proc/{pid}"), "hluk outlived its grace"


# A worker holding more than 1,024 descriptors (a server with a full queue on a large node):
# every descriptor of its cases is numbered above 1,023, past what select(2) can watch.
CROWDED_WORKER = """
import json, logging, os, resource, sys
from concurrent.futures import ThreadPoolExecutor

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
ballast = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
records = []
handler = logging.Handler(logging.WARNING)
# A stand-in slow to exit after its report (a loaded machine: CI's two suites at once) is said
# at WARNING by design (test_answer_at_report): not what this test is about.
handler.emit = lambda record: (
    "had not ended" in record.getMessage() or records.append(record.getMessage())
)
logging.getLogger("verl_hyperlight").addHandler(handler)
from verl_hyperlight import run_code
from verl_hyperlight.hluk import ending

def case(i):
    response, error = run_code("hyperlight://", "print(input())", f"{i}\\n", None, 10, None)
    return response["run_result"]["stdout"] if response and response["run_result"] else [
        response, error]

def children():
    found = []
    for task in os.listdir("/proc/self/task"):
        try:  # a thread may end between the listing and the read
            found += open(f"/proc/self/task/{task}/children").read().split()
        except FileNotFoundError:
            continue
    return sorted(int(pid) for pid in found)

first = case(-1)  # the warm-up, and the long-lived helpers started
assert ending.wait(30)  # the hluks of answered cases ended (within their grace)
descriptors, helpers = len(os.listdir("/proc/self/fd")), children()
with ThreadPoolExecutor(4) as pool:
    answers = list(pool.map(case, range(12)))
assert ending.wait(30)
print(json.dumps({
    "lowest": min(ballast), "highest": max(ballast), "first": first, "answers": answers,
    "records": records, "leaked_descriptors": len(os.listdir("/proc/self/fd")) - descriptors,
    "helpers": [helpers, children()],
}))
"""


def test_cases_run_in_a_worker_holding_more_than_1024_descriptors(host: Host, way: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CROWDED_WORKER],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(host.tmpdir)},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["highest"] > 1100  # what the cases opened came after these
    assert found["first"] == "-1\n"
    assert found["answers"] == [f"{i}\n" for i in range(12)]
    assert found["records"] == []  # no fall-back, no internal error, no backend failure
    assert found["leaked_descriptors"] == 0
    before, after = found["helpers"]
    assert before == after  # the spawners and the cleaner, none added or lost
    assert wait_for(lambda: not processes_with(str(host.tmpdir)))


# A worker as a script's `python worker.py &` starts it (SIGINT and SIGQUIT ignored), with
# Python's SIGPIPE ignored, and its case thread blocking two signals.
QUIET_WORKER = """
import json, signal, sys
from concurrent.futures import ThreadPoolExecutor
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGQUIT, signal.SIG_IGN)
from verl_hyperlight import run_code

def case():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1})
    return run_code("hyperlight://", sys.argv[1], "", None, 10, None)

with ThreadPoolExecutor(1) as pool:
    response, error = pool.submit(case).result()
print(json.dumps([response, error]))
"""
SEEN_SIGNALS = (
    "import signal\n"
    "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
    "print(signal.getsignal(signal.SIGQUIT) == signal.SIG_DFL)\n"
    "print(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))\n"
)


@pytest.mark.parametrize("way", ["direct", "spawner"])
def test_hluk_starts_with_no_signal_the_worker_ignores_or_blocks(
    host: Host, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A solution's signals are a fresh process's, whatever the worker's: its SIGINT raises
    KeyboardInterrupt although the worker ignores it (as a background job does), and nothing
    the case thread blocks reaches it."""
    monkeypatch.setenv(_settings.SPAWN.name, way)
    done = subprocess.run(
        [sys.executable, "-c", QUIET_WORKER, SEEN_SIGNALS],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(host.tmpdir)},
    )
    assert done.returncode == 0, done.stderr
    response, error = json.loads(done.stdout)
    assert error is None and response["status"] == "Success", response
    assert response["run_result"]["stdout"] == "True\nTrue\n[]\n"


def test_cases_tell_the_cleaner_nothing_once_their_root_is_known(host: Host) -> None:
    """The cleaner is woken by no case: the worker's directories are named with its token,
    hluk's environment carries it, and a root is told once (each record would wake it)."""
    from verl_hyperlight.case import casedir
    from verl_hyperlight.hluk import cleaner as _cleaner

    assert result(run("print(0)"))[3] == "0\n"
    process = _cleaner._cleaner._process
    assert process is not None
    # The cleaner is the child of the process the worker started, which only waits for it.
    (cleaner,) = children_of(process.pid)

    def switches() -> int:
        status = Path(f"/proc/{cleaner}/status").read_text()
        return sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line)

    before = switches()
    for i in range(5):
        assert result(run(f"print({i})"))[3] == f"{i}\n"
    assert switches() == before
    made = casedir.make_empty()  # named as the cleaner will find it, with the worker's token
    try:
        assert os.path.basename(made.path).startswith(_cleaner.token())
    finally:
        made.remove()
