"""The stand-in's guest driver: what hluk's Python driver does inside the micro-VM.

The stand-in hluk runs this file's text with ``python -s -X utf8 -c`` inside bubblewrap,
with only PATH (and, for a warm run, the snapshot's PYTHONHASHSEED) in its environment. It
reproduces the driver's contract (hyperlight-unikraft's drivers/python/hl_pydriver.c and
drivers/hl_py.h) and nothing kinder: the code runs in the
globals of ``__main__`` with no ``__file__``, ``sys.argv`` is the driver's name, threads are not
joined and atexit handlers do not run when the code returns, a failed call says
``hl_driver: dispatch callback failed`` on the console, and the status is reported through a
private descriptor so the stand-in can tell "the driver returned N" from "the guest process died".

A warm snapshot freezes the interpreter as it was after the warm-exec: its string-hash seed (the
stand-in passes the snapshot's) and the state of ``random`` and ``numpy.random`` if they were
imported by then (seeded here with the snapshot's seed). The agent image's driver imports them
at boot.
"""

import json
import os
import runpy
import shlex
import sys
import time
import traceback

# The stand-in compiles this file under this name; its frames are left out of tracebacks, as
# the real driver's C frames are.
DRIVER_FILENAME = "<hl_driver>"


def _status_of(exc: BaseException) -> int:
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        print(code, file=sys.stderr)
        return 1
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == DRIVER_FILENAME:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)
    return 1


def _clean_main_globals() -> dict:
    namespace = sys.modules["__main__"].__dict__
    keep = {"__name__", "__doc__", "__package__", "__loader__", "__spec__", "__builtins__"}
    for name in list(namespace):
        if name not in keep:
            del namespace[name]
    namespace["__annotations__"] = {}
    return namespace


# What the driver prints on the console when a call ends with a status other than 0.
CALL_FAILED = b"hl_driver: dispatch callback failed\n"


def _preimport(names: list[str]) -> None:
    """What the runtime's driver imports at boot, before any warm-exec (the agent image's)."""
    for name in names:
        try:
            __import__(name)
        except ImportError:
            pass


def _freeze_random(seed: int | None) -> None:
    """Put the generators imported so far in the state the snapshot holds them in: the same
    in every run of one snapshot. Nothing is imported here that was not imported already."""
    if seed is None:
        return
    if "random" in sys.modules:
        sys.modules["random"].seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "random"):
        numpy.random.seed(seed % 2**32)


def _run(config: dict) -> int:
    namespace = _clean_main_globals()
    _preimport(config["preimport"])
    if config["warm_exec"] is not None:
        exec(compile(config["warm_exec"], "<string>", "exec"), namespace)
    _freeze_random(config["random_seed"])
    if config["guest_exec"] is not None:
        argv = shlex.split(config["guest_exec"])
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    else:
        exec(compile(config["code"], "<string>", "exec"), namespace)
    return 0


def _freeze_cpu_clocks() -> None:
    """The guest documents no CPU-time clock: time.process_time() does not advance there. The
    host's does, which would let a solution (or the runner) rely on it here and fail in hluk."""
    frozen_ns = time.process_time_ns()
    time.process_time_ns = lambda: frozen_ns
    time.process_time = lambda: frozen_ns / 1e9


def main() -> None:
    _freeze_cpu_clocks()
    config = json.loads(sys.argv[2])
    status_fd = config["status_fd"]
    os.set_inheritable(status_fd, False)
    sys.argv = [config["argv0"]]
    # Only PATH and the --env entries reach the guest; CPython itself adds PWD/LC_CTYPE here.
    os.environ.clear()
    os.environ.update(config["environ"])
    try:
        status = _run(config)
    except BaseException as exc:
        status = _status_of(exc)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if status != 0:
        try:
            os.write(2, CALL_FAILED)
        except OSError:
            pass
    os.write(status_fd, b"%d\n" % status)
    # The call ends here: no thread is joined, no atexit handler runs.
    os._exit(status)


if __name__ == "_hl_driver":
    main()
