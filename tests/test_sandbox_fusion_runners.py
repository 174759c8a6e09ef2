"""Sandbox Fusion's own tests of its python and pytest runners (sandbox/tests/runners/ in its
repository), asked of `verl-hyperlight serve` over HTTP: the same requests, as its
`RunCodeRequest(...).model_dump()` sends them (every field, defaults included), and the same
assertions. Its tests that mock its internals (the runner's argv) have no counterpart here."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest
from serving import Served

Serve = Callable[..., Served]


def request(language: str, code: str, **fields: Any) -> dict[str, Any]:
    """A RunCodeRequest as model_dump() gives it."""
    return {
        "compile_timeout": 10,
        "run_timeout": 10,
        "memory_limit_MB": -1,
        "code": code,
        "stdin": None,
        "language": language,
        "files": {},
        "fetch_files": [],
        **fields,
    }


@pytest.fixture
def served(serve: Serve) -> Served:
    return serve()


def post(served: Served, body: dict[str, Any]) -> dict[str, Any]:
    response = served.post(body)
    assert response.status_code == 200
    result: dict[str, Any] = response.json()
    return result


# ---------------------------------------------------------------------------------------------
# sandbox/tests/runners/test_python.py


def test_python_print(served: Served) -> None:
    result = post(served, request("python", "print(123)", run_timeout=5))
    assert result["status"] == "Success"
    assert result["run_result"]["stdout"].strip() == "123"


def test_python_timeout(served: Served) -> None:
    result = post(served, request("python", "import time; time.sleep(0.2)", run_timeout=0.1))
    assert result["status"] == "Failed"
    assert result["run_result"]["status"] == "TimeLimitExceeded"


def test_python_assertion_error(served: Served) -> None:
    result = post(served, request("python", "assert 1 == 2", run_timeout=5))
    assert result["status"] == "Failed"
    assert result["run_result"]["status"] == "Finished"
    assert "AssertionError" in result["run_result"]["stderr"]


def test_python_syntax_error(served: Served) -> None:
    result = post(served, request("python", "int a = 1", run_timeout=5))
    assert result["status"] == "Failed"
    assert result["run_result"]["status"] == "Finished"
    assert "SyntaxError: invalid syntax" in result["run_result"]["stderr"]


def test_python_file_read(served: Served) -> None:
    code = 'print(open("dir1/dir2/dir3/secret_flag").read())'
    files = {"dir1/dir2/dir3/secret_flag": "ImhlbGxvLCB0aGlzIGlzIGEgdGVzdCI="}
    result = post(served, request("python", code, run_timeout=5, files=files))
    assert result["status"] == "Success"
    assert result["run_result"]["status"] == "Finished"
    assert "hello, this is a test" in result["run_result"]["stdout"]


def test_python_stdin(served: Served) -> None:
    result = post(served, request("python", "print(int(input()))", run_timeout=5, stdin="65535"))
    assert result["status"] == "Success"
    assert result["run_result"]["status"] == "Finished"
    assert result["run_result"]["stdout"] == "65535\n"


def test_python_fetch_files(served: Served) -> None:
    # The solution writes /mnt/b itself: the guest must have the /mnt every Linux host has.
    code = 'open("a.txt", "w").write("secret"); open("/mnt/b", "w").write("sauce");'
    body = request("python", code, run_timeout=5, fetch_files=["a.txt", "/mnt/b"])
    result = post(served, body)
    assert result["status"] == "Success"
    assert result["run_result"]["status"] == "Finished"
    assert base64.b64decode(result["files"]["a.txt"].encode()).decode() == "secret"
    assert base64.b64decode(result["files"]["/mnt/b"].encode()).decode() == "sauce"


# ---------------------------------------------------------------------------------------------
# sandbox/tests/runners/test_pytest.py: the same test file, passing and failing, run both as
# `python` (defining the tests, running none: Success) and as `pytest`.

WORD_COUNT = r"""
def word_count(file_path):
    try:
        with open(file_path, 'r', encoding='utf-8') as file:
            content = file.read()
        translator = str.maketrans("", "", string.punctuation)
        content = content.translate(translator).lower()
        words = content.split()
        word_counter = Counter(words)
        sorted_word_count = sorted(word_counter.items(), key=lambda x: x[1], reverse=True)
        for word, count in sorted_word_count:
            print(f"'{word}': {count}")
    except FileNotFoundError:
        print(f"Error: File '{file_path}' not found.")

import string
from collections import Counter


class Testword_count:
    def test_word_count_case_sensitive_file(self, capfd, tmp_path):
        file_path = tmp_path / 'test_case_sensitive.txt'
        with open(file_path, 'w', encoding='utf-8') as file:
            file.write("Case case CASE")
        word_count(file_path)
        captured = capfd.readouterr()
        assert "'case': 3" {op} captured.out

    def test_word_count_punctuation_file(self, capfd, tmp_path):
        file_path = tmp_path / 'test_punctuation.txt'
        with open(file_path, 'w', encoding='utf-8') as file:
            file.write("This sentence has some punctuation, like commas and periods.")
        word_count(file_path)
        captured = capfd.readouterr()
        assert "'this': 1\n'sentence': 1\n'has': 1\n'some': 1\n'punctuation': 1\n'like': 1\n'commas': 1\n'and': 1\n'periods': 1\n" {op} captured.out
"""  # noqa: E501 - the service's test, as it is
PASSING = WORD_COUNT.replace("{op}", "in")
FAILING = WORD_COUNT.replace("{op}", "not in")


def test_pytest_pass(served: Served) -> None:
    result = post(served, request("python", PASSING, run_timeout=5))
    assert result["status"] == "Success"
    result = post(served, request("pytest", PASSING, run_timeout=5))
    assert result["status"] == "Success", result


def test_pytest_fail(served: Served) -> None:
    result = post(served, request("python", FAILING, run_timeout=5))
    assert result["status"] == "Success"
    result = post(served, request("pytest", FAILING, run_timeout=5))
    assert result["status"] == "Failed"
