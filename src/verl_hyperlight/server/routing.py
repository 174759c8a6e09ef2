"""The server's router: a request's path and method to its handler, from one table, and FastAPI's
answers where no handler fits (the service is a FastAPI application, and its clients and probes
see these): 404 `{"detail":"Not Found"}`, 405 `{"detail":"Method Not Allowed"}` with Allow, and
a 307 to a route's path for that path with trailing slashes. A GET route's handler is made from
an endpoint, which returns its whole reply: if it fails, 500, as FastAPI answers.

Pure ASGI, as the middlewares are: a dictionary look-up per request, no framework objects.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

from .middleware import ASGIApp, Receive, Scope, Send, answer, render_json

Routes = Mapping[str, Mapping[str, ASGIApp]]

NOT_FOUND = render_json({"detail": "Not Found"})
NOT_ALLOWED = render_json({"detail": "Method Not Allowed"})
INTERNAL_ERROR = b"Internal Server Error"
TEXT = b"text/plain; charset=utf-8"

# Starlette's rule for the Host a redirect's URL keeps: one that could change the URL's path or
# authority is not taken (the server's own address is, instead).
_HOST = re.compile(
    r"^(?P<host>[a-z0-9._~%!$&'()*+,;=-]+|\[(?:(?P<ipv6>[a-f0-9]*:[a-f0-9.:]+)|"
    r"(?-i:v)[a-f0-9]+\.[a-z0-9._~!$&'()*+,;=:-]+)\])(?::(?P<port>[0-9]+))?$",
    re.IGNORECASE,
)
# What Starlette's RedirectResponse leaves unquoted in its Location.
_LOCATION_SAFE = ":/%#?=@[]!$&'()*+,;"


@dataclass(frozen=True)
class Reply:
    """A whole answer, sent at once."""

    status: int
    body: bytes
    content_type: bytes = b"application/json"

    async def send(self, send: Send) -> None:
        await answer(send, self.status, self.body, content_type=self.content_type)


Endpoint = Callable[[], Awaitable[Reply]]


def endpoint(reply: Endpoint) -> ASGIApp:
    """A handler answering what `reply` returns; if it fails, 500 Internal Server Error, and
    the failure goes on to uvicorn, which logs it (as Starlette's ServerErrorMiddleware does)."""

    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            made = await reply()
        except Exception:
            await answer(send, 500, INTERNAL_ERROR, content_type=TEXT)
            raise
        await made.send(send)

    return handle


class Router:
    """The application under the middlewares: each request to its route's handler for its
    method. `routes` maps a path, exactly, to its handlers by method."""

    def __init__(self, routes: Routes) -> None:
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            # A websocket (uvicorn passes one on when a WebSocket library is installed): closed,
            # as a Starlette router closes one it has no route for.
            await send({"type": "websocket.close", "code": 1000, "reason": ""})
            return
        handlers = self.routes.get(scope["path"])
        if handlers is None:
            await self._not_found(scope, send)
            return
        handler = handlers.get(scope["method"])
        if handler is None:
            allowed = ", ".join(handlers).encode("latin-1")
            await answer(send, 405, NOT_ALLOWED, [(b"allow", allowed)])
            return
        await handler(scope, receive, send)

    async def _not_found(self, scope: Scope, send: Send) -> None:
        """A path that is a route's with trailing slashes is redirected to the route (no route's
        path ends with a slash, so Starlette's other redirect, adding one, never applies)."""
        path = scope["path"]
        route = path.rstrip("/")
        if route == path or route not in self.routes:
            await answer(send, 404, NOT_FOUND)
            return
        headers = [(b"content-length", b"0"), (b"location", location(scope, route))]
        await send({"type": "http.response.start", "status": 307, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


def location(scope: Scope, path: str) -> bytes:
    """The URL of `path` for a redirect, as Starlette writes it: the request's scheme and
    authority, `path` and the request's query string."""
    scheme: str = scope.get("scheme", "http")
    query = scope.get("query_string", b"").decode()
    authority = _authority(scope, scheme)
    url = path if authority is None else f"{scheme}://{authority}{path}"
    if query:
        url = f"{url}?{query}"
    return quote(url, safe=_LOCATION_SAFE).encode("latin-1")


def _authority(scope: Scope, scheme: str) -> str | None:
    """The request's first Host if Starlette takes it, else the address the server listens on
    (none on a Unix socket)."""
    for name, value in scope["headers"]:
        if name == b"host":
            given: str = value.decode("latin-1")
            if _takes_host(given):
                return given
            break
    server: tuple[str, int] | None = scope.get("server")
    if server is None:
        return None
    host, port = server
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return host if port == (443 if scheme == "https" else 80) else f"{host}:{port}"


def _takes_host(given: str) -> bool:
    match = _HOST.fullmatch(given)
    if match is None:
        return False
    if match["ipv6"] is not None:
        try:
            ipaddress.IPv6Address(match["ipv6"])
        except ipaddress.AddressValueError:
            return False
    port = (match["port"] or "").lstrip("0")
    return len(port) <= 5 and int(port or "0") <= 65535
