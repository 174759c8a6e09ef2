"""A notebook: one micro-VM kept up across calls, its Python state kept between them.

The code tool's `session: trajectory` runs a trajectory's calls here. It starts as a case does
(``hluk_argv`` of the URL's guest, through the guest's gate, retried once when the guest did
not start), restored from the same warm snapshot, with ``runner.notebook`` as its workload; each
call is then written to the guest's console input and answered from its report as a case is
(``from_outcome``), so a call's response is Sandbox Fusion's shape, as ``run_code``'s. A call
that does not end with its report whole and the guest still up (past its time limit, the
guest ended by the code, a backend failure) ends the notebook: the next call needs a new one.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

from .. import cancel as cancels
from .. import deadlines, diagnosis
from ..case import api, cluster, gate
from ..case.guests import Guest, guest_for, notebook_code
from ..case.response import Response, response_for
from ..case.url import parse_url
from ..errors import InvalidRequest
from ..guest import protocol
from ..hluk.binary import hluk_path
from ..hluk.notebook import NotebookProcess
from ..outcome import Ending, RawOutcome, Verdict

# Why a call its caller cancelled while its notebook started is answered SandboxError.
START_CANCELLED = "the call was cancelled before it ended"
# A notebook's micro-VM runs at most this many calls: past it (or past what its hluk may hold
# of its console, NotebookProcess.console_limit) the next call starts a new one, and its
# answer says the notebook was restarted, as after any restart.
CALLS_LIMIT = 10_000


class Notebook:
    """One notebook's micro-VM. Not thread-safe: its owner runs one call at a time."""

    def __init__(self, url: str, memory_limit_mb: int | None) -> None:
        # A bad URL or memory limit is the config's error, raised here as run_code's is.
        self.guest: Guest = guest_for(url, memory_limit_mb)
        self.process: NotebookProcess | None = None
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
        return api.response_or_error(lambda: self.answer(code, run_timeout, cancel))

    def answer(self, code: str, run_timeout: float, cancel: threading.Event | None) -> Response:
        """`run`'s response, raising what `run` answers as values (as ``api.answer``)."""
        data = api.encode_text("code", code, api.MAX_CODE_BYTES)
        path = hluk_path()
        if self.process is not None and (self.process.spent or self.calls >= CALLS_LIMIT):
            self.close()  # bounded: its hluk's memory grows with all it has printed
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
        limits = deadlines.for_case(run_timeout)
        outcome = self.process.call(nonce, request, limits, cancel)
        if outcome.verdict is Verdict.BACKEND_BEFORE_START and self.calls:
            # Its guest had ended since its last call (a thread of an earlier call ended
            # it): nothing of this call ran, so it runs in a new notebook.
            self._start(path, cancel)
            assert self.process is not None
            outcome = self.process.call(nonce, request, limits, cancel)
        self.calls += 1
        return response_for(outcome, path, run_timeout)

    def _start(self, path: str, cancel: threading.Event | None) -> None:
        limits = deadlines.for_case()
        started: list[NotebookProcess] = []

        def start(argv: list[str], nonce: str) -> RawOutcome:
            process = NotebookProcess(argv)
            outcome = process.await_up(nonce, limits, cancel)
            if outcome.ending is Ending.FINISHED and process.alive:
                started.append(process)
            return outcome

        outcome = gate.run_through_gate(
            path,
            self.guest,
            lambda _: gate.fresh_run(path, self.guest, notebook_code, start),
            limits,
            START_CANCELLED,
            cancel=cancel,
        )
        if started and outcome.ending is Ending.FINISHED:
            self.process, self.calls = started[-1], 0
            self.generation += 1
            return
        raise diagnosis.failure(outcome, path)

    def close(self) -> None:
        """End its micro-VM (if up); the next call starts a new one."""
        if self.process is not None:
            self.process.stop()
            self.process = None


class NotebookHost:
    """The Ray actor that holds a `?ray` notebook on the node Ray put it on, for the notebook's
    whole life: a Notebook there, of the URL less ``ray``, which answers each call as a local
    notebook does. A call reports the notebook's state with its answer, so the caller's view
    costs no round trip of its own."""

    def __init__(self, url: str, memory_limit_mb: int | None) -> None:
        self.notebook = Notebook(url, memory_limit_mb)
        self.cancel = cancels.Cancel()  # the running call's, set by cancel_call

    def run(self, code: str, run_timeout: float) -> tuple[Response | None, str | None, bool, int]:
        self.cancel.clear()
        response, error = self.notebook.run(code, run_timeout, self.cancel)
        return response, error, self.notebook.alive, self.notebook.generation

    def cancel_call(self) -> None:
        """Cancel the running call as a local notebook's is cancelled: its micro-VM killed
        by the call itself (the actor runs two methods at once for this)."""
        self.cancel.set()

    def placed(self) -> None:
        """Nothing: answered once the actor holds its unit on a node (see RemoteNotebook)."""

    def close(self) -> None:
        self.notebook.close()


class RemoteNotebook:
    """A notebook of a ``?ray`` URL: its micro-VM on a node of the Ray cluster that offers the
    URL's resource, held there by a NotebookHost actor that needs one unit of it (a notebook
    is one micro-VM, as a case is), and answered as a local Notebook answers. A new actor must
    hold its unit within the start-up deadline while nodes offer the resource (else every unit
    is held by others: the call is answered so, the actor withdrawn, and the trajectory's next
    call tries again), so no call holds its thread waiting for a unit. A cancelled call kills
    the actor, and with it the micro-VM: the next call starts another (its state lost, as a
    local notebook's is). Not thread-safe, as Notebook is not."""

    def __init__(self, url: str, memory_limit_mb: int | None) -> None:
        parsed = parse_url(url)
        assert parsed.ray is not None
        guest_for(url, memory_limit_mb)  # the config's error raised here, as Notebook's is
        self.resource = parsed.ray
        self.url = parsed.local
        self.memory_limit_mb = memory_limit_mb
        self.actor: cluster.Actor | None = None
        self.alive = False
        self.generation = 0  # micro-VMs started, as this side has seen them
        self._generations = 0  # of the actor now up: its own count

    def run(
        self, code: str, run_timeout: float, cancel: threading.Event | None
    ) -> tuple[Response | None, str | None]:
        """As Notebook.run: never raises."""
        return api.response_or_error(lambda: self.answer(code, run_timeout, cancel))

    def answer(self, code: str, run_timeout: float, cancel: threading.Event | None) -> Response:
        """As Notebook.answer."""
        api.encode_text("code", code, api.MAX_CODE_BYTES)
        if self.actor is None:
            self.actor = cluster.Actor(NotebookHost, self.resource, self.url, self.memory_limit_mb)
            self._generations = 0
        actor = self.actor
        try:
            if not self.alive and not self._generations:
                actor.call(
                    "placed",
                    (),
                    cancel,
                    START_CANCELLED,
                    lambda call: self._end(actor),
                    placed_within=deadlines.for_case().startup,
                )
            response, error, alive, generations = actor.call(
                "run",
                (code, run_timeout),
                cancel,
                START_CANCELLED,
                lambda call: self._end(actor, call),
            )
        except BaseException:
            self._end(actor)
            raise
        self.generation += generations - self._generations
        self._generations, self.alive = generations, alive
        if error is not None:
            raise InvalidRequest(error.removeprefix("Invalid request: "))
        assert response is not None
        answer: Response = response
        return answer

    def _end(self, actor: cluster.Actor, call: Any = None) -> None:
        """Kill `actor` (its notebook's micro-VM with it), if it is still this one's; its
        running `call`, if any, cancelled first where it runs, so that the micro-VM is ended
        by the notebook's own cancel rather than by its process's death alone."""
        if actor is not self.actor:
            return
        self.actor, self.alive = None, False
        actor.end(call, "cancel_call")

    def close(self) -> None:
        """End its actor and micro-VM (if up); the next call starts new ones."""
        if self.actor is not None:
            self._end(self.actor)
