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

SOURCE = Path(_settings.__file__).resolve().parent


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


def test_the_way_hluk_is_started_is_one_of_the_ways_else_direct(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_settings, "_unusable", CauseCounts())
    for text, way in [
        ("", "direct"),
        ("spawner", "spawner"),
        ("fork", "fork"),
        ("setpriv", "setpriv"),
    ]:
        monkeypatch.setenv(_settings.SPAWN.name, text)
        assert _settings.SPAWN.value() == way
    assert said_about(caplog, _settings.SPAWN.name) == []
    monkeypatch.setenv(_settings.SPAWN.name, "vfork")
    assert _settings.SPAWN.value() == "direct"
    assert said_about(caplog, _settings.SPAWN.name) == [
        "verl-hyperlight: VERL_HYPERLIGHT_SPAWN='vfork' is not one of direct, spawner, setpriv, "
        "fork; using direct"
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
    assert _settings.hluk_environment() == {
        "PATH": os.environ["PATH"],
        "HOME": os.environ["HOME"],
        "HLUK_REGISTRY": "registry.example",
        "WRAPPER_TOKEN": "kept",
        "WRAPPER_MODE": "fast",
    }
    monkeypatch.setenv("OTHER_NAME", "added")  # a change of a variable alone is seen
    monkeypatch.delenv("WRAPPER_MODE")
    assert _settings.hluk_environment()["OTHER_NAME"] == "added"
    assert "WRAPPER_MODE" not in _settings.hluk_environment()
    # What was found is kept only while the environment is as it was: a value changed in
    # place, by a name or a prefix, is seen at the next read, and a caller's change to the
    # answer does not reach the next.
    monkeypatch.setenv("WRAPPER_TOKEN", "changed")
    monkeypatch.setenv("HLUK_REGISTRY", "other.example")
    answer = _settings.hluk_environment()
    assert answer["WRAPPER_TOKEN"] == "changed" and answer["HLUK_REGISTRY"] == "other.example"
    answer["WRAPPER_TOKEN"] = "mutated"
    assert _settings.hluk_environment()["WRAPPER_TOKEN"] == "changed"


def test_the_paths_passed_to_hluk_are_absolute_from_the_directory_of_each_case(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """hluk runs elsewhere than the worker: a relative cache path is made absolute as each case
    asks, from the working directory of then (an answer found again would be a past one's)."""
    monkeypatch.setenv("HLUK_CACHE_DIR", "cache/../hluk-cache")
    monkeypatch.setenv("XDG_CACHE_HOME", "/var/tmp/./xdg/")
    for directory in (tmp_path / "a", tmp_path / "b"):
        directory.mkdir()
        monkeypatch.chdir(directory)
        found = _settings.hluk_environment()
        assert found["HLUK_CACHE_DIR"] == str(directory / "hluk-cache")
        assert found["XDG_CACHE_HOME"] == "/var/tmp/xdg"
    monkeypatch.setenv("HLUK_CACHE_DIR", "/srv//hluk")
    assert _settings.hluk_environment()["HLUK_CACHE_DIR"] == "/srv/hluk"
    monkeypatch.chdir(tmp_path)
    assert _settings.hluk_environment()["HLUK_CACHE_DIR"] == "/srv/hluk"


def test_the_environment_is_read_as_os_environ_holds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_HYPERLIGHT_TEST_SET", "é and \udcff")  # undecodable bytes too
    monkeypatch.delenv("HOME", raising=False)
    # Recorded as absent first (setenv records what it replaces; a delenv of an absent name
    # records nothing), so that the undo leaves it absent, not as setdefault made it.
    monkeypatch.setenv("VERL_HYPERLIGHT_TEST_DEFAULT", "recorded")
    monkeypatch.delenv("VERL_HYPERLIGHT_TEST_DEFAULT")
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


def test_the_environment_is_read_in_settings_only() -> None:
    readers = [
        f"{path.relative_to(SOURCE).as_posix()}:{line}"
        for path in sorted(SOURCE.rglob("*.py"))
        if path.name != "settings.py" or path.parent != SOURCE
        for line in environment_reads(ast.parse(path.read_text()))
    ]
    assert readers == []


def test_the_reader_sees_each_way_of_reading_the_environment() -> None:
    read = "import os\na = os.environ['X']\nb = os.getenv('Y')\nc = os.environb\n"
    assert sorted(environment_reads(ast.parse(read))) == [2, 3, 4]


def test_hluk_and_the_spawner_are_passed_only_what_settings_declares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for passed in _settings.PASSED:
        monkeypatch.setenv(passed.name, "/" + passed.name.lower())
    monkeypatch.setenv("SECRET_TOKEN", "never")
    monkeypatch.delenv(_settings.HLUK_ENV.name, raising=False)
    to_hluk = {p.name for p in _settings.PASSED if p.to_hluk}
    assert set(_settings.hluk_environment()) == to_hluk
    assert set(_settings.spawner_environment()) == {"LD_LIBRARY_PATH"}
    assert "HLUK_CACHE_DIR" in to_hluk and "PATH" in to_hluk
