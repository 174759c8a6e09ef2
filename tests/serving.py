"""A `verl-hyperlight serve` of the test's own: a subprocess on a free loopback port, pointed at
the stand-in hluk the `host` fixture configured, with a temporary directory of its own (where
its case directories go) and its log in a file; stopped (SIGTERM, then SIGKILL) at the end.

conftest.py imports the ``serve`` fixture from here.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from verl_hyperlight.settings import CASE_DIR

SERVE = "import sys\nfrom verl_hyperlight.cli import main\nsys.exit(main(['serve', *sys.argv[1:]]))"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Served:
    """One running server."""

    process: subprocess.Popen[bytes]
    base: str
    tmpdir: Path
    log: Path

    @property
    def run_code_url(self) -> str:
        return f"{self.base}/run_code"

    def client(self, **options: object) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=120, **options)  # type: ignore[arg-type]

    def post(self, body: object, **options: object) -> httpx.Response:
        with self.client() as client:
            return client.post("/run_code", json=body, **options)  # type: ignore[arg-type]

    def check_cases(
        self,
        language: str,
        cases: list[tuple[str, Callable[[dict[str, object]], None], str | None, float, dict]],
    ) -> None:
        """Post each case (code, check, stdin, run_timeout, files) in `language` as Sandbox
        Fusion's own tests post it, and hand its response to its check. But for
        compile_timeout: theirs is 10 s, which javac's start alone has taken on a loaded CI
        node; these checks are of answers, not of the compile's deadline."""
        with self.client() as client:
            for code, check, stdin, run_timeout, files in cases:
                body = {
                    "compile_timeout": 30,
                    "run_timeout": run_timeout,
                    "memory_limit_MB": -1,
                    "code": code,
                    "stdin": stdin,
                    "language": language,
                    "files": files,
                    "fetch_files": [],
                }
                reply = client.post("/run_code", json=body)
                assert reply.status_code == 200, reply.text
                check(reply.json())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Send `sig` and wait for the exit; its status."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def case_dirs(self) -> list[Path]:
        return sorted(self.tmpdir.glob("verl-hyperlight-*"))

    def logged(self) -> str:
        return self.log.read_text()


def start(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Served:
    """Start a server with `args` and wait until it answers /v1/ping."""
    port = free_port()
    tmpdir = tmp_path / f"serve-{port}"
    tmpdir.mkdir()
    log = tmp_path / f"serve-{port}.log"
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE, "--port", str(port), *args],
        stdin=subprocess.DEVNULL,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        # Case directories where the test sees them (by default they would go to /dev/shm).
        env={**os.environ, "TMPDIR": str(tmpdir), CASE_DIR.name: str(tmpdir), **(env or {})},
    )
    served = Served(process, f"http://127.0.0.1:{port}", tmpdir, log)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{served.base}/v1/ping", timeout=5).status_code == 200:
                return served
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the server did not start:\n{log.read_text()}")
        time.sleep(0.05)


def wait_ready(served: Served, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while httpx.get(f"{served.base}/readyz", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, served.logged()
        time.sleep(0.1)


@pytest.fixture
def serve(host: object, tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Start servers (ready) with the given arguments, on the `host` fixture's stand-in; all
    are stopped at the end."""
    started: list[Served] = []

    def starter(*args: str, ready: bool = True, env: dict[str, str] | None = None) -> Served:
        served = start(tmp_path, *args, env=env)
        started.append(served)
        if ready:
            wait_ready(served)
        return served

    yield starter
    for served in started:
        if served.process.poll() is None:
            served.stop(signal.SIGKILL)
