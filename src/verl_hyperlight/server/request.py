"""Sandbox Fusion's /run_code request, read as the service reads it.

The service is a FastAPI route taking a pydantic model, so a bad request's answer is FastAPI's
(422 with pydantic's errors located under "body", 400 for a body that is not text). This module
does what FastAPI does for that one route, in the same order and with the same calls (the body
parsed as JSON only when its content type says JSON, the model validated as FastAPI validates a
body, the errors encoded as FastAPI's jsonable_encoder encodes them), with pydantic alone and
without FastAPI's per-request machinery, which cost the server more than everything else it
does. tests/test_serve.py compares the answers with a FastAPI route's, byte for byte.
"""

from __future__ import annotations

import email.message
import functools
import json
from typing import Any

from pydantic import BaseModel, ValidationError

from ..case.api import SandboxFusionLanguage
from .middleware import render_json
from .routing import Reply


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


class Invalid(Reply):
    """A request answered without running: FastAPI's status and body for it."""


# FastAPI's answer when rendering its own 422 fails (an input that JSON cannot carry, such as
# NaN): Starlette's 500.
_UNRENDERABLE = Invalid(500, b"Internal Server Error", b"text/plain; charset=utf-8")
_UNPARSABLE = Invalid(400, render_json({"detail": "There was an error parsing the body"}))


def parse(body: bytes | bytearray, content_type: bytes | None) -> RunCodeRequest | Invalid:
    """The request in `body`, or how FastAPI answers it."""
    if not body:
        # FastAPI's error for a required body that is absent.
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        return _invalid([missing])
    value: Any
    if content_type and _says_json(content_type.decode("latin-1")):
        try:
            value = json.loads(body)
        except json.JSONDecodeError as exc:
            error = {
                "type": "json_invalid",
                "loc": ("body", exc.pos),
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": exc.msg},
            }
            return _invalid([error])
        except Exception:  # not UTF-8, -16 or -32 text, nested too deep: FastAPI's 400
            return _UNPARSABLE
    else:
        value = bytes(body)  # not JSON by its content type: validated as bytes, as FastAPI does
    try:
        return RunCodeRequest.model_validate(value, from_attributes=True)
    except ValidationError as exc:
        return _invalid(
            [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]
        )


@functools.lru_cache(maxsize=64)  # clients send one or two content types, every time
def _says_json(content_type: str) -> bool:
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def _invalid(errors: list[dict[str, Any]]) -> Invalid:
    try:
        return Invalid(422, render_json({"detail": _jsonable(errors)}))
    except ValueError:
        return _UNRENDERABLE


def _jsonable(value: Any) -> Any:
    """`value` as FastAPI's jsonable_encoder makes it, for what pydantic's errors about this
    model hold: JSON's values, tuples (a location) and bytes (a body validated as bytes, decoded
    as UTF-8: a ValueError if it is not). One call per level of nesting, as jsonable_encoder
    makes (so no comprehension, a call of its own before Python 3.12), so that an input nested
    near the recursion limit fails at the depth where FastAPI's fails."""
    if isinstance(value, (str, int, float, type(None))):
        return value
    if isinstance(value, dict):
        encoded = {}
        for key, item in value.items():
            # jsonable_encoder leaves out keys starting "_sa" (SQLAlchemy's instance state)
            if not (isinstance(key, str) and key.startswith("_sa")):
                encoded[_jsonable(key)] = _jsonable(item)
        return encoded
    if isinstance(value, (list, tuple)):
        items = []
        for item in value:
            items.append(_jsonable(item))
        return items
    if isinstance(value, bytes):
        return value.decode()
    raise ValueError(f"pydantic's errors about {RunCodeRequest.__name__} hold no {type(value)}")
