"""Sandbox Fusion's /run_code request, read as the service reads it.

The service is a FastAPI route taking a pydantic model, so a bad request's answer is FastAPI's
(422 with pydantic's errors located under "body", 400 for a body that is not text). This module
does what FastAPI does for that one route, in the same order and with the same calls (the body
parsed as JSON only when its content type says JSON, the model validated as FastAPI validates a
body, the errors encoded by FastAPI's own encoder), without FastAPI's per-request machinery,
which cost the server more than everything else it does. tests/test_serve.py compares the
answers with a FastAPI route's, byte for byte.
"""

from __future__ import annotations

import email.message
import functools
import json
from dataclasses import dataclass
from typing import Any

from fastapi.encoders import jsonable_encoder
from pydantic import BaseModel, ValidationError

from ._api import SandboxFusionLanguage
from ._middleware import render_json


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
class Invalid:
    """A request answered without running: FastAPI's status and body for it."""

    status: int
    body: bytes
    content_type: bytes = b"application/json"


# FastAPI's answer when rendering its own 422 fails (an input that JSON cannot carry, such as
# NaN): Starlette's 500.
_UNRENDERABLE = Invalid(500, b"Internal Server Error", b"text/plain; charset=utf-8")
_UNPARSABLE = Invalid(400, render_json({"detail": "There was an error parsing the body"}))


def parse(body: bytes, content_type: bytes | None) -> RunCodeRequest | Invalid:
    """The request in `body`, or how FastAPI answers it."""
    if not body:
        # FastAPI's error for a required body that is absent.
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        return _invalid([missing])
    value: Any = body  # not JSON by its content type: validated as bytes, as FastAPI does
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
        return Invalid(422, render_json({"detail": jsonable_encoder(errors)}))
    except ValueError:
        return _UNRENDERABLE
