"""The verl plugin against fake verl layouts: the wrapped function, a layout it does not know,
no verl at all, and a broken installation of this package."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SANDBOX = "verl/utils/reward_score/sandbox_fusion"


def fake_verl(root: Path, *, utils: str | None = None) -> Path:
    for package in ("verl", "verl/utils", "verl/utils/reward_score", SANDBOX):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")
    if utils is not None:
        (root / SANDBOX / "utils.py").write_text(textwrap.dedent(utils))
    return root


ORIGINAL = """
    CALLS = []
    def call_sandbox_api(sandbox_fusion_url, code, stdin, compile_timeout, run_timeout,
                         memory_limit_mb, language="python"):
        CALLS.append(sandbox_fusion_url)
        return {"status": "Success", "from": "verl"}, None
"""


def run_python(code: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_call_sandbox_api_is_wrapped_once(tmp_path: Path) -> None:
    root = fake_verl(tmp_path, utils=ORIGINAL)
    done = run_python(
        """
        import importlib
        import verl_hyperlight.plugin as plugin
        from verl.utils.reward_score.sandbox_fusion import utils
        wrapped = utils.call_sandbox_api
        print(plugin.install())
        print(utils.call_sandbox_api is wrapped)
        print(utils.call_sandbox_api("http://sandbox:8080/run_code", "print(1)", "", 10, 10,
                                     1024))
        print(utils.CALLS)
        response, error = utils.call_sandbox_api(sandbox_fusion_url="hyperlight://nope here",
            code="print(1)", stdin="", compile_timeout=10, run_timeout=10, memory_limit_mb=1024)
        print(response, error.startswith("Invalid request: unsupported sandbox URL"))
        print(utils.CALLS)
        """,
        root,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "already installed"
    assert lines[1] == "True"
    assert lines[2] == "({'status': 'Success', 'from': 'verl'}, None)"
    assert lines[3] == "['http://sandbox:8080/run_code']"
    assert lines[4] == "None True"
    assert lines[5] == "['http://sandbox:8080/run_code']"


@pytest.mark.parametrize(
    "utils", [None, "def something_else():\n    pass\n"], ids=["no-module", "no-function"]
)
def test_an_unknown_verl_layout_is_reported_at_warning(tmp_path: Path, utils: str | None) -> None:
    root = fake_verl(tmp_path, utils=utils)
    done = run_python("import verl_hyperlight.plugin as plugin; print(plugin.STATE)", root)
    assert done.returncode == 0, done.stderr
    # No logging is configured here, so only WARNING and above reach stderr.
    assert "hyperlight:// sandbox URLs will fail" in done.stderr
    assert "missing" in done.stdout


def test_without_verl_the_plugin_does_nothing_quietly(tmp_path: Path) -> None:
    done = run_python(
        """
        import importlib.util, sys
        if importlib.util.find_spec("verl") is not None:
            sys.exit("verl is importable here")
        import verl_hyperlight.plugin as plugin
        print(plugin.STATE)
        """
    )
    if "verl is importable here" in done.stderr:
        pytest.skip("verl is installed in this environment; tests/test_with_verl.py covers it")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "verl is not installed; nothing to do"
    assert done.stderr == ""


def test_a_broken_installation_is_reported_loudly_not_raised(tmp_path: Path) -> None:
    root = fake_verl(tmp_path, utils=ORIGINAL)
    done = run_python(
        """
        import sys
        sys.modules["verl_hyperlight.case.warmup"] = None  # as if a module failed to import
        import verl_hyperlight.plugin as plugin
        print(plugin.STATE)
        """,
        root,
    )
    assert done.returncode == 0, done.stderr
    assert "the verl plugin failed to install" in done.stderr
    assert done.stdout.startswith("failed:")


def test_importing_the_plugin_loads_nothing_of_the_case_path_but_the_url_parser() -> None:
    # verl imports the plugin in every process; the URL parser is what its wrapper routes by.
    done = run_python(
        """
        import importlib.util, sys
        if importlib.util.find_spec("verl") is not None:
            sys.exit("verl is importable here")
        import verl_hyperlight.plugin
        print(sorted(name for name in sys.modules if name.startswith("verl_hyperlight")))
        """
    )
    if "verl is importable here" in done.stderr:
        pytest.skip("verl is installed here: the plugin installs itself, importing run_code")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "['verl_hyperlight',",
        "'verl_hyperlight.case',",
        "'verl_hyperlight.case.url',",
        "'verl_hyperlight.errors',",
        "'verl_hyperlight.plugin']",
    ]
