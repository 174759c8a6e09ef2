"""The server's pure-ASGI middlewares, one concern each, in the order `serve` composes them:
a request id and its access-log line, the body-size limit, the bearer token. None reads a
body: the body is read by the route that needs it, once the request has been admitted.

Written as Starlette writes its own (a class taking the next application, passing through
what is not HTTP), without Starlette's request objects, which cost more per request than the
rest of the server.
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

access_log = logging.getLogger("verl_hyperlight.access")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Headers = Sequence[tuple[bytes, bytes]]

REQUEST_ID_HEADER = b"x-request-id"


def header(scope: Scope, name: bytes) -> bytes | None:
    """The last value of header `name` (lower case), as a dict of the headers would keep it."""
    found = None
    for key, value in scope["headers"]:
        if key.lower() == name:
            found = value
    return found


def render_json(content: Any) -> bytes:
    """JSON as Starlette's JSONResponse renders it, so answers are the service's byte for byte."""
    return json.dumps(
        content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


async def answer(
    send: Send,
    status: int,
    body: bytes,
    headers: Headers = (),
    content_type: bytes = b"application/json",
) -> None:
    """Send a whole response, its headers in the order Starlette's Response writes them."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                *headers,
                (b"content-length", str(len(body)).encode("latin-1")),
                (b"content-type", content_type),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def answer_json(send: Send, status: int, content: Any, headers: Headers = ()) -> None:
    await answer(send, status, render_json(content), headers)


class RequestLog:
    """A request id (the client's X-Request-ID, else a new one), echoed in the response, and
    one access-log line per request once it is answered: id, client, method and path, status,
    milliseconds and `scope["state"]["case"]` (what became of the case, set by the route)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # 16 hex digits: a random half, unique to this server, and a count, which spares a
        # system call for randomness on every request.
        self.prefix = secrets.token_hex(4)
        self.count = itertools.count()

    def _new_id(self) -> str:
        return f"{self.prefix}{next(self.count) & 0xFFFFFFFF:08x}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        given = header(scope, REQUEST_ID_HEADER)
        request_id = given.decode("latin-1") if given else self._new_id()
        echoed = (REQUEST_ID_HEADER, request_id.encode("latin-1"))
        state = scope.setdefault("state", {})
        state["case"] = "-"
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), echoed]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if access_log.isEnabledFor(logging.INFO):
                access_log.info(
                    '%s %s "%s %s" %d %.1f ms case=%s',
                    request_id,
                    (scope.get("client") or ("-",))[0],
                    scope["method"],
                    scope["path"],
                    status,
                    (time.monotonic() - started) * 1000,
                    state.get("case", "-"),
                )


class _BodyTooLarge(Exception):
    """Raised from `receive` past the limit, caught by BodyLimit to answer 413."""


class BodyLimit:
    """HTTP 413 for a body over `max_bytes`: at once when its Content-Length says so, else as
    soon as what was received passes the limit (the rest is never read)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._too_large(send)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _BodyTooLarge
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except _BodyTooLarge:
            if started:
                raise
            await self._too_large(send)

    async def _too_large(self, send: Send) -> None:
        await answer_json(send, 413, {"detail": f"the body is over {self.max_bytes} bytes"})


class BearerToken:
    """HTTP 401 on the `protected` paths unless the request carries `Bearer <token>`."""

    def __init__(self, app: ASGIApp, token: str | None, protected: frozenset[str]) -> None:
        self.app = app
        self.expected = None if token is None else f"Bearer {token}".encode()
        self.protected = protected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.expected is not None
            and scope["type"] == "http"
            and scope["path"] in self.protected
        ):
            # Compared as text: the header's bytes read as latin-1, as HTTP reads a header
            # value, against the token's characters.
            given = (header(scope, b"authorization") or b"").decode("latin-1").encode()
            if not secrets.compare_digest(given, self.expected):
                await answer_json(send, 401, {"detail": "a bearer token is required"})
                return
        await self.app(scope, receive, send)
