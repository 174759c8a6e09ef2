"""The guest runner's pure pieces, on the host: imported directly, never through a micro-VM."""

from __future__ import annotations

import base64
import builtins
import dis
import os
import random
import sys
import threading
import traceback
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from verl_hyperlight.case import guests as _guest
from verl_hyperlight.guest import runner


def in_runner(function_source: str, name: str) -> types.FunctionType:
    """A function whose frames carry the runner's file name, as the runner's do in the guest."""
    namespace: dict[str, object] = {}
    exec(compile(function_source, runner.RUNNER_FILENAME, "exec"), namespace)
    function = namespace[name]
    assert isinstance(function, types.FunctionType)
    return function


def raise_value_error() -> None:
    raise ValueError("from the solution")


CALL_THROUGH_RUNNER = "def call(function):\n    function()\n"


def frame_files(tb: types.TracebackType | None) -> list[str]:
    return [entry.filename for entry in traceback.extract_tb(tb)]


@pytest.fixture
def guest_runner(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The runner loaded as the guest loads it (through the warm-exec code), so that its
    frames carry RUNNER_FILENAME."""
    monkeypatch.delitem(sys.modules, runner.MODULE_NAME, raising=False)
    exec(compile(_guest.warm_exec_code(), "<warm-exec>", "exec"), {})
    loaded = sys.modules[runner.MODULE_NAME]
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    return loaded


# ---------------------------------------------------------------------------------------------
# _std_fd


@pytest.mark.parametrize(
    ("path", "fd"),
    [
        ("/dev/stdin", 0),
        ("/dev/stdout", 1),
        ("/dev/stderr", 2),
        ("/dev/fd/0", 0),
        ("/dev/fd/7", 7),
        ("/proc/self/fd/1", 1),
        ("/proc/self/fd/12", 12),
        (b"/dev/stdout", 1),
        (b"/dev/fd/2", 2),
        (Path("/dev/stderr"), 2),
        (Path("/proc/self/fd/3"), 3),
    ],
)
def test_std_fd_maps_standard_and_descriptor_paths(path: object, fd: int) -> None:
    assert runner._std_fd(path) == fd


@pytest.mark.parametrize(
    "path",
    [
        "/dev/null",
        "/dev/stdin2",
        "/dev/fd/",
        "/dev/fd/x",
        "/dev/fd/-1",
        "/dev/fd/1/x",
        "/proc/1/fd/1",
        "dev/stdout",
        "input.txt",
        0,
        1,
        None,
    ],
)
def test_std_fd_leaves_other_paths_and_descriptors_alone(path: object) -> None:
    assert runner._std_fd(path) is None


# ---------------------------------------------------------------------------------------------
# _exit_status


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (None, 0),
        (0, 0),
        (3, 3),
        (255, 255),
        (256, 0),
        (257, 1),
        (-1, 255),
        (True, 1),
        (False, 0),
        (2**63 - 1, 255),
        (-(2**63), 0),
    ],
)
def test_exit_status_of_a_number_is_its_low_byte_silently(
    capsys: pytest.CaptureFixture[str], code: object, status: int
) -> None:
    assert runner._exit_status(SystemExit(code)) == status
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("code", [2**63, 2**70, -(2**63) - 1])
def test_exit_status_beyond_a_c_long_is_255_with_the_overflow_reported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], code: int
) -> None:
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    assert runner._exit_status(SystemExit(code)) == 255
    # As `python -c "import sys; sys.exit(2**63)"` prints it on each version.
    overflow = "OverflowError: Python int too large to convert to C long\n"
    if sys.version_info >= (3, 13):
        overflow = "Exception ignored on threading shutdown:\n" + overflow
    elif sys.version_info < (3, 12):
        overflow = ""
    assert capsys.readouterr().err == overflow


@pytest.mark.parametrize(
    ("code", "printed"),
    [("the message", "the message\n"), (3.0, "3.0\n"), (["a", 1], "['a', 1]\n"), ("", "\n")],
)
def test_exit_status_of_any_other_payload_is_1_and_prints_it(
    capsys: pytest.CaptureFixture[str], code: object, printed: str
) -> None:
    assert runner._exit_status(SystemExit(code)) == 1
    assert capsys.readouterr() == ("", printed)


@pytest.fixture
def clean_sys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let a test set sys.excepthook and sys.last_*: they are put back afterwards."""
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        monkeypatch.setattr(sys, name, None, raising=False)


def caught(function: types.FunctionType, *args: object) -> BaseException:
    try:
        function(*args)
    except BaseException as exc:
        return exc
    raise AssertionError("nothing was raised")


def test_exit_status_of_an_exception_is_1_with_its_traceback_without_runner_frames(
    capsys: pytest.CaptureFixture[str], clean_sys: None
) -> None:
    exc = caught(in_runner(CALL_THROUGH_RUNNER, "call"), raise_value_error)
    assert runner.RUNNER_FILENAME in frame_files(exc.__traceback__)
    assert runner._exit_status(exc) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):\n")
    assert err.endswith("ValueError: from the solution\n")
    assert runner.RUNNER_FILENAME not in err
    assert sys.last_value is exc  # as CPython leaves it for atexit handlers


def test_exit_status_uses_sys_excepthook(
    capsys: pytest.CaptureFixture[str], clean_sys: None
) -> None:
    seen: list[object] = []
    sys.excepthook = lambda kind, value, tb: seen.append((kind, value, sys.exc_info()[0]))
    exc = KeyError("k")
    assert runner._exit_status(exc) == 1
    assert seen == [(KeyError, exc, None)]
    assert capsys.readouterr() == ("", "")


def test_exit_status_when_the_excepthook_raises_prints_both(
    capsys: pytest.CaptureFixture[str], clean_sys: None, guest_runner: types.ModuleType
) -> None:
    def hook(kind: object, value: object, tb: object) -> None:
        raise TypeError("hook failed")

    sys.excepthook = hook
    assert guest_runner._exit_status(LookupError("original")) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[:2] == ["Error in sys.excepthook:", "Traceback (most recent call last):"]
    assert lines[2].endswith(", in hook") and lines[3:5] == [
        '    raise TypeError("hook failed")',
        "TypeError: hook failed",
    ]
    assert lines[5:] == ["", "Original exception was:", "LookupError: original"]


def test_exit_status_when_the_excepthook_exits_is_the_exit_status(
    capsys: pytest.CaptureFixture[str], clean_sys: None
) -> None:
    def hook(kind: object, value: object, tb: object) -> None:
        raise SystemExit(9)

    sys.excepthook = hook
    assert runner._exit_status(LookupError("original")) == 9
    assert capsys.readouterr() == ("", "")


def test_exit_status_without_an_excepthook_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], clean_sys: None
) -> None:
    monkeypatch.delattr(sys, "excepthook")
    assert runner._exit_status(LookupError("original")) == 1
    assert capsys.readouterr().err == "sys.excepthook is missing\nLookupError: original\n"


# ---------------------------------------------------------------------------------------------
# runner frames


def test_without_runner_frames_drops_exactly_the_runner_frames() -> None:
    call = in_runner(CALL_THROUGH_RUNNER, "call")
    exc = caught(call, lambda: call(raise_value_error))
    files = frame_files(exc.__traceback__)
    assert files.count(runner.RUNNER_FILENAME) == 2
    kept = runner._without_runner_frames(exc.__traceback__)
    assert frame_files(kept) == [f for f in files if f != runner.RUNNER_FILENAME]
    assert [entry.name for entry in traceback.extract_tb(kept)] == [
        "caught",
        "<lambda>",
        "raise_value_error",
    ]


def test_without_runner_frames_of_runner_frames_only_is_none() -> None:
    fail = in_runner("def fail():\n    raise ValueError\n", "fail")
    exc = caught(fail)
    assert runner._without_runner_frames(exc.__traceback__.tb_next) is None  # type: ignore[union-attr]
    assert runner._without_runner_frames(None) is None


@pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="before 3.11 leaving a with block re-raises with the traceback the block caught, so"
    " no Python function can drop its own frame from an exception leaving it",
)
def test_hidden_block_raises_as_if_from_c(guest_runner: types.ModuleType) -> None:
    def solution_calls_open() -> object:
        return guest_runner._open("/nonexistent/input.txt")

    exc = caught(solution_calls_open)
    assert isinstance(exc, FileNotFoundError)
    names = [entry.name for entry in traceback.extract_tb(exc.__traceback__)]
    assert names == ["caught", "solution_calls_open"]


def test_compile_refuses_a_null_byte_at_its_line_as_the_file_reader_does() -> None:
    with pytest.raises(SyntaxError) as info:
        runner._compile(b"print(1)\nx = 1\0 + 2\n", "/tmp/solution/solution.py")
    error = info.value
    assert error.msg == "source code cannot contain null bytes"
    assert (error.filename, error.lineno, error.offset, error.text) == (
        "/tmp/solution/solution.py",
        2,
        0,
        "x = 1",
    )


# ---------------------------------------------------------------------------------------------
# the recursion limit, without the runner's frames


@pytest.fixture
def limit_of_a_case(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A case with 5 frames beneath the solution, and a recursion limit kept in a list rather
    than in this interpreter."""
    case = runner._Case("00", 1)
    case.frames_below = 5
    monkeypatch.setattr(runner, "_case", case)
    limit = [1005]
    monkeypatch.setattr(runner, "_getrecursionlimit", lambda: limit[0])
    monkeypatch.setattr(runner, "_setrecursionlimit", lambda value: limit.__setitem__(0, value))
    return limit


def test_recursion_limit_seen_by_the_solution_leaves_out_the_frames_beneath_it(
    limit_of_a_case: list[int],
) -> None:
    assert runner._get_recursion_limit() == 1000
    runner._set_recursion_limit(10**6)
    assert limit_of_a_case == [10**6 + 5]
    assert runner._get_recursion_limit() == 10**6
    runner._set_recursion_limit(2**31 - 1)
    assert limit_of_a_case == [2**31 - 1]


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (0, ValueError, "recursion limit must be greater or equal than 1"),
        (2**31, OverflowError, "Python int too large to convert to C int"),
        (2.5, TypeError, "'float' object cannot be interpreted as an integer"),
        ("9", TypeError, "'str' object cannot be interpreted as an integer"),
    ],
)
def test_recursion_limit_refuses_what_cpython_refuses(
    limit_of_a_case: list[int], value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        runner._set_recursion_limit(value)
    assert limit_of_a_case == [1005]


def test_descend_runs_the_function_that_many_frames_deeper() -> None:
    depths: list[int] = []
    start = runner._frame_depth(sys._getframe())
    runner._descend(3, lambda: depths.append(runner._frame_depth(sys._getframe())), ())
    # _descend four times (levels 3 to 0), then the function's own frame.
    assert depths == [start + 5]


# ---------------------------------------------------------------------------------------------
# _clear_module


class Recorder:
    def __init__(self, name: str, order: list[str]) -> None:
        self.name, self.order = name, order

    def __del__(self) -> None:
        self.order.append(self.name)


def test_clear_module_clears_single_underscore_names_first_and_keeps_builtins() -> None:
    order: list[str] = []
    namespace: dict[object, object] = {
        name: Recorder(name, order) for name in ("b", "_a", "__dunder__", "c", "_", "__private")
    }
    namespace["__builtins__"] = builtins
    namespace[1] = marker = Recorder("not a name", order)
    runner._clear_module(namespace)
    assert order == ["_a", "_", "b", "__dunder__", "c", "__private"]
    assert namespace["__builtins__"] is builtins
    assert namespace[1] is marker
    assert all(namespace[name] is None for name in ("b", "_a", "__dunder__", "c", "_"))


# ---------------------------------------------------------------------------------------------
# _CappedFile


@pytest.fixture
def output_case(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[runner._Case]:
    """A case whose stdout and stderr are files under tmp_path, as the runner opens them, with
    a console that is a file too, and an output limit of 10 bytes."""
    console = os.open(tmp_path / "console", os.O_WRONLY | os.O_CREAT)
    case = runner._Case("00", console)
    for name in runner.OUTPUT_PATHS:
        path = tmp_path / name
        path.touch()
        case.outputs[name] = os.open(path, os.O_RDONLY)
        stat = os.fstat(case.outputs[name])
        case.output_ids[(stat.st_dev, stat.st_ino)] = name
    monkeypatch.setattr(runner, "_case", case)
    monkeypatch.setattr(runner.protocol, "OUTPUT_LIMIT", 10)
    opened = [console, *case.outputs.values()]
    yield case
    for fd in opened:
        os.close(fd)


def test_capped_file_stops_at_the_limit(
    output_case: runner._Case, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stops: list[str] = []
    monkeypatch.setattr(runner, "_stop_for_output_limit", stops.append)
    with runner._CappedFile(str(tmp_path / "stderr"), "wb") as capped:
        capped.stream = "stderr"
        assert capped.write(b"12345") == 5
        assert capped.write(b"678") == 3
        assert stops == []
        capped.write(b"90abc")
        assert stops == ["stderr"]
    assert (tmp_path / "stderr").read_bytes() == b"1234567890"


def test_capped_file_counts_what_other_descriptors_wrote_to_its_file(
    output_case: runner._Case, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stops: list[str] = []
    monkeypatch.setattr(runner, "_stop_for_output_limit", stops.append)
    (tmp_path / "stdout").write_bytes(b"12345678")  # as a child process or os.write would
    with runner._CappedFile(str(tmp_path / "stdout"), "ab") as capped:
        capped.write(b"abc")
    assert stops == ["stdout"]
    assert (tmp_path / "stdout").read_bytes() == b"12345678ab"


def test_capped_file_takes_exactly_the_limit(
    output_case: runner._Case, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stops: list[str] = []
    monkeypatch.setattr(runner, "_stop_for_output_limit", stops.append)
    with runner._CappedFile(str(tmp_path / "stdout"), "wb") as capped:
        assert capped.write(memoryview(b"0123456789")) == 10
    assert ((tmp_path / "stdout").read_bytes(), stops) == (b"0123456789", [])


def test_os_write_past_the_limit_stops_the_solution(
    output_case: runner._Case, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stops: list[str] = []
    monkeypatch.setattr(runner, "_stop_for_output_limit", stops.append)
    fd = os.open(tmp_path / "stdout", os.O_WRONLY)
    try:
        assert runner._write(fd, b"0123456789") == 10
        assert stops == []
        runner._write(os.dup2(fd, fd), b"x")
        assert stops == ["stdout"]
    finally:
        os.close(fd)


def console_frames(path: Path) -> list[list[bytes]]:
    return [line.split(b" ")[1:] for line in path.read_bytes().split(b"\n") if line]


def test_finish_reports_the_end_before_the_output_then_done(
    output_case: runner._Case, tmp_path: Path
) -> None:
    (tmp_path / "stdout").write_bytes(b"out")
    output_case.finish(3)
    frames = console_frames(tmp_path / "console")
    assert [frame[0] for frame in frames] == [b"end", b"stdout", b"done"]
    end = runner.protocol.parse_end(frames[0][1:])
    assert (end.status, end.limit_hit, end.sizes) == (3, None, (3, 0))
    assert frames[1][1] == b"b3V0"  # base64 of "out"


def test_finish_past_the_limit_keeps_the_limit_and_reports_153(
    output_case: runner._Case, tmp_path: Path
) -> None:
    (tmp_path / "stdout").write_bytes(b"x" * 25)  # as a child process writes, past any check
    output_case.finish(0)
    frames = console_frames(tmp_path / "console")
    end = runner.protocol.parse_end(frames[0][1:])
    assert (end.status, end.limit_hit, end.sizes) == (153, "stdout", (10, 0))


def test_a_second_finish_waits_for_the_micro_vm_to_end(
    output_case: runner._Case, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    output_case.finish(0)
    reported = (tmp_path / "console").read_bytes()
    second = threading.Thread(target=output_case.finish, args=(7,), daemon=True)
    second.start()
    second.join(0.5)
    # Still waiting: it reported nothing, and the first report stands.
    assert second.is_alive()
    assert (tmp_path / "console").read_bytes() == reported
    # The micro-VM's end, which it waits for, never comes here: let it go rather than leave
    # the thread blocked for the rest of the suite (and never let it end pytest's process).
    monkeypatch.setattr(runner, "_os_exit", lambda status: None)
    output_case.reporting.release()
    second.join(10)
    assert not second.is_alive()


def test_a_finish_that_cannot_report_ends_the_guest(
    output_case: runner._Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    exits: list[int] = []

    def exit_now(status: int) -> None:
        exits.append(status)
        raise SystemExit  # stands for the process ending here

    monkeypatch.setattr(runner, "_os_exit", exit_now)
    closed = os.open(os.devnull, os.O_RDONLY)
    os.close(closed)
    # The solution closed the runner's descriptor of its stderr.
    monkeypatch.setitem(output_case.outputs, "stderr", closed)
    with pytest.raises(SystemExit):
        output_case.finish(0)
    assert exits == [runner.REPORT_FAILED_STATUS]


# ---------------------------------------------------------------------------------------------
# warm-exec


def test_warm_exec_code_loads_the_runner_under_its_module_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, runner.MODULE_NAME, raising=False)
    namespace: dict[str, object] = {}
    exec(compile(_guest.warm_exec_code(), "<warm-exec>", "exec"), namespace)
    loaded = sys.modules[runner.MODULE_NAME]
    assert loaded is not runner
    assert loaded.__name__ == runner.MODULE_NAME
    assert callable(loaded.main) and callable(loaded.prepare)
    assert loaded.main.__code__.co_filename == runner.RUNNER_FILENAME
    assert loaded.WORK_DIR == runner.WORK_DIR
    # The warm-exec leaves nothing behind in the driver's __main__ globals.
    assert set(namespace) == {"__builtins__"}


def test_prepare_imports_what_exists_and_skips_what_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    runner.prepare(["colorsys", "no_such_module_anywhere"])
    assert "colorsys" in sys.modules
    assert "no_such_module_anywhere" not in sys.modules


def imported_modules(code: types.CodeType) -> set[str]:
    """The top-level names of every module `code` imports, nested code included."""
    names = {
        i.argval.split(".")[0] for i in dis.get_instructions(code) if i.opname == "IMPORT_NAME"
    }
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= imported_modules(const)
    return names


@pytest.mark.parametrize("module", [runner, runner.protocol])
def test_the_guest_package_uses_only_the_standard_library(module: types.ModuleType) -> None:
    code = compile(Path(module.__file__ or "").read_text(), module.__file__ or "", "exec")
    imported = imported_modules(code)
    assert imported <= set(sys.stdlib_module_names) | {"__future__", ""}
    # Its own modules, imported relatively: the ones the warm-exec loads.
    relative = {
        name
        for i in dis.get_instructions(code)
        if i.opname == "IMPORT_FROM" and i.argval in _guest.GUEST_MODULES
        for name in [i.argval]
    }
    assert relative <= set(_guest.GUEST_MODULES)


# ---------------------------------------------------------------------------------------------
# one protocol: the host's parser reads what the runner writes


def as_a_console_passes_it(frames: bytes, noise: bytes) -> bytes:
    """The runner's frames as hluk's stdout carries them: newlines as \\r\\n, with text that is
    not the runner's before and between them."""
    return noise + frames.replace(b"\n", b"\r\n").replace(b"\r\n\r\n", b"\r\n" + noise + b"\r\n")


def feed(console: Any, chunk: bytes) -> None:
    """Hand `chunk` to `console` as hluk's stdout hands it over: through a pipe, read by the
    console's own read, a pipe's worth at a time."""
    read, write = os.pipe()
    try:
        for offset in range(0, len(chunk), 65536):
            left = os.write(write, chunk[offset : offset + 65536])
            while left:
                left -= console.read(read)
    finally:
        os.close(read)
        os.close(write)


@pytest.mark.parametrize("read_size", [1, 7, 4096, 1 << 20])
def test_the_hosts_parser_reads_what_the_runner_writes(
    output_case: runner._Case, tmp_path: Path, read_size: int
) -> None:
    from verl_hyperlight.hluk import console as _console

    (tmp_path / "stdout").write_bytes(b"\xce\xbbx\n")
    (tmp_path / "stderr").write_bytes(b"err")
    start = runner.protocol.frame(output_case.nonce, runner.protocol.START)
    output_case.finish(4)
    frames = start + (tmp_path / "console").read_bytes()
    console = _console.Console(output_case.nonce.decode())
    stream = as_a_console_passes_it(frames, b"hl_driver: noise 00 end 0 0 - 0 0")
    for offset in range(0, len(stream), read_size):
        feed(console, stream[offset : offset + read_size])
    assert console.started and console.done
    assert console.end is not None and (console.end.status, console.end.sizes) == (4, (4, 3))
    assert bytes(console.stream("stdout")) == b"\xce\xbbx\n"
    assert bytes(console.stream("stderr")) == b"err"
    assert console.preamble() == b"hl_driver: noise 00 end 0 0 - 0 0"


def test_frames_of_another_nonce_or_malformed_are_not_the_runners() -> None:
    from verl_hyperlight.hluk import console as _console

    nonce = "ab" * 16
    console = _console.Console(nonce)
    frame = runner.protocol.frame
    feed(console, frame(nonce.encode(), runner.protocol.START))
    feed(console, frame(b"cd" * 16, runner.protocol.END, b"0", b"0.1", b"-", b"0", b"0"))
    feed(console, frame(nonce.encode(), runner.protocol.END, b"0", b"zero", b"-", b"0", b"0"))
    feed(console, frame(nonce.encode(), runner.protocol.STDOUT, b"not base64!"))
    assert console.started and console.end is None and not console.done


def _random_console(rng: random.Random, nonce: bytes) -> tuple[bytes, list[bytes]]:
    """A console as hluk's stdout may carry it: a runner's whole report (start, end, outputs
    and fetched files in chunks, done) among text, forged and cut frames, frames of another
    nonce and lines too long for a frame; and the report's outputs and files."""
    protocol = runner.protocol
    outputs = [rng.randbytes(rng.choice([0, 3, 40_000, 100_000])) for _ in range(2)]
    files = [rng.randbytes(rng.choice([0, 5, 40_000])) for _ in range(rng.randint(0, 2))]
    sizes = b",".join(b"%d" % len(data) for data in files) or b"-"
    report = [protocol.frame(nonce, protocol.START), rng.randbytes(rng.randint(0, 50))]
    end = (b"3", b"0.5", b"-", b"%d" % len(outputs[0]), b"%d" % len(outputs[1]), sizes)
    report.append(protocol.frame(nonce, protocol.END, *end))
    chunked = [(protocol.STDOUT, (), outputs[0]), (protocol.STDERR, (), outputs[1])]
    chunked += [(protocol.FILE, (b"%d" % index,), data) for index, data in enumerate(files)]
    for kind, index, data in chunked:
        for at in range(0, len(data), protocol.CHUNK):
            chunk = base64.b64encode(data[at : at + protocol.CHUNK])
            report.append(protocol.frame(nonce, kind, *index, chunk))
    report.append(protocol.frame(nonce, protocol.DONE))
    noise = [
        rng.randbytes(rng.randint(0, 300)),
        protocol.frame(b"cd" * 16, protocol.START),
        protocol.frame(nonce, protocol.STDOUT, b"not base64!"),
        protocol.frame(nonce, protocol.END, b"0", b"zero", b"-", b"0", b"0", b"-"),
        b"\n" + nonce + b" " + rng.randbytes(protocol.MAX_FRAME_LINE + 5) + b"\n",
        b"\n" + nonce + b" st",
    ]
    before = rng.sample(noise, rng.randint(0, len(noise)))
    stream = b"".join([*before, *report, *rng.sample(noise, 2)])
    return stream.replace(b"\n", b"\r\n") if rng.random() < 0.5 else stream, [*outputs, *files]


@pytest.mark.parametrize("seed", range(40))
def test_the_hosts_parser_reads_the_same_in_any_read_sizes(seed: int) -> None:
    """Frames cut anywhere by the pipe's reads (a marker, a frame line, a \r\n) decode as
    they do whole: the runner's report whole, nothing else taken for it."""
    from verl_hyperlight.hluk import console as _console

    rng = random.Random(seed)
    nonce = "ab" * 16
    stream, data = _random_console(rng, nonce.encode())
    states = []
    for read_size in (1 << 16, rng.choice([1, 2, 7, 61]), rng.randint(100, 1 << 16)):
        console = _console.Console(nonce)
        size = read_size if len(stream) < 20_000 or read_size > 99 else 4093
        for offset in range(0, len(stream), size):
            feed(console, stream[offset : offset + size])
        assert console.started and console.done and console.whole and console.end is not None
        outputs = [console.stream("stdout"), console.stream("stderr")]
        outputs += [console.files[index].view() for index in sorted(console.files)]
        assert [bytes(output) for output in outputs] == data
        states.append((console.total, console.refusal, console.last, console.preamble()))
        console.release()
    assert states[0] == states[1] == states[2]


def test_the_copy_out_budget_counts_the_fetched_files_too() -> None:
    from verl_hyperlight import deadlines

    protocol = runner.protocol
    end = protocol.End(0, 0.1, None, (3, 4), (5, protocol.FILE_MISSING, protocol.FILE_LEFT_OUT))
    assert end.copied == 3 + 4 + 5
    mib = 1024 * 1024
    output_only = protocol.End(0, 0.1, None, (mib, 0))
    with_a_file = protocol.End(0, 0.1, None, (mib, 0), (8 * mib,))
    limits = deadlines.for_case(10)
    extra = limits.copy_out_budget(with_a_file.copied) - limits.copy_out_budget(output_only.copied)
    assert extra == 8 * mib / deadlines.COPY_OUT_BYTES_PER_SECOND
