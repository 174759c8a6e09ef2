"""`verl-hyperlight serve`: Sandbox Fusion's HTTP API, answered from micro-VMs.

A thin layer over run_code, the one path a case takes, built as a list of pure-ASGI
middlewares, one concern each (`_middleware`: request id and access log, body limit, bearer
token; here: admission), around two routes: POST /run_code, and a FastAPI application for
the rest (/v1/ping, /readyz, /metrics, and FastAPI's 404 and 405 answers).

A /run_code request takes a place in the queue before its body is read (none left: HTTP 504
at once, its body unread); holding it, its body is read and validated as the service
validates it (`_request`: FastAPI's 422 bodies), off the event loop when large; it then takes
a free micro-VM at once, or waits for one (at most `max_wait` seconds, never longer than its
compile_timeout + 5 s; past that HTTP 504 with Retry-After, which verl's client retries), runs
in a worker thread, and is answered with run_code's response. A client that goes away, a
server that stops past its grace period, or a handler cancelled by uvicorn cancels its case:
the micro-VM is killed and its case directory removed, and the case keeps its place until
then, so the server never runs more than `max_concurrent` micro-VMs and stops only once they
have ended.

Needs the `serve` extra (FastAPI, uvicorn, prometheus-client); the package itself, which verl
imports in every process, never imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric

from . import _api, _hluk, _warmup
from ._errors import BackendError, InvalidRequest
from ._guest import guest_for
from ._middleware import (
    ASGIApp,
    BearerToken,
    BodyLimit,
    Receive,
    RequestLog,
    Scope,
    Send,
    answer,
    answer_json,
    header,
)
from ._request import Invalid, RunCodeRequest, parse
from ._response import sandbox_error

logger = logging.getLogger("verl_hyperlight.serve")

RUN_CODE = "/run_code"
# verl's client waits compile_timeout + run_timeout + 10 s for an answer: a request waits for a
# micro-VM at most this much longer than its compile_timeout allows, so that its run still fits.
WAIT_MARGIN_SECONDS = 5.0
RETRY_AFTER_SECONDS = 1
READINESS_WAIT_SECONDS = 2.0
# Parsing a body takes 5 to 10 ms per MiB: past this size it is parsed in a thread, so the loop
# answers /readyz and watches disconnects between the parse's steps (each step, such as one
# long string's decode, still holds the interpreter while it runs).
PARSE_ON_LOOP_BYTES = 64 * 1024
# How long a stopping server waits for its cancelled cases' micro-VMs to be killed.
STOP_SECONDS = 10.0
# uvicorn cancels the handlers still running this long after the grace period, a backstop:
# by then the cases were cancelled and their clients answered.
CANCEL_MARGIN_SECONDS = 10


def _node_memory_mb() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)


@dataclass(frozen=True)
class Settings:
    """How the server runs; see `verl-hyperlight serve --help`."""

    url: str = "hyperlight://"
    max_concurrent: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    max_queue: int | None = None  # None: 8 x max_concurrent
    max_wait: float = 5.0
    max_body_bytes: int = 64 * 1024 * 1024
    grace: float = 30.0
    warm_up_memory_mb: int = 1024
    max_memory_mb: int | None = None  # None: half the node's memory, at least warm_up_memory_mb
    max_run_timeout: float = 300.0
    token: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_wait", "grace"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.max_run_timeout <= 0 or self.memory_cap < self.warm_up_memory_mb:
            raise ValueError("the caps must allow the warm-up's memory and a positive run")

    @property
    def queue_limit(self) -> int:
        return self.max_queue if self.max_queue is not None else 8 * self.max_concurrent

    @property
    def memory_cap(self) -> int:
        if self.max_memory_mb is not None:
            return self.max_memory_mb
        return max(_node_memory_mb() // 2, self.warm_up_memory_mb)


class _Metrics:
    """What /metrics shows, in a registry of the server's own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.cases = Counter(
            "verl_hyperlight_cases",
            "Requests to /run_code by how they were answered (the response's status, or "
            "invalid / rejected / cancelled)",
            ["status"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "verl_hyperlight_cases_in_flight", "Cases running now", registry=self.registry
        )
        self.queued = Gauge(
            "verl_hyperlight_cases_queued",
            "Requests waiting for a micro-VM",
            registry=self.registry,
        )
        self.seconds = Histogram(
            "verl_hyperlight_case_seconds",
            "Time from a /run_code request to its answer (waiting included)",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        self.registry.register(_BackendFailures())


class _BackendFailures:
    """run_code's count of backend failures by cause, as a Prometheus counter."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "verl_hyperlight_backend_failures",
            "Cases answered SandboxError because the backend failed, by cause",
            labels=["cause"],
        )
        for cause, count in sorted(_api.failures.counts.items()):
            family.add_metric([cause], count)
        yield family


class _Place:
    """A /run_code request's place, from its arrival (before its body is read) until it is
    answered, or, once its case runs, until the case's thread has ended (whatever became of
    the handler): the place, and the micro-VM once taken, are given back exactly once."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.waiting = True
        self.slot = False
        self.running = False
        server.places += 1
        server.metrics.queued.inc()

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

    def leave(self) -> None:
        """The handler is done; a running case keeps the place until its thread ends."""
        if not self.running:
            self.release()

    def release(self) -> None:
        self._stop_waiting()
        if self.slot:
            self.slot = False
            self.server.slots.release()
        self.server.places -= 1


class _Server:
    """The server's state: admission, the cases in flight, readiness and metrics."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.memory_cap = settings.memory_cap
        self.metrics = _Metrics()
        self.slots = asyncio.Semaphore(settings.max_concurrent)
        # Requests holding a place: being read, waiting for a micro-VM, or running.
        self.places = 0
        self.place_limit = settings.max_concurrent + settings.queue_limit
        self.executor = ThreadPoolExecutor(settings.max_concurrent, "verl-hyperlight-case")
        self.parser = ThreadPoolExecutor(1, "verl-hyperlight-parse")
        self.in_flight: set[threading.Event] = set()
        self.ready = False
        self.reason = "warming up"
        self.check: asyncio.Future[None] | None = None
        self.pod_name = os.environ.get("MY_POD_NAME")

    # readiness

    def _check_backend(self) -> None:
        """See the guest warm (a probe when hluk's cache changed, else two stat calls)."""
        try:
            guest = guest_for(self.settings.url, self.settings.warm_up_memory_mb)
            warmth = _warmup.ensure_ready(_hluk.hluk_path(), guest)
        except (BackendError, InvalidRequest) as exc:
            if self.ready or self.reason != str(exc):
                logger.error("not ready: %s", exc)
            self.ready, self.reason = False, str(exc)
            return
        if not self.ready:
            how = "" if warmth is None else f" (probe took {warmth.seconds:.2f} s)"
            logger.info("ready: %s is warm%s", guest.image.label, how)
        self.ready, self.reason = True, "ready"

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
        return self.ready, self.reason

    # a case

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

    async def parse(self, body: bytes, content_type: bytes | None) -> RunCodeRequest | Invalid:
        if len(body) <= PARSE_ON_LOOP_BYTES:
            return parse(body, content_type)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.parser, parse, body, content_type)

    async def run(
        self, request: RunCodeRequest, receive: Receive, place: _Place
    ) -> tuple[dict[str, Any] | None, str | None, bool]:
        """Run the case in a worker thread; cancel it if the client goes away or the handler is
        cancelled. run_code's answer, and whether the case was cancelled."""
        cancel = threading.Event()
        call = functools.partial(
            _api.run_code,
            self.settings.url,
            request.code,
            request.stdin,
            request.compile_timeout,
            request.run_timeout,
            None if request.memory_limit_MB <= 0 else request.memory_limit_MB,
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
            place.release()

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

    def cancel_all(self) -> None:
        for cancel in list(self.in_flight):
            cancel.set()

    async def stop(self) -> None:
        """The last step of stopping: cancel what still runs (its micro-VM killed, its case
        directory removed) and wait until it has ended, cases whose handler was cancelled
        included."""
        self.cancel_all()
        deadline = time.monotonic() + STOP_SECONDS
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.in_flight:
            logger.error("stopping with %d cases still ending", len(self.in_flight))


def _settle(check: asyncio.Future[None]) -> None:
    if not check.done():
        check.set_result(None)


async def _read_body(receive: Receive) -> bytes | None:
    """The request's body, or None if the client went away first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _cancel_on_disconnect(receive: Receive, cancel: threading.Event) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return


PLACE = "verl_hyperlight.place"


class _Admission:
    """A place for each POST /run_code before its body is read: past `max_concurrent` running
    and `queue_limit` waiting, HTTP 504 at once, without reading the body (as uvicorn's
    limit_concurrency refuses). The place is given back when the request is done with it."""

    def __init__(self, app: ASGIApp, server: _Server) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _is_run_code(scope):
            await self.app(scope, receive, send)
            return
        server = self.server
        if server.places >= server.place_limit:
            limit = server.settings.queue_limit
            await _busy(scope, send, f"the queue is full ({limit} requests wait already)")
            return
        place = _Place(server)
        scope[PLACE] = place
        try:
            await self.app(scope, receive, send)
        finally:
            place.leave()


def _is_run_code(scope: Scope) -> bool:
    return bool(scope["type"] == "http" and scope["path"] == RUN_CODE and scope["method"] == "POST")


async def _busy(scope: Scope, send: Send, why: str) -> None:
    scope["state"]["case"] = "rejected"
    scope[SERVER].metrics.cases.labels("rejected").inc()
    headers = [(b"retry-after", str(RETRY_AFTER_SECONDS).encode())]
    await answer_json(send, 504, {"detail": f"verl-hyperlight is busy: {why}"}, headers)


SERVER = "verl_hyperlight.server"


async def _run_code(scope: Scope, receive: Receive, send: Send) -> None:
    """POST /run_code, admitted: read, validate, take a micro-VM, run, answer."""
    server: _Server = scope[SERVER]
    place: _Place = scope[PLACE]
    started = time.monotonic()
    body = await _read_body(receive)
    if body is None:
        return  # gone before it was read: nothing to answer
    request = await server.parse(body, header(scope, b"content-type"))
    del body  # the request holds the content from here: one copy while it waits
    if isinstance(request, Invalid):
        await answer(send, request.status, request.body, content_type=request.content_type)
        return
    refused = server.over_cap(request)
    if refused is None:
        busy = await place.take_slot(request.compile_timeout)
        if busy is not None:
            await _busy(scope, send, busy)
            return
        response, error, cancelled = await server.run(request, receive, place)
    else:
        response, error, cancelled = sandbox_error(refused), None, False
    if response is None:
        # Valid for the service, not runnable here (a memory limit below the image's):
        # an outcome, answered as the service answers a failed run.
        response = sandbox_error(error or "invalid request")
    response["executor_pod_name"] = server.pod_name
    case = "cancelled" if cancelled else response["status"]
    scope["state"]["case"] = case
    server.metrics.cases.labels(case).inc()
    server.metrics.seconds.observe(time.monotonic() - started)
    await answer_json(send, 200, response)


class _App:
    """The innermost application: the lifespan (warm-up at start, `stop` at the end), POST
    /run_code, and FastAPI for the rest."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.rest = _other_routes(server)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif _is_run_code(scope):
            await _run_code(scope, receive, send)
        else:
            await self.rest(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.server.start_check()  # the warm-up: pull and snapshot if needed, logged
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.server.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _other_routes(server: _Server) -> FastAPI:
    app = FastAPI(title="verl-hyperlight", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/v1/ping")
    async def ping() -> str:
        return "pong"

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ready, reason = await server.readiness()
        return JSONResponse({"ready": ready, "reason": reason}, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post(RUN_CODE)
    async def run_code() -> None:
        """Never reached (POST /run_code is answered before FastAPI): declared so that other
        methods get FastAPI's 405."""

    return app


class Application:
    """The ASGI application serving `settings`: the middlewares, outermost first, around
    `_App`."""

    def __init__(self, settings: Settings) -> None:
        self.server = _Server(settings)
        middlewares: list[tuple[type[Any], dict[str, Any]]] = [
            (RequestLog, {}),
            (BodyLimit, {"max_bytes": settings.max_body_bytes}),
            (BearerToken, {"token": settings.token, "protected": frozenset({RUN_CODE})}),
            (_Admission, {"server": self.server}),
        ]
        app: ASGIApp = _App(self.server)
        for middleware, options in reversed(middlewares):
            app = middleware(app, **options)
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[SERVER] = self.server
        await self.app(scope, receive, send)


def create_app(settings: Settings) -> Application:
    """The ASGI application serving `settings`."""
    return Application(settings)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class _Uvicorn(uvicorn.Server):
    """uvicorn, whose first SIGTERM or SIGINT starts the grace period: once over, the cases
    still running are cancelled, so their clients get an answer, their connections close and
    the server exits. This is the one way the server stops: uvicorn then cancels what is
    left, and `_Server.stop` waits for the cases' ends."""

    def __init__(self, config: uvicorn.Config, server: _Server) -> None:
        super().__init__(config)
        self.cases = server

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self.should_exit:
            grace = self.cases.settings.grace
            logger.info(
                "stopping (%s): %d cases in flight get %g s to finish",
                signal.Signals(sig).name,
                len(self.cases.in_flight),
                grace,
            )
            timer = threading.Timer(grace, self.cases.cancel_all)
            timer.daemon = True
            timer.start()
        super().handle_exit(sig, frame)


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Serve until SIGTERM or SIGINT."""
    if not _is_loopback(host) and settings.token is None:
        logger.warning(
            "listening on %s without a token: the API has no authentication, so anyone who "
            "reaches %s:%d runs code in this node's micro-VMs (set VERL_HYPERLIGHT_TOKEN)",
            host,
            host,
            port,
        )
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=False,  # one line per request, with its id, from RequestLog
        log_config=None,
        lifespan="on",
        timeout_graceful_shutdown=int(settings.grace) + CANCEL_MARGIN_SECONDS,
    )
    _Uvicorn(config, app.server).run()
