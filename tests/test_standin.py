"""The stand-in hluk's contract (docs/hluk.md), pinned so that it never becomes kinder than hluk.

Each test runs the stand-in as the project runs hluk and asserts what a caller can observe: its
stdout (the guest console), its stderr (hluk's own messages), its exit status and the cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import select
import shutil
import signal
import subprocess
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from conftest import find_bwrap, run_standin
from hostside import wait_for

GUEST_PATH = "/usr/local/bin:/usr/bin:/bin"
REPO = Path(__file__).resolve().parent.parent
IMAGE = "ghcr.io/hyperlight-dev/hyperlight-unikraft/python:initrd-v0.19.0"
IMAGE_PATH = "rootfs/ghcr.io/hyperlight-dev/hyperlight-unikraft/python/initrd-v0.19.0.cpio"
PULLED = r"pulled {}  \d+\.\d MiB in \d+\.\d s"
CALL_FAILED = "hl_driver: dispatch callback failed\n"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Variables of hluk's (and the stand-in's) that change what it prints: none may leak in.
HLUK_OUTPUT_VARIABLES = ("HLUK_REGISTRY", "HLUK_IMAGE_VERSION", "HLUK_PROFILE", "NO_COLOR")


def _load_guest_python():  # type: ignore[no-untyped-def]
    path = REPO / "tests" / "standin" / "guest_python.py"
    spec = importlib.util.spec_from_file_location("standin_guest_python", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


guest_python = _load_guest_python()


def _leaks(name: str) -> bool:
    return name.startswith("HLUK_STANDIN_") or name in HLUK_OUTPUT_VARIABLES


@pytest.fixture(autouse=True)
def _no_inherited_fault_injection(monkeypatch: pytest.MonkeyPatch) -> None:
    # run_standin passes this process's environment on: a stray HLUK_STANDIN_* must not leak in.
    for name in list(os.environ):
        if _leaks(name):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def _images_pulled(standin_path: Path, standin_cache: Path) -> None:
    """Both runtime images in the shared cache, so that no test sees the lines of their pull."""
    environ = {name: value for name, value in os.environ.items() if not _leaks(name)}
    environ |= {
        "HLUK_CACHE_DIR": str(standin_cache),
        "HLUK_STANDIN_BWRAP": find_bwrap(),
        "HLUK_STANDIN_PULL_SECONDS": "0",
    }
    for runtime in ("python", "agent"):
        subprocess.run(
            [standin_path, "run", "--runtime", runtime, "--cold", "--exec", "pass"],
            input=b"",
            capture_output=True,
            timeout=120,
            env=environ,
            check=True,
        )


@pytest.fixture
def env(standin_env: dict[str, str], _images_pulled: None) -> dict[str, str]:
    """The shared stand-in, with boot and pull delays removed where they are irrelevant. Its
    runtime images are pulled already."""
    return {**standin_env, "HLUK_STANDIN_BOOT_SECONDS": "0", "HLUK_STANDIN_PULL_SECONDS": "0"}


@pytest.fixture
def fresh_env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The stand-in with a cache of its own, for tests whose result depends on the cache."""
    return {**env, "HLUK_CACHE_DIR": str(tmp_path / "cache")}


def guest(
    env: dict[str, str], code: str, *flags: str, input: bytes | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    """Run `code` as an --exec workload of the python runtime."""
    return run_standin(env, "run", *flags, "--exec", code, input=input, timeout=timeout)


def console(result: subprocess.CompletedProcess[bytes]) -> str:
    """The guest console as text, with the terminal's \\r\\n turned back into \\n."""
    return result.stdout.decode().replace("\r\n", "\n")


def guest_value(env: dict[str, str], expression: str, *flags: str) -> object:
    """Evaluate `expression` (json, os, shutil, sys imported) in a guest; return its value."""
    result = guest(env, f"import json, os, shutil, sys\nprint(json.dumps({expression}))", *flags)
    assert (result.returncode, result.stderr) == (0, b""), console(result)
    return json.loads(console(result).strip().splitlines()[-1])


def plain(stderr: bytes) -> str:
    """hluk's stderr as text, without the colours of its logs."""
    return ANSI.sub("", stderr.decode())


def info_log(env: dict[str, str], *flags: str) -> str:
    """hluk's stderr (colours removed) for a trivial workload at --log-level info."""
    result = run_standin(env, "--log-level", "info", "run", *flags, "--exec", "pass")
    assert result.returncode == 0, result.stderr.decode()
    return plain(result.stderr)


def pulled_lines(image: str) -> list[str]:
    """Regular expressions for what a pull of `image` prints on a stderr that is a pipe."""
    return [re.escape(f"pulling {image}..."), PULLED.format(re.escape(image))]


def assert_lines(text: str, patterns: list[str]) -> None:
    """Each line of `text` matches its pattern (regular expressions), and there are as many."""
    lines = text.splitlines()
    assert len(lines) == len(patterns), text
    for line, pattern in zip(lines, patterns, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)


def cache_of(env: dict[str, str]) -> Path:
    return Path(env["HLUK_CACHE_DIR"])


def snapshot_slots(env: dict[str, str]) -> list[Path]:
    """The complete snapshots in the cache."""
    snapshots = cache_of(env) / "snapshots"
    return sorted(p for p in snapshots.iterdir() if "." not in p.name) if snapshots.exists() else []


# ---------------------------------------------------------------------------------------------
# --version


def test_version_prints_hluk_and_a_semantic_version(env: dict[str, str]) -> None:
    result = run_standin(env, "--version")
    assert result.returncode == 0
    assert re.fullmatch(rb"hluk \d+\.\d+\.\d+\n", result.stdout)
    assert result.stderr == b""


def test_version_follows_hluk_standin_version(env: dict[str, str]) -> None:
    result = run_standin({**env, "HLUK_STANDIN_VERSION": "0.23.4"}, "--version")
    assert (result.returncode, result.stdout) == (0, b"hluk 0.23.4\n")


# ---------------------------------------------------------------------------------------------
# argv validation: `error: ...` on stderr, nothing on stdout, exit 1

TOO_MANY_MOUNTS = [arg for i in range(33) for arg in ("--mount", f"{{dir}}:/m{i}")]

INVALID_ARGV = {
    "no-subcommand": [],
    "unknown-subcommand": ["start", "--exec", "pass"],
    "unknown-flag": ["run", "--exec", "pass", "--bogus"],
    "flag-without-value": ["run", "--exec"],
    "two-workloads": ["run", "--exec", "pass", "--guest-exec", "/x.py"],
    "script-and-exec": ["run", "{dir}/script.py", "--exec", "pass"],
    "no-workload": ["run", "--runtime", "python"],
    "mount-without-colon": ["run", "--mount", "{dir}", "--exec", "pass"],
    "33-mounts": ["run", *TOO_MANY_MOUNTS, "--exec", "pass"],
    "port-without-net": ["run", "--port", "8080", "--exec", "pass"],
    "env-without-equals": ["run", "--env", "NOVALUE", "--exec", "pass"],
    "env-without-name": ["run", "--env", "=V", "--exec", "pass"],
    "scratch-mb-not-a-number": ["run", "--scratch-mb", "lots", "--exec", "pass"],
    "scratch-mb-zero": ["run", "--scratch-mb", "0", "--exec", "pass"],
    "scratch-mb-negative": ["run", "--scratch-mb", "-5", "--exec", "pass"],
    "bad-log-level": ["--log-level", "loud", "run", "--exec", "pass"],
    "unknown-runtime": ["run", "--runtime", "x", "--exec", "pass"],
    "missing-initrd": ["run", "--initrd", "{dir}/absent.cpio", "--exec", "pass"],
    "missing-script": ["run", "{dir}/absent.py"],
    "non-utf8-script": ["run", "{dir}/latin1.py"],
    "unknown-cache-subcommand": ["cache", "prune"],
    "cache-flag-without-subcommand": ["cache", "--snapshots"],
    "unknown-cache-flag": ["cache", "clean", "--all"],
    "two-cache-subcommands": ["cache", "ls", "clean"],
}


@pytest.mark.parametrize("argv", INVALID_ARGV.values(), ids=INVALID_ARGV.keys())
def test_invalid_argv_is_an_error_on_stderr_and_exit_1(
    env: dict[str, str], tmp_path: Path, argv: list[str]
) -> None:
    (tmp_path / "script.py").write_text("print('ran')\n")
    (tmp_path / "latin1.py").write_bytes("print('café')\n".encode("latin-1"))
    result = run_standin(env, *(arg.format(dir=tmp_path) for arg in argv))
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.startswith(b"error: ")


def test_unknown_runtime_names_the_runtime(env: dict[str, str]) -> None:
    result = run_standin(env, "run", "--runtime", "x", "--exec", "pass")
    assert result.returncode == 1
    assert result.stderr.startswith(b'error: no runtime image called "x"')


# ---------------------------------------------------------------------------------------------
# workloads


def test_script_file_runs_as_the_workload(env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text("print('from the script', __name__)\n")
    result = run_standin(env, "run", str(script))
    assert (result.returncode, console(result)) == (0, "from the script __main__\n")


def test_exec_code_runs_as_the_workload(env: dict[str, str]) -> None:
    result = guest(env, "print(6 * 7)")
    assert (result.returncode, console(result)) == (0, "42\n")


def test_guest_exec_runs_a_file_under_a_mount_with_shlex_split_argv(
    env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "prog.py").write_text("import sys\nprint(sys.argv, __name__)\n")
    result = run_standin(
        env, "run", "--mount", f"{tmp_path}:/app:ro", "--guest-exec", "/app/prog.py 'a b' c"
    )
    assert result.returncode == 0, console(result)
    assert console(result) == "['/app/prog.py', 'a b', 'c'] __main__\n"


# ---------------------------------------------------------------------------------------------
# the guest


def test_host_environment_never_reaches_the_guest(env: dict[str, str]) -> None:
    canary = {**env, "HLUK_CONTRACT_CANARY": "canary-7f3a"}
    assert guest_value(canary, "dict(os.environ)") == {"PATH": GUEST_PATH}


def test_env_flag_entries_reach_the_guest(env: dict[str, str]) -> None:
    environ = guest_value(env, "dict(os.environ)", "--env", "ANSWER=4=2")
    assert environ == {"PATH": GUEST_PATH, "ANSWER": "4=2"}


def test_guest_path_is_the_images_path(env: dict[str, str]) -> None:
    assert guest_value(env, "os.environ['PATH']") == GUEST_PATH


NETWORK_PROBE = """
import errno, socket
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    print("allowed")
except OSError as exc:
    print(type(exc).__name__, errno.errorcode[exc.errno])
"""


def test_no_network_without_a_net_flag(env: dict[str, str]) -> None:
    result = guest(env, NETWORK_PROBE)
    assert (result.returncode, console(result)) == (0, "PermissionError EACCES\n")


@pytest.mark.parametrize(
    "net_flag",
    [["--net"], ["--net-allow", "example.com"], ["--net-block", "example.com"]],
    ids=["net", "net-allow", "net-block"],
)
def test_a_net_flag_allows_inet_sockets(env: dict[str, str], net_flag: list[str]) -> None:
    result = guest(env, NETWORK_PROBE, *net_flag)
    assert (result.returncode, console(result)) == (0, "allowed\n")


def test_a_mount_is_visible_at_its_guest_path_and_writable(
    env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "in.txt").write_text("from the host")
    code = "d = open('/data/in.txt').read()\nopen('/data/out.txt', 'w').write(d + ', back')"
    result = guest(env, code, "--mount", f"{tmp_path}:/data")
    assert result.returncode == 0, console(result)
    assert (tmp_path / "out.txt").read_text() == "from the host, back"


def test_a_mount_does_not_reach_outside_its_source(env: dict[str, str], tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (tmp_path / "secret.txt").write_text("host only")
    (shared / "escape").symlink_to(tmp_path / "secret.txt")
    code = """
try:
    print(open('/data/escape').read())
except OSError:
    print('unreachable')
"""
    result = guest(env, code, "--mount", f"{shared}:/data")
    assert (result.returncode, console(result)) == (0, "unreachable\n")


def test_a_read_only_mount_refuses_writes(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("from the host")
    code = """
print(open('/data/in.txt').read())
try:
    open('/data/out.txt', 'w')
except OSError:
    print('refused')
"""
    result = guest(env, code, "--mount", f"{tmp_path}:/data:ro")
    assert (result.returncode, console(result)) == (0, "from the host\nrefused\n")
    assert not (tmp_path / "out.txt").exists()


def test_guest_tmp_is_writable_and_private(env: dict[str, str], tmp_path: Path) -> None:
    marker = f"hluk-contract-{uuid.uuid4().hex}"
    (tmp_path / "host-only").write_text("x")
    code = f"""
import os
open('/tmp/{marker}', 'w').write('guest')
print(open('/tmp/{marker}').read(), os.path.exists({str(tmp_path / "host-only")!r}))
"""
    result = guest(env, code)
    assert (result.returncode, console(result)) == (0, "guest False\n")
    assert not Path("/tmp", marker).exists()


def test_guest_root_filesystem_is_writable(env: dict[str, str]) -> None:
    code = "import os\nos.mkdir('/scratch')\nopen('/scratch/f', 'w').write('x')\nprint('ok')"
    result = guest(env, code)
    assert (result.returncode, console(result)) == (0, "ok\n")


def test_host_home_is_not_visible(env: dict[str, str]) -> None:
    home = Path.home()
    python = Path(str(guest_value(env, "sys.executable")))
    # The stand-in binds the guest interpreter's own prefix, which may lie under home.
    entries = [str(p) for p in home.iterdir() if p not in python.parents]
    if home == Path("/") or not entries:
        pytest.skip(f"home {home} has no entries of its own to look for")
    assert guest_value(env, f"[p for p in {entries!r} if os.path.lexists(p)]") == []


def test_work_tree_is_not_visible(env: dict[str, str]) -> None:
    places = [str(REPO), str(REPO / "tests"), str(Path(__file__).resolve())]
    assert guest_value(env, f"[p for p in {places!r} if os.path.lexists(p)]") == []


def test_guest_has_no_shell(env: dict[str, str]) -> None:
    found = guest_value(env, "[os.path.lexists('/bin/sh'), shutil.which('sh')]")
    assert found == [False, None]


def test_dev_stdin_is_not_provided(env: dict[str, str]) -> None:
    # Whether hluk's guest has /dev/stdin is unconfirmed, so code must not get to rely on it.
    assert guest_value(env, "os.path.lexists('/dev/stdin')") is False


def test_fork_fails_with_enotsup(env: dict[str, str]) -> None:
    code = """
import errno, os
try:
    pid = os.fork()
except OSError as exc:
    print(errno.errorcode[exc.errno])
else:
    if pid == 0:
        os._exit(0)
    print("forked")
"""
    result = guest(env, code)
    assert (result.returncode, console(result)) == (0, "ENOTSUP\n")


def test_subprocess_of_sys_executable_works(env: dict[str, str]) -> None:
    code = """
import subprocess, sys
done = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True)
print(done.returncode, done.stdout.decode().strip())
"""
    result = guest(env, code)
    assert (result.returncode, console(result)) == (0, "0 42\n")


def test_alarm_and_itimer_signals_never_fire(env: dict[str, str]) -> None:
    # The guest has no timer interrupts: a time limit inside it cannot work, the caller must kill.
    code = """
import signal, time
signal.signal(signal.SIGALRM, lambda *_: print("fired"))
signal.alarm(1)
signal.setitimer(signal.ITIMER_REAL, 0.5)
time.sleep(1.5)
print("slept")
"""
    result = guest(env, code)
    assert (result.returncode, console(result)) == (0, "slept\n")


def test_process_time_does_not_advance(env: dict[str, str]) -> None:
    # The guest documents no CPU-time clock; a solution timing itself with it sees no time pass.
    code = """
import time
start, start_ns = time.process_time(), time.process_time_ns()
sum(i * i for i in range(300_000))
print(time.process_time() == start, time.process_time_ns() == start_ns)
"""
    result = guest(env, code)
    assert (result.returncode, console(result)) == (0, "True True\n")


def processes_mentioning(marker: str) -> list[int]:
    """Live processes whose command line contains `marker` (zombies have none)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def read_until(stream: int, wanted: bytes, limit: float) -> bytes:
    """Read a pipe until `wanted` appears, the pipe ends or `limit` seconds pass."""
    seen = b""
    deadline = time.monotonic() + limit
    while wanted not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.1)
        if ready:
            chunk = os.read(stream, 4096)
            if not chunk:
                break
            seen += chunk
    return seen


def test_guest_dies_with_the_standin(env: dict[str, str]) -> None:
    marker = f"guest_marker_{uuid.uuid4().hex}"
    code = f"import time\n{marker} = 1\nprint('ready', flush=True)\ntime.sleep(30)"
    proc = subprocess.Popen(
        [env["HLUK_PATH"], "run", "--exec", code],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env},
    )
    assert proc.stdout is not None
    try:
        assert b"ready" in read_until(proc.stdout.fileno(), b"ready", 30)
        assert processes_mentioning(marker)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    deadline = time.monotonic() + 10
    while processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_mentioning(marker) == []


# ---------------------------------------------------------------------------------------------
# the driver


def test_a_guest_killing_its_own_process_group_ends_only_the_guest(env: dict[str, str]) -> None:
    # On hluk the guest's processes are the unikernel's: no signal of theirs reaches hluk.
    result = guest(env, "import os, signal\nos.killpg(0, signal.SIGKILL)\n")
    assert result.returncode == 9
    assert result.stderr == b"error: the guest exited with status 9\n"


def test_code_runs_as_main_without_file(env: dict[str, str]) -> None:
    assert guest_value(env, "[__name__, '__file__' in globals()]") == ["__main__", False]


def test_python_runtime_argv_is_the_driver(env: dict[str, str]) -> None:
    assert guest_value(env, "sys.argv") == ["hl_pydriver"]


def test_agent_runtime_argv_is_the_warm_driver(env: dict[str, str]) -> None:
    argv = guest_value(env, "sys.argv", "--runtime", "agent")
    assert argv == ["hl_pywarmdriver"]


def test_warm_exec_runs_first_in_the_same_globals(fresh_env: dict[str, str]) -> None:
    result = guest(fresh_env, "print(WARMED + 1)", "--warm-exec", "WARMED = 41")
    assert (result.returncode, console(result)) == (0, "42\n")


@pytest.mark.parametrize(
    ("code", "status", "shown"),
    [
        ("raise SystemExit", 0, ""),
        ("raise SystemExit(None)", 0, ""),
        ("raise SystemExit(3)", 3, ""),
        ("raise SystemExit(256)", 0, ""),
        ("raise SystemExit(258)", 2, ""),
        ("raise SystemExit('msg')", 1, "msg\n"),
    ],
)
def test_system_exit_maps_to_a_status(
    env: dict[str, str], code: str, status: int, shown: str
) -> None:
    result = guest(env, code)
    if status != 0:
        shown += CALL_FAILED
    assert (result.returncode, console(result), result.stderr) == (status, shown, b"")


def test_uncaught_exception_prints_a_string_traceback_and_exits_1(env: dict[str, str]) -> None:
    result = guest(env, "def fail():\n    raise ValueError('boom')\nfail()")
    text = console(result)
    assert (result.returncode, result.stderr) == (1, b"")
    assert text.startswith("Traceback (most recent call last):\n")
    assert 'File "<string>", line 3, in <module>' in text
    assert 'File "<string>", line 2, in fail' in text
    assert text.endswith("ValueError: boom\n" + CALL_FAILED)
    assert text.count('File "') == 2  # no driver frames


def test_guest_runs_in_utf8_mode(env: dict[str, str]) -> None:
    assert guest_value(env, "[sys.flags.utf8_mode, sys.stdout.encoding]") == [1, "utf-8"]


def test_threads_are_not_joined(env: dict[str, str]) -> None:
    code = """
import threading, time
def late():
    time.sleep(5)
    print("late")
threading.Thread(target=late).start()
print("main done")
"""
    result = guest(env, code)
    assert (result.returncode, console(result)) == (0, "main done\n")


def test_atexit_handlers_do_not_run(env: dict[str, str]) -> None:
    result = guest(env, "import atexit\natexit.register(print, 'atexit ran')\nprint('end')")
    assert (result.returncode, console(result)) == (0, "end\n")


# ---------------------------------------------------------------------------------------------
# the console


def test_console_claims_to_be_a_terminal(env: dict[str, str]) -> None:
    ttys = guest_value(env, "[s.isatty() for s in (sys.stdin, sys.stdout, sys.stderr)]")
    assert ttys == [True, True, True]


def test_newlines_arrive_as_crlf(env: dict[str, str]) -> None:
    result = guest(env, 'print("a\\nb")')
    assert (result.returncode, result.stdout) == (0, b"a\r\nb\r\n")


def test_guest_stderr_is_merged_into_stdout(env: dict[str, str]) -> None:
    result = guest(env, "import sys\nprint('to out')\nprint('to err', file=sys.stderr)")
    assert result.returncode == 0
    assert result.stdout == b"to out\r\nto err\r\n"
    assert result.stderr == b""


def test_stdin_is_readable_and_echoed(env: dict[str, str]) -> None:
    result = guest(env, "line = input()\nprint('got', line)", input=b"hello\n")
    assert (result.returncode, result.stdout) == (0, b"hello\r\ngot hello\r\n")


def test_input_without_a_final_newline_then_ends(env: dict[str, str]) -> None:
    result = guest(env, "import sys\nprint(repr(sys.stdin.read()))", input=b"abc", timeout=20)
    assert (result.returncode, console(result)) == (0, "abc'abc'\n")


def test_end_of_input_is_final(env: dict[str, str]) -> None:
    code = "import sys\nfirst = sys.stdin.read()\nprint(repr(first), repr(sys.stdin.read()))"
    result = guest(env, code, input=b"x\n", timeout=20)
    assert (result.returncode, console(result)) == (0, "x\n'x\\n' ''\n")


def test_a_long_input_line_reaches_the_guest_whole(env: dict[str, str]) -> None:
    line = b"7 " * 50_000 + b"\n"
    code = "import sys\ndata = sys.stdin.buffer.read()\nprint(len(data), data.count(b'7'))"
    result = guest(env, code, input=line, timeout=20)
    assert result.returncode == 0
    # Echoed whole, before what the guest printed after reading it: a pty's own echo lost part
    # of it whenever hluk's stdout was read slowly (CI saw the count glued to a cut echo).
    assert console(result) == line.decode() + "100001 50000\n"


def test_input_bytes_reach_the_guest_unchanged(env: dict[str, str]) -> None:
    # Carriage returns, terminal control characters and NULs are data, not line editing.
    data = b"a\r\nb\x7fc\x15d\x03e\x04f\x16g\x13h\x00i\n"
    code = "import sys\nprint(sys.stdin.buffer.read().hex())"
    result = guest(env, code, input=data, timeout=20)
    assert result.returncode == 0
    assert result.stdout.splitlines()[-1] == data.hex().encode()


# ---------------------------------------------------------------------------------------------
# exit status


def test_guest_process_exit_is_reported_with_its_status(env: dict[str, str]) -> None:
    result = guest(env, "import os\nprint('before', flush=True)\nos._exit(7)")
    assert result.returncode == 7
    assert result.stderr == b"error: the guest exited with status 7\n"
    assert console(result) == "before\n"


def test_guest_killed_by_a_signal_is_reported_with_the_signal_number(env: dict[str, str]) -> None:
    # The guest kernel ends a process killed by signal N with exit status N (not the shell's
    # 128 + N): hluk reports that status as it reports any other.
    code = "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)"
    result = guest(env, code)
    assert result.returncode == 15
    assert result.stderr == b"error: the guest exited with status 15\n"
    assert console(result) == "before\n"


def test_a_successful_run_says_nothing_on_stderr(env: dict[str, str]) -> None:
    result = guest(env, "print('fine')")
    assert (result.returncode, result.stderr) == (0, b"")


# ---------------------------------------------------------------------------------------------
# the cache


def test_first_warm_run_boots_and_later_runs_restore(fresh_env: dict[str, str]) -> None:
    assert "restored=false" in info_log(fresh_env)
    assert "restored=true" in info_log(fresh_env)


def test_warm_exec_is_part_of_the_snapshot_key(fresh_env: dict[str, str]) -> None:
    info_log(fresh_env, "--warm-exec", "import json")
    assert "restored=true" in info_log(fresh_env, "--warm-exec", "import json")
    assert "restored=false" in info_log(fresh_env, "--warm-exec", "import re")


def test_one_snapshot_serves_any_mounts(fresh_env: dict[str, str], tmp_path: Path) -> None:
    info_log(fresh_env)
    assert "restored=true" in info_log(fresh_env, "--mount", f"{tmp_path}:/data:ro")


def test_initrd_runs_cold_unless_warm(fresh_env: dict[str, str], tmp_path: Path) -> None:
    initrd = tmp_path / "rootfs.cpio"
    initrd.write_bytes(b"070701")
    cold = info_log(fresh_env, "--initrd", str(initrd))
    assert "restored=false" in cold
    assert "warm snapshot saved" not in cold
    assert "restored=false" in info_log(fresh_env, "--initrd", str(initrd), "--warm")
    assert "restored=true" in info_log(fresh_env, "--initrd", str(initrd), "--warm")


def test_cold_runs_never_restore(fresh_env: dict[str, str]) -> None:
    info_log(fresh_env)
    for _ in range(2):
        cold = info_log(fresh_env, "--cold")
        assert "restored=false" in cold
        assert "warm snapshot saved" not in cold


def env_without_cache_dir(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.delenv("HLUK_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return {k: v for k, v in env.items() if k != "HLUK_CACHE_DIR"}


def test_cache_falls_back_to_xdg_cache_home(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    xdg_env = {**env_without_cache_dir(env, monkeypatch), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert "restored=false" in info_log(xdg_env)
    assert "restored=true" in info_log(xdg_env)
    assert any((tmp_path / "xdg" / "hluk" / "snapshots").iterdir())


def test_cache_falls_back_to_home_cache(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stand-in looks for its guest interpreter under home too: pin it before moving home.
    python = str(guest_value(env, "sys.executable"))
    home_env = {
        **env_without_cache_dir(env, monkeypatch),
        "HOME": str(tmp_path),
        "HLUK_STANDIN_PYTHON": python,
    }
    assert "restored=false" in info_log(home_env)
    assert "restored=true" in info_log(home_env)
    assert any((tmp_path / ".cache" / "hluk" / "snapshots").iterdir())


def test_cache_keeps_images_under_rootfs_and_snapshots_by_key(
    fresh_env: dict[str, str],
) -> None:
    info_log(fresh_env)
    cache = Path(fresh_env["HLUK_CACHE_DIR"])
    assert [p for p in (cache / "rootfs").rglob("*") if p.is_file()]
    keys = [p.name for p in (cache / "snapshots").iterdir()]
    assert len(keys) == 1
    assert re.fullmatch(r"[0-9a-f]{16}", keys[0])
    assert any((cache / "snapshots" / keys[0]).iterdir())


# ---------------------------------------------------------------------------------------------
# guest memory


def test_scratch_smaller_than_twice_the_image_gives_a_note(env: dict[str, str]) -> None:
    result = guest(env, "print('ok')", "--scratch-mb", "90")
    assert result.returncode == 0, result.stderr.decode()
    assert any(line.startswith("note: ") for line in result.stderr.decode().splitlines())


def test_default_scratch_bounds_a_python_guest(env: dict[str, str]) -> None:
    code = """
import time
hoard = [b"x" * (16 << 20) for _ in range(24)]
time.sleep(30)
print("survived")
"""
    result = guest(env, code)
    assert result.returncode != 0
    assert "survived" not in console(result)


def test_a_guest_beyond_its_scratch_memory_aborts_as_hluks_kernel_does(env: dict[str, str]) -> None:
    code = """
import time
hoard = [b"x" * (16 << 20) for _ in range(40)]
time.sleep(30)
print("survived")
"""
    result = guest(env, code, "--scratch-mb", "128")
    # hluk has no handling of a guest out of memory: its kernel aborts.
    assert result.returncode == 1
    assert result.stderr.endswith(b"error: Guest aborted: 1 \n")
    assert "survived" not in console(result)


def test_files_written_to_the_root_filesystem_count_against_the_guests_scratch_memory(
    env: dict[str, str],
) -> None:
    # hluk's root filesystem is ramfs in the guest's scratch memory; the stand-in's is a tmpfs
    # of no size of its own (its /tmp has one, and fills up with ENOSPC).
    code = """
import time
chunk = b"x" * (1 << 20)
with open("/hoard", "wb") as f:
    for _ in range(160):
        f.write(chunk)
        f.flush()
time.sleep(30)
print("survived")
"""
    result = guest(env, code, "--scratch-mb", "128")
    assert result.returncode == 1, console(result)
    assert result.stderr.endswith(b"error: Guest aborted: 1 \n")
    assert "survived" not in console(result)


# ---------------------------------------------------------------------------------------------
# fault injection

WRITE_TO_MOUNT = "open('/out/ran', 'a').write('x')"


def test_fail_file_fails_exactly_that_many_runs_before_the_guest(
    fresh_env: dict[str, str], tmp_path: Path
) -> None:
    env = fresh_env
    guest(env, "pass", "--cold")  # the image is pulled: see the test of the failure's order
    out = tmp_path / "out"
    out.mkdir()
    fail_file = tmp_path / "fail"
    fail_file.write_text("2")
    failing = {
        **env,
        "HLUK_STANDIN_FAIL_FILE": str(fail_file),
        "HLUK_STANDIN_FAIL_MESSAGE": "the node is out of guests",
    }
    for _ in range(2):
        result = guest(failing, WRITE_TO_MOUNT, "--mount", f"{out}:/out")
        assert (result.returncode, result.stdout) == (1, b"")
        assert result.stderr == b"error: the node is out of guests\n"
        assert not (out / "ran").exists()
        assert snapshot_slots(failing) == []
    result = guest(failing, WRITE_TO_MOUNT, "--mount", f"{out}:/out")
    assert (result.returncode, result.stderr) == (0, b"")
    assert (out / "ran").read_text() == "x"


def test_hang_hangs_before_the_guest_starts(env: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        guest(
            {**env, "HLUK_STANDIN_HANG": "1"},
            WRITE_TO_MOUNT,
            "--mount",
            f"{tmp_path}:/out",
            timeout=1,
        )
    assert not (tmp_path / "ran").exists()


def test_hang_file_hangs_the_next_n_runs_then_none(env: dict[str, str], tmp_path: Path) -> None:
    counter = tmp_path / "hang"
    counter.write_text("1")
    out = tmp_path / "out"
    out.mkdir()
    hanging = {**env, "HLUK_STANDIN_HANG_FILE": str(counter)}
    # The first run is watched until it has taken its count: a run killed on a timer could be
    # killed, on a loaded machine, before it read the file, and leave the count to the next.
    first = subprocess.Popen(
        [env["HLUK_PATH"], "run", "--mount", f"{out}:/out", "--exec", WRITE_TO_MOUNT],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **hanging},
    )
    try:
        deadline = time.monotonic() + 60
        while counter.read_text() != "0" and first.poll() is None:
            assert time.monotonic() < deadline, "the first run never took its count"
            time.sleep(0.02)
        time.sleep(0.5)
        assert first.poll() is None, "the first run ended instead of hanging"
    finally:
        first.kill()
        first.wait()
    assert not (out / "ran").exists()
    result = guest(hanging, WRITE_TO_MOUNT, "--mount", f"{out}:/out")
    assert (result.returncode, result.stderr) == (0, b"")
    assert (out / "ran").read_text() == "x"


def test_kill_after_kills_a_running_guest(env: dict[str, str]) -> None:
    code = "import time\ntime.sleep(30)\nprint('survived')"
    result = guest({**env, "HLUK_STANDIN_KILL_AFTER": "0.5"}, code)
    assert result.returncode == 137
    assert result.stderr == b"error: the guest exited with status 137\n"
    assert "survived" not in console(result)


def faulty(env: dict[str, str], log: Path, faults: str) -> dict[str, str]:
    return {**env, "HLUK_STANDIN_FAULTS": faults, "HLUK_STANDIN_FAULT_LOG": str(log)}


def fault_log(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def case_dir(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A mount source with a file (and a directory, which is not listed), and the digests of
    its regular files."""
    source = tmp_path / "case"
    (source / "sub").mkdir(parents=True)
    (source / "solution.py").write_bytes(b"print(1)  # case 7\n")
    digest = hashlib.sha256(b"print(1)  # case 7\n").hexdigest()
    return source, {"solution.py": digest}


def test_a_drawn_fail_fault_fails_before_the_guest_and_is_logged_with_the_mounts_files(
    env: dict[str, str], tmp_path: Path
) -> None:
    source, digests = case_dir(tmp_path)
    log = tmp_path / "faults.jsonl"
    mount = ["--mount", f"{source}:/case", "--mount", f"{tmp_path / 'out'}:/out"]
    (tmp_path / "out").mkdir()
    result = guest(faulty(env, log, "seed=3,fail=1"), WRITE_TO_MOUNT, *mount)
    assert (result.returncode, result.stdout) == (1, b"")
    assert result.stderr == b"error: injected failure\n"
    assert not (tmp_path / "out" / "ran").exists()
    [line] = fault_log(log)
    assert line["kind"] == "fail"
    assert line["mounts"] == {str(source): digests, str(tmp_path / "out"): {}}


def test_a_drawn_hang_fault_hangs_before_the_guest_and_is_logged(
    env: dict[str, str], tmp_path: Path
) -> None:
    source, digests = case_dir(tmp_path)
    log = tmp_path / "faults.jsonl"
    argv = [env["HLUK_PATH"], "run", "--mount", f"{source}:/case", "--exec", "print('ran')"]
    # Waited for by its log, not a fixed time: a loaded machine's start can take seconds.
    hung = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **faulty(env, log, "hang=1")},
    )
    try:
        assert wait_for(lambda: fault_log(log), limit=60)
        time.sleep(1)
        assert hung.poll() is None  # it hangs
    finally:
        hung.kill()
        hung.communicate()
    [line] = fault_log(log)
    assert (line["kind"], line["mounts"]) == ("hang", {str(source): digests})


@pytest.mark.parametrize(
    "code",
    ["import time\ntime.sleep(30)\nprint('survived')", "print('quick')"],
    ids=["mid-run", "a-quick-guest"],
)
def test_a_drawn_die_fault_kills_hluk_and_its_guest_after_the_guest_starts(
    env: dict[str, str], tmp_path: Path, code: str
) -> None:
    source, digests = case_dir(tmp_path)
    log = tmp_path / "faults.jsonl"
    result = guest(faulty(env, log, "die=1"), code, "--mount", f"{source}:/case")
    assert result.returncode == -signal.SIGKILL
    assert b"survived" not in result.stdout and result.stderr == b""
    [line] = fault_log(log)
    assert (line["kind"], line["mounts"]) == ("die", {str(source): digests})


def test_faults_are_drawn_per_run_and_only_the_injected_ones_are_logged(
    env: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "faults.jsonl"
    out = tmp_path / "out"
    failed = 0
    for run_number in range(16):
        out.mkdir()
        result = guest(
            faulty(env, log, "seed=5,fail=0.5"), WRITE_TO_MOUNT, "--mount", f"{out}:/out"
        )
        ran = (out / "ran").exists()
        assert (result.returncode, ran) in ((0, True), (1, False)), run_number
        failed += not ran
        shutil.rmtree(out)
    # All 16 alike would mean nothing was drawn per run (a chance of 1 in 32,768).
    assert 0 < failed < 16
    assert [line["kind"] for line in fault_log(log)] == ["fail"] * failed


@pytest.mark.parametrize("faults", ["fail=2", "crash=0.1", "fail=0.6,hang=0.6", "fail=x"])
def test_an_invalid_faults_setting_is_an_error_line(env: dict[str, str], faults: str) -> None:
    result = guest({**env, "HLUK_STANDIN_FAULTS": faults}, "print('ran')")
    assert (result.returncode, result.stdout) == (1, b"")
    assert result.stderr.startswith(b"error: HLUK_STANDIN_FAULTS: ")


def test_a_slow_console_holds_the_guests_writes_back(env: dict[str, str]) -> None:
    # The guest times its own writes: with the console passing 256 KiB/s, 1 MiB cannot leave
    # the guest faster than the console takes it, less what the pty holds (well under 256 KiB).
    rate, size = 256 * 1024, 1024 * 1024
    code = (
        "import os, sys, time\n"
        "started = time.monotonic()\n"
        f"os.write(1, b'x' * {size})\n"
        "os.write(2, b'\\n%.6f\\n' % (time.monotonic() - started))\n"
    )
    result = guest({**env, "HLUK_STANDIN_CONSOLE_BYTES_PER_SECOND": str(rate)}, code)
    assert result.returncode == 0, result.stderr
    took = float(console(result).split()[-1])
    assert took >= (size - rate) / rate


def test_argv_log_records_each_argv_as_a_json_line(env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "argv.jsonl"
    logging = {**env, "HLUK_STANDIN_ARGV_LOG": str(log)}
    run_standin(logging, "--version")
    guest(logging, "print(1)", "--env", "A=b c")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines == [["--version"], ["run", "--env", "A=b c", "--exec", "print(1)"]]


def test_standin_variables_never_reach_the_guest(env: dict[str, str], tmp_path: Path) -> None:
    fail_file = tmp_path / "fail"
    fail_file.write_text("0")
    standin_vars = {
        "HLUK_STANDIN_VERSION": "0.19.9",
        "HLUK_STANDIN_FAIL_FILE": str(fail_file),
        "HLUK_STANDIN_FAIL_MESSAGE": "unused",
        "HLUK_STANDIN_KILL_AFTER": "60",
        "HLUK_STANDIN_ARGV_LOG": str(tmp_path / "argv.jsonl"),
        "HLUK_STANDIN_SAVE_SECONDS": "0",
        "HLUK_STANDIN_RESTORE_SECONDS": "0",
        "HLUK_STANDIN_FAULTS": "seed=1,fail=0",
        "HLUK_STANDIN_FAULT_LOG": str(tmp_path / "faults.jsonl"),
    }
    hluk_vars = {"HLUK_PROFILE": "0", "HLUK_IMAGE_VERSION": "0.19.9"}
    # Another version is another image, pulled on first use: its lines are on stderr.
    result = guest({**env, **standin_vars, **hluk_vars}, "import os\nprint(dict(os.environ))")
    assert (result.returncode, console(result)) == (0, f"{{'PATH': {GUEST_PATH!r}}}\n")


# ---------------------------------------------------------------------------------------------
# a failed call, and a guest that exits


@pytest.mark.parametrize(
    ("code", "status", "shown"),
    [
        ("import sys\nsys.exit(3)", 3, ""),
        ("raise SystemExit(-1)", 255, ""),
        ("import sys\nsys.exit('bye')", 1, "bye\n"),
        ("raise KeyError('k')", 1, "KeyError: 'k'\n"),
    ],
    ids=["exit-3", "exit-minus-1", "exit-message", "exception"],
)
def test_a_failed_call_exits_silently_with_its_status(
    env: dict[str, str], code: str, status: int, shown: str
) -> None:
    result = guest(env, "print('before')\n" + code)
    assert (result.returncode, result.stderr) == (status, b"")
    text = console(result)
    assert text.startswith("before\n")
    assert text.endswith(shown + CALL_FAILED)
    assert text.count(CALL_FAILED) == 1


def test_a_guest_process_ending_with_status_0_is_still_an_error_line(env: dict[str, str]) -> None:
    result = guest(env, "import os\nos._exit(0)")
    assert (result.returncode, result.stdout) == (0, b"")
    assert result.stderr == b"error: the guest exited with status 0\n"


# ---------------------------------------------------------------------------------------------
# pulling images


def test_first_use_of_a_runtime_pulls_its_image_with_two_lines_on_stderr(
    fresh_env: dict[str, str],
) -> None:
    first = guest(fresh_env, "print('ran')")
    assert (first.returncode, console(first)) == (0, "ran\n")
    assert_lines(first.stderr.decode(), pulled_lines(IMAGE))
    image = cache_of(fresh_env) / IMAGE_PATH
    assert image.is_file()
    assert image.with_name(image.name + ".digest").is_file()
    again = guest(fresh_env, "print('ran')")
    assert (again.returncode, again.stderr) == (0, b"")


def test_pull_lines_are_printed_at_every_log_level(fresh_env: dict[str, str]) -> None:
    result = run_standin(fresh_env, "--log-level", "error", "run", "--exec", "pass")
    assert result.returncode == 0
    assert_lines(result.stderr.decode(), pulled_lines(IMAGE))


def test_an_image_without_its_digest_file_is_pulled_again(fresh_env: dict[str, str]) -> None:
    info_log(fresh_env)
    image = cache_of(fresh_env) / IMAGE_PATH
    image.with_name(image.name + ".digest").unlink()
    result = guest(fresh_env, "pass")
    assert result.returncode == 0
    assert_lines(result.stderr.decode(), pulled_lines(IMAGE))


def test_hluk_registry_and_image_version_choose_the_image_and_so_its_snapshot(
    fresh_env: dict[str, str],
) -> None:
    assert "restored=false" in info_log(fresh_env)
    custom = {
        **fresh_env,
        "HLUK_REGISTRY": "https://registry.example:5000/team/",
        "HLUK_IMAGE_VERSION": " v0.20.1 ",
    }
    log = info_log(custom)
    assert log.splitlines()[0] == "pulling registry.example:5000/team/python:initrd-v0.20.1..."
    assert "restored=false" in log
    assert (cache_of(fresh_env) / "rootfs/registry.example_5000/team/python").is_dir()
    assert "restored=true" in info_log(custom)
    # A blank HLUK_IMAGE_VERSION is no version: the default image, and its snapshot.
    assert "restored=true" in info_log({**fresh_env, "HLUK_IMAGE_VERSION": "  "})


@pytest.mark.parametrize(
    ("reference", "path"),
    [
        (
            f"ghcr.io/acme/images/python@sha256:{'ab' * 32}",
            f"ghcr.io/acme/images/python/sha256_{'ab' * 32}.cpio",
        ),
        ("localhost:5000/python:dev", "localhost_5000/python/dev.cpio"),
        ("registry.example/agent", "registry.example/agent/latest.cpio"),
    ],
    ids=["digest", "port", "no-tag"],
)
def test_a_full_image_reference_is_pulled_as_named_to_its_own_path(
    fresh_env: dict[str, str], reference: str, path: str
) -> None:
    result = guest(fresh_env, "print('ran')", "--runtime", reference)
    assert (result.returncode, console(result)) == (0, "ran\n")
    shown = reference if ":" in reference.rsplit("/", 1)[-1] else reference + ":latest"
    assert_lines(result.stderr.decode(), pulled_lines(shown))
    assert (cache_of(fresh_env) / "rootfs" / path).is_file()


def test_version_is_printed_verbatim_for_a_pre_release_and_tags_the_image(
    fresh_env: dict[str, str],
) -> None:
    rc = {**fresh_env, "HLUK_STANDIN_VERSION": "0.19.0-rc1"}
    version = run_standin(rc, "--version")
    assert (version.returncode, version.stdout, version.stderr) == (0, b"hluk 0.19.0-rc1\n", b"")
    result = guest(rc, "pass")
    assert result.returncode == 0
    image = "ghcr.io/hyperlight-dev/hyperlight-unikraft/python:initrd-v0.19.0-rc1"
    assert_lines(result.stderr.decode(), pulled_lines(image))


def test_an_injected_failure_comes_after_the_pull_and_is_the_last_line(
    fresh_env: dict[str, str], tmp_path: Path
) -> None:
    fail_file = tmp_path / "fail"
    fail_file.write_text("1")
    failing = {
        **fresh_env,
        "HLUK_STANDIN_FAIL_FILE": str(fail_file),
        "HLUK_STANDIN_FAIL_MESSAGE": "cannot open /dev/kvm: Permission denied (os error 13)",
    }
    result = run_standin(failing, "--log-level", "info", "run", "--exec", "print('ran')")
    assert (result.returncode, result.stdout) == (1, b"")
    error = re.escape("error: cannot open /dev/kvm: Permission denied (os error 13)")
    assert_lines(plain(result.stderr), [*pulled_lines(IMAGE), error])


def test_hang_comes_after_the_pull(fresh_env: dict[str, str], tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [fresh_env["HLUK_PATH"], "run", "--mount", f"{tmp_path}:/out", "--exec", WRITE_TO_MOUNT],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **fresh_env, "HLUK_STANDIN_HANG": "1"},
    )
    assert proc.stderr is not None
    try:
        seen = read_until(proc.stderr.fileno(), b" s\n", 30)
        assert_lines(seen.decode(), pulled_lines(IMAGE))
        time.sleep(0.5)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert not (tmp_path / "ran").exists()


# ---------------------------------------------------------------------------------------------
# logs, the profile and the last line


LOG_LINE = re.compile(
    r"\x1b\[2m(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)\x1b\[0m "
    r"\x1b\[(?P<colour>\d+)m(?P<level>[ A-Z]{5})\x1b\[0m (?P<rest>.*)"
)


def test_logs_are_tracing_lines_coloured_even_on_a_pipe(fresh_env: dict[str, str]) -> None:
    guest(fresh_env, "pass", "--cold")  # pulled before
    result = run_standin(fresh_env, "--log-level", "info", "run", "--exec", "pass")
    assert result.returncode == 0
    lines = result.stderr.decode().splitlines()
    matches = [LOG_LINE.fullmatch(line) for line in lines]
    assert all(matches), lines
    now = datetime.now(timezone.utc)
    for match in matches:
        assert match is not None
        stamp = datetime.strptime(match["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
        assert abs(stamp.replace(tzinfo=timezone.utc) - now) < timedelta(minutes=1)
        assert (match["colour"], match["level"]) == ("32", " INFO")
    slot = snapshot_slots(fresh_env)[0]
    assert_lines(
        "\n".join(ANSI.sub("", match["rest"]) for match in matches if match),
        [
            r"boot elapsed_ms=\d+\.\d restored=false",
            rf"warm snapshot saved elapsed_ms=\d+\.\d path={re.escape(str(slot))} pruned=0",
        ],
    )


def test_no_color_turns_the_log_colours_off(env: dict[str, str]) -> None:
    result = run_standin({**env, "NO_COLOR": "1"}, "--log-level", "info", "run", "--exec", "pass")
    assert result.returncode == 0
    assert b"\x1b" not in result.stderr
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT[\d:.]+Z  INFO boot elapsed_ms=\d+\.\d restored=(true|false)\n",
        result.stderr.decode(),
    )


def test_nothing_is_logged_without_log_level(fresh_env: dict[str, str]) -> None:
    first = guest(fresh_env, "pass")  # pulls, boots and saves a snapshot: only the pull is said
    assert first.returncode == 0
    assert_lines(first.stderr.decode(), pulled_lines(IMAGE))
    assert guest(fresh_env, "pass").stderr == b""


def test_hluk_profile_prints_a_table_then_the_error_line_last(env: dict[str, str]) -> None:
    result = guest({**env, "HLUK_PROFILE": ""}, "print('x')\nimport os\nos._exit(3)")
    assert result.returncode == 3
    lines = result.stderr.decode().splitlines()
    assert re.fullmatch(
        r"hluk profile \(host side\) +count +total ms +mean µs +max µs +exits", lines[0]
    )
    assert re.fullmatch(r"entry Exec +1 +\d+\.\d{3} +\d+\.\d +\d+\.\d +\d+\.\d", lines[1])
    assert lines[-1] == "error: the guest exited with status 3"


@pytest.mark.parametrize(("setting", "shown"), [("1", True), ("yes", True), ("0", False)])
def test_hluk_profile_is_on_unless_0(env: dict[str, str], setting: str, shown: bool) -> None:
    result = guest({**env, "HLUK_PROFILE": setting}, "print('x')")
    assert (result.returncode, console(result)) == (0, "x\n")
    assert result.stderr.startswith(b"hluk profile (host side)") is shown
    if not shown:
        assert result.stderr == b""


# ---------------------------------------------------------------------------------------------
# the snapshot cache as hluk keeps it

STAMP = re.compile(r"key=(k[0-9a-f]{16}-c\d+)\n")


def expected_stamp(key: str, rootfs: Path, scratch_mb: int, warm_exec: str = "") -> str:
    meta = rootfs.stat()
    return (
        f"key={key}\nrootfs={rootfs.resolve()}\nsize={meta.st_size}\nmtime={meta.st_mtime_ns}\n"
        f"scratch_mb={scratch_mb}\nentry=\nwarm_exec={warm_exec}\n"
    )


def test_a_snapshot_slot_is_named_by_the_hash_of_hluks_stamp(fresh_env: dict[str, str]) -> None:
    warm_exec = "import json\nimport re"
    info_log(fresh_env, "--warm-exec", warm_exec)
    [slot] = snapshot_slots(fresh_env)
    stamp = (slot / "stamp").read_text()
    key = STAMP.match(stamp)
    assert key is not None, stamp
    assert stamp == expected_stamp(key[1], cache_of(fresh_env) / IMAGE_PATH, 256, warm_exec)
    assert slot.name == hashlib.sha256(stamp.encode()).hexdigest()[:16]
    assert sorted(p.name for p in slot.iterdir()) == ["stamp", "state.json"]
    assert [p.name for p in slot.parent.iterdir()] == [slot.name]  # no .part left


def test_a_warm_initrd_snapshot_is_stamped_with_the_initrd_file(
    fresh_env: dict[str, str], tmp_path: Path
) -> None:
    initrd = tmp_path / "rootfs.cpio"
    initrd.write_bytes(b"070701")
    info_log(fresh_env, "--initrd", str(initrd), "--warm", "--scratch-mb", "300")
    [slot] = snapshot_slots(fresh_env)
    stamp = (slot / "stamp").read_text()
    key = STAMP.match(stamp)
    assert key is not None
    assert stamp == expected_stamp(key[1], initrd, 300)


def test_a_snapshot_whose_state_cannot_be_loaded_boots_fresh_and_says_so(
    fresh_env: dict[str, str],
) -> None:
    info_log(fresh_env)
    [slot] = snapshot_slots(fresh_env)
    (slot / "state.json").write_text("{")
    log = info_log(fresh_env)
    assert "cached warm snapshot cannot be used; booting fresh" in log
    assert "restored=false" in log
    assert "warm snapshot saved" in log
    assert "restored=true" in info_log(fresh_env)


def test_a_rebuilt_rootfs_prunes_the_snapshots_of_its_earlier_file(
    fresh_env: dict[str, str], tmp_path: Path
) -> None:
    initrd, other = tmp_path / "rootfs.cpio", tmp_path / "other.cpio"
    initrd.write_bytes(b"070701")
    other.write_bytes(b"070701")
    info_log(fresh_env, "--initrd", str(initrd), "--warm")
    info_log(fresh_env, "--initrd", str(initrd), "--warm", "--scratch-mb", "512")
    info_log(fresh_env, "--initrd", str(other), "--warm")
    assert "restored=true" in info_log(fresh_env, "--initrd", str(initrd), "--warm")
    assert len(snapshot_slots(fresh_env)) == 3
    initrd.write_bytes(b"0707010")  # rebuilt: the snapshots of the earlier file never match again
    log = info_log(fresh_env, "--initrd", str(initrd), "--warm")
    assert "restored=false" in log
    assert "pruned=2" in log
    rootfs_of = [(s / "stamp").read_text().splitlines()[1] for s in snapshot_slots(fresh_env)]
    assert sorted(rootfs_of) == sorted([f"rootfs={initrd.resolve()}", f"rootfs={other.resolve()}"])


def test_an_image_pulled_again_prunes_the_snapshots_of_the_earlier_file(
    fresh_env: dict[str, str],
) -> None:
    info_log(fresh_env)
    image = cache_of(fresh_env) / IMAGE_PATH
    image.with_name(image.name + ".digest").unlink()
    log = info_log(fresh_env)
    assert "restored=false" in log
    assert "pruned=1" in log
    assert len(snapshot_slots(fresh_env)) == 1


def test_two_first_runs_of_one_snapshot_can_break_each_others_save(
    fresh_env: dict[str, str], tmp_path: Path
) -> None:
    # hluk writes a snapshot into <slot>.part, a fixed name with no lock: a second first run,
    # starting while the first writes, removes the first one's directory and writes its own
    # there; the first moves it into place, and the second finds no directory left to finish
    # its own, and fails before its workload.
    racing = {**fresh_env, "HLUK_STANDIN_SAVE_SECONDS": "3"}
    assert guest(racing, "pass", "--cold").returncode == 0  # pulled, no snapshot yet
    out = tmp_path / "out"
    out.mkdir()
    snapshots = Path(fresh_env["HLUK_CACHE_DIR"]) / "snapshots"

    def first_run(i: int) -> subprocess.Popen[bytes]:
        argv = ["run", "--mount", f"{out}:/out", "--exec", f"open('/out/ran-{i}', 'w')"]
        return subprocess.Popen(
            [racing["HLUK_PATH"], *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **racing},
        )

    first = first_run(0)
    deadline = time.monotonic() + 30
    while not list(snapshots.glob("*.part")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list(snapshots.glob("*.part")), "the first run never began its save"
    second = first_run(1)
    assert first.communicate(timeout=60) == (b"", b"") and first.returncode == 0
    stdout, stderr = second.communicate(timeout=60)
    assert (second.returncode, stdout) == (1, b""), stderr
    last = stderr.decode().splitlines()[-1]
    assert last == "error: No such file or directory (os error 2)"
    assert (out / "ran-0").exists() and not (out / "ran-1").exists()
    assert "restored=true" in info_log(fresh_env)


HASH_PROBE = "print(hash('abc'), hash(b'abc'), list({'a', 'b', 'c', 'd', 'e', 'f'}))"


def test_every_run_of_a_snapshot_has_its_string_hash_seed(fresh_env: dict[str, str]) -> None:
    runs = {console(guest(fresh_env, HASH_PROBE)) for _ in range(3)}  # a boot, two restores
    assert len(runs) == 1
    other_snapshot = {console(guest(fresh_env, HASH_PROBE, "--warm-exec", "pass"))}
    assert other_snapshot != runs


def test_cold_runs_have_a_fresh_string_hash_seed(fresh_env: dict[str, str]) -> None:
    runs = {console(guest(fresh_env, HASH_PROBE, "--cold")) for _ in range(3)}
    assert len(runs) == 3


RANDOM_PROBE = "import random\nprint(random.getrandbits(64))"


def test_random_imported_by_the_warm_exec_is_frozen_in_the_snapshot(
    fresh_env: dict[str, str],
) -> None:
    runs = [console(guest(fresh_env, RANDOM_PROBE, "--warm-exec", "import random")) for _ in "abc"]
    assert len(set(runs)) == 1, runs


def test_random_imported_by_the_workload_is_fresh_in_every_run(fresh_env: dict[str, str]) -> None:
    runs = {console(guest(fresh_env, RANDOM_PROBE)) for _ in range(3)}
    assert len(runs) == 3


def test_a_workload_that_reseeds_random_gets_fresh_numbers(fresh_env: dict[str, str]) -> None:
    code = "random.seed()\n" + RANDOM_PROBE
    runs = {console(guest(fresh_env, code, "--warm-exec", "import random")) for _ in range(3)}
    assert len(runs) == 3


def test_the_agent_driver_imports_random_before_the_snapshot(fresh_env: dict[str, str]) -> None:
    runs = [console(guest(fresh_env, RANDOM_PROBE, "--runtime", "agent")) for _ in range(3)]
    assert len(set(runs)) == 1, runs


def test_os_urandom_is_fresh_in_every_restore(fresh_env: dict[str, str]) -> None:
    code = "import os\nprint(os.urandom(16).hex())"
    runs = {console(guest(fresh_env, code, "--warm-exec", "import os")) for _ in range(3)}
    assert len(runs) == 3


@pytest.mark.parametrize(
    ("flags", "left"),
    [([], []), (["--snapshots"], ["rootfs"]), (["--rootfs"], ["snapshots"])],
    ids=["both", "snapshots", "rootfs"],
)
def test_cache_clean_removes_the_snapshots_and_or_the_images(
    fresh_env: dict[str, str], flags: list[str], left: list[str]
) -> None:
    info_log(fresh_env)
    (cache_of(fresh_env) / "snapshots" / "0123456789abcdef.part").mkdir()  # a killed run's
    result = run_standin(fresh_env, "cache", "clean", *flags)
    assert (result.returncode, result.stdout) == (0, b"")
    assert re.fullmatch(rb"removed \d+\.\d MiB\n", result.stderr)
    assert sorted(p.name for p in cache_of(fresh_env).iterdir()) == left


def test_cache_ls_lists_the_images_and_the_snapshots(fresh_env: dict[str, str]) -> None:
    info_log(fresh_env, "--warm-exec", "import json")
    [slot] = snapshot_slots(fresh_env)
    result = run_standin(fresh_env, "cache", "ls")
    assert (result.returncode, result.stderr) == (0, b"")
    assert_lines(
        result.stdout.decode(),
        [
            re.escape(f"cache: {cache_of(fresh_env)}"),
            "",
            re.escape("rootfs images (1)"),
            rf"  {re.escape(IMAGE_PATH)}  \d+\.\d MiB",
            "",
            re.escape("warm snapshots (1)"),
            rf"  snapshots/{slot.name}  \d+\.\d MiB  rootfs={re.escape(IMAGE_PATH)} "
            r'scratch_mb=256 warm_exec="import json"',
        ],
    )
    assert run_standin(fresh_env, "cache").stdout == result.stdout


# ---------------------------------------------------------------------------------------------
# --mount as hluk parses it


def test_a_mount_without_a_colon_is_refused_before_anything_else(
    fresh_env: dict[str, str], tmp_path: Path
) -> None:
    result = guest(fresh_env, "pass", "--mount", str(tmp_path))
    assert (result.returncode, result.stdout) == (1, b"")
    message = f'error: invalid --mount "{tmp_path}": expected HOST:GUEST[:ro]\n'
    assert result.stderr.decode() == message
    assert not cache_of(fresh_env).exists()  # nothing pulled


BAD_GUEST_PATHS = {
    "relative": ("{dir}:data", "data"),
    "whitespace": ("{dir}:/da ta", "/da ta"),
    "brackets": ("{dir}:/data[0]", "/data[0]"),
    "colon": ("{dir}:/a:b", "/a:b"),
    "rw-suffix": ("{dir}:/data:rw", "/data:rw"),
    "upper-case-ro": ("{dir}:/data:RO", "/data:RO"),
    "empty": ("{dir}::ro", ""),
    "colon-in-host": ("{dir}/a:b/case:/case:ro", "b/case:/case"),
}


@pytest.mark.parametrize(("mount", "guest_path"), BAD_GUEST_PATHS.values(), ids=BAD_GUEST_PATHS)
def test_an_unusable_guest_mount_path_fails_at_boot_after_the_pull(
    fresh_env: dict[str, str], tmp_path: Path, mount: str, guest_path: str
) -> None:
    result = guest(fresh_env, "print('ran')", "--mount", mount.format(dir=tmp_path))
    assert (result.returncode, result.stdout) == (1, b"")
    error = (
        f'error: guest mount path "{guest_path}" must be absolute and contain no whitespace, '
        "':' or brackets (it is passed to the kernel in its vfs.fstab list)"
    )
    assert_lines(result.stderr.decode(), [*pulled_lines(IMAGE), re.escape(error)])
    assert snapshot_slots(fresh_env) == []


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("absent", "No such file or directory (os error 2)"),
        ("file", "Not a directory (os error 20)"),
    ],
)
def test_a_host_directory_that_cannot_be_opened_fails_at_boot(
    env: dict[str, str], tmp_path: Path, name: str, why: str
) -> None:
    (tmp_path / "file").write_text("not a directory")
    host = tmp_path / name
    result = guest(env, "print('ran')", "--mount", f"{host}:/data:ro")
    assert (result.returncode, result.stdout) == (1, b"")
    message = f"error: cannot open the host directory {host} for the guest mount /data: {why}\n"
    assert result.stderr.decode() == message


def test_a_relative_host_path_is_relative_to_hluks_working_directory(
    env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "in.txt").write_text("found")
    result = subprocess.run(
        [
            env["HLUK_PATH"],
            "run",
            "--mount",
            "sub:/data:ro",
            "--exec",
            "print(open('/data/in.txt').read())",
        ],
        input=b"",
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, **env},
    )
    assert (result.returncode, console(result), result.stderr) == (0, "found\n", b"")


# ---------------------------------------------------------------------------------------------
# a hluk that dies of a signal


@pytest.mark.parametrize("name", ["BUS", "SEGV", "KILL"])
def test_standin_signal_kills_hluk_with_it_after_the_pull(
    fresh_env: dict[str, str], tmp_path: Path, name: str
) -> None:
    dying = {**fresh_env, "HLUK_STANDIN_SIGNAL": name}
    result = guest(dying, WRITE_TO_MOUNT, "--mount", f"{tmp_path}:/out")
    assert result.returncode == -getattr(signal, f"SIG{name}")
    assert result.stdout == b""
    assert_lines(result.stderr.decode(), pulled_lines(IMAGE))
    assert not (tmp_path / "ran").exists()


# ---------------------------------------------------------------------------------------------
# the environment the stand-in is started with


@pytest.mark.parametrize("cache_variable", ["HLUK_CACHE_DIR", "XDG_CACHE_HOME"])
def test_the_standin_runs_with_only_path_home_and_hluk_variables(
    env: dict[str, str], tmp_path: Path, cache_variable: str
) -> None:
    minimal = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": os.environ.get("HOME", str(Path.home())),
        cache_variable: str(tmp_path / "cache"),
        "HLUK_STANDIN_BWRAP": env["HLUK_STANDIN_BWRAP"],
        "HLUK_STANDIN_PULL_SECONDS": "0",
    }
    result = subprocess.run(
        [env["HLUK_PATH"], "run", "--exec", "import sys\nprint(sys.executable)"],
        input=b"",
        capture_output=True,
        timeout=60,
        env=minimal,
    )
    assert result.returncode == 0, result.stderr.decode()
    assert console(result) == guest_python.find_python() + "\n"
    assert_lines(result.stderr.decode(), pulled_lines(IMAGE))
    assert list((tmp_path / "cache").rglob("stamp"))


def test_the_guest_runs_the_interpreter_guest_python_chooses(env: dict[str, str]) -> None:
    assert guest_value(env, "sys.executable") == guest_python.find_python()


def test_the_guests_import_path_holds_no_current_directory(env: dict[str, str]) -> None:
    # hluk's driver puts no directory of its own on sys.path, as `python -c` puts "".
    assert guest_value(env, "[p for p in sys.path if p in ('', '.', os.getcwd())]") == []
