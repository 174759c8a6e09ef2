"""`verl-hyperlight selftest` on the stand-in: it agrees on every program but the documented
divergences, names exactly the program a broken runner answers wrongly, and says so when the
backend itself is broken instead of listing every program.

Each run is a command of its own (a process, as a user runs it), so a backend broken on purpose
leaves nothing behind in this one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hostside import (
    KVM_FAILURE,
    URL,
    Host,
    fail_with,
    logged_argvs,
    notebooks,
    option,
    processes_with,
    wait_for,
)
from test_conformance import LIBRARIES_PYTHON_ENV, known_limits

import verl_hyperlight
from verl_hyperlight import settings
from verl_hyperlight.commands import selftest as st
from verl_hyperlight.commands.conformance import FAMILIES, PROGRAMS, Interpreter, load_recording

pytestmark = pytest.mark.once

# A whole run of the corpus on two shared cores, with room for a loaded machine.
CORPUS_TIMEOUT = 600
BROKEN_TIMEOUT = 120
INJECTED = "uncaught_exception_in_nested_calls"
INJECTED_LINE = "ZeroDivisionError: division by zero"


CLI = "import sys; from verl_hyperlight.cli import main; sys.exit(main(sys.argv[1:]))"
# What the command runs, on the programs named only, printing the report as JSON.
PART = """
import json, sys
from verl_hyperlight.commands import selftest
from verl_hyperlight.commands.conformance import PROGRAMS
part = [p for p in PROGRAMS if p.name in sys.argv[2:]]
print(json.dumps(selftest.as_json(selftest.selftest(sys.argv[1], selftest.default_jobs(), part))))
"""


def environment(env: dict[str, str], pythonpath: Path | None = None) -> dict[str, str]:
    """This process's environment with `env`'s hluk (and nothing of its own hluk's)."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("HLUK_", "VERL_HYPERLIGHT_"))
    }
    environ.update(env, VERL_HYPERLIGHT_HLUK_ENV="HLUK_STANDIN_*")
    if pythonpath is not None:
        environ["PYTHONPATH"] = str(pythonpath)
    return environ


def python(
    env: dict[str, str],
    code: str,
    *args: str,
    pythonpath: Path | None = None,
    timeout: float = CORPUS_TIMEOUT,
) -> subprocess.CompletedProcess[str]:
    """Run `code` in a process of its own whose hluk is the one `env` names."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=environment(env, pythonpath),
        timeout=timeout,
    )


def selftest(
    env: dict[str, str], *args: str, pythonpath: Path | None = None, timeout: float = CORPUS_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    return python(env, CLI, "selftest", *args, pythonpath=pythonpath, timeout=timeout)


def _verdicts(report: dict[str, object], verdict: str) -> set[str]:
    outcomes = report["outcomes"]
    assert isinstance(outcomes, list)
    return {o["program"] for o in outcomes if o["verdict"] == verdict}


DOCUMENTED = {p.name for p in PROGRAMS if p.divergence is not None and not p.needs}
NEEDING_LIBRARIES = {p.name for p in PROGRAMS if p.needs}


def test_the_known_limits_a_verdict_quotes_are_the_readmes_own_sentences() -> None:
    said = " ".join(known_limits().split())
    quoted = {p.divergence.limit for p in PROGRAMS if p.divergence is not None}
    assert quoted and [limit for limit in sorted(quoted) if limit not in said] == []


@pytest.mark.parametrize("ready_guests", ["0", str(settings.READY_GUESTS_DEFAULT)])
def test_selftest_agrees_on_the_stand_in_except_the_documented_divergences(
    standin_env: dict[str, str], ready_guests: str
) -> None:
    """With each case's micro-VM started when it comes, and with ready guests (the default)."""
    done = selftest({**standin_env, settings.READY_GUESTS.name: ready_guests}, "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["broken"] == ""
    backend = ["hluk", "snapshot", "case", "notebook"]
    compiled = [
        "cpp case", "go case", "rust case", "java case", "nodejs case", "bash case",
        "typescript case",
    ]  # fmt: skip
    assert [c["name"] for c in report["checks"]] == [*backend, *compiled]
    assert _verdicts(report, "known limit") == DOCUMENTED
    assert _verdicts(report, "skipped") == NEEDING_LIBRARIES  # the python image has neither
    assert _verdicts(report, "agreed") == {p.name for p in PROGRAMS} - DOCUMENTED - (
        NEEDING_LIBRARIES
    )
    for outcome in report["outcomes"]:
        if outcome["verdict"] == "known limit":
            assert outcome["note"] and outcome["fields"]
            assert outcome["expected"] != outcome["ours"]


def test_selftest_of_the_agent_image_runs_its_libraries_where_it_has_them(
    standin_env: dict[str, str],
) -> None:
    """The stand-in's agent image has numpy and sympy when its interpreter does: one with them
    is named by VERL_HYPERLIGHT_TEST_LIBRARIES_PYTHON (the test then runs their programs; it
    must be an installation of its own, not a venv, as the stand-in binds only the interpreter's
    prefix into its guest). The rest of the corpus is the python image's test: here one program
    of each family."""
    libraries_python = os.environ.get(LIBRARIES_PYTHON_ENV)
    env = dict(standin_env)
    if libraries_python:
        env["HLUK_STANDIN_PYTHON"] = libraries_python
    sample = {next(p.name for p in PROGRAMS if p.family == family) for family in FAMILIES}
    done = python(env, PART, "hyperlight://agent", *sample, *NEEDING_LIBRARIES)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert {o["program"] for o in report["outcomes"]} == sample | NEEDING_LIBRARIES
    assert _verdicts(report, "agreed") >= sample - DOCUMENTED
    if libraries_python:
        assert set(report["guest"]["libraries"]) == {"numpy", "sympy"}
        assert _verdicts(report, "agreed") >= NEEDING_LIBRARIES
    else:
        assert report["guest"]["libraries"] == []
        assert _verdicts(report, "skipped") == NEEDING_LIBRARIES
        notes = {o["note"] for o in report["outcomes"] if o["verdict"] == "skipped"}
        assert notes == {"the image has no numpy", "the image has no sympy"}
    assert _verdicts(report, "diverged") == set()


def _package_with_a_runner_that_drops_a_line(root: Path) -> Path:
    """A copy of the package whose guest runner drops the last line of a stderr that ends with
    `INJECTED_LINE`, before reporting it."""
    package = Path(verl_hyperlight.__file__).parent
    copy = root / "verl_hyperlight"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    runner = copy / "guest" / "runner.py"
    source = runner.read_text()
    anchor = "            sizes = {name: self.output_size(name) for name in OUTPUT_PATHS}\n"
    assert source.count(anchor) == 1, "the runner's report changed: move the injection"
    drop = (
        "            _text = os.pread(self.outputs['stderr'], 1 << 20, 0)\n"
        f"            if _text.endswith({INJECTED_LINE.encode()!r} + b'\\n'):\n"
        "                os.truncate(OUTPUT_PATHS['stderr'], _text[:-1].rfind(b'\\n') + 1)\n"
    )
    runner.write_text(source.replace(anchor, drop + anchor))
    return root


def test_a_runner_that_drops_a_line_of_stderr_is_reported_for_that_program_alone(
    standin_env: dict[str, str], tmp_path: Path
) -> None:
    recorded = load_recording().answers
    ending = [n for n, runs in recorded.items() if runs[0]["last_stderr_line"] == INJECTED_LINE]
    assert ending == [INJECTED]  # so exactly one program meets the broken runner
    root = _package_with_a_runner_that_drops_a_line(tmp_path / "patched")
    # A cache of its own: the snapshot holds the runner, so the patched one needs its own.
    env = {**standin_env, "HLUK_CACHE_DIR": str(tmp_path / "cache")}
    done = selftest(env, pythonpath=root)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert [line for line in lines if line.startswith("DIVERGED")] == [
        f"DIVERGED: {INJECTED} (exceptions)"
    ]
    block = done.stdout.split(f"DIVERGED: {INJECTED}", 1)[1].split("\n\n", 1)[0]
    assert "    | def inner(x):" in block  # the program itself
    assert f"CPython {load_recording().python}: {INJECTED_LINE!r}" in block
    assert "this node:     '           ~~^~~'" in block
    assert re.search(r"^  exceptions +18/19 \(1 diverged\)$", done.stdout, re.M)
    assert "1 differ otherwise (undocumented divergences)" in lines[-2]
    assert lines[-1].startswith("FAILED")
    assert f"{len(DOCUMENTED)} differ as documented known limits" in lines[-2]


FAILING_HLUK = '#!/bin/sh\necho "error: no such thing as a guest here" >&2\nexit 1\n'
# Answers --version (through the stand-in) and fails every run: a hluk that starts no guest.
FAILING_RUNS = (
    '#!/bin/sh\nif [ "$1" = "--version" ]; then exec {standin} "$@"; fi\n'
    'echo "error: failed to create the micro-VM: /dev/kvm: Permission denied" >&2\nexit 1\n'
)


@pytest.mark.parametrize(
    ("script", "check", "said"),
    [
        pytest.param(FAILING_HLUK, "fail  hluk", "no such thing", id="hluk_fails_at_once"),
        pytest.param(FAILING_RUNS, "fail  guest", "Permission denied", id="hluk_starts_no_guest"),
    ],
)
def test_a_broken_backend_is_named_instead_of_every_program(
    standin_env: dict[str, str], tmp_path: Path, script: str, check: str, said: str
) -> None:
    hluk = tmp_path / "hluk"
    hluk.write_text(script.format(standin=standin_env["HLUK_PATH"]))
    hluk.chmod(0o755)
    env = {**standin_env, "HLUK_PATH": str(hluk), "HLUK_CACHE_DIR": str(tmp_path / "cache")}
    done = selftest(env, timeout=BROKEN_TIMEOUT)
    assert done.returncode == 1
    assert check in done.stdout and said in done.stdout
    assert "the backend is broken, so no program was run" in done.stdout
    for name in ("DIVERGED", "KNOWN LIMIT", "BACKEND FAILURE", INJECTED):
        assert name not in done.stdout
    report = json.loads(selftest(env, "--json", timeout=BROKEN_TIMEOUT).stdout)
    assert report["ok"] is False and said in report["broken"] and report["outcomes"] == []


def test_programs_the_backend_failed_are_one_paragraph_per_cause_not_a_list_of_divergences() -> (
    None
):
    recorded = load_recording().answers
    message = "hluk at /usr/bin/hluk was killed by signal 9 (SIGKILL)"
    outcomes = [
        st.Outcome(p, st.BACKEND_FAILURE, recorded[p.name], [], [], message) for p in PROGRAMS[:5]
    ]
    outcomes += [
        st.Outcome(p, st.AGREED, recorded[p.name], recorded[p.name], []) for p in PROGRAMS[5:]
    ]
    guest = Interpreter("3.12.1", "/usr/lib/python3.12", ())
    report = st.Report("hyperlight://", "3.12.1", [], guest=guest, outcomes=outcomes)
    text = st.render(report)
    assert not report.ok
    assert text.count("BACKEND FAILURE") == 1
    assert f"BACKEND FAILURE (SandboxError) on 5 programs: {message}" in text
    assert f"  programs: {', '.join(p.name for p in PROGRAMS[:5])}" in text
    assert "    | " not in text  # no program's code: they were not run
    assert "5 failed in the backend (SandboxError)" in text.splitlines()[-2]
    assert text.splitlines()[-1].startswith("FAILED")


# ---------------------------------------------------------------------------------------------
# the notebook path, and Ctrl-C (issue 24)


def test_the_notebook_check_starts_one_shares_a_variable_between_two_calls_and_ends_it(
    host: Host,
) -> None:
    check = st.notebook_check(URL)
    assert (check.name, check.status) == ("notebook", "ok"), check
    assert "kept a variable between two calls" in check.detail
    assert "the next call found a new one" in check.detail
    assert notebooks() == {}  # both notebooks it started have ended
    # Two notebooks, each started as a case starts (through the guest's gate).
    started = [argv for argv in host.runs() if ".notebook(" in (option(argv, "--exec") or "")]
    assert len(started) == 2


def test_a_notebook_that_cannot_start_fails_its_check_with_the_fix(
    host: Host, monkeypatch: pytest.MonkeyPatch, fail_file: Path
) -> None:
    st.notebook_check(URL)  # the guest warm: its gate stays closed for what follows
    fail_with(monkeypatch, fail_file, KVM_FAILURE, 100)
    check = st.notebook_check(URL)
    assert (check.name, check.status) == ("notebook", "fail"), check
    assert check.detail.startswith("its call 'shared = 41' failed in the backend: ")
    assert "Permission denied" in check.detail and check.fix
    assert notebooks() == {}


def case_runs(argv_log: Path) -> int:
    return sum("--mount" in argv for argv in logged_argvs(argv_log))


def test_ctrl_c_stops_the_corpus_at_once_cancelling_its_cases_and_says_what_it_checked(
    standin_env: dict[str, str], tmp_path: Path
) -> None:
    argv_log, case_dirs = tmp_path / "argv.jsonl", tmp_path / "cases"
    case_dirs.mkdir()
    env = {
        **standin_env,
        "HLUK_STANDIN_ARGV_LOG": str(argv_log),
        "VERL_HYPERLIGHT_CASE_DIR": str(case_dirs),
    }
    jobs = 2
    command = subprocess.Popen(
        [sys.executable, "-c", CLI, "selftest", "--jobs", str(jobs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(env),
    )
    try:
        # The checks' case, the guest's version, then the corpus's: a few of them run.
        assert wait_for(lambda: case_runs(argv_log) >= 14, limit=CORPUS_TIMEOUT)
        at_the_signal = case_runs(argv_log)
        command.send_signal(signal.SIGINT)
        stdout, stderr = command.communicate(timeout=CORPUS_TIMEOUT)
    finally:
        command.kill()
    # Only the cases in flight then had started (a case ending as it was read let one more
    # start); the others never did.
    assert case_runs(argv_log) <= at_the_signal + 2 * jobs, "the corpus ran on after Ctrl-C"
    assert command.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    checks = re.findall(r"^(ok|warn|fail) +(\S+)", stdout, re.M)
    languages = ["cpp", "go", "rust", "java", "nodejs", "bash", "typescript"]
    assert [name for _, name in checks] == ["hluk", "snapshot", "case", "notebook", *languages]
    assert "fail" not in [status for status, _ in checks]
    lines = stdout.splitlines()
    checked = re.match(r"interrupted \(Ctrl-C\) with (\d+) of (\d+) programs checked: ", lines[-2])
    assert checked and int(checked[2]) == len(PROGRAMS), lines[-2]
    assert lines[-1].startswith("INTERRUPTED: no verdict on this node")
    assert "BACKEND FAILURE" not in stdout  # a cancelled case is no program's answer
    assert wait_for(lambda: not processes_with(str(case_dirs)))  # its micro-VMs were killed
    assert list(case_dirs.iterdir()) == []


def test_ctrl_c_during_the_checks_stops_the_warm_up_and_says_what_was_checked(
    standin_env: dict[str, str], tmp_path: Path
) -> None:
    hang = tmp_path / "hang"
    hang.write_text("1")  # the warm-up's probe hangs before the boot, for up to 900 s
    env = {
        **standin_env,
        "HLUK_CACHE_DIR": str(tmp_path / "cold-cache"),
        "HLUK_STANDIN_HANG_FILE": str(hang),
        "VERL_HYPERLIGHT_STARTUP_TIMEOUT": "900",
    }
    command = subprocess.Popen(
        [sys.executable, "-c", CLI, "selftest", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(env),
    )
    try:
        assert wait_for(lambda: hang.read_text() == "0", limit=BROKEN_TIMEOUT)
        command.send_signal(signal.SIGINT)
        stdout, stderr = command.communicate(timeout=BROKEN_TIMEOUT)
    finally:
        command.kill()
    assert command.returncode == 130, stderr[-3000:]
    report = json.loads(stdout)
    assert report["interrupted"] is True and report["ok"] is False
    assert [check["name"] for check in report["checks"]] == ["hluk"]
    assert report["outcomes"] == []
    assert wait_for(lambda: not processes_using(tmp_path / "cold-cache"))


def processes_using(cache: Path) -> list[int]:
    """Live processes given `cache` as their hluk cache (hluk runs, and what they started)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if f"HLUK_CACHE_DIR={cache}\0".encode() in environ:
            found.append(int(entry))
    return found


def test_the_verdict_says_why_programs_were_skipped_and_where_they_run() -> None:
    needing = [p for p in PROGRAMS if p.needs]
    skipped = [st.Outcome(p, st.SKIPPED, [], [], [], "the image has no x") for p in needing]
    report = st.Report("hyperlight://", "3.12.0", [], outcomes=skipped)
    line = st._verdict(report)  # the last line the command prints
    wanted = ", ".join(sorted({name for p in needing for name in p.needs}))
    assert f"{len(needing)} skipped: they need {wanted}, which this image lacks" in line
    assert "selftest hyperlight://agent" in line


def test_skips_on_the_agent_url_do_not_send_the_user_to_the_agent_url() -> None:
    needing = [p for p in PROGRAMS if p.needs]
    skipped = [st.Outcome(p, st.SKIPPED, [], [], [], "the image has no x") for p in needing]
    line = st._verdict(st.Report("hyperlight://agent", "3.12.0", [], outcomes=skipped))
    assert "which this guest lacks although the published agent image has them" in line
    assert "HLUK_INITRD" in line and "selftest hyperlight://agent" not in line
