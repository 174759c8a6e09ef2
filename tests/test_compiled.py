"""C++, Go and Rust as Sandbox Fusion runs them: compiled on the host in bubblewrap
(case/compiled.py), the program run in the python guest by the runner (guest/runner.py).

Sandbox Fusion's own runner tests (sandbox/tests/runners/test_cpp.py, test_go.py,
test_rust.py: 6, 3 and 5 tests) are restated here as programs of our own doing what each of
theirs does, with their timeouts and their assertions, through run_code and through serve. The
compile timeouts of their Go and Rust timeout tests (1 s) are raised to COMPILE_TIMEOUT here,
so that a loaded CI machine's slow compile does not pass for a failure of the run: their
run_timeout, which the test is about, is theirs.
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hostside import Host, WaitingCase, result, wait_for
from serving import Served

from verl_hyperlight import cancel as cancels
from verl_hyperlight import settings
from verl_hyperlight.case import api, compiled
from verl_hyperlight.case import failures as _failures
from verl_hyperlight.commands import selftest
from verl_hyperlight.errors import Refused

pytestmark = pytest.mark.once

COMPILE_TIMEOUT = 30.0
Check = Callable[[dict[str, Any]], None]


@pytest.fixture
def compiles(host: Host) -> Host:
    """The host fixture: its compile cache is the session's (conftest's standin_env)."""
    return host


def run(
    code: str,
    language: str,
    stdin: str = "",
    run_timeout: float = 10,
    compile_timeout: float = COMPILE_TIMEOUT,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    response, error = api.run_code(
        "hyperlight://", code, stdin, compile_timeout, run_timeout, None, language, cancel=cancel
    )
    assert error is None and response is not None, error
    return response


# --- Sandbox Fusion's runner tests --------------------------------------------------------


@dataclass(frozen=True)
class SfTest:
    name: str
    language: str
    code: str
    check: Check
    stdin: str = ""
    run_timeout: float = 10


def success_printing(text: str) -> Check:
    def check(response: dict[str, Any]) -> None:
        assert response["status"] == "Success", response
        assert response["compile_result"]["status"] == "Finished"
        assert response["run_result"]["stdout"].strip() == text

    return check


def success_echoing(stdout: str) -> Check:
    def check(response: dict[str, Any]) -> None:
        assert response["status"] == "Success", response
        assert response["run_result"]["status"] == "Finished"
        assert response["run_result"]["stdout"] == stdout

    return check


def timed_out(response: dict[str, Any]) -> None:
    assert response["status"] == "Failed", response
    assert response["run_result"]["status"] == "TimeLimitExceeded"


def failed_saying(text: str) -> Check:
    def check(response: dict[str, Any]) -> None:
        assert response["status"] == "Failed", response
        assert response["run_result"]["status"] == "Finished"
        assert text in response["run_result"]["stderr"]

    return check


def compile_error(response: dict[str, Any]) -> None:
    assert response["status"] == "Failed", response
    assert response["compile_result"]["status"] == "Finished"
    assert response["compile_result"]["return_code"] != 0
    assert response["run_result"] is None


def success(response: dict[str, Any]) -> None:
    assert response["status"] == "Success", response
    assert response["run_result"]["status"] == "Finished"


CPP_QUEUE = """
#include <condition_variable>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <thread>
#include <vector>

template <typename T> class Channel {
    std::queue<T> items;
    std::mutex lock;
    std::condition_variable ready;
public:
    void send(T item) {
        { std::lock_guard<std::mutex> held(lock); items.push(std::move(item)); }
        ready.notify_one();
    }
    std::optional<T> receive() {
        std::unique_lock<std::mutex> held(lock);
        ready.wait(held, [this] { return !items.empty(); });
        T item = std::move(items.front());
        items.pop();
        return item;
    }
};

template <typename T, typename Make> void exchange(Make make) {
    Channel<T> channel;
    std::vector<std::thread> threads;
    for (int p = 0; p < 2; p++)
        threads.emplace_back([&] { for (int i = 0; i < 50; i++) channel.send(make(i)); });
    for (int c = 0; c < 2; c++)
        threads.emplace_back([&] { for (int i = 0; i < 50; i++) channel.receive(); });
    for (auto &t : threads) t.join();
}

int main() {
    exchange<int>([](int i) { return i; });
    exchange<std::unique_ptr<int>>([](int i) { return std::make_unique<int>(i); });
}
"""

SF_TESTS = [
    # test_cpp.py
    SfTest(
        "cpp_print",
        "cpp",
        "#include <iostream>\nint main() { std::cout << 123 << std::endl; return 0; }\n",
        success_printing("123"),
        run_timeout=5,
    ),
    SfTest(
        "cpp_timeout",
        "cpp",
        "#include <chrono>\n#include <thread>\nint main() {\n"
        "  std::this_thread::sleep_for(std::chrono::milliseconds(1000));\n}\n",
        timed_out,
        run_timeout=0.5,
    ),
    SfTest(
        "cpp_assertion_error",
        "cpp",
        "#include <cassert>\nint main() {\n  assert(1 == 2);\n  return 0;\n}\n",
        failed_saying("Assertion"),
    ),
    SfTest("cpp_compile_error", "cpp", "int main() { object i = ?; }\n", compile_error),
    SfTest(
        "cpp_stdin",
        "cpp",
        "#include <iostream>\nint main() { int n; std::cin >> n; std::cout << n << std::endl; }\n",
        success_echoing("65535\n"),
        stdin="65535",
        run_timeout=5,
    ),
    SfTest("cpp_pthread", "cpp", CPP_QUEUE, success, run_timeout=2),
    # test_go.py
    SfTest(
        "golang_print",
        "go",
        'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("123")\n}\n',
        success_printing("123"),
    ),
    SfTest(
        "golang_timeout",
        "go",
        'package main\n\nimport "time"\n\nfunc main() {\n\ttime.Sleep(200 * time.Millisecond)\n}\n',
        timed_out,
        run_timeout=0.19,
    ),
    SfTest(
        "golang_stdin",
        "go",
        'package main\n\nimport "fmt"\n\nfunc main() {\n\tvar n int\n\tfmt.Scan(&n)\n'
        "\tfmt.Println(n)\n}\n",
        success_echoing("65535\n"),
        stdin="65535",
        run_timeout=5,
    ),
    # test_rust.py
    SfTest(
        "rust_print",
        "rust",
        'fn main() {\n    println!("123");\n}\n',
        success_printing("123"),
        run_timeout=5,
    ),
    SfTest(
        "rust_timeout",
        "rust",
        "use std::{thread, time};\n\nfn main() {\n"
        "    thread::sleep(time::Duration::from_millis(200));\n}\n",
        timed_out,
        run_timeout=0.1,
    ),
    SfTest(
        "rust_assertion_error",
        "rust",
        "fn main() {\n    assert_eq!(1, 2);\n}\n",
        failed_saying("assertion"),
    ),
    SfTest(
        "rust_compile_error",
        "rust",
        'fn main() {\n    let x: u32 = "Hello, world!";\n}\n',
        compile_error,
    ),
    SfTest(
        "rust_stdin",
        "rust",
        "use std::io;\n\nfn main() {\n    let mut line = String::new();\n"
        "    io::stdin().read_line(&mut line).unwrap();\n"
        "    let n: i32 = line.trim().parse().unwrap();\n"
        '    println!("{}", n);\n}\n',
        success_echoing("65535\n"),
        stdin="65535",
        run_timeout=5,
    ),
]


@pytest.mark.parametrize("test", SF_TESTS, ids=[test.name for test in SF_TESTS])
def test_sandbox_fusions_runner_test_passes_through_run_code(compiles: Host, test: SfTest) -> None:
    test.check(run(test.code, test.language, test.stdin, test.run_timeout))


def test_sandbox_fusions_runner_tests_pass_through_serve(
    compiles: Host, serve: Callable[..., Served]
) -> None:
    served = serve()
    with served.client() as client:
        # The node's Go cache (the session's, warm) is said warm once serve has looked.
        deadline = time.monotonic() + 120
        while (readiness := client.get("/readyz").json())["compiles"] == "warming":
            assert time.monotonic() < deadline, readiness
            time.sleep(0.2)
        assert readiness == {"ready": True, "reason": "ready", "compiles": "warm"}
        for test in SF_TESTS:
            # Every field, as Sandbox Fusion's tests send RunCodeRequest(...).model_dump().
            body = {
                "compile_timeout": COMPILE_TIMEOUT,
                "run_timeout": test.run_timeout,
                "memory_limit_MB": -1,
                "code": test.code,
                "stdin": test.stdin or None,
                "language": test.language,
                "files": {},
                "fetch_files": [],
            }
            reply = client.post("/run_code", json=body)
            assert reply.status_code == 200, reply.text
            test.check(reply.json())


# --- the response, as the service shapes it ----------------------------------------------


def test_a_compile_error_is_the_services_response_with_no_run(compiles: Host) -> None:
    response = run("int main() { return undeclared; }\n", "cpp")
    assert set(response) == {
        "status",
        "message",
        "compile_result",
        "run_result",
        "executor_pod_name",
        "files",
    }
    assert (response["status"], response["message"], response["run_result"]) == ("Failed", "", None)
    compiled_result = response["compile_result"]
    assert set(compiled_result) == {"status", "execution_time", "return_code", "stdout", "stderr"}
    assert compiled_result["status"] == "Finished" and compiled_result["return_code"] == 1
    assert "'undeclared' was not declared" in compiled_result["stderr"]
    assert compiled_result["execution_time"] > 0
    assert compiles.case_runs() == []  # nothing ran in a micro-VM


def test_the_program_gets_stdin_and_its_stdout_stderr_and_status_come_back_apart(
    compiles: Host,
) -> None:
    code = (
        "#include <cstdio>\n#include <iostream>\n#include <string>\n"
        "int main() { std::string line; long total = 0;\n"
        "  while (std::getline(std::cin, line)) total += std::stol(line);\n"
        '  std::cout << "total " << total << "\\n"; std::cerr << "to stderr\\n"; return 7; }\n'
    )
    response = run(code, "cpp", "1\n2\n39\n")
    assert result(response) == ("Failed", "Finished", 7, "total 42\n", "to stderr\n")
    assert response["compile_result"]["return_code"] == 0
    # The run's time is the program's, not the compile's.
    assert response["run_result"]["execution_time"] < response["compile_result"]["execution_time"]


def test_the_cases_of_one_solution_share_one_compile(
    compiles: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As verl sends them: each test case of a solution a request of its own, the same code,
    at once; then the solution's next batch. One compile (case/builds.py), each case its own
    run of the program it built, each answer its compile's compile_result."""
    compiling: list[bytes] = []
    build = compiled.build

    def counted(language: str, code: bytes, *args: Any) -> compiled.Build:
        compiling.append(code)
        return build(language, code, *args)

    monkeypatch.setattr(compiled, "build", counted)
    code = (
        "#include <bits/stdc++.h>\nint main() { long a, b; std::cin >> a >> b;\n"
        '  std::cout << a * b << "\\n"; }\n'
    )
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda n: run(code, "cpp", f"{n} 3\n"), range(8)))
    assert [result(answer)[3] for answer in answers] == [f"{3 * n}\n" for n in range(8)]
    assert len(compiling) == 1
    assert all(answer["compile_result"] == answers[0]["compile_result"] for answer in answers)
    assert len(compiles.case_runs()) == 8
    assert result(run(code, "cpp", "5 5\n"))[3] == "25\n" and len(compiling) == 1
    # Another source compiles; so does a case whose compile_timeout the kept compile took more
    # than (as the service's would, it runs out of time).
    assert result(run(code + "\n", "cpp", "2 2\n"))[3] == "4\n" and len(compiling) == 2
    late = run(code, "cpp", "1 1\n", compile_timeout=0.001)
    assert late["compile_result"]["status"] == "TimeLimitExceeded" and len(compiling) == 3


def test_a_program_killed_by_a_signal_has_its_negative_status(compiles: Host) -> None:
    response = run("#include <cstdlib>\nint main() { std::abort(); }\n", "cpp")
    status, run_status, code, _, _ = result(response)
    assert (status, run_status, code) == ("Failed", "Finished", -signal.SIGABRT)


# A compile that never ends, at no cost: the preprocessor reads a new pseudo-terminal's master
# (the sandbox's own /dev/ptmx), which nothing ever writes to.
NEVER_COMPILES = '#include "/dev/ptmx"\nint main() {}\n'


def test_a_compile_past_its_timeout_is_killed_whole_and_answered_as_the_service_does(
    compiles: Host,
) -> None:
    started = time.monotonic()
    response = run(NEVER_COMPILES, "cpp", compile_timeout=2)
    assert time.monotonic() - started < 15
    assert response["status"] == "Failed" and response["run_result"] is None
    assert response["compile_result"]["status"] == "TimeLimitExceeded"
    assert response["compile_result"]["return_code"] is None
    assert compiles.case_runs() == []
    assert wait_gone("cc1plus")


@pytest.mark.parametrize("kind", ["Cancel", "plain Event"])
def test_a_cancelled_compile_is_killed_and_answered_cancelled(compiles: Host, kind: str) -> None:
    # Its wait sleeps until the compile ends, its deadline or its cancel: a Cancel wakes it,
    # a plain Event is looked at every cancel.POLL_SECONDS (tests/test_cancel.py).
    cancel = cancels.Cancel() if kind == "Cancel" else threading.Event()
    case = WaitingCase(NEVER_COMPILES, cancel, language="cpp", compile_timeout=60)
    assert wait_for(lambda: running("cc1plus"), limit=30)  # it compiles
    woke = case.wake_ups(2.0)
    print(f"\n{kind}: the compiling case's thread woke {woke} times in 2 s")
    if kind == "Cancel":
        assert woke <= 2
    else:
        assert woke >= 2.0 / cancels.POLL_SECONDS / 2
    assert "cancelled" in case.cancelled()
    assert wait_gone("cc1plus")


def wait_gone(name: str, limit: float = 10) -> bool:
    """Whether no process of this test's named `name` is left within `limit` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if not running(name):
            return True
        time.sleep(0.1)
    return False


def running(name: str) -> list[int]:
    """This test's processes named `name`."""
    return [pid for pid in descendants(os.getpid()) if comm(pid) == name]


def descendants(pid: int) -> set[int]:
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != pid:
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                found.add(int(entry))
    for child in list(found):
        found |= descendants(child)
    return found


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


# --- isolation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("cpp", '#include "/etc/passwd"\nint main() {}\n'),
        ("cpp", f'#include "{Path(__file__).resolve()}"\nint main() {{}}\n'),
        ("rust", 'const P: &str = include_str!("/etc/passwd");\nfn main() { print!("{}", P); }\n'),
        (
            "go",
            'package main\n\nimport (\n\t_ "embed"\n\t"fmt"\n)\n\n//go:embed ../../etc/passwd\n'
            "var p string\n\nfunc main() { fmt.Print(p) }\n",
        ),
    ],
    ids=["cpp-include-etc-passwd", "cpp-include-this-test", "rust-include-str", "go-embed"],
)
def test_a_compile_sees_no_host_file(compiles: Host, language: str, code: str) -> None:
    response = run(code, language)
    compile_error(response)
    stderr = response["compile_result"]["stderr"]
    assert "root:" not in stderr and "def test_a_compile_sees_no_host_file" not in stderr


def test_go_reaches_no_network_and_no_module_outside_the_standard_library(compiles: Host) -> None:
    code = (
        'package main\n\nimport "github.com/stretchr/testify/assert"\n\n'
        "func main() { _ = assert.Equal }\n"
    )
    response = run(code, "go")
    compile_error(response)
    assert "github.com/stretchr/testify" in response["compile_result"]["stderr"]


def test_cgo_is_off_so_no_c_compiler_runs_for_go(compiles: Host) -> None:
    code = 'package main\n\n/*\n#include "/etc/passwd"\n*/\nimport "C"\n\nfunc main() {}\n'
    response = run(code, "go")
    compile_error(response)
    assert "root:" not in response["compile_result"]["stderr"]


PROBE = r"""
import os, socket, sys
found = {}
for path in ("/etc/passwd", "/etc/hostname", "/home", "/var", "/x", *sys.argv[2:]):
    found["sees " + path] = os.path.exists(path)
for path in ("/usr/escape", "/etc/escape", "/escape"):
    try:
        open(path, "w").close()
        found["writes " + path] = True
    except OSError:
        found["writes " + path] = False
try:
    open("/build/mine", "w").close()
    found["writes its build directory"] = True
except OSError:
    found["writes its build directory"] = False
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3).close()
    found["reaches the host"] = True
except OSError:
    found["reaches the host"] = False
try:
    socket.getaddrinfo("example.com", 80)
    found["resolves names"] = True
except OSError:
    found["resolves names"] = False
found["environment"] = sorted(os.environ)
found["processes"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print(repr(found))
"""


def test_a_compiler_plugin_or_build_script_could_read_write_and_reach_nothing_of_the_host(
    tmp_path: Path,
) -> None:
    # Whatever a compile runs (a compiler plugin, a build script, a macro) runs as this probe
    # does: in the same sandbox, under the same limits, as the compiler's own process.
    listener = __import__("socket").create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    build = tmp_path / "build"
    build.mkdir()
    (build / "probe.py").write_text(PROBE)
    secret = tmp_path / "beside-the-build"
    secret.write_text("not the compile's")
    # This Python (a venv's is a link to its base): a toolchain outside /usr, as pyenv's is,
    # bound read-only as a toolchain's own root is.
    python = os.path.realpath(sys.executable)
    toolchain = compiled._Toolchain(
        "probe.py",
        (python, "-I", "probe.py", str(port), str(Path(__file__).resolve()), str(secret)),
        roots=(os.path.realpath(sys.base_prefix),),
    )
    argv = compiled._sandbox(compiled._bwrap(need_overlay=False), str(build), toolchain)
    done = subprocess.run(
        [*argv, "prlimit", "--as=2147483648", "--", *toolchain.argv],
        capture_output=True,
        text=True,
        env={"SECRET": "of the host"},
        timeout=60,
    )
    listener.close()
    assert done.returncode == 0, done.stderr
    found = ast.literal_eval(done.stdout)
    assert found.pop("writes its build directory") is True
    # What the sandbox sets; CPython adds LC_CTYPE (its C locale coercion) and PWD itself.
    assert set(found.pop("environment")) - {"LC_CTYPE", "PWD"} == {"HOME", "PATH", "TMPDIR"}
    assert max(found.pop("processes")) < 10  # its own pid namespace: no host process seen
    assert found == {
        "sees /etc/passwd": False,
        "sees /etc/hostname": False,
        "sees /home": False,
        "sees /var": False,
        "sees /x": False,
        f"sees {Path(__file__).resolve()}": False,
        f"sees {secret}": False,
        "writes /usr/escape": False,
        "writes /etc/escape": False,
        "writes /escape": False,
        "reaches the host": False,
        "resolves names": False,
    }
    assert not Path("/usr/escape").exists()


HOSTILE = r"""
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
int main() {
    pid_t child = fork();
    if (child == 0) _exit(0);
    std::printf("fork %s\n", child < 0 ? "refused" : "ran");
    int fd = open("program", O_WRONLY | O_TRUNC);
    std::printf("rewrite its program %s\n", fd < 0 ? "refused" : "done");
    int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(80);
    to.sin_addr.s_addr = htonl(0x01010101);
    bool reached = s >= 0 && connect(s, (sockaddr *)&to, sizeof to) == 0;
    std::printf("network %s\n", reached ? "reached" : "unreachable");
    return 0;
}
"""


def test_a_hostile_program_in_the_guest_forks_nothing_and_reaches_nothing(
    compiles: Host,
) -> None:
    response = run(HOSTILE, "cpp")
    status, run_status, code, stdout, _ = result(response)
    assert (status, run_status, code) == ("Success", "Finished", 0), response
    # fork() is ENOTSUP in hluk's guests (docs/hluk.md), as in the stand-in's.
    assert stdout.splitlines() == [
        "fork refused",
        "rewrite its program refused",
        "network unreachable",
    ]


# --- the node's side ---------------------------------------------------------------------


def test_a_node_without_the_toolchain_says_what_to_install_and_python_still_runs(
    compiles: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    with monkeypatch.context() as patched:
        patched.setenv("PATH", str(bare))
        response = run("int main() {}\n", "cpp")
    assert response["status"] == "SandboxError"
    assert "compiled with g++, which this node lacks" in response["message"]
    assert "apt-get install g++" in response["message"]
    assert _failures.log.counts() == {"toolchain-g++": 1}
    assert result(api.run_code("hyperlight://", "print(5)", "", None, 10, None)[0])[3] == "5\n"  # type: ignore[arg-type]


def test_a_program_that_is_not_a_static_pie_is_refused_by_the_guest(
    compiles: Host, tmp_path: Path
) -> None:
    # What hluk's check_pie refuses of a mounted program (src/cli/mod.rs), the runner refuses
    # of one in the case: here, a program the compile sandbox would never build.
    source = tmp_path / "a.c"
    source.write_text("int main(void) { return 0; }\n")
    program = tmp_path / "a"
    subprocess.run(["gcc", "-no-pie", "-static", str(source), "-o", str(program)], check=True)
    case = api.Case(
        guest=api.guest_for("hyperlight://", None),
        code=program.read_bytes(),
        stdin=b"",
        run_timeout=10,
        program_name="./test",
    )
    with pytest.raises(Refused, match="not position-independent"):
        api._run_case(api.hluk_path(), case, None)


def test_go_warms_its_cache_once_per_node(
    host: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A cache of its own, warmed with a smaller program: the full one is the session's.
    monkeypatch.setenv("VERL_HYPERLIGHT_COMPILE_CACHE_DIR", str(host.cache / "compiles"))
    monkeypatch.setattr(compiled, "GO_WARM_PROGRAM", "package main\n\nfunc main() {}\n")
    caplog.set_level("WARNING", "verl_hyperlight")
    program = 'package main\n\nfunc main() { println("warm") }\n'
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: result(run(program, "go"))[4], range(3)))
    assert answers == ["warm\n"] * 3
    warmed = [r for r in caplog.records if "warming the Go build cache" in r.getMessage()]
    assert len(warmed) == 1
    caches = list((host.cache / "compiles").glob("go-build-*"))
    assert [(cache / ".warm").exists() for cache in caches if cache.is_dir()] == [True]


def test_serve_stopped_while_warming_go_kills_the_build_and_leaves_nothing(
    serve: Callable[..., Served], tmp_path: Path
) -> None:
    # A cold cache of its own: serve is stopped (SIGTERM) while its Go build runs.
    cache = tmp_path / "cold-compiles"
    served = serve(env={"VERL_HYPERLIGHT_COMPILE_CACHE_DIR": str(cache)})
    with served.client() as client:
        deadline = time.monotonic() + 60
        while client.get("/readyz").json()["compiles"] != "warming" or not builds_in(cache):
            assert time.monotonic() < deadline, served.logged()
            time.sleep(0.05)
    assert served.stop() in (0, -signal.SIGTERM)  # uvicorn raises the signal again once done
    # The build is gone with the server (not left to finish as an orphan), and so are the
    # directory it built in and the half-built cache, which the next warm-up rebuilds.
    assert not builds_in(cache), served.logged()
    assert served.case_dirs() == [] and not list(cache.glob(".warming-*"))
    assert not [path for path in cache.glob("go-build-*") if path.is_dir()]


def builds_in(cache: Path) -> list[int]:
    """The processes whose command line names `cache` (the warm-up's bubblewrap and go)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if str(cache).encode() in line and entry.name.isdigit():
            found.append(int(entry.name))
    return found


def test_cases_poison_nothing_for_the_next_go_compile(compiles: Host) -> None:
    # A compile's writes to the warm cache are its own overlay's, dropped with it.
    cache = Path(settings.compile_cache_dir())
    before = snapshot(cache)
    program = (
        'package main\n\nimport (\n\t"encoding/json"\n\t"fmt"\n)\n\n'
        "func main() { b, _ := json.Marshal([]int{1, 2}); fmt.Println(string(b)) }\n"
    )
    assert result(run(program, "go"))[3] == "[1,2]\n"
    assert snapshot(cache) == before


def snapshot(root: Path) -> dict[str, tuple[int, float]]:
    root = root.resolve()
    return {
        str(path.relative_to(root)): (path.stat().st_size, path.stat().st_mtime)
        for path in root.rglob("*")
        if path.is_file()
    }


@pytest.fixture(autouse=True)
def toolchains() -> Iterator[None]:
    missing = [tool for tool in ("g++", "rustc", "gcc") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"these tests need {', '.join(missing)} (CI installs them): {missing}")
    yield


def test_selftests_case_of_each_language_passes_and_a_missing_toolchain_is_a_warning(
    compiles: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for language in compiled.LANGUAGES:
        check = selftest.language_check("hyperlight://", language)
        assert (check.name, check.status) == (f"{language} case", "ok"), check
    monkeypatch.setenv("PATH", str(tmp_path))
    check = selftest.language_check("hyperlight://", "cpp")
    assert check.status == "warn" and "apt-get install g++" in check.detail, check


def test_a_toolchain_installed_under_tmp_is_seen_in_the_sandbox(tmp_path: Path) -> None:
    # A venv's Go lives wherever the venv does (CI's, under /tmp): the sandbox's own /tmp must
    # not hide it.
    tool = tmp_path / "tool"
    (tool / "bin").mkdir(parents=True)
    script = tool / "bin" / "hello"
    script.write_text("#!/bin/sh\necho seen\n")
    script.chmod(0o755)
    build = tmp_path / "build"
    build.mkdir()
    toolchain = compiled._Toolchain("x", (str(script),), roots=(str(tool),))
    argv = compiled._sandbox(compiled._bwrap(need_overlay=False), str(build), toolchain)
    done = subprocess.run([*argv, *toolchain.argv], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "seen\n"), done.stderr
