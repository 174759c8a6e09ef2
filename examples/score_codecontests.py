"""Score codecontests-style completions in Hyperlight micro-VMs through verl's own scorer.

Each problem below has a statement, a few test cases and a model-style completion (a fenced
```python block); one also has a wrong completion. They are scored by verl's
``sandbox_fusion.compute_score`` with ``sandbox_fusion_url="hyperlight://"``, exactly as a
reward worker scores a ``codecontests`` sample, and the per-case results and timings are read
from the metadata it returns.

    python examples/score_codecontests.py

needs verl 0.6 or later, verl-hyperlight, and hluk on PATH (or HLUK_PATH naming one).
"""

from __future__ import annotations

import sys
import textwrap
import threading
import time
from dataclasses import dataclass

import verl  # noqa: F401  (verl 0.9+ loads the plugin through its verl.plugins entry point)
from verl.utils.reward_score import sandbox_fusion

import verl_hyperlight.plugin  # noqa: F401  (idempotent; needed on verl 0.6-0.8)

SANDBOX_URL = "hyperlight://"
MEMORY_LIMIT_MB = 1024  # verl's default reward.sandbox_fusion.memory_limit_mb
# verl's reward worker passes a semaphore of reward.sandbox_fusion.max_concurrent.
MAX_CONCURRENT = threading.Semaphore(4)
# verl's statuses of a case that did not run (the sandbox failed it, or could not be asked).
NOT_RUN = ("sandbox_error", "api_error", "internal_error")


@dataclass(frozen=True)
class Problem:
    name: str
    statement: str
    inputs: list[str]
    outputs: list[str]
    completions: dict[str, str]


def fenced(reasoning: str, code: str) -> str:
    """A completion as a model writes it: some prose, then the program in a python fence."""
    return f"{reasoning}\n\n```python\n{code.strip()}\n```\n"


PROBLEMS = [
    Problem(
        name="watermelon",
        statement=(
            "A watermelon weighs w kilos (1 <= w <= 100). Can it be cut into two parts that "
            "each weigh a positive even number of kilos? Print YES or NO."
        ),
        inputs=["8\n", "5\n", "2\n", "100\n"],
        outputs=["YES\n", "NO\n", "NO\n", "YES\n"],
        completions={
            "correct": fenced(
                "Both parts even means w is even, and w = 2 leaves no room for two.",
                "w = int(input())\nprint('YES' if w % 2 == 0 and w > 2 else 'NO')",
            ),
            "wrong": fenced(
                "An even weight splits into two even parts.",
                "w = int(input())\nprint('YES' if w % 2 == 0 else 'NO')",
            ),
        },
    ),
    Problem(
        name="distinct-values",
        statement=(
            "The first line holds n, the second n integers. Print how many distinct values "
            "the sequence contains."
        ),
        inputs=["5\n1 2 2 3 1\n", "1\n42\n", "6\n-1 -1 -1 -1 -1 -1\n"],
        outputs=["3\n", "1\n", "1\n"],
        completions={
            "correct": fenced(
                "A set keeps one copy of each value.",
                "input()\nprint(len(set(input().split())))",
            ),
        },
    ),
    Problem(
        name="range-sums",
        statement=(
            "The first line holds n and q, the second n integers a_1..a_n, then q lines each "
            "hold l and r (1 <= l <= r <= n). For each query print a_l + ... + a_r."
        ),
        inputs=["5 3\n1 2 3 4 5\n1 5\n2 3\n4 4\n", "3 2\n-5 10 -5\n1 3\n2 2\n"],
        outputs=["15\n5\n4\n", "0\n10\n"],
        completions={
            "correct": fenced(
                "Prefix sums answer each query in O(1); read everything at once for speed.",
                """
import sys

data = sys.stdin.buffer.read().split()
n, q = int(data[0]), int(data[1])
prefix = [0]
for value in data[2 : 2 + n]:
    prefix.append(prefix[-1] + int(value))
queries = data[2 + n :]
answers = []
for i in range(q):
    l, r = int(queries[2 * i]), int(queries[2 * i + 1])
    answers.append(prefix[r] - prefix[l - 1])
sys.stdout.write("\\n".join(map(str, answers)) + "\\n")
""",
            ),
        },
    ),
    Problem(
        name="reverse-words",
        statement="Print the words of the input line in reverse order, separated by one space.",
        inputs=["hello world\n", "a\n", "  the quick   brown fox \n"],
        outputs=["world hello\n", "a\n", "fox brown quick the\n"],
        completions={
            "correct": fenced(
                "split() without arguments also drops repeated and surrounding spaces.",
                "print(' '.join(reversed(input().split())))",
            ),
        },
    ),
]


def score(problem: Problem, completion: str) -> int:
    """Score `completion` and print how it went; how many of its cases could not be run."""
    started = time.perf_counter()
    value, metadata = sandbox_fusion.compute_score(
        SANDBOX_URL,
        MAX_CONCURRENT,
        MEMORY_LIMIT_MB,
        completion,
        {"inputs": problem.inputs, "outputs": problem.outputs},
        timeout=10,
    )
    elapsed = time.perf_counter() - started
    print(f"  score {value:.2f}  ({len(metadata)} cases in {elapsed:.2f} s)")
    unrun = 0
    for case in metadata:
        duration = case.get("duration")
        timing = "-" if duration is None else f"{duration * 1000:.1f} ms"
        line = f"    case {case.get('case_index')}: {case.get('status'):<14} run {timing}"
        response = case.get("api_response") or {}
        if case.get("status") in NOT_RUN:
            unrun += 1
            line += f"  ({response.get('message') or case.get('api_request_error')})"
        print(line)
    return unrun


def main() -> int:
    """0 when every case ran (whatever its score); 1 when some could not, as their scores
    are then the node's, not the completions'."""
    unrun = 0
    for problem in PROBLEMS:
        print(textwrap.fill(f"{problem.name}: {problem.statement}", subsequent_indent="  "))
        for label, completion in problem.completions.items():
            print(f" {label} completion")
            unrun += score(problem, completion)
    if unrun:
        print(
            f"{unrun} cases could not be run, so their scores say nothing of the completions: "
            "see why above, and run `verl-hyperlight doctor`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
