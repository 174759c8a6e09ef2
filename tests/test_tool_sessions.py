"""The code tool's notebooks (`session: trajectory`), without verl, on the stand-in: state kept
within a trajectory and invisible to another, one call at a time, ended by release, by idle
time, by a call past its time limit or one that ends its guest; the cap; backend failures; and
nothing left behind. tests/test_tool.py drives the same through verl's own loader."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hostside import Host, fail_with, notebooks, still_running, wait_for

from verl_hyperlight import settings as _settings
from verl_hyperlight.agent import calls as _tool
from verl_hyperlight.agent.calls import (
    NOT_RUN,
    NOTEBOOK_RESTARTED,
    NOTEBOOKS_FULL,
    CodeRunner,
    ToolSettings,
)
from verl_hyperlight.hluk import spawn as _spawn

pytestmark = pytest.mark.once


def tool(**config: Any) -> CodeRunner:
    return CodeRunner(
        ToolSettings.from_config(
            {"sandbox_fusion_url": "hyperlight://", "session": "trajectory", **config}
        )
    )


@pytest.fixture
def runner(host: Host) -> Iterator[CodeRunner]:
    found = tool(num_workers=4)
    yield found
    held = notebooks()
    found.close()
    assert wait_for(lambda: not still_running(held))


def ask(runner: CodeRunner, code: str, notebook_key: str | None = "a", **parameters: Any) -> str:
    text, _ = asyncio.run(runner.call({"code": code, **parameters}, notebook_key))
    return text


def test_state_is_kept_across_a_trajectorys_calls(runner: CodeRunner) -> None:
    assert ask(runner, "import json\nx = 41\nprint('set')") == "set\n"
    assert ask(runner, "x += 1\nprint(json.dumps({'x': x}))") == '{"x": 42}\n'
    assert ask(runner, "open('notes.txt', 'w').write('kept')") == ""
    assert ask(runner, "print(open('notes.txt').read())") == "kept\n"
    assert ask(runner, "def f(n):\n    return n * x\nprint(f(2))") == "84\n"
    assert ask(runner, "print(f(3))") == "126\n"
    assert len(notebooks()) == 1  # one micro-VM for all of it


def test_another_trajectory_sees_none_of_it(runner: CodeRunner) -> None:
    ask(runner, "secret = 7\nopen('mine.txt', 'w').write('a')", notebook_key="a")
    other = ask(
        runner, "import os\nprint('secret' in globals(), os.listdir('.'))", notebook_key="b"
    )
    assert other == "False []\n"
    assert ask(runner, "print(secret)", notebook_key="a") == "7\n"
    assert len(notebooks()) == 2


def test_calls_without_a_notebook_key_stay_stateless(runner: CodeRunner) -> None:
    ask(runner, "y = 1", notebook_key=None)
    assert "NameError" in ask(runner, "print(y)", notebook_key=None)
    assert not notebooks()


def test_errors_exits_and_non_ascii_text_in_a_notebook(runner: CodeRunner) -> None:
    text = ask(runner, "def g():\n    raise ValueError('bad value')\ng()")
    assert text.startswith("Traceback (most recent call last):\n")
    assert 'File "<cell 1>", line 3, in <module>' in text
    assert text.endswith("ValueError: bad value\n")
    # Neither an exception nor SystemExit ends the notebook; the model's text goes both ways.
    assert ask(runner, "z = 'héllo ✓ 世界'\nimport sys\nsys.exit(3)") == ""
    assert ask(runner, "print(z[::-1])\nimport sys\nprint('é', file=sys.stderr)") == (
        "界世 ✓ olléh\né\n"
    )
    big = ask(runner, "print('x' * 3_000_000)")
    assert big == "x" * 3_000_000 + "\n"
    assert ask(runner, "print(len(z))") == "10\n"


def test_input_and_the_console_cannot_be_read_by_a_call(runner: CodeRunner) -> None:
    # stdin is empty for a call, as for a case with no input: the requests stay the runner's.
    assert ask(runner, "import sys\nprint(repr(sys.stdin.read()))") == "''\n"
    assert ask(runner, "print(input())").endswith("EOFError: EOF when reading a line\n")
    assert ask(runner, "print('still here')") == "still here\n"


def test_a_trajectorys_calls_that_arrive_together_run_one_after_another(
    runner: CodeRunner,
) -> None:
    ask(runner, "import time\nlog = []")
    code = (
        "start = time.monotonic()\ntime.sleep(0.2)\nlog.append((start, time.monotonic()))\n"
        "print(len(log))"
    )

    async def together() -> list[tuple[str, dict[str, Any]]]:
        return list(await asyncio.gather(*(runner.call({"code": code}, "a") for _ in range(4))))

    answers = asyncio.run(together())
    assert sorted(text for text, _ in answers) == ["1\n", "2\n", "3\n", "4\n"]
    spans = ask(runner, "print(all(a[1] <= b[0] for a, b in zip(log, log[1:])), len(log))")
    assert spans == "True 4\n"


def test_release_ends_the_notebook_and_its_micro_vm(runner: CodeRunner) -> None:
    ask(runner, "x = 1")
    held = notebooks()
    assert len(held) == 1
    runner.release("a")
    assert wait_for(lambda: not still_running(held))
    assert "NameError" in ask(runner, "print(x)")
    runner.release("never-used")  # nothing to end: nothing happens


def test_an_idle_notebook_is_ended_after_its_idle_timeout(host: Host) -> None:
    runner = tool(session_idle_timeout=0.5)
    try:
        ask(runner, "x = 1")
        held = notebooks()
        assert len(held) == 1
        assert wait_for(lambda: not still_running(held), 10)
        text, found = asyncio.run(runner.call({"code": "print(x)"}, "a"))
        assert "NameError" in text and text.endswith("\n" + NOTEBOOK_RESTARTED)
        assert found["session_restarted"] is True
    finally:
        runner.close()


def test_a_call_past_its_timeout_ends_its_notebook_and_says_so(runner: CodeRunner) -> None:
    ask(runner, "x = 1")
    held = notebooks()
    text = ask(runner, "import time\ntime.sleep(30)", timeout=1)
    assert text == "no stdout here\n" + NOTEBOOK_RESTARTED
    assert wait_for(lambda: not still_running(held))
    assert "NameError" in ask(runner, "print(x)")  # the next call starts a fresh one
    detailed = tool(detailed_errors=True)
    try:
        text = ask(detailed, "print('before', flush=True)\nwhile True: pass", timeout=1)
        # As a case past its time limit is answered: its output is not kept.
        assert text == (
            "Time limit exceeded: the code ran past 1 s and was stopped.\n" + NOTEBOOK_RESTARTED
        )
    finally:
        detailed.close()


def test_a_call_that_ends_its_guest_ends_its_notebook(runner: CodeRunner) -> None:
    ask(runner, "x = 1")
    text, found = asyncio.run(
        runner.call({"code": "print('bye', flush=True)\nimport os\nos._exit(0)"}, "a")
    )
    assert text == "bye\n" + NOTEBOOK_RESTARTED and found["session_restarted"] is True
    assert "NameError" in ask(runner, "print(x)")


def test_a_notebook_ended_between_calls_runs_the_next_call_in_a_new_one(
    runner: CodeRunner,
) -> None:
    # A thread of an earlier call ends the guest after that call was answered: the next call
    # finds it gone, runs in a new notebook (nothing of it had run) and says the state is lost.
    ask(
        runner,
        "import os, threading, time\nx = 1\n"
        "threading.Thread(target=lambda: (time.sleep(0.5), os._exit(0))).start()",
    )
    time.sleep(1.5)
    text, found = asyncio.run(runner.call({"code": "print('x' in globals())"}, "a"))
    assert text == "False\n" + NOTEBOOK_RESTARTED and found["session_restarted"] is True
    assert ask(runner, "print('after')") == "after\n"


def test_at_max_sessions_the_least_recently_used_idle_notebook_makes_room(host: Host) -> None:
    """A new trajectory at the cap ends the notebook used longest ago, not refused; the
    trajectory whose notebook it was is told, at its next call, that its state is gone."""
    runner = tool(max_sessions=2)
    try:
        ask(runner, "x = 'a'", notebook_key="a")
        ask(runner, "x = 'b'", notebook_key="b")
        assert ask(runner, "print(x)", notebook_key="a") == "a\n"  # b is now the least recent
        assert ask(runner, "print(3)", notebook_key="c") == "3\n"
        assert wait_for(lambda: len(notebooks()) == 2)  # b's is closed in a thread
        assert ask(runner, "print(x)", notebook_key="a") == "a\n"
        text, found = asyncio.run(runner.call({"code": "print('x' in globals())"}, "b"))
        assert (text, found["session_restarted"]) == ("False\n" + NOTEBOOK_RESTARTED, True)
        assert ask(runner, "print('x' in globals())", notebook_key="b") == "False\n"  # told once
    finally:
        runner.close()


def test_at_max_sessions_all_in_use_a_call_is_answered_at_once(
    host: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_tool, "_once", _tool._Once())  # warnings said once per process
    runner = tool(max_sessions=2)
    code = "import time\ntime.sleep(2)\nprint(x)"

    async def main() -> list[str]:
        running = [asyncio.ensure_future(runner.call({"code": code}, key)) for key in "ab"]
        await asyncio.sleep(0)  # both own their notebooks now
        for _ in range(2):
            text, found = await runner.call({"code": "print(3)"}, "c")
            assert (text, found["status"]) == (NOTEBOOKS_FULL, "sessions-full")
        assert not any(call.done() for call in running)  # answered without waiting for them
        return [text for text, _ in await asyncio.gather(*running)]

    try:
        ask(runner, "x = 1", notebook_key="a")
        ask(runner, "x = 2", notebook_key="b")
        assert asyncio.run(main()) == ["1\n", "2\n"]
        assert len([r for r in caplog.records if "max_sessions" in r.getMessage()]) == 1
        assert ask(runner, "print(3)", notebook_key="c") == "3\n"
    finally:
        runner.close()


def test_idle_notebooks_make_room_for_a_new_one(host: Host) -> None:
    runner = tool(max_sessions=1, session_idle_timeout=60)
    try:
        ask(runner, "x = 1", notebook_key="a")
        runner.notebooks.by_key["a"].last_used -= 120  # type: ignore[union-attr]
        assert ask(runner, "print(2)", notebook_key="b") == "2\n"
        assert wait_for(lambda: len(notebooks()) == 1)  # "a" is closed in a thread
    finally:
        runner.close()


class Trajectory:
    """Stands for verl's AgentData: a plain object alive exactly as long as its trajectory."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id


def in_trajectory(runner: CodeRunner, trajectory: Trajectory, code: str) -> str:
    text, _ = asyncio.run(runner.call({"code": code}, trajectory.request_id, trajectory))
    return text


def test_a_notebook_ends_when_its_trajectory_object_is_collected(runner: CodeRunner) -> None:
    trajectories = [Trajectory("r1")]
    assert in_trajectory(runner, trajectories[0], "x = 5") == ""
    assert in_trajectory(runner, trajectories[0], "print(x)") == "5\n"
    held = notebooks()
    assert len(held) == 1
    trajectories.clear()  # its run returned: nothing refers to it any more
    assert wait_for(lambda: not still_running(held))
    assert runner.notebooks is not None and wait_for(lambda: not runner.notebooks.by_key)  # type: ignore[union-attr]
    assert not runner.notebooks.left and not runner.notebooks.keys


def test_trajectories_with_equal_request_ids_keep_notebooks_of_their_own(
    runner: CodeRunner,
) -> None:
    """verl's full_determinism names trajectories det-N, again at every step."""
    first, second = Trajectory("det-0"), Trajectory("det-0")
    in_trajectory(runner, first, "x = 'first'")
    assert "NameError" in in_trajectory(runner, second, "print(x)")
    in_trajectory(runner, second, "x = 'second'")
    held = notebooks()
    assert len(held) == 2
    del first
    assert wait_for(lambda: len(still_running(held)) == 1)
    assert in_trajectory(runner, second, "print(x)") == "second\n"


def test_a_backend_failure_answers_a_neutral_text_logged_once(
    host: Host,
    fail_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    runner, detailed = tool(), tool(detailed_errors=True)
    try:
        ask(runner, "x = 1")  # warm; the notebook is up
        runner.release("a")
        fail_with(monkeypatch, fail_file, "failed to open /dev/kvm: Permission denied", 1000)

        def errors() -> int:
            return sum(1 for r in caplog.records if r.levelname == "ERROR")

        for _ in range(3):
            assert ask(detailed, "print(1)") == NOT_RUN
        assert ask(runner, "print(1)") == "no stdout here"  # the removed tool's text
        # The failure and the guest's gate opening, as run_code logs them; no more per call.
        assert "kvm" in caplog.text and "Traceback" not in caplog.text and errors() <= 2
        logged = errors()
        for _ in range(5):
            assert ask(detailed, "print(1)") == NOT_RUN
        assert errors() == logged
        assert not notebooks()
        # A notebook that could not start holds no place among max_sessions.
        assert runner.notebooks is not None and detailed.notebooks is not None
        assert not runner.notebooks.by_key and not detailed.notebooks.by_key
    finally:
        runner.close()
        detailed.close()


def test_a_cancelled_call_ends_its_notebook(runner: CodeRunner) -> None:
    held: dict[int, bytes] = {}

    async def main() -> None:
        await runner.call({"code": "x = 1"}, "a")
        held.update(notebooks())
        call = asyncio.ensure_future(runner.call({"code": "import time; time.sleep(60)"}, "a"))
        await asyncio.sleep(1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(main())
    assert held and wait_for(lambda: not still_running(held))
    # The cancelled call's answer never reached the trajectory: its next call is told.
    text, found = asyncio.run(runner.call({"code": "print(x)"}, "a"))
    assert "NameError" in text and text.endswith("\n" + NOTEBOOK_RESTARTED)
    assert found["session_restarted"] is True
    assert ask(runner, "x = 2\nprint(x)") == "2\n"


def test_other_languages_run_stateless_beside_the_notebook(runner: CodeRunner) -> None:
    ask(runner, "x = 1")
    text = ask(runner, "def test_one():\n    assert 1\n", language="pytest")
    assert "1 passed" in text or "pytest" in text  # run by run_code, not in the notebook
    assert ask(runner, "print(x)") == "1\n"


def test_code_too_large_for_a_call_is_answered_and_logged_clearly(
    runner: CodeRunner, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_tool, "_once", _tool._Once())
    assert ask(runner, "x = '" + "a" * 2_000_000 + "'") == "no stdout here"
    assert "a notebook call takes at most about" in caplog.text
    assert ask(runner, "x = '" + "a" * 200_000 + "'\nprint(len(x))") == "200000\n"


@pytest.mark.parametrize("way", _settings.SPAWN_WAYS)
def test_a_notebook_runs_on_every_way_of_starting_hluk(
    host: Host, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    if way == "setpriv" and _spawn.setpriv() is None:
        pytest.skip("no setpriv with --pdeathsig here")
    monkeypatch.setenv(_settings.SPAWN.name, way)
    runner = tool()
    try:
        ask(runner, "x = 'kept'")
        assert ask(runner, "print(x)") == "kept\n"
        held = notebooks()
        assert len(held) == 1
    finally:
        runner.close()
    assert wait_for(lambda: not still_running(held))


def test_many_trajectories_at_once_each_keep_their_own_notebook(host: Host) -> None:
    """An agent-loop worker with 64 trajectories in flight, each calling 3 times, 8 calls
    running at once: every trajectory reads back only its own state, and nothing is left."""
    runner = tool(num_workers=8, max_sessions=64)

    async def trajectory(n: int) -> list[str]:
        texts = []
        for code in (f"mine = {n}\nseen = [{n}]", "seen.append(mine * 2)", "print(mine, seen)"):
            texts.append((await runner.call({"code": code}, f"t{n}"))[0])
        return texts

    async def all_of_them() -> list[list[str]]:
        return list(await asyncio.gather(*(trajectory(n) for n in range(64))))

    try:
        answers = asyncio.run(all_of_them())
        assert answers == [["", "", f"{n} [{n}, {2 * n}]\n"] for n in range(64)]
        held = notebooks()
        assert len(held) == 64
    finally:
        runner.close()
    assert wait_for(lambda: not still_running(held), 30)


def test_a_notebook_past_its_console_cap_is_restarted_and_says_so(
    runner: CodeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hluk keeps all its guest printed in memory while it runs: a notebook whose calls printed
    past the cap gets a new micro-VM (the old one ended), told to the model as any restart."""
    from verl_hyperlight.hluk.notebook import NotebookProcess

    monkeypatch.setattr(NotebookProcess, "console_limit", 1_500_000)
    assert ask(runner, "x = 1\nprint('x' * 400_000)") == "x" * 400_000 + "\n"
    (first,) = notebooks()
    assert ask(runner, "print('y' * 400_000)") == "y" * 400_000 + "\n"
    assert ask(runner, "print(x)") == "1\n"  # about 1.07 MB of console (base64): not yet
    assert ask(runner, "print('z' * 400_000)") == "z" * 400_000 + "\n"  # 1.6 MB: spent
    answer = ask(runner, "print('x' in globals())")
    assert answer == f"False\n{NOTEBOOK_RESTARTED}"
    assert first not in notebooks() and len(notebooks()) == 1
    assert ask(runner, "print('after')") == "after\n"


def test_a_notebook_past_its_calls_cap_is_restarted_and_says_so(
    runner: CodeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl_hyperlight.agent import notebook as _notebook

    monkeypatch.setattr(_notebook, "CALLS_LIMIT", 3)
    for n in range(3):
        assert ask(runner, f"n = {n}\nprint(n)") == f"{n}\n"
    assert ask(runner, "print('n' in globals())") == f"False\n{NOTEBOOK_RESTARTED}"
