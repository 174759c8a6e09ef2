"""`language: "pytest"` and the hosts' directories in real Hyperlight micro-VMs (RUN_ALL=1, as
tests/test_microvm.py): pytest imported in the warm snapshot from its read-only mount."""

from __future__ import annotations

import base64
from typing import Any

from test_microvm import pytestmark, real_hluk  # noqa: F401 - the same gate and check

from verl_hyperlight import run_code
from verl_hyperlight.guest import runner


def run(code: str, language: str, **options: Any) -> dict[str, Any]:
    response, error = run_code("hyperlight://", code, None, 10, 20, 1024, language, **options)
    assert error is None, error
    assert response is not None
    assert response["status"] != "SandboxError", response["message"]
    return response


def test_a_pytest_case_passes_fails_and_uses_built_in_fixtures() -> None:
    code = (
        "import os\n"
        "def test_capfd(capfd, tmp_path):\n"
        "    os.write(1, b'fd')\n"
        "    assert capfd.readouterr().out == 'fd'\n"
        "    (tmp_path / 'a').write_text('x')\n"
        "def test_wrong():\n"
        "    assert 1 == 2\n"
    )
    response = run(code, "pytest")
    assert (response["status"], response["run_result"]["return_code"]) == ("Failed", 1)
    assert "1 failed, 1 passed" in response["run_result"]["stdout"]


def test_pytests_mount_is_read_only_in_the_guest() -> None:
    code = (
        "import os, pytest\n"
        "def test_read_only():\n"
        "    with pytest.raises(OSError):\n"
        f"        open(os.path.join({runner.PYTEST_MOUNT!r}, 'new.py'), 'w')\n"
    )
    assert run(code, "pytest")["status"] == "Success"


def test_the_hosts_directories_are_writable_in_the_guest() -> None:
    code = "".join(f"open('{d}/x', 'w').write('{d}')\n" for d in runner.HOST_DIRECTORIES)
    fetch = [f"{d}/x" for d in runner.HOST_DIRECTORIES]
    response = run(code, "python", fetch_files=fetch)
    assert response["files"] == {
        f"{d}/x": base64.b64encode(d.encode()).decode() for d in runner.HOST_DIRECTORIES
    }
