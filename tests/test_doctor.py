"""`verl-hyperlight doctor` on the stand-in: a healthy node, and each check's failing form
with the fix it names."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import STANDIN
from hostside import KVM_FAILURE, Host, fail_with, typescript_missing

from verl_hyperlight import diagnosis as _diagnosis
from verl_hyperlight import node
from verl_hyperlight import settings as _settings
from verl_hyperlight.cli import main
from verl_hyperlight.commands import doctor
from verl_hyperlight.hluk import cleaner as _cleaner
from verl_hyperlight.hluk import spawn as _spawn
from verl_hyperlight.hluk import spawners as _spawners


def run_doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, dict]]:  # type: ignore[type-arg]
    """doctor's exit status and its checks by name (from --json)."""
    status = main(["doctor", "--json", *args])
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] == (status == 0)
    return status, {check["name"]: check for check in report["checks"]}


@pytest.fixture
def verl_09(monkeypatch: pytest.MonkeyPatch) -> None:
    """A verl 0.9.1 with this package's entry point, whatever is installed here."""
    monkeypatch.setattr(doctor, "_verl_version", lambda: "0.9.1")
    monkeypatch.setattr(doctor, "_plugins", lambda: {"hyperlight"})
    monkeypatch.delenv("VERL_USE_EXTERNAL_PLUGINS", raising=False)


def test_a_healthy_node_passes_every_check_and_prints_one_line_each(
    host: Host, verl_09: None, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["warm-up"])  # a node warmed up beforehand, as the docs say
    capsys.readouterr()
    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # The stand-in's wrapper execs it: no wrapper line.
    names = [
        "platform",
        "python",
        "settings",
        "hluk",
        "/dev/kvm",
        "cache",
        "case-dir",
        "snapshot",
        "case",
    ]
    compilers = ["cpp", "go", "rust", "java", "typescript"]
    images = ["nodejs", "java", "bash"]
    if typescript_missing() is not None:
        # A developer's node without TypeScript (CI installs it; tests/test_nodejs.py skips
        # its cases): its check warns, with its fix on the next line, and the node passes.
        at = [line.split()[1] for line in lines].index("typescript")
        assert lines[at].startswith("warn ") and lines[at + 1].split()[0] == "fix:", lines
        assert "npm install -g typescript" in lines[at + 1]
        del lines[at : at + 2]
        compilers.remove("typescript")
    assert [line.split()[1] for line in lines] == [
        *names,
        "pytest",
        *compilers,
        *images,
        "spawn",
        "verl",
    ]
    assert all(line.startswith("ok ") for line in lines), lines
    assert "print(1+1) answered 2" in "\n".join(lines)
    assert "set reward.sandbox_fusion.url=hyperlight://" in lines[-1]


def test_a_node_without_a_compiler_is_warned_with_its_install_and_passes(
    host: Host,
    verl_09: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    main(["warm-up"])
    capsys.readouterr()
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++, no rustc; Go from the go extra
    status, found = run_doctor(capsys)
    assert status == 0
    assert found["cpp compiler"]["status"] == "warn"
    assert "apt-get install g++" in found["cpp compiler"]["fix"]
    assert found["rust compiler"]["status"] == "warn"
    assert "https://rustup.rs" in found["rust compiler"]["fix"]
    assert found["go compiler"]["status"] == "ok"
    assert "/go/bin/go" in found["go compiler"]["detail"]


def test_a_missing_hluk_fails_with_the_installer_line(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("HLUK_PATH")
    monkeypatch.setenv("PATH", str(tmp_path))
    status, found = run_doctor(capsys)
    assert status == 1
    assert found["hluk"]["status"] == "fail"
    assert found["hluk"]["fix"].startswith(_diagnosis.INSTALL_COMMAND)
    # And, on a node without KVM, how to try things: the checkout's script for the stand-in.
    script = Path(__file__).parent.parent / "examples" / "try-without-kvm.sh"
    assert f"to try things without KVM: source {script}" in found["hluk"]["fix"]
    assert "raw.githubusercontent.com/hyperlight-dev/hyperlight-unikraft" in found["hluk"]["fix"]
    assert "case" not in found  # nothing to run a case with


def test_a_program_that_is_not_hluk_fails_as_not_hluk(
    host: Host, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A newcomer's HLUK_PATH=/usr/bin/python3 passed as "ok hluk 3.11.2".
    monkeypatch.setenv("HLUK_PATH", sys.executable)
    status, found = run_doctor(capsys)
    assert status == 1 and found["hluk"]["status"] == "fail"
    assert (
        f"{sys.executable} is not hluk: its --version printed no hluk version"
        in (found["hluk"]["detail"])
    )
    assert "'Python 3." in found["hluk"]["detail"] and "HLUK_PATH" in found["hluk"]["fix"]


@pytest.mark.parametrize("where", ["HLUK_INSTALL_DIR", "HOME"])
def test_hluk_installed_off_path_fails_saying_to_add_its_folder_to_path(
    host: Host,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    where: str,
) -> None:
    """The installer puts hluk in ~/.local/bin (or HLUK_INSTALL_DIR), which PATH may not name:
    installing again would not help."""
    folder = tmp_path / "bin" if where == "HLUK_INSTALL_DIR" else tmp_path / ".local" / "bin"
    folder.mkdir(parents=True)
    (folder / "hluk").write_bytes(Path(os.environ["HLUK_PATH"]).read_bytes())
    (folder / "hluk").chmod(0o755)
    monkeypatch.setenv(where, str(tmp_path / "bin" if where == "HLUK_INSTALL_DIR" else tmp_path))
    monkeypatch.delenv("HLUK_PATH")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    status, found = run_doctor(capsys)
    assert status == 1 and found["hluk"]["status"] == "fail"
    assert found["hluk"]["detail"] == (
        f"hluk is installed at {folder / 'hluk'}, but {folder} is not on PATH"
    )
    assert f'export PATH="{folder}:$PATH"' in found["hluk"]["fix"]
    assert "install.sh" not in found["hluk"]["fix"]
    # And a case says so too.
    from verl_hyperlight import run_code

    response, _ = run_code("hyperlight://", "print(1)", "", None, 10, 1024)
    assert response is not None and f"{folder} is not on PATH" in response["message"]


def test_a_misspelled_setting_is_warned_with_the_nearest_one(
    host: Host, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMOUT", "120")
    monkeypatch.setenv("VERL_HYPERLIGHT_NOTHING_LIKE_IT", "1")
    _, found = run_doctor(capsys)
    check = found["settings"]
    assert check["status"] == "warn"
    assert (
        "VERL_HYPERLIGHT_STARTUP_TIMOUT (did you mean VERL_HYPERLIGHT_STARTUP_TIMEOUT?)"
        in (check["detail"])
    )
    assert (
        "rename VERL_HYPERLIGHT_STARTUP_TIMOUT to VERL_HYPERLIGHT_STARTUP_TIMEOUT" in check["fix"]
    )
    assert "unset VERL_HYPERLIGHT_NOTHING_LIKE_IT" in check["fix"]


def test_the_stand_in_is_said_once_plainly_and_is_no_wrapper_to_fix(
    host: Host, verl_09: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As the README's "Try it without KVM" sets it up: HLUK_PATH at the stand-in itself.
    monkeypatch.setenv("HLUK_PATH", str(STANDIN))
    monkeypatch.setenv("VERL_HYPERLIGHT_HLUK_ENV", "HLUK_STANDIN_*")
    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    said = [line for line in lines if "stand-in" in line]
    assert said == [
        f"warn  {'stand-in':<{doctor.NAME_WIDTH}}  {STANDIN} is the test stand-in: weaker "
        "isolation, for trying only"
    ]
    assert not [line for line in lines if "exec" in line]


def test_an_old_hluk_fails_asking_for_0_19(
    host: Host, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HLUK_STANDIN_VERSION", "0.18.2")
    status, found = run_doctor(capsys)
    assert status == 1
    assert "0.18.2" in found["hluk"]["detail"] and "0.19.0 or later" in found["hluk"]["fix"]


def test_hluk_that_is_not_executable_fails_with_chmod(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "hluk"
    plain.write_text("#!/bin/sh\n")
    monkeypatch.setenv("HLUK_PATH", str(plain))
    _, found = run_doctor(capsys)
    assert found["hluk"]["fix"] == f"chmod +x {plain}, or point HLUK_PATH at hluk itself"
    plain.unlink()
    _, found = run_doctor(capsys)  # missing: HLUK_PATH is what to fix, not an install
    assert found["hluk"]["detail"] == f"hluk was not found at {plain} (where HLUK_PATH points)"
    assert found["hluk"]["fix"].startswith("point HLUK_PATH at hluk, or unset it")
    monkeypatch.setenv("HLUK_PATH", str(tmp_path))
    _, found = run_doctor(capsys)
    assert "is a directory, not hluk" in found["hluk"]["detail"]
    assert "chmod" not in found["hluk"]["fix"]


def test_a_wrapper_that_does_not_exec_hluk_is_flagged(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wrapper = tmp_path / "hluk"
    wrapper.write_text(f'#!/bin/sh\n{sys.executable} -I -S {STANDIN} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("HLUK_PATH", str(wrapper))
    status, found = run_doctor(capsys)
    assert found["wrapper"]["status"] == "warn"
    assert "does not exec hluk" in found["wrapper"]["detail"]
    assert "exec /path/to/hluk" in found["wrapper"]["fix"]
    assert status == 0  # a warning, not a failure


def test_no_dev_kvm_fails_pointing_at_a_kvm_node_the_cluster_or_serve(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(doctor, "KVM_DEVICE", str(tmp_path / "no-kvm"))
    status, found = run_doctor(capsys)
    assert status == 1
    assert found["/dev/kvm"]["status"] == "fail"
    assert "hyperlight://?ray" in found["/dev/kvm"]["fix"]
    assert "verl-hyperlight serve" in found["/dev/kvm"]["fix"]
    # Only /dev/kvm fails: the docs' `verl-hyperlight doctor` example, run on the stand-in on
    # a machine without KVM, is held to that (tests/test_docs.py).
    assert [name for name, check in found.items() if check["status"] == "fail"] == ["/dev/kvm"]


def test_a_dev_kvm_this_user_cannot_use_names_its_group_and_the_usermod_line(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    device = tmp_path / "kvm"
    device.write_text("")
    os.chown(device, -1, 0)  # group root (gid 0) stands for the kvm group here
    monkeypatch.setattr(doctor, "KVM_DEVICE", str(device))
    monkeypatch.setattr(doctor, "_can_use", lambda path: False)  # as root, access() says yes
    status, found = run_doctor(capsys)
    assert status == 1
    assert found["/dev/kvm"]["fix"].startswith("sudo usermod -aG root ")
    assert found["/dev/kvm"]["fix"].endswith(", then log in again")


def test_an_unwritable_cache_fails_and_a_full_one_warns(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("HLUK_CACHE_DIR", str(blocker / "cache"))
    status, found = run_doctor(capsys)
    assert status == 1
    assert found["cache"]["status"] == "fail" and "HLUK_CACHE_DIR" in found["cache"]["fix"]

    monkeypatch.setenv("HLUK_CACHE_DIR", str(host.cache))
    monkeypatch.setattr(doctor, "MIN_FREE_BYTES", 1 << 60)
    _, found = run_doctor(capsys)
    assert found["cache"]["status"] == "warn" and "free space" in found["cache"]["fix"]


def test_a_guest_that_fails_to_start_fails_with_what_fixes_it(
    host: Host,
    monkeypatch: pytest.MonkeyPatch,
    fail_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fail_with(monkeypatch, fail_file, KVM_FAILURE, 100)
    status, found = run_doctor(capsys)
    assert status == 1
    assert found["guest"]["status"] == "fail" and KVM_FAILURE in found["guest"]["detail"]
    assert "usermod -aG kvm" in found["guest"]["fix"]


def test_a_cold_node_warns_to_warm_up_and_is_warm_after(
    host: Host, capsys: pytest.CaptureFixture[str]
) -> None:
    _, found = run_doctor(capsys, "hyperlight://")
    assert found["snapshot"]["status"] == "warn"
    assert found["snapshot"]["fix"].startswith("verl-hyperlight warm-up hyperlight://")
    assert found["case"]["status"] == "ok"
    from verl_hyperlight.case import gate as _gate

    _gate.forget()  # another doctor run: a new process
    _, found = run_doctor(capsys, "hyperlight://")
    assert found["snapshot"]["status"] == "ok"


def test_a_spawner_that_cannot_start_warns_with_the_way_taken_instead(
    host: Host, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(_settings.SPAWN.name, "spawner")
    monkeypatch.setattr(_spawners, "_spawners", {})
    monkeypatch.setattr(_spawners, "_starts", _spawners._Starts())
    monkeypatch.setattr(_spawners, "SPAWNER_SCRIPT", "/nonexistent/spawner.py")
    _, found = run_doctor(capsys)
    assert found["spawn"]["status"] == "warn"
    assert "exited with status 2" in found["spawn"]["detail"]
    assert "setpriv" in found["spawn"]["detail"]
    monkeypatch.setattr(_spawn, "setpriv", lambda: None)
    _, found = run_doctor(capsys)
    assert "fork" in found["spawn"]["detail"] and "util-linux" in found["spawn"]["fix"]


def test_a_cleaner_that_cannot_start_warns_and_hluk_is_started_another_way(
    host: Host,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.delenv(_settings.SPAWN.name, raising=False)  # the default: direct
    monkeypatch.setattr(_cleaner, "_cleaner", _cleaner._Cleaner())
    monkeypatch.setattr(_cleaner.sys, "executable", "/nonexistent/python")
    monkeypatch.setattr(_spawners, "_spawners", {})
    monkeypatch.setattr(_spawners, "_starts", _spawners._Starts())
    _, found = run_doctor(capsys)
    assert found["spawn"]["status"] == "warn"
    assert found["spawn"]["detail"].startswith("the cleaner cannot start")
    assert "setpriv" in found["spawn"]["detail"]
    said = [r.getMessage() for r in caplog.records if "cleaner" in r.getMessage()]
    assert len(said) == 1 and "/nonexistent/python" in said[0], said


def test_an_oversubscribed_sizing_fails_with_the_max_concurrent_that_fits(
    host: Host, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cpus = node.cpus()
    status, found = run_doctor(capsys, "--max-concurrent", str(cpus + 1), "--num-workers", "1")
    assert status == 1
    assert found["sizing"]["status"] == "fail"
    assert found["sizing"]["fix"] == f"max_concurrent={cpus}"

    monkeypatch.setattr(node, "available_mb", lambda: 1000)
    _, found = run_doctor(capsys, "--max-concurrent", "1", "--num-workers", "1")
    assert found["sizing"]["status"] == "ok"
    assert found["memory"]["status"] == "fail"  # 1536 MiB of guest alone
    assert "0 ready ones" not in found["memory"]["detail"]  # the host fixture's: none

    monkeypatch.setattr(node, "available_mb", lambda: 2 * (1536 + node.HOST_MB_PER_CASE) + 1)
    _, found = run_doctor(capsys, "--max-concurrent", "1", "--num-workers", "2")
    assert found["memory"]["status"] == "ok"
    monkeypatch.setenv("VERL_HYPERLIGHT_READY_GUESTS", "8")  # one ready guest per worker more
    _, found = run_doctor(capsys, "--max-concurrent", "1", "--num-workers", "2")
    assert found["memory"]["status"] == "fail"
    assert "and 2 ready ones" in found["memory"]["detail"]
    assert found["memory"]["fix"].startswith("VERL_HYPERLIGHT_READY_GUESTS=0")


@pytest.mark.parametrize(
    ("version", "environment", "status", "fix"),
    [
        ("0.9.1", {"VERL_USE_EXTERNAL_PLUGINS": "none"}, "fail", "name hyperlight"),
        ("0.9.1", {"VERL_USE_EXTERNAL_PLUGINS": "other_plugin"}, "fail", "name hyperlight"),
        ("0.9.1", {"VERL_USE_EXTERNAL_PLUGINS": "Other, HyperLight"}, "ok", ""),
        ("0.8.0", {}, "fail", "VERL_USE_EXTERNAL_MODULES=verl_hyperlight.plugin"),
        ("0.7.0", {"VERL_USE_EXTERNAL_MODULES": "verl_hyperlight.plugin"}, "ok", ""),
        ("0.5.0", {}, "warn", "verl-hyperlight serve"),
    ],
)
def test_the_verl_check_follows_verls_plugin_policy_for_its_version(
    host: Host,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    version: str,
    environment: dict[str, str],
    status: str,
    fix: str,
) -> None:
    monkeypatch.setattr(doctor, "_verl_version", lambda: version)
    monkeypatch.setattr(doctor, "_plugins", lambda: {"hyperlight"})
    for name in ("VERL_USE_EXTERNAL_PLUGINS", "VERL_USE_EXTERNAL_MODULES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    _, found = run_doctor(capsys)
    assert found["verl"]["status"] == status, found["verl"]
    assert fix in found["verl"]["fix"]
    if status == "ok":
        key = "reward_model" if version < "0.7.1" else "reward"
        assert f"set {key}.sandbox_fusion.url=hyperlight://" in found["verl"]["detail"]


def test_a_missing_entry_point_fails_asking_to_reinstall(
    host: Host, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(doctor, "_verl_version", lambda: "0.9.1")
    monkeypatch.setattr(doctor, "_plugins", lambda: set())
    _, found = run_doctor(capsys)
    assert found["verl"]["status"] == "fail" and "reinstall" in found["verl"]["fix"]


# ---------------------------------------------------------------------------------------------
# where case directories go, and the pytest extra (issue 24)


def test_doctor_says_where_case_directories_go(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from verl_hyperlight.case import casedir as _casedir

    _, found = run_doctor(capsys)
    assert found["case-dir"]["status"] == "ok"
    assert f"case directories go to the tmpfs {host.tmpfs} " in found["case-dir"]["detail"]
    # No tmpfs (a container without /dev/shm): they go to TMPDIR, which is said, with the fix.
    monkeypatch.setattr(_casedir, "TMPFS", str(tmp_path / "no-shm"))
    _, found = run_doctor(capsys)
    assert found["case-dir"]["status"] == "warn"
    assert f"case directories go to {host.tmpdir} (TMPDIR)" in found["case-dir"]["detail"]
    assert f"VERL_HYPERLIGHT_CASE_DIR={host.tmpdir} keeps them there" in found["case-dir"]["fix"]
    # Chosen: exactly there, or a failure that says what to do.
    chosen = tmp_path / "cases"
    chosen.mkdir()
    monkeypatch.setenv("VERL_HYPERLIGHT_CASE_DIR", str(chosen))
    _, found = run_doctor(capsys)
    assert found["case-dir"]["status"] == "ok"
    assert found["case-dir"]["detail"] == (
        f"case directories go to {chosen} (VERL_HYPERLIGHT_CASE_DIR)"
    )
    assert list(chosen.iterdir()) == []  # the one doctor made is gone
    monkeypatch.setenv("VERL_HYPERLIGHT_CASE_DIR", str(tmp_path / "missing"))
    status, found = run_doctor(capsys)
    assert status == 1 and found["case-dir"]["status"] == "fail"
    assert found["case-dir"]["fix"] == ("point VERL_HYPERLIGHT_CASE_DIR at a writable directory")


def test_doctor_says_whether_the_pytest_extra_is_installed(
    host: Host, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from verl_hyperlight.case import pytest_library as _pytest_library

    _, found = run_doctor(capsys)
    assert found["pytest"]["status"] == "ok"
    detail = found["pytest"]["detail"]
    assert detail.startswith(f"the pytest extra is installed: pytest {pytest.__version__} ")
    library = detail.rsplit(" given to the guest from ", 1)[1]
    assert Path(library, "pytest").is_dir()  # the copy the guest mounts is made

    def missing() -> str:
        raise _pytest_library.Missing(_diagnosis.pytest_missing("pytest is not installed"))

    monkeypatch.setattr(_pytest_library, "library", missing)
    _, found = run_doctor(capsys)
    assert found["pytest"]["status"] == "warn"  # python cases run on without it
    assert "pytest is not installed" in found["pytest"]["detail"]
    fix = (
        "pip install -e '.[pytest]' in your verl-hyperlight checkout, in the environment "
        "verl-hyperlight runs in"
    )
    assert found["pytest"]["fix"] == fix


def test_the_nodejs_image_is_said_with_its_warm_up_until_pulled(
    host: Host, capsys: pytest.CaptureFixture[str]
) -> None:
    _, found = run_doctor(capsys, "hyperlight://")
    assert found["nodejs image"]["status"] == "ok"
    detail = found["nodejs image"]["detail"]
    assert "the node image, not pulled yet" in detail
    assert "verl-hyperlight warm-up --language nodejs takes them ahead" in detail
    assert main(["warm-up", "--language", "nodejs"]) == 0
    capsys.readouterr()
    _, found = run_doctor(capsys, "hyperlight://")
    assert "in hluk's cache at" in found["nodejs image"]["detail"], found["nodejs image"]
