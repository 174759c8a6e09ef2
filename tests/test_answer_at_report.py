"""A case is answered once the runner's report is whole: hluk's teardown and exit are awaited
off the case's path (hluk/ending.py), reaped, and killed past their grace, said once.

The stand-in's HLUK_STANDIN_TEARDOWN_SECONDS makes its micro-VM's teardown slow, and its
HLUK_STANDIN_EXIT_LOG says which hluks exited of themselves (a killed one writes nothing).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from hostside import Host, result, run

from verl_hyperlight import deadlines, settings
from verl_hyperlight.case import api
from verl_hyperlight.hluk import ending

TEARDOWN_SECONDS = 30.0


@pytest.fixture
def slow_teardown(host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    exit_log = tmp_path / "exits"
    exit_log.write_text("")
    monkeypatch.setenv("HLUK_STANDIN_TEARDOWN_SECONDS", str(TEARDOWN_SECONDS))
    monkeypatch.setenv("HLUK_STANDIN_EXIT_LOG", str(exit_log))
    return exit_log


def exited(exit_log: Path) -> list[str]:
    return exit_log.read_text().split()


@pytest.mark.parametrize("ready_guests", ["0", "2"])
@pytest.mark.parametrize("language", ["python", "nodejs"])
def test_a_case_is_answered_at_its_report_and_its_hluk_ended_off_its_path(
    host: Host,
    slow_teardown: Path,
    monkeypatch: pytest.MonkeyPatch,
    language: str,
    ready_guests: str,
) -> None:
    monkeypatch.setenv(settings.READY_GUESTS.name, ready_guests)
    # Each teardown long enough to be seen, and a grace past it even on a loaded machine: each
    # hluk ends of itself. Seen means past the warm-up's too, whose teardown begins before the
    # case's guest starts: 1 s was not, on CI's loaded 3.13 leg (a nodejs case, ready guests
    # on, answered after the warm-up's hluk had exited).
    monkeypatch.setenv("HLUK_STANDIN_TEARDOWN_SECONDS", "5")
    monkeypatch.setattr(deadlines, "EXIT_GRACE_SECONDS", 20.0)
    code = "print(6 * 7)" if language == "python" else "console.log(6 * 7)"
    response = run(code, language=language)
    assert result(response)[:4] == ("Success", "Finished", 0, "42\n")
    # Answered while its hluk (and the warm-up's) still tear their micro-VMs down.
    assert exited(slow_teardown) == [] and not ending.wait(0)
    api.close()  # waits for them: each exits of itself, and is reaped
    assert ending.wait(0)
    # The warm-up's hluk and the case's exited of themselves (ready guests still waiting for a
    # case were ended by close, killed).
    assert len(exited(slow_teardown)) == 2
    assert host.case_dirs() == []


def test_a_hluk_past_its_grace_after_the_report_is_killed_and_said_once(
    host: Host,
    slow_teardown: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(deadlines, "EXIT_GRACE_SECONDS", 0.5)
    monkeypatch.setattr(ending, "_overruns", type(ending._overruns)())
    caplog.set_level(logging.WARNING, "verl_hyperlight")
    answers = [result(run(f"print({i})"))[3] for i in range(3)]
    assert answers == ["0\n", "1\n", "2\n"]
    assert ending.wait(10)
    assert exited(slow_teardown) == []  # each killed, none waited for its 30 s
    said = [r.getMessage() for r in caplog.records if "had not ended" in r.getMessage()]
    assert len(said) == 1 and "was killed" in said[0], said
    assert host.case_dirs() == []


def test_a_notebook_keeps_its_hluk_between_calls(host: Host, slow_teardown: Path) -> None:
    from verl_hyperlight.agent.notebook import Notebook

    notebook = Notebook("hyperlight://", 1024)
    try:
        first, _ = notebook.run("x = 41", 10, None)
        second, _ = notebook.run("print(x + 1)", 10, None)
        assert notebook.alive and notebook.generation == 1
    finally:
        notebook.close()
    assert first is not None and first["status"] == "Success"
    assert second is not None and second["run_result"]["stdout"] == "42\n"


def test_cases_back_to_back_share_one_ender_thread_which_ends_with_nothing_to_end(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Back to back on a loaded machine is further apart than the usual 1 s (CI's 3.13 leg saw
    # three threads): the linger is the rule under test, not its length.
    monkeypatch.setattr(ending, "LINGER_SECONDS", 60.0)

    def enders() -> set[threading.Thread]:  # the objects: a new thread may reuse an ident
        return {t for t in threading.enumerate() if t.name == "verl-hyperlight-ender"}

    seen: set[threading.Thread] = set()
    for i in range(5):
        assert result(run(f"print({i})"))[3] == f"{i}\n"
        seen |= enders()
    # One thread took every hand-off, lingering between cases rather than started for each.
    assert len(seen) == 1, seen
    assert ending.wait(30)  # each hluk ended, and the thread with them, told not to linger
    assert enders() == set()
    thread = next(iter(seen))
    assert result(run("print(5)"))[3] == "5\n"  # the next hand-off starts another
    assert enders() and thread not in enders()
