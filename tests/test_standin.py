"""The stand-in hluk's contract (docs/hluk.md), pinned so that it never becomes kinder than hluk.

Each test runs the stand-in as the project runs hluk and asserts what a caller can observe: its
stdout (the guest console), its stderr (hluk's own messages), its exit status and the cache.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import run_standin

GUEST_PATH = "/usr/local/bin:/usr/bin:/bin"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_inherited_fault_injection(monkeypatch: pytest.MonkeyPatch) -> None:
    # run_standin passes this process's environment on: a stray HLUK_STANDIN_* must not leak in.
    for name in list(os.environ):
        if name.startswith("HLUK_STANDIN_"):
            monkeypatch.delenv(name)


@pytest.fixture
def env(standin_env: dict[str, str]) -> dict[str, str]:
    """The shared stand-in, with boot and pull delays removed where they are irrelevant."""
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


def info_log(env: dict[str, str], *flags: str) -> str:
    """hluk's stderr for a trivial workload at --log-level info."""
    result = run_standin(env, "--log-level", "info", "run", *flags, "--exec", "pass")
    assert result.returncode == 0, result.stderr.decode()
    return result.stderr.decode()


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
    "mount-relative-guest-path": ["run", "--mount", "{dir}:data", "--exec", "pass"],
    "mount-whitespace": ["run", "--mount", "{dir}:/da ta", "--exec", "pass"],
    "mount-brackets": ["run", "--mount", "{dir}:/data[0]", "--exec", "pass"],
    "mount-colon": ["run", "--mount", "{dir}:/a:b", "--exec", "pass"],
    "mount-without-guest": ["run", "--mount", "{dir}", "--exec", "pass"],
    "mount-missing-source": ["run", "--mount", "{dir}/absent:/data", "--exec", "pass"],
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
    assert (result.returncode, console(result), result.stderr) == (status, shown, b"")


def test_uncaught_exception_prints_a_string_traceback_and_exits_1(env: dict[str, str]) -> None:
    result = guest(env, "def fail():\n    raise ValueError('boom')\nfail()")
    text = console(result)
    assert (result.returncode, result.stderr) == (1, b"")
    assert text.startswith("Traceback (most recent call last):\n")
    assert 'File "<string>", line 3, in <module>' in text
    assert 'File "<string>", line 2, in fail' in text
    assert text.endswith("ValueError: boom\n")
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
    assert console(result).splitlines()[-1] == "100001 50000"


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
    assert "restored" not in info_log(fresh_env, "--initrd", str(initrd))
    assert "restored=false" in info_log(fresh_env, "--initrd", str(initrd), "--warm")
    assert "restored=true" in info_log(fresh_env, "--initrd", str(initrd), "--warm")


def test_cold_runs_never_restore(fresh_env: dict[str, str]) -> None:
    info_log(fresh_env)
    assert "restored" not in info_log(fresh_env, "--cold")
    assert "restored" not in info_log(fresh_env, "--cold")


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


def test_guest_beyond_its_scratch_memory_is_killed(env: dict[str, str]) -> None:
    code = """
import time
hoard = [b"x" * (16 << 20) for _ in range(40)]
time.sleep(30)
print("survived")
"""
    result = guest(env, code, "--scratch-mb", "128")
    assert result.returncode == 137
    assert result.stderr.endswith(b"error: the guest exited with status 137\n")
    assert "survived" not in console(result)


# ---------------------------------------------------------------------------------------------
# fault injection

WRITE_TO_MOUNT = "open('/out/ran', 'a').write('x')"


def test_fail_file_fails_exactly_that_many_runs_before_the_guest(
    env: dict[str, str], tmp_path: Path
) -> None:
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


def test_kill_after_kills_a_running_guest(env: dict[str, str]) -> None:
    code = "import time\ntime.sleep(30)\nprint('survived')"
    result = guest({**env, "HLUK_STANDIN_KILL_AFTER": "0.5"}, code)
    assert result.returncode == 137
    assert result.stderr == b"error: the guest exited with status 137\n"
    assert "survived" not in console(result)


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
    }
    assert guest_value({**env, **standin_vars}, "dict(os.environ)") == {"PATH": GUEST_PATH}
