"""`verl-hyperlight bench`: its table and recommendation on the stand-in, the recommendation's
rule, and progress shown on a terminal only (warm-up's too)."""

from __future__ import annotations

import fcntl
import http.server
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hostside import KVM_FAILURE, Host, fail_with
from serving import Served

from verl_hyperlight import run_code
from verl_hyperlight.cli import main
from verl_hyperlight.commands import against
from verl_hyperlight.commands.bench import Level, recommend

pytestmark = pytest.mark.once


def level(concurrency: int, per_second: float, p99: float, failed: int = 0) -> Level:
    return Level(concurrency, 100, per_second, p99 / 2, p99, 0.5, failed)


def test_the_recommendation_is_the_level_past_which_throughput_stops_rising() -> None:
    levels = [level(1, 10, 100), level(2, 19, 110), level(4, 30, 150), level(8, 31, 190)]
    advice = recommend(levels, num_workers=2)
    assert (advice.node_concurrency, advice.max_concurrent) == (4, 2)
    assert "stopped rising past 4" in advice.why


def test_the_recommendation_stops_where_p99_degrades() -> None:
    levels = [level(1, 10, 100), level(2, 19, 150), level(4, 30, 250)]
    advice = recommend(levels, num_workers=1)
    assert advice.node_concurrency == 2 and "p99 degraded past 2" in advice.why


def test_the_recommendation_stops_where_cases_fail_and_gives_each_worker_one_at_least() -> None:
    levels = [level(1, 10, 100), level(2, 19, 110), level(4, 0, 0, failed=3)]
    advice = recommend(levels, num_workers=8)
    assert (advice.node_concurrency, advice.max_concurrent) == (2, 1)
    assert "failed" in advice.why


def test_bench_prints_each_level_and_a_recommendation(
    host: Host, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--concurrency", "1,2", "--seconds", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [found["concurrency"] for found in report["levels"]] == [1, 2]
    for found in report["levels"]:
        assert found["cases"] > 0 and found["failed"] == 0
        assert found["p50_ms"] <= found["p99_ms"]
        assert 0 < found["startup_share"] < 1
    assert report["recommendation"]["node_concurrency"] in (1, 2)

    assert main(["bench", "--concurrency", "1", "--seconds", "0.5", "--num-workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "concurrency  cases/s   p50 ms   p99 ms  start-up  failed" in text
    assert "recommended: at most 1 at once on this node" in text
    assert "max_concurrent=1" in text


def test_bench_on_a_broken_backend_says_why_and_exits_1(
    host: Host,
    monkeypatch: pytest.MonkeyPatch,
    fail_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fail_with(monkeypatch, fail_file, KVM_FAILURE, 100)
    assert main(["bench", "--concurrency", "1", "--seconds", "1"]) == 1
    assert "kvm group" in capsys.readouterr().err


CLI = "import sys\nfrom verl_hyperlight.cli import main\nsys.exit(main(sys.argv[1:]))"


def stderr_of(args: list[str], terminal: bool) -> str:
    """What the command wrote on its stderr, a terminal or a pipe."""
    if not terminal:
        done = subprocess.run(
            [sys.executable, "-c", CLI, *args], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stderr
    controller, terminal_end = pty.openpty()
    # A terminal has a size (a bare pty has none, and a progress line then has no room).
    fcntl.ioctl(terminal_end, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-c", CLI, *args], stdout=subprocess.DEVNULL, stderr=terminal_end
    )
    os.close(terminal_end)
    seen = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        seen += chunk
    os.close(controller)
    assert process.wait(120) == 0
    return seen.decode(errors="replace")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["bench", "--concurrency", "1", "--seconds", "1.5"], "concurrency 1"),
        (["warm-up"], "seeing the python image warm"),
    ],
    ids=["bench", "warm-up"],
)
def test_progress_is_shown_on_a_terminal_and_nowhere_else(
    host: Host, args: list[str], says: str
) -> None:
    assert says in stderr_of(args, terminal=True)
    assert stderr_of(args, terminal=False) == ""


def test_bench_and_doctor_share_one_sizing_rule(
    host: Host, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On 2 CPUs with 8 reward workers bench advised max_concurrent=1, which doctor then failed
    (8 micro-VMs on 2 CPUs): now both say fewer workers."""
    from verl_hyperlight.commands import doctor

    advice = recommend([level(1, 10, 100), level(2, 19, 110), level(4, 19, 110)], num_workers=8)
    assert (advice.max_concurrent, advice.num_workers) == (1, 2)
    monkeypatch.setattr(doctor.os, "sched_getaffinity", lambda _: {0, 1})
    assert main(["doctor", "--max-concurrent", "1", "--num-workers", "8", "--json"]) == 1
    checks = {check["name"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["sizing"]["fix"] == "max_concurrent=1, reward.num_workers=2"
    assert main(["doctor", "--max-concurrent", "1", "--num-workers", "2", "--json"]) in (0, 1)
    checks = {check["name"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["sizing"]["status"] == "ok"


# --- bench --against: the same cases through this node and through another service --------


def test_bench_against_a_serve_of_this_node_agrees_on_every_answer(
    host: Host, serve: Callable[..., Served], capsys: pytest.CaptureFixture[str]
) -> None:
    served = serve()
    args = ["--concurrency", "2", "--seconds", "0.1", "--json"]
    assert main(["bench", "--against", served.run_code_url, *args]) == 0
    report = json.loads(capsys.readouterr().out)
    chosen = against.cases()
    assert report["cases"] == len(chosen) > 20
    assert [found["concurrency"] for found in report["levels"]] == [2]
    for found in report["levels"]:
        for side in ("ours", "theirs"):
            # Every case at least once on each side (a chunk holds each), none failed.
            assert found[side]["cases"] >= len(chosen) and found[side]["failed"] == 0
            assert 0 < found[side]["p50_ms"] <= found[side]["p90_ms"]
    assert report["theirs"] == served.run_code_url and report["disagreements"] == []


class FakeSandboxFusion(http.server.BaseHTTPRequestHandler):
    """A Sandbox Fusion of the test's own: it answers /run_code with this process's run_code
    (as the service answers), 5 ms later, and gets one case wrong: `print(1)` prints 2."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(0.005)
        response, _ = run_code(
            "hyperlight://",
            body["code"],
            body["stdin"],
            body["compile_timeout"],
            body["run_timeout"],
            None if body["memory_limit_MB"] <= 0 else body["memory_limit_MB"],
        )
        assert response is not None
        if body["code"] == "print(1)":
            response["run_result"]["stdout"] = "2\n"
        answer = json.dumps(response).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_bench_against_a_sandbox_fusion_prints_both_sides_their_ratio_and_a_disagreement(
    host: Host, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bench's own cases and two of the corpus (all of it: the test above).
    chosen = against.cases()[:5]
    monkeypatch.setattr(against, "cases", lambda: chosen)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeSandboxFusion)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/run_code"
    try:
        status = main(["bench", "--against", url, "--concurrency", "1", "--seconds", "0.5"])
    finally:
        server.shutdown()
        server.server_close()
    out = capsys.readouterr().out
    assert status == 1  # an answer disagreed
    lines = out.splitlines()
    assert lines[0].startswith("the same 5 cases through this node")
    [ours] = [line for line in lines if "this node (hyperlight://)" in line]
    [theirs] = [line for line in lines if line.split()[1:2] == [url]]
    [ratio] = [line for line in lines if "theirs / ours" in line]
    assert ours.split()[0] == theirs.split()[0] == ratio.split()[0] == "1"
    assert all(word.startswith("x") for word in ratio.split()[-3:])
    assert "answers: 1 of" in out and "cases disagree" in out
    assert "trivial: ours ('Success', 'Finished', 0, '1\\n')" in out
    assert "theirs ('Success', 'Finished', 0, '2\\n')" in out


def test_bench_against_refuses_a_url_that_is_not_http(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--against", "hyperlight://"]) == 2
    assert "--against hyperlight://: an http(s) URL" in capsys.readouterr().err
