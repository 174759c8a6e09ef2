"""run_code is safe from many threads at once: every answer is its own case's, and nothing is
left behind."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from hostside import Host, Usage, left_running, result, run

pytestmark = pytest.mark.once

Expected = Callable[[str], tuple[object, ...]]
# (solution, run_timeout, the answer for stdin `token`): correct, wrong, runtime error, an exit
# status, and a timeout; each echoes its stdin, so an answer crossed with another case's shows.
KINDS: list[tuple[str, int, Expected]] = [
    ("print(input()[::-1])", 30, lambda t: ("Success", "Finished", 0, t[::-1] + "\n", "")),
    ("print(input(), 'wrong')", 30, lambda t: ("Success", "Finished", 0, t + " wrong\n", "")),
    (
        "import sys\nsys.stderr.write(input() + '\\n')\nraise SystemExit(3)",
        30,
        lambda t: ("Failed", "Finished", 3, "", t + "\n"),
    ),
    (
        "raise ValueError(input())",
        30,
        lambda t: ("Failed", "Finished", 1, "", f"ValueError: {t}\n"),
    ),
]
TIMEOUT: tuple[str, int, Expected] = (
    "input()\nwhile True:\n    pass\n",
    1,
    lambda t: ("Failed", "TimeLimitExceeded", None),
)


def test_run_code_from_32_threads_answers_each_case_with_its_own_result(host: Host) -> None:
    run("pass")
    before = Usage.now(host)
    cases: list[tuple[str, str, int, Expected]] = []
    for i in range(200):
        kind = TIMEOUT if i % 40 == 39 else KINDS[i % len(KINDS)]
        cases.append((f"case-{i:03d}-{'x' * (i % 7)}", *kind))

    def answer(case: tuple[str, str, int, Expected]) -> tuple[object, ...]:
        token, code, run_timeout, _ = case
        response = run(code, stdin=token + "\n", run_timeout=run_timeout)
        found = result(response)
        if found[1] == "TimeLimitExceeded":
            return found[:3]
        if found[2] == 1:  # a traceback: its last line names the exception and the token
            return (*found[:4], found[4].splitlines(keepends=True)[-1])
        return found

    started = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(answer, cases))
    wall = time.monotonic() - started
    wrong = [
        (case[0], got) for case, got in zip(cases, answers, strict=True) if got != case[3](case[0])
    ]
    assert wrong == []

    leaked = Usage.now(host).minus(before)
    print(f"\n{len(cases)} cases from 32 threads in {wall:.1f} s; leaked: {leaked}")
    assert leaked == Usage(descriptors=0, threads=0, children=0, case_dirs=0)
    # Seen in CI at b39dd78 and e3872b7: the stand-in's inner bwrap, its parent init, running
    # (ending) just after the cases.
    assert left_running(str(host.tmpdir)) == []
