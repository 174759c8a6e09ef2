"""run_code: one Sandbox Fusion request, run in a micro-VM, answered as the service answers.

Data flows one way: request -> case files -> hluk -> raw outcome -> response. Nothing here
raises into the caller: a bad request is an error value, a backend failure a SandboxError
response, as verl's call_sandbox_api returns them.
"""

from __future__ import annotations

import base64
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from .. import deadlines
from ..errors import BackendError, CauseCounts, InvalidRequest, Refused
from ..guest import protocol
from ..hluk import ending, watch
from ..hluk.binary import hluk_path
from ..outcome import RawOutcome
from . import builds, casedir, cluster, compiled, failures, gate, packages, pytest_library, ready
from .guests import CASE_MOUNT, LANGUAGE_IMAGES, Guest, guest_for, workload_code
from .response import (
    CASE_CANCELLED,
    Response,
    compile_failed,
    response_for,
    sandbox_error,
    time_limit_exceeded,
    transpile_failed,
    with_compile_result,
)
from .url import parse_url
from .warmup import Warmth

logger = logging.getLogger("verl_hyperlight")

MAX_CODE_BYTES = 16 * 1024 * 1024
MAX_STDIN_BYTES = 256 * 1024 * 1024
DEFAULT_RUN_TIMEOUT = 10.0
DEFAULT_COMPILE_TIMEOUT = 10.0  # Sandbox Fusion's, for a request that gives none
MAX_PATH_LENGTH = 4096
MIB = 1024 * 1024
# A request file whose name holds this is skipped, as the service skips it.
IGNORED_FILE = "IGNORE_THIS_FILE"
# Sandbox Fusion's languages: a request for one of these is valid; those not in RUNS are
# answered SandboxError, saying which run here.
SandboxFusionLanguage = Literal[
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
SANDBOX_FUSION_LANGUAGES = frozenset(get_args(SandboxFusionLanguage))
# What runs here: a solution as `python solution.py`, a test file as `pytest FILE`, a program
# compiled on the host (case/compiled.py) and run in the guest (Java's in its own image), or a
# solution in the image of its language (guests.LANGUAGE_IMAGES: `node solution.js`),
# TypeScript transpiled to it first.
RUNS = tuple(dict.fromkeys(("python", "pytest", *compiled.LANGUAGES, *LANGUAGE_IMAGES)))


@dataclass(frozen=True)
class Case:
    """A validated request."""

    guest: Guest
    code: bytes
    stdin: bytes
    run_timeout: float
    files: tuple[tuple[str, bytes], ...] = ()  # to write before the solution starts
    fetch: tuple[str, ...] = ()  # to return once it has ended
    program_name: str | None = None  # `code` is a compiled program, run by this name


# Requests in a language only Sandbox Fusion runs: the client's doing, not the backend's, so
# said once per language at WARNING and not counted as backend failures.
unsupported_languages = CauseCounts()


def encode_text(name: str, text: object, limit: int) -> bytes:
    """A request's text `name` as UTF-8; InvalidRequest when it is not a string, not valid
    Unicode, or more than `limit` bytes."""
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


def _timeout(name: str, value: object, default: float | None = None) -> float:
    if value is None:
        return DEFAULT_RUN_TIMEOUT if default is None else default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{name} must be a number of seconds, not {value!r}")
    if not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a finite number of seconds, not {value!r}")
    return float(value)


def _path(name: str, path: object) -> str:
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_LENGTH:
        raise InvalidRequest(f"{name} paths must be strings of 1 to {MAX_PATH_LENGTH} characters")
    return path


def _files(files: object) -> tuple[tuple[str, bytes], ...]:
    """The request's files, decoded; skipped as the service skips them: null content, or a
    name holding IGNORE_THIS_FILE."""
    if files is None:
        return ()
    if not isinstance(files, dict):
        raise InvalidRequest("files must map paths to base64 text or None")
    if len(files) > protocol.MAX_FILES:
        raise InvalidRequest(f"files holds {len(files)} files; at most {protocol.MAX_FILES}")
    decoded, total = [], 0
    for path, content in files.items():
        _path("files", path)
        if content is not None and not isinstance(content, str):
            raise InvalidRequest(f"files[{path!r}] must be base64 text or None")
        if content is None or IGNORED_FILE in path:
            continue
        try:
            data = base64.b64decode(content, validate=True)
        except ValueError as exc:
            raise Refused(f"files[{path!r}] is not valid base64: {exc}") from None
        total += len(data)
        if total > protocol.FILES_IN_LIMIT:
            raise InvalidRequest(
                f"files hold more than {protocol.FILES_IN_LIMIT // MIB} MiB once decoded"
            )
        decoded.append((path, data))
    return tuple(decoded)


def _fetch(fetch_files: object) -> tuple[str, ...]:
    if fetch_files is None:
        return ()
    if not isinstance(fetch_files, list | tuple):
        raise InvalidRequest("fetch_files must be a list of paths")
    if len(fetch_files) > protocol.MAX_FILES:
        raise InvalidRequest(
            f"fetch_files holds {len(fetch_files)} paths; at most {protocol.MAX_FILES}"
        )
    return tuple(_path("fetch_files", path) for path in fetch_files)


def _validate(
    url: object,
    code: object,
    stdin: object,
    run_timeout: float,
    memory_limit_mb: object,
    files: object,
    fetch_files: object,
    language: str = "python",
) -> Case:
    guest = guest_for(url, memory_limit_mb, language)  # type: ignore[arg-type]
    return Case(
        guest=guest,
        code=encode_text("code", code, MAX_CODE_BYTES),
        stdin=b"" if stdin is None else encode_text("stdin", stdin, MAX_STDIN_BYTES),
        run_timeout=run_timeout,
        files=_files(files),
        fetch=_fetch(fetch_files),
    )


def _run_case(path: str, case: Case, cancel: threading.Event | None) -> Response:
    """Run `case` through its gate: in one of its guest's ready guests, or in a micro-VM
    started for it, whose case directory is made once, for its retry too."""
    limits = deadlines.for_case(case.run_timeout)
    files = casedir.files_of(case.code, case.stdin, case.files, case.fetch, case.program_name)
    made: list[casedir.CaseDir] = []

    def own(meanwhile: Callable[[], None]) -> RawOutcome:
        if not made:
            made.append(casedir.make(files))
        case_dir = made[0]

        def run(argv: list[str], nonce: str) -> RawOutcome:
            return watch.run(
                argv, nonce, limits, cwd=case_dir.workdir, cancel=cancel, meanwhile=meanwhile
            )

        return gate.fresh_run(
            path,
            case.guest,
            lambda nonce: workload_code(case.guest, CASE_MOUNT, nonce),
            run,
            mount=case_dir.mount(CASE_MOUNT),
        )

    def attempt(found: gate.Gate) -> RawOutcome:
        return found.ready_guests.run_case(files, limits, cancel, own)

    try:
        outcome = gate.run_through_gate(
            path, case.guest, attempt, limits, CASE_CANCELLED, cancel=cancel
        )
        return response_for(outcome, path, case.run_timeout, case.fetch, case.guest.image.driver)
    finally:
        for case_dir in made:
            case_dir.remove()


def response_or_error(body: Callable[[], Response]) -> tuple[Response | None, str | None]:
    """`body`'s response as verl's call_sandbox_api returns it, ``(response, None)``; never
    raises: a request that cannot be run as given is ``(None, error)``, a refused one or a
    backend failure a SandboxError response (the failure logged once per cause), and a bug of
    this package's too, its traceback logged once per cause."""
    try:
        return body(), None
    except InvalidRequest as exc:
        return None, f"Invalid request: {exc}"
    except Refused as exc:
        return sandbox_error(str(exc)), None
    except BackendError as exc:
        failures.log.backend(exc)
        return sandbox_error(str(exc)), None
    except Exception as exc:
        failures.log.internal(exc)
        return sandbox_error(f"verl-hyperlight internal error: {exc!r}"), None


def run_code(
    sandbox_fusion_url: str,
    code: str,
    stdin: str | None,
    compile_timeout: float | None,
    run_timeout: float | None,
    memory_limit_mb: int | None,
    language: str = "python",
    *,
    files: dict[str, str | None] | None = None,
    fetch_files: list[str] | None = None,
    cancel: threading.Event | None = None,
) -> tuple[dict[str, Any] | None, str | None]:
    """Run `code` on `stdin` in a fresh micro-VM, with the arguments and return shape of
    verl's ``call_sandbox_api``: ``(response, None)`` with Sandbox Fusion's response, or
    ``(None, error)`` for a request that cannot be run as given.

    As the service's request does, `files` maps paths to base64 content written (in the
    micro-VM only) relative to the solution's directory before it starts, and `fetch_files`
    names files returned base64 in the response's ``files`` once it has ended. Setting
    `cancel` stops the case: its micro-VM is killed and it is answered SandboxError (a
    ``verl_hyperlight.cancel.Cancel`` wakes the case's waits when set; a plain Event is looked
    at every 0.2 s).
    `language` "pytest" runs `code` as a test file under `pytest FILE` (with the `pytest`
    extra installed); "cpp", "go" and "rust" compile it on the host first (within
    `compile_timeout`, Python having no compile step); languages other than these are answered
    SandboxError."""
    return response_or_error(
        lambda: answer(
            sandbox_fusion_url,
            code,
            stdin,
            run_timeout,
            memory_limit_mb,
            language,
            files=files,
            fetch_files=fetch_files,
            cancel=cancel,
            compile_timeout=compile_timeout,
        )
    )


def answer(
    sandbox_fusion_url: str,
    code: str,
    stdin: str | None,
    run_timeout: float | None,
    memory_limit_mb: int | None,
    language: str = "python",
    *,
    files: dict[str, str | None] | None = None,
    fetch_files: list[str] | None = None,
    cancel: threading.Event | None = None,
    compile_timeout: float | None = None,
) -> Response:
    """run_code's response, raising what run_code answers as values: InvalidRequest for a
    request that cannot be run as given, BackendError (its `diagnosis` apart) for a failure of
    the backend, Refused for a case refused or cancelled. For a caller that renders a failure
    itself (doctor)."""
    if language not in RUNS:
        if isinstance(language, str) and language in SANDBOX_FUSION_LANGUAGES:
            message = (
                f"verl-hyperlight runs {', '.join(RUNS)}; language {language!r} is not supported"
            )
            if unsupported_languages.first(language):
                logger.warning(
                    "verl-hyperlight: %s (its cases are answered SandboxError and score -1; "
                    "said once per language)",
                    message,
                )
            return sandbox_error(message)
        raise InvalidRequest(f"unknown language {language!r}")
    timeout = _timeout("run_timeout", run_timeout)
    to_compile = _timeout("compile_timeout", compile_timeout, DEFAULT_COMPILE_TIMEOUT)
    case = _validate(
        sandbox_fusion_url, code, stdin, timeout, memory_limit_mb, files, fetch_files, language
    )
    parsed = parse_url(sandbox_fusion_url) if "?" in sandbox_fusion_url else None
    if parsed is not None and parsed.ray is not None:
        # Validated here, run there: the node's run_code answers as hyperlight:// does.
        arguments = (
            parsed.local,
            code,
            stdin,
            compile_timeout,
            run_timeout,
            memory_limit_mb,
            language,
        )
        options = {"files": files, "fetch_files": fetch_files}
        response: Response | None
        response, error = cluster.run(
            parsed.ray, run_code, arguments, options, cancel, CASE_CANCELLED
        )
        if error is not None or response is None:
            raise InvalidRequest(str(error).removeprefix("Invalid request: "))
        return response
    if language == "pytest":
        try:
            library = pytest_library.library()
        except pytest_library.Missing as exc:
            failures.log.record("pytest-missing", str(exc), "its pytest cases score -1")
            return sandbox_error(str(exc))
        case = replace(case, guest=replace(case.guest, pytest_library=library))
    if language in compiled.BUILT:
        return _built_case(case, language, to_compile, cancel)
    if timeout <= 0:
        return time_limit_exceeded()  # as the service answers it, at once
    response = _run_case(hluk_path(), case, cancel)
    packages.note(response, case.guest.image)
    return response


def _built_case(
    case: Case, language: str, compile_timeout: float, cancel: threading.Event | None
) -> Response:
    """Compile (cpp, go, rust) or transpile (typescript) the case's code on the host, then run
    what it built as a case. A compiled language's response has its compile_result, and no
    run when the compile failed, as the service answers; TypeScript's has none (Sandbox
    Fusion runs it with tsx, which has no compile step), a syntax error being the run's failure
    with the transpiler's words."""
    path = hluk_path()  # before the compile: a node without hluk says so at once
    try:
        built = builds.build(language, case.code, compile_timeout, cancel)
    except BackendError as exc:
        # This node cannot compile the language: its cases fail, the others run.
        failures.log.record(exc.cause, str(exc), f"its {language} cases score -1")
        return sandbox_error(str(exc))
    transpiled = language in compiled.TRANSPILED
    if built.program is None:
        return transpile_failed(built.result) if transpiled else compile_failed(built.result)
    if transpiled:
        if case.run_timeout <= 0:
            return time_limit_exceeded()
        return _run_case(path, replace(case, code=built.program), cancel)
    if case.run_timeout <= 0:
        return with_compile_result(time_limit_exceeded(), built.result)
    program = replace(case, code=built.program, program_name=compiled.PROGRAM_NAMES[language])
    return with_compile_result(_run_case(path, program, cancel), built.result)


def warm_up(url: str, memory_limit_mb: int | None, language: str = "python") -> Warmth | None:
    """See the guest of `url`, `memory_limit_mb` and `language` warm on this node, as a reward
    worker does before its first case (an image pull and a warm snapshot, if need be, under
    the node's lock): what the probe found, or None when it was seen warm already;
    BackendError when it cannot be."""
    return gate.ensure_ready(hluk_path(), guest_for(url, memory_limit_mb, language))


def close() -> None:
    """End what this process keeps for its cases: its ready guests (waited for: their hluks
    killed and reaped, their directories removed) and what its gates know of each guest; the
    next case probes its guest again; and the hluks of answered cases still tearing their
    guests down (hluk/ending.py), waited for to their end. serve calls it when it stops; a
    process that exits ends its ready guests itself."""
    gate.forget()
    ending.wait(deadlines.EXIT_GRACE_SECONDS + 1)


def ready_guests() -> ready.Counts:
    """This process's ready guests: waiting now, and cases run in one so far (serve's
    metrics)."""
    return ready.counts()
