"""The guest runner: runs inside the micro-VM and runs the solution as `python solution.py` would.

hluk's driver is not CPython's command line: it runs code in the globals of a long-lived
``__main__`` with no ``__file__``, over a console that claims to be a terminal, and it neither
joins threads nor runs atexit handlers. This module closes each of those gaps for one case:

* the solution gets a fresh ``__main__`` in a writable directory of its own (its cwd and
  ``sys.path[0]``), with ``__file__`` and ``sys.argv[0]`` set as CPython sets them;
* its stdin is the case's input file, its stdout and stderr are files in guest memory, so
  nothing it prints crosses the console (a VM exit per write, ``\\n`` turned into ``\\r\\n``);
* at its end it runs CPython's exit sequence (thread exit hooks and joins, atexit, flush with
  status 120 on failure, module teardown) and only then copies the output out, framed with a
  per-case nonce the host chose, so no text the solution prints can pass for a frame.

It is sent to the guest as the text of hluk's ``--warm-exec`` (see ``warm_exec_code``), so its
import and the imports it prepares are part of the warm snapshot. It uses only the standard
library and must run on the guest's CPython.
"""

from __future__ import annotations

import base64
import builtins
import gc
import importlib
import io
import os
import sys
import time
import types
from typing import Any

# Frames of this module are left out of the solution's tracebacks under this file name.
RUNNER_FILENAME = "<verl-hyperlight runner>"
MODULE_NAME = "_verl_hyperlight_runner"
WORK_DIR = "/tmp/solution"
OUTPUT_DIR = "/tmp/.verl-hyperlight-output"
OUTPUT_LIMIT = 16 * 1024 * 1024
# The status of a solution stopped for printing more than OUTPUT_LIMIT: 128 + SIGXFSZ, what a
# process gets when it exceeds its file-size limit.
OUTPUT_LIMIT_STATUS = 153
# CPython's status when flushing stdout at exit fails.
FLUSH_FAILED_STATUS = 120
CHUNK = 1 << 20

# The real functions, taken before any solution can replace them.
_os_write = os.write
_os_exit = os._exit
_os_dup = os.dup
_os_open = os.open
_builtin_open = builtins.open
_monotonic = time.monotonic

_EXCEPTION_GROUP = getattr(builtins, "BaseExceptionGroup", None)
_STD_NAMES = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_FD_DIRS = ("/dev/fd/", "/proc/self/fd/")


def prepare(modules: list[str]) -> None:
    """Import the modules solutions commonly use, so the warm snapshot holds them."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:
            continue


class _Case:
    """The state of the one case this micro-VM runs."""

    def __init__(self, nonce: str, console: int) -> None:
        self.nonce = nonce.encode("ascii")
        self.console = console
        self.started = 0.0
        self.finished = False
        self.limit_hit: str | None = None

    def frame(self, *fields: bytes) -> None:
        line = b"\n" + self.nonce + b" " + b" ".join(fields) + b"\n"
        view = memoryview(line)
        while view:
            view = view[_os_write(self.console, view) :]

    def emit_output(self) -> None:
        for name in ("stdout", "stderr"):
            with _builtin_open(os.path.join(OUTPUT_DIR, name), "rb") as f:
                data = f.read(OUTPUT_LIMIT + 1)
            if len(data) > OUTPUT_LIMIT:
                data = data[:OUTPUT_LIMIT]
                self.limit_hit = self.limit_hit or name
            for start in range(0, len(data), CHUNK):
                self.frame(name.encode(), base64.b64encode(data[start : start + CHUNK]))

    def finish(self, status: int) -> None:
        """Copy the output out and report the status; a second call does nothing."""
        if self.finished:
            return
        self.finished = True
        elapsed = _monotonic() - self.started
        self.emit_output()
        limit = (self.limit_hit or "-").encode()
        self.frame(b"exit", b"%d" % status, b"%.6f" % elapsed, limit)


_case: _Case | None = None


class _CappedFile(io.FileIO):
    """The solution's stdout or stderr: a file in guest memory that stops the solution when it
    has received more than OUTPUT_LIMIT bytes, instead of letting it run on to its timeout."""

    written = 0
    stream = "stdout"

    def write(self, data: bytes) -> int:  # type: ignore[override]
        room = OUTPUT_LIMIT - self.written
        if len(data) > room:
            if room > 0:
                super().write(bytes(data)[:room])
            _stop_for_output_limit(self.stream)
        count = super().write(data) or 0
        self.written += count
        return count


def _stop_for_output_limit(stream: str) -> None:
    assert _case is not None
    _case.limit_hit = stream
    _case.finish(OUTPUT_LIMIT_STATUS)
    _os_exit(0)


def _std_fd(path: object) -> int | None:
    """The descriptor a /dev/std*, /dev/fd/N or /proc/self/fd/N path names, else None."""
    if isinstance(path, os.PathLike):
        path = path.__fspath__()
    if isinstance(path, bytes):
        path = path.decode("utf-8", "surrogateescape")
    if not isinstance(path, str):
        return None
    if path in _STD_NAMES:
        return _STD_NAMES[path]
    for prefix in _FD_DIRS:
        if path.startswith(prefix) and path[len(prefix) :].isdigit():
            return int(path[len(prefix) :])
    return None


def _open(file: object, *args: object, **kwargs: object) -> object:
    fd = _std_fd(file)
    if fd is not None:
        kwargs.pop("closefd", None)
        return _builtin_open(_os_dup(fd), *args, **kwargs)  # type: ignore[call-overload]
    return _builtin_open(file, *args, **kwargs)  # type: ignore[call-overload]


def _os_open_std(path: object, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
    fd = _std_fd(path)
    if fd is not None:
        return _os_dup(fd)
    return _os_open(path, flags, mode, dir_fd=dir_fd)  # type: ignore[arg-type]


def _exit_now(status: int) -> None:
    """os._exit for the solution: what it wrote to its descriptors is kept, as on the host."""
    assert _case is not None
    _case.finish(status & 0xFF)
    _os_exit(status)


def _without_runner_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    frames = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename != RUNNER_FILENAME:
            frames.append(tb)
        tb = tb.tb_next
    kept = None
    for frame_tb in reversed(frames):
        kept = types.TracebackType(kept, frame_tb.tb_frame, frame_tb.tb_lasti, frame_tb.tb_lineno)
    return kept


def _strip_runner_frames(exc: BaseException) -> None:
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = _without_runner_frames(current.__traceback__)
        stack += [e for e in (current.__cause__, current.__context__) if e is not None]
        if _EXCEPTION_GROUP is not None and isinstance(current, _EXCEPTION_GROUP):
            stack += list(current.exceptions)


def _print_uncaught(exc: BaseException) -> None:
    _strip_runner_frames(exc)
    try:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except BaseException as hook_error:
        print("Error in sys.excepthook:", file=sys.stderr)
        sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
        print("\nOriginal exception was:", file=sys.stderr)
        sys.__excepthook__(type(exc), exc, exc.__traceback__)


def _exit_status(exc: BaseException) -> int:
    """The status CPython gives an exception that reaches the top of `python solution.py`."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        try:
            sys.stderr.write(f"{code}\n")
        except Exception:
            pass
        return 1
    _print_uncaught(exc)
    return 1


def _flush_std_files() -> bool:
    """Flush sys.stdout and sys.stderr as CPython does at exit; False when stdout failed."""
    ok = True
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except Exception:
            if name == "stdout":
                ok = False
                sys.unraisablehook(_unraisable(stream))  # type: ignore[arg-type]
            else:
                ok = False
    return ok


def _unraisable(obj: object) -> object:
    exc_type, exc_value, exc_tb = sys.exc_info()
    return types.SimpleNamespace(
        exc_type=exc_type, exc_value=exc_value, exc_traceback=exc_tb, err_msg=None, object=obj
    )


def _clear_module(namespace: dict[str, object]) -> None:
    """Tear down a module's globals in the order CPython does at exit, so __del__ runs."""
    for key in list(namespace):
        if key.startswith("_") and not key.startswith("__") and namespace[key] is not None:
            namespace[key] = None
    for key in list(namespace):
        if key != "__builtins__" and namespace[key] is not None:
            namespace[key] = None


def _interpreter_exit(status: int, namespace: dict[str, object]) -> int:
    """CPython's Py_FinalizeEx, as far as a solution can observe it."""
    import atexit
    import threading

    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException as exc:
        _print_uncaught(exc)
    atexit._run_exitfuncs()
    if not _flush_std_files():
        status = FLUSH_FAILED_STATUS
    gc.collect()
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
    _clear_module(namespace)
    gc.collect()
    if not _flush_std_files():
        status = FLUSH_FAILED_STATUS
    return status


def _std_streams() -> tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper]:
    """New sys.stdin/stdout/stderr over descriptors 0-2, built as CPython builds them for
    files and pipes: block-buffered stdout, line-buffered stderr with backslashreplace."""
    stdin = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "rb", closefd=False)), encoding="utf-8", errors="strict"
    )
    stdin.mode = "r"  # type: ignore[misc]
    streams: list[Any] = [stdin]
    for fd, name, errors in ((1, "stdout", "strict"), (2, "stderr", "backslashreplace")):
        raw = _CappedFile(fd, "wb", closefd=False)
        raw.stream = name
        text = io.TextIOWrapper(
            io.BufferedWriter(raw),  # type: ignore[type-var]
            encoding="utf-8",
            errors=errors,
            newline="\n",
            line_buffering=fd == 2,
        )
        text.mode = "w"  # type: ignore[misc]
        streams.append(text)
    for stream, name in zip(streams, ("<stdin>", "<stdout>", "<stderr>"), strict=True):
        stream.buffer.raw.name = name
    return streams[0], streams[1], streams[2]


def _redirect_descriptors(case_dir: str) -> None:
    os.makedirs(OUTPUT_DIR, exist_ok=True)
    targets = [
        (0, os.path.join(case_dir, "stdin"), os.O_RDONLY),
        (1, os.path.join(OUTPUT_DIR, "stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, os.path.join(OUTPUT_DIR, "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ]
    for fd, path, flags in targets:
        opened = _os_open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)


def _reseed() -> None:
    """The snapshot froze one random state; every micro-VM draws its own, as a new process."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _install_main(path: str) -> types.ModuleType:
    from importlib.machinery import SourceFileLoader

    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__cached__ = None  # type: ignore[attr-defined]
    module.__loader__ = SourceFileLoader("__main__", path)
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    module.__annotations__ = {}
    sys.modules["__main__"] = module
    return module


def main(case_dir: str, nonce: str) -> None:
    """Run the case in `case_dir` (solution.py, stdin) and report it on the console."""
    global _case
    console = _os_dup(1)
    case = _Case(nonce, console)
    _case = case
    saved = (sys.stdin, sys.stdout, sys.stderr, sys.modules["__main__"])
    saved_fds = [_os_dup(fd) for fd in (0, 1, 2)]

    os.makedirs(WORK_DIR, exist_ok=True)
    path = os.path.join(WORK_DIR, "solution.py")
    with _builtin_open(os.path.join(case_dir, "solution.py"), "rb") as f:
        source = f.read()
    with _builtin_open(path, "wb") as f:
        f.write(source)
    _redirect_descriptors(case_dir)
    streams = _std_streams()
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]
    os.chdir(WORK_DIR)
    sys.path[:] = [WORK_DIR, *(p for p in sys.path if p not in ("", "."))]
    sys.argv = [path]
    _reseed()
    builtins.open = io.open = _open  # type: ignore[assignment]
    os.open = _os_open_std
    os._exit = _exit_now  # type: ignore[assignment]
    module = _install_main(path)

    case.frame(b"start")
    case.started = _monotonic()
    try:
        code = compile(source, path, "exec", dont_inherit=True)
        exec(code, module.__dict__)
        status = 0
    except BaseException as exc:
        status = _exit_status(exc)
    status = _interpreter_exit(status, module.__dict__)
    case.finish(status)

    builtins.open = io.open = _builtin_open
    os.open, os._exit = _os_open, _os_exit
    for fd, saved_fd in enumerate(saved_fds):
        os.dup2(saved_fd, fd)
        os.close(saved_fd)
    sys.stdin, sys.stdout, sys.stderr, sys.modules["__main__"] = saved
