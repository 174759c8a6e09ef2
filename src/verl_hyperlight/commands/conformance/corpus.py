"""The conformance corpus: programs whose answers under verl-hyperlight must be those CPython 3.12
gives when Sandbox Fusion runs them (``python solution.py`` in a fresh directory, stdin a pipe
written then closed, a clean environment, a wall-clock limit).

Each program belongs to a family (what it exercises) and may name a documented divergence: the
"Known limits" sentence (docs/known-limits.md) that explains it (``known_limits``) and what
a micro-VM answers instead. The answers CPython 3.12 gave are recorded beside this module
(``expected.json``), so a node checks itself against them without a second interpreter; the
test suite re-records them and compares.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from . import known_limits

OUTPUT = "output"
INPUT = "input"
EXCEPTIONS = "exceptions"
EXITS = "exits and signals"
THREADS = "threads"
TIMEOUTS = "timeouts"
LIMITS = "limits"
FILES = "files"
UNICODE = "unicode and bytes"
PREIMPORTS = "preimports and reseeding"
MEMORY = "memory"
FAMILIES = (
    OUTPUT,
    INPUT,
    EXCEPTIONS,
    EXITS,
    THREADS,
    TIMEOUTS,
    LIMITS,
    FILES,
    UNICODE,
    PREIMPORTS,
    MEMORY,
)


@dataclass(frozen=True)
class Divergence:
    """A documented difference: `limit` is the "Known limits" sentence (docs/known-limits.md)
    that explains it (``known_limits``), which its verdict quotes; `ours` the compared fields a
    micro-VM answers instead of CPython's (what the stand-in answers; a real micro-VM may
    answer other values in those same fields)."""

    limit: str
    ours: dict[str, object]


@dataclass(frozen=True)
class Program:
    """A solution and its stdin, run `runs` times with the same run_timeout. A program that
    `varies` prints something else on every run (random numbers): its stdout is compared by its
    number of words, and its runs must differ. One that `needs` modules runs only in an image
    that has them."""

    name: str
    family: str
    code: str
    stdin: str | None = None
    run_timeout: float = 10.0
    divergence: Divergence | None = None
    runs: int = 1
    varies: bool = False
    needs: tuple[str, ...] = ()


def program(
    name: str,
    family: str,
    code: str,
    *,
    stdin: str | None = None,
    run_timeout: float = 10.0,
    divergence: Divergence | None = None,
    runs: int = 1,
    varies: bool = False,
    needs: tuple[str, ...] = (),
) -> Program:
    """A Program whose code may be written indented, inside a triple-quoted string."""
    return Program(
        name,
        family,
        textwrap.dedent(code).lstrip("\n"),
        stdin,
        run_timeout,
        divergence,
        runs,
        varies,
        needs,
    )


LINES = "3\n10 20\n30 40\n50 60\n"
BIG_STDIN = "".join(f"{i} {i * i}\n" for i in range(70_000))  # about 1 MB, several pipe fills

STDIN = [
    program(
        "input_until_eof_error",
        INPUT,
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
        INPUT,
        """
        print(repr(input()), repr(input()))
        """,
        stdin="first\nlast",
    ),
    program(
        "input_with_prompt_writes_the_prompt_to_stdout",
        INPUT,
        """
        name = input("name? ")
        print("hello", name)
        """,
        stdin="ada\n",
    ),
    program(
        "input_at_eof_is_an_uncaught_eof_error",
        INPUT,
        """
        print("before")
        input()
        """,
        stdin="",
    ),
    program(
        "input_keeps_carriage_returns",
        INPUT,
        """
        print(repr(input()), repr(input()))
        import sys
        print(repr(sys.stdin.read()))
        """,
        stdin="a\r\nb\r\nc\rd\r\n",
    ),
    program(
        "competitive_map_int_split",
        INPUT,
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
        INPUT,
        """
        import sys
        for number, line in enumerate(sys.stdin):
            print(number, repr(line))
        """,
        stdin=LINES,
    ),
    program(
        "sys_stdin_read",
        INPUT,
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
        INPUT,
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
        INPUT,
        """
        import sys
        print(sys.stdin.readlines())
        """,
        stdin=LINES + "no newline",
    ),
    program(
        "readline_then_read_the_rest",
        INPUT,
        """
        import sys
        first = sys.stdin.readline()
        print(repr(first), repr(sys.stdin.read()))
        """,
        stdin=LINES,
    ),
    program(
        "sys_stdin_buffer_read_bytes",
        UNICODE,
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
        INPUT,
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
        INPUT,
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
        INPUT,
        """
        data = open(0).read()
        print(repr(data))
        """,
        stdin=LINES,
    ),
    program(
        "open_dev_stdin",
        INPUT,
        """
        with open("/dev/stdin") as f:
            print(f.read().split())
        """,
        stdin=LINES,
    ),
    program(
        "open_dev_fd_0_binary",
        INPUT,
        """
        with open("/dev/fd/0", "rb") as f:
            print(f.read())
        """,
        stdin=LINES,
    ),
    program(
        "os_open_dev_stdin",
        INPUT,
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
        INPUT,
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
        INPUT,
        """
        import sys
        print(repr(sys.stdin.read()), repr(sys.stdin.readline()))
        """,
        stdin=None,
    ),
    program(
        "stdin_empty_is_immediate_eof",
        INPUT,
        """
        import sys
        print(repr(sys.stdin.read()), repr(sys.stdin.readline()))
        """,
        stdin="",
    ),
    program(
        "fileinput_reads_stdin",
        INPUT,
        """
        import fileinput
        for line in fileinput.input():
            print(fileinput.lineno(), fileinput.filename(), line.strip())
        """,
        stdin=LINES,
    ),
    program(
        "stdin_unicode_text",
        UNICODE,
        """
        text = input()
        print(len(text), text.upper(), [hex(ord(c)) for c in text[-2:]])
        """,
        stdin="grüße, 世界 😀\n",
    ),
]

ENDINGS = [
    program("sys_exit_no_argument", EXITS, "import sys\nprint('a')\nsys.exit()\nprint('b')\n"),
    program("sys_exit_0", EXITS, "import sys\nprint('a')\nsys.exit(0)\n"),
    program("sys_exit_3", EXITS, "import sys\nprint('a')\nsys.exit(3)\n"),
    program("sys_exit_message", EXITS, "import sys\nprint('a')\nsys.exit('the message')\n"),
    program("sys_exit_256_wraps_to_0", EXITS, "import sys\nsys.exit(256)\n"),
    program("sys_exit_minus_1_is_255", EXITS, "import sys\nsys.exit(-1)\n"),
    program("sys_exit_true_is_1", EXITS, "import sys\nsys.exit(True)\n"),
    program("sys_exit_beyond_a_c_long", EXITS, "import sys\nsys.exit(2 ** 70)\n"),
    program("sys_exit_an_object", EXITS, "import sys\nsys.exit(['not', 'a', 'number'])\n"),
    program("raise_system_exit", EXITS, "print('a')\nraise SystemExit(7)\n"),
    program("builtin_exit", EXITS, "print('a')\nexit(4)\n"),
    program("builtin_quit", EXITS, "print('a')\nquit()\n"),
    program(
        "sys_exit_runs_finally_blocks",
        EXITS,
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
        EXCEPTIONS,
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
        EXCEPTIONS,
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
        EXCEPTIONS,
        """
        try:
            {}["missing"]
        except KeyError:
            [][1]
        """,
    ),
    program(
        "exception_group",
        EXCEPTIONS,
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
    program("syntax_error", EXCEPTIONS, "print('a')\ndef f(:\n    pass\n"),
    program("unclosed_parenthesis", EXCEPTIONS, "x = (1,\nprint(x\n"),
    program("indentation_error", EXCEPTIONS, "if True:\nprint('a')\n"),
    program("unexpected_indent", EXCEPTIONS, "x = 1\n    y = 2\n"),
    program(
        "os_exit_after_flush_keeps_output",
        EXITS,
        """
        import os, sys
        print("kept", flush=True)
        sys.stderr.write("also kept\\n")
        os._exit(4)
        """,
    ),
    program(
        "os_exit_loses_unflushed_output",
        EXITS,
        """
        import os, sys
        print("lost")
        sys.stderr.write("lost too, no newline")
        os._exit(0)
        """,
    ),
    program(
        "os_exit_with_a_string_is_a_type_error",
        EXITS,
        """
        import os
        os._exit("3")
        """,
    ),
    program(
        "closed_stdout_then_exit",
        EXITS,
        """
        import sys
        print("written")
        sys.stdout.close()
        """,
    ),
    program(
        "closed_descriptor_1_then_print_is_status_120",
        EXITS,
        """
        import os
        print("never seen")
        os.close(1)
        print("nor this")
        """,
    ),
    program(
        "atexit_handlers_run_last_in_first_out",
        EXITS,
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
        EXITS,
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
        EXITS,
        """
        import atexit, sys
        atexit.register(lambda: print("atexit", getattr(sys, "last_value", None)))
        raise KeyError("boom")
        """,
    ),
    program(
        "module_globals_at_exit",
        EXITS,
        """
        import atexit
        atexit.register(lambda: print(sorted(k for k in globals() if k.startswith("__"))))
        print(list(globals()))
        """,
    ),
    program(
        "module_globals_at_exit_after_sys_exit",
        EXITS,
        """
        import atexit, sys
        atexit.register(lambda: print("__file__" in globals(), "__cached__" in globals()))
        sys.exit(0)
        """,
    ),
    program(
        "non_daemon_thread_finishes_after_main",
        THREADS,
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
        THREADS,
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
        THREADS,
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
        THREADS,
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
        THREADS,
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
        THREADS,
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
        THREADS,
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
        THREADS,
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
        EXITS,
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
        EXITS,
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
        EXITS,
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
        EXITS,
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
        EXITS,
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
        EXCEPTIONS,
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
        EXCEPTIONS,
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
        EXCEPTIONS,
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
        EXCEPTIONS,
        """
        import sys
        del sys.excepthook
        raise ValueError("shown anyway")
        """,
    ),
    program(
        "excepthook_not_callable",
        EXCEPTIONS,
        """
        import sys
        sys.excepthook = None
        raise ValueError("shown anyway")
        """,
    ),
    program(
        "excepthook_sees_no_exception_being_handled",
        EXCEPTIONS,
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
        FILES,
        """
        data = open("input.txt").read()
        """,
    ),
    program(
        "thread_refused_after_main_ends",
        THREADS,
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
        THREADS,
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
        UNICODE,
        "print('a')\nx = 1\0 + 2\n",
    ),
    program(
        "source_encoding_declaration",
        UNICODE,
        "# -*- coding: latin-1 -*-\nprint('é', len('é'))\n",
    ),
    program(
        "source_with_byte_order_mark",
        UNICODE,
        "\ufeffprint('bom', __doc__)\n",
    ),
    program(
        "module_docstring",
        FILES,
        '''"""The solution's docstring."""\nprint(__doc__)\n''',
    ),
    program(
        "recursion_limit_errors",
        LIMITS,
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
        EXITS,
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
        EXITS,
        """
        import atexit, sys
        atexit.register(lambda: print("earlier handler still runs"))
        atexit.register(sys.exit, 5)
        print("main done")
        """,
    ),
    program(
        "uncaught_exception_with_stderr_closed",
        EXCEPTIONS,
        """
        import sys
        print("out")
        sys.stderr.close()
        raise ValueError("lost")
        """,
    ),
    program(
        "uncaught_recursion_error",
        LIMITS,
        """
        def down(n):
            return down(n + 1)

        down(0)
        """,
    ),
    program(
        "recursion_depth_reached",
        LIMITS,
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
        THREADS,
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
        FILES,
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
        FILES,
        """
        # a comment that must come back
        print(open(__file__).read(), end="")
        """,
    ),
    program(
        "only_the_main_thread_runs",
        THREADS,
        """
        import threading
        current = threading.current_thread()
        print(threading.active_count(), current.name, current is threading.main_thread())
        """,
    ),
    program(
        "main_module_is_this_module",
        FILES,
        """
        import sys, __main__
        marker = object()
        print(__main__.marker is marker, sys.modules["__main__"] is __main__)
        print(__main__.__file__ == __file__)
        """,
    ),
    program(
        "working_directory_is_writable_and_private",
        FILES,
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
        FILES,
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
        THREADS,
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
        LIMITS,
        """
        import sys
        sys.set_int_max_str_digits(0)
        n = 3 ** 20_000
        print(len(str(n)), str(n)[:20], n % 1_000_000_007)
        """,
    ),
    program(
        "big_integer_string_limit",
        LIMITS,
        """
        print(len(str(10 ** 4299)))
        print(str(10 ** 4300))
        """,
    ),
    program(
        "streams_are_not_terminals",
        OUTPUT,
        """
        import os, sys
        print(sys.stdin.isatty(), sys.stdout.isatty(), sys.stderr.isatty())
        print(os.isatty(0), os.isatty(1), os.isatty(2))
        """,
    ),
    program(
        "standard_stream_attributes",
        OUTPUT,
        """
        import sys
        for s in (sys.stdin, sys.stdout, sys.stderr):
            print(s.name, s.mode, s.encoding, s.errors, s.line_buffering, s.fileno())
            print(s is getattr(sys, "__%s__" % s.name.strip("<>")), s.buffer.raw.name)
        """,
    ),
    program(
        "stdout_buffer_size_as_for_a_pipe",
        OUTPUT,
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
        OUTPUT,
        """
        import warnings
        warnings.warn("careful")
        warnings.warn("old", DeprecationWarning)
        print("done")
        """,
    ),
    program(
        "pickle_of_a_main_class",
        FILES,
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
        FILES,
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
        FILES,
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
        EXCEPTIONS,
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
        OUTPUT,
        """
        import subprocess, sys
        done = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True)
        print(done.returncode, done.stdout)
        print("parent", flush=True)
        subprocess.run([sys.executable, "-c", "print('child shares stdout')"])
        """,
    ),
]

OUTPUT_CASES = [
    program("no_trailing_newline", OUTPUT, "import sys\nsys.stdout.write('no newline')\n"),
    program("carriage_returns_kept", OUTPUT, "print('a\\r\\nb\\rc')\nprint('end\\r')\n"),
    program(
        "unicode_and_emoji",
        UNICODE,
        """
        print("grüße 世界 😀 🇫🇷 ∑")
        print("\\u00e9 vs e\\u0301", len("😀"))
        """,
    ),
    program(
        "invalid_utf8_on_stdout",
        UNICODE,
        """
        import sys
        sys.stdout.buffer.write(b"ok \\xff\\xfe bad\\n")
        """,
    ),
    program(
        "invalid_utf8_on_stderr",
        UNICODE,
        """
        import sys
        print("fine")
        sys.stderr.buffer.write(b"\\xc3\\x28\\n")
        """,
    ),
    program("lone_surrogate_on_stdout", UNICODE, "print('before')\nprint('\\ud800')\n"),
    program(
        "lone_surrogate_on_stderr_is_escaped",
        UNICODE,
        """
        import sys
        print("a\\ud800b", file=sys.stderr)
        """,
    ),
    program(
        "one_megabyte_of_output",
        LIMITS,
        """
        for i in range(100_000):
            print(str(i).zfill(9))
        """,
        run_timeout=30.0,
    ),
    program(
        "ten_megabytes_of_output",
        LIMITS,
        """
        import sys
        sys.stdout.write("\\n".join(str(i).zfill(9) for i in range(1_000_000)) + "\\n")
        """,
        run_timeout=60.0,
    ),
    program(
        "one_megabyte_on_stderr",
        LIMITS,
        """
        import sys
        for i in range(100_000):
            print(str(i).zfill(9), file=sys.stderr)
        """,
        run_timeout=30.0,
    ),
    program(
        "surrogate_escapes_on_stdout_are_bytes",
        UNICODE,
        """
        print("\\udcff\\udcfe", "ok")
        """,
    ),
    program(
        "binary_writes_and_the_stdout_buffer_size",
        UNICODE,
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
        OUTPUT,
        """
        import sys
        sys.stderr.write("only on stderr\\n")
        print("and this", file=sys.stderr)
        """,
    ),
    program(
        "interleaved_stdout_and_stderr",
        OUTPUT,
        """
        import sys
        for i in range(5):
            print("out", i)
            print("err", i, file=sys.stderr)
        """,
    ),
    program(
        "print_flush_and_os_write_order",
        OUTPUT,
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
        OUTPUT,
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
        UNICODE,
        """
        import sys
        counts = [sys.stdout.write(s) for s in ("abc", "héllo", "😀", "\\n")]
        print(counts, sys.stdout.buffer.write(b"bytes\\n"))
        """,
    ),
    program(
        "dev_stdout_and_dev_stderr",
        OUTPUT,
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
        OUTPUT,
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


def raised_in_main_and_in_a_thread(
    what: str, family: str, statement: str, setup: str = ""
) -> list[Program]:
    """`statement` ending the main code, after output left in the buffer, and ending a thread."""
    return [
        program(
            f"{what}_at_module_level", family, f"{setup}\nprint('buffered', end='')\n{statement}\n"
        ),
        program(
            f"{what}_in_a_thread",
            THREADS,
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
ENDS = [
    *raised_in_main_and_in_a_thread(
        "uncaught_keyboard_interrupt", EXITS, "raise KeyboardInterrupt"
    ),
    *raised_in_main_and_in_a_thread(
        "uncaught_keyboard_interrupt_with_a_message", EXITS, "raise KeyboardInterrupt('stop')"
    ),
    *raised_in_main_and_in_a_thread(
        "uncaught_keyboard_interrupt_subclass", EXITS, "raise Interrupted()", CUSTOM_EXCEPTIONS
    ),
    *raised_in_main_and_in_a_thread(
        "keyboard_interrupt_raised_while_handling_another",
        EXITS,
        "try:\n    1 / 0\nexcept ZeroDivisionError as exc:\n    raise KeyboardInterrupt from exc",
    ),
    *raised_in_main_and_in_a_thread(
        "uncaught_generator_exit", EXITS, "raise GeneratorExit('closing')"
    ),
    *raised_in_main_and_in_a_thread(
        "uncaught_custom_base_exception", EXITS, "raise Custom('custom')", CUSTOM_EXCEPTIONS
    ),
    *raised_in_main_and_in_a_thread(
        "uncaught_system_exit_subclass", EXITS, "raise Done(3)", CUSTOM_EXCEPTIONS
    ),
    *raised_in_main_and_in_a_thread(
        "uncaught_base_exception_group_holding_keyboard_interrupt",
        EXITS,
        "raise BaseExceptionGroup('group', [KeyboardInterrupt(), ValueError(1)])",
    ),
    *raised_in_main_and_in_a_thread(
        "uncaught_exception_group_holding_system_exit",
        EXITS,
        "raise BaseExceptionGroup('group', [SystemExit(4)])",
    ),
    *raised_in_main_and_in_a_thread(
        "uncaught_exception_whose_str_raises", EXITS, "raise UnprintableError()", CUSTOM_EXCEPTIONS
    ),
    program(
        "exception_raised_from_none",
        EXCEPTIONS,
        """
        try:
            {}[1]
        except KeyError:
            raise ValueError("clean") from None
        """,
    ),
    program(
        "keyboard_interrupt_with_a_replaced_excepthook",
        EXCEPTIONS,
        """
        import sys
        sys.excepthook = lambda kind, value, tb: print("hooked", kind.__name__)
        print("buffered", end="")
        raise KeyboardInterrupt
        """,
    ),
    program(
        "keyboard_interrupt_with_an_excepthook_raising_system_exit",
        EXCEPTIONS,
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
        EXITS,
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
        EXITS,
        """
        import atexit, os
        atexit.register(os._exit, 5)
        raise KeyboardInterrupt
        """,
    ),
    program(
        "threading_excepthook_replaced",
        THREADS,
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
        THREADS,
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
        THREADS,
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
        EXITS,
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
        EXITS,
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
        EXITS,
        """
        import atexit, os
        atexit.register(os._exit, 6)
        print("lost", end="")
        """,
    ),
    program(
        "del_raising_at_teardown",
        EXITS,
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
        EXITS,
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
        EXITS,
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
        EXITS,
        """
        class Late:
            def __del__(self):
                import os
                print("imported", os.sep)

        keep = Late()
        """,
    ),
    program(
        "sys_exit_none_after_buffered_output",
        EXITS,
        "import sys\nprint('b', end='')\nsys.exit(None)\n",
    ),
    program(
        "sys_exit_1_after_buffered_output", EXITS, "import sys\nprint('b', end='')\nsys.exit(1)\n"
    ),
    program("sys_exit_255", EXITS, "import sys\nsys.exit(255)\n"),
    program("sys_exit_false_is_0", EXITS, "import sys\nsys.exit(False)\n"),
    program("sys_exit_a_float", EXITS, "import sys\nsys.exit(3.0)\n"),
    program("sys_exit_an_empty_string", EXITS, "import sys\nprint('b', end='')\nsys.exit('')\n"),
    program("sys_exit_a_tuple", EXITS, "import sys\nsys.exit((1, 2))\n"),
    program("system_exit_with_several_arguments", EXITS, "raise SystemExit(1, 'two')\n"),
    program(
        "sys_exit_an_int_enum", EXITS, "import enum, sys\nsys.exit(enum.IntEnum('C', 'A B')(2))\n"
    ),
    program("sys_exit_below_a_c_long", EXITS, "import sys\nsys.exit(-(2 ** 70))\n"),
    program("sys_exit_beyond_a_c_int", EXITS, "import sys\nsys.exit(2 ** 31 + 3)\n"),
    program(
        "sys_exit_an_object_whose_str_raises",
        EXITS,
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
        EXITS,
        """
        import sys
        try:
            raise ValueError("hidden")
        finally:
            sys.exit(6)
        """,
    ),
    program("builtin_exit_with_a_string", EXITS, "exit('bye')\n"),
    program("builtin_quit_after_buffered_output", EXITS, "print('b', end='')\nquit(9)\n"),
    program("os_exit_255", EXITS, "import os\nos._exit(255)\n"),
    program("os_exit_256_is_0", EXITS, "import os\nprint('lost', end='')\nos._exit(256)\n"),
    program("os_exit_minus_1_is_255", EXITS, "import os\nos._exit(-1)\n"),
    program(
        "os_exit_in_a_thread",
        THREADS,
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
        EXITS,
        """
        import os, signal
        print("buffered", end="")
        os.kill(os.getpid(), signal.SIGINT)
        print("not reached")
        """,
    ),
    program(
        "sigint_raised_and_caught",
        EXITS,
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
        EXITS,
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
        EXITS,
        """
        import os, signal
        print("flushed", flush=True)
        print("lost", end="")
        os.kill(os.getpid(), signal.SIGKILL)
        """,
    ),
    program(
        "sigsegv_to_itself",
        EXITS,
        """
        import os, signal
        os.write(2, b"written\\n")
        os.kill(os.getpid(), signal.SIGSEGV)
        """,
    ),
    program(
        "raise_signal_sigterm",
        EXITS,
        "import signal\nprint('l', end='')\nsignal.raise_signal(15)\n",
    ),
    program("raise_signal_sigusr1", EXITS, "import signal\nsignal.raise_signal(signal.SIGUSR1)\n"),
    program(
        "raise_signal_sigchld_is_ignored",
        EXITS,
        "import signal\nsignal.raise_signal(signal.SIGCHLD)\nprint('still here')\n",
    ),
    program(
        "pthread_kill_of_the_main_thread",
        EXITS,
        """
        import signal, threading
        print("lost", end="")
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        """,
    ),
    program(
        "os_abort",
        EXITS,
        """
        import os
        print("flushed", flush=True)
        print("lost", end="")
        os.abort()
        """,
    ),
    program(
        "sigterm_handler_exits",
        EXITS,
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
        EXITS,
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
        EXITS,
        """
        import os, signal
        signal.signal(signal.SIGTERM, lambda signum, frame: print("handled"))
        os.kill(os.getpid(), signal.SIGTERM)
        print("went on")
        """,
    ),
    program(
        "sigterm_ignored",
        EXITS,
        """
        import os, signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.kill(os.getpid(), signal.SIGTERM)
        print("went on")
        """,
    ),
    program(
        "sigint_to_its_default_action",
        EXITS,
        """
        import signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        print("lost", end="")
        signal.raise_signal(signal.SIGINT)
        """,
    ),
    program(
        "kill_with_an_invalid_signal",
        EXITS,
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
        LIMITS,
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
        LIMITS,
        """
        import sys
        sys.setrecursionlimit(10 ** 6)

        def depth(n):
            return 0 if n == 0 else 1 + depth(n - 1)

        print(depth(200_000))
        """,
    ),
]

TIMEOUT_CASES = [
    program("infinite_loop_times_out", TIMEOUTS, "while True:\n    pass\n", run_timeout=1.0),
    program(
        "short_sleep_finishes",
        TIMEOUTS,
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
        INPUT,
        """
        import os, stat
        st = os.fstat(0)
        print(st.st_size, stat.S_ISFIFO(st.st_mode))
        """,
        stdin="abcdef",
        divergence=Divergence(known_limits.STDIN_IS_A_FILE, {"stdout": "6 False\n"}),
    ),
    program(
        "stdin_is_seekable",
        INPUT,
        """
        import sys
        print(sys.stdin.readline().strip(), sys.stdin.seekable())
        """,
        stdin="abc\ndef\n",
        divergence=Divergence(known_limits.STDIN_IS_A_FILE, {"stdout": "abc True\n"}),
    ),
    program(
        "fork_fails",
        EXITS,
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
        divergence=Divergence(known_limits.NO_FORK, {"stdout": "fork failed: ENOTSUP\n"}),
    ),
    program(
        "os_system_has_no_shell",
        EXITS,
        """
        import os
        print(os.system("echo from the shell") >> 8, flush=True)
        """,
        divergence=Divergence(known_limits.NO_FORK, {"stdout": "127\n"}),
    ),
    program(
        "timer_signal_never_fires",
        EXITS,
        """
        import signal, time
        signal.signal(signal.SIGALRM, lambda *_: print("fired"))
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        time.sleep(0.6)
        print("slept")
        """,
        divergence=Divergence(known_limits.NO_CPU_CLOCK, {"stdout": "slept\n"}),
    ),
    program(
        "process_time_does_not_advance",
        TIMEOUTS,
        """
        import time
        start = time.process_time()
        sum(i * i for i in range(300_000))
        print(time.process_time() > start)
        """,
        divergence=Divergence(known_limits.NO_CPU_CLOCK, {"stdout": "False\n"}),
    ),
    program(
        "faulthandler_report_of_a_fatal_signal_it_sends_itself",
        EXITS,
        """
        import faulthandler, os
        faulthandler.enable()
        print("lost", end="")
        os.abort()
        """,
        divergence=Divergence(
            known_limits.NO_FAULTHANDLER_REPORT, {"stderr": "", "last_stderr_line": ""}
        ),
    ),
    program(
        "faulthandler_dump_shows_frames_beneath_the_solution",
        EXITS,
        """
        import faulthandler
        with open("dump.txt", "w") as dump:
            faulthandler.dump_traceback(dump)
        frames = open("dump.txt").read().splitlines()[1:]
        print(all("solution.py" in frame for frame in frames))
        """,
        divergence=Divergence(known_limits.RUNNER_FRAMES_IN_DUMPS, {"stdout": "False\n"}),
    ),
    program(
        "recursion_through_c_code_stops_sooner",
        LIMITS,
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
        divergence=Divergence(known_limits.SHALLOWER_C_RECURSION, {"stdout": "495\n"}),
    ),
    program(
        "partial_output_on_timeout",
        TIMEOUTS,
        """
        import time
        print("started", flush=True)
        time.sleep(30)
        """,
        run_timeout=1.0,
        divergence=Divergence(known_limits.NO_OUTPUT_ON_TIMEOUT, {"stdout": ""}),
    ),
]

MEMORY_USE = [
    program(
        "allocate_two_hundred_megabytes",
        MEMORY,
        """
        data = bytearray(200 * 2**20)
        data[-1] = 7
        print(len(data), sum(data[-16:]))
        """,
    ),
    program(
        "millions_of_small_objects",
        MEMORY,
        """
        numbers = [str(i) for i in range(1_000_000)]
        print(len(numbers), sum(map(len, numbers)))
        """,
    ),
    program(
        "impossible_allocation_is_a_memory_error",
        MEMORY,
        """
        try:
            bytearray(2**50)
        except MemoryError as exc:
            print("MemoryError", repr(exc))
        """,
    ),
    *raised_in_main_and_in_a_thread("uncaught_memory_error", MEMORY, "raise MemoryError"),
]

STATE = [
    program("import_this_prints_the_zen", PREIMPORTS, "import this\n"),
    program(
        "module_state_does_not_leak_between_runs",
        PREIMPORTS,
        """
        import math, sys
        print(hasattr(math, "leaked"), "leaked_module" in sys.modules)
        math.leaked = True
        sys.modules["leaked_module"] = math
        """,
        runs=2,
    ),
    program(
        "random_seeded_by_the_solution_repeats",
        PREIMPORTS,
        """
        import random
        random.seed(42)
        print(random.random(), random.randrange(10 ** 6), random.sample(range(100), 3))
        """,
    ),
    program(
        "random_numbers_differ_between_runs",
        PREIMPORTS,
        """
        import random
        print([random.randrange(10 ** 9) for _ in range(4)], random.random())
        """,
        runs=2,
        varies=True,
    ),
    program(
        "uuid_and_secrets_differ_between_runs",
        PREIMPORTS,
        """
        import secrets, uuid
        print(uuid.uuid4(), secrets.token_hex(8), secrets.randbelow(10 ** 9))
        """,
        runs=2,
        varies=True,
    ),
]

# Cases of the agent image's libraries, run where the image has them.
LIBRARIES = [
    program(
        "numpy_arrays",
        PREIMPORTS,
        """
        import numpy as np
        a = np.arange(12).reshape(3, 4)
        print(a.sum(axis=0).tolist(), a.T.shape, int(np.linalg.matrix_rank(a)))
        print(np.array([1.5, 2.5, -0.5]).round().tolist(), np.median([3, 1, 2]))
        """,
        needs=("numpy",),
    ),
    program(
        "numpy_random_differs_between_runs",
        PREIMPORTS,
        """
        import numpy as np
        print(np.random.randint(0, 10 ** 9, 4).tolist(), np.random.default_rng().random())
        """,
        runs=2,
        varies=True,
        needs=("numpy",),
    ),
    program(
        "sympy_algebra",
        PREIMPORTS,
        """
        import sympy as sp
        x = sp.symbols("x")
        print(sp.factor(x**2 - 1), sp.integrate(x**2, x), sp.solve(x**2 - 4, x))
        print(sp.isprime(2**61 - 1), sp.Rational(1, 3) + sp.Rational(1, 6))
        """,
        needs=("sympy",),
    ),
]

PROGRAMS = [
    *STDIN,
    *ENDINGS,
    *ENDS,
    *ENVIRONMENT,
    *OUTPUT_CASES,
    *TIMEOUT_CASES,
    *DIVERGENCES,
    *MEMORY_USE,
    *STATE,
    *LIBRARIES,
]
