"""The server's state, one object (`Server`) passed to every route that needs it: its settings;
admission, a `Place` for each /run_code request it holds (from before its body is read until it
is answered, or until its case's thread has ended), the bytes of their bodies (within a budget)
and the micro-VMs they take (a free one at once, else after a wait of at most `max_wait`
seconds, never longer than the request's compile_timeout + 5 s); the cases in flight, each in a
worker thread (a client that goes away or a handler that is cancelled cancels its case: its
micro-VM killed, its case directory removed); readiness; and metrics. Stopping waits until
every case has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import cancel as cancels
from .. import deadlines, diagnosis
from ..case import api, cluster, compiled, gate
from ..case.guests import guest_for
from ..case.url import parse_url
from ..errors import BackendError, Diagnosis, InvalidRequest, Refused
from ..hluk.binary import hluk_path
from ..settings import POD_NAME, ServeSettings
from .metrics import Metrics
from .middleware import Receive, render_json
from .request import Invalid, RunCodeRequest, parse

logger = logging.getLogger("verl_hyperlight.serve")

# verl's client waits compile_timeout + run_timeout + 10 s for an answer: a request waits for a
# micro-VM at most this much longer than its compile_timeout allows, so that its run still fits.
WAIT_MARGIN_SECONDS = 5.0
READINESS_WAIT_SECONDS = 2.0
# A ?ray server's readiness runs one case through the cluster: it has this long to run.
PROBE_RUN_SECONDS = 10.0
# Parsing a body takes 5 to 10 ms per MiB: past this size it is parsed in a thread, so the loop
# answers /readyz and watches disconnects between the parse's steps (each step, such as one
# long string's decode, still holds the interpreter while it runs).
PARSE_ON_LOOP_BYTES = 64 * 1024
# How long a stopping server waits for its cancelled cases' micro-VMs to be killed.
STOP_SECONDS = 10.0
MIB = 1024 * 1024


class Reading:
    """A handler reading its request's body, interrupted by cancelling the handler's task (as
    asyncio.timeout interrupts what it bounds): at its deadline ("deadline"), or when the server
    stops ("stopping"). The handler asks `interrupted` on a CancelledError: None when the
    cancel was not this one's (the handler's own end), to be let through."""

    __slots__ = ("server", "task", "timer", "why")

    def __init__(self, server: Server, limit: float) -> None:
        self.server = server
        self.task = asyncio.current_task()
        self.why: str | None = None
        self.timer = asyncio.get_running_loop().call_later(limit, self.interrupt, "deadline")

    def interrupt(self, why: str) -> None:
        if self.why is None and self.task is not None:
            self.why = why
            self.task.cancel()

    def interrupted(self) -> str | None:
        """Why this reading interrupted the handler, if it did; the cancel is then taken back."""
        if self.why is not None and self.task is not None:
            uncancel = getattr(self.task, "uncancel", None)  # Python 3.11 and later
            if uncancel is not None:
                uncancel()
        return self.why

    def done(self) -> None:
        self.timer.cancel()
        self.server.readers.discard(self)


class Place:
    """A /run_code request's hold on the server, from its arrival until it is answered, or,
    once its case runs, until the case's thread has ended (whatever became of the handler).
    While its body is read it holds that body's bytes (`held`) alone; once the body is whole,
    its place among those waiting and running (`enter`), then a micro-VM (`take_slot`). Each
    is given back exactly once. Made by `Server.admit`."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.reading = True
        self.placed = False
        self.waiting = False
        self.slot = False
        self.running = False
        self.held = 0
        server.metrics.reading.inc()

    def hold(self, size: int) -> bool:
        """Hold `size` bytes more of its body, if the budget has room for them."""
        server = self.server
        if server.held + size > server.bodies_budget:
            return False
        server.held += size
        self.held += size
        return True

    def enter(self) -> str | None:
        """Its body whole: take its place among the requests waiting for a micro-VM or running
        one; why not, when `max_concurrent` run and `queue_limit` wait."""
        self._stop_reading()
        server = self.server
        if server.places >= server.place_limit:
            return server.queue_full()
        server.places += 1
        self.placed = self.waiting = True
        server.metrics.queued.inc()
        return None

    def _stop_reading(self) -> None:
        if self.reading:
            self.reading = False
            self.server.metrics.reading.dec()

    def _stop_waiting(self) -> None:
        if self.waiting:
            self.waiting = False
            self.server.metrics.queued.dec()

    async def take_slot(self, compile_timeout: float) -> str | None:
        """Take a micro-VM: a free one at once, else wait in order; why not, if turned away."""
        slots = self.server.slots
        try:
            if not slots.locked():
                await slots.acquire()  # free: taken without yielding, whatever the wait
            else:
                wait = min(self.server.settings.max_wait, compile_timeout + WAIT_MARGIN_SECONDS)
                if not wait > 0:  # wait_for(…, 0) would cancel the acquire before it ran
                    return f"no micro-VM was free within {max(wait, 0.0):g} s"
                try:
                    await asyncio.wait_for(slots.acquire(), wait)
                except asyncio.TimeoutError:
                    return f"no micro-VM was free within {wait:g} s"
            self.slot = True
            return None
        finally:
            self._stop_waiting()

    def handler_done(self) -> None:
        """The handler is done; a running case keeps the place until its thread ends."""
        if not self.running:
            self.give_back()

    def give_back(self) -> None:
        """Give back its body's bytes, its place and its micro-VM, those it holds (once: the
        handler's end, or its case's thread's end, whichever comes last)."""
        self._stop_reading()
        self._stop_waiting()
        if self.slot:
            self.slot = False
            self.server.slots.release()
        self.server.held -= self.held
        self.held = 0
        if self.placed:
            self.placed = False
            self.server.places -= 1


class Server:
    """The server's state: admission, the cases in flight, readiness and metrics."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.memory_cap = settings.memory_cap
        self.metrics = Metrics()
        self.slots = asyncio.Semaphore(settings.max_concurrent)
        # Requests holding a place: being read, waiting for a micro-VM, or running.
        self.places = 0
        self.place_limit = settings.max_concurrent + settings.queue_limit
        # The bytes of their bodies, held as they arrive, or from the arrival for the length
        # a request declares.
        self.held = 0
        self.bodies_budget = settings.bodies_budget
        self.metrics.held.set_function(lambda: self.held)  # read when scraped, not per request
        self.executor = ThreadPoolExecutor(settings.max_concurrent, "verl-hyperlight-case")
        # Large bodies are parsed and large answers rendered here, off the event loop; its one
        # thread starts with the server, as a lazy one would in the middle of its first load.
        self.parser = ThreadPoolExecutor(1, "verl-hyperlight-parse")
        self.parser.submit(int)
        self.in_flight: set[threading.Event] = set()
        # The handlers' body reads under way, answered at once when the server stops (their
        # case has not started: nothing is lost, and no grace is owed them).
        self.readers: set[Reading] = set()
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's, once it has started
        self.serving = False
        self.reason = "warming up"
        # Go's build cache, warmed in a thread of its own once the guest is: "not started",
        # "warming", then "warm", "nothing to warm" (no Go here), "failed" (logged why) or
        # "stopped" (the server stopped first).
        self.compiles = "not started"
        self.compiles_cancel = cancels.Cancel()  # set when the server stops
        self.compiles_thread: threading.Thread | None = None
        self.check: asyncio.Future[None] | None = None
        self.pod_name = POD_NAME.value()
        self.deadlines = deadlines.for_case()  # as the settings were when it started

    # readiness

    def _check_backend(self) -> None:
        """See the guest warm (a probe when hluk's cache changed, else two stat calls); with a
        ?ray URL, see an alive node offer the resource and, while the server is not serving
        yet, a probe case answered through the cluster."""
        url, memory = self.settings.url, self.settings.warm_up_memory_mb
        try:
            resource = parse_url(url).ray
            if resource is None:
                guest = guest_for(url, memory)
                warmth = gate.ensure_ready(hluk_path(), guest)
                how = "" if warmth is None else f" (probe took {warmth.seconds:.2f} s)"
                became = f"{guest.image.label} is warm{how}"
                self._warm_compiles()
            else:
                became = self._check_the_cluster(url, resource, memory)
                self.compiles = "on the nodes"  # each warms its own as its first case comes
        except (BackendError, InvalidRequest) as exc:
            if self.serving or self.reason != str(exc):
                logger.error("not ready: %s", exc)
            self.serving, self.reason = False, str(exc)
            return
        if not self.serving:
            logger.info("ready: %s", became)
        self.serving, self.reason = True, "ready"

    def _warm_compiles(self) -> None:
        """Go's build cache warmed once the guest is, in a thread of its own: readiness does
        not wait for it (a node may serve no go case), and a go case that comes meanwhile waits
        for that warm-up rather than starting its own. Said when done, or why it failed (the
        other languages are served either way)."""
        if self.compiles != "not started":
            return
        self.compiles = "warming"

        def warm() -> None:
            try:
                warmed = compiled.warm(self.compiles_cancel)
            except Refused:
                self.compiles = "stopped"  # the server stops: the half-built cache removed
                return
            except BackendError as exc:
                logger.error("go cases cannot compile here: %s", exc)
                self.compiles = "failed"
                return
            except BaseException:
                self.compiles = "failed"
                raise
            if warmed is not None:
                logger.info("%s", warmed)
            self.compiles = "nothing to warm" if warmed is None else "warm"

        self.compiles_thread = threading.Thread(
            target=warm, name="verl-hyperlight-compiles", daemon=True
        )
        self.compiles_thread.start()

    def _check_the_cluster(self, url: str, resource: str, memory: int) -> str:
        """What makes a ?ray server ready: an alive node offers `resource`, and (once) a probe
        case ran there; BackendError naming the resource when not."""
        nodes = cluster.nodes_offering(resource)
        if not nodes:
            raise diagnosis.ray_resource_offered_by_none(resource, 0)
        if not self.serving:
            response = api.answer(url, "print(1)", "", PROBE_RUN_SECONDS, memory)
            if response["status"] != "Success":
                raise BackendError(
                    Diagnosis(
                        f"a probe case through the cluster answered {response['status']}: "
                        f"{response.get('message') or response.get('run_result')}",
                        "",
                        "ray-probe",
                    )
                )
        return f"{len(nodes)} node(s) of the Ray cluster offer {resource!r}"

    def start_check(self) -> asyncio.Future[None]:
        """Check the backend in a daemon thread: a warm-up (a pull, a boot: up to 900 s) must
        never hold the process when it exits."""
        if self.check is None or self.check.done():
            loop = asyncio.get_running_loop()
            check: asyncio.Future[None] = loop.create_future()

            def checked() -> None:
                try:
                    self._check_backend()
                finally:
                    with contextlib.suppress(RuntimeError):  # the loop has closed: exiting
                        loop.call_soon_threadsafe(_settle, check)

            threading.Thread(target=checked, name="verl-hyperlight-readiness", daemon=True).start()
            self.check = check
        return self.check

    async def readiness(self) -> tuple[bool, str]:
        check = self.start_check()
        try:
            await asyncio.wait_for(asyncio.shield(check), READINESS_WAIT_SECONDS)
        except asyncio.TimeoutError:
            pass  # the last known state, while a probe (a pull, a boot) goes on
        return self.serving, self.reason

    # a case

    def admit(self, declared: int) -> Place | str:
        """A hold for a request that declares a body of `declared` bytes (0: it does not say),
        holding them while the body is read; why not, when the places are all taken now or the
        bodies held leave too little of the budget. Decided before the body is read: a request
        turned away is answered at once, its body unread. Its place is taken once its body is
        whole (`Place.enter`): a client that goes silent mid-body holds no place."""
        if self.places >= self.place_limit:
            return self.queue_full()
        if self.held + declared > self.bodies_budget:
            return self.over_budget()
        place = Place(self)
        place.hold(declared)
        return place

    def queue_full(self) -> str:
        return f"the queue is full ({self.settings.queue_limit} requests wait already)"

    def over_budget(self) -> str:
        return (
            f"the bodies of the requests it holds fill its {self.bodies_budget // MIB} MiB for "
            "them (verl-hyperlight serve --max-bodies-mb)"
        )

    def over_cap(self, request: RunCodeRequest) -> str | None:
        """Why this server will not run a request the service would take, if it will not."""
        if request.memory_limit_MB > self.memory_cap:
            return (
                f"memory_limit_MB {request.memory_limit_MB} is over this server's cap of "
                f"{self.memory_cap} MiB (verl-hyperlight serve --max-memory-mb)"
            )
        if request.run_timeout > self.settings.max_run_timeout:
            return (
                f"run_timeout {request.run_timeout:g} s is over this server's cap of "
                f"{self.settings.max_run_timeout:g} s (verl-hyperlight serve --max-run-timeout)"
            )
        return None

    async def parse(
        self, body: bytes | bytearray, content_type: bytes | None
    ) -> RunCodeRequest | Invalid:
        if len(body) <= PARSE_ON_LOOP_BYTES:
            return parse(body, content_type)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.parser, parse, body, content_type)

    async def run(
        self, request: RunCodeRequest, receive: Receive, place: Place
    ) -> tuple[dict[str, Any] | None, str | None, bool]:
        """Run the case in a worker thread; cancel it if the client goes away or the handler is
        cancelled. run_code's answer, and whether the case was cancelled."""
        cancel = cancels.Cancel()
        call = functools.partial(
            api.run_code,
            self.settings.url,
            request.code,
            request.stdin,
            request.compile_timeout,
            request.run_timeout,
            # No memory key (SF's -1, "no limit"): the guest this server warmed before it
            # said ready, not the image's smaller default, which would pay a cold start.
            self.settings.warm_up_memory_mb
            if request.memory_limit_MB <= 0
            else request.memory_limit_MB,
            request.language,
            files=request.files,
            fetch_files=request.fetch_files,
            cancel=cancel,
        )
        case = asyncio.get_running_loop().run_in_executor(self.executor, call)
        place.running = True
        self.in_flight.add(cancel)
        self.metrics.in_flight.inc()

        def ended(_: object) -> None:
            self.in_flight.discard(cancel)
            self.metrics.in_flight.dec()
            place.give_back()

        case.add_done_callback(ended)
        watcher = asyncio.ensure_future(_cancel_on_disconnect(receive, cancel))
        try:
            response, error = await asyncio.shield(case)
        except asyncio.CancelledError:
            cancel.set()  # the handler is gone (uvicorn past its shutdown timeout): so is its case
            raise
        finally:
            watcher.cancel()
        return response, error, cancel.is_set()

    def reading(self, limit: float) -> Reading:
        """The current handler begins to read its body: interrupted past `limit` seconds, or
        when the server stops (see Reading)."""
        reading = Reading(self, limit)
        self.readers.add(reading)
        return reading

    def stop_reading(self) -> None:
        """The server stops: the requests whose bodies are still being read are answered now
        (503), not after the grace the cases in flight get. In the loop's thread."""
        self.stopping = True
        for reading in list(self.readers):
            reading.interrupt("stopping")

    async def render(self, response: dict[str, Any]) -> bytes:
        """`response` as JSON: a large one (outputs past PARSE_ON_LOOP_BYTES) in a thread, so
        the event loop keeps serving while tens of MiB are encoded."""
        run = response.get("run_result") or {}
        size = len(run.get("stdout") or "") + len(run.get("stderr") or "")
        size += sum(map(len, (response.get("files") or {}).values()))
        if size <= PARSE_ON_LOOP_BYTES:
            return render_json(response)
        return await asyncio.get_running_loop().run_in_executor(self.parser, render_json, response)

    def cancel_all(self) -> None:
        for cancel in list(self.in_flight):
            cancel.set()

    async def stop(self) -> None:
        """The last step of stopping: cancel what still runs (its micro-VM killed, its case
        directory removed) and wait until it has ended, cases whose handler was cancelled
        included; then end the ready guests."""
        self.cancel_all()
        deadline = time.monotonic() + STOP_SECONDS
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.in_flight:
            logger.error("stopping with %d cases still ending", len(self.in_flight))
        # Go's cache, if it is still being built: the build killed, its directories removed.
        self.compiles_cancel.set()
        if self.compiles_thread is not None:
            await asyncio.to_thread(self.compiles_thread.join, STOP_SECONDS)
        # And the micro-VMs started for cases that will not come now.
        await asyncio.to_thread(api.close)


def _settle(check: asyncio.Future[None]) -> None:
    if not check.done():
        check.set_result(None)


async def _cancel_on_disconnect(receive: Receive, cancel: threading.Event) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return
