"""The agent-loop code tool's core, without verl: its settings, the answer text, the last
expression shown as a notebook shows it, and how calls are bounded (tests/test_tool.py loads the
verl class through verl itself)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from hostside import Host, wait_for

from verl_hyperlight import node
from verl_hyperlight.agent import calls as _tool
from verl_hyperlight.agent import pool as _pool
from verl_hyperlight.agent.calls import (
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
    assert (found.notebook_per_trajectory, found.session_idle_timeout) == (False, 300)
    found = settings(session="trajectory", num_workers=3)
    assert found.max_sessions == _tool.default_max_sessions(3, 1536)
    found = settings(session="trajectory", session_idle_timeout=20, max_sessions=5)
    assert (found.notebook_per_trajectory, found.session_idle_timeout, found.max_sessions) == (
        True,
        20,
        5,
    )
    assert not settings(session=None).notebook_per_trajectory
    assert not settings(session="none").notebook_per_trajectory
    for config, named in [
        ({"session": "yes"}, "session"),
        ({"session": "trajectory", "sandbox_fusion_url": "http://x/run_code"}, "session"),
        ({"session_idle_timeout": 0}, "session_idle_timeout"),
        ({"max_sessions": 0}, "max_sessions"),
        ({"session": "trajectory", "memory_limit_mb": 64}, "memory_limit_mb"),
    ]:
        with pytest.raises(ValueError, match=named):
            settings(**config)


def test_max_sessions_is_sized_from_the_nodes_memory_and_the_guests_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The idle notebooks of verl's 8 agent-loop workers, each its micro-VM's whole memory,
    within half the node's memory; never fewer than num_workers."""
    monkeypatch.setattr(node, "memory_mb", lambda: 1024 * 1024)  # a node of 1 TiB

    def sized(**config: Any) -> int:
        return settings(session="trajectory", **config).max_sessions

    assert sized() == 512 * 1024 // (8 * 1536) == 42  # memory_limit_mb 1024: 1536 MiB guests
    assert sized(memory_limit_mb=None) == 512 * 1024 // (8 * 256)  # the image's 256 MiB
    assert sized(memory_limit_mb=4000) == 512 * 1024 // (8 * 6144)
    assert sized(max_sessions=7) == 7
    monkeypatch.setattr(
        node, "memory_mb", lambda: 16 * 1024
    )  # a small node: as many as the calls that run at once
    assert sized(num_workers=6) == 6


def test_the_example_and_the_docs_name_every_config_key() -> None:
    root = Path(__file__).resolve().parent.parent
    example = yaml.safe_load((root / "examples" / "code_tool.yaml").read_text())
    (entry,) = example["tools"]
    config = entry["config"]
    assert set(config) == set(_tool.KNOWN_KEYS) - {"enable_global_rate_limit"}
    ToolSettings.from_config(config)  # every value valid
    section = (root / "docs" / "agent-tools.md").read_text()
    assert [key for key in _tool.KNOWN_KEYS - {"type"} if f"| `{key}` |" not in section] == []


# ---------------------------------------------------------------------------------------------
# Calls at an agent loop's scale, against doubles whose calls block until the test lets them go:
# who gives back a place, a trajectory's turn and its notebook, and when.


class Gate:
    """Where the doubles' calls block until the test lets them go, in any order; a cancelled
    call too, and it is let go last (a real one keeps its thread until its guest is killed and
    reaped, longer than a call of the test takes)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.blocked: list[tuple[threading.Event, threading.Event | None]] = []
        self.open = False

    def wait(self, cancel: threading.Event | None = None) -> None:
        go = threading.Event()
        with self.lock:
            if self.open:
                return
            self.blocked.append((go, cancel))
        go.wait()

    def let_one_go(self, pick: random.Random | None = None) -> bool:
        with self.lock:
            if not self.blocked:
                return False
            if pick is None:
                go, _ = self.blocked.pop(0)
            else:
                running = [n for n, (_, c) in enumerate(self.blocked) if not (c and c.is_set())]
                if not running or pick.random() < 0.05:
                    running = list(range(len(self.blocked)))
                go, _ = self.blocked.pop(pick.choice(running))
        go.set()
        return True

    def let_all_go(self) -> None:
        with self.lock:
            self.open = True
            blocked, self.blocked = self.blocked, []
        for go, _ in blocked:
            go.set()

    def waiting(self) -> int:
        with self.lock:
            return len(self.blocked)


class NotebookDouble:
    """A notebook whose calls block at the gate, instrumented: how many threads were ever in it
    at once, and whether it was closed while a thread was in it or entered once closed. A
    cancelled call ends it, as a real call's cancel stops its guest."""

    gate: ClassVar[Gate] = Gate()
    made: ClassVar[list[NotebookDouble]] = []

    def __init__(self, url: str, memory_limit_mb: int | None) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.most_inside = 0
        self.closed = False
        self.closed_in_use = False
        self.entered_closed = False
        self.process: object | None = None
        self.generation = 0
        self.made.append(self)

    @property
    def alive(self) -> bool:
        return self.process is not None

    def run(
        self, code: str, run_timeout: float, cancel: threading.Event | None
    ) -> tuple[dict[str, Any], None]:
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.entered_closed |= self.closed
        try:
            if self.process is None:
                self.process, self.generation = object(), self.generation + 1
            self.gate.wait(cancel)
            if cancel is not None and cancel.is_set():
                self.process = None
            return run_result("Finished", 0, f"{code}\n", ""), None
        finally:
            with self.lock:
                self.inside -= 1

    def close(self) -> None:
        with self.lock:
            self.closed_in_use |= self.inside > 0
            self.closed = True
            self.process = None


@pytest.fixture
def notebook_double(monkeypatch: pytest.MonkeyPatch) -> type[NotebookDouble]:
    monkeypatch.setattr(NotebookDouble, "gate", Gate())
    monkeypatch.setattr(NotebookDouble, "made", [])
    monkeypatch.setattr(_pool, "Notebook", NotebookDouble)
    return NotebookDouble


def blocking_service(gate: Gate) -> Any:
    def service(**arguments: Any) -> tuple[dict[str, Any], None]:
        gate.wait()
        return run_result("Finished", 0, f"{arguments['code']}\n", ""), None

    return service


def test_a_call_cancelled_while_queued_gives_its_place_back() -> None:
    gate = Gate()
    runner = CodeRunner(
        ToolSettings.from_config(
            {"sandbox_fusion_url": "http://127.0.0.1:9/run_code", "num_workers": 1, "max_queue": 2}
        ),
        blocking_service(gate),
    )

    async def main() -> list[str]:
        texts = []
        # More such cancels than there are places: each must give its place back.
        for n in range(4):
            running = asyncio.ensure_future(runner.call({"code": f"a{n}"}))
            queued = asyncio.ensure_future(runner.call({"code": f"b{n}"}))
            while not gate.waiting():  # a's thread is in its call; b waits for the worker
                await asyncio.sleep(0.01)
            assert not queued.done(), f"b{n} was answered {queued.result()[0]!r}"
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            gate.let_one_go()
            texts.append((await running)[0])
        return texts

    try:
        assert asyncio.run(main()) == [f"a{n}\n" for n in range(4)]
        runner.executor.shutdown(wait=True)  # every thread of the runner has ended
        assert runner.admitted == 0
    finally:
        gate.let_all_go()
        runner.close()


def notebook_runner(**config: Any) -> CodeRunner:
    return CodeRunner(settings(session="trajectory", **config))


def test_a_cancelled_notebook_call_holds_its_notebook_until_its_thread_ends(
    notebook_double: type[NotebookDouble],
) -> None:
    """A cancel, then at once the trajectory's next call and a release: neither enters or
    closes the notebook while the cancelled call's thread is still in it."""
    runner = notebook_runner(num_workers=4)
    gate = notebook_double.gate

    async def main() -> str:
        first = asyncio.ensure_future(runner.call({"code": "first"}, "t"))
        while not gate.waiting():
            await asyncio.sleep(0.01)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        after = asyncio.ensure_future(runner.call({"code": "after"}, "t"))
        await asyncio.to_thread(runner.release, "t")
        await asyncio.sleep(0.2)  # were it let in, the next call would be at the gate by now
        assert [(n.inside, n.closed) for n in notebook_double.made] == [(1, False)]
        gate.let_all_go()
        return (await after)[0]

    try:
        assert asyncio.run(main()).startswith("after\n")
        runner.executor.shutdown(wait=True)
    finally:
        notebook_double.gate.let_all_go()
        runner.close()
    assert all(n.most_inside == 1 and not n.closed_in_use for n in notebook_double.made)


def test_hundreds_of_trajectories_with_random_cancels_leak_no_place_and_share_no_notebook(
    notebook_double: type[NotebookDouble],
) -> None:
    """An agent-loop worker's day in a few seconds: 300 trajectories of four turns, some turns
    of two calls at once, calls cancelled at random (waiting for their turn, queued for a
    worker, running, or just answered), releases, and an idle sweep every 50 ms,
    while the calls' threads end in random order. Afterwards no place is held, and no notebook
    ever had two threads in it, was closed under one, or was entered once closed."""
    runner = notebook_runner(
        num_workers=64, max_queue=2000, max_sessions=400, session_idle_timeout=0.02
    )
    gate = notebook_double.gate
    pick = random.Random(24)
    in_flight: set[asyncio.Future[tuple[str, dict[str, Any]]]] = set()
    answered: list[str] = []
    cancelled = 0

    async def trajectory(n: int) -> None:
        nonlocal cancelled
        for turn in range(4):
            calls = [
                asyncio.ensure_future(runner.call({"code": f"t{n} turn {turn}"}, f"t{n}"))
                for _ in range(pick.choice((1, 1, 2)))
            ]
            in_flight.update(calls)
            for call in calls:
                try:
                    answered.append((await call)[0])
                except asyncio.CancelledError:
                    cancelled += 1
                in_flight.discard(call)
        if pick.random() < 0.5:
            await asyncio.to_thread(runner.release, f"t{n}")

    async def storm() -> None:
        trajectories = asyncio.gather(*(trajectory(n) for n in range(300)))
        while not trajectories.done():
            await asyncio.sleep(0.001)
            for _ in range(pick.randint(0, 6)):
                gate.let_one_go(pick)
            if in_flight and pick.random() < 0.4:
                pick.choice(sorted(in_flight, key=id)).cancel()
        await trajectories

    try:
        asyncio.run(storm())
        gate.let_all_go()  # the threads of the calls cancelled last
        runner.executor.shutdown(wait=True)  # every call's thread has ended
        assert cancelled > 100 and len(answered) > 500
        assert BUSY not in answered
        assert runner.admitted == 0
        assert runner.notebooks is not None
        assert all(not pooled.users for pooled in runner.notebooks.by_key.values())
    finally:
        gate.let_all_go()
        runner.close()
    made = notebook_double.made
    assert len(made) >= 300
    assert [n for n in made if n.most_inside > 1] == []
    assert [n for n in made if n.closed_in_use or n.entered_closed] == []


def test_a_trajectory_that_ends_during_its_call_has_its_notebook_closed_after_it_and_forgotten(
    notebook_double: type[NotebookDouble],
) -> None:
    """Its trajectory object is collected while its cancelled call's thread is still in the
    notebook: the notebook is closed once the thread is out, and nothing of it is kept."""
    runner = notebook_runner(num_workers=2)
    gate = notebook_double.gate
    assert runner.notebooks is not None
    pool = runner.notebooks

    class Trajectory:
        pass

    async def main() -> None:
        trajectories = [Trajectory()]
        call = asyncio.ensure_future(runner.call({"code": "long"}, "r", trajectories[0]))
        while not gate.waiting():
            await asyncio.sleep(0.01)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        del call
        trajectories.clear()
        gc.collect()
        for _ in range(1000):  # until the sweeper has seen the end
            if not pool.keys:
                break
            await asyncio.sleep(0.01)
        assert not pool.keys
        assert [(n.inside, n.closed) for n in notebook_double.made] == [(1, False)]
        gate.let_all_go()

    try:
        asyncio.run(main())
        runner.executor.shutdown(wait=True)
        (notebook,) = notebook_double.made
        assert wait_for(lambda: notebook.closed)  # closed in a thread of its own
        assert not notebook.closed_in_use
        assert not pool.left and not pool.by_key
    finally:
        gate.let_all_go()
        runner.close()
