"""URL -> guest: which image hluk boots for a sandbox URL, with how much memory, and that the
stand-in really runs each form."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from verl_hyperlight import _guest, run_code


@pytest.mark.parametrize(
    ("url", "args"),
    [
        ("hyperlight://", ("--runtime", "python")),
        ("hyperlight:///", ("--runtime", "python")),
        ("hyperlight://python", ("--runtime", "python")),
        ("hyperlight://agent", ("--runtime", "agent")),
        (
            "hyperlight://registry.example/org/python:1.2",
            ("--runtime", "registry.example/org/python:1.2"),
        ),
    ],
)
def test_each_url_form_names_its_image(
    url: str, args: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HLUK_INITRD", raising=False)
    assert _guest.image_for(url).args == args


def test_hluk_initrd_replaces_the_python_image_but_not_the_agent_image(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rootfs = tmp_path / "rootfs.cpio"
    monkeypatch.setenv("HLUK_INITRD", str(rootfs))
    assert _guest.image_for("hyperlight://").args == ("--initrd", str(rootfs), "--warm")
    assert _guest.image_for("hyperlight://agent").args == ("--runtime", "agent")


@pytest.mark.parametrize(
    ("limit", "scratch"), [(None, None), (-1, None), (0, None), (128, 171), (1024, 1366)]
)
def test_the_micro_vm_gets_about_a_third_more_than_the_memory_limit(
    limit: int | None, scratch: int | None
) -> None:
    guest = _guest.guest_for("hyperlight://", limit)
    assert guest.scratch_mb == scratch
    assert ("--scratch-mb" in guest.args()) == (scratch is not None)


def test_the_warm_exec_loads_the_runner_and_is_the_same_for_every_case() -> None:
    first = _guest.guest_for("hyperlight://", 1024).args()
    second = _guest.guest_for("hyperlight://", 1024).args()
    assert first == second  # one snapshot key for every case of a guest
    warm_exec = first[first.index("--warm-exec") + 1]
    namespace: dict[str, object] = {}
    exec(compile(warm_exec, "<warm-exec>", "exec"), namespace)
    runner = sys.modules.pop(_guest.runner.MODULE_NAME)
    assert callable(runner.main) and callable(runner.prepare)


def run_and_log(url: str, code: str, memory: int | None, log: Path) -> tuple[dict, list]:  # type: ignore[type-arg]
    response, error = run_code(url, code, "", 10, 10, memory)
    assert error is None and response is not None, error
    argvs = [json.loads(line) for line in log.read_text().splitlines()]
    return response, [argv for argv in argvs if "--mount" in argv]


def test_hluk_initrd_boots_the_local_rootfs_warm(
    hluk: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rootfs = tmp_path / "rootfs.cpio"
    rootfs.write_bytes(b"070701")  # the stand-in only checks that it exists
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("HLUK_INITRD", str(rootfs))
    monkeypatch.setenv("HLUK_STANDIN_ARGV_LOG", str(log))
    response, cases = run_and_log("hyperlight://", "print('from initrd')", 1024, log)
    assert response["run_result"]["stdout"] == "from initrd\n"
    assert cases[-1][cases[-1].index("--initrd") + 1 : cases[-1].index("--initrd") + 3] == [
        str(rootfs),
        "--warm",
    ]


def test_the_agent_url_runs_the_agent_image(
    hluk: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("HLUK_STANDIN_ARGV_LOG", str(log))
    response, cases = run_and_log("hyperlight://agent", "print('agent')", 1024, log)
    assert response["run_result"]["stdout"] == "agent\n"
    assert cases[-1][cases[-1].index("--runtime") + 1] == "agent"
    assert cases[-1][cases[-1].index("--scratch-mb") + 1] == "1366"


def test_the_warm_exec_fits_in_one_argument_as_linux_passes_it() -> None:
    # Linux refuses exec with any single argument longer than MAX_ARG_STRLEN (32 pages), so a
    # runner that grew past it would fail every spawn with E2BIG.
    max_arg_strlen = 32 * 4096
    assert len(_guest.warm_exec_code().encode()) + 1 < max_arg_strlen
