"""The server's routes, each handler given the server's state: POST /run_code (admission, then
the case), GET /v1/ping, /readyz and /metrics; and the table the router serves them from.

POST /run_code takes a place before its body is read, holding the length its body declares
(no place left, or no room for that length in the bodies' budget: HTTP 504 at once, its body
unread, where uvicorn's limit_concurrency would answer 503: 504 is the one status verl's client
retries); holding it, its body is read into one buffer
(counted against the budget as it arrives when its length was not declared) and validated as
the service validates it (`request`), off the event loop when large; it then takes a micro-VM
(past its wait, HTTP 504 with Retry-After, which verl's client retries), runs, and is answered
with run_code's response.
"""

from __future__ import annotations

import asyncio
import functools
import time

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..case.compiled import BUILT
from ..case.response import sandbox_error
from ..settings import BODY_READ_TIMEOUT
from .middleware import ASGIApp, Receive, Scope, Send, answer, answer_json, header, render_json
from .request import Invalid
from .routing import Reply, endpoint
from .state import Place, Server

RUN_CODE = "/run_code"
RETRY_AFTER_SECONDS = 1
PONG = Reply(200, render_json("pong"))
METRICS_TYPE = CONTENT_TYPE_LATEST.encode("latin-1")


def table(server: Server) -> dict[str, dict[str, ASGIApp]]:
    """The routes by path, each one's handlers by method."""
    routes: dict[str, dict[str, ASGIApp]] = {
        "/v1/ping": {"GET": endpoint(ping)},
        "/readyz": {"GET": endpoint(functools.partial(readyz, server))},
        "/metrics": {"GET": endpoint(functools.partial(metrics, server))},
        RUN_CODE: {"POST": functools.partial(run_code, server)},
    }
    return routes


async def ping() -> Reply:
    return PONG


async def readyz(server: Server) -> Reply:
    ready, reason = await server.readiness()
    answer = {"ready": ready, "reason": reason, "compiles": server.compiles}
    return Reply(200 if ready else 503, render_json(answer))


async def metrics(server: Server) -> Reply:
    return Reply(200, generate_latest(server.metrics.registry), METRICS_TYPE)


class _OverBudget(Exception):
    """Raised by `_read_body` when a body whose length was not declared outgrows the budget."""


async def run_code(server: Server, scope: Scope, receive: Receive, send: Send) -> None:
    """POST /run_code: its body's bytes held from its arrival (none past the bodies' budget,
    nor while `max_concurrent` run and `queue_limit` wait), its place taken once the body is
    whole; all given back when the request is done with them."""
    length = header(scope, b"content-length")
    # BodyLimit has refused a declared length past --max-body-mb, and uvicorn one not a number.
    place = server.admit(int(length) if length is not None and length.isdigit() else 0)
    if isinstance(place, str):
        await _busy(server, scope, send, place)
        return
    try:
        await _run_admitted(server, place, scope, receive, send)
    except _OverBudget:
        await _busy(server, scope, send, server.over_budget())
    finally:
        place.handler_done()


async def _run_admitted(
    server: Server, place: Place, scope: Scope, receive: Receive, send: Send
) -> None:
    """POST /run_code, admitted: read, validate, take a micro-VM, run, answer."""
    started = time.monotonic()
    limit = server.deadlines.body_read
    # The body read is interrupted by cancelling this handler, as asyncio.timeout does, at
    # the deadline or when the server stops (a timer and a set, not a task per request).
    reading = server.reading(limit)
    try:
        body = await _read_body(receive, place)
    except asyncio.CancelledError:
        why = reading.interrupted()
        if why is None:
            raise
        if why == "stopping":
            await _stopping(server, scope, send)
        else:
            await _slow_body(server, scope, send, limit)
        return
    finally:
        reading.done()
    if body is None:
        return  # gone before it was read: nothing to answer
    request = await server.parse(body, header(scope, b"content-type"))
    del body  # the request holds the content from here: one copy while it waits
    if isinstance(request, Invalid):
        await request.send(send)
        return
    refused = server.over_cap(request)
    if refused is None:
        # A compiled (or transpiled) language spends its compile_timeout compiling, in its
        # slot: of what verl waits, only the margin is left for waiting for one.
        spare = 0.0 if request.language in BUILT else request.compile_timeout
        busy = place.enter() or await place.take_slot(spare)
        if busy is not None:
            await _busy(server, scope, send, busy)
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
    await answer(send, 200, await server.render(response))


async def _slow_body(server: Server, scope: Scope, send: Send, limit: float) -> None:
    """A body that did not arrive whole within its deadline: HTTP 408, and the connection
    closed (what is left of the body is never read)."""
    scope["state"]["case"] = "body-timeout"
    server.metrics.cases.labels("body-timeout").inc()
    detail = (
        f"the request's body did not arrive whole within {limit:g} s ({BODY_READ_TIMEOUT.name})"
    )
    await answer_json(send, 408, {"detail": detail}, [(b"connection", b"close")])


async def _stopping(server: Server, scope: Scope, send: Send) -> None:
    """A request whose body was still arriving when the server began to stop: HTTP 503, and the
    connection closed (its case never started)."""
    scope["state"]["case"] = "stopping"
    server.metrics.cases.labels("stopping").inc()
    detail = "verl-hyperlight is stopping: the request's body had not arrived whole"
    await answer_json(send, 503, {"detail": detail}, [(b"connection", b"close")])


async def _busy(server: Server, scope: Scope, send: Send, why: str) -> None:
    scope["state"]["case"] = "rejected"
    server.metrics.cases.labels("rejected").inc()
    headers = [(b"retry-after", str(RETRY_AFTER_SECONDS).encode())]
    await answer_json(send, 504, {"detail": f"verl-hyperlight is busy: {why}"}, headers)


async def _read_body(receive: Receive, place: Place) -> bytes | bytearray | None:
    """The request's body, or None if the client went away first. A body in one message is
    kept as it came; one in several is read into one buffer, made at once of the length it
    declared (which its place holds already), so that it is never held twice, as chunks and
    joined. Bytes past the declared length are held as they arrive, and _OverBudget raised
    when the budget has no room for them."""
    buffer: bytearray | None = None
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        end = size + len(chunk)
        if end > place.held and not place.hold(end - place.held):
            raise _OverBudget
        if buffer is None:
            if not more:
                return chunk
            buffer = bytearray(place.held)
        buffer[size:end] = chunk  # in place within the declared length, else appended
        size = end
        if not more:
            del buffer[size:]  # shorter than declared, were a parser to let it be: what came
            return buffer
