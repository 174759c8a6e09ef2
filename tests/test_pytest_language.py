"""`language: "pytest"` through run_code, on the stand-in hluk: the code runs as a test file
under `pytest FILE` in the solution's directory, with pytest from a read-only mount, through
the same case path as `python` (timeouts, output limit, the gate); and the directories every
Linux host has exist in every guest."""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hostside import KVM_FAILURE, Host, fail_with

from verl_hyperlight import run_code
from verl_hyperlight.case import pytest_library as _guest_pytest
from verl_hyperlight.guest import protocol, runner


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def run_pytest(code: str, **options: Any) -> dict[str, Any]:
    run_timeout = options.pop("run_timeout", 20)
    response, error = run_code(
        "hyperlight://", textwrap.dedent(code), None, 10, run_timeout, 1024, "pytest", **options
    )
    assert error is None, error
    assert response is not None
    return response


def test_a_passing_test_file_succeeds_with_pytests_own_report(host: Host) -> None:
    reply = run_pytest(
        """
        def test_one():
            assert 1 + 1 == 2

        def test_two():
            print("captured, not shown")
        """
    )
    run = reply["run_result"]
    assert (reply["status"], run["status"], run["return_code"]) == ("Success", "Finished", 0)
    assert f"{runner.PYTEST_FILE} .." in run["stdout"]
    assert "2 passed" in run["stdout"].splitlines()[-1]
    assert "captured, not shown" not in run["stdout"]
    assert f"rootdir: {runner.WORK_DIR}" in run["stdout"]


def test_a_failing_test_fails_with_status_1_and_the_assertion_shown(host: Host) -> None:
    reply = run_pytest(
        """
        def test_wrong():
            assert [1, 2] == [1, 3]
        """
    )
    run = reply["run_result"]
    assert (reply["status"], run["return_code"]) == ("Failed", 1)
    assert "assert [1, 2] == [1, 3]" in run["stdout"]
    assert "1 failed" in run["stdout"].splitlines()[-1]


def test_built_in_fixtures_work_in_the_guest(host: Host) -> None:
    reply = run_pytest(
        """
        import os, sys

        def test_capfd(capfd):
            os.write(1, b"fd out")
            os.write(2, b"fd err")
            assert capfd.readouterr() == ("fd out", "fd err")

        def test_capsys(capsys):
            print("sys out")
            print("sys err", file=sys.stderr)
            assert capsys.readouterr() == ("sys out\\n", "sys err\\n")

        def test_tmp_path(tmp_path):
            (tmp_path / "f.txt").write_text("kept")
            assert (tmp_path / "f.txt").read_text() == "kept"

        def test_monkeypatch(monkeypatch):
            monkeypatch.setenv("ONLY_HERE", "1")
            monkeypatch.setattr(os, "sep", "!")
            assert os.environ["ONLY_HERE"] == "1" and os.sep == "!"

        def test_monkeypatch_undone():
            assert "ONLY_HERE" not in os.environ and os.sep == "/"

        def test_caplog(caplog):
            import logging
            logging.getLogger("x").warning("logged")
            assert "logged" in caplog.text
        """
    )
    assert reply["status"] == "Success", reply["run_result"]["stdout"]
    assert "6 passed" in reply["run_result"]["stdout"]


def test_parametrize_and_fixtures_of_a_conftest_from_files_are_used(host: Host) -> None:
    conftest = b"import pytest\n\n@pytest.fixture\ndef base():\n    return 10\n"
    solution = b"def add(a, b):\n    return a + b\n"
    reply = run_pytest(
        """
        import pytest
        from solution import add

        @pytest.mark.parametrize("n", [1, 2, 3])
        def test_add(base, n):
            assert add(base, n) == base + n
        """,
        files={"conftest.py": b64(conftest), "solution.py": b64(solution)},
    )
    assert reply["status"] == "Success", reply["run_result"]["stdout"]
    assert "3 passed" in reply["run_result"]["stdout"]


def test_a_pytest_ini_from_files_is_honoured_and_its_report_fetched(host: Host) -> None:
    ini = b"[pytest]\naddopts = -v --junitxml=report.xml\nmarkers =\n    slow: a marker\n"
    reply = run_pytest(
        """
        import pytest

        @pytest.mark.slow
        def test_marked():
            pass
        """,
        files={"pytest.ini": b64(ini)},
        fetch_files=["report.xml"],
    )
    stdout = reply["run_result"]["stdout"]
    assert reply["status"] == "Success", stdout
    assert "configfile: pytest.ini" in stdout
    assert f"{runner.PYTEST_FILE}::test_marked PASSED" in stdout  # -v
    report = base64.b64decode(reply["files"]["report.xml"]).decode()
    assert 'tests="1"' in report and 'failures="0"' in report


def test_the_guest_cannot_write_to_pytests_mount(host: Host) -> None:
    reply = run_pytest(
        f"""
        import os, pytest

        def test_read_only():
            target = os.path.join({runner.PYTEST_MOUNT!r}, "pytest", "__init__.py")
            assert os.path.exists(target)
            with pytest.raises(OSError):
                open(target, "a").write("# changed")
            with pytest.raises(OSError):
                open(os.path.join({runner.PYTEST_MOUNT!r}, "new.py"), "w")
        """
    )
    assert reply["status"] == "Success", reply["run_result"]["stdout"]


def test_a_pytest_case_past_its_timeout_times_out(host: Host) -> None:
    reply = run_pytest(
        """
        import time

        def test_slow():
            time.sleep(30)
        """,
        run_timeout=1,
    )
    assert (reply["status"], reply["run_result"]["status"]) == ("Failed", "TimeLimitExceeded")
    assert reply["run_result"]["return_code"] is None


def test_output_past_the_limit_stops_a_pytest_case_as_a_python_one(host: Host) -> None:
    reply = run_pytest(
        f"""
        def test_flood():
            print("x" * {protocol.OUTPUT_LIMIT + 1024})
        """,
        files={"pytest.ini": b64(b"[pytest]\naddopts = -s\n")},
    )
    run = reply["run_result"]
    assert (reply["status"], run["return_code"]) == ("Failed", protocol.OUTPUT_LIMIT_STATUS)
    assert len(run["stdout"]) == protocol.OUTPUT_LIMIT


def test_a_pytest_case_that_did_not_start_is_retried_after_the_gates_probe(
    host: Host, fail_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_pytest("def test_warm(): pass")["status"] == "Success"
    fail_with(monkeypatch, fail_file, KVM_FAILURE, 1)
    reply = run_pytest("def test_after_a_failed_start(): pass")
    assert reply["status"] == "Success", reply
    assert fail_file.read_text() == "0"


def test_pytest_and_python_cases_get_guests_of_their_own(host: Host) -> None:
    assert run_pytest("def test_ok(): pass")["status"] == "Success"
    response, _ = run_code("hyperlight://", "import pytest", None, 10, 10, 1024)
    assert response is not None
    # The python guest runs `python solution.py` without pytest, as hluk's image does.
    assert "No module named 'pytest'" in response["run_result"]["stderr"]
    # Each guest has its warm-up and snapshot: only the pytest guest mounts pytest (from a copy
    # beside hluk's cache) and prepares it.
    runs = [json.loads(line) for line in host.argv_log.read_text().splitlines()]
    kinds = set()
    for argv in filter(lambda argv: "--warm-exec" in argv, runs):
        mounts = [arg for arg in argv if arg.endswith(f":{runner.PYTEST_MOUNT}:ro")]
        warm_exec = argv[argv.index("--warm-exec") + 1]
        assert ("runner.prepare_pytest()" in warm_exec) == bool(mounts)
        assert all(mount.startswith(str(host.cache)) for mount in mounts)
        kinds.add(bool(mounts))
    assert kinds == {True, False}


def test_a_node_without_pytest_answers_sandbox_error_naming_the_extra_logged_once(
    host: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_guest_pytest, "DISTRIBUTIONS", ("pytest", "no-such-distribution"))
    caplog.set_level(logging.ERROR, logger="verl_hyperlight")
    for _ in range(3):
        reply = run_pytest("def test_never_runs(): pass")
        assert (reply["status"], reply["run_result"]) == ("SandboxError", None)
        assert "pip install -e '.[pytest]' in your verl-hyperlight checkout" in reply["message"]
    assert len([r for r in caplog.records if "'.[pytest]'" in r.getMessage()]) == 1
    assert not host.argv_log.exists()


@pytest.mark.parametrize("directory", ["/mnt", "/opt", "/srv", "/home", "/var/tmp"])
def test_the_directories_every_linux_host_has_exist_and_are_writable(
    host: Host, directory: str
) -> None:
    path = f"{directory}/written"
    code = f"open({path!r}, 'w').write('ok')\n"
    response, error = run_code("hyperlight://", code, None, 10, 10, 1024, fetch_files=[path])
    assert error is None and response is not None
    assert response["status"] == "Success", response
    assert response["files"] == {path: b64(b"ok")}


def test_the_warm_ups_objects_are_left_out_of_a_cases_collections(host: Host) -> None:
    # Each case's end collects three times, as CPython's exit does: with pytest's objects in
    # them, that walk cost a trivial pytest case several times its own run.
    reply = run_pytest(
        """
        import gc

        def test_frozen():
            assert gc.get_freeze_count() > 10_000
        """
    )
    assert reply["status"] == "Success", reply["run_result"]["stdout"]


def test_concurrent_first_pytest_cases_share_one_copy_and_one_warm_up(host: Host) -> None:
    codes = [f"def test_{i}():\n    assert {i} == {i}\n" for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(run_pytest, codes))
    assert [r["status"] for r in replies] == ["Success"] * 8, replies
    copies = [p for p in (host.cache / "verl-hyperlight").glob("pytest-*") if p.is_dir()]
    assert len(copies) == 1


def test_processes_making_the_copy_at_once_leave_one_whole_copy(tmp_path: Path) -> None:
    make = "from verl_hyperlight.case import pytest_library; print(pytest_library.library())"
    env = {**os.environ, "HLUK_CACHE_DIR": str(tmp_path)}
    processes = [
        subprocess.Popen([sys.executable, "-c", make], stdout=subprocess.PIPE, env=env)
        for _ in range(4)
    ]
    printed = {process.communicate(timeout=120)[0].decode().strip() for process in processes}
    assert all(process.returncode == 0 for process in processes)
    (library,) = printed
    name = Path(library).name
    left = sorted(p.name for p in (tmp_path / "verl-hyperlight").iterdir())
    assert left == [_guest_pytest.COPYING_LOCK, name, name + _guest_pytest.LOCK_SUFFIX]
    for name in ("pytest/__init__.py", "_pytest/config/__init__.py", "pluggy/__init__.py"):
        assert (Path(library) / name).is_file()
    assert list(Path(library).glob("pluggy-*.dist-info/METADATA"))
    assert not list(Path(library).rglob("__pycache__"))
