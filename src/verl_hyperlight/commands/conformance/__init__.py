"""The conformance corpus and what is compared of its answers.

`PROGRAMS` (in `corpus`) are run on both sides; an answer is reduced to its `shape` (everything
a verl reward reads); `expected.json` holds the shapes CPython 3.12 gave when run as Sandbox
Fusion runs it, recorded by ``python tests/test_conformance.py`` and checked by the test suite
against a local CPython 3.12, so `verl-hyperlight selftest` needs neither.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .corpus import FAMILIES, PROGRAMS, Divergence, Program

__all__ = [
    "FAMILIES",
    "PROBE",
    "PROGRAMS",
    "Divergence",
    "Interpreter",
    "Program",
    "Recording",
    "Shape",
    "differences",
    "load_recording",
    "parse_probe",
    "recorded_form",
    "shape",
]

Shape = dict[str, object]
RECORDING = "expected.json"
# Longer output is recorded by its digest: the corpus prints up to 10 MB, which the package
# would otherwise carry.
LONGEST_RECORDED = 4096
LIBRARIES = ("numpy", "sympy")

# What a side's interpreter is, printed by itself: its version, the directory of its standard
# library (which tracebacks through it name, and which differs between installations), and
# which of the agent image's libraries it has.
PROBE = f"""\
import importlib.util, os, sys
print(sys.version.split()[0])
print(os.path.dirname(os.__file__))
print(*[name for name in {LIBRARIES!r} if importlib.util.find_spec(name)])
"""


@dataclass(frozen=True)
class Interpreter:
    """A side's CPython, as its PROBE printed it."""

    version: str
    stdlib: str
    libraries: tuple[str, ...]


def parse_probe(stdout: str) -> Interpreter:
    version, stdlib, libraries = [*stdout.split("\n"), "", "", ""][:3]
    return Interpreter(version, stdlib, tuple(libraries.split()))


_ADDRESS = re.compile(r"0x[0-9a-f]+")


def shape(response: dict[str, Any], solution_dir: str, stdlib: str) -> Shape:
    """What is compared: everything a verl reward reads, with what legitimately differs between
    two runs or two installations normalised in stderr: the solution's fresh directory, the
    standard library's directory and object addresses."""
    run = response["run_result"]
    stderr = str(run["stderr"]).replace(solution_dir, "<dir>")
    if stdlib:
        stderr = stderr.replace(stdlib + os.sep, "<stdlib>" + os.sep)
    stderr = _ADDRESS.sub("0x?", stderr)
    return {
        "status": response["status"],
        "run_status": run["status"],
        "return_code": run["return_code"],
        "stdout": run["stdout"],
        "stderr": stderr,
        "last_stderr_line": ([""] + [line for line in stderr.splitlines() if line.strip()])[-1],
    }


def recorded_form(answer: Shape) -> Shape:
    """`answer` as the recording holds it: text longer than LONGEST_RECORDED by its length and
    digest."""
    form = dict(answer)
    for field, value in answer.items():
        if isinstance(value, str) and len(value) > LONGEST_RECORDED:
            digest = hashlib.sha256(value.encode(errors="surrogatepass")).hexdigest()
            form[field] = f"<{len(value)} characters, sha256 {digest}>"
    return form


def differences(program: Program, expected: list[Shape], actual: list[Shape]) -> list[str]:
    """The fields in which `actual` (one shape per run) is not `expected`, both compared in
    recorded form. A program that varies is compared on its stdout's number of words, and its
    runs must differ."""
    fields: set[str] = set()
    if len(actual) != len(expected):
        return ["runs"]
    expected, actual = [recorded_form(a) for a in expected], [recorded_form(a) for a in actual]
    for want, got in zip(expected, actual, strict=True):
        for field in want.keys() | got.keys():
            if program.varies and field == "stdout":
                if len(str(want.get(field)).split()) != len(str(got.get(field)).split()):
                    fields.add(field)
            elif want.get(field) != got.get(field):
                fields.add(field)
    if program.varies and len({str(run.get("stdout")) for run in actual}) < len(actual):
        fields.add("stdout")
    return sorted(fields)


@dataclass(frozen=True)
class Recording:
    """The answers CPython gave to each program (one shape per run, in recorded form)."""

    python: str
    answers: dict[str, list[Shape]]


def load_recording() -> Recording:
    text = resources.files(__package__).joinpath(RECORDING).read_text(encoding="utf-8")
    data = json.loads(text)
    return Recording(data["python"], data["answers"])
