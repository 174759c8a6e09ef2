"""Conformance of `language: "pytest"`: each test file answers through run_code (the stand-in
hluk) exactly as it answers when CPython 3.12 runs it as Sandbox Fusion does: `pytest FILE`
through pip's console script, in a fresh directory holding the file (and the request's files),
stdin a closed pipe, a clean environment, a wall-clock limit.

Both sides run the same pytest: the reference imports it from the copy the pytest guest mounts
(PYTHONPATH), the one installation this node has without the host's plugins. Compared as
tests/test_conformance.py compares `python` cases (status, run status, return code, stdout and
stderr, the last stderr line), with the solution's directory and pytest's timing normalised in
both streams.
"""

from __future__ import annotations

import base64
import os
import re
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_conformance import REFERENCE_PYTHON, sandbox_fusion_run

from verl_hyperlight import run_code
from verl_hyperlight.case import pytest_library as _guest_pytest
from verl_hyperlight.guest import runner

pytestmark = pytest.mark.once

Shape = dict[str, object]

# pip's console script for pytest's entry point (_pytest.config:_console_main), as it writes it.
CONSOLE_SCRIPT = """\
# -*- coding: utf-8 -*-
import re
import sys
from _pytest.config import _console_main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(_console_main())
"""
TEST_FILE = "test_solution.py"


@dataclass(frozen=True)
class Case:
    name: str
    code: str
    files: dict[str, str] = field(default_factory=dict)
    run_timeout: float = 20.0


def case(name: str, code: str, **kwargs: Any) -> Case:
    files = kwargs.pop("files", {})
    files = {path: textwrap.dedent(text).lstrip("\n") for path, text in files.items()}
    return Case(name, textwrap.dedent(code).lstrip("\n"), files, **kwargs)


CASES = [
    case(
        "all_pass",
        """
        def test_one():
            assert 1 + 1 == 2

        def test_two():
            print("captured and not shown")
        """,
    ),
    case(
        "assertion_introspection_of_a_failure",
        """
        def helper():
            return {"a": 1, "b": [1, 2, 3]}

        def test_dicts():
            assert helper() == {"a": 1, "b": [1, 2, 4]}

        def test_passes():
            pass
        """,
    ),
    case(
        "failure_shows_captured_output",
        """
        import sys

        def test_noisy():
            print("to stdout")
            print("to stderr", file=sys.stderr)
            assert False, "with a message"
        """,
    ),
    case(
        "syntax_error_at_collection",
        """
        def test_broken(:
            pass
        """,
    ),
    case(
        "import_error_at_collection",
        """
        import no_such_module

        def test_never():
            pass
        """,
    ),
    case(
        "no_tests_collected",
        """
        def helper():
            return 1
        """,
    ),
    case(
        "fixtures_with_setup_error_and_teardown",
        """
        import pytest

        @pytest.fixture
        def resource():
            print("setting up")
            yield 42
            print("tearing down")

        @pytest.fixture
        def broken():
            raise RuntimeError("setup failed")

        def test_uses_resource(resource):
            assert resource == 42

        def test_uses_broken(broken):
            pass
        """,
    ),
    case(
        "parametrize_with_a_failing_id",
        """
        import pytest

        @pytest.mark.parametrize("n, square", [(1, 1), (2, 4), (3, 10), (4, 16)])
        def test_square(n, square):
            assert n * n == square
        """,
    ),
    case(
        "skip_xfail_and_xpass",
        """
        import pytest

        @pytest.mark.skip(reason="not now")
        def test_skipped():
            pass

        @pytest.mark.xfail(reason="known")
        def test_xfail():
            assert False

        @pytest.mark.xfail
        def test_xpass():
            pass

        def test_imperative_skip():
            pytest.skip("inside")
        """,
    ),
    case(
        "built_in_fixtures",
        """
        import os, sys

        def test_capfd(capfd):
            os.write(1, b"fd")
            assert capfd.readouterr().out == "fd"

        def test_capsys(capsys):
            print("sys", file=sys.stderr)
            assert capsys.readouterr().err == "sys\\n"

        def test_tmp_path(tmp_path):
            (tmp_path / "a").write_text("x")
            assert [p.name for p in tmp_path.iterdir()] == ["a"]

        def test_monkeypatch(monkeypatch):
            monkeypatch.chdir("/")
            assert os.getcwd() == "/"
        """,
    ),
    case(
        "warnings_summary",
        """
        import warnings

        def test_warns():
            warnings.warn("old api", DeprecationWarning)
        """,
    ),
    case(
        "conftest_and_module_from_files",
        """
        from solution import solve

        def test_solve(offset):
            assert solve(2) == 4 + offset
        """,
        files={
            "conftest.py": """
                import pytest

                @pytest.fixture
                def offset():
                    return 1
                """,
            "solution.py": """
                def solve(n):
                    return n * n
                """,
        },
    ),
    case(
        "usage_error_from_pytest_ini",
        """
        def test_never():
            pass
        """,
        files={"pytest.ini": "[pytest]\naddopts = --no-such-option\n"},
    ),
    case(
        "internal_error_in_a_conftest_hook",
        """
        def test_never():
            pass
        """,
        files={
            "conftest.py": """
                def pytest_collection_modifyitems(items):
                    raise RuntimeError("hook broke")
                """
        },
    ),
    case(
        "keyboard_interrupt_in_a_test",
        """
        def test_first():
            pass

        def test_interrupts():
            raise KeyboardInterrupt
        """,
    ),
    case(
        "os_exit_inside_a_test",
        """
        import os

        def test_leaves():
            os._exit(7)
        """,
    ),
    case(
        "exit_first_and_verbose_from_pytest_ini",
        """
        def test_a():
            assert False

        def test_b():
            pass
        """,
        files={"pytest.ini": "[pytest]\naddopts = -x -v\n"},
    ),
    case(
        "timeout",
        """
        import time

        def test_slow():
            time.sleep(30)
        """,
        run_timeout=1.0,
    ),
]

_TIMING = re.compile(r" in \d+\.\d+s\b")
# Where pytest is installed, as a traceback through it names it (relative to the solution's
# directory when that is shorter): Sandbox Fusion's runtime, the reference's copy and the
# guest's mount each have their own.
_INSTALLATION = re.compile(r'[^\s"]*(?=/(?:_pytest|pluggy)/)')
_ADDRESS = re.compile(r"0x[0-9a-f]+")


def shape(response: dict[str, Any], solution_dir: str) -> Shape:
    """What is compared: as tests/test_conformance.py compares, with the solution's directory
    normalised in stdout too (pytest's header names it), and pytest's run time and where it is
    installed left out."""
    run = response["run_result"]

    def normalised(text: str) -> str:
        text = _TIMING.sub(" in ?s", text.replace(solution_dir, "<dir>"))
        return _ADDRESS.sub("0x?", _INSTALLATION.sub("<pytest>", text))

    stderr = normalised(run["stderr"])
    return {
        "status": response["status"],
        "run_status": run["status"],
        "return_code": run["return_code"],
        "stdout": normalised(run["stdout"]),
        "stderr": stderr,
        "last_stderr_line": ([""] + [line for line in stderr.splitlines() if line.strip()])[-1],
    }


def reference_run(item: Case, library: str) -> Shape:
    """Run the file as Sandbox Fusion runs `pytest`, and answer as it answers."""
    with tempfile.TemporaryDirectory() as directory, tempfile.TemporaryDirectory() as bin_dir:
        script = os.path.join(bin_dir, "pytest")
        Path(script).write_text(CONSOLE_SCRIPT)
        for path, text in item.files.items():
            Path(directory, path).write_text(text)
        test_file = os.path.join(directory, TEST_FILE)
        Path(test_file).write_text(item.code)
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "LANG": "C.UTF-8",
            "PYTHONPATH": library,
        }
        argv = [REFERENCE_PYTHON, script, test_file]
        # On a timeout no partial output, as this package answers one (a documented limit).
        response = sandbox_fusion_run(
            argv, directory, env, None, item.run_timeout, partial_output=False
        )
    return shape(response, directory)


def our_run(item: Case) -> Shape:
    files = {path: base64.b64encode(text.encode()).decode() for path, text in item.files.items()}
    response, error = run_code(
        "hyperlight://", item.code, None, 10, item.run_timeout, 1024, "pytest", files=files
    )
    assert error is None, error
    assert response is not None
    return shape(response, runner.WORK_DIR)


def test_the_corpus_covers_every_exit_status_of_pytest() -> None:
    assert len({c.name for c in CASES}) == len(CASES) >= 15


@pytest.mark.parametrize("item", [pytest.param(c, id=c.name) for c in CASES])
def test_pytest_case_answers_as_pytest_under_cpython(hluk: Path, item: Case) -> None:
    library = _guest_pytest.library()
    with ThreadPoolExecutor(2) as pool:
        ours = pool.submit(our_run, item)
        reference = pool.submit(reference_run, item, library)
        assert ours.result() == reference.result()


def test_the_corpus_meets_each_of_pytests_exit_statuses(hluk: Path) -> None:
    """The corpus is not all one answer: the reference gives each exit status pytest has."""
    library = _guest_pytest.library()
    statuses = {reference_run(c, library)["return_code"] for c in CASES}
    assert {0, 1, 2, 3, 4, 5, None} <= statuses
