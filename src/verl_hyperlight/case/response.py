"""How the answer is shaped: Sandbox Fusion's /run_code response, key for key."""

from __future__ import annotations

import base64
from typing import Any

from .. import diagnosis
from ..errors import Refused
from ..guest.protocol import FILE_LEFT_OUT, FILES_OUT_LIMIT, OUTPUT_LIMIT, OUTPUT_LIMIT_STATUS
from ..outcome import Ending, RawOutcome, Verdict

Response = dict[str, Any]
# Why a case its caller cancelled is answered SandboxError.
CASE_CANCELLED = "the case was cancelled before it ended"
# The return code of a solution whose guest kernel aborted (hluk's answer to a guest out of
# memory): that of a process the kernel's OOM killer killed, as Sandbox Fusion's host reports it.
GUEST_ABORTED_RETURN_CODE = 137


def _decode(data: memoryview) -> str:
    # As Sandbox Fusion decodes a stream: UTF-8, else a "[DecodeError]" text. Decoded straight
    # from where the output was received: the text is the only copy made.
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError as exc:
        return f"[DecodeError] {exc}"


def _response(
    status: str,
    message: str,
    run_result: dict[str, Any] | None,
    files: dict[str, str] | None = None,
) -> Response:
    return {
        "status": status,
        "message": message,
        "compile_result": None,
        "run_result": run_result,
        "executor_pod_name": None,
        "files": files or {},
    }


def time_limit_exceeded() -> Response:
    """A run_timeout of zero or less, answered as the service answers it: at once."""
    run = {
        "status": "TimeLimitExceeded",
        "execution_time": 0.0,
        "return_code": None,
        "stdout": "",
        "stderr": "",
    }
    return _response("Failed", "", run)


def _fetched(outcome: RawOutcome, fetch: tuple[str, ...]) -> tuple[dict[str, str], str]:
    """The fetched files, base64 under the paths the request named (those missing left out,
    as the service leaves them out), and a message naming those past the limit."""
    files = {
        fetch[index]: base64.b64encode(data).decode("ascii")
        for index, data in outcome.fetched.items()
    }
    assert outcome.end is not None
    left_out = [
        fetch[index] for index, size in enumerate(outcome.end.files) if size == FILE_LEFT_OUT
    ]
    message = ""
    if left_out:
        message = (
            f"fetch_files: {len(left_out)} left out, past {FILES_OUT_LIMIT // (1024 * 1024)} "
            f"MiB in all: {', '.join(left_out)[:1000]}"
        )
    return files, message


def compile_failed(compile_result: dict[str, Any]) -> Response:
    """A compile that failed or ran out of time: Failed, with no run, as the service answers."""
    response = _response("Failed", "", None)
    response["compile_result"] = compile_result
    return response


def transpile_failed(transpile_result: dict[str, Any]) -> Response:
    """A transpile (TypeScript's) that failed or ran out of time, answered as the service
    answers a tsx run that failed before the program: Failed, the transpiler's status and
    words as the run's, no compile_result."""
    if transpile_result["status"] == "TimeLimitExceeded":
        return _response("Failed", "", {**transpile_result, "stdout": "", "stderr": ""})
    return _response("Failed", "", dict(transpile_result))


def with_compile_result(response: Response, compile_result: dict[str, Any]) -> Response:
    """`response`, a compiled program's run, with the compile that built it."""
    response["compile_result"] = compile_result
    return response


def sandbox_error(message: str) -> Response:
    """The sandbox itself failed: verl scores it as sandbox_error, never as a wrong answer."""
    return _response("SandboxError", message, None)


def from_outcome(
    outcome: RawOutcome, run_timeout: float, fetch: tuple[str, ...] = (), driver: str = "python"
) -> Response:
    """The response for a run that the solution's own doing ended; the files of `fetch` that
    the runner copied out come back in its ``files``. `driver`: the image's (what a guest that
    aborted means there)."""
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
    status, elapsed, stdout, stderr = _finished(outcome, driver)
    files, message = _fetched(outcome, fetch) if ending is Ending.FINISHED else ({}, "")
    run = {
        "status": "Finished",
        "execution_time": elapsed,
        "return_code": status,
        "stdout": stdout,
        "stderr": stderr,
    }
    return _response("Failed" if status != 0 else "Success", message, run, files)


def _finished(outcome: RawOutcome, driver: str) -> tuple[int, float, str, str]:
    """A run that ended before its time limit: its return code, time, stdout and stderr, by
    how it ended (the runner's report, or the guest's end around it)."""
    ending = outcome.ending
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
    elif ending is Ending.GUEST_ABORTED:
        # hluk has no handling of a guest out of memory: its kernel aborts, and whatever of the
        # output was not copied out is lost. Answered as an OOM kill, never as a backend failure.
        status = GUEST_ABORTED_RETURN_CODE
        stdout = ""
        stderr = f"{outcome.hluk_error}\n{diagnosis.guest_aborted(driver, status)}"
    else:
        assert ending is Ending.BROKEN, ending
        # hluk ended with the status of the runner's failed call: the solution broke what the
        # runner reports with. Whatever of its output came is kept; it is its failure.
        status = outcome.hluk_status if outcome.hluk_status else 1
        stderr += (
            f"\nverl-hyperlight: the run ended without the runner's report (status {status}): "
            "the solution broke the runner (closed or replaced what it reports with)\n"
        )
    return status, elapsed, stdout, stderr


def response_for(
    outcome: RawOutcome,
    path: str,
    run_timeout: float,
    fetch: tuple[str, ...] = (),
    driver: str = "python",
) -> Response:
    """The response to a run (a case's, or a notebook call's): from its outcome when its
    ending is the solution's, else Refused or the BackendError it stands for."""
    verdict = outcome.verdict
    if verdict is Verdict.SOLUTIONS:
        return from_outcome(outcome, run_timeout, fetch, driver)
    if verdict is Verdict.REFUSED:
        raise Refused(outcome.refusal)
    if verdict is Verdict.CANCELLED:
        raise Refused(CASE_CANCELLED)
    raise diagnosis.failure(outcome, path)
