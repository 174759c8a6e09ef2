"""The verl-hyperlight command: --version, warm-up and run, as an operator uses them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from verl_hyperlight import __version__, _warmup
from verl_hyperlight.cli import main


def test_version_names_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"verl-hyperlight {__version__}"


def test_warm_up_prepares_the_node(
    hluk: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HLUK_CACHE_DIR", str(tmp_path / "cache"))
    _warmup.forget()
    assert main(["warm-up"]) == 0
    assert "the python image is warm on this node" in capsys.readouterr().out
    assert list((tmp_path / "cache" / "verl-hyperlight").glob("*.ready"))


def test_warm_up_says_what_failed_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HLUK_PATH", str(tmp_path / "missing" / "hluk"))
    _warmup.forget()
    assert main(["warm-up"]) == 1
    assert "hluk was not found at" in capsys.readouterr().err


def test_warm_up_refuses_a_memory_limit_below_the_image(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["warm-up", "hyperlight://agent", "--memory-limit-mb", "512"]) == 1
    assert "use at least 720" in capsys.readouterr().err


def test_run_prints_the_response_verl_would_get(
    hluk: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    solution = tmp_path / "solution.py"
    solution.write_text("print(int(input()) * 2)\n")
    monkeypatch.setattr("sys.stdin", io.StringIO("21\n"))
    assert main(["run", str(solution)]) == 0
    response = json.loads(capsys.readouterr().out)
    assert response["status"] == "Success"
    assert response["run_result"]["stdout"] == "42\n"
