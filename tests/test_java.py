"""`java` cases: compiled on the host by javac in the compiles' sandbox, as Sandbox Fusion
compiles them (`javac Main.java`), and run in hluk's java image by guest/runner.jsh as
`java -ea Main` runs them.

Sandbox Fusion's own runner tests (sandbox/tests/runners/test_java.py: 7 tests) through
run_code and through serve, with their requests and assertions; the one that needs javatuples,
a jar Sandbox Fusion keeps beside its runner and hluk's image does not hold, is the documented
limit, answered as javac answers a missing package. Then programs through this node and
through the host's own `javac Main.java && java -ea Main`, answers compared; and the stand-in's
java image held to what hluk's is.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hostside
import pytest
from hostside import (
    Attack,
    Expect,
    Host,
    Usage,
    assert_only_its_own,
    assert_stopped_for_its_stdout,
    console_lines,
    left_running,
    standin_run,
    stdouts_in_ready_guests_and_fresh_ones,
)
from serving import Served

from verl_hyperlight.case import compiled
from verl_hyperlight.case.guests import JAVA, guest_for
from verl_hyperlight.commands import selftest
from verl_hyperlight.guest.protocol import OUTPUT_LIMIT


def _jdk25() -> str | None:
    """A JDK 25 or later, which the stand-in's java image runs on (as hluk's is Temurin 25)."""
    chosen = os.environ.get("HLUK_STANDIN_JAVA")
    for home in [chosen] if chosen else sorted(glob.glob("/usr/lib/jvm/*")):
        try:
            release = Path(home, "release").read_text()
        except OSError:
            continue
        for line in release.splitlines():
            if line.startswith("JAVA_VERSION="):
                feature = line.split("=", 1)[1].strip('"').split(".")[0]
                if feature.isdigit() and int(feature) >= 25:
                    return home
    return None


JAVAC = shutil.which("javac")
JAVA_BINARY = shutil.which("java")
pytestmark = [
    pytest.mark.once,
    pytest.mark.skipif(
        _jdk25() is None,
        reason="the stand-in's java image needs a JDK 25 (hluk's is Temurin 25): none in "
        "/usr/lib/jvm, and HLUK_STANDIN_JAVA not set",
    ),
    pytest.mark.skipif(JAVAC is None, reason="java cases compile with javac: no JDK on PATH"),
]

Check = Callable[[dict[str, Any]], None]


# javac is a JVM: its start alone has taken past Sandbox Fusion's default compile_timeout (10 s)
# on a loaded CI node (a case answered compile TimeLimitExceeded). These tests are of answers,
# not of the compile's deadline (tests/test_compiled.py's are), so they give it 30 s, as
# tests/test_nodejs.py does for tsc.
COMPILE_TIMEOUT = 30.0


def run(code: str, stdin: str | None = None, run_timeout: float = 10, **options: Any) -> Any:
    options.setdefault("compile_timeout", COMPILE_TIMEOUT)
    return hostside.run(code, stdin, run_timeout, language="java", **options)


# --- Sandbox Fusion's sandbox/tests/runners/test_java.py ---------------------------------


def _success_printing(response: dict[str, Any]) -> None:
    assert response["status"] == "Success", response
    assert response["compile_result"]["status"] == "Finished"
    assert response["run_result"]["stdout"].strip() == "123"


def _compile_failed(response: dict[str, Any]) -> None:
    assert response["status"] == "Failed", response
    assert response["compile_result"]["status"] == "Finished"
    assert response["compile_result"]["return_code"] != 0
    assert response["run_result"] is None


def _timed_out(response: dict[str, Any]) -> None:
    assert response["status"] == "Failed", response
    assert response["run_result"]["status"] == "TimeLimitExceeded"


def _assertion_error(response: dict[str, Any]) -> None:
    assert response["status"] == "Failed", response
    assert response["run_result"]["status"] == "Finished"
    assert "java.lang.AssertionError" in response["run_result"]["stderr"]


def _assert_failed(response: dict[str, Any]) -> None:
    assert response["status"] == "Failed", response
    assert response["run_result"]["status"] == "Finished"


def _javatuples_missing(response: dict[str, Any]) -> None:
    # Sandbox Fusion asserts Success: its runner puts javatuples-1.2.jar on the class path.
    # hluk's java image holds the JDK's modules alone (drivers/java/Dockerfile's jlink list),
    # and no jar comes with the request, so javac answers the package missing: the documented
    # limit (docs/languages.md), a compile failure with no run.
    assert response["status"] == "Failed", response
    assert response["compile_result"]["status"] == "Finished"
    assert "package org.javatuples does not exist" in response["compile_result"]["stderr"]
    assert response["run_result"] is None


def _stdin_echoed(response: dict[str, Any]) -> None:
    assert response["status"] == "Success", response
    assert response["run_result"]["status"] == "Finished"
    assert response["run_result"]["stdout"] == "65535\n"


SF_TESTS: list[tuple[str, str, Check, str | None, float]] = [
    (
        "print",
        """
    public class Main {
        public static void main(String[] args) {
            System.out.println(123);
        }
    }
    """,
        _success_printing,
        None,
        10,
    ),
    (
        "compile_error",
        """
    public class Main {
        public static void main(String[] args) {
            System.uto.println(123);
        }
    }
    """,
        _compile_failed,
        None,
        10,
    ),
    (
        "timeout",
        """
    public class Main {
        public static void main(String[] args) {
            try {
                Thread.sleep(200);
            } catch (InterruptedException e) {
                System.err.println("The sleeping thread was interrupted: " + e.getMessage());
            }
        }
    }
    """,
        _timed_out,
        None,
        0.1,
    ),
    (
        "assertion_error",
        """
    public class Main {
        public static void main(String[] args) {
            throw new AssertionError("Intentional assertion error");
        }
    }
    """,
        _assertion_error,
        None,
        10,
    ),
    (
        "assert",
        """
    public class Main {
        public static void main(String[] args) {
            assert 1 == 2;
        }
    }
    """,
        _assert_failed,
        None,
        10,
    ),
    (
        "external_jar",
        """
    import org.javatuples.Pair;
    import org.javatuples.Triplet;

    public class Main {
        public static void main(String[] args) {
            Pair<String, Integer> pair = Pair.with("apple", 1);
            System.out.println("Fruit: " + pair.getValue0() + ", Quantity: " + pair.getValue1());
            Triplet<String, Integer, Double> triplet = Triplet.with("banana", 2, 0.99);
            System.out.println("Fruit: " + triplet.getValue0() + ", Quantity: "
                + triplet.getValue1() + ", Price: " + triplet.getValue2());
        }
    }
    """,
        _javatuples_missing,
        None,
        10,
    ),
    (
        "stdin",
        """
    import java.util.Scanner;

    public class Main {
        public static void main(String[] args) {
            Scanner scanner = new Scanner(System.in);
            int number = scanner.nextInt();
            System.out.println(number);
        }
    }
                             """,
        _stdin_echoed,
        "65535",
        5,
    ),
]


@pytest.mark.parametrize(
    ("code", "check", "stdin", "run_timeout"),
    [test[1:] for test in SF_TESTS],
    ids=[test[0] for test in SF_TESTS],
)
def test_sandbox_fusions_java_test_through_run_code(
    host: Host, code: str, check: Check, stdin: str | None, run_timeout: float
) -> None:
    check(run(code, stdin, run_timeout))


def test_sandbox_fusions_java_tests_through_serve(host: Host, serve: Callable[..., Served]) -> None:
    serve().check_cases("java", [(*test[1:], {}) for test in SF_TESTS])


# --- answers as the host's `javac Main.java && java -ea Main` -----------------------------

AS_JAVA = {
    "sum of stdin, BufferedReader": (
        "import java.io.*;\nimport java.util.*;\n\npublic class Main {\n"
        "    public static void main(String[] args) throws IOException {\n"
        "        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));\n"
        "        long sum = 0;\n        String line;\n"
        "        while ((line = in.readLine()) != null)\n"
        '            for (String word : line.trim().split("\\\\s+"))\n'
        "                if (!word.isEmpty()) sum += Long.parseLong(word);\n"
        "        System.out.println(sum);\n    }\n}\n",
        "1 2 3\n4\n",
    ),
    "an uncaught exception with a cause": (
        "public class Main {\n    static void inner() {\n"
        '        throw new IllegalStateException("inner");\n    }\n'
        "    public static void main(String[] args) {\n"
        '        System.out.println("before");\n'
        "        try {\n            inner();\n        } catch (RuntimeException e) {\n"
        '            throw new RuntimeException("outer", e);\n        }\n    }\n}\n',
        None,
    ),
    "System.exit with output in both streams": (
        "public class Main {\n    public static void main(String[] args) {\n"
        '        System.out.print("out");\n        System.err.print("err");\n'
        "        System.exit(7);\n    }\n}\n",
        None,
    ),
    "System.exit from another thread, after main returned": (
        "public class Main {\n    public static void main(String[] args) {\n"
        "        new Thread(() -> {\n"
        "            try { Thread.sleep(100); } catch (InterruptedException e) { }\n"
        '            System.out.println("late");\n            System.exit(4);\n'
        "        }).start();\n"
        '        System.out.println("main returns");\n    }\n}\n',
        None,
    ),
    "a thread that is no daemon is waited for": (
        "public class Main {\n    public static void main(String[] args) {\n"
        "        Thread t = new Thread(() -> {\n"
        "            try { Thread.sleep(100); } catch (InterruptedException e) { }\n"
        '            System.out.println("worker done");\n        });\n'
        "        t.start();\n"
        '        System.out.println("main done");\n    }\n}\n',
        None,
    ),
    "a static initializer that throws": (
        'public class Main {\n    static int x = Integer.parseInt("nope");\n'
        "    public static void main(String[] args) {\n"
        "        System.out.println(x);\n    }\n}\n",
        None,
    ),
    "no main method": (
        "public class Main {\n    public static void run(String[] args) { }\n}\n",
        None,
    ),
    "a main that is not static": (
        "public class Main {\n    public void main(String[] args) { }\n}\n",
        None,
    ),
    "no class Main": ("class Solution {\n    public static void main(String[] a) { }\n}\n", None),
    "a public class named otherwise": (
        "public class Solution {\n    public static void main(String[] a) { }\n}\n",
        None,
    ),
    "unicode out, no stdin": (
        "public class Main {\n    public static void main(String[] args) {\n"
        '        System.out.println("héllo ✓");\n'
        '        System.out.println(System.in.read() == -1 ? "eof" : "input");\n'
        "    }\n}\n".replace("(String[] args) {", "(String[] args) throws Exception {"),
        None,
    ),
    "assertions are on, in the program's own classes": (
        "public class Main {\n    static class Inner {\n"
        '        static void check(int n) { assert n > 0 : "n=" + n; }\n    }\n'
        "    public static void main(String[] args) {\n"
        "        Inner.check(1);\n        Inner.check(-1);\n    }\n}\n",
        None,
    ),
}


def java_answer(code: str, stdin: str | None, tmp: Path) -> tuple[str, int, str, bool]:
    """What the host's JDK answers: stdout, status and stderr of `java -ea Main`, or javac's
    failure (its stderr, and True)."""
    (tmp / "Main.java").write_text(code)
    compiled = subprocess.run(
        [str(JAVAC), "-encoding", "UTF-8", "Main.java"],
        cwd=tmp,
        capture_output=True,
        text=True,
        check=False,
    )
    if compiled.returncode != 0:
        return "", compiled.returncode, compiled.stderr, True
    done = subprocess.run(
        [str(JAVA_BINARY), "-ea", "-Dstdout.encoding=UTF-8", "-Dstderr.encoding=UTF-8", "Main"],
        cwd=tmp,
        input=(stdin or "").encode(),
        capture_output=True,
        check=False,
        timeout=60,
    )
    return done.stdout.decode(), done.returncode, done.stderr.decode(), False


def stack_lines(stderr: str) -> list[str]:
    """The lines of an answer's stderr, but the frames inside the JDK (their line numbers are
    its version's)."""
    return [line for line in stderr.splitlines() if not line.startswith("\tat java.base/")]


@pytest.mark.parametrize(("code", "stdin"), list(AS_JAVA.values()), ids=list(AS_JAVA))
def test_a_case_answers_as_java_ea_main(
    host: Host, code: str, stdin: str | None, tmp_path: Path
) -> None:
    response = run(code, stdin)
    stdout, status, stderr, compile_failed = java_answer(code, stdin, tmp_path)
    if compile_failed:
        assert response["run_result"] is None, response
        assert response["compile_result"]["return_code"] == status
        assert response["compile_result"]["stderr"] == stderr
        return
    got = response["run_result"]
    assert (got["stdout"], got["return_code"]) == (stdout, status), (response, stderr)
    assert stack_lines(got["stderr"]) == stack_lines(stderr), (got["stderr"], stderr)
    assert response["status"] == ("Success" if status == 0 else "Failed")


def test_request_files_are_in_the_working_directory_and_on_the_class_path(host: Host) -> None:
    code = (
        "import java.nio.file.*;\n\npublic class Main {\n"
        "    public static void main(String[] args) throws Exception {\n"
        '        String secret = Files.readString(Path.of("dir1/dir2/secret"));\n'
        '        Files.writeString(Path.of("out.txt"), secret.toUpperCase());\n'
        '        System.out.println(Main.class.getResource("/dir1/dir2/secret") != null);\n'
        "    }\n}\n"
    )
    response = run(
        code, files={"dir1/dir2/secret": "aGVsbG8="}, fetch_files=["out.txt", "missing.txt"]
    )
    assert response["status"] == "Success", response
    assert response["run_result"]["stdout"] == "true\n"
    assert response["files"] == {"out.txt": "SEVMTE8="}


def test_output_past_the_limit_stops_the_program(host: Host) -> None:
    code = (
        "public class Main {\n    public static void main(String[] args) {\n"
        '        String line = "x".repeat(1023);\n'
        f"        for (int i = 0; i < {OUTPUT_LIMIT // 1024 + 8}; i++) System.out.println(line);\n"
        '        System.err.println("never");\n    }\n}\n'
    )
    assert_stopped_for_its_stdout(run(code))


def test_cases_in_ready_guests_and_fresh_ones_answer_alike(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = (
        "public class Main {\n    public static void main(String[] args) throws Exception {\n"
        "        System.out.println(System.in.readAllBytes().length);\n    }\n}\n"
    )
    answers = stdouts_in_ready_guests_and_fresh_ones(lambda: run(code, "x" * 100_000), monkeypatch)
    assert answers == ["100000\n"] * 5


def test_a_java_case_runs_in_the_java_image_whatever_the_url_names(host: Host) -> None:
    guest = guest_for("hyperlight://agent", 1024, "java")
    assert guest.image == JAVA and guest.memory_mb == 1536
    assert guest_for("hyperlight://", -1, "java").memory_mb == JAVA.default_memory_mb
    code = (
        "public class Main {\n    public static void main(String[] args) {\n"
        "        System.out.println(Runtime.version().feature() >= 25);\n    }\n}\n"
    )
    response = run(code, url="hyperlight://agent")
    assert response["run_result"]["stdout"] == "true\n", response
    runs = [argv for argv in host.case_runs() + host.warm_ups() if "java" in argv]
    assert runs and all(argv[argv.index("--runtime") + 1] == "java" for argv in runs)


def test_selftest_checks_a_java_case(host: Host) -> None:
    check = selftest.language_check("hyperlight://", "java")
    assert check.status == "ok", check


def test_a_node_without_javac_answers_its_java_cases_with_the_install(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # PATH without a JDK: hluk is found by HLUK_PATH, bubblewrap by its package.
    monkeypatch.setenv("PATH", str(tmp_path))
    response = run("public class Main { public static void main(String[] a) { } }")
    assert response["status"] == "SandboxError", response
    assert "javac" in response["message"] and "apt-get install" in response["message"]


def test_a_case_leaves_nothing_behind(host: Host) -> None:
    code = (
        "public class Main {\n    public static void main(String[] args) {\n"
        "        new Thread(() -> { while (true) Thread.onSpinWait(); }).start();\n"
        "    }\n}\n"
    )
    run("public class Main { public static void main(String[] a) { } }")  # warm
    before = Usage.now(host)
    response = run(code, run_timeout=0.5)
    assert response["run_result"]["status"] == "TimeLimitExceeded", response
    ok = run("public class Main { public static void main(String[] a) { System.out.print(1); } }")
    assert ok["run_result"]["stdout"] == "1", ok
    assert Usage.now(host).minus(before) == Usage(0, 0, 0, 0)
    assert left_running(str(host.tmpdir)) == []


# --- the stand-in's java image, as hluk's -------------------------------------------------


def test_the_standin_java_image_runs_jshell_snippets_as_hluks_driver_does(
    standin_env: dict[str, str],
) -> None:
    # Statements and declarations in any mix, the preamble's `import module java.base`.
    done = standin_run(
        "java",
        'var xs = List.of(1, 2);\nSystem.out.println("sum " + (xs.get(0) + xs.get(1)));',
        standin_env,
    )
    assert (done.returncode, console_lines(done)) == (0, ["sum 3"]), done
    # Declarations alone run their main; with a statement, none runs.
    declared = 'class App { static void main(String[] a) { System.out.println("main ran"); } }'
    done = standin_run("java", declared, standin_env)
    assert (done.returncode, console_lines(done)) == (0, ["main ran"]), done
    done = standin_run("java", declared + '\nSystem.out.println("statement");', standin_env)
    assert (done.returncode, console_lines(done)) == (0, ["statement"]), done
    # The warm-exec's declarations stay for the code's call.
    done = standin_run(
        "java", "System.out.println(kept + 1);", standin_env, "--warm-exec", "int kept = 41;"
    )
    assert (done.returncode, console_lines(done)) == (0, ["42"]), done


def test_the_standin_java_images_failures_and_exits_are_hluks(
    standin_env: dict[str, str],
) -> None:
    failed = "hl_driver: dispatch callback failed"
    # A compile error and an exception fail the call with status 1.
    done = standin_run("java", "System.uto.println(1);", standin_env)
    assert done.returncode == 1 and console_lines(done)[0].startswith("error: "), done
    assert console_lines(done)[-1] == failed
    done = standin_run("java", 'throw new IllegalStateException("no");', standin_env)
    assert done.returncode == 1, done
    assert (
        console_lines(done)[0] == 'Exception in thread "main" java.lang.IllegalStateException: no'
    )
    # System.exit ends the JVM: its status is the call's, and so hluk's.
    done = standin_run("java", 'System.out.println("bye"); System.exit(5);', standin_env)
    assert (done.returncode, console_lines(done)) == (5, ["bye", failed]), done
    done = standin_run("java", "System.exit(0);", standin_env)
    assert (done.returncode, console_lines(done)) == (0, []), done


def test_the_standin_java_image_has_no_ea_and_only_the_images_modules(
    standin_env: dict[str, str],
) -> None:
    code = (
        'assert false : "asserted";\n'
        'System.out.println("no -ea");\n'
        'for (String m : new String[] {"java.desktop", "jdk.jfr", "java.sql", "jdk.compiler"})\n'
        '    System.out.println(m + " " + ModuleLayer.boot().findModule(m).isPresent());\n'
        "System.out.println(Runtime.getRuntime().availableProcessors());\n"
        'try { new ProcessBuilder("/bin/sh", "-c", "true").start();'
        ' System.out.println("shell"); }\n'
        'catch (java.io.IOException e) { System.out.println("no shell"); }\n'
        'System.out.println(new java.io.File("/usr/lib/jvm").exists()'
        ' || new java.io.File("/usr/bin").exists() ? "host files" : "the image\'s alone");\n'
    )
    done = standin_run("java", code, standin_env)
    assert done.returncode == 0, done
    assert console_lines(done) == [
        "no -ea",
        "java.desktop false",
        "jdk.jfr false",
        "java.sql true",
        "jdk.compiler true",
        "1",
        "no shell",
        "the image's alone",
    ]


@pytest.mark.microvm
def test_java_cases_in_a_real_micro_vm() -> None:
    if os.environ.get("RUN_ALL") != "1":
        pytest.skip("needs hluk and /dev/kvm: RUN_ALL=1 on a node that has them")
    for _, code, check, stdin, run_timeout in SF_TESTS:
        check(run(code, stdin, run_timeout))
    sum_code, sum_stdin = AS_JAVA["sum of stdin, BufferedReader"]
    response = run(sum_code, sum_stdin)
    assert response["run_result"]["stdout"] == "10\n", response


# --- hostile Java -------------------------------------------------------------------------

# Each attack (the body of Main's main), and the answer that is its own outcome (as
# test_hostile's for Python). The java image has no shell, the network is not the guest's, the
# case mount is read-only, the heap is half the guest's memory.
JAVA_ATTACKS = {
    "spins": Attack("while (true) { }", Expect("Failed", "TimeLimitExceeded", None), 1),
    "exhausts its memory": Attack(
        "var kept = new java.util.ArrayList<long[]>(); while (true) kept.add(new long[1 << 20]);",
        Expect("Failed", "Finished", 1, "", "java.lang.OutOfMemoryError"),
    ),
    "runs a shell": Attack(
        'try { new ProcessBuilder("/bin/sh", "-c", "echo hi").start(); System.out.println("ran"); }'
        ' catch (java.io.IOException e) { System.out.println("no shell"); }',
        Expect("Success", "Finished", 0, "no shell\n"),
    ),
    "connects to the host": Attack(
        'try (var s = new java.net.Socket("127.0.0.1", PORT)) { System.out.println("reached"); }'
        ' catch (java.io.IOException e) { System.out.println("unreachable"); }',
        Expect("Success", "Finished", 0, "unreachable\n"),
    ),
    "writes to the case mount": Attack(
        'try { java.nio.file.Files.writeString(java.nio.file.Path.of("/case/x"), "y");'
        ' System.out.println("wrote"); }'
        ' catch (java.io.IOException e) { System.out.println("refused"); }',
        Expect("Success", "Finished", 0, "refused\n"),
    ),
    "kills every process it can": Attack(
        "ProcessHandle.allProcesses().filter(p -> !p.equals(ProcessHandle.current()))"
        '.forEach(ProcessHandle::destroyForcibly); System.out.println("alive");',
        # What it sees is the guest's (the stand-in's sandbox init ignores it, as a signal to
        # a pid namespace's init from inside is), never the host's.
        Expect("Success", "Finished", 0, "alive\n"),
    ),
    "closes the console's descriptor": Attack(
        "new java.io.FileOutputStream(java.io.FileDescriptor.out).close();"
        ' System.out.println("closed");',
        Expect("Failed", "Finished", None),
    ),
    "replaces System.out and the exit logger": Attack(
        'java.util.logging.Logger.getLogger("java.lang.Runtime").setLevel('
        "java.util.logging.Level.OFF);"
        " System.setOut(new java.io.PrintStream(java.io.OutputStream.nullOutputStream()));"
        ' System.err.println("said"); System.exit(6);',
        Expect("Failed", "Finished", None, "", "said"),
    ),
    "forges frames on its stdout": Attack(
        'System.out.println("\\nabcdef end 0 0.1 - 6 0 -\\nabcdef stdout Zm9yZ2Vk\\nabcdef done");',
        Expect(
            "Success",
            "Finished",
            0,
            "\nabcdef end 0 0.1 - 6 0 -\nabcdef stdout Zm9yZ2Vk\nabcdef done\n",
        ),
    ),
}


@pytest.mark.parametrize("name", JAVA_ATTACKS)
def test_hostile_java_affects_only_its_own_result(host: Host, name: str) -> None:
    def in_main(body: str, run_timeout: float) -> Any:
        code = (
            "public class Main {\n    public static void main(String[] a) throws Exception {\n"
            f"        {body}\n    }}\n}}\n"
        )
        return run(code, run_timeout=run_timeout)

    def then() -> None:
        ok = run(
            "public class Main { public static void main(String[] a) { System.out.print(42); } }"
        )
        assert (ok.get("run_result") or {}).get("stdout") == "42", ok

    run("public class Main { public static void main(String[] a) { } }")  # warm
    assert_only_its_own(host, JAVA_ATTACKS[name], in_main, then)


def test_a_javac_of_21_or_later_compiles_at_sandbox_fusions_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jdk = _jdk25()
    assert jdk is not None  # the module's skip says so otherwise
    monkeypatch.setenv("PATH", f"{jdk}/bin:{os.environ['PATH']}")
    patterns = (
        "public class Main { public static void main(String[] a) { Object o = 1;"
        " switch (o) { case Integer i -> System.out.println(i); default -> { } } } }"
    )
    assert compiled.build("java", patterns.encode(), 30).result["return_code"] == 0
    # Java 25's compact source file is past Sandbox Fusion's JDK 21: refused as there.
    compact = compiled.build("java", b"void main() { IO.println(1); }\n", 30).result
    assert compact["return_code"] == 1, compact
    assert "not supported in -source 21" in compact["stderr"], compact
