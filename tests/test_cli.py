"""The verl-hyperlight command: --version, warm-up and run, as an operator uses them."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hostside import Host
from serving import Served

from verl_hyperlight import __version__
from verl_hyperlight.case import gate as _gate
from verl_hyperlight.cli import main
from verl_hyperlight.node import most_case_memory_mb


def test_version_names_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"verl-hyperlight {__version__}"


def test_warm_up_prepares_the_node(
    hluk: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HLUK_CACHE_DIR", str(tmp_path / "cache"))
    _gate.forget()
    assert main(["warm-up"]) == 0
    out = capsys.readouterr().out
    assert "the python image is warm on this node (pulled and snapshotted in" in out
    # Another process finds the snapshot the first took (and says so).
    _gate.forget()
    assert main(["warm-up"]) == 0
    assert "warm on this node (its warm snapshot restored in" in capsys.readouterr().out


def test_warm_up_says_what_failed_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HLUK_PATH", str(tmp_path / "missing" / "hluk"))
    _gate.forget()
    assert main(["warm-up"]) == 1
    assert "hluk was not found at" in capsys.readouterr().err


REFUSED_SETTINGS = [
    (["hyperlight:/"], "did you mean 'hyperlight://'?"),
    (["http://sandbox/run_code"], "verl-hyperlight serves hyperlight://"),
    (["hyperlight://agent", "--memory-limit-mb", "512"], "use at least 720"),
    (["hyperlight://", "--memory-limit-mb", "-5"], "is not a memory size"),
]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        *(
            (["serve", "--port", "0", "--url", *setting], says)
            for setting, says in REFUSED_SETTINGS
        ),
        *((["warm-up", *setting], says) for setting, says in REFUSED_SETTINGS),
        # run sends a case to an http(s) URL (tested below); selftest takes no memory limit.
        *(
            (["run", "/dev/null", "--url", *setting], says)
            for setting, says in REFUSED_SETTINGS
            if not setting[0].startswith("http")
        ),
        (["selftest", "hyperlight:/"], "did you mean 'hyperlight://'?"),
        (["selftest", "http://sandbox/run_code"], "verl-hyperlight serves hyperlight://"),
    ],
)
def test_a_setting_no_case_could_run_with_stops_the_command_at_once_as_a_usage_error(
    capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    """As uvicorn stops on an app it cannot import: serve does not answer 503 for ever, and
    warm-up, run and selftest exit 2 (a usage error) with one line naming the command."""
    assert main(args) == 2
    said = capsys.readouterr().err
    assert said.startswith(f"verl-hyperlight {args[0]}: ") and says in said, said
    assert said.count("\n") == 1


@pytest.mark.parametrize(
    "command",
    [["warm-up"], ["run", "/dev/null"], ["doctor"], ["bench"], ["selftest"], ["serve"]],
)
def test_every_command_takes_its_url_as_url(
    hluk: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """A newcomer's `doctor --url hyperlight://` was a usage error: every command takes --url
    (and those that took the URL as their argument still do)."""
    status = main([*command, "--url", "hyperlight:/"])
    said = capsys.readouterr()
    # The URL given reached the command, which says what is wrong with it: a usage error
    # where it is judged before the command runs, doctor's failed check and bench's error.
    assert status in (1, 2)
    assert "did you mean 'hyperlight://'?" in said.out + said.err, said


@pytest.mark.parametrize("command", ["warm-up", "doctor", "bench", "selftest"])
def test_a_url_given_twice_differently_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "hyperlight://", "--url", "hyperlight://?ray"])
    assert exited.value.code == 2
    assert "two sandbox URLs: --url hyperlight://?ray and hyperlight://" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["run", "/dev/null"], ["warm-up"], ["doctor"], ["bench"]])
def test_an_absurd_memory_limit_is_refused_by_every_command_as_serve_refuses_it(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*command, "--memory-limit-mb", "100000000"])
    assert exited.value.code == 2
    said = capsys.readouterr().err
    half = most_case_memory_mb()
    assert f"100000000 MiB is more than half this node's memory ({half} MiB)" in said


def test_serve_refuses_a_cap_past_the_most_a_case_may_ask_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--port", "0", "--max-memory-mb", str(most_case_memory_mb() + 1)])
    assert exited.value.code == 2
    said = capsys.readouterr().err
    assert f"more than half this node's memory ({most_case_memory_mb()} MiB)" in said


def test_run_prints_the_response_verl_would_get(
    hluk: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    solution = tmp_path / "solution.py"
    solution.write_text("print(int(input()) * 2)\n")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"21\n")))
    assert main(["run", str(solution)]) == 0
    response = json.loads(capsys.readouterr().out)
    assert response["status"] == "Success"
    assert response["run_result"]["stdout"] == "42\n"


RUN = "import sys\nfrom verl_hyperlight.cli import main\nsys.exit(main(sys.argv[1:]))"
HELLO = Path(__file__).parent.parent / "examples" / "hello.py"


def test_run_whose_reader_went_away_ends_quietly(hluk: Path, standin_env: dict[str, str]) -> None:
    """`verl-hyperlight run ... | head -c 1` ended in a BrokenPipeError traceback: the reader
    is gone before the answer is written (closed here at once, before the case has run)."""
    process = subprocess.Popen(
        [sys.executable, "-c", RUN, "run", str(HELLO)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **standin_env},
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    _, err = process.communicate(b"olleh\n", timeout=120)
    assert (process.returncode, err.decode()) == (141, "")


def test_run_reading_a_terminal_says_so_and_how_to_end_the_input(
    hluk: Path, standin_env: dict[str, str]
) -> None:
    """`run` with a terminal as its input waited silently for an input the user did not know
    it wanted."""
    terminal, side = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-c", RUN, "run", str(HELLO)],
        stdin=side,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **standin_env},
    )
    os.close(side)
    assert process.stderr is not None
    # Said before the input is read: a silent wait is a failure here, not a hang.
    if not select.select([process.stderr], [], [], 60)[0]:
        process.kill()
        raise AssertionError("run waited on the terminal without a word")
    said = process.stderr.readline().decode()
    assert "reading the solution's input from the terminal" in said and "Ctrl-D" in said
    os.write(terminal, b"olleh\n\x04")  # a line, then the end of input, as typed
    out, _ = process.communicate(timeout=120)
    os.close(terminal)
    assert process.returncode == 0
    assert json.loads(out)["run_result"]["stdout"] == "hello\n"


def test_run_compiles_cpp_and_rust_by_their_suffix_or_language(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    solution = tmp_path / "solution.cpp"
    solution.write_text(
        '#include <cstdio>\nint main() { int n; std::scanf("%d", &n); '
        'std::printf("%d\\n", 2 * n); }\n'
    )
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"21\n")))
    assert main(["run", str(solution)]) == 0
    response = json.loads(capsys.readouterr().out)
    assert response["compile_result"]["status"] == "Finished"
    assert (response["status"], response["run_result"]["stdout"]) == ("Success", "42\n")
    source = tmp_path / "solution.txt"
    source.write_text('fn main() { let x: u32 = "no"; }\n')
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert main(["run", str(source), "--language", "rust", "--compile-timeout", "30"]) == 0
    response = json.loads(capsys.readouterr().out)
    assert (response["status"], response["run_result"]) == ("Failed", None)
    assert "mismatched types" in response["compile_result"]["stderr"]


def test_run_names_a_language_by_its_suffix_and_says_when_none_is_known(
    hluk: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A C# file is a csharp request (answered SandboxError here, saying what runs), not Python
    that fails as a syntax error; a suffix no language has runs as Python, said on stderr."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    csharp = tmp_path / "Program.cs"
    csharp.write_text('System.Console.WriteLine("hi");\n')
    assert main(["run", str(csharp)]) == 1
    message = json.loads(capsys.readouterr().out)["message"]
    assert "language 'csharp' is not supported" in message
    assert message.startswith("verl-hyperlight runs python, pytest, cpp")
    tests = tmp_path / "sum_test.go"
    tests.write_text("package main\n")
    assert main(["run", str(tests)]) == 1
    assert "language 'go_test' is not supported" in json.loads(capsys.readouterr().out)["message"]
    odd = tmp_path / "solution.zzz"
    odd.write_text("print(6 * 7)\n")
    assert main(["run", str(odd)]) == 0
    said = capsys.readouterr()
    assert json.loads(said.out)["run_result"]["stdout"] == "42\n"
    assert "no language is known by the suffix '.zzz': it runs as python" in said.err
    plain = tmp_path / "solution"
    plain.write_text("print(1)\n")
    assert main(["run", str(plain)]) == 0
    assert capsys.readouterr().err == ""  # no suffix: Python, nothing to say


def test_run_asks_a_server_at_an_http_url_as_verls_client_does(
    serve: Callable[..., Served],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    served = serve()
    solution = tmp_path / "solution.py"
    solution.write_text("print(int(input()) * 2)\n")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"21\n")))
    assert main(["run", str(solution), "--url", served.run_code_url]) == 0
    response = json.loads(capsys.readouterr().out)
    assert (response["status"], response["run_result"]["stdout"]) == ("Success", "42\n")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert main(["run", str(solution), "--url", f"{served.base}/nowhere"]) == 1
    assert "answered HTTP 404" in capsys.readouterr().err
    # Any of Sandbox Fusion's languages is asked of a service (this one runs no C#).
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert main(["run", str(solution), "--url", served.run_code_url, "--language", "csharp"]) == 1
    assert "'csharp' is not supported" in json.loads(capsys.readouterr().out)["message"]


def test_run_with_no_time_says_why_its_answer_is_a_time_limit(
    hluk: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    solution = tmp_path / "solution.py"
    solution.write_text("print(1)\n")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert main(["run", str(solution), "--timeout", "-1"]) == 0
    said = capsys.readouterr()
    assert json.loads(said.out)["run_result"]["status"] == "TimeLimitExceeded"
    assert "--timeout -1 is answered TimeLimitExceeded at once, as Sandbox Fusion" in said.err


def test_run_passes_the_solution_and_its_input_byte_for_byte(
    hluk: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    solution = tmp_path / "solution.py"
    solution.write_bytes(b"import sys\r\ntext = sys.stdin.read()\r\nprint(repr(text))\r\n")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a\r\nb\r\n")))
    assert main(["run", str(solution)]) == 0
    response = json.loads(capsys.readouterr().out)
    assert response["run_result"]["stdout"] == "'a\\r\\nb\\r\\n'\n"


@pytest.mark.parametrize("bad", ["solution", "input"])
def test_run_refuses_text_that_is_not_utf8_saying_which(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    solution = tmp_path / "solution.py"
    solution.write_bytes(b"print(1)\n" if bad == "input" else b"print('\xff')\n")
    stdin = b"\xfe\n" if bad == "input" else b""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    assert main(["run", str(solution)]) == 1
    name = "standard input" if bad == "input" else str(solution)
    assert f"{name} is not UTF-8 text" in capsys.readouterr().err


README = Path(__file__).resolve().parent.parent / "README.md"
DOCS = README.parent / "docs"


def documentation() -> str:
    """The README and every page of the docs."""
    return "\n".join(path.read_text() for path in [README, *sorted(DOCS.rglob("*.md"))])


@pytest.mark.parametrize("command", ["warm-up", "run", "doctor", "bench", "serve", "selftest"])
def test_each_command_is_in_the_help_and_the_docs(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert command in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert len(capsys.readouterr().out.splitlines()) > 3
    assert f"verl-hyperlight {command}" in documentation()


def test_no_user_facing_text_holds_a_placeholder() -> None:
    root = README.parent
    texts = [
        README,
        *DOCS.rglob("*.md"),
        *root.joinpath("examples").iterdir(),
        *root.joinpath("src").rglob("*.py"),
    ]
    for path in texts:
        text = path.read_text()
        assert "<hyperlight-unikraft>" not in text, path
        assert "registry.example" not in text, path


@pytest.mark.parametrize(
    "option",
    [
        ["--grace", "-1"],
        ["--max-wait", "-0.5"],
        ["--max-wait", "nan"],
        ["--max-run-timeout", "0"],
        ["--max-memory-mb", "0"],
        ["--max-memory-mb", "512"],  # below the warm-up's 1024
    ],
)
def test_serve_refuses_options_it_cannot_honour(
    option: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from verl_hyperlight.server import app as serve

    def started(*args: object) -> None:
        raise AssertionError(f"serve started with {option}")

    monkeypatch.setattr(serve, "serve", started)
    with pytest.raises(SystemExit) as exited:
        main(["serve", *option])
    assert exited.value.code == 2
    assert option[0] in capsys.readouterr().err
