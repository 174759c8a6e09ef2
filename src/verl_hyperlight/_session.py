"""A notebook: one micro-VM kept up across calls, its Python state kept between them.

The code tool's `session: trajectory` runs a trajectory's calls here. It starts as a case does
(``hluk_argv`` of the URL's guest, through the guest's gate, retried once when the guest did
not start), restored from the same warm snapshot, with ``runner.session`` as its workload; each
call is then written to the guest's console input and answered from its report as a case is
(``from_outcome``), so a call's response is Sandbox Fusion's shape, as ``run_code``'s. A call
that does not end with its report whole and the guest still up (past its time limit, the
guest ended by the code, a backend failure) ends the notebook: the next call needs a new one.
"""

from __future__ import annotations

import secrets
import threading

from . import _api, _diagnosis, _hluk, _warmup
from ._errors import InvalidRequest, Refused
from ._guest import Guest, guest_for, hluk_argv, session_code
from ._outcome import Ending, RawOutcome, Verdict
from ._response import Response
from .guest import protocol


class Notebook:
    """One notebook's micro-VM. Not thread-safe: its owner runs one call at a time."""

    def __init__(self, url: str, memory_limit_mb: int | None) -> None:
        # A bad URL or memory limit is the config's error, raised here as run_code's is.
        self.guest: Guest = guest_for(url, memory_limit_mb)
        self.process: _hluk.SessionProcess | None = None
        self.calls = 0  # calls run by its current micro-VM
        self.generation = 0  # micro-VMs started

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.alive

    def run(
        self, code: str, run_timeout: float, cancel: threading.Event | None
    ) -> tuple[Response | None, str | None]:
        """Run `code` in the notebook (started first if it is not up), answered as run_code
        answers: ``(response, None)``, a backend failure a SandboxError response, or
        ``(None, error)`` for code that cannot be run as given. Never raises."""
        return _api.answered(lambda: self._run(code, run_timeout, cancel))

    def _run(self, code: str, run_timeout: float, cancel: threading.Event | None) -> Response:
        data = _api._encode("code", code, _api.MAX_CODE_BYTES)
        path = _hluk.hluk_path()
        if not self.alive:
            self._start(path, cancel)
        assert self.process is not None
        nonce = secrets.token_hex(16)
        request = protocol.request_lines(nonce, data.decode("utf-8"))
        if len(request) > self.process.capacity:
            raise InvalidRequest(
                f"code is {len(data)} bytes: a notebook call takes at most about "
                f"{self.process.capacity * 3 // 4 // 1024} KiB"
            )
        outcome = self.process.call(nonce, request, run_timeout, cancel)
        if outcome.verdict is Verdict.BACKEND_BEFORE_START and self.calls:
            # Its guest had ended since its last call (a thread of an earlier call ended
            # it): nothing of this call ran, so it runs in a new notebook.
            self._start(path, cancel)
            assert self.process is not None
            outcome = self.process.call(nonce, request, run_timeout, cancel)
        self.calls += 1
        return _api.respond(outcome, path, run_timeout)

    def _start(self, path: str, cancel: threading.Event | None) -> None:
        startup_timeout = _api._startup_timeout()
        started: list[_hluk.SessionProcess] = []

        def attempt() -> RawOutcome:
            nonce = secrets.token_hex(16)
            process = _hluk.SessionProcess(hluk_argv(path, self.guest, session_code(nonce)))
            outcome = process.ready(nonce, startup_timeout, cancel)
            if outcome.ending is Ending.FINISHED and process.alive:
                started.append(process)
            return outcome

        outcome = _warmup.gate(path, self.guest).run_case(attempt, startup_timeout)
        if started and outcome.ending is Ending.FINISHED:
            self.process, self.calls = started[-1], 0
            self.generation += 1
            return
        if outcome.verdict is Verdict.CANCELLED:
            raise Refused("the call was cancelled before it ended")
        raise _diagnosis.failure(outcome, path)

    def close(self) -> None:
        """End its micro-VM (if up); the next call starts a new one."""
        if self.process is not None:
            self.process.stop()
            self.process = None
