"""The "Known limits" sentences (docs/known-limits.md) that the corpus's documented
divergences quote, word for word: `verl-hyperlight selftest` reports a program that differs as
documented with its sentence, and the test suite checks that the docs still say each."""

STDIN_IS_A_FILE = "stdin is a file (as on Codeforces), so `os.fstat(0).st_size` is its size."
NO_FORK = "No `os.fork()`: no multiprocessing pools, no `os.system`, no shell."
NO_CPU_CLOCK = (
    "`time.process_time()` does not advance; timer signals (`signal.alarm`, `setitimer`) "
    "never fire."
)
NO_FAULTHANDLER_REPORT = "With `faulthandler` enabled, such an end prints no `faulthandler` report;"
RUNNER_FRAMES_IN_DUMPS = (
    "`faulthandler.dump_traceback` shows the runner's frames (and its driver's) beneath the "
    "solution's."
)
SHALLOWER_C_RECURSION = (
    "Recursion through C code (`functools.lru_cache`, `repr`, ...) fails a few levels sooner "
    "than under `python solution.py`: the runner's own calls use some of CPython's C recursion "
    "budget, which a solution cannot raise (`sys.setrecursionlimit` is not affected)."
)
NO_OUTPUT_ON_TIMEOUT = (
    "On a timeout, the solution's partial output is not returned (stdout and stderr are "
    "empty); verl does not read them for a timeout."
)
