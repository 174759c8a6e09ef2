"""Conformance: each program answers through run_code (the stand-in hluk) exactly as it answers
when CPython 3.12 runs it as Sandbox Fusion does (``python /tmp/dir/solution.py`` in a fresh
directory, stdin a pipe written then closed, a clean environment, a wall-clock limit).

Both answers are shaped as Sandbox Fusion responses and compared on their status, run status,
return code, stdout (exactly) and stderr (with the solution's directory and object addresses
normalised; this includes the last stderr line of every failure). The reference is built here
from the subprocess alone, sharing no code with the package under test, and without Sandbox
Fusion's 1 MiB truncation, which the package beats.

A program whose answer differs names the README "Known limits" entry that explains it and what
our side answers instead; the test checks that entry exists, that the difference is real, and
that everything else is equal.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import tempfile
import textwrap
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from verl_hyperlight import run_code
from verl_hyperlight.guest import runner

Response = dict[str, Any]
Shape = dict[str, object]

README = Path(__file__).resolve().parent.parent / "README.md"


def _find_reference_python() -> str:
    """The stand-in's guest interpreter, chosen by the stand-in's own code (beside it, in
    tests/standin), so both sides run the same CPython. The stand-in runs under the `hluk`
    fixture, which clears the HLUK_STANDIN_* variables it does not set: so is the choice here."""
    path = Path(__file__).resolve().parent / "standin" / "guest_python.py"
    spec = importlib.util.spec_from_file_location("standin_guest_python", path)
    assert spec is not None and spec.loader is not None
    guest_python = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guest_python)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HLUK_STANDIN_")}
    return guest_python.find_python(environ)


REFERENCE_PYTHON = _find_reference_python()


@dataclass(frozen=True)
class Divergence:
    """A documented difference: `limit` is words of the README's "Known limits" entry that
    explains it; `ours` the fields (of `shape`) our side answers instead of the reference's."""

    limit: str
    ours: dict[str, object]


@dataclass(frozen=True)
class Program:
    """A solution and its stdin, run `runs` times on each side with the same run_timeout."""

    name: str
    code: str
    stdin: str | None = None
    run_timeout: float = 10.0
    divergence: Divergence | None = None
    runs: int = 1


def program(name: str, code: str, **kwargs: Any) -> Program:
    """A Program whose code may be written indented, inside a triple-quoted string."""
    return Program(name, textwrap.dedent(code).lstrip("\n"), **kwargs)


LINES = "3\n10 20\n30 40\n50 60\n"
BIG_STDIN = "".join(f"{i} {i * i}\n" for i in range(70_000))  # about 1 MB, several pipe fills

STDIN = [
    program(
        "input_until_eof_error",
        """
        lines = []
        while True:
            try:
                lines.append(input())
            except EOFError:
                break
        print(len(lines), lines[::-1])
        """,
        stdin=LINES,
    ),
    program(
        "input_last_line_without_newline",
        """
        print(repr(input()), repr(input()))
        """,
        stdin="first\nlast",
    ),
    program(
        "input_with_prompt_writes_the_prompt_to_stdout",
        """
        name = input("name? ")
        print("hello", name)
        """,
        stdin="ada\n",
    ),
    program(
        "input_at_eof_is_an_uncaught_eof_error",
        """
        print("before")
        input()
        """,
        stdin="",
    ),
    program(
        "input_keeps_carriage_returns",
        """
        print(repr(input()), repr(input()))
        import sys
        print(repr(sys.stdin.read()))
        """,
        stdin="a\r\nb\r\nc\rd\r\n",
    ),
    program(
        "competitive_map_int_split",
        """
        n = int(input())
        total = 0
        for _ in range(n):
            a, b = map(int, input().split())
            total += a * b
        print(total)
        """,
        stdin=LINES,
    ),
    program(
        "sys_stdin_iteration",
        """
        import sys
        for number, line in enumerate(sys.stdin):
            print(number, repr(line))
        """,
        stdin=LINES,
    ),
    program(
        "sys_stdin_read",
        """
        import sys
        data = sys.stdin.read()
        print(len(data), data.split())
        print(repr(sys.stdin.read()))
        """,
        stdin=LINES,
    ),
    program(
        "sys_stdin_readline_until_empty",
        """
        import sys
        input = sys.stdin.readline
        while line := input():
            print(repr(line.rstrip()))
        print(repr(input()))
        """,
        stdin=LINES,
    ),
    program(
        "sys_stdin_readlines",
        """
        import sys
        print(sys.stdin.readlines())
        """,
        stdin=LINES + "no newline",
    ),
    program(
        "readline_then_read_the_rest",
        """
        import sys
        first = sys.stdin.readline()
        print(repr(first), repr(sys.stdin.read()))
        """,
        stdin=LINES,
    ),
    program(
        "sys_stdin_buffer_read_bytes",
        """
        import sys
        data = sys.stdin.buffer.read()
        print(len(data), data)
        print(data.decode())
        """,
        stdin="héllo wörld 😀\nzwei\n",
    ),
    program(
        "big_stdin_read_whole",
        """
        import hashlib, sys
        data = sys.stdin.buffer.read()
        print(len(data), hashlib.sha256(data).hexdigest())
        print(sum(int(x) for x in data.split()))
        """,
        stdin=BIG_STDIN,
    ),
    program(
        "big_stdin_read_by_line",
        """
        import sys
        count = total = 0
        for line in sys.stdin:
            a, b = map(int, line.split())
            count += 1
            total += b - a
        print(count, total)
        """,
        stdin=BIG_STDIN,
    ),
    program(
        "open_0_read",
        """
        data = open(0).read()
        print(repr(data))
        """,
        stdin=LINES,
    ),
    program(
        "open_dev_stdin",
        """
        with open("/dev/stdin") as f:
            print(f.read().split())
        """,
        stdin=LINES,
    ),
    program(
        "open_dev_fd_0_binary",
        """
        with open("/dev/fd/0", "rb") as f:
            print(f.read())
        """,
        stdin=LINES,
    ),
    program(
        "os_open_dev_stdin",
        """
        import os
        fd = os.open("/dev/stdin", os.O_RDONLY)
        print(os.read(fd, 1000))
        os.close(fd)
        """,
        stdin=LINES,
    ),
    program(
        "os_read_0_in_small_pieces",
        """
        import os
        pieces = []
        while piece := os.read(0, 4):
            pieces.append(piece)
        print(pieces)
        """,
        stdin=LINES,
    ),
    program(
        "stdin_none_is_immediate_eof",
        """
        import sys
        print(repr(sys.stdin.read()), repr(sys.stdin.readline()))
        """,
        stdin=None,
    ),
    program(
        "stdin_empty_is_immediate_eof",
        """
        import sys
        print(repr(sys.stdin.read()), repr(sys.stdin.readline()))
        """,
        stdin="",
    ),
    program(
        "fileinput_reads_stdin",
        """
        import fileinput
        for line in fileinput.input():
            print(fileinput.lineno(), fileinput.filename(), line.strip())
        """,
        stdin=LINES,
    ),
    program(
        "stdin_unicode_text",
        """
        text = input()
        print(len(text), text.upper(), [hex(ord(c)) for c in text[-2:]])
        """,
        stdin="grüße, 世界 😀\n",
    ),
]

ENDINGS = [
    program("sys_exit_no_argument", "import sys\nprint('a')\nsys.exit()\nprint('b')\n"),
    program("sys_exit_0", "import sys\nprint('a')\nsys.exit(0)\n"),
    program("sys_exit_3", "import sys\nprint('a')\nsys.exit(3)\n"),
    program("sys_exit_message", "import sys\nprint('a')\nsys.exit('the message')\n"),
    program("sys_exit_256_wraps_to_0", "import sys\nsys.exit(256)\n"),
    program("sys_exit_minus_1_is_255", "import sys\nsys.exit(-1)\n"),
    program("sys_exit_true_is_1", "import sys\nsys.exit(True)\n"),
    program("sys_exit_beyond_a_c_long", "import sys\nsys.exit(2 ** 70)\n"),
    program("sys_exit_an_object", "import sys\nsys.exit(['not', 'a', 'number'])\n"),
    program("raise_system_exit", "print('a')\nraise SystemExit(7)\n"),
    program("builtin_exit", "print('a')\nexit(4)\n"),
    program("builtin_quit", "print('a')\nquit()\n"),
    program(
        "sys_exit_runs_finally_blocks",
        """
        import sys
        try:
            sys.exit(2)
        finally:
            print("finally")
        """,
    ),
    program(
        "uncaught_exception_in_nested_calls",
        """
        def inner(x):
            return 1 / x

        def outer():
            return inner(0)

        print("start")
        outer()
        """,
    ),
    program(
        "chained_exception_with_from",
        """
        def parse(text):
            try:
                return int(text)
            except ValueError as exc:
                raise RuntimeError("bad input") from exc

        parse("x")
        """,
    ),
    program(
        "exception_raised_while_handling_another",
        """
        try:
            {}["missing"]
        except KeyError:
            [][1]
        """,
    ),
    program(
        "exception_group",
        """
        def fail(n):
            raise ValueError(n)

        errors = []
        for n in range(2):
            try:
                fail(n)
            except ValueError as exc:
                errors.append(exc)
        raise ExceptionGroup("two failures", [*errors, TypeError("t")])
        """,
    ),
    program("syntax_error", "print('a')\ndef f(:\n    pass\n"),
    program("unclosed_parenthesis", "x = (1,\nprint(x\n"),
    program("indentation_error", "if True:\nprint('a')\n"),
    program("unexpected_indent", "x = 1\n    y = 2\n"),
    program(
        "os_exit_after_flush_keeps_output",
        """
        import os, sys
        print("kept", flush=True)
        sys.stderr.write("also kept\\n")
        os._exit(4)
        """,
    ),
    program(
        "os_exit_loses_unflushed_output",
        """
        import os, sys
        print("lost")
        sys.stderr.write("lost too, no newline")
        os._exit(0)
        """,
    ),
    program(
        "os_exit_with_a_string_is_a_type_error",
        """
        import os
        os._exit("3")
        """,
    ),
    program(
        "closed_stdout_then_exit",
        """
        import sys
        print("written")
        sys.stdout.close()
        """,
    ),
    program(
        "closed_descriptor_1_then_print_is_status_120",
        """
        import os
        print("never seen")
        os.close(1)
        print("nor this")
        """,
    ),
    program(
        "atexit_handlers_run_last_in_first_out",
        """
        import atexit

        def bye(word):
            print("bye", word)

        atexit.register(bye, "first")
        atexit.register(bye, "second")
        print("main done")
        """,
    ),
    program(
        "atexit_handler_raising",
        """
        import atexit

        def broken():
            raise ValueError("in atexit")

        atexit.register(lambda: print("still runs"))
        atexit.register(broken)
        print("main done")
        """,
    ),
    program(
        "atexit_after_sys_exit_and_after_an_exception",
        """
        import atexit, sys
        atexit.register(lambda: print("atexit", getattr(sys, "last_value", None)))
        raise KeyError("boom")
        """,
    ),
    program(
        "module_globals_at_exit",
        """
        import atexit
        atexit.register(lambda: print(sorted(k for k in globals() if k.startswith("__"))))
        print(list(globals()))
        """,
    ),
    program(
        "module_globals_at_exit_after_sys_exit",
        """
        import atexit, sys
        atexit.register(lambda: print("__file__" in globals(), "__cached__" in globals()))
        sys.exit(0)
        """,
    ),
    program(
        "non_daemon_thread_finishes_after_main",
        """
        import threading, time

        def late():
            threading.main_thread().join()  # until the main code has ended
            time.sleep(0.2)
            print("thread done")

        threading.Thread(target=late).start()
        print("main done")
        """,
    ),
    program(
        "non_daemon_thread_starts_another_after_main",
        """
        import threading

        def second():
            print("second done")

        def first():
            threading.main_thread().join()  # until the main code has ended
            threading.Thread(target=second).start()
            print("first done")

        threading.Thread(target=first).start()
        """,
    ),
    program(
        "threads_joined_before_atexit_handlers",
        """
        import atexit, threading, time
        atexit.register(lambda: print("atexit"))

        def work():
            time.sleep(0.2)
            print("thread")

        threading.Thread(target=work).start()
        """,
    ),
    program(
        "thread_pool_executor_not_shut_down",
        """
        from concurrent.futures import ThreadPoolExecutor
        import time

        def square(x):
            time.sleep(0.05)
            print("done", x, flush=True)
            return x * x

        print("submitting", flush=True)
        pool = ThreadPoolExecutor(max_workers=1)
        futures = [pool.submit(square, x) for x in range(3)]
        """,
    ),
    program(
        "daemon_thread_is_abandoned",
        """
        import threading, time

        started = threading.Event()

        def forever():
            print("daemon started", flush=True)
            started.set()
            threading.Event().wait()

        def late():
            time.sleep(1)
            print("never printed")

        threading.Thread(target=forever, daemon=True).start()
        threading.Thread(target=late, daemon=True).start()
        started.wait()
        print("main done")
        """,
    ),
    program(
        "exception_in_a_thread",
        """
        import threading

        def work():
            raise ValueError("in thread")

        t = threading.Thread(target=work)
        t.start()
        t.join()
        print("main done")
        """,
    ),
    program(
        "sys_exit_in_a_thread_ends_only_the_thread",
        """
        import sys, threading
        t = threading.Thread(target=sys.exit, args=(5,))
        t.start()
        t.join()
        print("main done")
        """,
    ),
    program(
        "uncaught_exception_while_a_thread_still_runs",
        """
        import threading, time

        def work():
            time.sleep(0.2)
            print("thread done")

        threading.Thread(target=work).start()
        raise RuntimeError("main failed")
        """,
    ),
    program(
        "del_at_module_teardown",
        """
        class Noisy:
            def __init__(self, name):
                self.name = name

            def __del__(self):
                print("del", self.name)

        keep = Noisy("global")
        print("main done")
        """,
    ),
    program(
        "del_order_at_module_teardown",
        """
        class Noisy:
            def __init__(self, name):
                self.name = name

            def __del__(self):
                print("del", self.name)

        b = Noisy("b")
        _a = Noisy("_a")
        c = Noisy("c")
        __d = Noisy("__d")
        print("main done")
        """,
    ),
    program(
        "cycles_collected_before_module_teardown",
        """
        import sys

        class Noisy:
            def __init__(self, name):
                self.name = name

            def __del__(self):
                torn_down = sys.argv is None, sys.path is None
                print("del", self.name, torn_down, sys.stdout is sys.__stdout__)

        def make_cycle(name):
            a = Noisy(name)
            a.self = a

        keep = Noisy("global")
        make_cycle("cycle")
        _under = Noisy("_under")
        print("main done")
        """,
    ),
    program(
        "module_teardown_when_main_refers_to_itself",
        """
        import __main__

        class Noisy:
            def __init__(self, name):
                self.name = name

            def __del__(self):
                print("del", self.name)

        b = Noisy("b")
        _a = Noisy("_a")
        print("main done")
        """,
    ),
    program(
        "del_at_teardown_closing_stdout_is_silent",
        """
        import os

        class Closer:
            def __del__(self):
                print("in del")
                os.close(1)

        closer = Closer()
        """,
    ),
    program(
        "custom_excepthook",
        """
        import sys

        def hook(kind, value, tb):
            print("hooked:", kind.__name__, value)

        sys.excepthook = hook
        raise LookupError("custom")
        """,
    ),
    program(
        "excepthook_that_raises",
        """
        import sys

        def hook(kind, value, tb):
            raise TypeError("hook failed")

        sys.excepthook = hook
        raise LookupError("original")
        """,
    ),
    program(
        "excepthook_raising_system_exit",
        """
        import sys

        def hook(kind, value, tb):
            raise SystemExit(9)

        sys.excepthook = hook
        raise ValueError("never shown")
        """,
    ),
    program(
        "excepthook_missing",
        """
        import sys
        del sys.excepthook
        raise ValueError("shown anyway")
        """,
    ),
    program(
        "excepthook_not_callable",
        """
        import sys
        sys.excepthook = None
        raise ValueError("shown anyway")
        """,
    ),
    program(
        "excepthook_sees_no_exception_being_handled",
        """
        import sys

        def hook(kind, value, tb):
            print("handling:", sys.exc_info()[0], kind.__name__)

        sys.excepthook = hook
        raise ValueError
        """,
    ),
    program(
        "uncaught_file_not_found_from_open",
        """
        data = open("input.txt").read()
        """,
    ),
    program(
        "thread_refused_after_main_ends",
        """
        import atexit, threading

        def later():
            try:
                threading.Thread(target=print, args=("thread",)).start()
            except RuntimeError as exc:
                print("refused:", exc)

        atexit.register(later)
        threading.Thread(target=print, args=("during main",)).start()
        """,
    ),
    program(
        "output_flushed_when_main_code_ends",
        """
        import atexit, os, threading
        print("main's output")

        def late():
            threading.main_thread().join()  # until the main code has ended
            os.write(1, b"thread's direct write\\n")

        threading.Thread(target=late).start()
        atexit.register(os._exit, 0)
        """,
    ),
    program(
        "null_byte_in_source",
        "print('a')\nx = 1\0 + 2\n",
    ),
    program(
        "source_encoding_declaration",
        "# -*- coding: latin-1 -*-\nprint('é', len('é'))\n",
    ),
    program(
        "source_with_byte_order_mark",
        "\ufeffprint('bom', __doc__)\n",
    ),
    program(
        "module_docstring",
        '''"""The solution's docstring."""\nprint(__doc__)\n''',
    ),
    program(
        "recursion_limit_errors",
        """
        import sys
        for value in (0, -5, 2 ** 31, 2.5, "x"):
            try:
                sys.setrecursionlimit(value)
            except Exception as exc:
                print(type(exc).__name__, exc)

        def set_limit_at_depth(n):
            if n == 0:
                sys.setrecursionlimit(3)
            else:
                set_limit_at_depth(n - 1)

        set_limit_at_depth(2)
        """,
    ),
    program(
        "os_exit_with_an_out_of_range_status",
        """
        import os
        for value in (2 ** 31, 1.5):
            try:
                os._exit(value)
            except (OverflowError, TypeError) as exc:
                print(type(exc).__name__, exc)
        os._exit(status=2)
        """,
    ),
    program(
        "sys_exit_in_an_atexit_handler_is_ignored",
        """
        import atexit, sys
        atexit.register(lambda: print("earlier handler still runs"))
        atexit.register(sys.exit, 5)
        print("main done")
        """,
    ),
    program(
        "uncaught_exception_with_stderr_closed",
        """
        import sys
        print("out")
        sys.stderr.close()
        raise ValueError("lost")
        """,
    ),
    program(
        "uncaught_recursion_error",
        """
        def down(n):
            return down(n + 1)

        down(0)
        """,
    ),
    program(
        "recursion_depth_reached",
        """
        import sys

        def depth(n):
            try:
                return depth(n + 1)
            except RecursionError:
                return n

        print(depth(0), sys.getrecursionlimit())
        sys.setrecursionlimit(3000)
        print(depth(0), sys.getrecursionlimit())
        """,
    ),
    program(
        "recursion_depth_reached_in_a_thread",
        """
        import sys, threading

        def depth(n):
            try:
                return depth(n + 1)
            except RecursionError:
                return n

        thread = threading.Thread(target=lambda: print(depth(0)))
        thread.start()
        thread.join()
        """,
    ),
]

ENVIRONMENT = [
    program(
        "script_identity",
        """
        import os, sys
        print(__name__, os.path.basename(__file__))
        print(__file__ == os.path.abspath(sys.argv[0]), len(sys.argv))
        print(os.getcwd() == os.path.dirname(__file__))
        print(sys.path[0] == os.path.dirname(__file__))
        print(__spec__, __package__, __doc__, __cached__, __loader__.name)
        print(__builtins__ is __import__("builtins"))
        """,
    ),
    program(
        "solution_reads_its_own_source",
        """
        # a comment that must come back
        print(open(__file__).read(), end="")
        """,
    ),
    program(
        "only_the_main_thread_runs",
        """
        import threading
        current = threading.current_thread()
        print(threading.active_count(), current.name, current is threading.main_thread())
        """,
    ),
    program(
        "main_module_is_this_module",
        """
        import sys, __main__
        marker = object()
        print(__main__.marker is marker, sys.modules["__main__"] is __main__)
        print(__main__.__file__ == __file__)
        """,
    ),
    program(
        "working_directory_is_writable_and_private",
        """
        import os
        with open("notes.txt", "w") as f:
            f.write("kept")
        os.mkdir("sub")
        print(sorted(os.listdir(".")), open("notes.txt").read())
        """,
    ),
    program(
        "module_written_at_run_time_then_imported",
        """
        with open("helper.py", "w") as f:
            f.write("def twice(x):\\n    return 2 * x\\n")
        import helper
        import os
        print(helper.twice(21), helper.__file__ == os.path.join(os.getcwd(), "helper.py"))
        """,
    ),
    program(
        "deep_recursion_in_a_big_thread",
        """
        import sys, threading
        sys.setrecursionlimit(10 ** 6)
        threading.stack_size(2 ** 26)

        def depth(n):
            return 0 if n == 0 else 1 + depth(n - 1)

        thread = threading.Thread(target=lambda: print(depth(100_000)))
        thread.start()
        thread.join()
        """,
    ),
    program(
        "big_integers",
        """
        import sys
        sys.set_int_max_str_digits(0)
        n = 3 ** 20_000
        print(len(str(n)), str(n)[:20], n % 1_000_000_007)
        """,
    ),
    program(
        "big_integer_string_limit",
        """
        print(len(str(10 ** 4299)))
        print(str(10 ** 4300))
        """,
    ),
    program(
        "streams_are_not_terminals",
        """
        import os, sys
        print(sys.stdin.isatty(), sys.stdout.isatty(), sys.stderr.isatty())
        print(os.isatty(0), os.isatty(1), os.isatty(2))
        """,
    ),
    program(
        "standard_stream_attributes",
        """
        import sys
        for s in (sys.stdin, sys.stdout, sys.stderr):
            print(s.name, s.mode, s.encoding, s.errors, s.line_buffering, s.fileno())
            print(s is getattr(sys, "__%s__" % s.name.strip("<>")), s.buffer.raw.name)
        """,
    ),
    program(
        "stdout_buffer_size_as_for_a_pipe",
        """
        import os
        print("x" * 3000)
        os.write(1, b"|direct 1|\\n")
        print("y" * 3000)
        os.write(1, b"|direct 2|\\n")
        print("z" * 100)
        os.write(1, b"|direct 3|\\n")
        """,
    ),
    program(
        "warnings_go_to_stderr",
        """
        import warnings
        warnings.warn("careful")
        warnings.warn("old", DeprecationWarning)
        print("done")
        """,
    ),
    program(
        "pickle_of_a_main_class",
        """
        import pickle

        class Point:
            def __init__(self, x, y):
                self.x, self.y = x, y

        p = pickle.loads(pickle.dumps(Point(1, 2)))
        print(type(p).__module__, type(p).__qualname__, p.x, p.y)
        """,
    ),
    program(
        "dataclass_with_postponed_annotations",
        """
        from __future__ import annotations
        import dataclasses, typing

        @dataclasses.dataclass
        class Item:
            name: str
            count: typing.ClassVar[int] = 0
            tags: list[str] = dataclasses.field(default_factory=list)

        print(Item("a"), [f.name for f in dataclasses.fields(Item)])
        print(typing.get_type_hints(Item))
        """,
    ),
    program(
        "inspect_source_of_a_solution_function",
        """
        import inspect

        def answer():
            return 42

        print(inspect.getsource(answer), end="")
        print(inspect.getfile(answer).endswith("solution.py"))
        """,
    ),
    program(
        "traceback_print_exc_when_caught",
        """
        import traceback

        def fail():
            raise ValueError("caught")

        try:
            fail()
        except ValueError:
            traceback.print_exc()
        print("went on")
        """,
    ),
    program(
        "subprocess_of_sys_executable",
        """
        import subprocess, sys
        done = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True)
        print(done.returncode, done.stdout)
        print("parent", flush=True)
        subprocess.run([sys.executable, "-c", "print('child shares stdout')"])
        """,
    ),
]

OUTPUT = [
    program("no_trailing_newline", "import sys\nsys.stdout.write('no newline')\n"),
    program("carriage_returns_kept", "print('a\\r\\nb\\rc')\nprint('end\\r')\n"),
    program(
        "unicode_and_emoji",
        """
        print("grüße 世界 😀 🇫🇷 ∑")
        print("\\u00e9 vs e\\u0301", len("😀"))
        """,
    ),
    program(
        "invalid_utf8_on_stdout",
        """
        import sys
        sys.stdout.buffer.write(b"ok \\xff\\xfe bad\\n")
        """,
    ),
    program(
        "invalid_utf8_on_stderr",
        """
        import sys
        print("fine")
        sys.stderr.buffer.write(b"\\xc3\\x28\\n")
        """,
    ),
    program("lone_surrogate_on_stdout", "print('before')\nprint('\\ud800')\n"),
    program(
        "lone_surrogate_on_stderr_is_escaped",
        """
        import sys
        print("a\\ud800b", file=sys.stderr)
        """,
    ),
    program(
        "one_megabyte_of_output",
        """
        for i in range(100_000):
            print(str(i).zfill(9))
        """,
        run_timeout=30.0,
    ),
    program(
        "ten_megabytes_of_output",
        """
        import sys
        sys.stdout.write("\\n".join(str(i).zfill(9) for i in range(1_000_000)) + "\\n")
        """,
        run_timeout=60.0,
    ),
    program(
        "one_megabyte_on_stderr",
        """
        import sys
        for i in range(100_000):
            print(str(i).zfill(9), file=sys.stderr)
        """,
        run_timeout=30.0,
    ),
    program(
        "surrogate_escapes_on_stdout_are_bytes",
        """
        print("\\udcff\\udcfe", "ok")
        """,
    ),
    program(
        "binary_writes_and_the_stdout_buffer_size",
        """
        import os, sys
        sys.stdout.buffer.write(b"x" * 5000 + b"\\n")
        os.write(1, b"direct 1\\n")
        sys.stdout.buffer.write(b"y" * 3000 + b"\\n")
        os.write(1, b"direct 2\\n")
        """,
    ),
    program(
        "stderr_only",
        """
        import sys
        sys.stderr.write("only on stderr\\n")
        print("and this", file=sys.stderr)
        """,
    ),
    program(
        "interleaved_stdout_and_stderr",
        """
        import sys
        for i in range(5):
            print("out", i)
            print("err", i, file=sys.stderr)
        """,
    ),
    program(
        "print_flush_and_os_write_order",
        """
        import os
        print("buffered")
        os.write(1, b"direct\\n")
        print("flushed", flush=True)
        os.write(1, b"direct again\\n")
        """,
    ),
    program(
        "text_and_binary_layers_interleaved",
        """
        import sys
        print("text 1")
        sys.stdout.buffer.write(b"binary\\n")
        print("text 2")
        sys.stdout.flush()
        sys.stdout.buffer.write(b"binary 2\\n")
        """,
    ),
    program(
        "sys_stdout_write_returns_counts",
        """
        import sys
        counts = [sys.stdout.write(s) for s in ("abc", "héllo", "😀", "\\n")]
        print(counts, sys.stdout.buffer.write(b"bytes\\n"))
        """,
    ),
    program(
        "dev_stdout_and_dev_stderr",
        """
        print("via print")
        with open("/dev/stdout", "w") as out:
            out.write("via /dev/stdout\\n")
        with open("/dev/stderr", "w") as err:
            err.write("via /dev/stderr\\n")
        with open("/dev/fd/1", "wb") as out:
            out.write(b"via /dev/fd/1\\n")
        print("after")
        """,
    ),
    program(
        "print_to_a_file_and_read_back",
        """
        with open("out.txt", "w") as f:
            print("line", 1, file=f)
        print(open("out.txt").read(), end="")
        """,
    ),
]

RAISED_IN_A_THREAD = """\
import threading
{setup}

def work():
    print("thread starts", end="")
{statement}

thread = threading.Thread(target=work)
thread.start()
thread.join()
print("main done", end="")
"""


def raised_in_main_and_in_a_thread(what: str, statement: str, setup: str = "") -> list[Program]:
    """`statement` ending the main code, after output left in the buffer, and ending a thread."""
    return [
        program(f"{what}_at_module_level", f"{setup}\nprint('buffered', end='')\n{statement}\n"),
        program(
            f"{what}_in_a_thread",
            RAISED_IN_A_THREAD.format(setup=setup, statement=textwrap.indent(statement, "    ")),
        ),
    ]


CUSTOM_EXCEPTIONS = """
class Custom(BaseException):
    pass

class Done(SystemExit):
    pass

class Interrupted(KeyboardInterrupt):
    pass

class UnprintableError(Exception):
    def __str__(self):
        raise ValueError("no str")
"""

# Every way a process ends, with output still buffered where it can be: each uncaught
# BaseException (CPython kills itself with SIGINT after an uncaught KeyboardInterrupt, and
# ignores SystemExit in a thread), each SystemExit payload, os._exit, signals a solution sends
# itself, and exceptions where CPython only reports them (atexit, hooks, teardown).
EXITS = [
    *raised_in_main_and_in_a_thread("uncaught_keyboard_interrupt", "raise KeyboardInterrupt"),
    *raised_in_main_and_in_a_thread(
        "uncaught_keyboard_interrupt_with_a_message", "raise KeyboardInterrupt('stop')"
    ),
    *raised_in_main_and_in_a_thread(
        "uncaught_keyboard_interrupt_subclass", "raise Interrupted()", CUSTOM_EXCEPTIONS
    ),
    *raised_in_main_and_in_a_thread(
        "keyboard_interrupt_raised_while_handling_another",
        "try:\n    1 / 0\nexcept ZeroDivisionError as exc:\n    raise KeyboardInterrupt from exc",
    ),
    *raised_in_main_and_in_a_thread("uncaught_generator_exit", "raise GeneratorExit('closing')"),
    *raised_in_main_and_in_a_thread(
        "uncaught_custom_base_exception", "raise Custom('custom')", CUSTOM_EXCEPTIONS
    ),
    *raised_in_main_and_in_a_thread(
        "uncaught_system_exit_subclass", "raise Done(3)", CUSTOM_EXCEPTIONS
    ),
    *raised_in_main_and_in_a_thread(
        "uncaught_base_exception_group_holding_keyboard_interrupt",
        "raise BaseExceptionGroup('group', [KeyboardInterrupt(), ValueError(1)])",
    ),
    *raised_in_main_and_in_a_thread(
        "uncaught_exception_group_holding_system_exit",
        "raise BaseExceptionGroup('group', [SystemExit(4)])",
    ),
    *raised_in_main_and_in_a_thread(
        "uncaught_exception_whose_str_raises", "raise UnprintableError()", CUSTOM_EXCEPTIONS
    ),
    *raised_in_main_and_in_a_thread("uncaught_memory_error", "raise MemoryError"),
    program(
        "exception_raised_from_none",
        """
        try:
            {}[1]
        except KeyError:
            raise ValueError("clean") from None
        """,
    ),
    program(
        "keyboard_interrupt_with_a_replaced_excepthook",
        """
        import sys
        sys.excepthook = lambda kind, value, tb: print("hooked", kind.__name__)
        print("buffered", end="")
        raise KeyboardInterrupt
        """,
    ),
    program(
        "keyboard_interrupt_with_an_excepthook_raising_system_exit",
        """
        import sys

        def hook(kind, value, tb):
            raise SystemExit(9)

        sys.excepthook = hook
        raise KeyboardInterrupt
        """,
    ),
    program(
        "keyboard_interrupt_runs_finally_atexit_and_flush_first",
        """
        import atexit
        atexit.register(print, "atexit ran", end="")
        try:
            raise KeyboardInterrupt
        finally:
            print("finally ran")
        """,
    ),
    program(
        "keyboard_interrupt_then_os_exit_in_atexit",
        """
        import atexit, os
        atexit.register(os._exit, 5)
        raise KeyboardInterrupt
        """,
    ),
    program(
        "threading_excepthook_replaced",
        """
        import threading
        threading.excepthook = lambda args: print("hooked", args.exc_type, args.thread.name)
        thread = threading.Thread(target=lambda: 1 / 0, name="worker")
        thread.start()
        thread.join()
        print("main done")
        """,
    ),
    program(
        "threading_excepthook_that_raises",
        """
        import threading

        def hook(args):
            raise RuntimeError("hook failed")

        threading.excepthook = hook
        thread = threading.Thread(target=lambda: 1 / 0, name="worker")
        thread.start()
        thread.join()
        print("main done")
        """,
    ),
    program(
        "threading_excepthook_raising_system_exit",
        """
        import threading

        def hook(args):
            raise SystemExit(7)

        threading.excepthook = hook
        thread = threading.Thread(target=lambda: 1 / 0, name="worker")
        thread.start()
        thread.join()
        print("main done")
        """,
    ),
    program(
        "keyboard_interrupt_in_an_atexit_handler",
        """
        import atexit

        def stop():
            raise KeyboardInterrupt

        atexit.register(stop)
        print("main done", end="")
        """,
    ),
    program(
        "custom_base_exception_in_an_atexit_handler",
        """
        import atexit

        class Custom(BaseException):
            pass

        def stop():
            raise Custom("in atexit")

        atexit.register(stop)
        print("main done", end="")
        """,
    ),
    program(
        "os_exit_in_an_atexit_handler_loses_buffered_output",
        """
        import atexit, os
        atexit.register(os._exit, 6)
        print("lost", end="")
        """,
    ),
    program(
        "del_raising_at_teardown",
        """
        class Bad:
            def __del__(self):
                raise ValueError("in del")

        keep = Bad()
        print("main done", end="")
        """,
    ),
    program(
        "del_raising_keyboard_interrupt_at_teardown",
        """
        class Bad:
            def __del__(self):
                raise KeyboardInterrupt

        keep = Bad()
        print("main done", end="")
        """,
    ),
    program(
        "del_calling_sys_exit_at_teardown",
        """
        import sys

        class Bad:
            def __del__(self):
                sys.exit(5)

        keep = Bad()
        """,
    ),
    program(
        "del_importing_at_teardown",
        """
        class Late:
            def __del__(self):
                import os
                print("imported", os.sep)

        keep = Late()
        """,
    ),
    program(
        "sys_exit_none_after_buffered_output", "import sys\nprint('b', end='')\nsys.exit(None)\n"
    ),
    program("sys_exit_1_after_buffered_output", "import sys\nprint('b', end='')\nsys.exit(1)\n"),
    program("sys_exit_255", "import sys\nsys.exit(255)\n"),
    program("sys_exit_false_is_0", "import sys\nsys.exit(False)\n"),
    program("sys_exit_a_float", "import sys\nsys.exit(3.0)\n"),
    program("sys_exit_an_empty_string", "import sys\nprint('b', end='')\nsys.exit('')\n"),
    program("sys_exit_a_tuple", "import sys\nsys.exit((1, 2))\n"),
    program("system_exit_with_several_arguments", "raise SystemExit(1, 'two')\n"),
    program("sys_exit_an_int_enum", "import enum, sys\nsys.exit(enum.IntEnum('C', 'A B')(2))\n"),
    program("sys_exit_below_a_c_long", "import sys\nsys.exit(-(2 ** 70))\n"),
    program("sys_exit_beyond_a_c_int", "import sys\nsys.exit(2 ** 31 + 3)\n"),
    program(
        "sys_exit_an_object_whose_str_raises",
        """
        import atexit, sys

        class Unprintable:
            def __str__(self):
                raise ValueError("no str")

        atexit.register(print, "atexit ran")
        print("buffered", end="")
        sys.exit(Unprintable())
        """,
    ),
    program(
        "sys_exit_in_finally_replaces_the_exception",
        """
        import sys
        try:
            raise ValueError("hidden")
        finally:
            sys.exit(6)
        """,
    ),
    program("builtin_exit_with_a_string", "exit('bye')\n"),
    program("builtin_quit_after_buffered_output", "print('b', end='')\nquit(9)\n"),
    program("os_exit_255", "import os\nos._exit(255)\n"),
    program("os_exit_256_is_0", "import os\nprint('lost', end='')\nos._exit(256)\n"),
    program("os_exit_minus_1_is_255", "import os\nos._exit(-1)\n"),
    program(
        "os_exit_in_a_thread",
        """
        import os, threading, time
        print("flushed", flush=True)
        print("lost", end="")
        threading.Thread(target=os._exit, args=(3,)).start()
        time.sleep(5)
        """,
    ),
    program(
        "sigint_to_itself_is_an_uncaught_keyboard_interrupt",
        """
        import os, signal
        print("buffered", end="")
        os.kill(os.getpid(), signal.SIGINT)
        print("not reached")
        """,
    ),
    program(
        "sigint_raised_and_caught",
        """
        import signal
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            print("caught")
        """,
    ),
    program(
        "sigterm_to_itself_kills_it",
        """
        import os, signal
        print("flushed", flush=True)
        print("lost", end="")
        os.kill(os.getpid(), signal.SIGTERM)
        print("not reached")
        """,
    ),
    program(
        "sigkill_to_itself",
        """
        import os, signal
        print("flushed", flush=True)
        print("lost", end="")
        os.kill(os.getpid(), signal.SIGKILL)
        """,
    ),
    program(
        "sigsegv_to_itself",
        """
        import os, signal
        os.write(2, b"written\\n")
        os.kill(os.getpid(), signal.SIGSEGV)
        """,
    ),
    program("raise_signal_sigterm", "import signal\nprint('l', end='')\nsignal.raise_signal(15)\n"),
    program("raise_signal_sigusr1", "import signal\nsignal.raise_signal(signal.SIGUSR1)\n"),
    program(
        "raise_signal_sigchld_is_ignored",
        "import signal\nsignal.raise_signal(signal.SIGCHLD)\nprint('still here')\n",
    ),
    program(
        "pthread_kill_of_the_main_thread",
        """
        import signal, threading
        print("lost", end="")
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        """,
    ),
    program(
        "os_abort",
        """
        import os
        print("flushed", flush=True)
        print("lost", end="")
        os.abort()
        """,
    ),
    program(
        "sigterm_handler_exits",
        """
        import os, signal, sys

        def handler(signum, frame):
            print("handled", signal.Signals(signum).name, frame.f_lineno)
            sys.exit(3)

        signal.signal(signal.SIGTERM, handler)
        os.kill(os.getpid(), signal.SIGTERM)
        print("not reached")
        """,
    ),
    program(
        "sigterm_handler_raises",
        """
        import os, signal

        def handler(signum, frame):
            raise RuntimeError("from the handler")

        signal.signal(signal.SIGTERM, handler)
        os.kill(os.getpid(), signal.SIGTERM)
        """,
    ),
    program(
        "sigterm_handler_returns",
        """
        import os, signal
        signal.signal(signal.SIGTERM, lambda signum, frame: print("handled"))
        os.kill(os.getpid(), signal.SIGTERM)
        print("went on")
        """,
    ),
    program(
        "sigterm_ignored",
        """
        import os, signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.kill(os.getpid(), signal.SIGTERM)
        print("went on")
        """,
    ),
    program(
        "sigint_to_its_default_action",
        """
        import signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        print("lost", end="")
        signal.raise_signal(signal.SIGINT)
        """,
    ),
    program(
        "kill_with_an_invalid_signal",
        """
        import os
        try:
            os.kill(os.getpid(), 1000)
        except OSError as exc:
            print(type(exc).__name__, exc)
        os.kill(os.getpid(), 0)
        print("signal 0 checks only")
        """,
    ),
    program(
        "recursion_error_caught_then_sys_exit",
        """
        import sys

        def down(n):
            return down(n + 1)

        try:
            down(0)
        except RecursionError as exc:
            print("caught", exc)
        sys.exit(2)
        """,
    ),
    program(
        "deep_recursion_with_a_raised_limit",
        """
        import sys
        sys.setrecursionlimit(10 ** 6)

        def depth(n):
            return 0 if n == 0 else 1 + depth(n - 1)

        print(depth(200_000))
        """,
    ),
]

TIMEOUTS = [
    program("infinite_loop_times_out", "while True:\n    pass\n", run_timeout=1.0),
    program(
        "short_sleep_finishes",
        """
        import time
        time.sleep(0.3)
        print("woke")
        """,
        run_timeout=5.0,
    ),
]

DIVERGENCES = [
    program(
        "stdin_size_from_fstat",
        """
        import os, stat
        st = os.fstat(0)
        print(st.st_size, stat.S_ISFIFO(st.st_mode))
        """,
        stdin="abcdef",
        divergence=Divergence(
            "stdin is a file (as on Codeforces), so `os.fstat(0).st_size` is its size",
            {"stdout": "6 False\n"},
        ),
    ),
    program(
        "stdin_is_seekable",
        """
        import sys
        print(sys.stdin.readline().strip(), sys.stdin.seekable())
        """,
        stdin="abc\ndef\n",
        divergence=Divergence(
            "stdin is a file (as on Codeforces), so `os.fstat(0).st_size` is its size",
            {"stdout": "abc True\n"},
        ),
    ),
    program(
        "fork_fails",
        """
        import errno, os
        try:
            pid = os.fork()
        except OSError as exc:
            print("fork failed:", errno.errorcode[exc.errno])
        else:
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            print("forked")
        """,
        divergence=Divergence("No `os.fork()`", {"stdout": "fork failed: ENOTSUP\n"}),
    ),
    program(
        "os_system_has_no_shell",
        """
        import os
        print(os.system("echo from the shell") >> 8, flush=True)
        """,
        divergence=Divergence("no shell", {"stdout": "127\n"}),
    ),
    program(
        "timer_signal_never_fires",
        """
        import signal, time
        signal.signal(signal.SIGALRM, lambda *_: print("fired"))
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        time.sleep(0.6)
        print("slept")
        """,
        divergence=Divergence("timer signals", {"stdout": "slept\n"}),
    ),
    program(
        "process_time_does_not_advance",
        """
        import time
        start = time.process_time()
        sum(i * i for i in range(300_000))
        print(time.process_time() > start)
        """,
        divergence=Divergence("`time.process_time()` does not advance", {"stdout": "False\n"}),
    ),
    program(
        "faulthandler_report_of_a_fatal_signal_it_sends_itself",
        """
        import faulthandler, os
        faulthandler.enable()
        print("lost", end="")
        os.abort()
        """,
        divergence=Divergence("no `faulthandler` report", {"stderr": "", "last_stderr_line": ""}),
    ),
    program(
        "faulthandler_dump_shows_frames_beneath_the_solution",
        """
        import faulthandler
        with open("dump.txt", "w") as dump:
            faulthandler.dump_traceback(dump)
        frames = open("dump.txt").read().splitlines()[1:]
        print(all("solution.py" in frame for frame in frames))
        """,
        divergence=Divergence(
            "`faulthandler.dump_traceback` shows the runner's frames", {"stdout": "False\n"}
        ),
    ),
    program(
        "recursion_through_c_code_stops_sooner",
        """
        import functools, sys
        sys.setrecursionlimit(10 ** 6)
        deepest = 0

        @functools.lru_cache(maxsize=None)
        def down(n):
            global deepest
            deepest = n
            return down(n + 1)

        try:
            down(0)
        except RecursionError:
            print(deepest)
        """,
        divergence=Divergence("through C code", {"stdout": "495\n"}),
    ),
    program(
        "partial_output_on_timeout",
        """
        import time
        print("started", flush=True)
        time.sleep(30)
        """,
        run_timeout=1.0,
        divergence=Divergence(
            "On a timeout, the solution's partial output is not returned", {"stdout": ""}
        ),
    ),
]

RANDOM = program(
    "random_numbers_differ_between_runs",
    """
    import random
    print([random.randrange(10 ** 9) for _ in range(4)], random.random())
    """,
    runs=2,
)

PROGRAMS = [*STDIN, *ENDINGS, *EXITS, *ENVIRONMENT, *OUTPUT, *TIMEOUTS, *DIVERGENCES]


# ---------------------------------------------------------------------------------------------
# The reference: CPython as Sandbox Fusion runs it.


def _sandbox_fusion_decode(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        return f"[DecodeError] {exc}"


def _feed(fd: int, data: bytes) -> None:
    try:
        with open(fd, "wb") as pipe:
            pipe.write(data)
    except BrokenPipeError:
        pass


def reference_run(prog: Program) -> Shape:
    """Run `prog` as Sandbox Fusion runs Python, and answer as it answers."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "solution.py")
        Path(path).write_bytes(prog.code.encode())
        stdin_read, stdin_write = os.pipe()
        proc = subprocess.Popen(
            [REFERENCE_PYTHON, path],
            cwd=directory,
            stdin=stdin_read,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8"},
            start_new_session=True,
        )
        os.close(stdin_read)
        feeder = threading.Thread(target=_feed, args=(stdin_write, (prog.stdin or "").encode()))
        feeder.start()
        try:
            stdout, stderr = proc.communicate(timeout=prog.run_timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            timed_out = True
        finally:
            feeder.join()
    return_code = None if timed_out else proc.returncode
    response = {
        "status": "Success" if return_code == 0 else "Failed",
        "run_result": {
            "status": "TimeLimitExceeded" if timed_out else "Finished",
            "return_code": return_code,
            "stdout": _sandbox_fusion_decode(stdout),
            "stderr": _sandbox_fusion_decode(stderr),
        },
    }
    return shape(response, directory)


def our_run(prog: Program) -> Shape:
    response, error = run_code("hyperlight://", prog.code, prog.stdin, 10, prog.run_timeout, 1024)
    assert error is None, error
    assert response is not None
    return shape(response, runner.WORK_DIR)


_ADDRESS = re.compile(r"0x[0-9a-f]+")


def shape(response: Response, solution_dir: str) -> Shape:
    """What is compared: everything a verl reward reads, with the solution's directory and
    object addresses (which legitimately differ) normalised in stderr."""
    run = response["run_result"]
    stderr = _ADDRESS.sub("0x?", run["stderr"].replace(solution_dir, "<dir>"))
    return {
        "status": response["status"],
        "run_status": run["status"],
        "return_code": run["return_code"],
        "stdout": run["stdout"],
        "stderr": stderr,
        "last_stderr_line": ([""] + [line for line in stderr.splitlines() if line.strip()])[-1],
    }


# ---------------------------------------------------------------------------------------------


class Answers:
    """Every selected program's answers, ours and the reference's, computed together on first
    use (in parallel: run_code is thread-safe) while the test asking holds the stand-in. A run
    that raised raises again in its own program's test only."""

    def __init__(self, programs: list[Program]) -> None:
        self.programs = programs
        self.results: dict[str, tuple[list[Future[Shape]], list[Future[Shape]]]] | None = None
        self.lock = threading.Lock()

    def of(self, prog: Program) -> tuple[list[Shape], list[Shape]]:
        with self.lock:
            if self.results is None:
                self.results = self._run_all()
        ours, reference = self.results[prog.name]
        return [f.result() for f in ours], [f.result() for f in reference]

    def _run_all(self) -> dict[str, tuple[list[Future[Shape]], list[Future[Shape]]]]:
        workers = max(4, 2 * (os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            # The slowest first, so they do not finish the batch alone.
            ordered = sorted(self.programs, key=lambda p: -p.run_timeout)
            return {
                p.name: (
                    [pool.submit(our_run, p) for _ in range(p.runs)],
                    [pool.submit(reference_run, p) for _ in range(p.runs)],
                )
                for p in ordered
            }


@pytest.fixture(scope="module")
def answers(request: pytest.FixtureRequest) -> Answers:
    selected = {
        item.callspec.params["prog"].name: item.callspec.params["prog"]
        for item in request.session.items
        if item.module is request.module
        and hasattr(item, "callspec")
        and "prog" in item.callspec.params
    }
    return Answers(list(selected.values()))


def _param(prog: Program) -> Any:
    return pytest.param(prog, id=prog.name)


def test_suite_is_large_enough_and_names_are_unique() -> None:
    names = [p.name for p in [*PROGRAMS, RANDOM]]
    assert len(names) >= 60
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("prog", [_param(p) for p in PROGRAMS if p.divergence is None])
def test_program_answers_as_cpython_under_sandbox_fusion(
    hluk: Path, answers: Answers, prog: Program
) -> None:
    (ours,), (reference,) = answers.of(prog)
    assert ours == reference


def _known_limits() -> str:
    text = README.read_text()
    return text.split("## Known limits", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("prog", [_param(p) for p in PROGRAMS if p.divergence is not None])
def test_documented_divergence_is_real_and_is_all_that_differs(
    hluk: Path, answers: Answers, prog: Program
) -> None:
    assert prog.divergence is not None
    assert prog.divergence.limit in " ".join(_known_limits().split())
    (ours,), (reference,) = answers.of(prog)
    assert {k: reference[k] for k in prog.divergence.ours} != prog.divergence.ours
    assert ours == {**reference, **prog.divergence.ours}


@pytest.mark.parametrize("prog", [_param(RANDOM)])
def test_random_numbers_differ_between_runs_on_both_sides(
    hluk: Path, answers: Answers, prog: Program
) -> None:
    ours, reference = answers.of(prog)
    for first, second in (ours, reference):
        assert first["status"] == second["status"] == "Success"
        assert first["stdout"] != second["stdout"]
    assert {len(str(r["stdout"]).split()) for r in [*ours, *reference]} == {5}
