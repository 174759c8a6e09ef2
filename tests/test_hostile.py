"""Hostile solutions: each attacks the host side through run_code (forged frames, console
floods, binary output, writes where it may not, memory and disk exhaustion, process and
thread storms, broken descriptors, sockets, signals), and each affects only its own result.
Its answer is its own outcome; the next case in the same worker is answered correctly; and
the worker holds what it held before (descriptors, threads, child processes, case
directories, and its resident memory within RSS_TOLERANCE)."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hostside import (
    Attack,
    Expect,
    Host,
    Usage,
    assert_own_outcome,
    left_running,
    processes_with,
    result,
    run,
    sandbox_error,
    wait_for,
)

from verl_hyperlight import deadlines as _deadlines
from verl_hyperlight.guest.protocol import OUTPUT_LIMIT_STATUS

MIB = 1024 * 1024
# What the worker's resident memory may grow by over one hostile case and the normal one after
# it: what a case holds (at most its output, in mappings of its own) is returned when it ends,
# and what stays is the allocator's arenas and the test's own objects, a few MiB at most.
RSS_TOLERANCE = 8 * MIB

# The runner's case, found as any solution can find it (its memory is the solution's), with
# `frame` writing a line in the runner's frame format, marked with the case's own nonce, to the
# console descriptor the runner reports on.
FORGER = """
import base64, gc, os, sys
case = [o for o in gc.get_objects() if type(o).__name__ == "_Case"][0]
def frame(*fields):
    os.write(case.console, b"\\n" + b" ".join((case.nonce, *fields)) + b"\\n")
def b64(data):
    return base64.b64encode(data)
"""
# The console, found as a solution finds it without the runner's help: /proc/self/fd where the
# guest has it, else the descriptors that are terminals.
CONSOLE = """
import os
def console_descriptors():
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        fds = range(256)
    found = []
    for fd in fds:
        try:
            if os.isatty(fd):
                found.append(fd)
        except OSError:
            pass
    return found
"""
# Lines a console could show that mean something elsewhere: hluk's decisive `error:` lines, a
# tracing log line with its colours and `restored=`, a panic, terminal escapes, NUL and bytes
# that are not UTF-8, with and without newlines.
CONSOLE_LIES = (
    b"\nerror: the guest exited with status 137\n"
    b"error: Guest aborted: 1 out of memory\n"
    b"\x1b[2m2025-01-01T00:00:00.000000Z\x1b[0m \x1b[32m INFO\x1b[0m boot restored=false\n"
    b"thread 'main' panicked at src/main.rs:1:1\n"
    b"error: the guest is deadlocked: every thread is blocked\n"
    b"\x00\xff\xfe\x1b]0;title\x07\x1b[2J\x1b[H\r"
)
BINARY = b"\xff\xfe\x00text\x80\xc3(\x1b[31m"


SUCCESS_REAL = Expect("Success", "Finished", 0, "real\n")
# A solution that takes the runner's console away: its failure, with none of its output. The
# status is not pinned: hluk's driver reports through a host call no solution can reach, the
# stand-in's through a descriptor a solution that closes everything closes too.
BROKE_THE_RUNNER = Expect("Failed", "Finished", None, "")


ATTACKS = {
    # Forged frames. A forgery of the whole report is the solution's to make (README, Known
    # limits): it is answered as forged, and reaches nothing beyond its own answer.
    "forges a whole successful report on the console, then fails": Attack(
        FORGER + "frame(b'end', b'0', b'0.1', b'-', b'6', b'0', b'-')\n"
        "frame(b'stdout', b64(b'forged'))\nframe(b'done')\nprint('real')\nraise SystemExit(3)\n",
        Expect("Success", "Finished", 0, "forged"),
    ),
    "forges an end with sizes past the limit": Attack(
        FORGER + f"frame(b'end', b'0', b'0.1', b'-', b'{2**40}', b'{2**40}', b'-')\n"
        f"frame(b'end', b'0', b'0.1', b'-', b'0', b'0', b'{','.join(['0'] * 5000)}')\n"
        "frame(b'done')\nprint('real')\n",
        SUCCESS_REAL,
    ),
    "forges frames of other kinds and streams": Attack(
        FORGER + "frame(b'stdin', b64(b'x'))\nframe(b'file', b'7', b64(b'x'))\n"
        "frame(b'refused', b64(b'no'))\nframe(b'start')\nframe(b'done')\n"
        "frame(b'stdout', b64(b'y' * 100))\nframe(b'end', b'0', b'0.1')\nprint('real')\n",
        SUCCESS_REAL,
    ),
    "forges a frame longer than any frame": Attack(
        FORGER + "frame(b'stdout', b64(b'z' * 10**6))\nprint('real')\n", SUCCESS_REAL
    ),
    "forges frames on its stdout": Attack(
        FORGER + "sys.stdout.buffer.write(b'\\n' + case.nonce + b' end 0 0.1 - 6 0 -')\n"
        "sys.stdout.buffer.write(b'\\n' + case.nonce + b' stdout Zm9yZ2Vk\\n')\n"
        "sys.stdout.buffer.write(case.nonce + b' done\\n')\n",
        Expect("Success", "Finished", 0, None),
    ),
    # The console, written directly.
    "floods the console with binary bytes and no newline": Attack(
        CONSOLE + "con = console_descriptors()[-1]\nwhile True:\n"
        "    os.write(con, b'\\x00\\xff\\x1b[' * 21846)\n",
        Expect("Failed", "Finished", OUTPUT_LIMIT_STATUS, "", "console output exceeded"),
        run_timeout=60,
    ),
    "writes hluk's error and log lines and escapes to the console": Attack(
        CONSOLE + f"for fd in console_descriptors():\n    os.write(fd, {CONSOLE_LIES!r})\n"
        "for path in ('/dev/console', '/dev/tty'):\n"
        "    try:\n"
        "        with open(path, 'wb') as f:\n"
        f"            f.write({CONSOLE_LIES!r})\n"
        "    except OSError:\n"
        "        pass\n"
        "print('real')\n",
        Expect("Success", "Finished", 0, "real\n", ""),
    ),
    "prints bytes that are not UTF-8 on stdout and stderr": Attack(
        f"import sys\nsys.stdout.buffer.write({BINARY!r})\nsys.stderr.buffer.write({BINARY!r})\n",
        Expect("Success", "Finished", 0, None, "[DecodeError]"),
    ),
    # Files.
    "writes to the read-only case mount": Attack(
        "import os\nfor name in os.listdir('/case'):\n"
        "    try:\n        open('/case/' + name, 'w').write('x')\n"
        "    except OSError as exc:\n        print(exc.errno)\n"
        "open('/case/new', 'w')\n",
        Expect("Failed", "Finished", 1, None, "Read-only file system"),
    ),
    "overwrites and removes its own files": Attack(
        "import os, sys\nprint('real', flush=True)\n"
        "open(__file__, 'w').write('raise SystemExit(9)')\n"
        "for d in ('/tmp/solution', '/tmp/.verl-hyperlight-output'):\n"
        "    for name in os.listdir(d):\n        os.remove(os.path.join(d, name))\n"
        "print('also', flush=True)\n",
        Expect("Success", "Finished", 0, "real\nalso\n"),
    ),
    "fills /tmp": Attack(
        "with open('/tmp/hoard', 'wb') as f:\n    while True:\n"
        "        f.write(b'x' * (1 << 20))\n        f.flush()\n",
        # Out of space (ENOSPC, status 1) or out of the guest's memory (its kernel aborts, 137):
        # which comes first is a race between the guest's writes and its memory's watcher.
        Expect("Failed", "Finished", None),
        memory=128,
    ),
    "fills the root filesystem": Attack(
        "with open('/hoard', 'wb') as f:\n    while True:\n"
        "        f.write(b'x' * (1 << 20))\n        f.flush()\n",
        Expect("Failed", "Finished", 137, "", "error: Guest aborted:"),
        memory=128,
    ),
    "exhausts its memory": Attack(
        f"hoard = b'x' * {1024 * MIB}\nprint('survived')\n",
        Expect("Failed", "Finished", 137, "", "error: Guest aborted:"),
        memory=128,
    ),
    # Processes and threads.
    "forks": Attack(
        "import os\nwhile True:\n    os.fork()\n",
        Expect("Failed", "Finished", 1, "", "Operation not supported"),
    ),
    "starts a storm of child processes and leaves them running": Attack(
        "import subprocess, sys\nfor _ in range(10):\n"
        "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {marker}'])\n"
        "print('real')\n",
        SUCCESS_REAL,
    ),
    # A spin that allocates nothing: a growing list would exhaust the guest's memory before
    # run_timeout on a fast machine, and end as an out-of-memory kill instead of a timeout.
    "leaves a non-daemon thread spinning": Attack(
        "import threading\ndef spin():\n    while True:\n        pass\n"
        "threading.Thread(target=spin).start()\nprint('real')\n",
        Expect("Failed", "TimeLimitExceeded", None, ""),
        run_timeout=1,
    ),
    "leaves daemon threads spinning and sleeping": Attack(
        "import threading, time\n"
        "def sleeping():\n    while True:\n        time.sleep(0.001)\n"
        "threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\n"
        "threading.Thread(target=sleeping, daemon=True).start()\nprint('real')\n",
        SUCCESS_REAL,
    ),
    # Descriptors.
    "closes every descriptor": Attack(
        "import os\nprint('real')\nos.closerange(0, 65536)\n",
        BROKE_THE_RUNNER,
    ),
    "dup2s /dev/null over every descriptor": Attack(
        "import os\nprint('real')\nnull = os.open('/dev/null', os.O_RDWR)\n"
        "for fd in range(256):\n    try:\n        os.dup2(null, fd)\n    except OSError:\n"
        "        pass\n",
        BROKE_THE_RUNNER,
    ),
    "dup2s over its standard descriptors": Attack(
        "import os\nr, w = os.pipe()\nfor fd in (0, 1, 2):\n    os.dup2(w, fd)\nprint('lost')\n",
        Expect("Success", "Finished", 0, ""),
    ),
    # Network.
    "opens an internet socket": Attack(
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=5)\n",
        Expect("Failed", "Finished", 1, "", "Permission denied"),
    ),
    "connects to a unix socket the worker's host listens on": Attack(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('\\0{marker}')\n",
        Expect("Failed", "Finished", 1, "", "ConnectionRefusedError"),
    ),
    # Signals.
    "kills its own process group": Attack(
        "import os, signal\nprint('real', flush=True)\nos.killpg(0, signal.SIGKILL)\n",
        # Not a signal to itself the runner delivers: the guest kernel ends the process, with
        # the signal's number as its status (see README, Known limits).
        Expect("Failed", "Finished", 9, "", "the guest exited with status 9"),
    ),
    "signals pid 1 and every process it can": Attack(
        "import os, signal\nfor sig in (signal.SIGTERM, signal.SIGKILL):\n"
        "    os.kill(1, sig)\n    os.kill(os.getppid(), sig)\n"
        "try:\n    os.kill(-1, signal.SIGKILL)\nexcept ProcessLookupError:\n    pass\n"
        "print('real')\n",
        SUCCESS_REAL,
    ),
}


@dataclass(frozen=True)
class Footprint:
    """What the worker holds: its descriptors, threads, children and case directories, and its
    resident memory."""

    usage: Usage
    rss: int

    @classmethod
    def now(cls, host: Host) -> Footprint:
        with open("/proc/self/status") as status:
            rss = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
        return cls(Usage.now(host), rss)


@pytest.fixture
def listening(tmp_path: object) -> Iterator[str]:
    """A marker that names an abstract unix socket this process listens on."""
    marker = f"verl-hyperlight-hostile-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("\0" + marker)
        server.listen()
        yield marker


def assert_a_normal_case_is_answered(host: Host) -> None:
    response = run("print(input()[::-1])", stdin="abc\n")
    assert result(response) == ("Success", "Finished", 0, "cba\n", "")


@pytest.mark.parametrize("name", ATTACKS)
def test_a_hostile_solution_affects_only_its_own_result(
    host: Host, listening: str, name: str
) -> None:
    attack = ATTACKS[name]
    run("pass")  # warm: the footprint is that of a worker that has run cases
    before = Footprint.now(host)
    code = attack.code.replace("{marker}", listening)
    response = run(code, run_timeout=attack.run_timeout, memory=attack.memory)
    assert_own_outcome(response, attack.expect)
    assert_a_normal_case_is_answered(host)

    after = Footprint.now(host)
    print(f"\n{name}: RSS {(after.rss - before.rss) / MIB:+.1f} MiB")
    assert after.usage.minus(before.usage) == Usage(0, 0, 0, 0)
    assert after.rss - before.rss < RSS_TOLERANCE
    assert wait_for(lambda: not processes_with(listening)), processes_with(listening)
    assert left_running(str(host.tmpdir)) == []


def test_forged_frames_on_stdout_come_back_as_its_output_byte_for_byte(host: Host) -> None:
    response = run(ATTACKS["forges frames on its stdout"].code)
    stdout = result(response)[3]
    nonces = {line.split(" ")[0] for line in stdout.splitlines() if line}
    assert len(nonces) == 1
    nonce = nonces.pop()
    assert stdout == f"\n{nonce} end 0 0.1 - 6 0 -\n{nonce} stdout Zm9yZ2Vk\n{nonce} done\n"


def test_a_forged_end_then_a_stall_is_answered_as_a_copy_out_that_did_not_finish(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A forged end stops the solution's clock; what follows is the copy-out's, which the host
    # cannot tell from a node too slow to copy out (README, Known limits).
    monkeypatch.setattr(_deadlines, "COPY_OUT_SECONDS", 1.0)
    code = FORGER + "frame(b'end', b'0', b'0.1', b'-', b'0', b'0', b'-')\nwhile True:\n    pass\n"
    before = Footprint.now(host)
    message = sandbox_error(run(code, run_timeout=1))
    assert "did not copy the solution's output" in message
    assert_a_normal_case_is_answered(host)
    assert Footprint.now(host).usage.minus(before.usage) == Usage(0, 0, 0, 0)
