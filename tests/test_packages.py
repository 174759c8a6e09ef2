"""A solution importing a package the python image lacks (numpy): its answer unchanged (a
runtime error, as the image gives it), and said once per package in the log, with where the
package is (the agent image, Sandbox Fusion's runtime), and counted: a user whose rewards
dropped against Sandbox Fusion's learns why (case/packages.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from verl_hyperlight import run_code
from verl_hyperlight.case import packages
from verl_hyperlight.errors import CauseCounts


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> CauseCounts:
    counts = CauseCounts()
    monkeypatch.setattr(packages, "missing", counts)
    return counts


def run(code: str) -> dict:  # type: ignore[type-arg]
    response, error = run_code("hyperlight://", code, "", None, 10, None)
    assert error is None and response is not None
    return response


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_solution_importing_numpy_is_a_runtime_error_said_once_with_where_numpy_is(
    hluk: Path, counted: CauseCounts, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "verl_hyperlight")
    first = run("import numpy as np\nprint(np.zeros(2))")
    # The answer is the image's own: the import fails, a runtime error verl scores 0.
    assert (first["status"], first["run_result"]["return_code"]) == ("Failed", 1)
    assert "ModuleNotFoundError: No module named 'numpy'" in first["run_result"]["stderr"]
    [said] = [m for m in warnings(caplog) if "numpy" in m]
    assert "a solution failed importing numpy, which the python image lacks" in said
    assert "the agent image has it (hyperlight://agent" in said
    assert "Sandbox Fusion's python runtime has it" in said
    run("from numpy.linalg import norm\n")
    run("import sklearn\n")
    assert counted.counts() == {"numpy": 2, "sklearn": 1}
    assert len([m for m in warnings(caplog) if "numpy" in m]) == 1  # said once per package


def test_a_module_no_image_or_sandbox_fusion_has_is_not_said(
    hluk: Path, counted: CauseCounts, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "verl_hyperlight")
    response = run("import no_such_module_anywhere\n")
    assert response["status"] == "Failed"
    assert counted.counts() == {} and not warnings(caplog)


def test_the_known_limits_and_rewards_pages_say_what_each_image_has() -> None:
    docs = Path(__file__).parent.parent / "docs"
    for page in ("known-limits.md", "rewards.md"):
        text = (docs / page).read_text()
        assert "standard library only" in text, page
        assert "numpy" in text and "Sandbox Fusion's python runtime" in text, page
