"""run_code: one Sandbox Fusion request, run in a micro-VM, answered as the service answers.

Data flows one way: request -> case files -> hluk -> raw outcome -> response. Nothing here
raises into the caller: a bad request is an error value, a backend failure a SandboxError
response, as verl's call_sandbox_api returns them.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

from . import _hluk, _warmup
from ._errors import BackendError, InvalidRequest
from ._guest import Guest, guest_for, workload_code
from ._response import Response, from_outcome, sandbox_error

logger = logging.getLogger("verl_hyperlight")

MAX_CODE_BYTES = 16 * 1024 * 1024
MAX_STDIN_BYTES = 256 * 1024 * 1024
DEFAULT_RUN_TIMEOUT = 10.0
STARTUP_TIMEOUT_ENV = "VERL_HYPERLIGHT_STARTUP_TIMEOUT"
DEFAULT_STARTUP_TIMEOUT = 60.0
CASE_MOUNT = "/case"
# Sandbox Fusion's languages: a request for one of these is valid, but only Python runs here.
SANDBOX_FUSION_LANGUAGES = frozenset(
    [
        "python",
        "cpp",
        "nodejs",
        "go",
        "go_test",
        "java",
        "php",
        "csharp",
        "bash",
        "typescript",
        "sql",
        "rust",
        "cuda",
        "lua",
        "R",
        "perl",
        "D_ut",
        "ruby",
        "scala",
        "julia",
        "pytest",
        "junit",
        "kotlin_script",
        "jest",
        "verilog",
        "python_gpu",
        "lean",
        "swift",
        "racket",
    ]
)


@dataclass(frozen=True)
class Case:
    """A validated request."""

    guest: Guest
    code: bytes
    stdin: bytes
    run_timeout: float


class _FailureLog:
    """Backend failures: logged at ERROR once per cause per process, then counted, with a
    reminder at every power of ten so a long run keeps saying it is broken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def record(self, cause: str, message: str) -> None:
        with self._lock:
            count = self.counts[cause] = self.counts.get(cause, 0) + 1
        if count == 1:
            logger.error(
                "verl-hyperlight: %s (every code reward is zero while this lasts)", message
            )
        elif math.log10(count).is_integer():
            logger.error("verl-hyperlight: %d cases failed so far with: %s", count, message)


failures = _FailureLog()


def _encode(name: str, text: object, limit: int) -> bytes:
    if not isinstance(text, str):
        raise InvalidRequest(f"{name} must be a string, not {type(text).__name__}")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"{name} is not valid Unicode text ({exc.reason} at {exc.start})"
        ) from None
    if len(data) > limit:
        raise InvalidRequest(f"{name} is {len(data)} bytes; at most {limit} are accepted")
    return data


def _timeout(name: str, value: object) -> float:
    if value is None:
        return DEFAULT_RUN_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{name} must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidRequest(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)


def _validate(
    url: object, code: object, stdin: object, run_timeout: object, memory_limit_mb: object
) -> Case:
    guest = guest_for(url, memory_limit_mb)  # type: ignore[arg-type]
    return Case(
        guest=guest,
        code=_encode("code", code, MAX_CODE_BYTES),
        stdin=b"" if stdin is None else _encode("stdin", stdin, MAX_STDIN_BYTES),
        run_timeout=_timeout("run_timeout", run_timeout),
    )


def _startup_timeout() -> float:
    try:
        return float(os.environ.get(STARTUP_TIMEOUT_ENV, DEFAULT_STARTUP_TIMEOUT))
    except ValueError:
        return DEFAULT_STARTUP_TIMEOUT


def _run_case(path: str, case: Case) -> Response:
    case_dir = tempfile.mkdtemp(prefix="verl-hyperlight-")
    try:
        with open(os.path.join(case_dir, "solution.py"), "wb") as f:
            f.write(case.code)
        with open(os.path.join(case_dir, "stdin"), "wb") as f:
            f.write(case.stdin)
        for attempt in (1, 2):
            nonce = secrets.token_hex(16)
            argv = [
                path,
                "run",
                *case.guest.args(),
                "--mount",
                f"{case_dir}:{CASE_MOUNT}:ro",
                "--exec",
                workload_code(CASE_MOUNT, nonce),
            ]
            outcome = _hluk.run(argv, nonce, case.run_timeout, _startup_timeout())
            if outcome.started:
                if (
                    outcome.status is None
                    and not outcome.timed_out
                    and not (
                        outcome.hluk_stderr.startswith("error: the guest exited with status")
                        or "deadlocked" in outcome.hluk_stderr
                        or outcome.limit_hit
                    )
                ):
                    raise _hluk.failure_from(outcome, path)
                return from_outcome(outcome, case.run_timeout)
            # Nothing of the solution ran: a backend failure, tried once more.
            failure = _hluk.failure_from(outcome, path)
            if outcome.hluk_status is None or outcome.hluk_status < 0:
                failure = BackendError(
                    f"the micro-VM did not start within {_startup_timeout():.0f} s "
                    f"({STARTUP_TIMEOUT_ENV}); the node may be overloaded: lower "
                    "max_concurrent or reward.num_workers",
                    "startup-timeout",
                )
            if attempt == 2:
                raise failure
            logger.warning("verl-hyperlight: retrying a case that did not start: %s", failure)
        raise AssertionError("unreachable")
    finally:
        shutil.rmtree(case_dir, ignore_errors=True)


def run_code(
    sandbox_fusion_url: str,
    code: str,
    stdin: str | None,
    compile_timeout: float | None,
    run_timeout: float | None,
    memory_limit_mb: int | None,
    language: str = "python",
) -> tuple[dict[str, Any] | None, str | None]:
    """Run `code` on `stdin` in a fresh micro-VM, with the arguments and return shape of
    verl's ``call_sandbox_api``: ``(response, None)`` with Sandbox Fusion's response, or
    ``(None, error)`` for a request that cannot be run as given."""
    del compile_timeout  # Python has no compile step.
    try:
        if language != "python":
            if language in SANDBOX_FUSION_LANGUAGES:
                message = (
                    f"verl-hyperlight runs Python only; language {language!r} is not supported"
                )
                failures.record("language", message)
                return sandbox_error(message), None
            raise InvalidRequest(f"unknown language {language!r}")
        case = _validate(sandbox_fusion_url, code, stdin, run_timeout, memory_limit_mb)
        path = _hluk.hluk_path()
        _warmup.ensure_ready(path, case.guest)
        return _run_case(path, case), None
    except InvalidRequest as exc:
        return None, f"Invalid request: {exc}"
    except BackendError as exc:
        failures.record(exc.cause, str(exc))
        return sandbox_error(str(exc)), None
    except Exception as exc:
        logger.exception("verl-hyperlight: internal error")
        failures.record("internal", f"internal error: {exc!r}")
        return sandbox_error(f"verl-hyperlight internal error: {exc!r}"), None
