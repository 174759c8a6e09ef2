"""`verl-hyperlight serve`: Sandbox Fusion's HTTP API, answered from micro-VMs.

A thin layer over run_code, the one path a case takes: the request is validated as the
service validates it (FastAPI and pydantic, so bad requests get the service's 422 bodies),
admitted (at most `max_concurrent` micro-VMs at once, the rest waiting in order, each at most
`max_wait` seconds, at most `max_queue` of them; past that HTTP 504 with Retry-After, which
verl's client retries), run in a worker thread, and answered with run_code's response. A client
that goes away, or a server that stops past its grace period, cancels its case: the micro-VM is
killed and its case directory removed.

Needs the `serve` extra (FastAPI, uvicorn, prometheus-client); the package itself, which verl
imports in every process, never imports this module.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
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
from pydantic import BaseModel

from . import _api, _hluk, _warmup
from ._api import SandboxFusionLanguage
from ._errors import BackendError, InvalidRequest
from ._guest import guest_for
from ._response import sandbox_error

logger = logging.getLogger("verl_hyperlight.serve")
access_log = logging.getLogger("verl_hyperlight.access")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# verl's client waits compile_timeout + run_timeout + 10 s for an answer: a request waits for a
# micro-VM at most this much longer than its compile_timeout allows, so that its run still fits.
WAIT_MARGIN_SECONDS = 5.0
RETRY_AFTER_SECONDS = 1
READINESS_WAIT_SECONDS = 2.0
REQUEST_ID_HEADER = "x-request-id"


class RunCodeRequest(BaseModel):
    """Sandbox Fusion's request; keys it does not know are ignored, as the service ignores
    them. `language` may be left out: it is then Python (verl's agent-loop tool sends none)."""

    compile_timeout: float = 10
    run_timeout: float = 10
    memory_limit_MB: int = -1
    code: str
    stdin: str | None = None
    language: SandboxFusionLanguage = "python"  # an unknown one is a 422, as the service's
    files: dict[str, str | None] = {}
    fetch_files: list[str] = []


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
    token: str | None = None

    @property
    def queue_limit(self) -> int:
        return self.max_queue if self.max_queue is not None else 8 * self.max_concurrent


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


class _Server:
    """The server's state: admission, the cases in flight, readiness and metrics."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = _Metrics()
        self.slots = asyncio.Semaphore(settings.max_concurrent)
        self.executor = ThreadPoolExecutor(settings.max_concurrent, "verl-hyperlight-case")
        self.checker = ThreadPoolExecutor(1, "verl-hyperlight-readiness")
        self.waiting = 0
        self.in_flight: set[threading.Event] = set()
        self.ready = False
        self.reason = "warming up"
        self.check: asyncio.Future[None] | None = None
        self.pod_name = os.environ.get("MY_POD_NAME")

    def cancel_all(self) -> None:
        for cancel in list(self.in_flight):
            cancel.set()

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
        if self.check is None or self.check.done():
            loop = asyncio.get_running_loop()
            self.check = loop.run_in_executor(self.checker, self._check_backend)
        return self.check

    async def readiness(self) -> tuple[bool, str]:
        check = self.start_check()
        try:
            await asyncio.wait_for(asyncio.shield(check), READINESS_WAIT_SECONDS)
        except asyncio.TimeoutError:
            pass  # the last known state, while a probe (a pull, a boot) goes on
        return self.ready, self.reason

    async def admit(self, compile_timeout: float) -> str | None:
        """Wait for a micro-VM; why not, if the request must be turned away (HTTP 504)."""
        if self.waiting >= self.settings.queue_limit:
            return f"the queue is full ({self.settings.queue_limit} requests wait already)"
        wait = max(0.0, min(self.settings.max_wait, compile_timeout + WAIT_MARGIN_SECONDS))
        self.waiting += 1
        self.metrics.queued.inc()
        try:
            await asyncio.wait_for(self.slots.acquire(), wait)
        except asyncio.TimeoutError:
            return f"no micro-VM was free within {wait:g} s"
        finally:
            self.waiting -= 1
            self.metrics.queued.dec()
        return None

    async def run(
        self, body: RunCodeRequest, request: Request
    ) -> tuple[dict[str, Any] | None, str | None, bool]:
        """Run the case in a worker thread; cancel it if the client goes away. run_code's
        answer, and whether the case was cancelled."""
        cancel = threading.Event()
        call = functools.partial(
            _api.run_code,
            self.settings.url,
            body.code,
            body.stdin,
            body.compile_timeout,
            body.run_timeout,
            None if body.memory_limit_MB <= 0 else body.memory_limit_MB,
            body.language,
            files=body.files,
            fetch_files=body.fetch_files,
            cancel=cancel,
        )
        self.in_flight.add(cancel)
        self.metrics.in_flight.inc()
        try:
            watcher = asyncio.ensure_future(_cancel_on_disconnect(request, cancel))
            try:
                response, error = await asyncio.get_running_loop().run_in_executor(
                    self.executor, call
                )
            finally:
                watcher.cancel()
            return response, error, cancel.is_set()
        finally:
            self.in_flight.discard(cancel)
            self.metrics.in_flight.dec()
            self.slots.release()


async def _cancel_on_disconnect(request: Request, cancel: threading.Event) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return


def _json(status: int, content: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(content, status_code=status, headers=headers)


def create_app(settings: Settings) -> _Guard:
    """The ASGI application serving `settings`."""
    server = _Server(settings)

    async def lifespan(app: FastAPI) -> Any:
        server.start_check()  # the warm-up: pull and snapshot if needed, logged
        yield
        # Stopping: what is still running past the grace period is cancelled (its micro-VM
        # killed, its case directory removed) before the process exits.
        server.cancel_all()
        deadline = time.monotonic() + 10
        while server.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    app = FastAPI(title="verl-hyperlight", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = server

    @app.get("/v1/ping")
    async def ping() -> str:
        return "pong"

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ready, reason = await server.readiness()
        return _json(200 if ready else 503, {"ready": ready, "reason": reason})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/run_code")
    async def run_code(body: RunCodeRequest, request: Request) -> JSONResponse:
        started = time.monotonic()
        refused = await server.admit(body.compile_timeout)
        if refused is not None:
            request.state.case = "rejected"
            server.metrics.cases.labels("rejected").inc()
            headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
            return _json(504, {"detail": f"verl-hyperlight is busy: {refused}"}, headers)
        response, error, cancelled = await server.run(body, request)
        if response is None:
            # Valid for the service, not runnable here (a memory limit below the image's):
            # an outcome, answered as the service answers a failed run.
            response = sandbox_error(error or "invalid request")
        response["executor_pod_name"] = server.pod_name
        request.state.case = "cancelled" if cancelled else response["status"]
        server.metrics.cases.labels(request.state.case).inc()
        server.metrics.seconds.observe(time.monotonic() - started)
        return _json(200, response)

    return _Guard(app, settings, server)


class _Guard:
    """Before the application: a request id, the body-size limit (413 without reading past
    it), the optional bearer token, and one access-log line per request."""

    def __init__(self, app: FastAPI, settings: Settings, server: _Server) -> None:
        self.app = app
        self.settings = settings
        self.server = server
        # uvicorn and tests reach the application's state through this object.
        self.state = app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        request_id = headers.get(REQUEST_ID_HEADER) or secrets.token_hex(8)
        scope.setdefault("state", {})["case"] = "-"
        status = [0]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [
                    *message["headers"],
                    (b"x-request-id", request_id.encode("latin-1")),
                ]
            await send(message)

        try:
            refusal = self._refusal(scope, headers)
            if refusal is not None:
                await refusal(scope, receive, send_with_id)
                return
            body = await self._body(receive)
            if body is None:
                await self._too_large()(scope, receive, send_with_id)
                return
            await self.app(scope, _replay(body, receive), send_with_id)
        finally:
            access_log.info(
                '%s %s "%s %s" %d %.1f ms case=%s',
                request_id,
                (scope.get("client") or ("-",))[0],
                scope["method"],
                scope["path"],
                status[0],
                (time.monotonic() - started) * 1000,
                scope["state"].get("case", "-"),
            )

    def _too_large(self) -> JSONResponse:
        return _json(413, {"detail": f"the body is over {self.settings.max_body_bytes} bytes"})

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> JSONResponse | None:
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.settings.max_body_bytes:
            return self._too_large()
        token = self.settings.token
        if token is not None and scope["path"] == "/run_code":
            given = headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return _json(401, {"detail": "a bearer token is required"})
        return None

    async def _body(self, receive: Receive) -> list[Message] | None:
        """The request's body messages, or None past the limit (the rest is never read)."""
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages
            size += len(message.get("body", b""))
            if size > self.settings.max_body_bytes:
                return None
            if not message.get("more_body", False):
                return messages


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that hands over the body read already, then waits on the client as before
    (for its disconnect)."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class _Uvicorn(uvicorn.Server):
    """uvicorn, whose first SIGTERM or SIGINT also starts the grace period: once over, the
    cases still running are cancelled, so their connections close and the server exits."""

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
        access_log=False,  # one line per request, with its id, from _Guard
        log_config=None,
        lifespan="on",
        timeout_graceful_shutdown=int(settings.grace) + 15,
    )
    _Uvicorn(config, app.state.server).run()
