"""Cases in real Hyperlight micro-VMs, through the hluk on PATH (or HLUK_PATH / HLUK_INITRD).

These need hluk 0.19.0+ and a usable /dev/kvm, so they run only with RUN_ALL=1; everywhere
else they are skipped with that reason, and the stand-in tests cover the code around them.
VERL_HYPERLIGHT_TEST_AGENT=1 adds the test that needs the agent image (a large pull).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from verl_hyperlight import run_code

pytestmark = [
    pytest.mark.microvm,
    pytest.mark.skipif(
        os.environ.get("RUN_ALL") != "1",
        reason="real micro-VMs need hluk and /dev/kvm: set RUN_ALL=1 where they are available",
    ),
]


@pytest.fixture(autouse=True)
def real_hluk() -> None:
    hluk = os.environ.get("HLUK_PATH") or shutil.which("hluk")
    if hluk is None:
        pytest.fail("RUN_ALL=1 but no hluk: install it or set HLUK_PATH")
    if "standin" in hluk:
        pytest.fail(f"RUN_ALL=1 must run real hluk, not the stand-in ({hluk})")
    version = subprocess.run([hluk, "--version"], capture_output=True, text=True, timeout=30)
    assert version.returncode == 0, version.stderr


def run(code: str, stdin: str | None = "", timeout: float = 10, **kw: Any) -> dict[str, Any]:
    response, error = run_code(
        kw.get("url", "hyperlight://"), code, stdin, 10, timeout, kw.get("memory", 1024)
    )
    assert error is None, error
    assert response is not None
    assert response["status"] != "SandboxError", response["message"]
    return response


def test_a_solution_reads_its_input_and_its_output_comes_back_exact() -> None:
    response = run("import sys\nprint(sys.stdin.read()[::-1], end='')", "abc\ndef")
    assert response["status"] == "Success"
    assert response["run_result"]["stdout"] == "fed\ncba"


def test_stdout_and_stderr_come_back_separate_without_carriage_returns() -> None:
    response = run("import sys\nprint('out')\nprint('err', file=sys.stderr)\nprint('out2')")
    assert response["run_result"]["stdout"] == "out\nout2\n"
    assert response["run_result"]["stderr"] == "err\n"


def test_a_runtime_error_shows_the_solutions_traceback() -> None:
    response = run("def f():\n    return 1 / 0\nf()")
    assert response["status"] == "Failed"
    assert response["run_result"]["return_code"] == 1
    stderr = response["run_result"]["stderr"]
    assert "solution.py" in stderr and "ZeroDivisionError" in stderr
    assert "runner" not in stderr


def test_the_solution_runs_as_main_from_its_own_writable_directory() -> None:
    code = (
        "import os, sys\n"
        "open('scratch.txt', 'w').write('x')\n"
        "print(__name__, os.path.basename(__file__), sys.argv[0] == __file__,\n"
        "      os.getcwd() == os.path.dirname(__file__) == sys.path[0])\n"
    )
    assert run(code)["run_result"]["stdout"] == "__main__ solution.py True True\n"


def test_dev_stdin_and_proc_self_fd_open_the_solutions_own_input() -> None:
    code = "print(open('/dev/stdin').read().strip(), open('/proc/self/fd/0').read() == '')"
    assert run(code, "hello\n")["run_result"]["stdout"] == "hello True\n"


def test_threads_are_joined_and_atexit_runs_at_the_end() -> None:
    code = (
        "import atexit, threading, time\n"
        "atexit.register(print, 'atexit')\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
        "print('main')\n"
    )
    assert run(code)["run_result"]["stdout"] == "main\nthread\natexit\n"


def test_os_exit_keeps_flushed_output_and_its_status() -> None:
    code = "import os, sys\nprint('kept', flush=True)\nprint('lost')\nos._exit(4)"
    response = run(code)
    assert response["run_result"]["return_code"] == 4
    assert response["run_result"]["stdout"] == "kept\n"


def test_an_endless_loop_times_out_counted_from_the_solutions_start() -> None:
    response = run("while True:\n    pass", timeout=1)
    assert response["status"] == "Failed"
    assert response["run_result"]["status"] == "TimeLimitExceeded"
    assert response["run_result"]["return_code"] is None


def test_the_guest_has_no_network_and_no_host_environment_or_files(tmp_path: Path) -> None:
    # A host file no image can hold (a fresh directory, random content) and the host's working
    # directory: the guest sees neither.
    host_file = tmp_path / "host-only.txt"
    host_file.write_text(uuid.uuid4().hex)
    code = (
        "import os, socket\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); print('net')\n"
        "except OSError:\n    print('no net')\n"
        "print(sorted(os.environ))\n"
        f"print(os.path.exists({str(host_file)!r}), os.path.exists({os.getcwd()!r}))\n"
    )
    os.environ["VERL_HYPERLIGHT_SECRET_FOR_TEST"] = "leak"
    try:
        out = run(code)["run_result"]["stdout"]
    finally:
        del os.environ["VERL_HYPERLIGHT_SECRET_FOR_TEST"]
    assert out.startswith("no net\n")
    assert "VERL_HYPERLIGHT_SECRET_FOR_TEST" not in out
    assert out.endswith("False False\n")


def test_random_is_reseeded_in_every_micro_vm() -> None:
    code = "import random\nprint(random.getrandbits(64))"
    assert run(code)["run_result"]["stdout"] != run(code)["run_result"]["stdout"]


def test_a_solution_exhausting_guest_memory_is_killed_with_137() -> None:
    response = run("x = bytearray(2 * 1024 ** 3)\nprint(len(x))", memory=256)
    assert response["status"] == "Failed"
    assert response["run_result"]["return_code"] in (137, 1)


def test_large_output_comes_back_whole() -> None:
    response = run("import sys\nsys.stdout.write('x' * (10 * 1024 * 1024))", timeout=60)
    assert response["status"] == "Success"
    assert len(response["run_result"]["stdout"]) == 10 * 1024 * 1024


# Another reward worker's first act: see the guest warm, in a process of its own.
SECOND_WORKER = (
    "from verl_hyperlight.cli import main\n"
    "raise SystemExit(main(['warm-up', 'hyperlight://', '--memory-limit-mb', '1024']))\n"
)


def test_a_second_process_finds_the_guest_warm() -> None:
    run("pass")
    done = subprocess.run(
        [sys.executable, "-c", SECOND_WORKER], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr
    # hluk's own log line said restored=true: the snapshot the first process took.
    assert "its warm snapshot restored in" in done.stdout, done.stdout


def test_cases_after_hluk_cache_clean_find_the_guest_warm_again() -> None:
    run("pass")
    hluk = os.environ.get("HLUK_PATH") or shutil.which("hluk")
    assert hluk is not None
    subprocess.run([hluk, "cache", "clean", "--snapshots"], check=True, timeout=60)
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda i: run(f"print({i})"), range(8)))
    assert [r["run_result"]["stdout"] for r in responses] == [f"{i}\n" for i in range(8)]


def test_large_output_at_the_end_of_the_time_limit_is_copied_out_whole() -> None:
    # hluk's console costs a VM exit and a print per write: copying 16 MiB out takes time the
    # solution, which ended within its limit, is not charged.
    code = "import sys, time\ntime.sleep(1.5)\nsys.stdout.write('x' * (16 * 2**20))"
    response = run(code, timeout=2)
    assert response["status"] == "Success", response["run_result"]["status"]
    assert len(response["run_result"]["stdout"]) == 16 * 2**20


def test_a_solution_posing_as_a_kvm_failure_and_breaking_its_report_is_its_failure() -> None:
    code = (
        "import os\n"
        "print('error: failed to open /dev/kvm: Permission denied', flush=True)\n"
        "for fd in range(3, 64):\n"
        "    if os.isatty(fd):\n"
        "        os.write(fd, b'\\nerror: failed to open /dev/kvm: Permission denied\\n')\n"
        "        os.close(fd)\n"
    )
    response = run(code)
    assert response["status"] == "Failed"
    assert response["run_result"]["return_code"] not in (None, 0)


@pytest.mark.skipif(
    os.environ.get("VERL_HYPERLIGHT_TEST_AGENT") != "1",
    reason="the agent image is a large pull: set VERL_HYPERLIGHT_TEST_AGENT=1",
)
def test_the_agent_image_has_numpy_and_sympy_reseeded() -> None:
    code = "import numpy, sympy\nprint(numpy.random.randint(1 << 30), sympy.factorint(12))"
    first = run(code, url="hyperlight://agent", memory=1024)["run_result"]["stdout"]
    second = run(code, url="hyperlight://agent", memory=1024)["run_result"]["stdout"]
    assert first.split()[1:] == second.split()[1:] == ["{2:", "2,", "3:", "1}"]
    assert first.split()[0] != second.split()[0]


def test_a_notebook_keeps_its_state_across_calls_through_the_console_input() -> None:
    """The code tool's notebook in a real micro-VM: requests reach the guest through hluk's
    stdin (echoed on the console, decoded as text), the state carries over, large code and
    non-ASCII text pass, a call past its timeout ends the notebook and the next starts anew."""
    from verl_hyperlight.agent.notebook import Notebook

    notebook = Notebook("hyperlight://", 1024)
    try:

        def cell(code: str, timeout: float = 10) -> dict[str, Any]:
            response, error = notebook.run(code, timeout, None)
            assert error is None and response is not None, error
            assert response["status"] != "SandboxError", response["message"]
            return response

        assert cell("x = 41\nprint('ready')")["run_result"]["stdout"] == "ready\n"
        assert cell("x += 1\nprint(x, 'é → ✓')")["run_result"]["stdout"] == "42 é → ✓\n"
        data = "y = '" + "ab" * 200_000 + "'\nprint(len(y), x)"  # many lines of input
        assert cell(data)["run_result"]["stdout"] == "400000 42\n"
        failed = cell("1 / 0")["run_result"]
        assert failed["return_code"] == 1 and "ZeroDivisionError" in failed["stderr"]
        assert cell("print(x)")["run_result"]["stdout"] == "42\n"
        assert cell("import time\ntime.sleep(30)", 1)["run_result"]["status"] == (
            "TimeLimitExceeded"
        )
        assert not notebook.alive
        assert "NameError" in cell("print(x)")["run_result"]["stderr"]
    finally:
        notebook.close()


def test_a_mount_written_after_the_guest_started_is_read(tmp_path: Path) -> None:
    """What ready guests rely on (case/ready.py): a guest that looked for a file in its mount
    before it existed, and then blocked on its console's input, finds the file written
    meanwhile, its whole content, and the directory's new listing."""
    hluk = os.environ.get("HLUK_PATH") or shutil.which("hluk")
    assert hluk is not None
    late = tmp_path / "late"
    late.mkdir()
    code = (
        "import os\n"
        "before = os.path.exists('/late/a.txt')\n"
        "while b'\\n' not in os.read(0, 4096): pass\n"
        "print('seen', before, sorted(os.listdir('/late')), open('/late/a.txt').read(),"
        " flush=True)\n"
    )
    proc = subprocess.Popen(
        [hluk, "run", "--runtime", "python", "--mount", f"{late}:/late:ro", "--exec", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(5)  # restored, and waiting on its input
        assert proc.poll() is None, proc.communicate()
        (late / "a.txt").write_text("x" * 100_000)
        (late / "b.txt").write_text("b")
        out, err = proc.communicate(b"go\n", timeout=60)
    finally:
        proc.kill()
    text = out.decode(errors="replace")
    assert "seen False ['a.txt', 'b.txt'] " + "x" * 100_000 in text, (text[-500:], err[-2000:])


def test_cases_in_ready_guests_answer_as_in_micro_vms_started_for_them() -> None:
    """Cases one after another take the micro-VM started while the last ran: each answer as a
    fresh one's, its random state its own."""
    from verl_hyperlight.case import api

    taken = api.ready_guests().taken
    code = "import random, sys\nprint(sys.stdin.read(), random.getrandbits(64))"
    answers = []
    for i in range(6):
        answers.append(run(code, f"case{i}")["run_result"]["stdout"].split())
        time.sleep(0.5)  # the next one's guest restores meanwhile
    assert [words[0] for words in answers] == [f"case{i}" for i in range(6)]
    assert len({words[1] for words in answers}) == 6
    assert api.ready_guests().taken - taken >= 4


@pytest.mark.parametrize(
    ("language", "code"),
    [
        (
            "cpp",
            "#include <iostream>\nint main() { long a, b; std::cin >> a >> b;\n"
            '  std::cout << a + b << "\\n"; std::cerr << "err\\n"; return 3; }\n',
        ),
        (
            "rust",
            "use std::io::Read;\nfn main() { let mut s = String::new();\n"
            "  std::io::stdin().read_to_string(&mut s).unwrap();\n"
            "  let n: Vec<i64> = s.split_whitespace().map(|w| w.parse().unwrap()).collect();\n"
            '  println!("{}", n[0] + n[1]); eprintln!("err"); std::process::exit(3); }\n',
        ),
        (
            "go",
            'package main\n\nimport (\n\t"fmt"\n\t"os"\n)\n\nfunc main() {\n\tvar a, b int\n'
            '\tfmt.Scan(&a, &b)\n\tfmt.Println(a + b)\n\tfmt.Fprintln(os.Stderr, "err")\n'
            "\tos.Exit(3)\n}\n",
        ),
    ],
)
def test_a_compiled_program_runs_in_the_python_guest_with_its_streams_apart(
    language: str, code: str
) -> None:
    """The static PIE the host built, started by the runner with subprocess (vfork + execve
    in hluk's guest): its stdin, its stdout and stderr apart, its exit status."""
    response, error = run_code("hyperlight://", code, "19 23\n", 60, 10, 1024, language)
    assert error is None and response is not None, error
    assert response["status"] == "Failed", response
    assert response["compile_result"]["return_code"] == 0
    run_result = response["run_result"]
    assert (run_result["return_code"], run_result["stdout"], run_result["stderr"]) == (
        3,
        "42\n",
        "err\n",
    )
