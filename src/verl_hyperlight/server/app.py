"""`verl-hyperlight serve`: Sandbox Fusion's HTTP API, answered from micro-VMs.

A thin layer over run_code, the one path a case takes, on one framework of its own, pure ASGI: a
list of middlewares, one concern each (`middleware`: request id and access log, body limit,
bearer token), around a router (`routing`: path and method to handler, FastAPI's 404, 405 and
redirect answers) serving the routes (`routes`: POST /run_code, GET /v1/ping, /readyz and
/metrics), each given the server's state (`state`: admission, the cases in flight, readiness,
`metrics`); no framework objects per request, which cost the server more than everything else it
does.

A /run_code request takes a place before its body is read, is read and validated as the service
validates it (`request`: FastAPI's 422 bodies), takes a micro-VM at once or waits for one, runs
in a worker thread and is answered with run_code's response. A client that goes away, a server
that stops past its grace period, or a handler cancelled by uvicorn cancels its case: the
micro-VM is killed and its case directory removed, and the case keeps its place until then, so
the server never runs more than `max_concurrent` micro-VMs and stops only once they have ended.

Needs the `serve` extra (uvicorn, pydantic, prometheus-client); the package itself, which verl
imports in every process, never imports this module.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import threading
from typing import Any

import uvicorn

from ..settings import ServeSettings as Settings
from .middleware import ASGIApp, BearerToken, BodyLimit, Receive, RequestLog, Scope, Send
from .routes import RUN_CODE, table
from .routing import Router
from .state import Server

__all__ = ["Application", "Settings", "create_app", "serve"]

logger = logging.getLogger("verl_hyperlight.serve")

# uvicorn cancels the handlers still running this long after the grace period, a backstop:
# by then the cases were cancelled and their clients answered.
CANCEL_MARGIN_SECONDS = 10


class Application:
    """The ASGI application serving `settings`: its lifespan (the warm-up at the start,
    `Server.stop` at the end), and the middlewares, outermost first, around the router."""

    def __init__(self, settings: Settings) -> None:
        self.server = Server(settings)
        middlewares: list[tuple[type[Any], dict[str, Any]]] = [
            (RequestLog, {}),
            (BodyLimit, {"max_bytes": settings.max_body_bytes}),
            (BearerToken, {"token": settings.token, "protected": frozenset({RUN_CODE})}),
        ]
        app: ASGIApp = Router(table(self.server))
        for middleware, options in reversed(middlewares):
            app = middleware(app, **options)
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        else:
            await self.app(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.server.loop = asyncio.get_running_loop()
                self.server.start_check()  # the warm-up: pull and snapshot if needed, logged
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.server.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


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
    left, and `Server.stop` waits for the cases' ends."""

    def __init__(self, config: uvicorn.Config, server: Server) -> None:
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
            if self.cases.loop is not None:
                self.cases.loop.call_soon_threadsafe(self.cases.stop_reading)
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
