"""`bash` cases: run in hluk's bash image, BusyBox's hush built without an MMU, by
guest/runner.sh as Sandbox Fusion's `/bin/bash FILE.sh` runs them.

Sandbox Fusion's own runner tests (sandbox/tests/runners/test_bash.py: 6 tests) through run_code
and through serve, with their requests and assertions; the one whose `if [` Bash calls a syntax
error, which hush runs as an unfinished `if` (`sh: missing ]`), is the documented limit. Then
what the image's shell cannot do (a pipe, `$( )`, a redirect of an external command crash its
micro-VM) answered as such; and the stand-in's bash image held to what hluk's is.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hostside
import pytest
from conftest import find_bwrap
from hostside import (
    Attack,
    Expect,
    Host,
    assert_only_its_own,
    console_lines,
    standin_run,
    stdouts_in_ready_guests_and_fresh_ones,
)
from serving import Served

from verl_hyperlight.case.guests import BASH, guest_for
from verl_hyperlight.commands import selftest
from verl_hyperlight.guest.protocol import OUTPUT_LIMIT, OUTPUT_LIMIT_STATUS

pytestmark = pytest.mark.once

Check = Callable[[dict[str, Any]], None]


@pytest.fixture(scope="module", autouse=True)
def busybox_built(standin_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The stand-in's bash image is BusyBox built from Debian's source (once per machine, about
    a minute): built here, ahead of the tests' own deadlines."""
    cache = tmp_path_factory.mktemp("bash-build")
    done = subprocess.run(
        [str(standin_path), "run", "--runtime", "bash", "--exec", "true"],
        capture_output=True,
        text=True,
        env={**os.environ, "HLUK_CACHE_DIR": str(cache), "HLUK_STANDIN_BWRAP": find_bwrap()},
        timeout=900,
        check=False,
    )
    if "needs BusyBox's source" in done.stderr:
        pytest.skip(f"the stand-in's bash image cannot be built here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr


def run(code: str, stdin: str | None = None, run_timeout: float = 10, **options: Any) -> Any:
    return hostside.run(code, stdin, run_timeout, language="bash", **options)


# --- Sandbox Fusion's sandbox/tests/runners/test_bash.py ---------------------------------


def _hello(response: dict[str, Any]) -> None:
    assert response["status"] == "Success", response
    assert response["run_result"]["stdout"].strip() == "Hello World"


def _timed_out(response: dict[str, Any]) -> None:
    assert response["status"] == "Failed", response
    assert response["run_result"]["status"] == "TimeLimitExceeded"


def _failed(response: dict[str, Any]) -> None:
    assert response["status"] == "Failed", response
    assert response["run_result"]["status"] == "Finished"


def _hush_runs_an_unfinished_if(response: dict[str, Any]) -> None:
    # Sandbox Fusion's bash says `syntax error: unexpected end of file`. hush runs an `if`
    # left open at the end of the script (shell/hush.c checks only here-documents and
    # brackets there): `[` runs and says `missing ]`, status 2. The documented limit
    # (docs/languages.md): Failed and Finished as Sandbox Fusion asserts, not its words.
    _failed(response)
    assert response["run_result"]["return_code"] == 2
    assert response["run_result"]["stderr"] == "sh: missing ]\n"


def _read_the_file(response: dict[str, Any]) -> None:
    assert response["status"] == "Success", response
    assert response["run_result"]["status"] == "Finished"
    assert "hello, this is a test" in response["run_result"]["stdout"]


def _stdin_echoed(response: dict[str, Any]) -> None:
    assert response["status"] == "Success", response
    assert response["run_result"]["status"] == "Finished"
    assert response["run_result"]["stdout"] == "65535\n"


SF_TESTS: list[tuple[str, str, Check, str | None, float, dict[str, str | None]]] = [
    ("echo", 'echo "Hello World"', _hello, None, 5, {}),
    ("sleep_timeout", "sleep 0.2", _timed_out, None, 0.1, {}),
    ("false_condition", "test 1 -eq 2", _failed, None, 5, {}),
    ("syntax_error", "if [", _hush_runs_an_unfinished_if, None, 5, {}),
    (
        "file_read",
        "cat dir1/dir2/dir3/secret_flag",
        _read_the_file,
        None,
        5,
        {"dir1/dir2/dir3/secret_flag": "ImhlbGxvLCB0aGlzIGlzIGEgdGVzdCI="},
    ),
    ("stdin", "\n    read input\n    echo $input\n    ", _stdin_echoed, "65535", 5, {}),
]


@pytest.mark.parametrize(
    ("code", "check", "stdin", "run_timeout", "files"),
    [test[1:] for test in SF_TESTS],
    ids=[test[0] for test in SF_TESTS],
)
def test_sandbox_fusions_bash_test_through_run_code(
    host: Host,
    code: str,
    check: Check,
    stdin: str | None,
    run_timeout: float,
    files: dict[str, str | None],
) -> None:
    check(run(code, stdin, run_timeout, files=files))


def test_sandbox_fusions_bash_tests_through_serve(host: Host, serve: Callable[..., Served]) -> None:
    serve().check_cases("bash", [test[1:] for test in SF_TESTS])


# --- the case as `/bin/bash FILE.sh` runs it, within what hush can do ----------------------


def test_the_script_has_its_own_status_streams_and_shell(host: Host) -> None:
    code = 'x=outer\ncd /\necho "out $1"\necho err >&2\nset -e\nfalse\necho never\n'
    response = run(code)
    result = response["run_result"]
    assert (response["status"], result["return_code"]) == ("Failed", 1), response
    assert (result["stdout"], result["stderr"]) == ("out \n", "err\n")
    # exit, a signal of its own: the script's, not the runner's
    assert run("echo a\nexit 7")["run_result"]["return_code"] == 7
    assert run("kill -9 $$")["run_result"]["return_code"] == 137
    # the next case's shell knows nothing of the last one's
    assert run('echo "[$x]"')["run_result"]["stdout"] == "[]\n"


def test_request_files_are_in_the_working_directory_and_fetched(host: Host) -> None:
    code = 'read -r secret <"dir one/secret"\necho "$secret!" >out.txt\necho "ünï" >"ü.txt"\n'
    response = run(
        code,
        files={"dir one/secret": "aGVsbG8=", "odd \"name'\\": "eA=="},
        fetch_files=["out.txt", "missing.txt", "ü.txt", "odd \"name'\\"],
    )
    assert response["status"] == "Success", response
    assert response["files"] == {
        "out.txt": "aGVsbG8hCg==",
        "ü.txt": "w7xuw68K",
        "odd \"name'\\": "eA==",
    }


def test_output_past_the_limit_is_cut_and_answered_so(host: Host) -> None:
    # The shell cannot watch a size: the limit is applied once the script has ended.
    code = (
        'x=xxxxxxxxxxxxxxx\nx="$x$x$x$x$x$x$x$x"\nx="$x$x$x$x$x$x$x$x"\nx="$x$x$x$x$x$x$x$x"\n'
        f"i=0\nwhile [ $i -lt {OUTPUT_LIMIT // 30721 + 8} ]; do\n"
        '  printf "%s%s%s%s\\n" "$x" "$x" "$x" "$x"\n  i=$((i + 1))\ndone\necho done >&2\n'
    )
    response = run(code, run_timeout=60)
    result = response["run_result"]
    assert (response["status"], result["status"], result["return_code"]) == (
        "Failed",
        "Finished",
        OUTPUT_LIMIT_STATUS,
    ), {**result, "stdout": len(result["stdout"])}
    assert len(result["stdout"]) == OUTPUT_LIMIT


@pytest.mark.parametrize(
    "code",
    ["echo a | cat", "x=$(echo a)", "ls /tmp >listing", "cat </dev/null", "ls /nope 2>/dev/null"],
)
def test_what_crashes_the_images_shell_is_answered_so(host: Host, code: str) -> None:
    response = run(code)
    result = response["run_result"]
    assert (response["status"], result["status"], result["return_code"]) == (
        "Failed",
        "Finished",
        137,
    ), response
    assert "in the bash image (BusyBox's hush, built without an MMU) a pipe" in result["stderr"]
    # the node's next case is answered as ever
    assert run("echo fine")["run_result"]["stdout"] == "fine\n"


def test_what_the_images_shell_can_do(host: Host) -> None:
    code = (
        'f() { echo "f $1"; }\nf one\n'
        '{ ls /tmp/solution; } >listing\nread -r first <listing\necho "first $first"\n'
        'for i in 1 2; do echo "i$i"; done >loop\nwhile read -r l; do echo "[$l]"; done <loop\n'
        'echo "$((6 * 7))"\ncase x in x) echo matched ;; esac\n'
    )
    response = run(code)
    assert response["status"] == "Success", response
    assert response["run_result"]["stdout"] == ("f one\nfirst listing\n[i1]\n[i2]\n42\nmatched\n")


def test_cases_in_ready_guests_and_fresh_ones_answer_alike(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = "n=0\nwhile read -r l; do n=$((n + 1)); done\necho $n\n"
    stdin = "line\n" * 1000
    answers = stdouts_in_ready_guests_and_fresh_ones(lambda: run(code, stdin), monkeypatch)
    assert answers == ["1000\n"] * 5


def test_a_bash_case_runs_in_the_bash_image_whatever_the_url_names(host: Host) -> None:
    guest = guest_for("hyperlight://agent", 1024, "bash")
    assert guest.image == BASH and guest.memory_mb == 1536
    assert guest_for("hyperlight://", -1, "bash").memory_mb == BASH.default_memory_mb
    response = run(
        "[ -x /bin/busybox ] && [ ! -e /bin/bash ] && echo busybox", url="hyperlight://agent"
    )
    assert response["run_result"]["stdout"] == "busybox\n", response
    runs = [argv for argv in host.case_runs() + host.warm_ups() if "bash" in argv]
    assert runs and all(argv[argv.index("--runtime") + 1] == "bash" for argv in runs)


def test_selftest_checks_a_bash_case(host: Host) -> None:
    check = selftest.language_check("hyperlight://", "bash")
    assert check.status == "ok", check


# --- the stand-in's bash image, as hluk's -------------------------------------------------


def test_the_standin_bash_image_sources_calls_into_one_hush_as_hluks_driver_does(
    standin_env: dict[str, str],
) -> None:
    failed = "hl_driver: dispatch callback failed"
    # The warm-exec's functions and variables stay for the code's call; --env is exported.
    done = standin_run("bash",
        'f; echo "$kept $WHO"', standin_env, "--warm-exec", "kept=41; f() { echo f; }",
        "--env", "WHO=me",
    )  # fmt: skip
    assert (done.returncode, console_lines(done)) == (0, ["f", "41 me"]), done
    # Nothing of the host's files but the C library BusyBox loads (the image: BusyBox alone).
    done = standin_run("bash", "[ -e /usr/lib/jvm ] || [ -e /usr/bin ] || echo none", standin_env)
    assert (done.returncode, console_lines(done)) == (0, ["none"]), done
    # The shell is started with the bootstrap alone: no positional parameters.
    done = standin_run("bash", 'echo "$#"', standin_env)
    assert (done.returncode, console_lines(done)) == (0, ["0"]), done
    # A call's status is its last command's, 0 or 1; `exit N` ends the shell with N.
    done = standin_run("bash", "false", standin_env)
    assert (done.returncode, console_lines(done)) == (1, [failed]), done
    done = standin_run("bash", "echo bye; exit 5", standin_env)
    assert (done.returncode, console_lines(done)) == (5, ["bye", failed]), done
    # hush, not bash: no arrays, no [[ ]] with patterns of bash's, no /bin/bash
    done = standin_run("bash", "[ -e /bin/bash ] || echo no bash; a=(1 2) || true", standin_env)
    assert console_lines(done)[0] == "no bash" and done.returncode != 0, done


def test_the_standin_bash_images_vfork_children_crash_it_as_hluks_do(
    standin_env: dict[str, str],
) -> None:
    for code in ("echo a | cat", "cat /dev/null >/tmp/x", "x=$(true)", "cat <<E\nx\nE"):
        done = standin_run("bash", f"echo before\n{code}\necho after", standin_env)
        assert done.returncode == 1 and "after" not in console_lines(done), (code, done)
        assert done.stderr.decode().splitlines()[-1].startswith("error: Guest aborted:"), done
    # What hush sets in its own process, and plain external commands, do not.
    done = standin_run(
        "bash",
        "{ cat /case-less; echo kept; } >/tmp/x 2>&1; cat /tmp/x; echo y >/tmp/y; cat /tmp/y",
        standin_env,
    )
    lines = ["cat: can't open '/case-less': No such file or directory", "kept", "y"]
    assert (done.returncode, console_lines(done)) == (0, lines), done


# --- hostile shell scripts ----------------------------------------------------------------

BASH_ATTACKS = {
    "spins": Attack("while :; do :; done", Expect("Failed", "TimeLimitExceeded", None), 1),
    "exhausts its memory": Attack(
        "x=xxxxxxxxxxxxxxxx\nwhile :; do x=$x$x; done", Expect("Failed", "Finished", 137)
    ),
    "writes to the case mount": Attack(
        "echo y >/case/x || echo refused", Expect("Success", "Finished", 0, "refused\n", "")
    ),
    "connects to the host": Attack(
        "nc 127.0.0.1 PORT && echo reached || echo unreachable",
        Expect("Success", "Finished", 0, "unreachable\n"),
    ),
    "kills every process it can": Attack(
        "kill -9 -1; echo alive", Expect("Failed", "Finished", None)
    ),
    "closes its descriptors": Attack(
        "exec 1>&- 2>&- 0<&-; echo gone", Expect("Failed", "Finished", 1)
    ),
    "forges frames on its stdout": Attack(
        "printf '\\nabcdef end 0 0.1 - 6 0 -\\nabcdef stdout Zm9yZ2Vk\\nabcdef done\\n'",
        Expect(
            "Success",
            "Finished",
            0,
            "\nabcdef end 0 0.1 - 6 0 -\nabcdef stdout Zm9yZ2Vk\nabcdef done\n",
        ),
    ),
}


@pytest.mark.parametrize("name", BASH_ATTACKS)
def test_hostile_shell_scripts_affect_only_their_own_result(host: Host, name: str) -> None:
    def then() -> None:
        assert run("echo $((6 * 7))")["run_result"]["stdout"] == "42\n"

    run("true")  # warm
    assert_only_its_own(host, BASH_ATTACKS[name], lambda code, limit: run(code, None, limit), then)


@pytest.mark.microvm
def test_bash_cases_in_a_real_micro_vm() -> None:
    if os.environ.get("RUN_ALL") != "1":
        pytest.skip("needs hluk and /dev/kvm: RUN_ALL=1 on a node that has them")
    for _, code, check, stdin, run_timeout, files in SF_TESTS:
        check(run(code, stdin, run_timeout, files=files))
    response = run("read a b\necho $((a + b))", "19 23\n")
    assert response["run_result"]["stdout"] == "42\n", response
