"""Conformance: each program answers through run_code (the stand-in hluk) exactly as it answers
when CPython 3.12 runs it as Sandbox Fusion does (``python /tmp/dir/solution.py`` in a fresh
directory, stdin a pipe written then closed, a clean environment, a wall-clock limit).

The programs are the package's conformance corpus (`verl_hyperlight.commands.conformance`), which
`verl-hyperlight selftest` runs on a node against the answers recorded beside it. Here both
sides run live: answers are shaped as Sandbox Fusion responses and compared on their status,
run status, return code, stdout (exactly) and stderr (with the solution's directory, the
standard library's and object addresses normalised; this includes the last stderr line of
every failure). The reference is run here by a subprocess alone, without Sandbox Fusion's 1 MiB
truncation, which the package beats; it is also compared with the recorded answers, so they
cannot go stale. ``python tests/test_conformance.py`` records them again.

A program whose answer differs names the "Known limits" entry (docs/known-limits.md) that
explains it and what our side answers instead; the test checks that entry exists, that the
difference is real, and that everything else is equal.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from verl_hyperlight import run_code, settings
from verl_hyperlight.case import api
from verl_hyperlight.commands import conformance, selftest
from verl_hyperlight.commands.conformance import (
    FAMILIES,
    PROBE,
    PROGRAMS,
    Interpreter,
    Program,
    Shape,
    differences,
    load_recording,
    parse_probe,
    recorded_form,
    shape,
)

pytestmark = pytest.mark.once

KNOWN_LIMITS = Path(__file__).resolve().parent.parent / "docs" / "known-limits.md"
CLEAN_ENV = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8"}
# The stand-in's interpreter has none of the agent image's libraries: a CPython 3.12 that has
# them (numpy, sympy) records and checks the programs that need them.
LIBRARIES_PYTHON_ENV = "VERL_HYPERLIGHT_TEST_LIBRARIES_PYTHON"


def _find_reference_python() -> str:
    """The stand-in's guest interpreter, chosen by the stand-in's own code (beside it, in
    tests/standin), so both sides run the same CPython. The stand-in runs under the `hluk`
    fixture, which clears the HLUK_STANDIN_* variables it does not set: so is the choice here."""
    path = Path(__file__).resolve().parent / "standin" / "guest_python.py"
    spec = importlib.util.spec_from_file_location("standin_guest_python", path)
    assert spec is not None and spec.loader is not None
    guest_python = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guest_python)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HLUK_STANDIN_")}
    return guest_python.find_python(environ)


REFERENCE_PYTHON = _find_reference_python()


def reference_python(prog: Program) -> str | None:
    """The CPython that answers `prog` for reference, if this machine has one."""
    if not prog.needs:
        return REFERENCE_PYTHON
    return os.environ.get(LIBRARIES_PYTHON_ENV) or None


@functools.cache
def interpreter(python: str) -> Interpreter:
    done = subprocess.run(
        [python, "-c", PROBE], capture_output=True, text=True, env=CLEAN_ENV, timeout=60, check=True
    )
    return parse_probe(done.stdout)


# ---------------------------------------------------------------------------------------------
# The reference: CPython as Sandbox Fusion runs it.


def _sandbox_fusion_decode(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        return f"[DecodeError] {exc}"


def _feed(fd: int, data: bytes) -> None:
    try:
        with open(fd, "wb") as pipe:
            pipe.write(data)
    except BrokenPipeError:
        pass


def sandbox_fusion_run(
    argv: list[str],
    directory: str,
    env: dict[str, str],
    stdin: bytes | None,
    timeout: float,
    partial_output: bool = True,
) -> dict[str, Any]:
    """Run `argv` in `directory` as Sandbox Fusion runs a program (stdin a pipe written, then
    closed; none when `stdin` is None; its whole group killed at `timeout`), answered as it
    answers: status and run_result. A timed-out run keeps the output it had, unless
    `partial_output` is false."""
    stdin_read, stdin_write = os.pipe() if stdin is not None else (subprocess.DEVNULL, -1)
    proc = subprocess.Popen(
        argv,
        cwd=directory,
        stdin=stdin_read,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    feeder = None
    if stdin is not None:
        os.close(stdin_read)
        feeder = threading.Thread(target=_feed, args=(stdin_write, stdin))
        feeder.start()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        timed_out = True
    finally:
        if feeder is not None:
            feeder.join()
    kept = partial_output or not timed_out
    return_code = None if timed_out else proc.returncode
    return {
        "status": "Success" if return_code == 0 else "Failed",
        "run_result": {
            "status": "TimeLimitExceeded" if timed_out else "Finished",
            "return_code": return_code,
            "stdout": _sandbox_fusion_decode(stdout) if kept else "",
            "stderr": _sandbox_fusion_decode(stderr) if kept else "",
        },
    }


def reference_run(prog: Program, python: str) -> Shape:
    """Run `prog` with `python` as Sandbox Fusion runs Python, and answer as it answers."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "solution.py")
        Path(path).write_bytes(prog.code.encode())
        stdin = (prog.stdin or "").encode()
        response = sandbox_fusion_run([python, path], directory, CLEAN_ENV, stdin, prog.run_timeout)
    return shape(response, directory, interpreter(python).stdlib)


def guest_interpreter() -> Interpreter:
    """The stand-in guest's CPython, as the selftest asks it."""
    response, error = run_code("hyperlight://", PROBE, None, 10, 10, 1024)
    assert error is None and response is not None and response["status"] == "Success", response
    return parse_probe(response["run_result"]["stdout"])


def our_run(prog: Program, guest: Interpreter) -> Shape:
    answer = selftest.answer("hyperlight://", prog, guest)
    assert not isinstance(answer, str), answer
    return answer


# ---------------------------------------------------------------------------------------------

Runs = list[Future[Shape]]


class Answers:
    """Every selected program's answers, ours (where the python image can run it) and the
    reference's (where this machine has its CPython), computed together on first use (in
    parallel: run_code is thread-safe) while the test asking holds the stand-in. A run that
    raised raises again in its own program's test only."""

    def __init__(self, programs: list[Program]) -> None:
        self.programs = programs
        self.results: dict[str, tuple[Runs, Runs]] | None = None
        self.without_ready: dict[str, Runs] | None = None
        self.in_ready_guests = 0  # of our runs, those that ran in a ready guest
        self.lock = threading.Lock()

    def of(self, prog: Program) -> tuple[list[Shape], list[Shape]]:
        with self.lock:
            if self.results is None:
                taken = api.ready_guests().taken
                self.results = self._run_all()  # all run by now: its pool is shut down
                self.in_ready_guests = api.ready_guests().taken - taken
        ours, reference = self.results[prog.name]
        return [f.result() for f in ours], [f.result() for f in reference]

    def ours_without_ready_guests(self, prog: Program) -> list[Shape]:
        """Our answers to `prog` with each case's micro-VM started when it arrives (the corpus
        run once more so, after the first run, whose cases take ready guests as they come)."""
        self.of(prog)
        with self.lock:
            if self.without_ready is None:
                self.without_ready = self._run_ours_without_ready_guests()
        return [f.result() for f in self.without_ready[prog.name]]

    def _run_ours_without_ready_guests(self) -> dict[str, Runs]:
        name = settings.READY_GUESTS.name
        saved = os.environ.get(name)
        os.environ[name] = "0"
        try:
            guest = guest_interpreter()
            with ThreadPoolExecutor(max(4, 2 * (os.cpu_count() or 1))) as pool:
                ordered = sorted(self.programs, key=lambda p: -p.run_timeout)
                found = {
                    p.name: [pool.submit(our_run, p, guest) for _ in range(p.runs)]
                    for p in ordered
                    if not p.needs
                }
            return found  # all run by now: the pool is shut down
        finally:
            if saved is None:
                del os.environ[name]
            else:
                os.environ[name] = saved

    def _run_all(self) -> dict[str, tuple[Runs, Runs]]:
        guest = guest_interpreter()
        workers = max(4, 2 * (os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            # The slowest first, so they do not finish the batch alone.
            ordered = sorted(self.programs, key=lambda p: -p.run_timeout)
            results = {}
            for p in ordered:
                python = reference_python(p)
                ours = [] if p.needs else [pool.submit(our_run, p, guest) for _ in range(p.runs)]
                reference = (
                    []
                    if python is None
                    else [pool.submit(reference_run, p, python) for _ in range(p.runs)]
                )
                results[p.name] = (ours, reference)
            return results


@pytest.fixture(scope="module")
def answers(request: pytest.FixtureRequest) -> Answers:
    selected = {
        item.callspec.params["prog"].name: item.callspec.params["prog"]
        for item in request.session.items
        if item.module is request.module
        and hasattr(item, "callspec")
        and "prog" in item.callspec.params
    }
    return Answers(list(selected.values()))


def _param(prog: Program) -> Any:
    return pytest.param(prog, id=prog.name)


def test_suite_is_large_enough_and_names_are_unique() -> None:
    names = [p.name for p in PROGRAMS]
    assert len(names) >= 60
    assert len(set(names)) == len(names)
    assert {p.family for p in PROGRAMS} == set(FAMILIES)


ON_THE_PYTHON_IMAGE = [p for p in PROGRAMS if not p.needs]


@pytest.mark.parametrize(
    "prog", [_param(p) for p in ON_THE_PYTHON_IMAGE if p.divergence is None and not p.varies]
)
def test_program_answers_as_cpython_under_sandbox_fusion(
    hluk: Path, answers: Answers, prog: Program
) -> None:
    ours, reference = answers.of(prog)
    assert ours == reference


@pytest.mark.parametrize("prog", [_param(p) for p in ON_THE_PYTHON_IMAGE if not p.varies])
def test_program_answers_alike_with_ready_guests_and_without(
    hluk: Path, answers: Answers, prog: Program
) -> None:
    ours, _ = answers.of(prog)
    assert answers.in_ready_guests > 0  # the first run's cases took ready guests
    assert answers.ours_without_ready_guests(prog) == ours


def known_limits() -> str:
    """The docs' "Known limits" page (docs/known-limits.md)."""
    return KNOWN_LIMITS.read_text()


@pytest.mark.parametrize(
    "prog", [_param(p) for p in ON_THE_PYTHON_IMAGE if p.divergence is not None]
)
def test_documented_divergence_is_real_and_is_all_that_differs(
    hluk: Path, answers: Answers, prog: Program
) -> None:
    assert prog.divergence is not None
    assert prog.divergence.limit in " ".join(known_limits().split())
    (ours,), (reference,) = answers.of(prog)
    assert {k: reference[k] for k in prog.divergence.ours} != prog.divergence.ours
    assert ours == {**reference, **prog.divergence.ours}


@pytest.mark.parametrize("prog", [_param(p) for p in ON_THE_PYTHON_IMAGE if p.varies])
def test_output_that_varies_differs_between_runs_on_both_sides(
    hluk: Path, answers: Answers, prog: Program
) -> None:
    ours, reference = answers.of(prog)
    for first, second in (ours, reference):
        assert first["status"] == second["status"] == "Success"
        assert first["stdout"] != second["stdout"]
    recorded = load_recording().answers[prog.name]
    words = {len(str(r["stdout"]).split()) for r in [*ours, *reference, *recorded]}
    assert len(words) == 1 and words != {0}


def test_recording_holds_every_program_once_per_run() -> None:
    recording = load_recording()
    assert recording.python.startswith("3.12.")
    assert list(recording.answers) == [p.name for p in PROGRAMS]
    for prog in PROGRAMS:
        runs = recording.answers[prog.name]
        assert len(runs) == prog.runs
        assert all(run == recorded_form(run) for run in runs)


@pytest.mark.parametrize("prog", [_param(p) for p in PROGRAMS])
def test_recorded_answer_is_what_cpython_answers_today(
    hluk: Path, answers: Answers, prog: Program
) -> None:
    python = reference_python(prog)
    if python is None:
        pytest.skip(f"set {LIBRARIES_PYTHON_ENV} to a CPython 3.12 with {', '.join(prog.needs)}")
    found = interpreter(python)
    if not found.version.startswith("3.12."):
        pytest.skip(f"no CPython 3.12 here to check the recording ({python} is {found.version})")
    missing = set(prog.needs) - set(found.libraries)
    if missing:
        pytest.skip(f"{python} has no {', '.join(sorted(missing))}")
    _, reference = answers.of(prog)
    assert differences(prog, load_recording().answers[prog.name], reference) == []


def record() -> None:
    """Write the answers CPython 3.12 gives to every program into the package's recording."""
    version = interpreter(REFERENCE_PYTHON).version
    if not version.startswith("3.12."):
        sys.exit(f"{REFERENCE_PYTHON} is CPython {version}: the recording is CPython 3.12's")
    for prog in PROGRAMS:
        python = reference_python(prog)
        if python is None or set(prog.needs) - set(interpreter(python).libraries):
            sys.exit(
                f"{prog.name} needs a CPython 3.12 with {prog.needs}: set {LIBRARIES_PYTHON_ENV}"
            )
        if interpreter(python).version != version:
            sys.exit(f"{python} is CPython {interpreter(python).version}, not {version}")
    with ThreadPoolExecutor(max(4, 2 * (os.cpu_count() or 1))) as pool:
        runs = {
            p.name: [
                pool.submit(reference_run, p, reference_python(p) or "") for _ in range(p.runs)
            ]
            for p in PROGRAMS
        }
        answers = {
            name: [recorded_form(f.result()) for f in futures] for name, futures in runs.items()
        }
    path = Path(conformance.__file__).with_name(conformance.RECORDING)
    text = json.dumps({"python": version, "answers": answers}, indent=1, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")
    print(f"recorded {len(answers)} programs' answers from CPython {version} in {path}")


if __name__ == "__main__":
    record()
