"""URL -> guest: which image hluk boots for a sandbox URL, with how much memory, and that the
stand-in really runs each form."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hostside import Host, option, run

from verl_hyperlight import node, run_code
from verl_hyperlight.case import guests as _guest


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
    assert _guest.guest_for(url, None).image.args == args


def test_hluk_initrd_replaces_the_python_image_but_not_the_agent_image(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rootfs = tmp_path / "rootfs.cpio"
    monkeypatch.setenv("HLUK_INITRD", str(rootfs))
    assert _guest.guest_for("hyperlight://", None).image.args == ("--initrd", str(rootfs), "--warm")
    assert _guest.guest_for("hyperlight://agent", None).image.args == ("--runtime", "agent")


@pytest.mark.parametrize(
    ("limit", "scratch"), [(None, None), (-1, None), (0, None), (128, 192), (1024, 1536)]
)
def test_the_micro_vm_gets_a_third_more_than_the_memory_limit_rounded_up(
    limit: int | None, scratch: int | None
) -> None:
    guest = _guest.guest_for("hyperlight://", limit)
    assert guest.scratch_mb == scratch
    assert ("--scratch-mb" in guest.args()) == (scratch is not None)


def ladder_in_the_readme() -> list[tuple[int, int, int]]:
    """The docs' table of micro-VM memory (docs/sizing.md): (lowest limit, highest limit,
    memory) rows."""
    readme = (Path(__file__).resolve().parent.parent / "docs" / "sizing.md").read_text()
    rows = re.findall(r"^  \| (\d+) - (\d+) +\| (\d+) +\|$", readme, re.MULTILINE)
    return [(int(low), int(high), int(memory)) for low, high, memory in rows]


def test_the_micro_vm_memory_ladder_is_the_one_the_readme_documents(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A node as large as any a user runs (64 TiB), so no limit below is past half its memory.
    monkeypatch.setattr(node, "memory_mb", lambda: 64 * 2**20)
    rows = ladder_in_the_readme()
    assert len(rows) >= 8 and rows[0][0] == _guest.PYTHON.min_memory_mb
    for (low, high, memory), following in zip(rows, [*rows[1:], None], strict=True):
        for limit in (low, (low + high) // 2, high):
            assert _guest.guest_for("hyperlight://", limit).memory_mb == memory, limit
        assert following is None or following[0] == high + 1  # no limit left out
    # Beyond the table: powers of two and 1.5 times them, the smallest at least 4/3 the limit.
    ladder = sorted({size for n in range(7, 26) for size in (2**n, 3 * 2 ** (n - 1))})
    for limit in [*range(128, 5000, 7), 65536, 100_000, 10_000_000, 1024.5]:
        memory = _guest.guest_for("hyperlight://", limit).memory_mb
        assert memory in ladder and memory >= limit * 4 / 3, limit
        assert ladder[ladder.index(memory) - 1] < limit * 4 / 3, limit


# A reward worker's hluk arguments for a guest, as a digest (the warm-exec is part of hluk's
# snapshot key).
GUEST_ARGS_DIGEST = """
import hashlib, json
from verl_hyperlight.case import guests as _guest
args = _guest.guest_for("hyperlight://", 1024).args()
print(hashlib.sha256(json.dumps(args).encode()).hexdigest())
"""


def test_every_worker_process_passes_the_same_warm_exec_so_they_share_one_snapshot() -> None:
    # Two processes with different hash seeds, as two reward workers have.
    digests = []
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", GUEST_ARGS_DIGEST],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        digests.append(done.stdout)
    assert digests[0] == digests[1]


def test_the_warm_exec_loads_the_runner_as_a_module() -> None:
    args = _guest.guest_for("hyperlight://", 1024).args()
    warm_exec = args[args.index("--warm-exec") + 1]
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
    assert cases[-1][cases[-1].index("--scratch-mb") + 1] == "1536"


@pytest.mark.parametrize(
    "pytest_copy",
    [None, "pytest-pytest9.2.0-pluggy1.6.0-iniconfig2.3.0-packaging26.2-Pygments2.20.0"],
)
def test_the_warm_exec_fits_in_one_argument_as_linux_passes_it(pytest_copy: str | None) -> None:
    # Linux refuses exec with any single argument longer than MAX_ARG_STRLEN (32 pages), so a
    # runner that grew past it would fail every spawn with E2BIG.
    max_arg_strlen = 32 * 4096
    assert len(_guest.warm_exec_code(pytest_copy).encode()) + 1 < max_arg_strlen


@pytest.mark.parametrize("language", ["python", "pytest"])
def test_the_warm_exec_and_a_cases_exec_fit_in_one_host_call_of_hluk(
    host: Host, language: str
) -> None:
    # hluk hands the --warm-exec and --exec code to the guest as a host call, whose payload
    # hyperlight-unikraft bounds (HOST_CALL_MAX: 64 KiB; 69,620 bytes in another version, so the
    # smaller is pinned). Both together fit in one, however hluk groups them: a bound far
    # tighter than MAX_ARG_STRLEN, past which the guest could not receive its code.
    host_call_max = 64 * 1024
    run("pass", language=language)
    argv = host.case_runs()[-1]
    warm_exec, case_exec = option(argv, "--warm-exec"), option(argv, "--exec")
    assert warm_exec is not None and case_exec is not None
    payload = len(warm_exec.encode()) + len(case_exec.encode())
    assert payload <= host_call_max, f"{payload} bytes of code"
