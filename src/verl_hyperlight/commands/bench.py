"""`verl-hyperlight bench`: how many micro-VMs this node runs well at once.

At each concurrency level, that many threads run representative cases through run_code for a
few seconds: a trivial one, one busy on the CPU for about 50 ms, one printing 1 MB. Per level:
cases/s, p50 and p99 latency, and the start-up share (the part of a case's latency outside the
solution's own run: restore, start-up, copy-out, orchestration). The recommendation is the
level past which cases/s stops rising (by less than RISE) or p99 degrades (beyond DEGRADE
times the first level's), divided among the reward workers.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..case.api import run_code
from ..case.guests import guest_for
from ..errors import BackendError, Diagnosis, InvalidRequest

CASES = {
    "trivial": "print(1)",
    "cpu": "import time\nend = time.perf_counter() + 0.05\nwhile time.perf_counter() < end:\n"
    "    pass\nprint('done')",
    "output": "import sys\nsys.stdout.write('x' * 1_000_000)",
}
# A level is worth its concurrency when it adds this much throughput, and no more than this
# much to p99.
RISE = 1.05
DEGRADE = 2.0


@dataclass(frozen=True)
class Level:
    """What one concurrency level measured."""

    concurrency: int
    cases: int
    per_second: float
    p50_ms: float
    p99_ms: float
    startup_share: float  # of a case's latency, outside the solution's own run
    failed: int  # cases answered SandboxError or not as expected


@dataclass(frozen=True)
class Recommendation:
    node_concurrency: int
    max_concurrent: int
    why: str
    num_workers: int  # the reward workers to run them: fewer than asked when they would not fit


def share(capacity: int, num_workers: int) -> tuple[int, int]:
    """The one sizing rule (bench's and doctor's): `capacity` micro-VMs at once on the node
    (what it runs well, its CPUs, what its memory holds) shared by `num_workers` reward
    workers, as (max_concurrent, reward.num_workers). max_concurrent is at least 1, so when
    there are more workers than the capacity, the workers are fewer."""
    if capacity < num_workers:
        return 1, max(capacity, 1)
    return capacity // num_workers, num_workers


def measure(
    url: str,
    memory_limit_mb: int | None,
    concurrency: int,
    seconds: float,
    tick: Callable[[], None] = lambda: None,
) -> Level:
    """Run the cases round-robin from `concurrency` threads for `seconds`."""
    deadline = time.monotonic() + seconds
    names = list(CASES)
    lock = threading.Lock()
    latencies: list[float] = []
    startup: list[float] = []
    failed = [0]

    def worker(offset: int) -> None:
        index = offset
        while time.monotonic() < deadline:
            name = names[index % len(names)]
            index += 1
            started = time.monotonic()
            response, _ = run_code(url, CASES[name], "", 10, 60, memory_limit_mb)
            latency = time.monotonic() - started
            run = (response or {}).get("run_result") or {}
            with lock:
                if (response or {}).get("status") != "Success":
                    failed[0] += 1
                    continue
                latencies.append(latency)
                startup.append(max(latency - (run.get("execution_time") or 0.0), 0.0) / latency)
            tick()

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    if not latencies:
        return Level(concurrency, 0, 0.0, 0.0, 0.0, 0.0, failed[0])
    return Level(
        concurrency=concurrency,
        cases=len(latencies),
        per_second=len(latencies) / elapsed,
        p50_ms=statistics.median(latencies) * 1000,
        p99_ms=percentile_ms(latencies, 0.99),
        startup_share=statistics.fmean(startup),
        failed=failed[0],
    )


def percentile_ms(latencies: list[float], share: float) -> float:
    """The latency (in seconds) below which `share` of `latencies` fall, in milliseconds."""
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))] * 1000


def recommend(levels: list[Level], num_workers: int) -> Recommendation:
    """The last level that still paid: more cases/s by RISE, p99 within DEGRADE of the
    first's; max_concurrent is its share per reward worker."""
    chosen = levels[0]
    why = "the first level"
    for level in levels[1:]:
        if level.failed or level.cases == 0:
            why = f"cases failed at concurrency {level.concurrency}"
            break
        if level.per_second < chosen.per_second * RISE:
            why = (
                f"cases/s stopped rising past {chosen.concurrency} "
                f"({level.per_second:.1f} at {level.concurrency} against {chosen.per_second:.1f})"
            )
            break
        if level.p99_ms > levels[0].p99_ms * DEGRADE:
            why = (
                f"p99 degraded past {chosen.concurrency} ({level.p99_ms:.0f} ms at "
                f"{level.concurrency}, more than {DEGRADE:g} x {levels[0].p99_ms:.0f} ms)"
            )
            break
        chosen = level
        why = f"cases/s still rose up to {level.concurrency}, the last level measured"
    per_worker, workers = share(chosen.concurrency, num_workers)
    return Recommendation(chosen.concurrency, per_worker, why, workers)


def check(url: str, memory_limit_mb: int | None) -> None:
    """Refuse at once what cannot run (a bad URL, a broken backend), before any level."""
    guest_for(url, memory_limit_mb)
    response, error = run_code(url, "print(1)", "", 10, 60, memory_limit_mb)
    if error is not None:
        raise InvalidRequest(error)
    if response is None or response["status"] != "Success":
        raise BackendError(Diagnosis((response or {}).get("message", "no answer"), "", "bench"))


def as_json(cpus: int, measured: list[Level], advice: Recommendation) -> dict[str, object]:
    """`verl-hyperlight bench --json`'s report."""
    return {
        "cpus": cpus,
        "levels": [asdict(level) for level in measured],
        "recommendation": asdict(advice),
    }


def render(
    cpus: int, seconds: float, measured: list[Level], advice: Recommendation, num_workers: int
) -> str:
    """`verl-hyperlight bench`'s report: a row per level, then the recommendation."""
    lines = [
        f"{cpus} CPUs; {seconds:g} s per level; cases: {', '.join(CASES)}",
        "concurrency  cases/s   p50 ms   p99 ms  start-up  failed",
    ]
    for level in measured:
        lines.append(
            f"{level.concurrency:>11}{level.per_second:>9.1f}{level.p50_ms:>9.0f}"
            f"{level.p99_ms:>9.0f}{level.startup_share:>10.0%}{level.failed:>8}"
        )
    if advice.num_workers == num_workers:
        split = f"with reward.num_workers={num_workers}: max_concurrent={advice.max_concurrent}"
    else:
        split = (
            f"max_concurrent=1 with reward.num_workers={advice.num_workers} ({num_workers} "
            f"workers would run {num_workers} at once)"
        )
    lines.append(
        f"recommended: at most {advice.node_concurrency} at once on this node ({advice.why}); "
        f"{split}"
    )
    return "\n".join(lines)
