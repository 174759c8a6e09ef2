"""How the answer is shaped: Sandbox Fusion's /run_code response, key for key."""

from __future__ import annotations

from typing import Any

from ._hluk import Ending, RawOutcome
from .guest.protocol import OUTPUT_LIMIT, OUTPUT_LIMIT_STATUS

Response = dict[str, Any]


def _decode(data: memoryview) -> str:
    # As Sandbox Fusion decodes a stream: UTF-8, else a "[DecodeError]" text. Decoded straight
    # from where the output was received: the text is the only copy made.
    try:
        return str(data, "utf-8")
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
    """The response for a run that the solution's own doing ended."""
    ending = outcome.ending
    if ending in (Ending.TIMED_OUT, Ending.DEADLOCKED):
        # A guest whose every thread blocks forever would run to its timeout under Sandbox
        # Fusion; hluk says so at once, and it is answered as that timeout.
        run = {
            "status": "TimeLimitExceeded",
            "execution_time": max(outcome.host_elapsed, run_timeout),
            "return_code": None,
            "stdout": "",
            "stderr": outcome.hluk_error + "\n" if ending is Ending.DEADLOCKED else "",
        }
        return _response("Failed", "", run)
    stdout = _decode(outcome.stdout)
    stderr = _decode(outcome.stderr)
    elapsed = outcome.host_elapsed
    if ending is Ending.FINISHED:
        assert outcome.end is not None
        status, elapsed = outcome.end.status, outcome.end.elapsed
        if outcome.end.limit_hit:
            stderr += (
                f"\nverl-hyperlight: the solution's {outcome.end.limit_hit} exceeded "
                f"{OUTPUT_LIMIT // (1024 * 1024)} MiB; it was stopped\n"
            )
    elif ending is Ending.CONSOLE_LIMIT:
        # The solution wrote past the console's limit around the runner (to the console's
        # descriptor itself) and was stopped, as one that prints too much is.
        status = OUTPUT_LIMIT_STATUS
        stderr = (
            "verl-hyperlight: the solution's console output exceeded its limit; it was stopped\n"
        )
    elif ending is Ending.GUEST_DIED:
        # The guest process ended outside the runner (killed by the guest kernel): hluk's
        # message is all that is left. Its output is lost, so it never counts as a success.
        status = outcome.guest_status or 1
        stdout, stderr = "", outcome.hluk_error + "\n"
    else:
        assert ending is Ending.BROKEN, ending
        # hluk ended with the status of the runner's failed call: the solution broke what the
        # runner reports with. Whatever of its output came is kept; it is its failure.
        status = outcome.hluk_status if outcome.hluk_status else 1
        stderr += (
            f"\nverl-hyperlight: the run ended without the runner's report (status {status}): "
            "the solution broke the runner (closed or replaced what it reports with)\n"
        )
    run = {
        "status": "Finished",
        "execution_time": elapsed,
        "return_code": status,
        "stdout": stdout,
        "stderr": stderr,
    }
    return _response("Failed" if status != 0 else "Success", "", run)
