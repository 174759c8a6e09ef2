"""docs/troubleshooting.md: each message it lists is what verl-hyperlight really says in the
case the page gives for it (made here, on the stand-in), and every cause of a backend failure
diagnosis.py can give has its row."""

from __future__ import annotations

import ast
import io
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import STANDIN
from hostside import KVM_FAILURE, Host, fail_with
from serving import Served

from verl_hyperlight import diagnosis
from verl_hyperlight.case import api as _api
from verl_hyperlight.case import gate as _gate
from verl_hyperlight.case import pytest_library as _pytest_library
from verl_hyperlight.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "troubleshooting.md"


def section(heading: str) -> str:
    """The text of the page's section under `## heading`, up to the next."""
    text = PAGE.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def first_cells(text: str) -> list[str]:
    """The backticked text each table row of `text` opens with."""
    return re.findall(r"^\| `([^`]+)` \|", text, re.MULTILINE)


class Case:
    """What a scenario has at hand: the stand-in host, a solution file, and what was said."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.fixture = request.getfixturevalue  # what only some scenarios need, started then
        self.host: Host = self.fixture("host")
        self.tmp_path: Path = self.fixture("tmp_path")
        self.monkeypatch: pytest.MonkeyPatch = self.fixture("monkeypatch")
        self.capsys: pytest.CaptureFixture[str] = self.fixture("capsys")
        self.caplog: pytest.LogCaptureFixture = self.fixture("caplog")
        self.caplog.set_level(logging.WARNING)
        self.solution = self.tmp_path / "solution.py"
        self.solution.write_text("print(1)\n")
        self.monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO()))  # `run`'s input

    def said(self, *argv: str) -> str:
        """What `verl-hyperlight ARGV` printed and logged."""
        _gate.forget()
        try:
            main(list(argv))
        except SystemExit:  # argparse refusing an argument
            pass
        out = self.capsys.readouterr()
        return out.out + out.err + self.caplog.text

    def run(self, *options: str) -> str:
        return self.said("run", str(self.solution), *options)

    def run_with_hluk_at(self, path: Path) -> str:
        self.monkeypatch.setenv("HLUK_PATH", str(path))
        return self.run()

    def hluk_path(self, text: str | None, mode: int = 0o755) -> Path:
        """HLUK_PATH at a script of `text` (None: at nothing)."""
        path = self.tmp_path / "bin" / "hluk"
        if text is not None:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
            path.chmod(mode)
        self.monkeypatch.setenv("HLUK_PATH", str(path))
        return path


def no_hluk_anywhere(case: Case) -> str:
    case.monkeypatch.delenv("HLUK_PATH")
    empty = case.tmp_path / "empty"
    empty.mkdir()
    case.monkeypatch.setenv("PATH", str(empty))
    return case.run()


def script_of_another_tool(version: str) -> Callable[[Case], str]:
    def scenario(case: Case) -> str:
        case.hluk_path(f"#!/bin/sh\necho '{version}'\n")
        return case.run()

    return scenario


def no_kvm(case: Case) -> str:
    fail_with(case.monkeypatch, case.fixture("fail_file"), KVM_FAILURE, 100)
    return case.run()


def form_encoded_request(case: Case) -> str:
    served: Served = case.fixture("serve")()
    with served.client() as client:  # what `curl -d 'code=print(1)'` sends
        reply = client.post("/run_code", data={"code": "print(1)", "language": "python"})
    assert reply.status_code == 422
    return reply.text


def no_pytest(case: Case) -> str:
    case.monkeypatch.setattr(_pytest_library, "DISTRIBUTIONS", ("pytest-is-not-installed",))
    case.monkeypatch.setattr(_pytest_library, "_current", None)
    case.monkeypatch.setattr(_pytest_library, "_failed", None)
    response, error = _api.run_code(
        "hyperlight://", "def test_x():\n  pass\n", "", None, 10, None, "pytest"
    )
    assert error is None and response is not None
    return str(response["message"])


def a_wrapper_that_does_not_exec_hluk(case: Case) -> str:
    case.hluk_path(f'#!/bin/sh\n{sys.executable} -I -S {STANDIN} "$@"\n')
    return case.said("doctor")


def hluk_installed_off_path(case: Case) -> str:
    folder = case.tmp_path / "installed"
    folder.mkdir()
    (folder / "hluk").write_bytes(Path(os.environ["HLUK_PATH"]).read_bytes())
    (folder / "hluk").chmod(0o755)
    case.monkeypatch.setenv("HLUK_INSTALL_DIR", str(folder))
    return no_hluk_anywhere(case)


def doctor_on_the_stand_in(case: Case) -> str:
    case.monkeypatch.setenv("HLUK_PATH", str(STANDIN))
    case.monkeypatch.setenv("VERL_HYPERLIGHT_HLUK_ENV", "HLUK_STANDIN_*")
    return case.said("doctor")


def a_misspelled_setting(case: Case) -> str:
    case.monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMOUT", "120")
    return case.said("doctor")


# What you see -> how to make it happen.
SCENARIOS: dict[str, Callable[[Case], str]] = {
    "hluk was not found on PATH": no_hluk_anywhere,
    "every code reward is zero while this lasts": no_hluk_anywhere,
    "(where HLUK_PATH points)": lambda case: case.run_with_hluk_at(case.hluk_path(None)),
    "is a directory, not hluk": lambda case: case.run_with_hluk_at(case.tmp_path),
    "is not executable": lambda case: case.run_with_hluk_at(case.hluk_path("#!/bin/sh\n", 0o644)),
    "is not hluk: its --version printed no hluk version": script_of_another_tool("tool 1.0"),
    "verl-hyperlight needs": script_of_another_tool("hluk 0.1.0"),
    "hluk cannot use /dev/kvm": no_kvm,
    "did you mean 'hyperlight://'?": lambda case: case.said(
        "serve", "--port", "0", "--url", "hyperlight:/"
    ),
    "is not a memory size": lambda case: case.run("--memory-limit-mb", "-5"),
    "is below what the python image boots in": lambda case: case.run("--memory-limit-mb", "100"),
    "more than half this node's memory": lambda case: case.run("--memory-limit-mb", "100000000"),
    "is not supported": lambda case: str(
        _api.run_code("hyperlight://", "puts 1", "", None, 10, None, "ruby")[0]
    ),
    "Input should be a valid dictionary": form_encoded_request,
    "needs pytest on this node": no_pytest,
    "is a script that does not exec hluk": a_wrapper_that_does_not_exec_hluk,
    "hluk is installed at": hluk_installed_off_path,
    "is the test stand-in": doctor_on_the_stand_in,
    "set but no setting of verl-hyperlight": a_misspelled_setting,
}


@pytest.mark.parametrize("message", SCENARIOS)
def test_each_message_the_page_lists_is_said_in_its_case(
    message: str, request: pytest.FixtureRequest
) -> None:
    said = SCENARIOS[message](Case(request))
    assert message in said, said


def test_the_page_lists_the_messages_made_here() -> None:
    assert first_cells(section("What you see")) == list(SCENARIOS)


def causes_diagnosis_gives() -> set[str]:
    """The cause of each Diagnosis diagnosis.py makes (its third argument, or `cause=`, also
    through `_failed`): a constant, or a pattern with `*` for each value an f-string puts in."""
    tree = ast.parse(Path(diagnosis.__file__).read_text())
    # The module's named causes (HLUK_OFF_PATH = "hluk-off-path"), which doctor compares with.
    named = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }
    causes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
            "Diagnosis",
            "_failed",
        ):
            given = {keyword.arg: keyword.value for keyword in node.keywords}
            cause = node.args[2] if len(node.args) > 2 else given["cause"]
            if isinstance(cause, ast.Name) and cause.id in named:
                causes.add(named[cause.id])
                continue
            if isinstance(cause, ast.Name):  # _failed's own call of Diagnosis
                continue
            if isinstance(cause, ast.Constant):
                causes.add(str(cause.value))
            else:
                assert isinstance(cause, ast.JoinedStr), ast.dump(cause)
                causes.add(
                    "".join(
                        str(part.value) if isinstance(part, ast.Constant) else "*"
                        for part in cause.values
                    )
                )
    return causes


def test_every_cause_of_a_backend_failure_has_its_row() -> None:
    rows = first_cells(section("Backend failures by cause"))
    assert len(rows) == len(set(rows))
    assert set(rows) == causes_diagnosis_gives() | {"internal *"}
