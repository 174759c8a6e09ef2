"""What a `language: "pytest"` case costs over a `python` case, in one run.

The same check is run as a python solution (asserting, then printing) and as a pytest test file
(one test), alternately, one at a time, each guest warmed up first. It prints, for each, the
median wall time of run_code and the median execution_time (the guest's own run: the solution,
or the whole pytest session), and the pytest case's ratios to the python case's.

On hluk both guests restore a warm snapshot that holds their imports (pytest's included), so
execution_time is what the pytest case adds. The stand-in hluk runs the warm-exec (every
prepared import, pytest's included) again in every run, so its wall-time ratio also counts
importing pytest once per case, which hluk does not.

Usage: python benchmarks/bench_pytest.py [--cases N]  (the hluk on PATH or HLUK_PATH, else
the stand-in)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run_code import use_standin_unless_configured

from verl_hyperlight import run_code

CHECK = "def increment(x):\n    return x + 1\n"
PYTHON = CHECK + "assert increment(1) == 2\nprint('ok')\n"
PYTEST = CHECK + "def test_increment():\n    assert increment(1) == 2\n"


def one_case(language: str) -> tuple[float, float]:
    """run_code's wall time and the case's execution_time, in seconds."""
    code = PYTEST if language == "pytest" else PYTHON
    started = time.perf_counter()
    response, error = run_code("hyperlight://", code, None, 10, 30, 1024, language)
    wall = time.perf_counter() - started
    assert error is None and response is not None, error
    assert response["status"] == "Success", response
    return wall, float(response["run_result"]["execution_time"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=20, help="cases of each language")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        print("hluk:", use_standin_unless_configured(Path(scratch)))
        one_case("python")  # each guest's warm-up, charged to no case
        one_case("pytest")
        times: dict[str, list[tuple[float, float]]] = {"python": [], "pytest": []}
        for _ in range(args.cases):
            for language in times:
                times[language].append(one_case(language))
    medians = {
        language: (statistics.median(w for w, _ in runs), statistics.median(e for _, e in runs))
        for language, runs in times.items()
    }
    print(f"{'language':<10} {'wall p50 ms':>12} {'execution_time p50 ms':>22}")
    for language, (wall, execution) in medians.items():
        print(f"{language:<10} {wall * 1e3:>12.1f} {execution * 1e3:>22.1f}")
    (python_wall, python_run), (pytest_wall, pytest_run) = medians["python"], medians["pytest"]
    print(
        f"pytest / python: wall {pytest_wall / python_wall:.2f}x "
        f"(+{(pytest_wall - python_wall) * 1e3:.0f} ms), execution_time "
        f"{pytest_run / python_run:.1f}x (+{(pytest_run - python_run) * 1e3:.0f} ms)"
    )


if __name__ == "__main__":
    main()
