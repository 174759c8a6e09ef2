"""The agent-loop code tool's core, without verl: its settings, the answer text, the last
expression shown as a notebook shows it, and how calls are bounded (tests/test_tool.py loads the
verl class through verl itself)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostside import Host

from verl_hyperlight import _tool
from verl_hyperlight._tool import (
    BUSY,
    NO_STDOUT,
    NOT_RUN,
    Call,
    CodeRunner,
    ToolSettings,
    answer,
    display_last_expression,
)

URL = "hyperlight://"


def settings(**config: Any) -> ToolSettings:
    return ToolSettings.from_config({"sandbox_fusion_url": URL, **config})


def run_result(status: str, return_code: int | None, stdout: str, stderr: str) -> dict[str, Any]:
    top = "Success" if status == "Finished" and return_code == 0 else "Failed"
    return {
        "status": top,
        "message": "",
        "compile_result": None,
        "run_result": {
            "status": status,
            "execution_time": 0.01,
            "return_code": return_code,
            "stdout": stdout,
            "stderr": stderr,
        },
        "executor_pod_name": None,
        "files": {},
    }


SANDBOX_ERROR = {"status": "SandboxError", "message": "hluk failed", "run_result": None}
CALL = Call("print(1)", 30.0, "python")


def test_the_removed_tools_keys_and_defaults_are_read() -> None:
    found = settings()
    assert (found.num_workers, found.default_timeout, found.default_language) == (10, 30, "python")
    assert (found.memory_limit_mb, found.rate_limit, found.max_queue) == (1024, None, 160)
    assert not found.detailed_errors and not found.print_last_expression
    found = settings(num_workers=4, rate_limit=5, enable_global_rate_limit=True, type="native")
    assert (found.num_workers, found.rate_limit, found.max_queue) == (4, 5.0, 64)


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"sandbox_fusion_url": ""}, "sandbox_fusion_url"),
        ({"sandbox_fusion_url": "ftp://x"}, "sandbox_fusion_url"),
        ({"sandbox_fusion_url": URL, "num_workers": 0}, "num_workers"),
        ({"sandbox_fusion_url": URL, "default_timeout": -1}, "default_timeout"),
        ({"sandbox_fusion_url": URL, "rate_limit": "fast"}, "rate_limit"),
        ({"sandbox_fusion_url": URL, "detailed_errors": "yes"}, "detailed_errors"),
        ({"sandbox_fusion_url": URL, "memory_limit_mb": 1.5}, "memory_limit_mb"),
    ],
)
def test_a_bad_config_value_is_refused_naming_its_key(config: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ToolSettings.from_config(config)


def test_unknown_config_keys_are_named_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    settings(detailed_error=True)
    assert "detailed_error" in caplog.text


def test_a_finished_run_answers_stdout_then_stderr_else_the_removed_tools_text() -> None:
    plain = settings()
    assert answer(run_result("Finished", 0, "out\n", "err\n"), plain, CALL) == "out\nerr\n"
    assert answer(run_result("Finished", 1, "", "Traceback\n"), plain, CALL) == "Traceback\n"
    assert answer(run_result("TimeLimitExceeded", None, "", ""), plain, CALL) == NO_STDOUT
    assert answer(SANDBOX_ERROR, plain, CALL) == NO_STDOUT
    assert answer(None, plain, CALL) == NO_STDOUT


def test_detailed_errors_give_the_return_code_the_time_limit_and_the_end_of_stderr() -> None:
    detailed = settings(detailed_errors=True)
    assert answer(run_result("Finished", 0, "3\n", ""), detailed, CALL) == "3\n"
    failed = answer(
        run_result("Finished", 1, "partial", "Traceback\nValueError: x\n"), detailed, CALL
    )
    assert failed == (
        "partial\nExited with return code 1. The end of stderr:\nTraceback\nValueError: x\n"
    )
    timed_out = answer(run_result("TimeLimitExceeded", None, "", ""), detailed, Call("", 2.5, ""))
    assert timed_out == "Time limit exceeded: the code ran past 2.5 s and was stopped."
    assert answer(SANDBOX_ERROR, detailed, CALL) == NOT_RUN
    long_stderr = "".join(f"line {n}\n" for n in range(1000))
    tail = answer(run_result("Finished", 1, "", long_stderr), detailed, CALL)
    assert tail.endswith("line 999\n") and "line 0\n" not in tail
    assert len(tail) <= _tool.STDERR_TAIL_CHARS + 100
    assert tail.split("stderr:\n", 1)[1].startswith("line ")  # cut at a line's start


@pytest.mark.parametrize(
    ("code", "shown"),
    [
        ("x = 2\nx * 21", "42\n"),
        ("'é' * 2", "'éé'\n"),
        ("import math\nmath.pi  # the answer", "3.141592653589793\n"),
        ("print('a')\nNone", "a\n"),
        ("1 + 1;", ""),
        ("x = 5", ""),
        ("def f():\n    return 3\n(f()\n +\n 1)", "4\n"),
        ("s = 'ü'; s + 'ß'", "'üß'\n"),
        ("[1,\r\n 2]", "[1, 2]\n"),
    ],
)
def test_the_last_expression_is_shown_as_a_notebook_cell_shows_it(
    code: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    exec(compile(display_last_expression(code), "<cell>", "exec"), {})
    assert capsys.readouterr().out == shown


def test_code_that_does_not_parse_is_left_for_the_run_to_report() -> None:
    assert display_last_expression("def broken(:\n") == "def broken(:\n"


def test_the_shown_expression_keeps_its_line_numbers_in_tracebacks() -> None:
    code = "x = 1\n\n1 / 0"
    with pytest.raises(ZeroDivisionError) as raised:
        exec(compile(display_last_expression(code), "<cell>", "exec"), {})
    assert raised.traceback[-1].lineno + 1 == 3


def test_calls_past_the_workers_and_the_queue_are_answered_busy_at_once() -> None:
    release = threading.Event()
    started = []

    def service(**arguments: Any) -> tuple[dict[str, Any], None]:
        started.append(arguments["code"])
        release.wait(30)
        return run_result("Finished", 0, "ok\n", ""), None

    runner = CodeRunner(
        ToolSettings.from_config(
            {"sandbox_fusion_url": "http://127.0.0.1:9/run_code", "num_workers": 2, "max_queue": 3}
        ),
        service,
    )

    async def main() -> list[tuple[str, dict[str, Any]]]:
        calls = [asyncio.ensure_future(runner.call({"code": str(n)})) for n in range(5)]
        await asyncio.sleep(0.2)
        busy = await runner.call({"code": "late"})
        assert busy[0] == BUSY and busy[1]["status"] == "busy"
        assert len(started) == 2  # num_workers at once, the rest waiting
        release.set()
        return list(await asyncio.gather(*calls))

    try:
        answers = asyncio.run(main())
    finally:
        release.set()
        runner.close()
    assert [text for text, _ in answers] == ["ok\n"] * 5
    assert runner.admitted == 0


def test_rate_limit_spaces_the_starts_of_calls() -> None:
    starts: list[float] = []

    def service(**arguments: Any) -> tuple[dict[str, Any], None]:
        starts.append(time.monotonic())
        return run_result("Finished", 0, "", ""), None

    runner = CodeRunner(
        ToolSettings.from_config(
            {"sandbox_fusion_url": "http://127.0.0.1:9/run_code", "num_workers": 8, "rate_limit": 4}
        ),
        service,
    )

    async def main() -> None:
        await asyncio.gather(*(runner.call({"code": ""}) for _ in range(8)))

    try:
        asyncio.run(main())
    finally:
        runner.close()
    starts.sort()
    # A bucket of 4: four start at once, the next four one every quarter second.
    assert starts[7] - starts[0] >= 0.9


def test_a_cancelled_call_stops_its_run(host: Host) -> None:
    runner = CodeRunner(settings(num_workers=1))

    async def main() -> None:
        call = asyncio.ensure_future(runner.call({"code": "import time; time.sleep(60)"}))
        for _ in range(300):  # until its micro-VM runs
            await asyncio.sleep(0.1)
            if host.case_runs():
                break
        assert host.case_runs(), "the call's micro-VM never started"
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    started = time.monotonic()
    try:
        asyncio.run(main())
        for _ in range(300):
            if runner.admitted == 0:
                break
            time.sleep(0.1)
    finally:
        runner.close()
    assert runner.admitted == 0 and time.monotonic() - started < 60
    assert host.case_dirs() == []


def test_the_session_keys_are_read_and_checked() -> None:
    found = settings(num_workers=3)
    assert (found.session, found.session_idle_timeout, found.max_sessions) == (False, 300, 12)
    found = settings(session="trajectory", session_idle_timeout=20, max_sessions=5)
    assert (found.session, found.session_idle_timeout, found.max_sessions) == (True, 20, 5)
    assert not settings(session=None).session and not settings(session="none").session
    for config, named in [
        ({"session": "yes"}, "session"),
        ({"session": "trajectory", "sandbox_fusion_url": "http://x/run_code"}, "session"),
        ({"session_idle_timeout": 0}, "session_idle_timeout"),
        ({"max_sessions": 0}, "max_sessions"),
    ]:
        with pytest.raises(ValueError, match=named):
            settings(**config)


def test_the_example_and_the_readme_name_every_config_key() -> None:
    root = Path(__file__).resolve().parent.parent
    example = yaml.safe_load((root / "examples" / "code_tool.yaml").read_text())
    (entry,) = example["tools"]
    config = entry["config"]
    assert set(config) == set(_tool.KNOWN_KEYS) - {"enable_global_rate_limit"}
    ToolSettings.from_config(config)  # every value valid
    readme = (root / "README.md").read_text()
    section = readme[readme.index("## Tool calls in verl's agent loop") :]
    section = section[: section.index("\n## ", 1)]
    assert [key for key in _tool.KNOWN_KEYS - {"type"} if f"| `{key}` |" not in section] == []
