"""`verl-hyperlight serve` over real HTTP: a server started as a subprocess on a free loopback
port (tests/serving.py), with the stand-in hluk. Sandbox Fusion's contract (the response,
`files` and `fetch_files`, its error statuses and bodies), admission (never more than N
micro-VMs, 504 past the queue or the wait), a client that goes away, stopping, readiness,
metrics and the access log."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httpx
import pytest
from hostside import (
    KVM_FAILURE,
    Host,
    descendants_of,
    fail_with,
    option,
    processes_with,
    wait_for,
)
from serving import Served

from verl_hyperlight.settings import BODY_READ_TIMEOUT

Serve = Callable[..., Served]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def body(code: str, **fields: Any) -> dict[str, Any]:
    return {"code": code, "language": "python", "run_timeout": 10, **fields}


def metric(served: Served, name: str) -> float:
    """The value of one sample of /metrics, by its name and labels (0 if absent)."""
    for line in httpx.get(f"{served.base}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


# ---------------------------------------------------------------------------------------------
# the contract


def test_ping_answers_pong_and_readiness_says_ready(serve: Serve) -> None:
    served = serve()
    assert httpx.get(f"{served.base}/v1/ping").json() == "pong"
    ready = httpx.get(f"{served.base}/readyz")
    # Go is installed here: its build cache is being warmed, or is (tests/test_compiled.py).
    compiles = ready.json()["compiles"]
    assert compiles in ("warming", "warm")
    expected = {"ready": True, "reason": "ready", "compiles": compiles}
    assert (ready.status_code, ready.json()) == (200, expected)
    raw = exchange(served, request_bytes("GET", "/readyz", "host: h"))
    # As FastAPI renders it (compact), whichever the state is by then.
    assert raw in [
        sent_json("200 OK", b'{"ready":true,"reason":"ready","compiles":"%s"}' % state)
        for state in (b"warming", b"warm")
    ]


def test_a_run_is_answered_with_the_services_response(serve: Serve) -> None:
    served = serve()
    reply = served.post(body("print(input()[::-1])", stdin="abc\n", unknown_key="ignored"))
    assert reply.status_code == 200
    assert reply.json() == {
        "status": "Success",
        "message": "",
        "compile_result": None,
        "run_result": {
            "status": "Finished",
            "execution_time": reply.json()["run_result"]["execution_time"],
            "return_code": 0,
            "stdout": "cba\n",
            "stderr": "",
        },
        "executor_pod_name": None,
        "files": {},
    }


def test_a_request_without_a_memory_key_runs_in_the_guest_warmed_before_ready(
    serve: Serve, host: Host
) -> None:
    """The README's request has no memory key: it ran in the image's 256 MiB guest, cold
    (serve had warmed the 1024 MiB one), where a 200 MB allocation is killed that Sandbox
    Fusion (no limit by default) runs."""
    served = serve()
    # The guest of --memory-limit-mb's default, 1024 (a micro-VM of more: the runner's share).
    [warmed] = [option(argv, "--scratch-mb") for argv in host.warm_ups()]
    assert warmed is not None and int(warmed) >= 1024
    code = "x = bytearray(200 * 1024 * 1024)\nprint(len(x))"
    for request in (body(code), body(code, memory_limit_MB=-1), body(code, memory_limit_MB=0)):
        reply = served.post(request).json()
        assert (reply["status"], reply["run_result"]["stdout"]) == ("Success", "209715200\n")
    assert [option(argv, "--scratch-mb") for argv in host.case_runs()] == [warmed] * 3
    assert len(host.warm_ups()) == 1  # nothing more to warm: the guest was the warmed one


def test_files_are_written_before_the_start_and_fetch_files_come_back(serve: Serve) -> None:
    served = serve()
    code = (
        "print(open('data/in.txt').read(), open('/mnt/b').read(), end='')\n"
        "open('out.txt', 'w').write('written by the solution')\n"
    )
    reply = served.post(
        body(
            code,
            files={
                "data/in.txt": b64(b"nested"),
                "/mnt/b": b64(b"absolute"),
                "skipped": None,
                "IGNORE_THIS_FILE.txt": b64(b"never written"),
            },
            fetch_files=["out.txt", "/mnt/b", "missing.txt", "IGNORE_THIS_FILE.txt", "data"],
        )
    ).json()
    assert reply["run_result"]["stdout"] == "nested absolute"
    # What exists as a regular file comes back; what does not is left out, as the service
    # leaves it out.
    assert reply["files"] == {
        "out.txt": b64(b"written by the solution"),
        "/mnt/b": b64(b"absolute"),
    }


def test_hostile_paths_reach_only_the_guests_own_files(serve: Serve, tmp_path: Path) -> None:
    served = serve()
    secret = tmp_path / "host-secret.txt"
    secret.write_text(uuid.uuid4().hex)
    escape = tmp_path / f"escaped-{uuid.uuid4().hex}"
    depth = "../" * (len(Path.cwd().parts) + len(tmp_path.parts) + 4)
    files = {
        f"{depth}{str(escape).lstrip('/')}-dots": b64(b"x"),  # ../../ up to the host's root
        f"{escape}-absolute": b64(b"x"),
    }
    code = f"import os\nos.symlink({str(secret)!r}, 'link')\n"
    reply = served.post(
        body(
            code,
            files=files,
            fetch_files=[str(secret), f"{depth}{str(secret).lstrip('/')}", "link"],
        )
    ).json()
    assert reply["status"] == "Success", reply
    # Nothing of the request reached the host's file system, and nothing of the host's came
    # back: the paths were the guest's (where the host's secret does not exist).
    assert not list(tmp_path.glob("escaped-*"))
    assert secret.read_text() not in json.dumps(reply)
    assert reply["files"] == {}
    assert served.case_dirs() == []


def test_a_file_the_guest_cannot_write_is_a_sandbox_error_before_the_run(serve: Serve) -> None:
    served = serve()
    # The case's own directory is mounted read-only in the guest.
    reply = served.post(body("print('never ran')", files={"/case/x.txt": b64(b"x")})).json()
    assert (reply["status"], reply["run_result"]) == ("SandboxError", None)
    assert "cannot write the request's file '/case/x.txt'" in reply["message"]


def test_only_regular_files_are_fetched(serve: Serve) -> None:
    served = serve()
    # A FIFO would block the reader; a directory is not a file: both are left out.
    code = "import os\nos.mkfifo('pipe')\nos.mkdir('folder')\nopen('plain', 'w').write('ok')\n"
    reply = served.post(body(code, fetch_files=["pipe", "folder", "plain"])).json()
    assert reply["files"] == {"plain": b64(b"ok")}


def test_fetched_files_past_their_limit_are_left_out_and_named(serve: Serve) -> None:
    served = serve()
    nine_mib = 9 * 1024 * 1024
    code = f"for name in ('a.bin', 'b.bin'):\n    open(name, 'wb').write(b'z' * {nine_mib})\n"
    reply = served.post(body(code, fetch_files=["a.bin", "b.bin"])).json()
    assert reply["status"] == "Success"
    assert list(reply["files"]) == ["a.bin"]
    assert len(base64.b64decode(reply["files"]["a.bin"])) == nine_mib
    assert "1 left out, past 16 MiB in all: b.bin" in reply["message"]


def test_a_request_without_language_runs_as_python(serve: Serve) -> None:
    served = serve()
    reply = served.post({"code": "print('lenient')"}).json()
    assert (reply["status"], reply["run_result"]["stdout"]) == ("Success", "lenient\n")


def test_bad_base64_in_files_is_a_sandbox_error_with_status_200(serve: Serve) -> None:
    served = serve()
    reply = served.post(body("print(1)", files={"a.txt": "not base64!"}))
    assert reply.status_code == 200
    assert reply.json()["status"] == "SandboxError"
    assert "a.txt" in reply.json()["message"] and "base64" in reply.json()["message"]


def test_a_run_timeout_of_zero_is_a_time_limit_exceeded_at_once(serve: Serve) -> None:
    served = serve()
    reply = served.post(body("print(1)", run_timeout=0)).json()
    assert (reply["status"], reply["run_result"]["status"]) == ("Failed", "TimeLimitExceeded")


def test_a_language_not_run_here_is_a_sandbox_error_saying_so(serve: Serve) -> None:
    served = serve()
    reply = served.post(body("puts 1", language="ruby"))
    assert reply.status_code == 200
    assert "language 'ruby' is not supported" in reply.json()["message"]


def test_the_executor_pod_name_is_my_pod_name(serve: Serve) -> None:
    served = serve(env={"MY_POD_NAME": "sandbox-7"})
    assert served.post(body("pass")).json()["executor_pod_name"] == "sandbox-7"


@pytest.mark.parametrize(
    ("payload", "headers", "kind", "loc"),
    [
        (b"not json", {"content-type": "application/json"}, "json_invalid", ["body", 0]),
        (b"", {"content-type": "application/json"}, "missing", ["body"]),
        (b"[1, 2]", {"content-type": "application/json"}, "model_attributes_type", ["body"]),
        (
            b'{"language": "python"}',
            {"content-type": "application/json"},
            "missing",
            ["body", "code"],
        ),
        (b'{"code": 123}', {"content-type": "application/json"}, "string_type", ["body", "code"]),
        (
            b'{"code": "x", "language": "cobol"}',
            {"content-type": "application/json"},
            "literal_error",
            ["body", "language"],
        ),
        (
            b'{"code": "x", "run_timeout": "abc"}',
            {"content-type": "application/json"},
            "float_parsing",
            ["body", "run_timeout"],
        ),
        (
            b'{"code": "x", "memory_limit_MB": 1.5}',
            {"content-type": "application/json"},
            "int_from_float",
            ["body", "memory_limit_MB"],
        ),
        (b'{"code": "x"}', {}, "model_attributes_type", ["body"]),
    ],
    ids=lambda value: repr(value)[:30] if isinstance(value, bytes) else None,
)
def test_a_bad_request_gets_the_services_422(
    serve: Serve, payload: bytes, headers: dict[str, str], kind: str, loc: list[Any]
) -> None:
    served = serve()
    reply = httpx.post(served.run_code_url, content=payload, headers=headers)
    assert reply.status_code == 422
    [error] = reply.json()["detail"]
    assert (error["type"], error["loc"]) == (kind, loc)


def test_a_number_as_a_string_is_accepted_as_the_service_accepts_it(serve: Serve) -> None:
    served = serve()
    reply = served.post(body("print(1)", run_timeout="5")).json()
    assert reply["status"] == "Success"


def test_get_run_code_is_405(serve: Serve) -> None:
    served = serve()
    reply = httpx.get(served.run_code_url)
    assert (reply.status_code, reply.json()) == (405, {"detail": "Method Not Allowed"})


def test_a_body_over_the_limit_is_413_whether_or_not_it_says_its_length(serve: Serve) -> None:
    served = serve("--max-body-mb", "1")
    large = json.dumps(body("x = 1", stdin="y" * (2 * 1024 * 1024))).encode()
    said = httpx.post(
        served.run_code_url, content=large, headers={"content-type": "application/json"}
    )
    assert said.status_code == 413

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(large), 64 * 1024):
            yield large[start : start + 64 * 1024]

    streamed = httpx.post(
        served.run_code_url, content=chunks(), headers={"content-type": "application/json"}
    )
    assert streamed.status_code == 413
    assert served.post(body("print('small')")).json()["status"] == "Success"


def test_a_token_when_set_is_required_on_run_code(serve: Serve) -> None:
    served = serve(env={"VERL_HYPERLIGHT_TOKEN": "s3cret"})
    assert served.post(body("print(1)")).status_code == 401
    wrong = served.post(body("print(1)"), headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401
    right = served.post(body("print(1)"), headers={"authorization": "Bearer s3cret"})
    assert (right.status_code, right.json()["status"]) == (200, "Success")
    assert httpx.get(f"{served.base}/v1/ping").status_code == 200


# ---------------------------------------------------------------------------------------------
# every route, method and odd path, answered byte for byte as FastAPI answers them (the service
# is a FastAPI application): its 404, its 405 with Allow, its redirect of a trailing slash

METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE")
OTHERS = "every other method"


def exchange(served: Served, request: bytes) -> bytes:
    """What the server sends back for `request` until it closes the connection, with its date,
    request id and port as placeholders."""
    port = int(served.base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(request)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    received = re.sub(rb"\r\ndate: [^\r]+\r\n", b"\r\ndate: DATE\r\n", received)
    received = re.sub(rb"\r\nx-request-id: [0-9a-f]{16}\r\n", b"\r\nx-request-id: ID\r\n", received)
    return received.replace(f"127.0.0.1:{port}".encode(), b"127.0.0.1:PORT")


def request_bytes(
    method: str, target: str, *headers: str, version: str = "HTTP/1.1", content: bytes = b""
) -> bytes:
    lines = [f"{method} {target} {version}", *headers, "connection: close"]
    if content:
        lines += ["content-type: application/json", f"content-length: {len(content)}"]
    return "\r\n".join([*lines, "", ""]).encode("latin-1") + content


def sent(status: str, *headers: str, content: bytes = b"") -> bytes:
    """An answer as uvicorn writes it: its date and server first, the request id and the
    connection last."""
    lines = [f"HTTP/1.1 {status}", "date: DATE", "server: uvicorn", *headers]
    lines += ["x-request-id: ID", "connection: close"]
    return "\r\n".join([*lines, "", ""]).encode("latin-1") + content


def sent_json(status: str, content: bytes, *headers: str) -> bytes:
    length = f"content-length: {len(content)}"
    return sent(status, *headers, length, "content-type: application/json", content=content)


def not_allowed(allowed: str) -> bytes:
    return sent_json(
        "405 Method Not Allowed", b'{"detail":"Method Not Allowed"}', f"allow: {allowed}"
    )


def redirected(location: str) -> bytes:
    return sent("307 Temporary Redirect", "content-length: 0", f"location: {location}")


def without_content(answer: bytes) -> bytes:
    """An answer to HEAD: uvicorn sends its headers alone."""
    return answer.partition(b"\r\n\r\n")[0] + b"\r\n\r\n"


PONG = sent_json("200 OK", b'"pong"')
NOT_FOUND = sent_json("404 Not Found", b'{"detail":"Not Found"}')
JSON_INVALID = sent_json(
    # uvicorn's phrase is the running Python's: "Unprocessable Content" from 3.13 (RFC 9110).
    f"422 {HTTPStatus.UNPROCESSABLE_ENTITY.phrase}",
    b'{"detail":[{"type":"json_invalid","loc":["body",1],"msg":"JSON decode error","input":{},'
    b'"ctx":{"error":"Expecting property name enclosed in double quotes"}}]}',
)
# Each request is sent with Host "h" and, when it is a POST, the body "{" (JSON); None: pinned
# apart (the text of GET /metrics is prometheus-client's).
ANSWERS: dict[str, dict[str, bytes | None]] = {
    "/v1/ping": {"GET": PONG, OTHERS: not_allowed("GET")},
    "/v1/ping?x=1": {"GET": PONG, OTHERS: not_allowed("GET")},
    "/readyz": {
        "GET": None,  # test_ping_answers_pong_and_readiness_says_ready
        OTHERS: not_allowed("GET"),
    },
    "/metrics": {"GET": None, OTHERS: not_allowed("GET")},
    "/run_code": {"POST": JSON_INVALID, OTHERS: not_allowed("POST")},
    "/run_code?x=1": {"POST": JSON_INVALID, OTHERS: not_allowed("POST")},
    "/": {OTHERS: NOT_FOUND},
    "/nope": {OTHERS: NOT_FOUND},
    "/v1": {OTHERS: NOT_FOUND},
    "/V1/PING": {OTHERS: NOT_FOUND},
    "//v1/ping": {OTHERS: NOT_FOUND},
    "/run_code/x": {OTHERS: NOT_FOUND},
    "/v1/ping/%3F": {OTHERS: NOT_FOUND},
    "/v1/ping/": {OTHERS: redirected("http://h/v1/ping")},
    "/v1/ping%2F": {OTHERS: redirected("http://h/v1/ping")},
    "/readyz/?a=b&c=%20": {OTHERS: redirected("http://h/readyz?a=b&c=%20")},
    "/metrics//": {OTHERS: redirected("http://h/metrics")},
    "/run_code/": {OTHERS: redirected("http://h/run_code")},
    # A path is matched whole: FastAPI's patterns (`^/v1/ping$`) also matched before a trailing
    # newline, where a POST to /run_code's got 200 `null` past the token and the admission.
    "/v1/ping%0A": {OTHERS: NOT_FOUND},
    "/run_code%0A": {OTHERS: NOT_FOUND},
    "/run_code%0A/": {OTHERS: NOT_FOUND},
}
# The redirect's location, by the request's Host (Starlette's rule: a valid one, else the
# address the server listens on) and the scheme uvicorn took from a trusted proxy.
REDIRECTS: list[tuple[list[str], str, str]] = [
    (["host: example.org:8080"], "HTTP/1.1", "http://example.org:8080/v1/ping"),
    (["host: [::1]:8080"], "HTTP/1.1", "http://[::1]:8080/v1/ping"),
    (["host: [::zz]"], "HTTP/1.1", "http://127.0.0.1:PORT/v1/ping"),
    (["host: [1:2:3:4:5:6:7:8:9]"], "HTTP/1.1", "http://127.0.0.1:PORT/v1/ping"),
    (["host: h:00080"], "HTTP/1.1", "http://h:00080/v1/ping"),
    (["host: a b"], "HTTP/1.1", "http://127.0.0.1:PORT/v1/ping"),
    (["host: h:99999"], "HTTP/1.1", "http://127.0.0.1:PORT/v1/ping"),
    (["host: h:"], "HTTP/1.1", "http://127.0.0.1:PORT/v1/ping"),
    (["host: first", "host: second"], "HTTP/1.1", "http://first/v1/ping"),
    (["host: h", "x-forwarded-proto: https"], "HTTP/1.1", "https://h/v1/ping"),
    ([], "HTTP/1.0", "http://127.0.0.1:PORT/v1/ping"),
]


def test_every_route_and_method_gets_fastapis_answer_byte_for_byte(serve: Serve) -> None:
    served = serve()
    for target, answers in ANSWERS.items():
        for method in METHODS:
            expected = answers.get(method, answers[OTHERS])
            if expected is None:
                continue
            content = b"{" if method == "POST" else b""
            got = exchange(served, request_bytes(method, target, "host: h", content=content))
            assert got == (without_content(expected) if method == "HEAD" else expected), (
                method,
                target,
            )
    for headers, version, location in REDIRECTS:
        got = exchange(served, request_bytes("GET", "/v1/ping/", *headers, version=version))
        assert got == redirected(location), headers


def test_metrics_and_unreadiness_get_fastapis_answers_byte_for_byte(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_file: Path
) -> None:
    from prometheus_client import CONTENT_TYPE_LATEST

    served = serve()
    got = exchange(served, request_bytes("GET", "/metrics", "host: h"))
    head, _, text = got.partition(b"\r\n\r\n")
    length, kind = f"content-length: {len(text)}", f"content-type: {CONTENT_TYPE_LATEST}"
    assert head + b"\r\n\r\n" == sent("200 OK", length, kind)
    assert text.startswith(b"# HELP verl_hyperlight_cases_total Requests to /run_code")

    broken = without_kvm(serve, monkeypatch, fail_file, tmp_path / "cache-without-kvm")
    assert wait_for(
        lambda: httpx.get(f"{broken.base}/readyz").json()["reason"] != "warming up", limit=30
    )
    got = exchange(broken, request_bytes("GET", "/readyz", "host: h"))
    said = json.loads(got.partition(b"\r\n\r\n")[2])
    assert said["ready"] is False
    rendered = json.dumps(said, ensure_ascii=False, separators=(",", ":")).encode()
    assert got == sent_json("503 Service Unavailable", rendered)


# ---------------------------------------------------------------------------------------------
# admission and load

# An HLUK_PATH that counts the case runs going on at once (and the most at once) in a file, and
# runs the stand-in.
# A hluk that counts the micro-VMs running a case at once: from its start to its guest's whole
# report (its `done` frame), after which the case is answered and hluk's teardown is off the
# case's path (tests/test_answer_at_report.py), bounded by its grace.
COUNTING_HLUK = """#!{python}
import fcntl, json, os, subprocess, sys
COUNT = {count!r}

def add(delta):
    with open(COUNT, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        now, most = json.loads(f.read() or "[0, 0]")
        now += delta
        f.seek(0)
        f.truncate()
        f.write(json.dumps([now, max(most, now)]))

case = "--mount" in sys.argv
if case:
    add(1)
argv = [{python!r}, "-I", "-S", {standin!r}, *sys.argv[1:]]
proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
running, seen = case, b""
while chunk := os.read(proc.stdout.fileno(), 65536):
    if running and b" done" in seen[-64:] + chunk:
        add(-1)
        running = False
    seen = (seen + chunk)[-64:]
    os.write(1, chunk)
status = proc.wait()
if running:
    add(-1)
sys.exit(status)
"""


def test_never_more_than_max_concurrent_micro_vms_at_once(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import STANDIN

    count = tmp_path / "count.json"
    counting = tmp_path / "hluk"
    counting.write_text(
        COUNTING_HLUK.format(python=sys.executable, count=str(count), standin=str(STANDIN))
    )
    counting.chmod(0o755)
    monkeypatch.setenv("HLUK_PATH", str(counting))
    served = serve("--max-concurrent", "2", "--max-wait", "60")
    code = "import time\ntime.sleep(0.5)\nprint('done')"
    with served.client() as client, ThreadPool(8) as pool:
        replies = pool.map(lambda _: client.post("/run_code", json=body(code)).json(), range(8))
    assert [reply["status"] for reply in replies] == ["Success"] * 8
    assert wait_for(lambda: count.read_text() == "[0, 2]"), count.read_text()


class ThreadPool:
    """Calls at once from threads (a small context manager over concurrent.futures)."""

    def __init__(self, size: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.executor = ThreadPoolExecutor(size)

    def __enter__(self) -> ThreadPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.executor.shutdown()

    def map(self, function: Callable[[int], Any], items: range) -> list[Any]:
        return list(self.executor.map(function, items))


def test_past_the_queue_or_the_wait_a_request_is_504_with_retry_after(serve: Serve) -> None:
    served = serve("--max-concurrent", "1", "--max-queue", "1", "--max-wait", "1")
    slow = body("import time\ntime.sleep(4)\nprint('slow')")
    with served.client() as client, ThreadPool(3) as pool:
        replies = pool.map(
            lambda i: (time.sleep(0.3 * i), client.post("/run_code", json=slow))[1], range(3)
        )
    statuses = [reply.status_code for reply in replies]
    # One runs; one waits its 1 s and is turned away; one finds the queue full at once.
    assert sorted(statuses) == [200, 504, 504], statuses
    for reply in replies:
        if reply.status_code == 504:
            assert reply.headers["retry-after"] == "1"
            assert "busy" in reply.json()["detail"]
    assert metric(served, 'verl_hyperlight_cases_total{status="rejected"}') == 2


def test_waiting_is_never_charged_to_run_timeout(serve: Serve) -> None:
    served = serve("--max-concurrent", "1", "--max-wait", "30")
    first = body("import time\ntime.sleep(2)\nprint('first')", run_timeout=10)
    second = body("print('second')", run_timeout=1)  # waits about 2 s for its micro-VM
    with served.client() as client, ThreadPool(2) as pool:
        replies = pool.map(
            lambda i: (time.sleep(0.3 * i), client.post("/run_code", json=[first, second][i]))[1],
            range(2),
        )
    assert [reply.json()["status"] for reply in replies] == ["Success", "Success"]


def sleeper(marker: str, seconds: int) -> str:
    return (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {marker}'])\n"
        f"time.sleep({seconds})\n"
    )


def test_a_client_that_goes_away_leaves_no_micro_vm_running(serve: Serve) -> None:
    served = serve()
    marker = uuid.uuid4().hex
    with pytest.raises(httpx.ReadTimeout), httpx.Client(timeout=3) as client:
        client.post(served.run_code_url, json=body(sleeper(marker, 60), run_timeout=60))
    assert wait_for(lambda: not processes_with(marker)), processes_with(marker)
    assert wait_for(lambda: not served.case_dirs()), served.case_dirs()
    assert wait_for(lambda: metric(served, 'verl_hyperlight_cases_total{status="cancelled"}') == 1)
    assert metric(served, "verl_hyperlight_cases_in_flight") == 0


# ---------------------------------------------------------------------------------------------
# stopping

# After its graceful shutdown uvicorn ends by the signal it was sent (as systemd expects of a
# service it stopped), or with 0.
STOPPED = (0, -signal.SIGTERM)


def post_in_background(
    served: Served, request: dict[str, Any]
) -> tuple[threading.Thread, list[Any]]:
    answer: list[Any] = []

    def post() -> None:
        try:
            answer.append(served.post(request))
        except httpx.HTTPError as exc:
            answer.append(exc)

    thread = threading.Thread(target=post)
    thread.start()
    return thread, answer


def test_sigterm_lets_in_flight_cases_finish_then_exits(serve: Serve) -> None:
    served = serve("--grace", "20")
    thread, answer = post_in_background(
        served, body("import time\ntime.sleep(2)\nprint('finished')")
    )
    assert wait_for(lambda: metric(served, "verl_hyperlight_cases_in_flight") == 1)
    assert served.stop(signal.SIGTERM) in STOPPED
    thread.join()
    assert answer[0].status_code == 200
    assert answer[0].json()["run_result"]["stdout"] == "finished\n"
    assert served.case_dirs() == []
    assert "Application shutdown complete" in served.logged()


def test_sigterm_past_the_grace_period_kills_what_is_left(serve: Serve) -> None:
    served = serve("--grace", "1")
    marker = uuid.uuid4().hex
    thread, answer = post_in_background(served, body(sleeper(marker, 60), run_timeout=60))
    assert wait_for(lambda: processes_with(marker))
    assert served.stop(signal.SIGTERM, timeout=30) in STOPPED
    thread.join()
    # Answered as cancelled if the connection was still open, else closed: never run out.
    if isinstance(answer[0], httpx.Response):
        assert answer[0].json()["status"] == "SandboxError"
        assert "cancelled" in answer[0].json()["message"]
    assert wait_for(lambda: not processes_with(marker)), processes_with(marker)
    assert served.case_dirs() == []
    assert "cases in flight get 1 s to finish" in served.logged()


# ---------------------------------------------------------------------------------------------
# operations


def without_kvm(
    serve: Serve, monkeypatch: pytest.MonkeyPatch, fail_file: Path, cache: Path
) -> Served:
    """A server (with a cache of its own) whose every hluk run fails as one without /dev/kvm."""
    fail_with(monkeypatch, fail_file, KVM_FAILURE, 100)
    return serve(ready=False, env={"HLUK_CACHE_DIR": str(cache)})


def test_metrics_count_cases_by_status_and_backend_failures_by_cause(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_file: Path
) -> None:
    served = serve()
    served.post(body("print(1)"))
    served.post(body("raise SystemExit(3)"))
    httpx.post(served.run_code_url, json={"code": 1})
    assert metric(served, 'verl_hyperlight_cases_total{status="Success"}') == 1
    assert metric(served, 'verl_hyperlight_cases_total{status="Failed"}') == 1
    assert metric(served, "verl_hyperlight_case_seconds_count") == 2
    assert metric(served, "verl_hyperlight_cases_queued") == 0

    broken = without_kvm(serve, monkeypatch, fail_file, tmp_path / "another-cache")
    assert broken.post(body("print(1)")).json()["status"] == "SandboxError"
    assert metric(broken, 'verl_hyperlight_backend_failures_total{cause="kvm"}') >= 1


def test_readiness_says_what_is_wrong_while_the_backend_fails(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_file: Path
) -> None:
    served = without_kvm(serve, monkeypatch, fail_file, tmp_path / "cache-without-kvm")
    deadline = time.monotonic() + 30
    while (reply := httpx.get(f"{served.base}/readyz")).json()["reason"] == "warming up":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert reply.status_code == 503
    assert "kvm group" in reply.json()["reason"]
    assert httpx.get(f"{served.base}/v1/ping").status_code == 200  # alive, not ready
    assert "not ready" in served.logged()


def test_each_request_gets_one_access_log_line_with_its_request_id(serve: Serve) -> None:
    served = serve()
    reply = served.post(body("print(1)"), headers={"x-request-id": "trace-42"})
    assert reply.headers["x-request-id"] == "trace-42"
    generated = httpx.get(f"{served.base}/v1/ping").headers["x-request-id"]

    def access_lines() -> list[str]:
        return [line for line in served.logged().splitlines() if "verl_hyperlight.access" in line]

    # A request's line is written once its response has gone out, so the client can be first.
    ids = ("trace-42", generated)
    wait_for(lambda: all(any(i in line for line in access_lines()) for i in ids))
    lines = access_lines()
    [traced] = [line for line in lines if "trace-42" in line]
    assert '"POST /run_code" 200' in traced and "case=Success" in traced
    assert any(generated in line and '"GET /v1/ping" 200' in line for line in lines)


def test_the_plugin_and_run_code_never_import_the_servers_stack() -> None:
    code = (
        "import sys\nimport verl_hyperlight.plugin\nfrom verl_hyperlight import run_code\n"
        "print(sorted({'fastapi', 'uvicorn', 'starlette', 'prometheus_client'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_serve_without_its_extra_says_how_to_install_it() -> None:
    code = (
        "import sys\nsys.modules['uvicorn'] = None\n"
        "from verl_hyperlight.cli import main\nsys.exit(main(['serve']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert "pip install -e '.[serve]' in your verl-hyperlight checkout" in done.stderr


def test_listening_beyond_loopback_without_a_token_is_warned(serve: Serve) -> None:
    served = serve("--host", "0.0.0.0", ready=False)
    assert wait_for(lambda: "has no authentication" in served.logged()), served.logged()


def test_host_fixture_is_what_the_server_runs(host: Host, serve: Serve) -> None:
    served = serve()
    served.post(body("print(1)"))
    assert host.case_runs()  # the server's cases ran on the test's stand-in
    assert os.environ["HLUK_CACHE_DIR"] == str(host.cache)


# ---------------------------------------------------------------------------------------------
# the server in this process, driven as uvicorn drives it (no socket)

Answer = tuple[int, dict[bytes, bytes], bytes]


def http_scope(method: str, path: str, headers: Any = ()) -> dict[str, Any]:
    """An HTTP request's scope, as uvicorn makes it."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
    }


async def asgi(
    app: Any, path: str, payload: bytes = b"", headers: Any = (), method: str = "POST"
) -> Answer:
    """One request to an ASGI application: its status, headers (but X-Request-ID) and body. An
    application that raises before answering gets uvicorn's answer, 500 Internal Server Error."""
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    try:
        await app(http_scope(method, path, headers), receive, send)
    except Exception:
        if not sent:
            return 500, {}, b"Internal Server Error"
    start = sent[0]
    body_bytes = b"".join(m.get("body", b"") for m in sent[1:])
    kept = {k: v for k, v in start["headers"] if k != b"x-request-id"}
    return start["status"], kept, body_bytes


async def started(app: Any) -> Callable[[], Awaitable[None]]:
    """Run the application's lifespan startup, as uvicorn does; its shutdown, to call."""
    inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    lifespan = asyncio.ensure_future(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, outbox.put)
    )
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"

    async def stop() -> None:
        await inbox.put({"type": "lifespan.shutdown"})
        assert (await outbox.get())["type"] == "lifespan.shutdown.complete"
        await lifespan

    return stop


def fastapi_route() -> Any:
    """/run_code as the service declares it, and as serve declared it before it read requests
    itself: a FastAPI route taking the request model."""
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    from verl_hyperlight.server.request import RunCodeRequest

    app = FastAPI()

    async def run_code(body: RunCodeRequest) -> PlainTextResponse:
        return PlainTextResponse(repr(body.model_dump()))  # NaN and lone surrogates included

    run_code.__annotations__["body"] = RunCodeRequest  # the class, not this module's string
    app.post("/run_code")(run_code)
    return app


JSON = [("content-type", "application/json")]
BAD_REQUESTS: list[tuple[bytes, Any]] = [
    (b"not json", JSON),
    (b"", JSON),
    (b"", []),
    (b"[1, 2]", JSON),
    (b"null", JSON),
    (b'"code"', JSON),
    (b"{", JSON),
    (b'{"code": "x",}', JSON),
    (b'{"code": "x"} trailing', JSON),
    (b'{"language": "python"}', JSON),
    (b'{"code": 123}', JSON),
    (b'{"code": null}', JSON),
    (b'{"code": ["x"]}', JSON),
    (b'{"code": "x", "language": "cobol"}', JSON),
    (b'{"code": "x", "language": "\xc3\xbc"}', JSON),
    (b'{"code": "x", "language": null}', JSON),
    (b'{"code": "x", "run_timeout": "abc"}', JSON),
    (b'{"code": "x", "run_timeout": null}', JSON),
    (b'{"code": "x", "compile_timeout": [1]}', JSON),
    (b'{"code": "x", "memory_limit_MB": 1.5}', JSON),
    (b'{"code": "x", "memory_limit_MB": "12a"}', JSON),
    (b'{"code": "x", "memory_limit_MB": 1e400}', JSON),
    (b'{"code": "x", "memory_limit_MB": NaN}', JSON),
    (b'{"code": "x", "stdin": 5}', JSON),
    (b'{"code": "x", "files": {"a": 1}}', JSON),
    (b'{"code": "x", "files": []}', JSON),
    (b'{"code": "x", "fetch_files": "a"}', JSON),
    (b'{"code": "x", "fetch_files": [1, null]}', JSON),
    (b'{"code": 1, "language": 2, "run_timeout": [], "files": 3}', JSON),
    (b'{"code": NaN}', JSON),  # the error's input cannot be rendered: FastAPI's 500
    (b'{"_sa": 1, "a": {"_sa_b": 2, "c_sa": 3}}', JSON),  # "_sa" keys: left out of the input
    (b'{"code": "x", "files": {"_sa": 1}}', JSON),
    (b'{"code": "\xff"}', JSON),  # not UTF-8: FastAPI's 400
    (b"[" * 100_000, JSON),  # nested past the recursion limit: 400
    (b'{"code": "x"}', []),  # no content type: validated as bytes
    (b'{"code": "x"}', [("content-type", "text/plain")]),
    (b'{"code": "x"}', [("content-type", "application/x-www-form-urlencoded")]),
    (b'{"code": "\xff"}', [("content-type", "text/plain")]),
    (b'{"code": 1}', [("content-type", "application/json; charset=utf-8")]),
    (b'{"code": 1}', [("content-type", "APPLICATION/JSON")]),
    (b'{"code": 1}', [("content-type", "application/vnd.api+json")]),
    (b'{"code": 1}', [("content-type", "application/jsonx")]),
    ('{"code": 1}'.encode("utf-16"), JSON),
]
GOOD_REQUESTS: list[tuple[bytes, Any]] = [
    (b'{"code": "x"}', JSON),
    (b'{"code": "x", "code": "y", "unknown": [1, {}]}', JSON),
    (b'{"code": "x", "run_timeout": "5", "compile_timeout": true, "memory_limit_MB": 2.0}', JSON),
    (b'{"code": "x", "run_timeout": NaN, "compile_timeout": -Infinity}', JSON),
    (b'{"code": "\\ud800", "stdin": "\\u0000", "language": "cpp"}', JSON),
    (b'{"code": "x", "files": {"a": null, "b": "QQ=="}, "fetch_files": ["a"]}', JSON),
    (b'{"code": "x", "memory_limit_MB": 10000000000000000000000}', JSON),
    ('{"code": "\u00e9"}'.encode("utf-16"), JSON),
    (b'{"code": "x"}', [("content-type", "application/json; charset=latin-1")]),
]


def test_bad_requests_get_fastapis_answers_byte_for_byte() -> None:
    from verl_hyperlight.server import app as serve

    ours, theirs = serve.create_app(serve.Settings()), fastapi_route()

    async def both() -> list[tuple[Answer, Answer]]:
        return [
            (await asgi(ours, "/run_code", payload, h), await asgi(theirs, "/run_code", payload, h))
            for payload, h in BAD_REQUESTS
        ]

    for (payload, _), (mine, fastapis) in zip(BAD_REQUESTS, asyncio.run(both()), strict=True):
        assert mine == fastapis, payload[:60]
        assert mine[0] in (400, 422, 500), payload[:60]


def test_good_requests_are_read_as_fastapi_reads_them() -> None:
    from verl_hyperlight.server.request import RunCodeRequest, parse

    theirs = fastapi_route()

    async def answers() -> list[Answer]:
        return [await asgi(theirs, "/run_code", payload, h) for payload, h in GOOD_REQUESTS]

    for (payload, h), fastapis in zip(GOOD_REQUESTS, asyncio.run(answers()), strict=True):
        request = parse(payload, dict((k.encode(), v.encode()) for k, v in h).get(b"content-type"))
        assert isinstance(request, RunCodeRequest), payload
        assert fastapis[0] == 200
        assert repr(request.model_dump()).encode("utf-8", "surrogatepass") == fastapis[2]


def test_a_route_that_fails_gets_a_500_and_its_failure_goes_on_to_uvicorn() -> None:
    """As FastAPI answers (Starlette's ServerErrorMiddleware), so that uvicorn logs it."""
    from verl_hyperlight.server import app as serve

    class Broken:
        def collect(self) -> Iterator[Any]:
            raise RuntimeError("a collector failed")

    app = serve.create_app(serve.Settings())
    app.server.metrics.registry.register(Broken())
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        raise AssertionError("a GET's body is never read")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with pytest.raises(RuntimeError, match="a collector failed"):
        asyncio.run(app(http_scope("GET", "/metrics"), receive, send))
    start, content = sent
    assert start["status"] == 500
    length, kind, (request_id, _) = start["headers"]
    assert (length, kind) == (
        (b"content-length", b"21"),
        (b"content-type", b"text/plain; charset=utf-8"),
    )
    assert request_id == b"x-request-id"
    assert content == {"type": "http.response.body", "body": b"Internal Server Error"}


def test_a_websocket_is_closed_at_once_as_fastapi_closes_one_it_has_no_route_for() -> None:
    from verl_hyperlight.server import app as serve

    app = serve.create_app(serve.Settings())
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {**http_scope("GET", "/v1/ping"), "type": "websocket", "scheme": "ws"}
    asyncio.run(app(scope, receive, send))
    assert sent == [{"type": "websocket.close", "code": 1000, "reason": ""}]


# ---------------------------------------------------------------------------------------------
# the server's own limits (issue 17)


def test_requests_past_the_servers_caps_are_sandbox_errors_naming_the_option(
    serve: Serve, host: Host
) -> None:
    served = serve("--max-memory-mb", "2048", "--max-run-timeout", "60")
    runs = len(host.case_runs())
    huge = served.post(body("print(1)", memory_limit_MB=10_000_000))
    day = served.post(body("print(1)", run_timeout=86_400))
    for reply, cap, flag in (
        (huge, "2048 MiB", "--max-memory-mb"),
        (day, "60 s", "--max-run-timeout"),
    ):
        # Valid for the service, so HTTP 200 with a SandboxError, as the service answers a run
        # it cannot make.
        assert reply.status_code == 200
        assert (reply.json()["status"], reply.json()["run_result"]) == ("SandboxError", None)
        assert f"cap of {cap} (verl-hyperlight serve {flag})" in reply.json()["message"]
    assert len(host.case_runs()) == runs  # neither reached hluk
    assert served.post(body("print(1)", run_timeout=60)).json()["status"] == "Success"


@pytest.mark.parametrize(
    ("args", "fields"),
    [(("--max-wait", "0"), {}), ((), {"compile_timeout": -10}), ((), {"compile_timeout": -5})],
)
def test_a_free_micro_vm_is_taken_at_once_whatever_the_wait(
    serve: Serve, args: tuple[str, ...], fields: dict[str, Any]
) -> None:
    served = serve(*args)
    reply = served.post(body("print('ran')", **fields))
    assert (reply.status_code, reply.json()["status"]) == (200, "Success")


def server_peak_rss_kib(served: Served) -> int:
    for line in Path(f"/proc/{served.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_a_flooded_queue_is_refused_before_the_bodies_are_read(serve: Serve) -> None:
    import selectors
    import socket

    served = serve(
        "--max-concurrent", "1", "--max-queue", "2", "--max-wait", "60", "--max-body-mb", "16"
    )
    # A queued case waits for a micro-VM up to its compile_timeout + 5 s (verl's budget), 15 s
    # by default: two cases of 3 s on a loaded machine under this flood can take longer.
    slow = body("import time\ntime.sleep(3)\nprint('held')", compile_timeout=55)
    held = [post_in_background(served, slow) for _ in range(3)]  # one runs, two wait
    assert wait_for(lambda: metric(served, "verl_hyperlight_cases_queued") == 2)
    before = server_peak_rss_kib(served)
    # 300 clients each announce an 8 MiB body and send its first 16 KiB: 2.4 GiB announced.
    declared = 8 * 1024 * 1024
    head = (
        (
            f"POST /run_code HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {declared}\r\n\r\n"
        ).encode()
        + b'{"code": "'
        + b"x" * (16 * 1024)
    )
    port = int(served.base.rsplit(":", 1)[1])
    answers: dict[socket.socket, bytes] = {}
    with selectors.DefaultSelector() as selector:
        for _ in range(300):
            client = socket.create_connection(("127.0.0.1", port))
            client.sendall(head)
            client.setblocking(False)
            selector.register(client, selectors.EVENT_READ)
            answers[client] = b""
        deadline = time.monotonic() + 60
        pending = set(answers)
        while pending and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=1):
                client = key.fileobj
                assert isinstance(client, socket.socket)
                chunk = client.recv(65536)
                answers[client] += chunk
                if not chunk or b"queue is full" in answers[client]:
                    pending.discard(client)
                    selector.unregister(client)
    for client in answers:
        client.close()
    replies = list(answers.values())
    assert not pending, f"{len(pending)} of 300 got no answer with their bodies unsent"
    assert all(reply.startswith(b"HTTP/1.1 504 ") for reply in replies), replies[0][:200]
    assert all(b"verl-hyperlight is busy: the queue is full" in reply for reply in replies)
    # The server's peak memory grew by far less than one announced body.
    assert server_peak_rss_kib(served) - before < declared // 1024
    for thread, answer in held:
        thread.join()
        said = answer[0].json()
        assert (said.get("run_result") or {}).get("stdout") == "held\n", said
    assert metric(served, 'verl_hyperlight_cases_total{status="rejected"}') == 300
    assert metric(served, "verl_hyperlight_cases_queued") == 0
    assert metric(served, "verl_hyperlight_cases_in_flight") == 0


def test_a_bodies_budget_that_holds_no_largest_body_is_refused_at_the_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from verl_hyperlight.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["serve", "--max-body-mb", "16", "--max-bodies-mb", "8"])
    assert stopped.value.code == 2
    assert "--max-bodies-mb is below --max-body-mb (16)" in capsys.readouterr().err


def flood(served: Served, requests: list[list[bytes]], limit: float = 120) -> list[bytes]:
    """Send `requests` at once, each on a connection of its own and as fast as the server reads
    it, in parts (so that one large part can be shared by all); each one's whole answer. A
    client stops sending once it is answered: a request turned away is answered before its
    body has been sent."""
    import selectors

    port = int(served.base.rsplit(":", 1)[1])
    answers = [bytearray() for _ in requests]
    outgoing: dict[socket.socket, tuple[int, list[memoryview]]] = {}
    with selectors.DefaultSelector() as selector:
        for index, parts in enumerate(requests):
            client = socket.create_connection(("127.0.0.1", port))
            client.setblocking(False)
            outgoing[client] = (index, [memoryview(part) for part in parts])
            selector.register(client, selectors.EVENT_READ | selectors.EVENT_WRITE)
        deadline = time.monotonic() + limit
        pending = set(outgoing)
        while pending and time.monotonic() < deadline:
            for key, events in selector.select(timeout=1):
                client = key.fileobj
                assert isinstance(client, socket.socket)
                index, parts = outgoing[client]
                if events & selectors.EVENT_READ:
                    chunk = client.recv(65536)
                    answers[index] += chunk
                    if not chunk or whole_answer(answers[index]):
                        selector.unregister(client)
                        pending.discard(client)
                        continue
                if events & selectors.EVENT_WRITE:
                    send_some(client, parts)
                    if not parts:
                        selector.modify(client, selectors.EVENT_READ)
        for client in outgoing:
            client.close()
    assert not pending, f"{len(pending)} of {len(requests)} requests got no answer"
    return [bytes(answer) for answer in answers]


def send_some(client: socket.socket, parts: list[memoryview]) -> None:
    """Send what the socket takes of the first of `parts`, dropping what was sent."""
    try:
        sent = client.send(parts[0][: 1 << 20])
    except BlockingIOError:
        return
    except OSError:  # the server closed it, having answered
        parts.clear()
        return
    parts[0] = parts[0][sent:]
    if not parts[0]:
        parts.pop(0)


def whole_answer(data: bytearray) -> bool:
    head, found, rest = bytes(data).partition(b"\r\n\r\n")
    if not found:
        return False
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    return length is not None and len(rest) >= int(length.group(1))


def test_a_flood_of_large_bodies_holds_them_within_the_budget_and_answers_each(
    serve: Serve,
) -> None:
    mib = 1024 * 1024
    budget, clients = 32 * mib, 40
    served = serve(
        "--max-concurrent", "1", "--max-queue", str(clients), "--max-wait", "120",
        "--max-body-mb", "16", "--max-bodies-mb", str(budget // mib),
    )  # fmt: skip
    assert served.post(body("print('warm')")).json()["status"] == "Success"
    before = server_peak_rss_kib(served)
    # 40 requests of almost 8 MiB each at once (320 MiB), their code a marker and a comment.
    filler = b"x" * (8 * mib - 200)
    requests = []
    for index in range(clients):
        start = b'{"language":"python","run_timeout":30,"code":"print(\'request %d\')\\n#' % index
        end = b'"}'
        head = (
            b"POST /run_code HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % (len(start) + len(filler) + len(end))
        )
        requests.append([head + start, filler, end])
    answers = flood(served, requests)
    ran, refused = [], []
    for index, answer in enumerate(answers):
        status = answer.split(b" ", 2)[1]
        if status == b"200":
            reply = json.loads(answer.partition(b"\r\n\r\n")[2])
            assert reply["run_result"]["stdout"] == f"request {index}\n", reply
            ran.append(index)
        else:
            assert status == b"504", answer[:300]
            assert b"retry-after: 1" in answer.lower()
            assert (
                b"verl-hyperlight is busy: the bodies of the requests it holds fill its 32 MiB "
                b"for them (verl-hyperlight serve --max-bodies-mb)"
            ) in answer
            refused.append(index)
    print(f"\n{len(ran)} of {clients} run, {len(refused)} turned away at once")
    assert ran and len(ran) + len(refused) == clients
    # Held: at most the budget, each body once; parsed and run: one more of each, for a while.
    growth = (server_peak_rss_kib(served) - before) * 1024
    print(f"the server's peak memory grew by {growth / mib:.0f} MiB (budget {budget // mib} MiB)")
    assert growth < 4 * budget
    assert metric(served, "verl_hyperlight_body_bytes_held") == 0
    assert metric(served, 'verl_hyperlight_cases_total{status="rejected"}') == len(refused)


def test_a_body_of_no_declared_length_is_held_as_it_arrives_and_turned_away_past_the_budget(
    serve: Serve,
) -> None:
    mib = 1024 * 1024
    served = serve("--max-body-mb", "16", "--max-bodies-mb", "16")
    port = int(served.base.rsplit(":", 1)[1])
    declared = json.dumps({"code": "print('declared')\n#" + "x" * (12 * mib)}).encode()
    held = socket.create_connection(("127.0.0.1", port))
    held.sendall(
        b"POST /run_code HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(declared) + declared[:1024]
    )
    assert wait_for(lambda: metric(served, "verl_hyperlight_body_bytes_held") == len(declared))
    # Chunked, 8 MiB: the budget's 4 MiB left take half of it.
    chunk = b"%x\r\n%s\r\n" % (mib, b"y" * mib)
    head = (
        b"POST /run_code HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    [answer] = flood(served, [[head, *[chunk] * 8, b"0\r\n\r\n"]])
    assert answer.startswith(b"HTTP/1.1 504 "), answer[:300]
    assert b"the bodies of the requests it holds fill its 16 MiB" in answer
    held.sendall(declared[1024:])
    with held, held.makefile("rb") as reply:
        assert reply.readline().startswith(b"HTTP/1.1 200 ")
        while reply.readline() != b"\r\n":
            pass
        assert b'"stdout":"declared\\n"' in reply.read1(1 << 16)
    assert wait_for(lambda: metric(served, "verl_hyperlight_body_bytes_held") == 0)


def test_readyz_is_answered_while_a_large_body_is_parsed(
    hluk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl_hyperlight.server import app as serve
    from verl_hyperlight.server import state

    parsing, answered = threading.Event(), threading.Event()
    held: list[bool] = []
    real = state.parse

    def slow_parse(payload: bytes, content_type: bytes | None) -> Any:
        parsing.set()
        # Holds until /readyz has been answered: never, if this held the event loop.
        held.append(answered.wait(10))
        return real(payload, content_type)

    monkeypatch.setattr(state, "parse", slow_parse)
    app = serve.create_app(serve.Settings(max_run_timeout=1))
    large = json.dumps(body("print(1)", stdin="y" * (4 * 1024 * 1024))).encode()

    async def scenario() -> tuple[Answer, Answer]:
        run = asyncio.ensure_future(asgi(app, "/run_code", large, JSON))
        assert await asyncio.get_running_loop().run_in_executor(None, parsing.wait, 10)
        ready = await asgi(app, "/readyz", method="GET")
        answered.set()
        return ready, await run

    ready, run = asyncio.run(scenario())
    assert held == [True]
    assert ready[0] in (200, 503)
    # run_timeout 10 is past this server's cap: answered without a case.
    assert b"--max-run-timeout" in run[2]


def test_a_cancelled_handler_cancels_its_case_and_stopping_waits_for_it(
    hluk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl_hyperlight.server import app as serve

    monkeypatch.setenv("VERL_HYPERLIGHT_CASE_DIR", str(tmp_path))
    app = serve.create_app(serve.Settings(max_concurrent=1))
    marker = uuid.uuid4().hex
    request = json.dumps(body(sleeper(marker, 60), run_timeout=60)).encode()

    async def scenario() -> None:
        stop = await started(app)
        handler = asyncio.ensure_future(asgi(app, "/run_code", request, JSON))
        deadline = time.monotonic() + 60
        while not processes_with(marker):
            assert time.monotonic() < deadline and not handler.done()
            await asyncio.sleep(0.05)
        handler.cancel()  # as uvicorn cancels a handler past its graceful-shutdown timeout
        with pytest.raises(asyncio.CancelledError):
            await handler
        await stop()

    asyncio.run(scenario())
    # Stopping waited for the case's end: its micro-VM is gone, its case directory removed.
    assert not processes_with(marker)
    assert not list(tmp_path.glob("verl-hyperlight-*"))


def test_sigint_during_a_warm_up_exits_without_waiting_for_it(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HLUK_STANDIN_HANG", "1")  # the warm-up's hluk hangs before its boot
    served = serve(ready=False, env={"HLUK_CACHE_DIR": str(tmp_path / "cold-cache")})
    assert wait_for(lambda: list(descendants_of(served.process.pid)), limit=30)
    probes = list(descendants_of(served.process.pid))
    try:
        assert served.stop(signal.SIGINT, timeout=30) in (0, -signal.SIGINT)
    finally:
        for pid in probes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert "Application shutdown complete" in served.logged()


# ---------------------------------------------------------------------------------------------
# waits that honour a case's cancel (issue 24)


@pytest.fixture
def hung_warm_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Callable[[Served], list[int]]]:
    """The server's warm-up probe hangs before the boot, silent, for up to the warm-up's
    900 s (the start-up deadline made as long, so no stall cuts it); its later runs work.
    Yields what finds the hung probe's processes, killed at the end should the server leave
    them."""
    hang = tmp_path / "hang"
    hang.write_text("1")
    monkeypatch.setenv("HLUK_STANDIN_HANG_FILE", str(hang))
    monkeypatch.setenv("VERL_HYPERLIGHT_STARTUP_TIMEOUT", "900")
    hung: list[int] = []

    def probes_of(served: Served) -> list[int]:
        assert wait_for(lambda: hang.read_text() == "0", limit=30), "the probe never hung"
        hung[:] = [pid for pid in list(descendants_of(served.process.pid)) if pid_runs_a_probe(pid)]
        return hung

    yield probes_of
    for pid in hung:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def pid_runs_a_probe(pid: int) -> bool:
    try:
        return b".probe(" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_a_client_gone_during_a_900_s_probe_frees_its_thread_and_place_at_once(
    serve: Serve, tmp_path: Path, hung_warm_up: Callable[[Served], list[int]]
) -> None:
    served = serve(
        "--max-concurrent", "1", "--max-queue", "1", "--max-wait", "60",
        ready=False, env={"HLUK_CACHE_DIR": str(tmp_path / "cold-cache")},
    )  # fmt: skip
    [probe] = hung_warm_up(served)
    for _ in range(3):  # more clients than places: each leaves its own behind, or none
        with pytest.raises(httpx.ReadTimeout), httpx.Client(timeout=2) as client:
            client.post(served.run_code_url, json=body("print(1)"))
        # Its case stopped waiting for the probe: its thread ended and its place is free.
        assert wait_for(lambda: metric(served, "verl_hyperlight_cases_in_flight") == 0), (
            "the case of a client that went away still waits for the probe"
        )
    assert metric(served, "verl_hyperlight_cases_queued") == 0
    assert metric(served, 'verl_hyperlight_cases_total{status="cancelled"}') == 3
    assert pid_runs_a_probe(probe)  # the warm-up goes on, for readiness
    assert httpx.get(f"{served.base}/readyz").status_code == 503


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_probe_that_cases_wait_for_stops_them_after_the_grace(
    serve: Serve, tmp_path: Path, hung_warm_up: Callable[[Served], list[int]], sig: int
) -> None:
    served = serve(
        "--grace", "1", "--max-concurrent", "3",
        ready=False, env={"HLUK_CACHE_DIR": str(tmp_path / "cold")},
    )  # fmt: skip
    hung_warm_up(served)
    waiting = [post_in_background(served, body(f"print({i})")) for i in range(3)]
    assert wait_for(lambda: metric(served, "verl_hyperlight_cases_in_flight") == 3)
    assert served.stop(sig, timeout=30) in (0, -sig)
    for thread, answer in waiting:
        thread.join()
        if isinstance(answer[0], httpx.Response):  # else closed: never left waiting
            assert answer[0].status_code == 200, answer[0].text
            assert answer[0].json()["message"] == "the case was cancelled before it ended"
    assert "cases still ending" not in served.logged()
    assert "Application shutdown complete" in served.logged()


def test_a_body_that_stops_arriving_is_answered_408_within_its_deadline_and_its_place_freed(
    serve: Serve,
) -> None:
    """A client that sends its headers and part of its body, then goes silent (a node that died
    mid-upload), holds its place only until the body-read deadline."""
    served = serve("--max-concurrent", "1", "--max-queue", "1", env={BODY_READ_TIMEOUT.name: "1.5"})
    port = int(served.base.rsplit(":", 1)[1])
    declared = json.dumps(body("print('late')")).encode()
    silent = socket.create_connection(("127.0.0.1", port), timeout=30)
    silent.sendall(
        b"POST /run_code HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(declared) + declared[:10]
    )
    with silent, silent.makefile("rb") as reply:
        status = reply.readline()
        headers = []
        while (line := reply.readline()) != b"\r\n":
            headers.append(line.lower())
        answer = reply.read()  # to its end: the server closes the connection
    assert status.startswith(b"HTTP/1.1 408 "), status
    assert b"connection: close\r\n" in headers
    assert BODY_READ_TIMEOUT.name.encode() in answer and b"within 1.5 s" in answer
    assert metric(served, 'verl_hyperlight_cases_total{status="body-timeout"}') == 1
    assert metric(served, "verl_hyperlight_body_bytes_held") == 0
    # Its place is back: the one place a running case and the queue leave is taken again.
    assert served.post(body("print('next')")).json()["run_result"]["stdout"] == "next\n"


def test_a_hundred_silent_clients_hold_no_place_and_stopping_answers_them_at_once(
    serve: Serve,
) -> None:
    """Clients that send their headers and part of a body, then go silent (a load balancer
    dropping flows, a slowloris): they hold their bodies' bytes alone, so the one place of a
    server of --max-concurrent 1 --max-queue 1 serves everyone else; SIGTERM answers them 503
    at once, within its grace, not after their body-read deadline."""
    served = serve(
        "--max-concurrent", "1", "--max-queue", "1", "--grace", "30",
        env={BODY_READ_TIMEOUT.name: "300"},
    )  # fmt: skip
    port = int(served.base.rsplit(":", 1)[1])
    declared = json.dumps(body("print('never')")).encode()
    head = (
        b"POST /run_code HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(declared)
    )
    silent = []
    for _ in range(100):
        client = socket.create_connection(("127.0.0.1", port), timeout=60)
        client.sendall(head + declared[:10])
        silent.append(client)
    try:
        assert wait_for(lambda: metric(served, "verl_hyperlight_requests_reading") == 100, 60)
        assert metric(served, "verl_hyperlight_cases_queued") == 0
        for i in range(4):
            answered = served.post(body(f"print({i})"))
            assert (
                answered.status_code == 200 and answered.json()["run_result"]["stdout"] == f"{i}\n"
            )
        assert metric(served, 'verl_hyperlight_cases_total{status="rejected"}') == 0
        stopped = time.monotonic()
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=30) in STOPPED
        took = time.monotonic() - stopped
        answers = []
        for client in silent:
            with client.makefile("rb") as reply:
                answers.append(reply.readline())
    finally:
        for client in silent:
            client.close()
    assert answers == [b"HTTP/1.1 503 Service Unavailable\r\n"] * 100
    print(f"SIGTERM with 100 silent clients: the server exited in {took:.1f} s (grace 30 s)")


def test_the_loop_answers_while_a_large_answer_is_rendered(
    hluk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tens of MiB of output are rendered as JSON in a thread: /v1/ping is answered meanwhile."""
    from verl_hyperlight.server import app as serve
    from verl_hyperlight.server import state

    rendering, answered = threading.Event(), threading.Event()
    held: list[bool] = []
    real = state.render_json

    def slow_render(content: Any) -> bytes:
        rendering.set()
        # Holds until /v1/ping has been answered: never, if this held the event loop.
        held.append(answered.wait(30))
        return real(content)

    monkeypatch.setattr(state, "render_json", slow_render)
    app = serve.create_app(serve.Settings())
    large = json.dumps(body("import sys\nsys.stdout.write('x' * (8 << 20))")).encode()

    async def scenario() -> tuple[Answer, Answer]:
        run = asyncio.ensure_future(asgi(app, "/run_code", large, JSON))
        assert await asyncio.get_running_loop().run_in_executor(None, rendering.wait, 120)
        ping = await asgi(app, "/v1/ping", method="GET")
        answered.set()
        return ping, await run

    ping, run = asyncio.run(scenario())
    assert held == [True] and ping[0] == 200
    assert run[0] == 200 and json.loads(run[2])["run_result"]["stdout"] == "x" * (8 << 20)
