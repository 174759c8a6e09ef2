"""Sandbox URLs: which are ours, which are a Sandbox Fusion service's (http(s)), and what a
well-formed one of ours names.

A URL is ours when its scheme is ``hyperlight:`` (in any case), so that the plugin sends a
malformed one to run_code, which answers it with this module's error rather than verl's HTTP
client with its own. A well-formed one is ``hyperlight://IMAGE?OPTIONS``: IMAGE nothing (or
``python``), ``agent``, or a full image reference; OPTIONS ``name=value`` or ``name`` pairs
joined by ``&``. The one option, ``ray`` (``ray=NAME``), sends each case to a node of the Ray
cluster that offers the custom resource NAME (``hyperlight`` by default).

The verl plugin imports this module in every verl process: it imports nothing but the errors.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import NamedTuple

from ..errors import InvalidRequest

SCHEME = "hyperlight:"
PREFIX = SCHEME + "//"
RAY = "ray"
# The options a URL may give.
OPTIONS: frozenset[str] = frozenset((RAY,))
# The Ray custom resource `?ray` names when given no value.
DEFAULT_RESOURCE = "hyperlight"


class SandboxURL(NamedTuple):
    """A well-formed sandbox URL of ours. A NamedTuple, not a dataclass: importing dataclasses
    would cost every verl process the plugin is imported in."""

    image: str  # "python", "agent", or a full image reference
    options: Mapping[str, str | None]  # by name; None for a name given without a value
    ray: str | None  # the Ray resource whose nodes run the cases, or None: run them here
    local: str  # the URL as the node that runs a case takes it: without `ray`


def is_ours(url: object) -> bool:
    """Whether `url` is a sandbox URL this package serves (well-formed or not)."""
    return isinstance(url, str) and url[: len(SCHEME)].lower() == SCHEME


def is_http(url: object) -> bool:
    """Whether `url` is an http(s) URL: a Sandbox Fusion service's (or a serve's), which the
    service's HTTP client asks."""
    return isinstance(url, str) and url[:8].lower().startswith(("http://", "https://"))


def parse_url(url: object) -> SandboxURL:
    """What a sandbox URL names; InvalidRequest for one that is not ours or is malformed.
    Every case asks, mostly of the same few URLs: what a URL names is kept."""
    if isinstance(url, str):
        return _parsed(url)
    return _parse(url)


@functools.lru_cache(maxsize=64)
def _parsed(url: str) -> SandboxURL:
    return _parse(url)


def _parse(url: object) -> SandboxURL:
    # The scheme in any case, as is_ours takes it.
    if not isinstance(url, str) or url[: len(PREFIX)].lower() != PREFIX:
        meant = ""
        if is_ours(url):  # the scheme, less its slashes
            meant = f"did you mean {PREFIX + str(url)[len(SCHEME) :].lstrip('/')!r}? "
        raise InvalidRequest(
            f"unsupported sandbox URL {url!r}: {meant}verl-hyperlight serves hyperlight://, "
            "hyperlight://agent or hyperlight://<image reference>"
        )
    rest, _, query = url[len(PREFIX) :].partition("?")
    name = rest.strip("/")
    if name in ("", "python"):
        image = "python"
    elif name == "agent" or ("/" in name and not any(c.isspace() for c in name)):
        image = name
    else:
        raise InvalidRequest(
            f"unsupported sandbox URL {url!r}: after hyperlight:// give nothing (the python "
            "image), 'agent', or a full image reference such as "
            "ghcr.io/hyperlight-dev/hyperlight-unikraft/python:initrd-v0.19.0"
        )
    options = _options(query)
    for option in options:
        if option not in OPTIONS:
            raise InvalidRequest(
                f"unsupported sandbox URL {url!r}: verl-hyperlight knows no option {option!r}"
            )
    ray = None
    if RAY in options:
        ray = options[RAY] or DEFAULT_RESOURCE
        if not ray.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise InvalidRequest(
                f"unsupported sandbox URL {url!r}: ray={ray!r} is not a Ray resource name "
                "(letters, digits, '_', '-' and '.'; ?ray alone names 'hyperlight')"
            )
    local = url
    if ray is not None:
        rest = "&".join(pair for pair in query.split("&") if pair.partition("=")[0] != RAY)
        local = url.partition("?")[0] + (f"?{rest}" if rest else "")
    return SandboxURL(image, options, ray, local)


def _options(query: str) -> dict[str, str | None]:
    """A query string, `name=value&name`, by name (a name given twice: its last value)."""
    options: dict[str, str | None] = {}
    for pair in query.split("&"):
        if pair:
            name, equals, value = pair.partition("=")
            options[name] = value if equals else None
    return options
