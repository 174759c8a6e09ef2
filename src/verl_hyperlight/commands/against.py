"""`verl-hyperlight bench --against URL`: the same cases through this node's run_code and
through a Sandbox Fusion service (or another `serve`) at URL, side by side.

The sides are alternated in chunks (a chunk holds every case once), so that whatever else
the machine does falls on both alike; each concurrency level runs chunks until each side has
had `seconds` of them. Per level and side: cases/s, p50 and p90 latency, and the ratio of the
other side's to ours. Each case's answers are compared too (status, the run's status, return
code and stdout): a disagreement is reported with both answers, whatever the speeds say.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from ..case.api import run_code
from . import remote
from .bench import percentile_ms
from .conformance import corpus

RUN_TIMEOUT = 10.0
COMPILE_TIMEOUT = 10.0
STDIN_100K = "".join(f"{i}\n" for i in range(19_000))  # 100 KB or so

# The cases every run compares: trivial, CPU-bound for 20 ms, a 100 KB stdin, then the shipped
# conformance programs that answer the same on every run and every backend (no documented
# divergence, no randomness, no package beyond the standard library, quick).
BENCH_CASES: tuple[tuple[str, str, str], ...] = (
    ("trivial", "print(1)", ""),
    (
        "cpu 20 ms",
        "import time\nend = time.perf_counter() + 0.02\nwhile time.perf_counter() < end:\n"
        "    pass\nprint('done')",
        "",
    ),
    (
        "stdin 100 KB",
        "import sys\ndata = sys.stdin.read()\nprint(len(data), data[-7:])",
        STDIN_100K,
    ),
)
_QUICK_FAMILIES = frozenset((corpus.OUTPUT, corpus.INPUT, corpus.EXCEPTIONS, corpus.UNICODE))


def cases() -> list[tuple[str, str, str]]:
    """The cases compared: BENCH_CASES, then the conformance programs fit for it."""
    chosen = list(BENCH_CASES)
    for program in corpus.PROGRAMS:
        if (
            program.family in _QUICK_FAMILIES
            and program.divergence is None
            and not program.varies
            and not program.needs
            and program.runs == 1
            and program.run_timeout <= RUN_TIMEOUT
            and len(program.stdin or "") <= 1024 * 1024
        ):
            chosen.append((f"conformance {program.name}", program.code, program.stdin or ""))
    return chosen


@dataclass
class Side:
    """What one side measured at one level."""

    name: str
    cases: int = 0
    seconds: float = 0.0  # wall time of its chunks
    latencies: list[float] = field(default_factory=list)
    failed: int = 0  # answered with no response (HTTP or transport errors, invalid requests)

    @property
    def per_second(self) -> float:
        return self.cases / self.seconds if self.seconds else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "side": self.name,
            "cases": self.cases,
            "per_second": round(self.per_second, 2),
            "p50_ms": round(statistics.median(self.latencies) * 1000, 2) if self.latencies else 0,
            "p90_ms": round(percentile_ms(self.latencies, 0.9), 2) if self.latencies else 0,
            "failed": self.failed,
        }


@dataclass(frozen=True)
class Disagreement:
    case: str
    ours: tuple[Any, ...]
    theirs: tuple[Any, ...]


@dataclass
class Comparison:
    """The whole run: each level's two sides, and the answers that disagreed."""

    ours: str
    theirs: str
    cases: int
    seconds: float
    levels: list[tuple[int, Side, Side]] = field(default_factory=list)
    disagreements: list[Disagreement] = field(default_factory=list)


Ask = Callable[[str, str], "dict[str, Any] | None"]


def answer_of(response: dict[str, Any] | None) -> tuple[Any, ...]:
    """What is compared of an answer: its status, the run's status, return code and stdout."""
    if response is None:
        return ("no answer",)
    run = response.get("run_result") or {}
    return (response.get("status"), run.get("status"), run.get("return_code"), run.get("stdout"))


def _chunk(
    ask: Ask,
    chosen: list[tuple[str, str, str]],
    concurrency: int,
    side: Side,
    tick: Callable[[], None],
) -> dict[str, tuple[Any, ...]]:
    """Every case once through `ask`, `concurrency` at a time; each case's answer."""
    lock = threading.Lock()

    def one(case: tuple[str, str, str]) -> tuple[str, tuple[Any, ...]]:
        name, code, stdin = case
        started = time.monotonic()
        response = ask(code, stdin)
        latency = time.monotonic() - started
        with lock:
            if response is None:
                side.failed += 1
            else:
                side.latencies.append(latency)
                side.cases += 1
        tick()
        return name, answer_of(response)

    started = time.monotonic()
    with ThreadPoolExecutor(min(concurrency, len(chosen))) as pool:
        answers = dict(pool.map(one, chosen))
    side.seconds += time.monotonic() - started
    return answers


def compare(
    ours_url: str,
    theirs_url: str,
    memory_limit_mb: int | None,
    levels: list[int],
    seconds: float,
    tick: Callable[[], None] = lambda: None,
) -> Comparison:
    """Run the cases through both sides at each level, alternating chunks until each side has
    had `seconds` (one chunk at least)."""
    chosen = cases()

    def ours(code: str, stdin: str) -> dict[str, Any] | None:
        response, _ = run_code(ours_url, code, stdin, COMPILE_TIMEOUT, RUN_TIMEOUT, memory_limit_mb)
        return response

    def theirs(code: str, stdin: str) -> dict[str, Any] | None:
        memory = memory_limit_mb if memory_limit_mb is not None else -1
        response, _ = remote.post(
            theirs_url, code, stdin, RUN_TIMEOUT, memory, compile_timeout=COMPILE_TIMEOUT
        )
        return response

    found = Comparison(ours_url, theirs_url, len(chosen), seconds)
    seen: dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
    for level in levels:
        mine, other = Side(f"this node ({ours_url})"), Side(theirs_url)
        first = True
        while first or min(mine.seconds, other.seconds) < seconds:
            first = False
            our_answers = _chunk(ours, chosen, level, mine, tick)
            their_answers = _chunk(theirs, chosen, level, other, tick)
            for name, _, _ in chosen:
                seen.setdefault(name, (our_answers[name], their_answers[name]))
        found.levels.append((level, mine, other))
    found.disagreements = [Disagreement(name, a, b) for name, (a, b) in seen.items() if a != b]
    return found


def _ratio(theirs: float, ours: float) -> str:
    return f"x{theirs / ours:.2f}" if ours else "-"


def render(found: Comparison) -> str:
    """The side-by-side table, then the answers' agreement."""
    lines = [
        f"the same {found.cases} cases through this node and through {found.theirs}, "
        f"alternated in chunks, {found.seconds:g} s a side per level",
        f"{'concurrency':>11}  {'side':<40}{'cases/s':>9}{'p50 ms':>9}{'p90 ms':>9}{'failed':>8}",
    ]
    for level, mine, other in found.levels:
        for side in (mine, other):
            shown = side.summary()
            lines.append(
                f"{level:>11}  {side.name[:39]:<40}{shown['per_second']:>9.1f}"
                f"{shown['p50_ms']:>9.1f}{shown['p90_ms']:>9.1f}{side.failed:>8}"
            )
        ours, theirs = mine.summary(), other.summary()
        lines.append(
            f"{level:>11}  {'theirs / ours':<40}"
            f"{_ratio(theirs['per_second'], ours['per_second']):>9}"
            f"{_ratio(theirs['p50_ms'], ours['p50_ms']):>9}"
            f"{_ratio(theirs['p90_ms'], ours['p90_ms']):>9}"
        )
    if not found.disagreements:
        lines.append(f"answers: all {found.cases} cases agree")
    else:
        lines.append(f"answers: {len(found.disagreements)} of {found.cases} cases disagree")
        for differing in found.disagreements:
            lines.append(f"  {differing.case}: ours {differing.ours!r}")
            lines.append(f"  {' ' * len(differing.case)}  theirs {differing.theirs!r}")
    return "\n".join(lines)


def as_json(found: Comparison) -> dict[str, Any]:
    return {
        "ours": found.ours,
        "theirs": found.theirs,
        "cases": found.cases,
        "seconds_per_side": found.seconds,
        "levels": [
            {"concurrency": level, "ours": mine.summary(), "theirs": other.summary()}
            for level, mine, other in found.levels
        ],
        "disagreements": [asdict(d) for d in found.disagreements],
    }
