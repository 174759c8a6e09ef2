"""The package's settings: each declared once, read per use and only through settings.py, and
a value that cannot be used said once, in one line, however often it is read."""

from __future__ import annotations

import ast
import logging
import os
from pathlib import Path

import pytest
from hostside import Host, result, run

from verl_hyperlight import settings as _settings
from verl_hyperlight.errors import CauseCounts
from verl_hyperlight.hluk import process as _hluk
from verl_hyperlight.hluk import spawn as _spawn

SOURCE = Path(_settings.__file__).resolve().parent
# The modules that read the environment for what is not a setting of this package's, and why.
READERS_OF_OTHERS = {
    "hluk/spawn.py": "what the spawner's Python needs to start (INTERPRETER_ENVIRONMENT)",
    "commands/doctor.py": "verl's own VERL_USE_EXTERNAL_* settings, checked as verl reads them",
}


def said_about(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if name in r.getMessage()]


def test_a_bad_value_is_said_once_in_one_line_however_many_cases_read_it(
    host: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(_settings.STARTUP_TIMEOUT.name, "soon")
    with caplog.at_level(logging.DEBUG, logger="verl_hyperlight"):
        # The first case's warm-up reads it too, as its stall deadline.
        results = [result(run("print('ran')"))[:4] for _ in range(3)]
        monkeypatch.setenv(_settings.STARTUP_TIMEOUT.name, "later")
        results.append(result(run("print('ran')"))[:4])
    assert results == [("Success", "Finished", 0, "ran\n")] * 4
    assert said_about(caplog, _settings.STARTUP_TIMEOUT.name) == [
        "verl-hyperlight: VERL_HYPERLIGHT_STARTUP_TIMEOUT='soon' is not a positive number of "
        "seconds; using 60",
        "verl-hyperlight: VERL_HYPERLIGHT_STARTUP_TIMEOUT='later' is not a positive number of "
        "seconds; using 60",
    ]
    said = [r for r in caplog.records if _settings.STARTUP_TIMEOUT.name in r.getMessage()]
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in said)


@pytest.mark.parametrize("text", ["0", "-3", "nan", "inf", "soon", ""])
def test_seconds_that_are_not_a_positive_number_are_the_default(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    monkeypatch.setattr(_settings, "_unusable", CauseCounts())
    monkeypatch.setenv(_settings.WARM_UP_TIMEOUT.name, text)
    assert _settings.WARM_UP_TIMEOUT.value() == 900.0
    assert said_about(caplog, _settings.WARM_UP_TIMEOUT.name) == [
        f"verl-hyperlight: VERL_HYPERLIGHT_WARM_UP_TIMEOUT={text!r} is not a positive number of "
        "seconds; using 900"
    ]
    monkeypatch.setenv(_settings.WARM_UP_TIMEOUT.name, "2.5")
    assert _settings.WARM_UP_TIMEOUT.value() == 2.5


def test_each_setting_is_read_as_the_environment_is_at_each_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(_settings.STARTUP_TIMEOUT.name, raising=False)
    assert _settings.STARTUP_TIMEOUT.value() == 60.0
    monkeypatch.setenv(_settings.STARTUP_TIMEOUT.name, "7")
    assert _settings.STARTUP_TIMEOUT.value() == 7.0
    os.environ.update({_settings.STARTUP_TIMEOUT.name: "8"})
    assert _settings.STARTUP_TIMEOUT.value() == 8.0
    monkeypatch.delenv(_settings.STARTUP_TIMEOUT.name)
    assert _settings.STARTUP_TIMEOUT.value() == 60.0
    monkeypatch.setenv(_settings.HLUK_PATH.name, "")  # empty: as if not set
    assert _settings.HLUK_PATH.value() is None
    monkeypatch.setenv(_settings.POD_NAME.name, "")  # as the service answers it: as it is
    assert _settings.POD_NAME.value() == ""


def test_the_way_hluk_is_started_is_one_of_the_ways_else_the_spawner(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_settings, "_unusable", CauseCounts())
    for text, way in [("", "spawner"), ("fork", "fork"), ("setpriv", "setpriv")]:
        monkeypatch.setenv(_settings.SPAWN.name, text)
        assert _settings.SPAWN.value() == way
    assert said_about(caplog, _settings.SPAWN.name) == []
    monkeypatch.setenv(_settings.SPAWN.name, "vfork")
    assert _settings.SPAWN.value() == "spawner"
    assert said_about(caplog, _settings.SPAWN.name) == [
        "verl-hyperlight: VERL_HYPERLIGHT_SPAWN='vfork' is not one of spawner, setpriv, fork; "
        "using spawner"
    ]


def test_hluks_environment_is_what_it_reads_and_what_the_operator_adds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name not in ("PATH", "HOME"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HLUK_REGISTRY", "registry.example")
    monkeypatch.setenv("WRAPPER_TOKEN", "kept")
    monkeypatch.setenv("WRAPPER_MODE", "fast")
    monkeypatch.setenv("OTHER_SECRET", "never")
    monkeypatch.setenv(_settings.HLUK_ENV.name, " OTHER_NAME , WRAPPER_*,,")
    assert _settings.HLUK_ENV.value() == _settings.Additions(("OTHER_NAME",), ("WRAPPER_",))
    assert _hluk.environment() == {
        "PATH": os.environ["PATH"],
        "HOME": os.environ["HOME"],
        "HLUK_REGISTRY": "registry.example",
        "WRAPPER_TOKEN": "kept",
        "WRAPPER_MODE": "fast",
    }
    monkeypatch.setenv("OTHER_NAME", "added")  # a change of a variable alone is seen
    monkeypatch.delenv("WRAPPER_MODE")
    assert _hluk.environment()["OTHER_NAME"] == "added"
    assert "WRAPPER_MODE" not in _hluk.environment()


def test_the_environment_is_read_as_os_environ_holds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_HYPERLIGHT_TEST_SET", "é and \udcff")  # undecodable bytes too
    monkeypatch.delenv("HOME", raising=False)
    os.environ.setdefault("VERL_HYPERLIGHT_TEST_DEFAULT", "x")
    monkeypatch.delenv("VERL_HYPERLIGHT_TEST_DEFAULT")
    assert _settings.variables(tuple(os.environ)) == dict(os.environ)
    assert _settings.variables((), ("",)) == dict(os.environ)


def test_the_declarations_make_a_reference_table() -> None:
    names = [setting.name for setting in _settings.ALL]
    assert len(set(names)) == len(names)
    declared = {
        value.name for value in vars(_settings).values() if isinstance(value, _settings.Setting)
    }
    assert declared == set(names)  # each declared one is listed
    for setting in _settings.ALL:
        row = f"| `{setting.name}` | {setting.unset} | {setting.description} |"
        assert "\n" not in row and setting.unset and setting.description.endswith("."), row


def environment_reads(tree: ast.AST) -> list[int]:
    """The lines that touch the environment: os.environ, os.environb, os.getenv."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
        and node.attr in ("environ", "environb", "getenv", "putenv", "unsetenv")
    ]


def test_every_declared_variable_is_read_only_through_settings() -> None:
    declared = {setting.name for setting in _settings.ALL}
    readers = {}
    for path in SOURCE.rglob("*.py"):
        relative = path.relative_to(SOURCE).as_posix()
        tree = ast.parse(path.read_text())
        if relative != "settings.py" and environment_reads(tree):
            readers[relative] = tree
    assert set(readers) == set(READERS_OF_OTHERS), readers.keys()
    for relative, tree in readers.items():
        named = {
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        }
        assert not declared & named, relative
    assert not declared & set(_spawn.INTERPRETER_ENVIRONMENT)
