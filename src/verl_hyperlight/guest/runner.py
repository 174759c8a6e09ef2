"""The guest runner: runs inside the micro-VM and runs the solution as `python solution.py` would.

hluk's driver is not CPython's command line: it runs code in the globals of a long-lived
``__main__`` with no ``__file__``, over a console that claims to be a terminal, and it neither
joins threads nor runs atexit handlers. This module closes each of those gaps for one case:

* the solution gets a fresh ``__main__`` in a writable directory of its own (its cwd and
  ``sys.path[0]``), with ``__file__`` and ``sys.argv[0]`` set as CPython sets them;
* its stdin is the case's input file, its stdout and stderr are files in guest memory, so
  nothing it prints crosses the console (a VM exit per write, ``\\n`` turned into ``\\r\\n``);
  the three streams are built as CPython builds them for pipes;
* the runner's own frames stay out of sight: out of tracebacks, and out of the recursion
  depth, so a solution reaches exactly the depth it reaches under ``python solution.py``;
* at its end it runs CPython's exit sequence (thread exit hooks and joins, atexit, flush with
  status 120 on failure, teardown of ``__main__``), then reports the end (which stops the
  host's clock) and copies the output out, in the frames of ``protocol``, marked with a
  per-case nonce the host chose, so no text the solution prints can pass for a frame; the
  report is made once, by whichever thread ends the solution first, and an output file past
  OUTPUT_LIMIT, however it got there, ends the solution with OUTPUT_LIMIT_STATUS.

It is sent to the guest, with ``protocol``, as the text of hluk's ``--warm-exec`` (see
``warm_exec_code``), so its import and the imports it prepares are part of the warm snapshot.
It uses only the standard library and must run on the guest's CPython.
"""

from __future__ import annotations

import _thread
import atexit
import binascii
import builtins
import functools
import gc
import importlib
import io
import json
import operator
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from typing import Any

from . import protocol

# Frames of this module are left out of the solution's tracebacks under this file name.
RUNNER_FILENAME = "<verl-hyperlight runner>"
PACKAGE_NAME = "_verl_hyperlight_guest"
MODULE_NAME = PACKAGE_NAME + ".runner"
WORK_DIR = "/tmp/solution"
OUTPUT_DIR = "/tmp/.verl-hyperlight-output"
OUTPUT_PATHS = {"stdout": OUTPUT_DIR + "/stdout", "stderr": OUTPUT_DIR + "/stderr"}
# Directories every Linux host has, which solutions write to (Sandbox Fusion's own test writes
# /mnt/b); the guest's root file system has none of them until the warm-up makes them.
HOST_DIRECTORIES = ("/mnt", "/opt", "/srv", "/home", "/var/tmp")
# Where a pytest guest mounts pytest (read-only), and how a case runs under it: the test file
# in the solution's directory, and `pytest FILE` as pip's console script runs it, from where
# pip installs it (its directory, not the case's, is first on sys.path).
PYTEST_MOUNT = "/verl-hyperlight-pytest"
PYTEST_FILE = "test_solution.py"
PYTEST_SCRIPT = "/usr/local/bin/pytest"
PYTEST_SCRIPT_SOURCE = (
    "import re\n"
    "import sys\n"
    "from _pytest.config import _console_main\n"
    "if __name__ == '__main__':\n"
    "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
    "    sys.exit(_console_main())\n"
)
# CPython's status when flushing stdout at exit fails.
FLUSH_FAILED_STATUS = 120
# A compiled program's ELF type: a position-independent executable (ET_DYN).
ELF_DYNAMIC = 3
# The status of a program the guest could not start: a shell's for a command it cannot run.
PROGRAM_UNRUNNABLE_STATUS = 126
# The status the guest ends with when the runner cannot report the case (the solution broke
# what it reports with): the host answers it as the solution's failure.
REPORT_FAILED_STATUS = 1
# CPython sizes the buffers of its standard streams by the descriptor's st_blksize: a page for
# the pipes Sandbox Fusion gives it.
PIPE_BUFFER_SIZE = 4096
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1

# The real functions, taken before any solution can replace them: the report at the end of a
# case uses nothing a solution reaches through a module.
_os_write = os.write
_os_exit = os._exit
_os_dup = os.dup
_os_open = os.open
_os_close = os.close
_os_fstat = os.fstat
_os_pread = os.pread
_os_read = os.read
_os_dup2 = os.dup2
_path_join = os.path.join
_b2a_base64 = binascii.b2a_base64
_builtin_open = builtins.open
_monotonic = time.monotonic
_allocate_lock = _thread.allocate_lock
_setrecursionlimit = sys.setrecursionlimit
_getrecursionlimit = sys.getrecursionlimit
_start_new_thread = _thread.start_new_thread
_getpid = os.getpid
_bytearray = bytearray
_kill = os.kill
_pthread_kill = signal.pthread_kill
_raise_signal = signal.raise_signal
_get_ident = _thread.get_ident
# The runner is imported in the interpreter's main thread, where signal handlers run.
_main_thread_id = _thread.get_ident()
# From 3.13 threading starts its threads with this one instead.
_start_joinable = getattr(_thread, "start_joinable_thread", None)

_EXCEPTION_GROUP = getattr(builtins, "BaseExceptionGroup", None)
_STD_NAMES = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_FD_DIRS = ("/dev/fd/", "/proc/self/fd/")
_MISSING = object()
# What a signal does to a process that has no handler for it, when it does not end it.
_IGNORED_BY_DEFAULT = {signal.SIGCHLD, signal.SIGCONT, signal.SIGURG, signal.SIGWINCH}
_STOPS_BY_DEFAULT = {signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}
# CPython 3.12 starts no thread once the main code has ended; 3.10, 3.11 and 3.13 still start
# them while they join threads and run the atexit handlers.
_THREADS_AT_SHUTDOWN = sys.version_info[:2] != (3, 12)


def prepare(modules: list[str]) -> None:
    """Import the modules solutions commonly use, and make the directories every Linux host
    has, so the warm snapshot holds them."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:
            continue
    for directory in HOST_DIRECTORIES:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError:
            continue


def prepare_pytest() -> None:
    """Make this guest a pytest guest: pytest importable from its mount, and imported with the
    plugins it loads by default, so the warm snapshot holds them; its cases then run under
    pytest (see main)."""
    global _language
    sys.path.append(PYTEST_MOUNT)
    config = importlib.import_module("_pytest.config")
    plugins = [f"_pytest.{name}" for name in config.default_plugins]
    # And what a pytest session imports as it starts (its debugging plugin's pdb, its argcomplete).
    prepare(["pytest", *plugins, "_pytest._argcomplete", "pdb", "readline", "faulthandler"])
    # What the warm-up made stays for the guest's life: out of the collections a case's end
    # runs (three, as CPython's exit does), which would otherwise walk pytest's objects each
    # time, several times the cost of the case's own.
    gc.freeze()
    _language = "pytest"


def _unraisable_hook_args_type() -> Callable[[tuple[object, ...]], Any]:
    # sys.UnraisableHookArgs is not exposed; the one argument sys.unraisablehook gets is.
    seen: list[object] = []

    class _Raises:
        def __del__(self) -> None:
            raise RuntimeError

    def record(args: object) -> None:
        seen.append(args)

    hook, sys.unraisablehook = sys.unraisablehook, record
    try:
        _Raises()
    finally:
        sys.unraisablehook = hook
    return type(seen[0])


_UnraisableHookArgs = _unraisable_hook_args_type()


class _Case:
    """The state of the one case this micro-VM runs."""

    def __init__(self, nonce: str, console: int) -> None:
        self.nonce = nonce.encode("ascii")
        self.console = console
        self.started = 0.0
        # The output files, as the runner opened them: what the solution wrote through any
        # descriptor, by any process, whatever it did to their paths.
        self.outputs: dict[str, int] = {}
        self.output_ids: dict[tuple[int, int], str] = {}
        # The request's files to fetch once the solution has ended.
        self.fetch: list[str] = []
        # Held by the one thread that reports the case, and never released: a thread that ends
        # the solution after that (os._exit in a daemon thread while the main thread copies the
        # output out) waits here until the micro-VM is gone.
        self.reporting = _allocate_lock()
        # Python frames beneath the solution's module frame; under `python solution.py` there
        # are none, so the recursion limit is raised by this many and threads start this deep.
        self.frames_below = 0
        # Set once the interpreter would be finalizing: CPython starts no thread from then on.
        self.finalizing = False
        # The functions the runner replaced for the solution, with their originals.
        self.replaced: list[tuple[object, str, object]] = []
        # The report's frames not yet written, while it is being made (see CONSOLE_WRITE).
        self.batch: bytearray | None = None

    def frame(self, kind: bytes, *fields: bytes) -> None:
        data = protocol.frame(self.nonce, kind, *fields)
        if self.batch is None:
            self.write_console(data)
            return
        if len(self.batch) + len(data) > protocol.CONSOLE_WRITE:
            self.write_console(self.batch)
            self.batch.clear()
        self.batch += data

    def write_console(self, data: bytes | bytearray) -> None:
        view = memoryview(data)
        while view:
            view = view[_os_write(self.console, view) :]

    def output_size(self, name: str) -> int:
        return _os_fstat(self.outputs[name]).st_size

    def open_fetched(self) -> list[tuple[int | None, int]]:
        """Each file to fetch: a descriptor and its size, or None and what became of it.
        Only regular files are read (a FIFO the solution left there would block), found as
        the service finds them: joined to the solution's directory."""
        found: list[tuple[int | None, int]] = []
        total = 0
        for path in self.fetch:
            fd, size = None, protocol.FILE_MISSING
            try:
                fd = _os_open(_path_join(WORK_DIR, path), os.O_RDONLY | os.O_NONBLOCK)
                info = _os_fstat(fd)
                if stat.S_ISREG(info.st_mode):
                    size = info.st_size
            except (OSError, ValueError):
                pass
            if size >= 0 and total + size > protocol.FILES_OUT_LIMIT:
                total = protocol.FILES_OUT_LIMIT + 1  # this one and every later one
                size = protocol.FILE_LEFT_OUT
            if size < 0 and fd is not None:
                _os_close(fd)
                fd = None
            total += max(size, 0)
            found.append((fd, size))
        return found

    def copy_out(self, kind: bytes, fd: int, size: int, *fields: bytes) -> None:
        for offset in range(0, size, protocol.CHUNK):
            chunk = _os_pread(fd, min(protocol.CHUNK, size - offset), offset)
            self.frame(kind, *fields, _b2a_base64(chunk, newline=False))

    def finish(self, status: int, limit_hit: str | None = None, last: bool = False) -> None:
        """Report the solution's end, then copy its output out; only the first call reports,
        any later one waits for the micro-VM to end. `last`: the guest ends once it is
        reported (said on the done frame, for a notebook's host)."""
        self.reporting.acquire()
        elapsed = _monotonic() - self.started
        try:
            sizes = {name: self.output_size(name) for name in OUTPUT_PATHS}
            if limit_hit is None:
                limit_hit = next(
                    (name for name, size in sizes.items() if size > protocol.OUTPUT_LIMIT), None
                )
            if limit_hit is not None:
                status = protocol.OUTPUT_LIMIT_STATUS
            kept = [min(sizes[name], protocol.OUTPUT_LIMIT) for name in OUTPUT_PATHS]
            fetched = self.open_fetched()
            files = tuple(size for _, size in fetched)
            end = protocol.End(status, elapsed, limit_hit, (kept[0], kept[1]), files)
            self.batch = _bytearray()
            self.frame(protocol.END, *protocol.end_fields(end))
            for (name, output), size in zip(self.outputs.items(), kept, strict=True):
                self.copy_out(name.encode("ascii"), output, size)
            for index, (fetch, size) in enumerate(fetched):
                if fetch is not None:
                    self.copy_out(protocol.FILE, fetch, size, b"%d" % index)
            self.frame(protocol.DONE, *([protocol.LAST] if last else []))
            self.write_console(self.batch)
            self.batch = None
        except BaseException:
            # The solution broke what the report needs (closed the console or the output
            # files): the guest ends here, and the host answers the run as its failure.
            _os_exit(REPORT_FAILED_STATUS)


_case: _Case | None = None
# What this guest's cases run as: "python" (`python solution.py`), or "pytest" once
# prepare_pytest has run in its warm-up.
_language = "python"


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


class _Hidden:
    """An exception leaving this block loses the runner's frames, as if raised by the C function
    the runner stands in for. (Leaving a with block re-raises without adding a frame. Before
    3.11 it re-raises with the traceback it caught, so there the runner's frames stay.)"""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            exc.__traceback__ = _without_runner_frames(exc.__traceback__)


_hidden = _Hidden()


class _CappedFile(io.FileIO):
    """The solution's stdout or stderr: a file in guest memory that stops the solution when it
    has received more than OUTPUT_LIMIT bytes, instead of letting it run on to its timeout."""

    stream = "stdout"

    def write(self, data: bytes) -> int:  # type: ignore[override]
        with _hidden:
            assert _case is not None
            # The file's size, not this object's count: the solution (and its children) may
            # also write to it through other descriptors.
            room = protocol.OUTPUT_LIMIT - _case.output_size(self.stream)
            if len(data) > room:
                if room > 0:
                    super().write(bytes(data)[:room])
                _stop_for_output_limit(self.stream)
                return max(room, 0)
            return super().write(data) or 0


def _stop_for_output_limit(stream: str) -> None:
    assert _case is not None
    _case.finish(0, stream, last=True)
    _os_exit(0)


def _write(fd: int, data: object) -> int:
    """os.write for the solution: a write that takes an output file past OUTPUT_LIMIT stops the
    solution, as one through its streams does."""
    with _hidden:
        count = _os_write(fd, data)  # type: ignore[arg-type]
    assert _case is not None
    try:
        info = _os_fstat(fd)
    except OSError:
        return count
    stream = _case.output_ids.get((info.st_dev, info.st_ino))
    if stream is not None and info.st_size > protocol.OUTPUT_LIMIT:
        _stop_for_output_limit(stream)
    return count


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
    with _hidden:
        fd = _std_fd(file)
        if fd is not None:
            kwargs.pop("closefd", None)
            return _builtin_open(_os_dup(fd), *args, **kwargs)  # type: ignore[call-overload]
        return _builtin_open(file, *args, **kwargs)  # type: ignore[call-overload]


def _os_open_std(path: object, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
    with _hidden:
        fd = _std_fd(path)
        if fd is not None:
            return _os_dup(fd)
        return _os_open(path, flags, mode, dir_fd=dir_fd)  # type: ignore[arg-type]


def _c_int(value: object) -> int:
    """`value` converted as CPython converts an argument to a C int."""
    number = operator.index(value)  # type: ignore[arg-type]
    if not -INT_MAX - 1 <= number <= INT_MAX:
        raise OverflowError("Python int too large to convert to C int")
    return number


def _exit_now(status: object) -> None:
    """os._exit for the solution: what it wrote to its descriptors is kept, as on the host."""
    with _hidden:
        code = _c_int(status)
    assert _case is not None
    _case.finish(code & 0xFF, last=True)
    _os_exit(code)


def _die_by_signal(signum: int) -> None:
    """The end of a process killed by `signum`: what it had written is kept, what it buffered
    is lost, and the status is the one `subprocess` reports for it, -signum. The guest kernel
    would not deliver the signal, or would end the guest with status signum and its output
    unreported."""
    assert _case is not None
    _case.finish(-signum, last=True)
    _os_exit(128 + signum)


def _signal_self(signum: object, frame: types.FrameType | None) -> bool:
    """Deliver `signum` to the solution's own process, from its main thread, as CPython does:
    its Python handler runs with `frame`, or its default action is taken. False when it is left
    to the real call: a signal number the call refuses, one that stops the process, one with a
    handler set outside Python, or one sent from another thread (whose handler would run later,
    in the main thread)."""
    if _get_ident() != _main_thread_id or not isinstance(signum, int):
        return False
    signum = int(signum)
    if not 0 < signum < signal.NSIG:
        return False
    handler = signal.getsignal(signum)
    if handler is signal.SIG_IGN:
        return True
    if handler is signal.SIG_DFL:
        if signum in _IGNORED_BY_DEFAULT:
            return True
        if signum in _STOPS_BY_DEFAULT:
            return False
        _die_by_signal(signum)
    if not callable(handler):
        return False
    handler(signum, frame)
    return True


def _os_kill(pid: int, signum: int) -> None:
    """os.kill for the solution: a signal to its own process is delivered by the runner."""
    with _hidden:
        if not (pid == _getpid() and _signal_self(signum, sys._getframe(1))):
            _kill(pid, signum)


def _signal_raise_signal(signum: int) -> None:
    """signal.raise_signal for the solution, delivered by the runner."""
    with _hidden:
        if not _signal_self(signum, sys._getframe(1)):
            _raise_signal(signum)


def _signal_pthread_kill(thread_id: int, signum: int) -> None:
    """signal.pthread_kill for the solution: a signal to its main thread is delivered by the
    runner."""
    with _hidden:
        if not (thread_id == _main_thread_id and _signal_self(signum, sys._getframe(1))):
            _pthread_kill(thread_id, signum)


def _os_abort() -> None:
    """os.abort for the solution: SIGABRT ends the process whatever handles it, as abort()."""
    _die_by_signal(signal.SIGABRT)


def _frame_depth(frame: types.FrameType | None) -> int:
    depth = 0
    while frame is not None:
        depth += 1
        frame = frame.f_back
    return depth


def _set_recursion_limit(new_limit: object) -> None:
    """sys.setrecursionlimit for the solution, which counts none of the runner's frames."""
    with _hidden:
        limit = _c_int(new_limit)
        if limit < 1:
            raise ValueError("recursion limit must be greater or equal than 1")
        assert _case is not None
        depth = _frame_depth(sys._getframe(1)) - _case.frames_below
        if depth >= limit:
            raise RecursionError(
                f"cannot set the recursion limit to {limit} at the recursion depth {depth}: "
                "the limit is too low"
            )
        _setrecursionlimit(min(limit + _case.frames_below, INT_MAX))


def _get_recursion_limit() -> int:
    """sys.getrecursionlimit for the solution."""
    assert _case is not None
    return _getrecursionlimit() - _case.frames_below


def _descend(levels: int, function: Callable[..., object], args: tuple[object, ...]) -> None:
    if levels > 0:
        _descend(levels - 1, function, args)
    else:
        function(*args)


def _refuse_after_main() -> None:
    assert _case is not None
    if _case.finalizing:
        raise RuntimeError("can't create new thread at interpreter shutdown")


def _start_thread(function: Callable[..., object], args: tuple[object, ...]) -> int:
    """threading's thread starter up to 3.12: refuses once the solution has ended, and starts
    the thread as deep as the solution's main code runs, so both reach the depth they reach in
    CPython."""
    with _hidden:
        _refuse_after_main()
        assert _case is not None
        return _start_new_thread(_descend, (_case.frames_below - 1, function, args))


def _start_joinable_thread(
    function: Callable[[], object], handle: object = None, daemon: bool = True
) -> object:
    """threading's thread starter from 3.13, as _start_thread. (The partial is C: the thread's
    first Python frame is _descend's, as there.)"""
    with _hidden:
        _refuse_after_main()
        assert _case is not None and _start_joinable is not None
        start = functools.partial(_descend, _case.frames_below - 1, function, ())
        return _start_joinable(start, handle=handle, daemon=daemon)


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


def _write_stderr(text: str) -> None:
    try:
        sys.stderr.write(text)
    except Exception:
        pass


def _write_unraisable(exc: BaseException, obj: object, err_msg: str | None = None) -> None:
    """CPython's PyErr_WriteUnraisable (PyErr_FormatUnraisable with `err_msg`): the exception
    goes to sys.unraisablehook."""
    _strip_runner_frames(exc)
    args = _UnraisableHookArgs((type(exc), exc, exc.__traceback__, err_msg, obj))
    try:
        sys.unraisablehook(args)
    except BaseException:
        sys.__unraisablehook__(args)


def _system_exit_status(exc: SystemExit) -> int:
    """The status CPython exits with for a SystemExit, printing its payload as it does."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        if -LONG_MAX - 1 <= code <= LONG_MAX:
            return code & 0xFF
        # CPython's conversion to a C long fails and leaves the error behind, reported as
        # unraisable while it shuts down from 3.12 (named as such from 3.13), dropped before;
        # the status is that of -1.
        overflow = OverflowError("Python int too large to convert to C long")
        if sys.version_info >= (3, 13):
            _write_unraisable(overflow, None, "Exception ignored on threading shutdown")
        elif sys.version_info >= (3, 12):
            _write_unraisable(overflow, None)
        return 0xFF
    try:
        text = str(code)
    except Exception as exc:
        # CPython's write of the payload fails, and the error is reported as it shuts down.
        _write_stderr("\n")
        _write_unraisable(exc, None)
        return 1
    _write_stderr(f"{text}\n")
    return 1


def _exit_status(exc: BaseException) -> int:
    """CPython's PyErr_Print for an exception that ends `python solution.py`, and the status the
    interpreter then exits with. Call it outside any except block, and keep no reference to the
    exception: the hook then gets it as CPython hands it over, with no exception being handled
    and no reference of the runner's (a dump of it, which CPython prints when sys.stderr is
    closed, shows its reference count)."""
    if isinstance(exc, SystemExit):
        return _system_exit_status(exc)
    # A KeyboardInterrupt (exactly) that ends the main code makes CPython kill itself with
    # SIGINT once it has shut down, unless the hook exits first.
    status = -signal.SIGINT if type(exc) is KeyboardInterrupt else 1
    _strip_runner_frames(exc)
    sys.last_exc = exc  # type: ignore[attr-defined,unused-ignore]
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
    args = (type(exc), exc, exc.__traceback__)
    del exc
    hook = getattr(sys, "excepthook", _MISSING)
    if hook is _MISSING:
        _write_stderr("sys.excepthook is missing\n")
        sys.__excepthook__(*args)
        return status
    try:
        hook(*args)  # type: ignore[operator]
    except SystemExit as hook_exit:
        return _system_exit_status(hook_exit)
    except BaseException as hook_error:
        _strip_runner_frames(hook_error)
        _write_stderr("Error in sys.excepthook:\n")
        sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
        _write_stderr("\nOriginal exception was:\n")
        sys.__excepthook__(*args)
    return status


def _flush_io() -> None:
    # As CPython flushes once the script's code has ended, before it reports an exception:
    # errors are ignored.
    for name in ("stderr", "stdout"):
        try:
            getattr(sys, name).flush()
        except Exception:
            pass


def _flush_std_files() -> bool:
    """Flush sys.stdout and sys.stderr as CPython does at exit; False when one failed."""
    ok = True
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except Exception as exc:
            ok = False
            if name == "stdout" and sys.version_info >= (3, 13):
                _write_unraisable(exc, None, "Exception ignored on flushing sys.stdout")
            elif name == "stdout":
                _write_unraisable(exc, stream)
    return ok


def _clear_module(namespace: dict[Any, Any]) -> None:
    """Clear a module's globals in the order CPython does for a module still alive at exit."""
    for key in list(namespace):
        underscored = isinstance(key, str) and key[:1] == "_" and key[1:2] != "_"
        if underscored and namespace[key] is not None:
            namespace[key] = None
    for key in list(namespace):
        if isinstance(key, str) and key != "__builtins__" and namespace[key] is not None:
            namespace[key] = None


def _finalize_main(main: weakref.ref[types.ModuleType]) -> None:
    """CPython's finalize_modules, as the solution's __main__ sees it: sys's special names
    cleared, every module dropped from sys.modules (so that nothing can be imported, and a
    traceback shows no source line) and collecting __main__ then runs the destructors of its
    globals, and a module still alive after that cleared name by name. The modules are put
    back for the runner once the solution's teardown is over."""
    saved = sys.path, sys.argv, sys.meta_path
    for name in ("path", "argv", "last_exc", "last_type", "last_value", "last_traceback"):
        setattr(sys, name, None)
    sys.meta_path = None  # type: ignore[assignment]
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
    modules = dict(sys.modules)
    del modules["__main__"]
    sys.modules.clear()
    gc.collect()
    module = main()
    if module is not None:
        _clear_module(module.__dict__)
        del module
    gc.collect()
    sys.modules.update(modules)
    sys.path, sys.argv, sys.meta_path = saved


def _interpreter_exit(status: int, main: weakref.ref[types.ModuleType]) -> int:
    """CPython's Py_FinalizeEx, as far as a solution can observe it."""
    solution_hook = sys.unraisablehook

    def unraisable_hook(args: Any) -> None:
        # CPython reports an error of a C callback (an atexit handler such as sys.exit) with
        # the frame running at the time, and none runs while it finalizes; here the runner's
        # would, so it is dropped.
        traceback = _without_runner_frames(args.exc_traceback)
        solution_hook(
            _UnraisableHookArgs(
                (args.exc_type, args.exc_value, traceback, args.err_msg, args.object)
            )
        )

    sys.unraisablehook = unraisable_hook
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException as exc:
        _write_unraisable(exc, threading)
    atexit._run_exitfuncs()
    assert _case is not None
    _case.finalizing = True
    if sys.unraisablehook is unraisable_hook:
        sys.unraisablehook = solution_hook
    # A death by signal (a negative status) comes after the flush, whatever it did.
    if not _flush_std_files() and status >= 0:
        status = FLUSH_FAILED_STATUS
    gc.collect()
    _finalize_main(main)
    # What the teardown printed is flushed as CPython's streams flush when they are destroyed:
    # silently, whatever happens.
    _flush_io()
    return status


def _std_streams() -> tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper]:
    """New sys.stdin/stdout/stderr over descriptors 0-2, built as CPython builds them for pipes
    in a UTF-8 locale: page-sized buffers, no newline translation, surrogateescape on stdin and
    stdout, block-buffered stdout, line-buffered stderr with backslashreplace."""
    stdin = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "rb", closefd=False), PIPE_BUFFER_SIZE),
        encoding="utf-8",
        errors="surrogateescape",
        newline="\n",
    )
    stdin.mode = "r"  # type: ignore[misc]
    streams: list[Any] = [stdin]
    for fd, name, errors in ((1, "stdout", "surrogateescape"), (2, "stderr", "backslashreplace")):
        raw = _CappedFile(fd, "wb", closefd=False)
        raw.stream = name
        text = io.TextIOWrapper(
            io.BufferedWriter(raw, PIPE_BUFFER_SIZE),  # type: ignore[type-var]
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


def _write_request_files(case: _Case, case_dir: str) -> str | None:
    """Write the request's files where the service writes them (joined to the solution's
    directory, their directories made) and note those to fetch; why one cannot be, if so."""
    manifest_path = os.path.join(case_dir, protocol.FILES)
    if not os.path.exists(manifest_path):
        return None
    with _builtin_open(manifest_path, "rb") as f:
        manifest = json.loads(f.read())
    case.fetch = [str(path) for path in manifest["fetch"]]
    for path, index in manifest["write"]:
        target = os.path.join(WORK_DIR, path)
        try:
            directory = os.path.dirname(target)
            if directory:
                os.makedirs(directory, exist_ok=True)
            with _builtin_open(os.path.join(case_dir, protocol.file_name(index)), "rb") as f:
                data = f.read()
            with _builtin_open(target, "wb") as f:
                f.write(data)
        except (OSError, ValueError) as exc:
            return f"cannot write the request's file {path!r}: {exc}"
    return None


def _redirect_descriptors(case: _Case, case_dir: str) -> None:
    """stdin from the case's input file, stdout and stderr to files in guest memory, which the
    runner also opens for itself to copy them out from."""
    os.makedirs(OUTPUT_DIR, exist_ok=True)
    opened = _os_open(os.path.join(case_dir, protocol.STDIN), os.O_RDONLY)
    os.dup2(opened, 0)
    _os_close(opened)
    for fd, (name, path) in enumerate(OUTPUT_PATHS.items(), start=1):
        opened = _os_open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(opened, fd)
        _os_close(opened)
        case.outputs[name] = _os_open(path, os.O_RDONLY)
        info = _os_fstat(case.outputs[name])
        case.output_ids[(info.st_dev, info.st_ino)] = name


def _reseed() -> None:
    """The snapshot froze one random state; every micro-VM draws its own, as a new process."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _install_main(path: str) -> types.ModuleType:
    """A fresh __main__ whose globals CPython would have given `python path`, in its order."""
    from importlib.machinery import SourceFileLoader

    module = types.ModuleType("__main__")
    namespace = module.__dict__
    namespace["__annotations__"] = {}
    namespace["__builtins__"] = builtins
    namespace["__file__"] = path
    namespace["__cached__"] = None
    namespace["__loader__"] = SourceFileLoader("__main__", path)
    sys.modules["__main__"] = module
    return module


def _patch(case: _Case) -> None:
    """Put the runner's stand-ins in place of the functions that would show it."""

    def replace(owner: object, name: str, value: object) -> None:
        case.replaced.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    replace(builtins, "open", _open)
    replace(io, "open", _open)
    replace(os, "open", _os_open_std)
    replace(os, "_exit", _exit_now)
    replace(os, "write", _write)
    replace(os, "kill", _os_kill)
    replace(os, "abort", _os_abort)
    replace(signal, "raise_signal", _signal_raise_signal)
    replace(signal, "pthread_kill", _signal_pthread_kill)
    replace(sys, "setrecursionlimit", _set_recursion_limit)
    replace(sys, "getrecursionlimit", _get_recursion_limit)
    if hasattr(threading, "_start_joinable_thread"):
        replace(threading, "_start_joinable_thread", _start_joinable_thread)
    else:
        replace(threading, "_start_new_thread", _start_thread)
    _setrecursionlimit(_getrecursionlimit() + case.frames_below)


def _unpatch(case: _Case) -> None:
    while case.replaced:
        owner, name, value = case.replaced.pop()
        setattr(owner, name, value)


def _compile(source: bytes, path: str) -> types.CodeType:
    """The solution's code, compiled as CPython compiles a script file, whose reader refuses
    a null byte at its line (compile() would refuse it with no location and other words)."""
    null = source.find(b"\0")
    if null >= 0:
        line = source.count(b"\n", 0, null) + 1
        text = source[source.rfind(b"\n", 0, null) + 1 : null].decode("utf-8", "replace")
        raise SyntaxError("source code cannot contain null bytes", (path, line, 0, text, line, 0))
    return compile(source, path, "exec", dont_inherit=True)


def _execute(
    case: _Case, source: bytes, path: str, namespace: dict[str, Any]
) -> list[BaseException]:
    """Start the solution (the start frame, the host's clock) and run its code in `namespace`;
    what it raised, if anything (handed over in a list, see _exit_status)."""
    # The solution's module frame sits on this one.
    case.frames_below = _frame_depth(sys._getframe())
    _patch(case)
    case.frame(protocol.START)
    case.started = _monotonic()
    failures: list[BaseException] = []
    try:
        exec(_compile(source, path), namespace)
    except BaseException as exc:
        failures.append(exc)
    _flush_io()
    return failures


def _run(case: _Case, source: bytes, path: str) -> int:
    """Run the solution as `python path` and return the status it exits with."""
    module = _install_main(path)
    namespace = module.__dict__
    main = weakref.ref(module)
    del module
    failures = _execute(case, source, path, namespace)
    exits_inside = bool(failures) and isinstance(failures[0], SystemExit)
    # The exception is handed over, not kept (see _exit_status).
    status = _exit_status(failures.pop()) if failures else 0
    if not exits_inside:
        # CPython forgets the script's file once its code has ended, unless it exits from
        # inside (SystemExit finalizes the interpreter there and then).
        namespace.pop("__file__", None)
        namespace.pop("__cached__", None)
    del namespace
    case.finalizing = not _THREADS_AT_SHUTDOWN
    return _interpreter_exit(status, main)


def _program_refusal(path: str) -> str | None:
    """Why the program at `path` cannot run in the guest, if it cannot: the guest's ELF loader
    takes a position-independent executable only (hluk's check_pie says so of a mounted one)."""
    try:
        with _builtin_open(path, "rb") as f:
            header = f.read(18)
    except OSError as exc:
        return f"cannot read the program: {exc}"
    if header[:4] != b"\x7fELF" or len(header) < 18:
        return "the program is not an ELF executable"
    if int.from_bytes(header[16:18], "little") != ELF_DYNAMIC:
        return "the program is not position-independent (build it as a static PIE)"
    return None


def _run_program(case: _Case, path: str, name: str) -> int:
    """Run the compiled program at `path` as Sandbox Fusion runs it (`./test` in the solution's
    directory): its descriptors 0-2 are the case's input and output files, nothing else of the
    runner's is open in it; the status as subprocess reports it (-signum for a signal). The
    guest starts it with vfork and execve, and the runner waits: one vCPU, no preemption."""
    case.frame(protocol.START)
    case.started = _monotonic()
    try:
        child = subprocess.Popen([name], executable=path, close_fds=True)
    except OSError as exc:
        _os_write(2, f"verl-hyperlight: cannot run the program: {exc}\n".encode())
        return PROGRAM_UNRUNNABLE_STATUS
    return child.wait()


def _program(case: _Case, case_dir: str) -> None:
    """Run the case's compiled program (see _run_program) and report it."""
    program = os.path.join(case_dir, protocol.PROGRAM)
    refusal = _program_refusal(program)
    if refusal is not None:
        case.frame(protocol.REFUSED, _b2a_base64(refusal.encode(), newline=False))
        return
    with _builtin_open(os.path.join(case_dir, protocol.PROGRAM_NAME), "rb") as f:
        name = f.read().decode()
    saved_fds = [_os_dup(fd) for fd in (0, 1, 2)]
    _redirect_descriptors(case, case_dir)
    os.chdir(WORK_DIR)
    status = _run_program(case, program, name)
    case.finish(status)
    for fd, saved_fd in enumerate(saved_fds):
        os.dup2(saved_fd, fd)
        os.close(saved_fd)
    for fd in case.outputs.values():
        _os_close(fd)


def main(case_dir: str, nonce: str) -> None:
    """Run the case in `case_dir` (solution.py, stdin) and report it on the console: as
    `python solution.py`, or in a pytest guest as `pytest test_solution.py`; or, when it holds
    a compiled program, as that program runs."""
    global _case
    console = _os_dup(1)
    case = _Case(nonce, console)
    _case = case
    os.makedirs(WORK_DIR, exist_ok=True)
    refusal = _write_request_files(case, case_dir)
    if refusal is not None:
        case.frame(protocol.REFUSED, _b2a_base64(refusal.encode(), newline=False))
        _os_close(console)
        return
    if os.path.exists(os.path.join(case_dir, protocol.PROGRAM)):
        _program(case, case_dir)
        _os_close(console)
        return
    saved = (sys.stdin, sys.stdout, sys.stderr, sys.modules["__main__"], sys.argv)
    saved_fds = [_os_dup(fd) for fd in (0, 1, 2)]
    saved_limit = _getrecursionlimit()
    # After the request's files: one of them named as the solution does not replace it.
    path = os.path.join(WORK_DIR, PYTEST_FILE if _language == "pytest" else protocol.SOLUTION)
    with _builtin_open(os.path.join(case_dir, protocol.SOLUTION), "rb") as f:
        source = f.read()
    with _builtin_open(path, "wb") as f:
        f.write(source)
    argv = [path]
    if _language == "pytest":
        argv, path, source = [PYTEST_SCRIPT, path], PYTEST_SCRIPT, PYTEST_SCRIPT_SOURCE.encode()
    _redirect_descriptors(case, case_dir)
    streams = _std_streams()
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]
    os.chdir(WORK_DIR)
    sys.path[:] = [os.path.dirname(path), *(p for p in sys.path if p not in ("", "."))]
    sys.argv = argv
    _reseed()

    status = _run(case, source, path)
    case.finish(status)

    _unpatch(case)
    _setrecursionlimit(saved_limit)
    for fd, saved_fd in enumerate(saved_fds):
        os.dup2(saved_fd, fd)
        os.close(saved_fd)
    sys.stdin, sys.stdout, sys.stderr, sys.modules["__main__"], sys.argv = saved
    for fd in (console, *case.outputs.values()):
        _os_close(fd)


def await_case(case_dir: str, nonce: str) -> None:
    """A ready guest's workload: wait, restored, for the host's GO line on the console's input
    (its case is written into `case_dir` by then), and run the case as `main` does. Nothing of
    `case_dir` is read before the line: it was mounted empty, and a file being written could be
    read half-written. Input that ends before the line ends the guest with no report."""
    pending = b""
    while True:
        newline = pending.find(b"\n")
        if newline >= 0:
            break
        data = _os_read(0, 4096)
        if not data:
            return
        pending += data
    if pending[:newline].strip() != protocol.GO:
        return
    # Import finders made before the line may have listed directories as they were then.
    importlib.invalidate_caches()
    main(case_dir, nonce)


def probe(nonce: str) -> None:
    """The warm-up's workload: report an empty case, which shows that the runner is loaded in
    the snapshot and that its frames reach the host."""
    case = _Case(nonce, 1)
    case.frame(protocol.START)
    case.frame(protocol.END, *protocol.end_fields(protocol.End(0, 0.0, None, (0, 0))))
    case.frame(protocol.DONE)


# A notebook's calls run as its cells: this file name, numbered, in their tracebacks.
CELL_FILENAME = "<cell {}>"


def _read_request(requests: int, pending: bytearray) -> dict[str, Any] | None:
    """The next request on the console's input (protocol.request_lines); None at its end."""
    pieces: list[bytes] = []
    while True:
        newline = pending.find(b"\n")
        while newline < 0:
            data = _os_read(requests, 4096)
            if not data:
                return None
            pending += data
            newline = pending.find(b"\n")
        line = bytes(pending[:newline]).strip()  # a console may add a carriage return
        del pending[: newline + 1]
        if line == protocol.REQUEST_END:
            request: dict[str, Any] = json.loads(binascii.a2b_base64(b"".join(pieces)))
            return request
        if line:
            pieces.append(line)


def _run_cell(case: _Case, source: str, number: int, namespace: dict[str, Any]) -> int:
    """Run one call's code in the notebook's namespace, as a notebook runs a cell: an exception
    is printed as CPython prints one that ends a script (status 1), SystemExit gives its
    status; neither ends the notebook."""
    import linecache

    filename = CELL_FILENAME.format(number)
    # Registered as a notebook does, for tracebacks printed through the traceback module.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    failures = _execute(case, source.encode("utf-8"), filename, namespace)
    status = _exit_status(failures.pop()) if failures else 0
    if not _flush_std_files() and status >= 0:
        status = FLUSH_FAILED_STATUS
    return status


def notebook(nonce: str) -> None:
    """Run calls read from the console's input, one after another, in one namespace kept
    across them (a notebook), each reported as a case with its own nonce, until the input
    ends. The notebook's nonce reports that it is up."""
    global _case
    requests, console = _os_dup(0), _os_dup(1)
    os.makedirs(WORK_DIR, exist_ok=True)
    os.makedirs(OUTPUT_DIR, exist_ok=True)
    empty = os.path.join(OUTPUT_DIR, protocol.STDIN)
    _os_close(_os_open(empty, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    os.chdir(WORK_DIR)
    sys.path[:] = [WORK_DIR, *(p for p in sys.path if p not in ("", "."))]
    sys.argv = [""]
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    namespace = module.__dict__
    _reseed()
    up = _Case(nonce, console)
    up.frame(protocol.START)
    up.frame(protocol.END, *protocol.end_fields(protocol.End(0, 0.0, None, (0, 0))))
    up.frame(protocol.DONE)
    pending = bytearray()
    number = 0
    while True:
        request = _read_request(requests, pending)
        if request is None:
            return
        number += 1
        case = _Case(str(request["nonce"]), console)
        _case = case
        # stdin empty, stdout and stderr to the output files, emptied for this call.
        opened = _os_open(empty, os.O_RDONLY)
        _os_dup2(opened, 0)
        _os_close(opened)
        for fd, (name, path) in enumerate(OUTPUT_PATHS.items(), start=1):
            opened = _os_open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            _os_dup2(opened, fd)
            _os_close(opened)
            case.outputs[name] = _os_open(path, os.O_RDONLY)
            info = _os_fstat(case.outputs[name])
            case.output_ids[(info.st_dev, info.st_ino)] = name
        streams = _std_streams()
        sys.stdin, sys.stdout, sys.stderr = streams
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]
        limit = _getrecursionlimit()
        status = _run_cell(case, str(request["code"]), number, namespace)
        case.finish(status)
        _unpatch(case)
        _setrecursionlimit(limit)
        for fd in case.outputs.values():
            _os_close(fd)
