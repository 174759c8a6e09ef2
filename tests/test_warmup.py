"""Warm-up: each guest runs once per node (pull and snapshot) before the first case, outside any
case's time, serialized across processes by a file lock beside hluk's cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hostside import Host, fail_with, option, result, run, sandbox_error

from verl_hyperlight import _warmup

# One worker process: THREADS threads call run_code at once (half with verl's default memory
# limit, half with the image's default memory: two guests), once a start file appears.
WORKER = """
import json, logging, os, sys, threading, time
from verl_hyperlight import run_code

logging.basicConfig(level=logging.INFO, format="%(message)s")  # the warm-up's news, on stderr

go, threads = sys.argv[1], int(sys.argv[2])
results = [None] * threads

def case(i):
    token = f"{os.getpid()}-{i}"
    while not os.path.exists(go):
        time.sleep(0.001)
    response, error = run_code(
        "hyperlight://", "print(input()[::-1])", token + "\\n", None, 10, 1024 if i % 2 else None
    )
    run = (response or {}).get("run_result") or {}
    results[i] = [token, error, (response or {}).get("status"), run.get("stdout")]

workers = [threading.Thread(target=case, args=(i,)) for i in range(threads)]
for worker in workers:
    worker.start()
print("ready", flush=True)
for worker in workers:
    worker.join()
print(json.dumps(results), flush=True)
"""


def test_warm_up_runs_once_per_guest_per_node_under_concurrent_first_cases(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pull and a boot that take long enough for every first case to arrive while they run.
    monkeypatch.setenv("HLUK_STANDIN_PULL_SECONDS", "1")
    monkeypatch.setenv("HLUK_STANDIN_BOOT_SECONDS", "0.5")
    go = tmp_path / "go"
    processes, threads = 3, 16
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(go), str(threads)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    for worker in workers:
        assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
    go.touch()
    outputs = [worker.communicate(timeout=120) for worker in workers]
    assert [worker.returncode for worker in workers] == [0] * processes

    answers = [answer for output, _ in outputs for answer in json.loads(output)]
    assert len(answers) == processes * threads
    for token, error, status, stdout in answers:
        assert (error, status, stdout) == (None, "Success", token[::-1] + "\n"), token
    # Each process saw each guest warm once, by a probe; the probes were serialized, so one
    # of them per guest pulled and booted, and the others restored what it saved.
    probes = Counter(option(argv, "--scratch-mb") for argv in host.warm_ups())
    news = "".join(err for _, err in outputs)
    print(f"\nprobes: {dict(probes)} (by --scratch-mb) for {len(answers)} first cases")
    assert probes == {"1536": processes, None: processes}
    assert news.count("warmed up in") == 2, news
    assert news.count("is warm (probed in") == 2 * (processes - 1), news
    assert len(host.case_runs()) == processes * threads


def test_warm_up_runs_before_the_first_case_and_not_again(host: Host) -> None:
    first = run("print('first')")
    runs = host.runs()
    assert result(first)[3] == "first\n"
    assert [argv[0] for argv in runs] == ["--version", "--log-level", "run"]
    assert runs[1] in host.warm_ups() and runs[2] in host.case_runs()

    run("print('second')")
    assert len(host.warm_ups()) == 1

    # Another process on the node (here: this one, having forgotten) sees the guest warm by
    # a probe of its own, which restores the snapshot the first took.
    _warmup.forget()
    assert result(run("print('third')"))[:4] == ("Success", "Finished", 0, "third\n")
    assert len(host.warm_ups()) == 2
    assert len(host.case_runs()) == 3


def test_warm_up_time_is_not_charged_to_the_first_case(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HLUK_STANDIN_PULL_SECONDS", "1.5")
    monkeypatch.setenv("HLUK_STANDIN_BOOT_SECONDS", "1")
    started = time.monotonic()
    response = run("print('fast')", run_timeout=1)
    wall = time.monotonic() - started
    print(f"\nfirst case with a 2.5 s warm-up: {wall:.2f} s wall, run_timeout 1 s")
    # Within its 1 s although the pull and boot before it took 2.5 s.
    assert result(response)[:4] == ("Success", "Finished", 0, "fast\n")
    assert len(host.warm_ups()) == 1


def test_a_failed_warm_up_fails_its_case_alone_and_the_next_case_warms_up_again(
    host: Host, monkeypatch: pytest.MonkeyPatch, fail_file: Path
) -> None:
    # The probe, and the one retry a failed start gets. (Three failures in a row open the
    # guest's gate: tests/test_fail_fast.py.)
    fail_with(monkeypatch, fail_file, "failed to save snapshot: disk full", 2)
    assert "snapshot" in sandbox_error(run("print(1)"))
    assert len(host.warm_ups()) == 2 and host.case_runs() == []
    assert result(run("print('warm')"))[:4] == ("Success", "Finished", 0, "warm\n")
    assert len(host.warm_ups()) == 3 and len(host.case_runs()) == 1


def test_a_probe_that_fails_at_once_is_retried_as_a_case_is(
    host: Host, monkeypatch: pytest.MonkeyPatch, fail_file: Path
) -> None:
    fail_file.write_text("1")
    assert result(run("print('warm')"))[:4] == ("Success", "Finished", 0, "warm\n")
    assert len(host.warm_ups()) == 2 and len(host.case_runs()) == 1


# ---------------------------------------------------------------------------------------------
# The warm state is hluk's snapshot: when it goes, the next cases wait for one probe to take it
# again, instead of cold-booting at once and breaking each other's save (hluk writes a
# snapshot through one <slot>.part directory, which each cold boot removes first).

CONCURRENT = 8


def concurrent_cases(count: int = CONCURRENT) -> list[tuple[str, str | None, int | None, str]]:
    with ThreadPoolExecutor(count) as pool:
        responses = list(pool.map(lambda i: run(f"print({i})"), range(count)))
    return [result(response)[:4] for response in responses]


def all_succeeded(answers: list[tuple[str, str | None, int | None, str]]) -> bool:
    return answers == [("Success", "Finished", 0, f"{i}\n") for i in range(len(answers))]


@pytest.fixture
def slow_save(host: Host, monkeypatch: pytest.MonkeyPatch) -> Host:
    """A snapshot that takes long enough to write for concurrent cold boots to overlap."""
    monkeypatch.setenv("HLUK_STANDIN_SAVE_SECONDS", "0.5")
    return host


def hluk_command(*args: str) -> None:
    done = subprocess.run([os.environ["HLUK_PATH"], *args], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("cleaned", [["--snapshots"], ["--rootfs"], []])
def test_a_cache_cleaned_under_the_workers_is_warmed_again_before_the_next_cases(
    slow_save: Host, cleaned: list[str]
) -> None:
    run("pass")
    hluk_command("cache", "clean", *cleaned)
    assert all_succeeded(concurrent_cases())
    # One probe took the snapshot again (pulling the image where it was gone too); no case
    # failed to start and was retried.
    assert len(slow_save.case_runs()) == 1 + CONCURRENT
    assert len(slow_save.warm_ups()) == 2


def test_a_rebuilt_local_rootfs_is_warmed_up_again_before_the_next_cases(
    slow_save: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rootfs = tmp_path / "rootfs.cpio"
    rootfs.write_bytes(b"070701")
    monkeypatch.setenv("HLUK_INITRD", str(rootfs))
    run("pass")
    rootfs.write_bytes(b"070701 rebuilt")  # hluk stamps its snapshot with size and mtime
    assert all_succeeded(concurrent_cases())
    assert len(slow_save.case_runs()) == 1 + CONCURRENT
    assert len(slow_save.warm_ups()) == 2


@pytest.mark.parametrize(
    ("setting", "value"),
    [("HLUK_IMAGE_VERSION", "0.19.1"), ("HLUK_REGISTRY", "registry.example/mirror")],
)
def test_hluk_settings_that_change_the_image_are_part_of_the_warm_state(
    slow_save: Host, monkeypatch: pytest.MonkeyPatch, setting: str, value: str
) -> None:
    run("pass")
    monkeypatch.setenv(setting, value)  # another image, so another snapshot
    assert all_succeeded(concurrent_cases())
    assert len(slow_save.case_runs()) == 1 + CONCURRENT
    assert len(slow_save.warm_ups()) == 2


def test_the_warm_up_command_says_the_node_is_cold_once_its_snapshot_is_gone(
    host: Host, capsys: pytest.CaptureFixture[str]
) -> None:
    from verl_hyperlight.cli import main

    assert main(["warm-up"]) == 0
    _warmup.forget()
    assert main(["warm-up"]) == 0
    assert "restored in" in capsys.readouterr().out
    hluk_command("cache", "clean", "--snapshots")
    _warmup.forget()
    assert main(["warm-up"]) == 0
    assert "pulled and snapshotted in" in capsys.readouterr().out


def test_hluks_cache_directory_is_found_as_hluk_finds_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/home/worker")
    monkeypatch.setenv("XDG_CACHE_HOME", "xdg")
    monkeypatch.setenv("HLUK_CACHE_DIR", "hluk-cache")
    assert _warmup.cache_root() == tmp_path / "hluk-cache"  # relative to the working directory
    monkeypatch.setenv("HLUK_CACHE_DIR", "")
    assert _warmup.cache_root() == tmp_path / "xdg" / "hluk"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert _warmup.cache_root() == Path("/home/worker/.cache/hluk")


def test_a_first_warm_up_is_held_to_the_warm_up_setting(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HLUK_STANDIN_HANG", "1")
    monkeypatch.setenv(_warmup.WARM_UP_TIMEOUT_ENV, "2")
    response = run("print(1)")
    assert response["status"] == "SandboxError"
    assert "took more than 2 s (VERL_HYPERLIGHT_WARM_UP_TIMEOUT)" in response["message"]


def test_a_probe_outside_a_case_is_held_to_the_startup_setting(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # serve's readiness check, `warm-up` and `doctor` probe through ensure_ready with no
    # deadline of their own: a guest seen warm is held to the cases' start-up setting, not 60 s.
    from verl_hyperlight import _hluk
    from verl_hyperlight._errors import BackendError
    from verl_hyperlight._guest import guest_for

    path, guest = _hluk.hluk_path(), guest_for("hyperlight://", None)
    assert _warmup.ensure_ready(path, guest) is not None  # probed: now seen warm
    _warmup.gate(path, guest).state = _warmup.State.SUSPECT  # as after a case hluk did not start
    monkeypatch.setenv("HLUK_STANDIN_HANG", "1")
    monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", "2")
    with pytest.raises(BackendError, match=r"did not start within 2 s \(VERL_HYPERLIGHT_STARTUP"):
        _warmup.ensure_ready(path, guest)


def test_a_hluk_that_hangs_on_a_guest_not_known_warm_is_answered_within_the_startup_deadline(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hluk hangs before the guest starts where this process does not know the guest warm (a
    # new worker, or hluk changed since): its warm-up probe, which may pull and boot for up to
    # VERL_HYPERLIGHT_WARM_UP_TIMEOUT (900 s), is cut once hluk has said nothing for the
    # start-up deadline.
    run("pass")  # the image is pulled: no pull is left to wait for
    _warmup.forget()
    monkeypatch.setenv("HLUK_STANDIN_HANG", "1")
    monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", "2")
    answers: list[dict[str, object]] = []
    case = threading.Thread(target=lambda: answers.append(run("print(1)")), daemon=True)
    case.start()
    case.join(60)
    assert answers, "no answer within 60 s"
    message = sandbox_error(answers[0])
    assert "hluk wrote nothing for 2 s while warming up the python image" in message


def test_a_slow_pull_that_hluk_announced_is_not_cut_by_the_startup_deadline(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hluk says `pulling IMAGE...` as a pull begins and nothing more until it ends.
    monkeypatch.setenv("HLUK_STANDIN_PULL_SECONDS", "5")
    monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", "2")
    assert result(run("print(1)"))[3] == "1\n"
    assert len(host.warm_ups()) == 1
