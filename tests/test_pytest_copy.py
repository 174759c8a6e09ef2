"""The copy of pytest that `language: "pytest"` guests mount, shared by every process of the
node that shares hluk's cache: pods whose caches are one hostPath copying it at once with
equal process ids, a copier killed halfway, a full disk, a read-only pre-built cache, pytest
upgraded under a running worker, and the copies no process holds removed.

Pods, disks and read-only mounts are made on purpose: processes in pid namespaces of their
own (each its namespace's pid 1) and mounts in mount namespaces of their own, so these tests
need root and util-linux's unshare."""

from __future__ import annotations

import errno
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hostside import GateClock, Host, in_mount_namespace, need_unshare, option, result, run
from test_pytest_language import run_pytest

from verl_hyperlight.case import pytest_library as _guest_pytest

# The copy's path in hluk's cache $HLUK_CACHE_DIR, printed by a process with its pid; given a
# path, the process says it is ready and makes the copy once that path exists.
COPY = """
import os, sys, time
from verl_hyperlight.case import pytest_library
if len(sys.argv) > 1:
    print("ready", flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.001)
print(os.getpid(), pytest_library.library(), flush=True)
"""
# Runs the cases of argv[1] (a JSON list of [language, code]) through run_code, and prints
# their answers, how many times pytest was copied, and what was logged at ERROR.
CASES = """
import json, logging, os, shutil, sys
from verl_hyperlight import run_code

errors = []
class Kept(logging.Handler):
    def emit(self, record):
        errors.append(record.getMessage())
logging.getLogger("verl_hyperlight").addHandler(Kept(logging.ERROR))
copies = []
copytree = shutil.copytree
def counted(source, *args, **kwargs):
    if os.fspath(source).rstrip("/").endswith("/_pytest"):
        copies.append(source)
    return copytree(source, *args, **kwargs)
shutil.copytree = counted

answers = []
for language, code in json.loads(sys.argv[1]):
    response, error = run_code("hyperlight://", code, None, 10, 20, 1024, language)
    answers.append([error, (response or {}).get("status"), (response or {}).get("message")])
print(json.dumps({"answers": answers, "copies": len(copies), "errors": errors}))
"""
PYTHON_CASE = ["python", "print('ok')"]
PYTEST_CASE = ["pytest", "def test_ok():\n    assert True\n"]


def copies_directory(cache: Path) -> Path:
    return cache / "verl-hyperlight"


def copy_name() -> str:
    """The name of the copy that this environment's pytest makes, as the guest is given it."""
    versions = "-".join(
        f"{d.name}{d.version}"
        for d in map(importlib.metadata.distribution, _guest_pytest.DISTRIBUTIONS)
    )
    return "pytest-" + versions


def files_under(root: Path) -> set[str]:
    return {
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def installed_files() -> set[str]:
    """What a whole copy holds, read from the installation itself: each package's files and
    each distribution's .dist-info directory."""
    found = set()
    for name in _guest_pytest.PACKAGES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        if spec.submodule_search_locations:
            package = Path(spec.submodule_search_locations[0])
            found |= {f"{package.name}/{file}" for file in files_under(package)}
        else:
            found.add(Path(spec.origin).name)
    for distribution in map(importlib.metadata.distribution, _guest_pytest.DISTRIBUTIONS):
        (metadata,) = {
            file.parts[0]
            for file in distribution.files or ()
            if file.parts[0].endswith(".dist-info")
        }
        directory = Path(str(distribution.locate_file(metadata)))
        found |= {f"{metadata}/{file}" for file in files_under(directory)}
    return found


def assert_whole(copy: Path) -> None:
    """`copy` holds every file of the installation (and what else it holds is its own)."""
    assert {file for file in files_under(copy) if not file.startswith(".")} == installed_files()


def run_cases(tmp_path: Path, cases: list[list[str]], mount: str) -> dict[str, Any]:
    script = tmp_path / "cases.py"
    script.write_text(CASES)
    argv = in_mount_namespace(mount, [sys.executable, str(script), json.dumps(cases)])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return found


def test_pods_with_equal_pids_copying_at_once_leave_one_whole_copy(tmp_path: Path) -> None:
    # Pods sharing one hostPath as hluk's cache: each worker is its pid namespace's pid 1
    # (unshare --fork), and all of them copy at once.
    need_unshare()
    for attempt in range(3):
        cache, go = tmp_path / f"cache-{attempt}", tmp_path / f"go-{attempt}"
        env = {**os.environ, "HLUK_CACHE_DIR": str(cache)}
        argv = ["unshare", "--pid", "--fork", sys.executable, "-c", COPY, str(go)]
        pods = [
            subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )
            for _ in range(4)
        ]
        for pod in pods:
            assert pod.stdout is not None and pod.stdout.readline() == "ready\n"
        go.touch()
        outputs = [pod.communicate(timeout=120) for pod in pods]
        assert [pod.returncode for pod in pods] == [0] * 4, [err for _, err in outputs]
        printed = {out.strip() for out, _ in outputs}
        (line,) = printed  # one pid (1, in every pod) and one copy
        pid, copy = line.split(" ", 1)
        assert pid == "1"
        assert_whole(Path(copy))
        assert not list(copies_directory(cache).glob("*.part"))


def killed_copier(cache: Path) -> Path:
    """A copier SIGKILLed halfway through its copy: the directory it was writing."""
    env = {**os.environ, "HLUK_CACHE_DIR": str(cache)}
    copier = subprocess.Popen([sys.executable, "-c", COPY], stdout=subprocess.DEVNULL, env=env)
    try:
        while True:
            assert copier.poll() is None, "the copier finished before it could be killed"
            for part in copies_directory(cache).glob("*.part"):
                try:
                    halfway = any(part.iterdir())
                except FileNotFoundError:  # renamed into place meanwhile
                    continue
                if halfway:
                    copier.send_signal(signal.SIGKILL)
                    return part
            time.sleep(0.001)
    finally:
        copier.kill()
        copier.wait()


def test_a_copier_killed_halfway_leaves_nothing_a_guest_mounts_and_its_part_is_removed(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    part = killed_copier(cache)
    done = subprocess.run(
        [sys.executable, "-c", COPY],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HLUK_CACHE_DIR": str(cache)},
    )
    assert done.returncode == 0, done.stderr
    assert_whole(Path(done.stdout.split(" ", 1)[1].strip()))
    assert not part.exists()


def test_a_partial_tree_in_the_copys_place_is_not_accepted(host: Host) -> None:
    # As a copy published before it was whole leaves it (pytest's package only: no pluggy).
    partial = copies_directory(host.cache) / copy_name()
    spec = importlib.util.find_spec("pytest")
    assert spec is not None and spec.submodule_search_locations
    shutil.copytree(spec.submodule_search_locations[0], partial / "pytest")
    reply = run_pytest("def test_ok():\n    assert True\n")
    assert reply["status"] == "Success", reply
    assert_whole(partial)


def test_a_full_disk_is_said_once_and_the_copy_not_tried_again_for_each_case(
    host: Host, tmp_path: Path
) -> None:
    copies = copies_directory(host.cache)
    copies.mkdir(parents=True)
    # Room for the warm-up's lock, not for pytest (about 8 MB).
    mount = f"mount -t tmpfs -o size=1m verl-hyperlight-test {copies}"
    found = run_cases(tmp_path, [PYTEST_CASE] * 6 + [PYTHON_CASE], mount)
    statuses = [status for _, status, _ in found["answers"]]
    assert statuses == ["SandboxError"] * 6 + ["Success"], found
    messages = {message for _, _, message in found["answers"][:6]}
    assert len(messages) == 1 and "No space left on device" in messages.pop()
    assert found["copies"] == 1
    assert len([line for line in found["errors"] if "copy pytest" in line]) == 1, found["errors"]


def test_a_full_disk_freed_is_copied_to_once_the_retry_is_due(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = GateClock()
    monkeypatch.setattr(_guest_pytest, "time", clock)
    with monkeypatch.context() as full:
        full.setattr(shutil, "copytree", no_room)
        assert "No space left on device" in run_pytest("def test_ok(): pass")["message"]
    assert run_pytest("def test_ok(): pass")["status"] == "SandboxError"  # within the retry
    clock.skip(_guest_pytest.RETRY_SECONDS)
    assert run_pytest("def test_ok(): pass")["status"] == "Success"


def no_room(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_read_only_prebuilt_cache_runs_python_and_pytest_cases(
    host: Host, tmp_path: Path
) -> None:
    # Built where it is writable, then mounted read-only, at the path its stamps name.
    assert run_pytest("def test_ok(): pass")["status"] == "Success"
    assert result(run("print('ok')", memory=1024))[0] == "Success"
    read_only = f"mount --bind {host.cache} {host.cache} && mount -o remount,bind,ro {host.cache}"
    found = run_cases(tmp_path, [PYTHON_CASE, PYTEST_CASE, PYTHON_CASE, PYTEST_CASE], read_only)
    assert [status for _, status, _ in found["answers"]] == ["Success"] * 4, found
    assert found["errors"] == []


def test_a_read_only_cache_without_the_copy_says_what_to_do(host: Host, tmp_path: Path) -> None:
    assert result(run("print('ok')", memory=1024))[0] == "Success"
    read_only = f"mount --bind {host.cache} {host.cache} && mount -o remount,bind,ro {host.cache}"
    found = run_cases(tmp_path, [PYTEST_CASE, PYTHON_CASE], read_only)
    (_, status, message), (_, python_status, _) = found["answers"]
    assert (status, python_status) == ("SandboxError", "Success")
    assert "a cache mounted read-only needs the copy made beforehand" in message


def metadata_directory(distribution: importlib.metadata.Distribution) -> Path:
    (name,) = {
        file.parts[0] for file in distribution.files or () if file.parts[0].endswith(".dist-info")
    }
    return Path(str(distribution.locate_file(name)))


def fake_installation(site: Path) -> None:
    """In `site` (put first on sys.path), the metadata of this environment's pytest
    distributions: an installation of them that a test can upgrade (see `upgrade`)."""
    site.mkdir()
    for distribution in map(importlib.metadata.distribution, _guest_pytest.DISTRIBUTIONS):
        source = metadata_directory(distribution)
        shutil.copytree(source, site / source.name)


def upgrade(site: Path, name: str) -> str:
    """Upgrade `name` in the fake installation at `site` to its next patch release, as pip
    does to its .dist-info directory; the new version."""
    (old,) = site.glob(f"{name}-*.dist-info")
    version = importlib.metadata.Distribution.at(old).version
    major_minor, patch = version.rsplit(".", 1)
    new_version = f"{major_minor}.{int(patch) + 1}"
    staged = site / "staged"
    shutil.copytree(old, staged)
    for file in ("METADATA", "RECORD"):
        path = staged / file
        path.write_text(
            path.read_text()
            .replace(f"{name}-{version}", f"{name}-{new_version}")
            .replace(f"Version: {version}", f"Version: {new_version}")
        )
    shutil.rmtree(old)
    staged.rename(site / old.name.replace(version, new_version))
    return new_version


def test_pytest_upgraded_under_a_running_worker_is_copied_and_warmed_anew(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    fake_installation(site)
    monkeypatch.syspath_prepend(str(site))
    assert run_pytest("def test_ok(): pass")["status"] == "Success"
    version = upgrade(site, "iniconfig")
    reply = run_pytest(
        "import importlib.metadata\n"
        "def test_upgraded():\n"
        f"    assert importlib.metadata.version('iniconfig') == {version!r}\n"
    )
    assert reply["status"] == "Success", reply["run_result"]["stdout"]
    copies = [p.name for p in copies_directory(host.cache).glob("pytest-*") if p.is_dir()]
    # Both copies: the old one may still be mounted by a case this worker started before.
    assert len(copies) == 2 and any(f"iniconfig{version}" in copy for copy in copies)
    # Each copy has a warm snapshot of its own: the snapshot holds the pytest it imported.
    warm_execs = {option(argv, "--warm-exec") for argv in host.warm_ups() if "--mount" in argv}
    assert len(warm_execs) == 2


def test_a_pytest_case_looks_up_pytests_distributions_once_per_process(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up: list[str] = []
    distribution = importlib.metadata.distribution

    def counted(name: str) -> importlib.metadata.Distribution:
        looked_up.append(name)
        return distribution(name)

    monkeypatch.setattr(importlib.metadata, "distribution", counted)
    for _ in range(10):
        assert run_pytest("def test_ok(): pass")["status"] == "Success"
    assert sorted(looked_up) == sorted(_guest_pytest.DISTRIBUTIONS)


HOLD = """
import sys
from verl_hyperlight.case import pytest_library
print(pytest_library.library(), flush=True)
sys.stdin.read()
"""


def test_copies_no_process_holds_are_removed_and_held_ones_kept(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {**os.environ, "HLUK_CACHE_DIR": str(cache)}
    # A worker of another pytest's, still up: its copy is held.
    site = tmp_path / "site"
    fake_installation(site)
    upgrade(site, "pluggy")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])},
    )
    try:
        assert holder.stdout is not None
        held = Path(holder.stdout.readline().strip())
        assert held.is_dir()
        # A copier killed halfway, and the copy of a pytest no worker runs any more.
        part = killed_copier(cache)
        unheld = copies_directory(cache) / "pytest-pytest8.0.0-pluggy1.4.0"
        shutil.copytree(held, unheld)
        cleaner = subprocess.run(
            [sys.executable, "-c", COPY], capture_output=True, text=True, env=env, timeout=120
        )
        assert cleaner.returncode == 0, cleaner.stderr
        current = Path(cleaner.stdout.split(" ", 1)[1].strip())
        assert not part.exists() and not unheld.exists()
        assert_whole(current)
        assert held.is_dir() and (held / _guest_pytest.WHOLE).is_file()
    finally:
        holder.communicate("", timeout=60)
    # Its worker gone, the next process to take up the copies removes it.
    cleaner = subprocess.run(
        [sys.executable, "-c", COPY], capture_output=True, text=True, env=env, timeout=120
    )
    assert cleaner.returncode == 0, cleaner.stderr
    assert sorted(p.name for p in copies_directory(cache).iterdir()) == sorted(
        [_guest_pytest.COPYING_LOCK, current.name, current.name + _guest_pytest.LOCK_SUFFIX]
    )


def waiting_for_flock(path: str) -> bool:
    """Whether a flock(2) request on `path`'s file waits (a `->` line of /proc/locks)."""
    stat = os.stat(path)
    inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    with open("/proc/locks") as locks:
        return any("->" in line and "FLOCK" in line and inode in line for line in locks)


def test_a_lock_file_removed_while_a_process_waited_for_it_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cleaner removes a copy's lock file under its exclusive lock; a process that opened it
    # just before then holds a file of no name, which no later cleaner would see held.
    monkeypatch.setattr(_guest_pytest, "_held", {})
    lock_file = str(tmp_path / "pytest-x.lock")
    cleaner = os.open(lock_file, os.O_RDWR | os.O_CREAT)
    fcntl.flock(cleaner, fcntl.LOCK_EX)
    waiter = threading.Thread(target=_guest_pytest._hold, args=(lock_file,))
    waiter.start()
    try:
        while not waiting_for_flock(lock_file):
            time.sleep(0.001)
        os.unlink(lock_file)
    finally:
        os.close(cleaner)
        waiter.join()
    descriptor = _guest_pytest._held[lock_file]
    try:
        assert os.fstat(descriptor).st_ino == os.stat(lock_file).st_ino
    finally:
        os.close(descriptor)


def test_a_read_only_cache_without_the_guests_snapshot_says_what_to_do(
    host: Host, tmp_path: Path
) -> None:
    assert result(run("print('ok')"))[0] == "Success"  # the image's default memory alone
    read_only = f"mount --bind {host.cache} {host.cache} && mount -o remount,bind,ro {host.cache}"
    found = run_cases(tmp_path, [PYTHON_CASE], read_only)
    ((_, status, message),) = found["answers"]
    assert status == "SandboxError"
    assert "a cache mounted read-only serves only the guests whose warm snapshots" in message
