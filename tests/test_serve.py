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
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hostside import KVM_FAILURE, Host, fail_with, processes_with, wait_for
from serving import Served

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
    assert (ready.status_code, ready.json()) == (200, {"ready": True, "reason": "ready"})


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


def test_another_language_is_a_sandbox_error_saying_python_only(serve: Serve) -> None:
    served = serve()
    reply = served.post(body("int main() {}", language="cpp"))
    assert reply.status_code == 200
    assert "runs Python only" in reply.json()["message"]


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
# admission and load

# An HLUK_PATH that counts the case runs going on at once (and the most at once) in a file, and
# runs the stand-in.
COUNTING_HLUK = """#!{python}
import fcntl, json, subprocess, sys
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
try:
    status = subprocess.call([{python!r}, "-I", "-S", {standin!r}, *sys.argv[1:]])
finally:
    if case:
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
    assert json.loads(count.read_text()) == [0, 2]


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
        "import sys\nsys.modules['fastapi'] = None\n"
        "from verl_hyperlight.cli import main\nsys.exit(main(['serve']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert "pip install 'verl-hyperlight[serve]'" in done.stderr


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

    scope = {
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
    try:
        await app(scope, receive, send)
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

    from verl_hyperlight._request import RunCodeRequest

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
    from verl_hyperlight import serve

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
    from verl_hyperlight._request import RunCodeRequest, parse

    theirs = fastapi_route()

    async def answers() -> list[Answer]:
        return [await asgi(theirs, "/run_code", payload, h) for payload, h in GOOD_REQUESTS]

    for (payload, h), fastapis in zip(GOOD_REQUESTS, asyncio.run(answers()), strict=True):
        request = parse(payload, dict((k.encode(), v.encode()) for k, v in h).get(b"content-type"))
        assert isinstance(request, RunCodeRequest), payload
        assert fastapis[0] == 200
        assert repr(request.model_dump()).encode("utf-8", "surrogatepass") == fastapis[2]


# ---------------------------------------------------------------------------------------------
# the server's own limits (issue 17)


def test_requests_past_the_servers_caps_are_sandbox_errors_naming_the_option(
    serve: Serve, host: Host
) -> None:
    served = serve("--max-memory-mb", "2048", "--max-run-timeout", "60")
    runs = len(host.case_runs())
    huge = served.post(body("print(1)", memory_limit_MB=10_000_000))
    day = served.post(body("print(1)", run_timeout=86_400))
    for reply, cap, option in (
        (huge, "2048 MiB", "--max-memory-mb"),
        (day, "60 s", "--max-run-timeout"),
    ):
        # Valid for the service, so HTTP 200 with a SandboxError, as the service answers a run
        # it cannot make.
        assert reply.status_code == 200
        assert (reply.json()["status"], reply.json()["run_result"]) == ("SandboxError", None)
        assert f"cap of {cap} (verl-hyperlight serve {option})" in reply.json()["message"]
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
    slow = body("import time\ntime.sleep(3)\nprint('held')")
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
        assert answer[0].json()["run_result"]["stdout"] == "held\n"
    assert metric(served, 'verl_hyperlight_cases_total{status="rejected"}') == 300
    assert metric(served, "verl_hyperlight_cases_queued") == 0
    assert metric(served, "verl_hyperlight_cases_in_flight") == 0


def test_readyz_is_answered_while_a_large_body_is_parsed(
    hluk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl_hyperlight import serve

    parsing, answered = threading.Event(), threading.Event()
    held: list[bool] = []
    real = serve.parse

    def slow_parse(payload: bytes, content_type: bytes | None) -> Any:
        parsing.set()
        # Holds until /readyz has been answered: never, if this held the event loop.
        held.append(answered.wait(10))
        return real(payload, content_type)

    monkeypatch.setattr(serve, "parse", slow_parse)
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
    from verl_hyperlight import serve

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


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_sigint_during_a_warm_up_exits_without_waiting_for_it(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HLUK_STANDIN_HANG", "1")  # the warm-up's hluk hangs before its boot
    served = serve(ready=False, env={"HLUK_CACHE_DIR": str(tmp_path / "cold-cache")})
    assert wait_for(lambda: descendants(served.process.pid), limit=30)
    probes = descendants(served.process.pid)
    try:
        assert served.stop(signal.SIGINT, timeout=30) in (0, -signal.SIGINT)
    finally:
        for pid in probes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert "Application shutdown complete" in served.logged()
