"""Warm-up: each guest runs once per node (pull and snapshot) before the first case, outside any
case's time, serialized across processes by a file lock beside hluk's cache."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hostside import (
    URL,
    Host,
    descendants_of,
    fail_with,
    option,
    processes_running,
    result,
    run,
    sandbox_error,
    wait_for,
)

from verl_hyperlight import settings as _settings
from verl_hyperlight.case import api as _api
from verl_hyperlight.case import gate as _gate
from verl_hyperlight.case import snapshots as _snapshots

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
    _gate.forget()
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
    _gate.forget()
    assert main(["warm-up"]) == 0
    assert "restored in" in capsys.readouterr().out
    hluk_command("cache", "clean", "--snapshots")
    _gate.forget()
    assert main(["warm-up"]) == 0
    assert "pulled and snapshotted in" in capsys.readouterr().out


def test_hluks_cache_directory_is_found_as_hluk_finds_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/home/worker")
    monkeypatch.setenv("XDG_CACHE_HOME", "xdg")
    monkeypatch.setenv("HLUK_CACHE_DIR", "hluk-cache")
    assert _settings.hluk_cache_directory() == str(tmp_path / "hluk-cache")  # relative to the cwd
    monkeypatch.setenv("HLUK_CACHE_DIR", "")
    assert _settings.hluk_cache_directory() == str(tmp_path / "xdg" / "hluk")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert _settings.hluk_cache_directory() == "/home/worker/.cache/hluk"


def test_a_first_warm_up_is_held_to_the_warm_up_setting(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HLUK_STANDIN_HANG", "1")
    monkeypatch.setenv(_settings.WARM_UP_TIMEOUT.name, "2")
    response = run("print(1)")
    assert response["status"] == "SandboxError"
    assert "took more than 2 s (VERL_HYPERLIGHT_WARM_UP_TIMEOUT)" in response["message"]


def test_a_probe_outside_a_case_is_held_to_the_startup_setting(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # serve's readiness check, `warm-up` and `doctor` probe through ensure_ready with no
    # deadline of their own: a guest seen warm is held to the cases' start-up setting, not 60 s.
    from verl_hyperlight.case.guests import guest_for
    from verl_hyperlight.errors import BackendError
    from verl_hyperlight.hluk import binary as _binary

    path, guest = _binary.hluk_path(), guest_for("hyperlight://", None)
    assert _gate.ensure_ready(path, guest) is not None  # probed: now seen warm
    _gate.gate(path, guest).state = _gate.State.SUSPECT  # as after a case hluk did not start
    monkeypatch.setenv("HLUK_STANDIN_HANG", "1")
    monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", "2")
    with pytest.raises(BackendError, match=r"did not start within 2 s \(VERL_HYPERLIGHT_STARTUP"):
        _gate.ensure_ready(path, guest)


def test_a_hluk_that_hangs_on_a_guest_not_known_warm_is_answered_within_the_startup_deadline(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hluk hangs before the guest starts where this process does not know the guest warm (a
    # new worker, or hluk changed since): its warm-up probe, which may pull and boot for up to
    # VERL_HYPERLIGHT_WARM_UP_TIMEOUT (900 s), is cut once hluk has said nothing for the
    # start-up deadline.
    run("pass")  # the image is pulled: no pull is left to wait for
    _gate.forget()
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


OTHER_GUESTS = """
import sys
from verl_hyperlight import run_code
for memory in map(int, sys.argv[1:]):
    response, error = run_code("hyperlight://", "pass", None, 10, 10, memory)
    assert error is None and response["status"] == "Success", (error, response)
"""


def probes_by_guest(host: Host) -> Counter[str | None]:
    """The probes so far, by the guest's --scratch-mb."""
    return Counter(option(argv, "--scratch-mb") for argv in host.warm_ups())


def test_snapshots_of_other_guests_taken_or_removed_make_no_gate_probe_again(
    host: Host, tmp_path: Path
) -> None:
    # Two guests seen warm here; then another process of the node warms three guests of its
    # own (their snapshots appear), and one of those is removed.
    for memory in (None, 1024):
        run("pass", memory=memory)
    mine = set((host.cache / "snapshots").iterdir())
    others = [str(memory) for memory in (384, 768, 2048)]
    done = subprocess.run([sys.executable, "-c", OTHER_GUESTS, *others], timeout=300)
    assert done.returncode == 0
    theirs = set((host.cache / "snapshots").iterdir()) - mine
    assert len(theirs) == 3
    shutil.rmtree(theirs.pop())
    for memory in (None, 1024) * 3:
        assert result(run("pass", memory=memory))[0] == "Success"
    assert probes_by_guest(host) == {None: 1, "1536": 1, "512": 1, "1024": 1, "3072": 1}
    # A guest's own snapshot gone, that guest alone is seen warm again.
    for slot in mine:
        if option_in_stamp(slot, "scratch_mb") == "1536":
            shutil.rmtree(slot)
    for memory in (None, 1024):
        assert result(run("pass", memory=memory))[0] == "Success"
    assert probes_by_guest(host) == {None: 1, "1536": 2, "512": 1, "1024": 1, "3072": 1}


def option_in_stamp(slot: Path, name: str) -> str:
    (line,) = [
        line for line in (slot / "stamp").read_text().splitlines() if line.startswith(name + "=")
    ]
    return line.split("=", 1)[1]


def test_a_gate_that_cannot_tell_its_snapshot_compares_hluks_whole_cache(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hluk whose snapshots carry no stamp this package reads: any new snapshot may be the
    # guest's, so its gate probes again.
    monkeypatch.setattr(_snapshots, "STAMP_FILE", "no-such-file")
    run("pass")
    run("pass", memory=1024)
    run("pass")
    assert probes_by_guest(host) == {None: 2, "1536": 1}


# ---------------------------------------------------------------------------------------------
# Waits that honour a case's cancel (issue 24): a case cancelled while it waits for its guest's
# probe, or for the node's warm-up lock, is answered at once; the probe runs on for the cases
# still waiting for it, and is cancelled once none does.

# A hluk whose probes wait, before they become hluk, until a file appears: a probe that runs
# for as long as the test wants (its wrapper silent, as a hluk that hangs before the boot is),
# and a hluk for every other run.
HELD_PROBES = """#!/bin/sh
case "$*" in *".probe("*) while [ ! -e {go} ]; do sleep 0.02; done ;; esac
exec {hluk} "$@"
"""


@pytest.fixture
def held_probes(host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Probes hold until the returned file exists; the wrapper's path is in their command line.
    The file is made at the end whatever happened, or a failed test would leave its probe
    running into the next test (whose probes_running() would see it)."""
    go = tmp_path / "probes-go"
    wrapper = tmp_path / "held-probes-hluk"
    wrapper.write_text(HELD_PROBES.format(go=go, hluk=os.environ["HLUK_PATH"]))
    wrapper.chmod(0o755)
    monkeypatch.setenv("HLUK_PATH", str(wrapper))
    yield go
    go.touch()
    assert wait_for(lambda: not held_probes_running(go)), "a held probe outlived its test"


def held_probes_running(go: Path) -> list[int]:
    return sorted(processes_running(str(go.parent / "held-probes-hluk")))


def the_held_probe(go: Path) -> int:
    """The one held probe, once it is the only process bearing the wrapper's command line (a
    run passing through the wrapper on its way to exec hluk bears it for a moment too)."""
    seen: list[list[int]] = []

    def alone() -> bool:
        # The same one process at two looks 0.2 s apart: a run passing through is gone by then.
        seen.append(held_probes_running(go))
        time.sleep(0.2)
        seen.append(held_probes_running(go))
        return len(seen[-1]) == 1 and seen[-1] == seen[-2]

    assert wait_for(alone), seen[-2:]
    return seen[-1][0]


def probes_running() -> list[int]:
    """This process's hluk runs that are probes (other tests run theirs on the machine too)."""
    return [pid for pid, argv in descendants_of(os.getpid()).items() if b".probe(" in argv]


class Cases:
    """Cases run in threads of their own, each with its cancel."""

    def __init__(self) -> None:
        self.cancels: list[threading.Event] = []
        self.answers: dict[int, dict[str, Any]] = {}
        self.threads: list[threading.Thread] = []

    def start(self, code: str) -> int:
        index, cancel = len(self.threads), threading.Event()

        def case() -> None:
            response, error = _api.run_code(URL, code, "", None, 10, None, cancel=cancel)
            assert error is None and response is not None, error
            self.answers[index] = response

        self.cancels.append(cancel)
        self.threads.append(threading.Thread(target=case, daemon=True))
        self.threads[index].start()
        return index

    def answered(self, *indices: int, limit: float = 30) -> bool:
        return bool(wait_for(lambda: all(i in self.answers for i in indices), limit))

    def waiting_in_the_gate(self, *indices: int) -> list[int]:
        """Those of these cases that are blocked in a condition wait of their guest's gate."""
        frames = sys._current_frames()
        found = []
        for index in indices:
            frame = frames.get(self.threads[index].ident or -1)
            if frame is None or frame.f_code.co_name != "wait":
                continue
            while frame is not None and frame.f_code.co_filename != _gate.__file__:
                frame = frame.f_back
            if frame is not None:
                found.append(index)
        return found


@pytest.fixture
def cases() -> Iterator[Cases]:
    """Cases for a test; at its end every one left is cancelled and waited for, so that a
    failed test's cases cannot run on into the next test (its probes, its argv log)."""
    started = Cases()
    yield started
    for cancel in started.cancels:
        cancel.set()
    assert wait_for(lambda: not any(t.is_alive() for t in started.threads), 30), (
        "a case outlived its test"
    )


def cancelled(response: dict[str, Any]) -> bool:
    return sandbox_error(response) == _api.CASE_CANCELLED


def test_a_case_cancelled_while_it_probes_leaves_at_once_and_the_probe_goes_on_for_the_others(
    held_probes: Path, host: Host, cases: Cases
) -> None:
    first = cases.start("print('first')")  # probes: its guest is not known warm
    assert wait_for(lambda: held_probes_running(held_probes))
    waiting = [cases.start(f"print({i})") for i in range(3)]
    assert wait_for(lambda: cases.waiting_in_the_gate(*waiting) == waiting)
    probe = the_held_probe(held_probes)
    cases.cancels[first].set()
    # Answered while its probe still runs, for the three cases that wait for it.
    assert cases.answered(first), "the cancelled case waits for its probe"
    assert cancelled(cases.answers[first])
    assert held_probes_running(held_probes) == [probe]
    assert not any(i in cases.answers for i in waiting)
    held_probes.touch()
    assert cases.answered(*waiting)
    assert [result(cases.answers[i])[3] for i in waiting] == ["0\n", "1\n", "2\n"]
    assert len(host.warm_ups()) == 1 and len(host.case_runs()) == 3


def test_a_probe_nobody_waits_for_is_cancelled_and_the_next_case_probes_again(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cases: Cases
) -> None:
    # A probe of 900 s: hluk hangs before the boot, and says nothing for longer than the
    # start-up deadline allows, which is the warm-up's.
    hang = tmp_path / "hang"
    hang.write_text("1")
    monkeypatch.setenv("HLUK_STANDIN_HANG_FILE", str(hang))
    monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", "900")
    waiting = [cases.start(f"print({i})") for i in range(2)]
    assert wait_for(lambda: host.warm_ups() and hang.read_text() == "0")
    assert probes_running()
    for index in waiting:
        cases.cancels[index].set()
    assert cases.answered(*waiting), "cancelled cases wait for the probe"
    assert all(cancelled(cases.answers[i]) for i in waiting)
    # The last one gone, its probe was cancelled: its hluk killed, the gate suspect again.
    assert wait_for(lambda: not probes_running()), "the probe runs on for nobody"
    gate = next(iter(_gate._registry.values()))
    assert wait_for(lambda: gate.state is _gate.State.SUSPECT)
    assert result(run("print('next')"))[3] == "next\n"
    assert len(host.warm_ups()) == 2
    assert gate.failures_in_a_row == 0  # a cancelled probe is no failure of hluk's


HOLD_LOCK = """
import sys, time
from filelock import FileLock
lock = FileLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
sys.stdin.read()
"""


def test_a_case_waiting_for_the_nodes_warm_up_lock_is_cancelled_at_once(
    host: Host, cases: Cases
) -> None:
    lock = host.cache / "verl-hyperlight" / "warm-up.lock"
    lock.parent.mkdir(parents=True)
    # Another process of the node warms a guest up, for as long as a pull and a boot take.
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        case = cases.start("print(1)")
        gate = wait_for(lambda: next(iter(_gate._registry.values()), None))
        assert isinstance(gate, _gate.Gate)
        assert wait_for(lambda: gate.state is _gate.State.PROBING)
        cases.cancels[case].set()
        assert cases.answered(case), "the cancelled case waits for the warm-up lock"
        assert cancelled(cases.answers[case])
        assert wait_for(lambda: gate.state is _gate.State.SUSPECT)
        assert host.warm_ups() == [] and holder.poll() is None
    finally:
        holder.communicate("", timeout=30)
    assert result(run("print('after')"))[3] == "after\n"


def test_hundreds_of_cases_waiting_for_one_probe_leave_at_once_when_cancelled(
    held_probes: Path, host: Host, cases: Cases
) -> None:
    # An agent loop's worker: hundreds of calls wait for their guest's first probe, and most
    # of them are cancelled (aborted rollouts) before it ends.
    rng = random.Random(24)
    count = 300
    indices = [cases.start(f"print({i})") for i in range(count)]
    # All wait: for the probe, and (the one that runs it) in it.
    assert wait_for(lambda: len(cases.waiting_in_the_gate(*indices)) >= count - 1)
    assert wait_for(lambda: held_probes_running(held_probes))  # its hluk may be starting yet
    probe = the_held_probe(held_probes)
    dropped = set(rng.sample(indices, count - 8))
    for index in dropped:
        cases.cancels[index].set()
    assert cases.answered(*dropped), f"{len(dropped) - len(cases.answers)} cancelled cases wait"
    assert all(cancelled(cases.answers[i]) for i in dropped)
    kept = sorted(set(indices) - dropped)
    assert held_probes_running(held_probes) == [probe]  # the probe runs on for the others
    assert not any(i in cases.answers for i in kept)
    held_probes.touch()
    assert cases.answered(*kept)
    assert [result(cases.answers[i])[3] for i in kept] == [f"{i}\n" for i in kept]
    assert len(host.warm_ups()) == 1 and len(host.case_runs()) == len(kept)
    for thread in cases.threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in cases.threads)


def test_hluk_replaced_under_sixteen_cases_in_flight_is_warmed_up_once_and_none_cold_boots(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An upgrade installed over the running hluk (a new release: a new image, a new snapshot)
    is seen by the gate: the cases that come after it wait for one warm-up, under the node's
    lock, and none pulls or boots the new image inside its own run."""
    wrapper = tmp_path / "bin" / "hluk"
    wrapper.parent.mkdir()
    original = Path(os.environ["HLUK_PATH"]).read_text()
    wrapper.write_text(original)
    wrapper.chmod(0o755)
    monkeypatch.setenv("HLUK_PATH", str(wrapper))
    assert result(run("print('warm')"))[:4] == ("Success", "Finished", 0, "warm\n")
    before = len(host.warm_ups())
    with ThreadPoolExecutor(32) as pool:
        in_flight = [
            pool.submit(run, f"import time\ntime.sleep(2)\nprint('old {i}')") for i in range(16)
        ]
        assert wait_for(lambda: len(host.case_runs()) >= 17, 60)
        upgraded = wrapper.with_name("hluk.new")
        # The new release reports another version and pulls the image of that tag, slowly.
        upgraded.write_text(
            original.replace(
                "exec ", "export HLUK_STANDIN_VERSION=0.20.1 HLUK_STANDIN_PULL_SECONDS=1\nexec ", 1
            )
        )
        upgraded.chmod(0o755)
        upgraded.replace(wrapper)  # as a package manager installs it: a new file in its place
        replaced_at = len(host.runs())
        after = [pool.submit(run, f"print('new {i}')") for i in range(16)]
        answers = [result(f.result(timeout=300))[:4] for f in in_flight + after]
    assert answers[:16] == [("Success", "Finished", 0, f"old {i}\n") for i in range(16)]
    assert answers[16:] == [("Success", "Finished", 0, f"new {i}\n") for i in range(16)]
    runs = host.runs()[replaced_at:]
    probes = [i for i, argv in enumerate(runs) if ".probe(" in (option(argv, "--exec") or "")]
    assert len(host.warm_ups()) == before + 1 and len(probes) == 1, runs
    # Every case of the new hluk ran after its warm-up had pulled the image and taken the
    # snapshot: none of them pulled or booted it in its own run.
    cases = [i for i, argv in enumerate(runs) if "--mount" in argv]
    assert len(cases) == 16 and min(cases) > probes[0]
    said = [r.getMessage() for r in caplog.records if "was replaced" in r.getMessage()]
    assert len(said) == 1 and str(wrapper) in said[0]
