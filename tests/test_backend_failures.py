"""Backend failures: each one is a SandboxError (never a wrong answer) whose message tells the
operator what to do, logged at ERROR once per cause per process; one that happened before the
solution started is retried once."""

from __future__ import annotations

import errno
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import STANDIN
from hostside import GateClock, Host, fail_with, result, run, sandbox_error

from verl_hyperlight import settings as _settings
from verl_hyperlight.case import warmup
from verl_hyperlight.errors import ZEROES_REWARDS

# A hluk that crashes after the solution started: it forwards the stand-in's console until the
# runner's start frame has passed, then its VM (the stand-in) dies with it and it panics, as a
# Rust program does (status 101). --version and the warm-up are the stand-in's own.
CRASHING_HLUK = """#!{python}
import os, re, subprocess, sys
argv = [{python!r}, "-I", "-S", {standin!r}, *sys.argv[1:]]
workload = sys.argv[sys.argv.index("--exec") + 1] if "--exec" in sys.argv else ""
nonce = re.search(r"'([0-9a-f]{{32}})'\\)$", workload)
if nonce is None or "--mount" not in sys.argv:  # not a case: --version, the warm-up's probe
    os.execv(argv[0], argv)
start = (nonce.group(1) + " start").encode()
vm = subprocess.Popen(argv, stdout=subprocess.PIPE)
seen = b""
while chunk := os.read(vm.stdout.fileno(), 65536):
    os.write(1, chunk)
    seen += chunk
    if start in seen:
        vm.kill()
        vm.wait()
        os.write(2, b"thread 'main' panicked at src/vmm/vcpu.rs:212:17:\\nunexpected VM exit\\n")
        os._exit(101)
sys.exit(vm.wait())
"""


def test_hluk_path_naming_a_missing_file_says_how_to_install_hluk(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HLUK_PATH", str(tmp_path / "no" / "hluk"))
    message = sandbox_error(run("print(1)"))
    assert "hluk was not found at" in message and "(where HLUK_PATH points)" in message
    assert "point HLUK_PATH at hluk, or unset it" in message
    # The installer's real line, which a user can run as it is.
    assert (
        "curl -fsSL https://raw.githubusercontent.com/hyperlight-dev/hyperlight-unikraft/main/"
        "install.sh | sh" in message
    )


def test_hluk_path_naming_a_file_that_is_not_executable_says_chmod(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plain = tmp_path / "hluk"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    monkeypatch.setenv("HLUK_PATH", str(plain))
    message = sandbox_error(run("print(1)"))
    assert "is not executable" in message and "chmod +x" in message


def test_hluk_path_naming_a_directory_says_to_point_it_at_hluk(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HLUK_PATH", str(tmp_path))
    message = sandbox_error(run("print(1)"))
    assert f"{tmp_path} (where HLUK_PATH points) is a directory, not hluk" in message
    assert "chmod" not in message and "install" not in message


def test_hluk_path_naming_another_program_quotes_its_first_line(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    other = tmp_path / "true"
    other.write_text("#!/bin/sh\nprintf 'true (GNU coreutils) 9.1\\nCopyright (C) 2022\\n'\n")
    other.chmod(0o755)
    monkeypatch.setenv("HLUK_PATH", str(other))
    message = sandbox_error(run("print(1)"))
    assert f"{other} is not hluk: its --version printed no hluk version" in message
    assert "'true (GNU coreutils) 9.1'" in message and "Copyright" not in message


def test_hluk_older_than_0_19_is_refused_with_a_request_to_upgrade(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HLUK_STANDIN_VERSION", "0.18.3")
    message = sandbox_error(run("print(1)"))
    assert "0.18.3" in message and "0.19.0 or later" in message and "upgrade" in message
    assert host.runs() == [["--version"]]


def test_no_access_to_dev_kvm_says_to_join_the_kvm_group(
    host: Host, monkeypatch: pytest.MonkeyPatch, fail_file: Path
) -> None:
    fail_with(monkeypatch, fail_file, "failed to open /dev/kvm: Permission denied", 100)
    message = sandbox_error(run("print(1)"))
    assert "/dev/kvm: Permission denied" in message
    assert "kvm group" in message and "usermod -aG kvm" in message


def test_an_unknown_image_says_to_check_the_sandbox_url(host: Host) -> None:
    url = "hyperlight://registry.example/org/nosuch:1"
    message = sandbox_error(run("print(1)", url=url))
    # The stand-in, as hluk, cannot find the image's manifest in the registry.
    assert "manifest unknown" in message
    assert "check the sandbox URL" in message


def test_an_image_pull_failure_says_to_check_the_registry(
    host: Host, monkeypatch: pytest.MonkeyPatch, fail_file: Path
) -> None:
    fail_with(
        monkeypatch,
        fail_file,
        "failed to pull image 'ghcr.io/hyperlight-dev/python:0.19': error sending request for "
        "url (https://ghcr.io/v2/): connection refused",
        100,
    )
    message = sandbox_error(run("print(1)"))
    assert "could not pull the image" in message and "connection refused" in message
    assert "registry" in message and "verl-hyperlight warm-up" in message


def test_a_snapshot_failure_says_to_check_hluks_cache(
    host: Host, monkeypatch: pytest.MonkeyPatch, fail_file: Path
) -> None:
    fail_with(monkeypatch, fail_file, "failed to save snapshot: No space left on device", 100)
    message = sandbox_error(run("print(1)"))
    assert "No space left on device" in message
    assert "free space" in message and "HLUK_CACHE_DIR" in message


@pytest.fixture
def crashing_hluk(host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Host:
    """HLUK_PATH is CRASHING_HLUK."""
    crashing = tmp_path / "hluk"
    crashing.write_text(
        CRASHING_HLUK.format(python=shlex.quote(sys.executable), standin=str(STANDIN))
    )
    crashing.chmod(0o755)
    monkeypatch.setenv("HLUK_PATH", str(crashing))
    return host


def test_hluk_crashing_after_the_solution_started_is_a_sandbox_error_not_retried(
    crashing_hluk: Host,
) -> None:
    host = crashing_hluk
    message = sandbox_error(run("import time\nprint('partial', flush=True)\ntime.sleep(30)"))
    assert "status 101" in message and "panicked" in message
    assert "upgrade hluk" in message and "report" in message
    assert len(host.case_runs()) == 1


def test_a_failure_before_the_solution_started_is_retried_once(
    host: Host, monkeypatch: pytest.MonkeyPatch, fail_file: Path
) -> None:
    run("pass")
    fail_with(monkeypatch, fail_file, "failed to restore snapshot: interrupted", 1)
    assert result(run("print('second try')"))[:4] == ("Success", "Finished", 0, "second try\n")
    assert len(host.case_runs()) == 1 + 2


def test_a_failure_before_the_solution_started_twice_is_a_sandbox_error(
    host: Host, monkeypatch: pytest.MonkeyPatch, fail_file: Path
) -> None:
    run("pass")
    fail_with(monkeypatch, fail_file, "failed to restore snapshot: interrupted", 3)
    assert "failed to restore snapshot: interrupted" in sandbox_error(run("print(1)"))
    # The case failed at once, so before its retry the guest was probed again, and the probe
    # failed the same way, twice (a probe gets a retry too): the case is answered without
    # running again.
    assert len(host.case_runs()) == 1 + 1
    assert len(host.warm_ups()) == 1 + 2


def test_a_guest_that_never_starts_is_a_sandbox_error_distinct_from_a_timeout(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    run("pass")
    # The probes counted where they are made: a stand-in starved past the deadline on a loaded
    # machine is killed before it logs its argv (CI's 3.13 leg, twice), so its log misses one.
    probes: list[Any] = []
    probe = warmup._probe
    monkeypatch.setattr(warmup, "_probe", lambda *args: probes.append(args) or probe(*args))
    monkeypatch.setenv("HLUK_STANDIN_HANG", "1")
    monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", "1")
    message = sandbox_error(run("print(1)", run_timeout=30))
    assert "did not start within 1 s" in message
    assert "VERL_HYPERLIGHT_STARTUP_TIMEOUT" in message and "max_concurrent" in message
    # The case's run, then, before its retry, a probe held to the same deadline, which hung too
    # (the case's answer is its failure): no retry.
    assert len(host.case_runs()) == 1 + 1
    assert len(probes) == 1


def test_retries_are_said_once_per_cause_then_at_every_power_of_ten(
    host: Host,
    monkeypatch: pytest.MonkeyPatch,
    fail_file: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A stall that a whole batch meets must not write a line per case: twelve cases, each
    # failing to start once and answered on its retry.
    caplog.set_level(logging.WARNING, logger="verl_hyperlight")
    run("pass")
    for n in range(12):
        fail_with(monkeypatch, fail_file, "failed to restore snapshot: interrupted", 1)
        assert result(run(f"print({n})"))[:4] == ("Success", "Finished", 0, f"{n}\n")
    said = [r.getMessage() for r in caplog.records if "did not start" in r.getMessage()]
    assert len(said) == 2, said
    assert said[0].startswith("verl-hyperlight: retrying a case that did not start: ")
    assert said[1].startswith("verl-hyperlight: 10 cases that did not start retried so far")
    assert all("failed to restore snapshot: interrupted" in line for line in said)


@pytest.mark.parametrize("stage", ["warm-up", "case"])
def test_each_cause_is_logged_at_error_once_per_process_then_counted(
    host: Host,
    monkeypatch: pytest.MonkeyPatch,
    fail_file: Path,
    caplog: pytest.LogCaptureFixture,
    stage: str,
) -> None:
    from verl_hyperlight.case import failures as _failures

    caplog.set_level(logging.ERROR, logger="verl_hyperlight")
    if stage == "case":
        run("pass")
    fail_with(monkeypatch, fail_file, "failed to open /dev/kvm: Permission denied", 100)
    for _ in range(4):
        assert "kvm group" in sandbox_error(run("print(1)"))
    errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert all("kvm group" in error for error in errors)
    # The cause, at its first case; then the guest's gate opening (once, with the cause), after
    # three failed starts in a row.
    opened = [error for error in errors if "answered SandboxError at once" in error]
    assert len(opened) == 1 and len(errors) == 2, errors
    assert _failures.log.counts() == {"kvm": 4}


def test_an_internal_error_logs_its_traceback_once_per_cause_and_counts_the_rest(
    host: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from verl_hyperlight.case import failures as _failures
    from verl_hyperlight.case import gate as _gate

    caplog.set_level(logging.ERROR, logger="verl_hyperlight")

    def broken_gate(path: str, guest: Any) -> Any:
        # A bug of the package's, in two places: two causes.
        if guest.scratch_mb is None:
            raise ValueError(f"no gate for {path}")
        raise KeyError(guest.scratch_mb)

    monkeypatch.setattr(_gate, "gate", broken_gate)
    memories = [None] * 40 + [1024] * 20
    with ThreadPoolExecutor(8) as pool:
        messages = list(pool.map(lambda m: sandbox_error(run("print(1)", memory=m)), memories))
    assert all("verl-hyperlight internal error" in m for m in messages)
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert sorted(type(r.exc_info[1]).__name__ for r in tracebacks) == ["KeyError", "ValueError"]
    assert sorted(_failures.log.counts().values()) == [20, 40]
    # The tenth of each cause is said again, without its traceback.
    reminders = [r for r in caplog.records if "10 cases failed so far" in r.getMessage()]
    assert len(reminders) == 2 and all(r.exc_info is None for r in reminders)
    assert host.runs() == [] and host.case_dirs() == []


@pytest.mark.parametrize("setting", ["0", "-3", "soon"])
def test_a_bad_startup_timeout_setting_is_reported_and_the_default_used(
    host: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, setting: str
) -> None:
    monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", setting)
    with caplog.at_level(logging.WARNING, logger="verl_hyperlight"):
        first = run("print('ran')")
        second = run("print('ran')")
    assert result(first)[:4] == result(second)[:4] == ("Success", "Finished", 0, "ran\n")
    reports = [r for r in caplog.records if "VERL_HYPERLIGHT_STARTUP_TIMEOUT" in r.getMessage()]
    assert len(reports) == 1
    assert "using 60" in reports[0].getMessage()


# ---------------------------------------------------------------------------------------------
# What decides that hluk failed: hluk's own stderr, never the guest's console


# Each prints the message of a backend failure where the host could read it (its streams, and
# the console itself), then breaks the runner's report of the case.
POSING = (
    "import os, sys\n"
    "LIE = 'error: failed to open /dev/kvm: Permission denied\\n'\n"
    "print(LIE, end='')\n"
    "print(LIE, end='', file=sys.stderr)\n"
    "consoles = [fd for fd in range(3, 64) if os.isatty(fd)]\n"
    "for fd in consoles:\n"
    "    os.write(fd, LIE.encode())\n"
)
BREAKS = {
    "closes the console": "for fd in consoles:\n    os.close(fd)\n",
    "makes the report raise": (
        "runner = [m for name, m in list(sys.modules.items())\n"
        "          if 'verl_hyperlight' in name and hasattr(m, '_Case')][0]\n"
        "def fail(*args):\n"
        "    raise RuntimeError(LIE)\n"
        "runner._case.frame = fail\n"
    ),
}


@pytest.mark.parametrize("breaks", BREAKS)
def test_a_solution_that_breaks_the_runners_report_is_its_own_failure(
    host: Host, caplog: pytest.LogCaptureFixture, breaks: str
) -> None:
    run("pass")
    caplog.set_level(logging.WARNING, logger="verl_hyperlight")
    response = run(POSING + BREAKS[breaks])
    status, run_status, return_code, _, _ = result(response)
    assert (status, run_status) == ("Failed", "Finished"), response
    assert return_code not in (None, 0)
    # Nothing the guest printed reached a diagnosis, a log line or a message.
    assert "kvm" not in response["message"]
    assert [r.getMessage() for r in caplog.records if "kvm" in r.getMessage()] == []
    assert len(host.case_runs()) == 1 + 1  # a solution's failure is not retried


def test_the_console_before_the_start_still_explains_a_failed_start(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Before the solution starts, the console is hluk's driver's alone: a failing warm-exec
    # (here: the runner missing from the image's snapshot) is reported with its traceback.
    from verl_hyperlight.case import guests as _guest

    monkeypatch.setattr(_guest, "warm_exec_code", lambda: "raise ImportError('no runner here')")
    message = sandbox_error(run("print(1)"))
    assert "ImportError: no runner here" in message


# A hluk whose console loses part of a report: each end frame announces 10 bytes of stdout,
# and 5 of them come (the warm-up's probe, and a notebook's ready report, come whole).
SHORT_REPORTING_HLUK = """#!{python} -IS
import base64, json, os, re, sys
if sys.argv[1:] == ["--version"]:
    print("hluk 0.19.0")
    sys.exit(0)
with open(os.environ["HLUK_STANDIN_ARGV_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
workload = sys.argv[-1]
nonce = re.search(r"'([0-9a-f]{{32}})'\\)$", workload).group(1)
def report(nonce, output=b"", announced=0):
    frames = [f"{{nonce}} start", f"{{nonce}} end 0 0.000100 - {{announced}} 0 -"]
    frames += [f"{{nonce}} stdout {{base64.b64encode(output).decode()}}"] if output else []
    frames.append(f"{{nonce}} done")
    os.write(1, "".join(f"\\r\\n{{frame}}\\r\\n" for frame in frames).encode())
if ".main(" in workload:
    report(nonce, b"12345", 10)
elif ".notebook(" in workload:
    report(nonce)
    pieces = []
    for line in sys.stdin.buffer:
        line = line.strip()
        if line == b".":
            report(json.loads(base64.b64decode(b"".join(pieces)))["nonce"], b"12345", 10)
            pieces = []
        elif line:
            pieces.append(line)
else:
    report(nonce)
"""


@pytest.fixture
def short_reports(host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    double = tmp_path / "hluk-short"
    double.write_text(SHORT_REPORTING_HLUK.format(python=sys.executable))
    double.chmod(0o755)
    monkeypatch.setenv("HLUK_PATH", str(double))


def assert_short_output_said(message: str, caplog: pytest.LogCaptureFixture) -> None:
    assert "report of the solution's output came short (stdout: 5 of 10 bytes)" in message
    assert "later cases run" in message
    logged = [r.getMessage() for r in caplog.records if "came short" in r.getMessage()]
    assert len(logged) == 1 and ZEROES_REWARDS not in logged[0]


def test_a_report_whose_stream_came_short_is_a_backend_failure_of_that_case(
    short_reports: None, host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    assert_short_output_said(sandbox_error(run("print('1234567890', end='')")), caplog)
    assert len(host.case_runs()) == 1  # the solution ran: not retried


def test_a_notebook_call_whose_stream_came_short_is_a_backend_failure_ending_it(
    short_reports: None, caplog: pytest.LogCaptureFixture
) -> None:
    from verl_hyperlight.agent.notebook import Notebook

    notebook = Notebook("hyperlight://", None)
    try:
        response, error = notebook.run("print('1234567890', end='')", 10, None)
        assert error is None and response is not None
        assert_short_output_said(sandbox_error(dict(response)), caplog)
        assert not notebook.alive  # what its console says next cannot be trusted either
    finally:
        notebook.close()


# ---------------------------------------------------------------------------------------------
# hluk's environment


@pytest.fixture
def hluk_environment(host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Where the environment of the last hluk run is written, one NAME=value a line."""
    seen = tmp_path / "environment"
    wrapper = tmp_path / "hluk"
    wrapper.write_text(f'#!/bin/sh\n/usr/bin/env > {seen}\nexec {os.environ["HLUK_PATH"]} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("HLUK_PATH", str(wrapper))
    return seen


def test_hluk_gets_what_it_reads_of_the_workers_environment_and_nothing_else(
    hluk_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = hluk_environment
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-pass")
    monkeypatch.setenv("WANDB_API_KEY", "do-not-pass")
    monkeypatch.setenv("HLUK_REGISTRY", "ghcr.io/hyperlight-dev/hyperlight-unikraft")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert result(run("print('ok')"))[:4] == ("Success", "Finished", 0, "ok\n")
    names = {line.split("=", 1)[0] for line in seen.read_text().splitlines()}
    assert {"PATH", "HOME", "HLUK_CACHE_DIR", "HLUK_REGISTRY", "HTTPS_PROXY"} <= names
    assert "do-not-pass" not in seen.read_text()
    # What is left is hluk's, or what the operator added (the stand-in's own settings here),
    # and the worker's token, by which its cleaner finds its hluks (a random name, no secret).
    assert _settings.WORKER_TOKEN in names
    passed = {p.name for p in _settings.PASSED} | {_settings.WORKER_TOKEN}
    extra = {name for name in names if name not in passed}
    assert all(name.startswith("HLUK_STANDIN_") for name in extra - {"PWD", "SHLVL", "_"}), extra


def test_a_change_to_the_workers_environment_reaches_the_next_cases_hluk(
    hluk_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://first.example:3128")
    run("pass")
    assert "HTTPS_PROXY=http://first.example:3128" in hluk_environment.read_text()
    monkeypatch.setenv("HTTPS_PROXY", "http://second.example:3128")
    monkeypatch.setenv("VERL_HYPERLIGHT_HLUK_ENV", "HLUK_STANDIN_*,OPERATOR_*")
    monkeypatch.setenv("OPERATOR_SETTING", "added")
    run("pass")
    lines = hluk_environment.read_text().splitlines()
    assert "HTTPS_PROXY=http://second.example:3128" in lines
    assert "OPERATOR_SETTING=added" in lines
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setenv("OPERATOR_LATER", "added later")  # new, of a prefix already given
    run("pass")
    lines = hluk_environment.read_text().splitlines()
    assert not any(line.startswith("HTTPS_PROXY=") for line in lines)
    assert "OPERATOR_LATER=added later" in lines


# ---------------------------------------------------------------------------------------------
# small ones


@pytest.mark.parametrize("version", ["0.19.0-rc1", "0.19.0-alpha.2", "0.18.9"])
def test_a_hluk_before_0_19_0_is_refused_pre_releases_included(
    host: Host, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    monkeypatch.setenv("HLUK_STANDIN_VERSION", version)
    message = sandbox_error(run("print(1)"))
    assert version in message and "0.19.0 or later" in message


@pytest.mark.parametrize("version", ["0.19.0", "0.19.1-rc1", "1.0.0"])
def test_a_hluk_of_0_19_0_or_later_is_accepted(
    host: Host, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    monkeypatch.setenv("HLUK_STANDIN_VERSION", version)
    assert result(run("print(1)"))[:3] == ("Success", "Finished", 0)


def test_an_unusable_cache_directory_is_a_sandbox_error_with_the_back_off(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gate_clock: GateClock
) -> None:
    not_a_directory = tmp_path / "cache-file"
    not_a_directory.write_text("")
    monkeypatch.setenv("HLUK_CACHE_DIR", str(not_a_directory))
    message = sandbox_error(run("print(1)"))
    assert f"hluk's cache directory {not_a_directory} is not usable" in message
    assert "HLUK_CACHE_DIR" in message
    sandbox_error(run("print(2)"))
    sandbox_error(run("print(3)"))  # the third warm-up in a row to fail: the gate opens
    spawned = len(host.runs())
    # During the back-off a case fails at once, without running hluk (--version) again.
    assert "is not usable" in sandbox_error(run("print(4)"))
    assert len(host.runs()) == spawned


def test_a_one_off_failure_is_not_logged_as_zeroing_every_reward(
    crashing_hluk: Host, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="verl_hyperlight")
    sandbox_error(run("import time\nprint('partial', flush=True)\ntime.sleep(30)"))
    [logged] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "panicked" in logged
    assert "every code reward is zero" not in logged
    assert "later cases run" in logged


def test_a_persistent_failure_is_logged_as_zeroing_every_reward(
    host: Host, monkeypatch: pytest.MonkeyPatch, fail_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="verl_hyperlight")
    fail_with(monkeypatch, fail_file, "failed to open /dev/kvm: Permission denied", 100)
    sandbox_error(run("print(1)"))
    [logged] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "every code reward is zero while this lasts" in logged


# ---------------------------------------------------------------------------------------------
# Endings named for what happened


@pytest.mark.parametrize("stage", ["warm-up", "case"])
@pytest.mark.parametrize("signal_name", ["BUS", "SEGV"])
def test_a_hluk_killed_by_a_signal_is_named_for_it_not_for_a_timeout(
    host: Host, monkeypatch: pytest.MonkeyPatch, stage: str, signal_name: str
) -> None:
    if stage == "case":
        run("pass")
    monkeypatch.setenv("HLUK_STANDIN_SIGNAL", signal_name)
    message = sandbox_error(run("print(1)"))
    assert f"was killed by SIG{signal_name}" in message
    assert "cache clean" in message  # what to do about a truncated snapshot
    assert "took more than" not in message and "did not start within" not in message


def test_hluks_decisive_error_line_is_read_after_a_long_stderr(
    host: Host, monkeypatch: pytest.MonkeyPatch, fail_file: Path, tmp_path: Path
) -> None:
    # Whatever hluk writes first (logs, a profile report: here 200 KiB of it), its final
    # `error:` line is what decides.
    verbose = tmp_path / "hluk"
    chatter = "import sys\nsys.stderr.write(('INFO pulled layer ' + 'y' * 80 + '\\n') * 2000)\n"
    verbose.write_text(
        f"#!/bin/sh\n{shlex.quote(sys.executable)} -c {shlex.quote(chatter)}\n"
        f'exec {os.environ["HLUK_PATH"]} "$@"\n'
    )
    verbose.chmod(0o755)
    monkeypatch.setenv("HLUK_PATH", str(verbose))
    run("pass")
    fail_with(monkeypatch, fail_file, "failed to open /dev/kvm: Permission denied", 100)
    message = sandbox_error(run("print(1)"))
    assert "/dev/kvm: Permission denied" in message and "kvm group" in message


@pytest.mark.parametrize("full", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_is_a_clear_backend_failure_logged_once_and_leaves_nothing(
    host: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, full: int
) -> None:
    run("pass")  # the node is warm: the case's own directory is all that is at stake
    real_open = os.open

    def disk_full_at_stdin(path: str, *args: Any, **kwargs: Any) -> int:
        if os.path.basename(path) == "stdin":
            raise OSError(full, os.strerror(full))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", disk_full_at_stdin)
    caplog.set_level(logging.WARNING, logger="verl_hyperlight")
    messages = [sandbox_error(run("print(1)")) for _ in range(3)]
    # The tmpfs was full: the case went to TMPDIR, full too; the answer names it and what to do.
    assert messages == [messages[0]] * 3
    assert (
        f"no room for a case's files (8 bytes) in {host.tmpdir} ({os.strerror(full)})"
        in (messages[0])
    )
    assert "VERL_HYPERLIGHT_CASE_DIR" in messages[0] and "internal" not in messages[0]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        f"verl-hyperlight: {messages[0]} ({ZEROES_REWARDS})"
    ]
    assert all(r.exc_info is None for r in caplog.records)  # no traceback
    [warned] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"the tmpfs {host.tmpfs} is full" in warned, warned
    assert host.case_dirs() == []
