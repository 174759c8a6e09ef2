"""Bad input never escapes as an exception: every malformed request gets the documented answer
(docs/operations.md, "Failures an operator sees"), and never runs hluk."""

from __future__ import annotations

import base64
import logging
import math
import os
from typing import Any

import pytest
from hostside import Host, option, result, run, sandbox_error

from verl_hyperlight import run_code
from verl_hyperlight import settings as _settings
from verl_hyperlight.case import api as _api
from verl_hyperlight.case import casedir as _casedir
from verl_hyperlight.case import failures as _failures
from verl_hyperlight.errors import CauseCounts

MIB = 1024 * 1024


def request_error(**overrides: Any) -> str:
    """The error of run_code for a request with these arguments changed; it must be one."""
    arguments: dict[str, Any] = {
        "sandbox_fusion_url": "hyperlight://",
        "code": "print(1)",
        "stdin": "",
        "compile_timeout": None,
        "run_timeout": 10,
        "memory_limit_mb": None,
        "language": "python",
        **overrides,
    }
    response, error = run_code(**arguments)
    assert response is None and error is not None, response
    assert error.startswith("Invalid request: "), error
    return error


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"code": None}, "code must be a string, not NoneType"),
        ({"code": 42}, "code must be a string, not int"),
        ({"code": b"print(1)"}, "code must be a string, not bytes"),
        ({"code": "#" * (16 * MIB + 1)}, f"code is {16 * MIB + 1} bytes; at most {16 * MIB}"),
        ({"code": "print('\ud800')"}, "code is not valid Unicode text (surrogates not allowed"),
        ({"stdin": 42}, "stdin must be a string, not int"),
        ({"stdin": b"1 2\n"}, "stdin must be a string, not bytes"),
        ({"stdin": "1 \udc80\n"}, "stdin is not valid Unicode text (surrogates not allowed"),
        ({"run_timeout": math.nan}, "run_timeout must be a finite number of seconds, not nan"),
        ({"run_timeout": math.inf}, "run_timeout must be a finite number of seconds, not inf"),
        ({"files": ["a"]}, "files must map paths to base64 text or None"),
        ({"files": {"a": 1}}, "files['a'] must be base64 text or None"),
        ({"files": {"": "eA=="}}, "files paths must be strings of 1 to 4096 characters"),
        ({"fetch_files": "a"}, "fetch_files must be a list of paths"),
        ({"fetch_files": [None]}, "fetch_files paths must be strings of 1 to 4096 characters"),
        ({"run_timeout": True}, "run_timeout must be a number of seconds, not True"),
        ({"run_timeout": "5"}, "run_timeout must be a number of seconds, not '5'"),
        ({"memory_limit_mb": "1024"}, "memory_limit_mb must be a number or None, not '1024'"),
        ({"memory_limit_mb": math.nan}, "memory_limit_mb must be a number or None, not nan"),
        ({"memory_limit_mb": True}, "memory_limit_mb must be a number or None, not True"),
        ({"language": "brainfuck"}, "unknown language 'brainfuck'"),
        ({"language": None}, "unknown language None"),
        ({"language": ["python"]}, "unknown language ['python']"),
        ({"sandbox_fusion_url": "http://x"}, "unsupported sandbox URL 'http://x'"),
        ({"sandbox_fusion_url": ""}, "unsupported sandbox URL ''"),
        ({"sandbox_fusion_url": None}, "unsupported sandbox URL None"),
        (
            {"sandbox_fusion_url": "hyperlight://not an image"},
            "unsupported sandbox URL 'hyperlight://not an image'",
        ),
    ],
    ids=lambda value: repr(value)[:40] if isinstance(value, dict) else "",
)
def test_a_malformed_request_is_answered_invalid_request_without_running_hluk(
    host: Host, overrides: dict[str, Any], says: str
) -> None:
    assert says in request_error(**overrides)
    assert host.runs() == []


def test_stdin_over_256_mib_is_an_invalid_request(host: Host) -> None:
    too_long = 256 * MIB + 1
    assert f"stdin is {too_long} bytes; at most {256 * MIB}" in request_error(stdin="x" * too_long)


@pytest.mark.parametrize("language", ["ruby", "php", "go_test", "csharp"])
def test_a_sandbox_fusion_language_not_run_here_is_a_sandbox_error_naming_those_that_are(
    host: Host, language: str
) -> None:
    message = sandbox_error(run("int main() {}", language=language))
    runs = "python, pytest, cpp, go, rust, java, nodejs, typescript, bash"
    says = f"runs {runs}; language {language!r} is not supported"
    assert says in message
    assert host.runs() == []


def test_another_language_is_the_clients_doing_said_once_and_no_backend_failure(
    host: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_api, "unsupported_languages", CauseCounts())
    caplog.set_level(logging.WARNING, "verl_hyperlight")
    for _ in range(3):
        sandbox_error(run("puts 1", language="ruby"))
    said = [r for r in caplog.records if "'ruby' is not supported" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING]
    assert _failures.log.counts() == {}  # /metrics' backend failures


def test_nul_bytes_in_code_are_a_syntax_error_as_cpython_gives(host: Host) -> None:
    status, run_status, return_code, stdout, stderr = result(run("print(1)\0\nprint(2)\n"))
    assert (status, run_status, return_code, stdout) == ("Failed", "Finished", 1, "")
    assert stderr.endswith("SyntaxError: source code cannot contain null bytes\n")


def test_nul_bytes_in_stdin_reach_the_solution_unchanged(host: Host) -> None:
    code = "import sys\nsys.stdout.write(sys.stdin.read())"
    assert result(run(code, stdin="a\0b\0\n\0"))[:4] == ("Success", "Finished", 0, "a\0b\0\n\0")


def test_the_url_scheme_is_case_insensitive_as_the_plugin_routes_it(host: Host) -> None:
    assert result(run("print('hi')", url="HyperLight://"))[:4] == ("Success", "Finished", 0, "hi\n")


def test_memory_limit_false_is_not_taken_for_zero() -> None:
    assert "memory_limit_mb must be a number or None, not False" in request_error(
        memory_limit_mb=False
    )


def test_stdin_none_is_an_empty_input(host: Host) -> None:
    code = "import sys\nprint(repr(sys.stdin.read()))"
    assert result(run(code, stdin=None))[:4] == ("Success", "Finished", 0, "''\n")


def test_run_timeout_none_is_the_default_of_10_seconds(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _api.DEFAULT_RUN_TIMEOUT == 10
    assert result(run("print('in time')", run_timeout=None))[:4] == (
        "Success",
        "Finished",
        0,
        "in time\n",
    )
    # The default is what a case without a timeout runs under (shortened here to be seen): a
    # solution that would end with Success after 3 s is stopped by a default of 1 s.
    monkeypatch.setattr(_api, "DEFAULT_RUN_TIMEOUT", 1.0)
    response = run("import time\ntime.sleep(3)\nprint('finished')\n", run_timeout=None)
    assert result(response)[:3] == ("Failed", "TimeLimitExceeded", None)
    assert response["run_result"]["execution_time"] >= 1.0  # a timed-out run ran its timeout


@pytest.mark.parametrize("where", ["tmpfs", "tmpdir"])
def test_a_case_directory_whose_path_holds_a_colon_still_runs_cases(
    host: Host, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    # hluk splits --mount at its first colon: the case directory is named relative to the
    # directory hluk runs in.
    import tempfile

    colon = host.tmpdir / "node:tmp"
    colon.mkdir()
    if where == "tmpfs":
        monkeypatch.setattr(_casedir, "TMPFS", str(colon))
    else:
        monkeypatch.setattr(_casedir, "TMPFS", str(host.tmpdir / "no-tmpfs"))
        monkeypatch.setattr(tempfile, "tempdir", str(colon))
    assert result(run("print(input())", "through a colon\n"))[:4] == (
        "Success",
        "Finished",
        0,
        "through a colon\n",
    )
    [mount] = [option(argv, "--mount") for argv in host.case_runs()]
    assert str(mount).startswith("verl-hyperlight-")  # relative to hluk's directory
    assert list(colon.iterdir()) == []  # removed as any case directory is


def test_case_directories_go_where_the_setting_says_and_an_unusable_one_is_said(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = host.tmpdir / "cases"
    chosen.mkdir()
    monkeypatch.setenv(_settings.CASE_DIR.name, str(chosen))
    run("pass")
    mounts = [option(argv, "--mount") for argv in host.case_runs()]
    assert mounts and all(str(mount).startswith(f"{chosen}/verl-hyperlight-") for mount in mounts)
    assert list(chosen.iterdir()) == [] and host.case_dirs() == []

    monkeypatch.setenv(_settings.CASE_DIR.name, str(host.tmpdir / "missing"))
    response = run("print(1)")
    assert response["status"] == "SandboxError"
    assert "missing" in response["message"] and _settings.CASE_DIR.name in response["message"]


def test_without_a_tmpfs_case_directories_go_to_tmpdir_said_once(
    host: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    missing = host.tmpdir / "no-tmpfs"
    monkeypatch.setattr(_casedir, "TMPFS", str(missing))
    caplog.set_level(logging.WARNING, logger="verl_hyperlight")
    for _ in range(3):
        assert result(run("print(input())", "here\n"))[3] == "here\n"
    mounts = [str(option(argv, "--mount")) for argv in host.case_runs()]
    assert [os.path.dirname(mount.split(":")[0]) for mount in mounts] == [str(host.tmpdir)] * 3
    [said] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"there is no tmpfs at {missing}" in said and _settings.CASE_DIR.name in said, said
    assert host.case_dirs() == []


@pytest.mark.parametrize("run_timeout", [0, -1, -0.5])
def test_a_run_timeout_of_zero_or_less_is_time_limit_exceeded_at_once(
    host: Host, run_timeout: float
) -> None:
    # As Sandbox Fusion answers it (its process is killed before it runs).
    response = run("print('never')", run_timeout=run_timeout)
    assert result(response) == ("Failed", "TimeLimitExceeded", None, "", "")
    assert host.runs() == []


def test_files_over_their_limit_are_an_invalid_request(host: Host) -> None:
    from verl_hyperlight.guest import protocol

    half = base64.b64encode(b"x" * (protocol.FILES_IN_LIMIT // 2 + 1)).decode()
    error = request_error(files={"a": half, "b": half})
    assert "files hold more than 32 MiB once decoded" in error
    too_many = {f"f{i}": "" for i in range(protocol.MAX_FILES + 1)}
    assert "at most 1000" in request_error(files=too_many)
    assert "at most 1000" in request_error(fetch_files=["a"] * (protocol.MAX_FILES + 1))
