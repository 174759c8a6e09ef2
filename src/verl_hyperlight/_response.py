"""How the answer is shaped: Sandbox Fusion's /run_code response, key for key."""

from __future__ import annotations

from typing import Any

from ._hluk import RawOutcome
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
    """The response for a run whose solution started."""
    deadlocked = outcome.status is None and "deadlocked" in outcome.hluk_stderr
    if outcome.timed_out or deadlocked:
        # A guest whose every thread blocks forever would run to its timeout under Sandbox
        # Fusion; hluk says so at once, and it is answered as that timeout.
        run = {
            "status": "TimeLimitExceeded",
            "execution_time": max(outcome.host_elapsed, run_timeout),
            "return_code": None,
            "stdout": "",
            "stderr": outcome.hluk_stderr if deadlocked else "",
        }
        return _response("Failed", "", run)
    if outcome.status is not None:
        status, stderr = outcome.status, outcome.stderr
        elapsed = outcome.elapsed if outcome.elapsed is not None else outcome.host_elapsed
        if outcome.limit_hit:
            note = (
                f"\nverl-hyperlight: the solution's {outcome.limit_hit} exceeded "
                f"{OUTPUT_LIMIT // (1024 * 1024)} MiB; it was stopped\n"
            )
            stderr += note.encode()
    else:
        # The guest process died outside the runner (killed by the guest kernel, or os-level
        # exit before the runner could report): hluk's message is all that is left.
        status = outcome.hluk_status if outcome.hluk_status else 1
        stderr = outcome.hluk_stderr.encode()
        elapsed = outcome.host_elapsed
        if outcome.limit_hit:
            # The solution wrote past the console's limit around the runner (to the console's
            # descriptor itself) and was killed: stopped for its output as one that prints too
            # much is, not answered with the status of the SIGKILL that stopped it.
            stderr += b"verl-hyperlight: the solution's console output exceeded its limit; "
            stderr += b"it was stopped\n"
            status = OUTPUT_LIMIT_STATUS
    run = {
        "status": "Finished",
        "execution_time": elapsed,
        "return_code": status,
        "stdout": _decode(outcome.stdout),
        "stderr": _decode(stderr),
    }
    return _response("Failed" if status != 0 else "Success", "", run)
