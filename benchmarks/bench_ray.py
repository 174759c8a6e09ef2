"""What a case through Ray (``hyperlight://?ray``) adds over the same case run in-process on
its node (``hyperlight://``), at 1, 8 and 64 cases at once, as ratios measured in one run.

A real two-node Ray cluster on this machine (ray.cluster_utils): a head without the resource
and a node offering ``hyperlight: 64``, both pointed at the instant hluk double
(bench_run_code.instant_hluk: no guest, so the figures are the host side's and Ray's own
cost). The in-process baseline runs in this process with the node's settings, which on one
machine is the node's own run_code; each level alternates the two ways, twice, after a
warm-up round of each (Ray starts a worker process per case running at once on the node).
Also printed: the Ray worker processes the node holds after the 64 level, and their memory.

Usage: python benchmarks/bench_ray.py [--cases N]  (needs the ray extra: pip install -e '.[ray]')
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run_code import EXPECTED, MEMORY_MB, SOLUTION, STDIN, instant_hluk

from verl_hyperlight import run_code

LEVELS = (1, 8, 64)
LOCAL, THROUGH_RAY = "hyperlight://", "hyperlight://?ray"
NODE_MARK = "VERL_HYPERLIGHT_BENCH_NODE=1"


def one(url: str) -> float:
    started = time.perf_counter()
    response, error = run_code(url, SOLUTION, STDIN, 10, 10, MEMORY_MB)
    elapsed = time.perf_counter() - started
    assert error is None and response is not None, error
    assert response["run_result"] is not None, response["message"]
    assert response["run_result"]["stdout"] == EXPECTED, response
    return elapsed


def level(url: str, concurrency: int, cases: int) -> tuple[float, float]:
    """(p50 latency, cases/s) of `cases` cases, `concurrency` at once."""
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        latencies = list(pool.map(lambda _: one(url), range(cases)))
    return statistics.median(latencies), cases / (time.perf_counter() - started)


def worker_memory() -> tuple[int, int]:
    """How many Ray worker processes run on the node (those with its NODE_MARK), and their
    RSS in MiB."""
    count = rss = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if not Path(f"/proc/{entry}/cmdline").read_bytes().startswith(b"ray::"):
                continue
            if NODE_MARK.encode() not in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                continue
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            count += 1
            rss += int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError):
            continue
    return count, rss // 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=200, help="cases per level and way")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="/tmp/vh-bench-ray-")
    import ray
    from ray.cluster_utils import Cluster

    env = {"HLUK_PATH": str(instant_hluk(scratch)), "HLUK_CACHE_DIR": str(scratch / "cache")}
    os.environ.update(env)  # the in-process baseline: the node's settings
    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "env_vars": env},
    )
    name, _, value = NODE_MARK.partition("=")
    cluster.add_node(num_cpus=1, resources={"hyperlight": 64}, env_vars={**env, name: value})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        print(f"{os.cpu_count()} CPUs, instant hluk double, {args.cases} cases per level and way")
        print("at once   in-process p50   through Ray p50   added ms   ratio   cases/s ratio")
        for concurrency in LEVELS:
            cases = max(args.cases, 4 * concurrency)
            for url in (LOCAL, THROUGH_RAY):
                level(url, concurrency, 2 * concurrency)  # warm: worker processes, guests
            found: dict[str, list[tuple[float, float]]] = {LOCAL: [], THROUGH_RAY: []}
            for _ in range(2):
                for url in (LOCAL, THROUGH_RAY):
                    found[url].append(level(url, concurrency, cases))
            local_p50 = statistics.median(p50 for p50, _ in found[LOCAL])
            ray_p50 = statistics.median(p50 for p50, _ in found[THROUGH_RAY])
            local_rate = statistics.median(rate for _, rate in found[LOCAL])
            ray_rate = statistics.median(rate for _, rate in found[THROUGH_RAY])
            print(
                f"{concurrency:>7}   {local_p50 * 1000:>11.2f} ms   {ray_p50 * 1000:>12.2f} ms"
                f"   {(ray_p50 - local_p50) * 1000:>8.2f}   {ray_p50 / local_p50:>5.2f}"
                f"   {ray_rate / local_rate:>13.2f}"
            )
        workers, mib = worker_memory()
        print(f"the node holds {workers} Ray worker processes, {mib} MiB resident in all")
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
