"""`verl-hyperlight selftest`: whether this node's micro-VMs answer the conformance corpus as
CPython 3.12 answers it under Sandbox Fusion, and precisely where not.

Every program runs through `run_code`, as the plugin runs a case, and its answer is compared
with the one recorded from CPython (`conformance`). A difference is a documented known limit
when it is confined to the fields the program's Known limits entry explains; any other is a
divergence. The backend is checked first, with doctor's own checks, so a broken node is named
as such instead of as every program diverging; then the code tool's notebook path, as a
trajectory's calls take it.

Ctrl-C stops it at once: the cases in flight are cancelled (their micro-VMs killed), the
programs not yet run are not, and the report says what had been checked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .. import cancel as cancels
from .. import diagnosis, node
from ..agent.notebook import Notebook, RemoteNotebook
from ..case.api import run_code
from ..case.guests import LANGUAGE_IMAGES
from ..case.url import parse_url
from ..errors import BackendError, InvalidRequest, Refused
from ..guest import runner
from . import doctor
from .conformance import (
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

# verl's default memory_limit_mb; both images boot in it.
MEMORY_LIMIT_MB = 1024
COMPILE_TIMEOUT = 10.0
# The notebook check's calls and their stdout: the second reads what the first left; a call
# after the notebook has ended finds a new one, without it.
NOTEBOOK_CALLS = (("shared = 41", ""), ("print(shared + 1)", "42\n"))
AFTER_THE_END = ("print('shared' in globals())", "False\n")
NOTEBOOK_RUN_TIMEOUT = 10.0

AGREED = "agreed"
KNOWN_LIMIT = "known limit"
DIVERGED = "diverged"
BACKEND_FAILURE = "backend failure"
SKIPPED = "skipped"
# How a family's line counts its programs that did not agree.
TALLIED = {
    KNOWN_LIMIT: ("known limit", "known limits"),
    DIVERGED: ("diverged", "diverged"),
    BACKEND_FAILURE: ("failed in the backend", "failed in the backend"),
    SKIPPED: ("skipped", "skipped"),
}

# How much of a differing field the text report shows; --json holds all of it.
SHOWN_CHARACTERS = 1500
AGAIN = "INTERRUPTED: no verdict on this node; run `verl-hyperlight selftest` to its end"


def default_jobs() -> int:
    """Programs at once: one per CPU this process may use, and at least 4, as most of the
    corpus waits (sleeps, threads, timeouts) rather than computes."""
    return max(4, node.cpus())


@dataclass(frozen=True)
class Outcome:
    """One program's verdict. `note` is why for a known limit (its sentence in
    docs/known-limits.md), a backend failure (its message) or a skip."""

    program: Program
    verdict: str
    expected: list[Shape]
    ours: list[Shape]
    fields: list[str]
    note: str = ""


@dataclass(frozen=True)
class Report:
    url: str
    recorded_python: str
    checks: list[doctor.Check]  # added to as they are made: an interrupted report keeps them
    broken: str = ""  # why no program could be run, if none could
    guest: Interpreter | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    planned: int = 0  # the programs it was to check
    interrupted: bool = False  # by Ctrl-C: `outcomes` are those of the programs checked by then

    @property
    def ok(self) -> bool:
        return (
            not self.broken
            and not self.interrupted
            and all(check.status != "fail" for check in self.checks)
            and not any(o.verdict in (DIVERGED, BACKEND_FAILURE) for o in self.outcomes)
        )


def checks(url: str) -> Generator[doctor.Check, None, None]:
    """doctor's checks of what a case needs: hluk (found, runnable, its version) and the guest
    (its warm snapshot, taken if missing, and a case end to end). A failed one is yielded
    before it stops them."""
    options = doctor.Options(url=url, memory_limit_mb=MEMORY_LIMIT_MB)
    resource = parse_url(url).ray
    if resource is not None:
        # Cases run on the cluster's nodes that offer the resource: doctor checks each there.
        yield from doctor.cluster_checks(options, resource)
        return
    path = yield from doctor.hluk_checks()
    if path is not None:
        yield from doctor.guest_checks(path, options)


def notebook_check(url: str) -> doctor.Check:
    """The code tool's notebook path (``agent.notebook``), as a trajectory's calls take it: a
    notebook started, two calls that share a variable, and its end (after which a call finds a
    new notebook, without that variable)."""
    on_cluster = parse_url(url).ray is not None
    notebook = (RemoteNotebook if on_cluster else Notebook)(url, MEMORY_LIMIT_MB)
    which = ""
    try:
        started = time.monotonic()
        for code, expected in NOTEBOOK_CALLS:
            which = f"its call {code!r}"
            answered = notebook.answer(code, NOTEBOOK_RUN_TIMEOUT, None)
            if _stdout(answered) != expected:
                return _notebook_failed(f"{which} answered {_said(answered)}")
        seconds = time.monotonic() - started
        notebook.close()
        code, expected = AFTER_THE_END
        which = f"a call after its end, {code!r},"
        answered = notebook.answer(code, NOTEBOOK_RUN_TIMEOUT, None)
        if _stdout(answered) != expected:
            return _notebook_failed(f"{which} answered {_said(answered)}")
    except BackendError as exc:
        return doctor.failed("notebook", exc.diagnosis, f"{which} failed in the backend: ")
    except (InvalidRequest, Refused) as exc:
        return _notebook_failed(f"{which} was not run: {exc}")
    finally:
        notebook.close()
    return doctor.ok(
        "notebook",
        f"a notebook started and kept a variable between two calls ({seconds * 1000:.0f} ms "
        "for both), and ended: the next call found a new one",
    )


# One program per language besides Python: its stdin summed, a line to stderr, exit status 3.
# Each reads and writes all three streams, and shows that the status and the streams come back
# apart. The compiled ones (cpp, go, rust, java) compile on the node first.
LANGUAGE_PROGRAMS = {
    "cpp": '#include <cstdio>\nint main() { long a, b; if (std::scanf("%ld %ld", &a, &b) != 2)'
    ' return 1; std::printf("%ld\\n", a + b); std::fprintf(stderr, "to stderr\\n"); return 3; }\n',
    "go": 'package main\n\nimport (\n\t"fmt"\n\t"os"\n)\n\nfunc main() {\n\tvar a, b int\n'
    '\tfmt.Scan(&a, &b)\n\tfmt.Println(a + b)\n\tfmt.Fprintln(os.Stderr, "to stderr")\n'
    "\tos.Exit(3)\n}\n",
    "rust": "use std::io::Read;\nfn main() { let mut s = String::new();\n"
    "    std::io::stdin().read_to_string(&mut s).unwrap();\n"
    "    let n: Vec<i64> = s.split_whitespace().map(|w| w.parse().unwrap()).collect();\n"
    '    println!("{}", n[0] + n[1]); eprintln!("to stderr"); std::process::exit(3); }\n',
    "java": "import java.util.Scanner;\n\npublic class Main {\n"
    "    public static void main(String[] args) {\n"
    "        Scanner in = new Scanner(System.in);\n"
    "        System.out.println(in.nextLong() + in.nextLong());\n"
    '        System.err.println("to stderr");\n'
    "        System.exit(3);\n    }\n}\n",
    "nodejs": "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/)"
    ".map(Number);\nconsole.log(a + b);\nconsole.error('to stderr');\nprocess.exitCode = 3;\n",
    "bash": 'read a b\necho $((a + b))\necho "to stderr" >&2\nexit 3\n',
    "typescript": "import { readFileSync } from 'fs';\nconst [a, b]: number[] = readFileSync(0, "
    "'utf8').trim().split(/\\s+/).map(Number);\nconsole.log(a + b);\n"
    "console.error('to stderr');\nprocess.exitCode = 3;\n",
}
LANGUAGE_STDIN = "19 23\n"
LANGUAGE_ANSWER = ("Failed", 3, "42\n", "to stderr\n")


def language_check(url: str, language: str) -> doctor.Check:
    """A `language` case end to end: compiled on the node that runs it where the language
    compiles, run in a micro-VM (its language's image where it has one). A node without the
    language's toolchain is warned of (its other languages run), not failed."""
    name = f"{language} case"
    started = time.monotonic()
    # A language with an image of its own takes that image's default memory, not Python's limit.
    memory = None if language in LANGUAGE_IMAGES else MEMORY_LIMIT_MB
    response, error = run_code(
        url, LANGUAGE_PROGRAMS[language], LANGUAGE_STDIN, 60, 10, memory, language
    )
    seconds = time.monotonic() - started
    if error is not None or response is None:
        return doctor.fail(name, f"was not run: {error}", diagnosis.SEE_WARM_UP)
    if response["status"] == "SandboxError":
        # The toolchain or the sandbox it compiles in is missing: the message names the install.
        return doctor.warn(name, response["message"], "see docs/languages.md")
    run = response["run_result"] or {}
    got = (response["status"], run.get("return_code"), run.get("stdout"), run.get("stderr"))
    if got != LANGUAGE_ANSWER:
        compile_result = response.get("compile_result") or {}
        return doctor.fail(
            name,
            f"answered {got!r} where {LANGUAGE_ANSWER!r} was due (the compile: "
            f"{compile_result.get('status')}, {str(compile_result.get('stderr'))[-300:]!r})",
            diagnosis.SEE_WARM_UP,
        )
    if response.get("compile_result") is None:
        return doctor.ok(
            name,
            f"ran with its stdin, stdout, stderr and exit status apart ({seconds:.2f} s, the "
            "image's warm-up included)",
        )
    compile_seconds = float(response["compile_result"]["execution_time"])
    return doctor.ok(
        name,
        f"compiled in {compile_seconds:.2f} s and ran with its stdin, stdout, stderr and exit "
        f"status apart ({seconds:.2f} s in all)",
    )


def _stdout(answered: dict[str, Any] | str) -> str | None:
    """A successful run's stdout."""
    if isinstance(answered, str) or answered["status"] != "Success":
        return None
    stdout: str = answered["run_result"]["stdout"]
    return stdout


def _said(answered: dict[str, Any] | str) -> str:
    if isinstance(answered, str):
        return answered
    run = answered["run_result"] or {}
    return f"{answered['status']}, stdout {run.get('stdout')!r}, stderr {run.get('stderr')!r}"


def _notebook_failed(detail: str) -> doctor.Check:
    return doctor.fail("notebook", detail, diagnosis.SEE_WARM_UP)


def selftest(
    url: str,
    jobs: int,
    programs: list[Program] = PROGRAMS,
    on_check: Callable[[doctor.Check], None] = lambda check: None,
) -> Report:
    """Check the backend and the notebook path, then run `programs` `jobs` at a time and judge
    each answer. Ctrl-C (KeyboardInterrupt) stops it at once: what had been checked then is
    the report, `interrupted`."""
    started = time.monotonic()
    recording = load_recording()
    report = Report(url, recording.python, [], planned=len(programs))
    try:
        report = _check(report, jobs, programs, on_check, recording.answers)
    except KeyboardInterrupt:
        report = replace(report, interrupted=True)
    return replace(report, seconds=time.monotonic() - started)


def _check(
    report: Report,
    jobs: int,
    programs: list[Program],
    on_check: Callable[[doctor.Check], None],
    recorded: dict[str, list[Shape]],
) -> Report:
    url = report.url
    for check in checks(url):
        report.checks.append(check)
        on_check(check)
    failed = [check for check in report.checks if check.status == "fail"]
    if failed:
        why = "; ".join(f"{check.name}: {check.detail}" for check in failed)
        return replace(report, broken=why)
    # Not a case's: its failure is said, and the corpus still runs.
    notebook = notebook_check(url)
    report.checks.append(notebook)
    on_check(notebook)
    for language in LANGUAGE_PROGRAMS:
        check = language_check(url, language)
        report.checks.append(check)
        on_check(check)
    probe = _run(url, PROBE, None, 10.0)
    if isinstance(probe, str):
        broken = f"the program that asks the guest its Python version failed: {probe}"
        return replace(report, broken=broken)
    if probe["status"] != "Success":
        run = probe["run_result"]
        broken = (
            "the program that asks the guest its Python version answered "
            f"{probe['status']} (return code {run['return_code']}): {run['stderr'][-500:]!r}"
        )
        return replace(report, broken=broken)
    guest = parse_probe(probe["run_result"]["stdout"])
    outcomes, interrupted = _run_corpus(url, jobs, programs, guest, recorded)
    return replace(report, guest=guest, outcomes=outcomes, interrupted=interrupted)


def _run(
    url: str,
    code: str,
    stdin: str | None,
    run_timeout: float,
    cancel: threading.Event | None = None,
) -> dict[str, Any] | str:
    """run_code's response, or the message of a response that is not the solution's own."""
    return _solutions(
        run_code(url, code, stdin, COMPILE_TIMEOUT, run_timeout, MEMORY_LIMIT_MB, cancel=cancel)
    )


def _solutions(answer: tuple[dict[str, Any] | None, str | None]) -> dict[str, Any] | str:
    """run_code's (or a notebook call's) response, or the message of a response that is not
    the solution's own."""
    response, error = answer
    if error is not None:
        return error
    assert response is not None
    if response["status"] == "SandboxError":
        return str(response.get("message") or "SandboxError")
    return response


def answer(
    url: str, program: Program, guest: Interpreter, cancel: threading.Event | None = None
) -> Shape | str:
    """One run of `program` on this node: its shape, or the backend's failure message."""
    response = _run(url, program.code, program.stdin, program.run_timeout, cancel)
    if isinstance(response, str):
        return response
    return shape(response, runner.WORK_DIR, guest.stdlib)


def _run_corpus(
    url: str,
    jobs: int,
    programs: list[Program],
    guest: Interpreter,
    recorded: dict[str, list[Shape]],
) -> tuple[list[Outcome], bool]:
    """Each program's outcome, and whether Ctrl-C stopped the runs: the outcomes are then
    those of the programs whose runs had all ended before it (the others' cases cancelled,
    or never started)."""
    runs: dict[str, list[Future[Shape | str]]] = {}
    cancel = cancels.Cancel()
    pool = ThreadPoolExecutor(jobs)
    ended: set[str] | None = None  # when interrupted: the programs whose runs had ended
    try:
        # The slowest first, so they do not finish the batch alone.
        for program in sorted(programs, key=lambda p: -p.run_timeout):
            if set(program.needs) <= set(guest.libraries):
                runs[program.name] = [
                    pool.submit(answer, url, program, guest, cancel) for _ in range(program.runs)
                ]
        wait([run for program_runs in runs.values() for run in program_runs])
    except KeyboardInterrupt:
        # Seen before the cancel, so that no answer of a cancelled case is judged.
        ended = {name for name, program_runs in runs.items() if all(r.done() for r in program_runs)}
        cancel.set()
    finally:
        pool.shutdown(cancel_futures=True)
    outcomes = []
    for program in programs:
        expected = recorded[program.name]
        if ended is not None and program.name not in ended:
            continue
        if program.name not in runs:
            missing = ", ".join(sorted(set(program.needs) - set(guest.libraries)))
            outcomes.append(
                Outcome(program, SKIPPED, expected, [], [], f"the image has no {missing}")
            )
            continue
        results = [run.result() for run in runs[program.name]]
        failures = [result for result in results if isinstance(result, str)]
        if failures:
            outcomes.append(Outcome(program, BACKEND_FAILURE, expected, [], [], failures[0]))
            continue
        ours = [result for result in results if not isinstance(result, str)]
        outcomes.append(_judge(program, expected, ours))
    return outcomes, ended is not None


def _judge(program: Program, expected: list[Shape], ours: list[Shape]) -> Outcome:
    fields = differences(program, expected, ours)
    ours = [recorded_form(run) for run in ours]
    if not fields:
        return Outcome(program, AGREED, expected, ours, fields)
    divergence = program.divergence
    if divergence is not None and set(fields) <= set(divergence.ours):
        return Outcome(program, KNOWN_LIMIT, expected, ours, fields, divergence.limit)
    return Outcome(program, DIVERGED, expected, ours, fields)


def render(report: Report) -> str:
    """The report as text: the families' tallies, then every difference with its program
    and both answers, then the verdict."""
    lines = []
    if report.broken:
        lines.append(f"the backend is broken, so no program was run: {report.broken}")
        lines.append(
            "fix what the failed checks above say, then run `verl-hyperlight selftest` again"
        )
        return "\n".join(lines)
    if report.guest is None:
        assert report.interrupted  # else it was broken, or it has a guest
        checked = ", ".join(check.name for check in report.checks) or "nothing"
        return f"interrupted (Ctrl-C) before any program was run; checked: {checked}\n{AGAIN}"
    lines.append(
        f"guest: CPython {report.guest.version}; answers recorded from CPython "
        f"{report.recorded_python} run as Sandbox Fusion runs it"
    )
    if report.guest.version.split(".")[:2] != report.recorded_python.split(".")[:2]:
        lines.append(
            "  the guest's CPython is not the one the answers were recorded from: messages and "
            "tracebacks differ between versions (the published images are CPython 3.12)"
        )
    for family in FAMILIES:
        members = [o for o in report.outcomes if o.program.family == family]
        ran = [o for o in members if o.verdict != SKIPPED]
        if not members:
            continue
        agreed = sum(o.verdict == AGREED for o in ran)
        counts = {verdict: sum(o.verdict == verdict for o in members) for verdict in TALLIED}
        notes = [
            f"{count} {TALLIED[verdict][count > 1]}" for verdict, count in counts.items() if count
        ]
        suffix = f" ({', '.join(notes)})" if notes else ""
        lines.append(f"  {family:<26}{agreed:>4}/{len(ran)}{suffix}")
    for outcome in report.outcomes:
        if outcome.verdict in (KNOWN_LIMIT, DIVERGED):
            lines += ["", *_describe(outcome, report.recorded_python)]
    # A backend failure says nothing of the program: one paragraph per cause, not per program.
    failed: dict[str, list[str]] = {}
    for outcome in report.outcomes:
        if outcome.verdict == BACKEND_FAILURE:
            failed.setdefault(outcome.note, []).append(outcome.program.name)
    for message, names in failed.items():
        lines += ["", f"BACKEND FAILURE (SandboxError) on {len(names)} programs: {message}"]
        lines.append(f"  programs: {', '.join(names)}")
    lines += ["", _verdict(report)]
    return "\n".join(lines)


def _lacking(url: str) -> str:
    """Why a guest lacks the libraries some programs need, and where they are."""
    if parse_url(url).image == "agent":
        return (
            "which this guest lacks although the published agent image has them: this hluk "
            "boots another guest (HLUK_INITRD set, or a stand-in hluk)"
        )
    return "which this image lacks (the agent image has them: `verl-hyperlight selftest hyperlight://agent`)"


def _verdict(report: Report) -> str:
    counts = {
        verdict: sum(o.verdict == verdict for o in report.outcomes)
        for verdict in (AGREED, KNOWN_LIMIT, DIVERGED, BACKEND_FAILURE, SKIPPED)
    }
    ran = len(report.outcomes) - counts[SKIPPED]
    text = ""
    if report.interrupted:
        text = f"interrupted (Ctrl-C) with {ran} of {report.planned} programs checked: "
    text += (
        f"{counts[AGREED]} of {ran} programs agree with CPython under Sandbox Fusion; "
        f"{counts[KNOWN_LIMIT]} differ as documented known limits; "
        f"{counts[DIVERGED]} differ otherwise (undocumented divergences)"
    )
    if counts[BACKEND_FAILURE]:
        text += f"; {counts[BACKEND_FAILURE]} failed in the backend (SandboxError)"
    if counts[SKIPPED]:
        needed = sorted(
            {n for o in report.outcomes if o.verdict == SKIPPED for n in o.program.needs}
        )
        text += f"; {counts[SKIPPED]} skipped: they need {', '.join(needed)}, " + _lacking(
            report.url
        )
    failed = [check.name for check in report.checks if check.status == "fail"]
    if failed:
        text += f"; the {', '.join(failed)} check failed (see above)"
    text += f" ({report.seconds:.1f} s)"
    if report.interrupted:
        return f"{text}\n{AGAIN}"
    if report.ok:
        return text + "\nok: this node grades as Sandbox Fusion does, within the known limits"
    return (
        text + "\nFAILED: see each divergence above; `verl-hyperlight selftest --json` writes the "
        "whole report for a bug report"
    )


def _describe(outcome: Outcome, recorded_python: str) -> list[str]:
    program = outcome.program
    title = outcome.verdict.upper()
    lines = [f"{title}: {program.name} ({program.family})"]
    if outcome.note:
        label = "docs/known-limits.md" if outcome.verdict == KNOWN_LIMIT else "why"
        lines.append(f"  {label}: {outcome.note}")
    lines.append(f"  program (run_timeout {program.run_timeout:g} s):")
    lines += [f"    | {line}" for line in program.code.splitlines()]
    if program.stdin is not None:
        lines.append(f"  stdin: {_shown(program.stdin)}")
    for index, (want, got) in enumerate(zip(outcome.expected, outcome.ours, strict=False)):
        run = f" (run {index + 1})" if program.runs > 1 else ""
        for name in outcome.fields:
            lines.append(f"  {name}{run}:")
            lines.append(f"    CPython {recorded_python}: {_shown(want.get(name))}")
            lines.append(f"    this node:     {_shown(got.get(name))}")
    agreeing = [name for name in (outcome.expected or [{}])[0] if name not in outcome.fields]
    if outcome.ours and agreeing:
        lines.append(f"  the same on both: {', '.join(agreeing)}")
    return lines


def _shown(value: object) -> str:
    text = repr(value)
    if len(text) <= SHOWN_CHARACTERS:
        return text
    return f"{text[:SHOWN_CHARACTERS]}... ({len(text) - SHOWN_CHARACTERS} more characters)"


def as_json(report: Report) -> dict[str, object]:
    """The whole report, for a bug report: every program with its code, stdin and both
    answers."""
    return {
        "ok": report.ok,
        "url": report.url,
        "recorded_python": report.recorded_python,
        "guest": asdict(report.guest) if report.guest else None,
        "checks": [asdict(check) for check in report.checks],
        "broken": report.broken,
        "interrupted": report.interrupted,
        "planned": report.planned,
        "seconds": round(report.seconds, 3),
        "outcomes": [
            {
                "program": o.program.name,
                "family": o.program.family,
                "verdict": o.verdict,
                "fields": o.fields,
                "note": o.note,
                "code": o.program.code,
                "stdin": o.program.stdin,
                "run_timeout": o.program.run_timeout,
                "expected": o.expected,
                "ours": o.ours,
            }
            for o in report.outcomes
        ],
    }
