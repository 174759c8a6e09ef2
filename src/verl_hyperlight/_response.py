"""How the answer is shaped: Sandbox Fusion's /run_code response, key for key."""

from __future__ import annotations

from typing import Any

from ._hluk import Ending, RawOutcome
from .guest.runner import OUTPUT_LIMIT, OUTPUT_LIMIT_STATUS

Response = dict[str, Any]


def _decode(data: bytes) -> str:
    # As Sandbox Fusion decodes a stream: UTF-8, else a "[DecodeError]" text.
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        return f"[DecodeError] {exc}"


def _response(status: str, message: str, run_result: dict[str, Any] | None) -> Response:
    return {
        "status": status,
        "message": message,
        "compile_result": None,
        "run_result": run_result,
        "executor_pod_name": None,
        "files": {},
    }


def sandbox_error(message: str) -> Response:
    """The sandbox itself failed: verl scores it as sandbox_error, never as a wrong answer."""
    return _response("SandboxError", message, None)


def from_outcome(outcome: RawOutcome, run_timeout: float) -> Response:
    """The response for a run whose solution started and ended by its own doing."""
    if outcome.ending in (Ending.TIMED_OUT, Ending.DEADLOCKED):
        # A guest whose every thread blocks forever would run to its timeout under Sandbox
        # Fusion; hluk says so at once, and it is answered as that timeout.
        deadlocked = outcome.ending is Ending.DEADLOCKED
        run = {
            "status": "TimeLimitExceeded",
            "execution_time": max(outcome.host_elapsed, run_timeout),
            "return_code": None,
            "stdout": "",
            "stderr": outcome.hluk_stderr if deadlocked else "",
        }
        return _response("Failed", "", run)
    if outcome.ending is Ending.FINISHED:
        assert outcome.status is not None
        status, stderr = outcome.status, outcome.stderr
        elapsed = outcome.elapsed if outcome.elapsed is not None else outcome.host_elapsed
        if outcome.limit_hit:
            note = (
                f"\nverl-hyperlight: the solution's {outcome.limit_hit} exceeded "
                f"{OUTPUT_LIMIT // (1024 * 1024)} MiB; it was stopped\n"
            )
            stderr += note.encode()
    elif outcome.ending is Ending.CONSOLE_LIMIT:
        # The solution wrote past the console's limit around the runner (to the console's
        # descriptor itself) and was killed: stopped for its output as one that prints too
        # much is, not answered with the status of the SIGKILL that stopped it.
        status = OUTPUT_LIMIT_STATUS
        stderr = outcome.hluk_stderr.encode()
        stderr += b"verl-hyperlight: the solution's console output exceeded its limit; "
        stderr += b"it was stopped\n"
        elapsed = outcome.host_elapsed
    else:
        # The guest process died outside the runner (killed by the guest kernel): hluk's
        # message is all that is left.
        assert outcome.ending is Ending.GUEST_DIED, outcome.ending
        status = outcome.hluk_status if outcome.hluk_status else 1
        stderr = outcome.hluk_stderr.encode()
        elapsed = outcome.host_elapsed
    run = {
        "status": "Finished",
        "execution_time": elapsed,
        "return_code": status,
        "stdout": _decode(outcome.stdout),
        "stderr": _decode(stderr),
    }
    return _response("Failed" if status != 0 else "Success", "", run)
