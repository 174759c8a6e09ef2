"""The code tool of verl's agent loop, apart from verl: its settings, how calls are bounded,
and the text the model reads back.

``tool.py`` is the verl class around this (the only module that imports verl). Each call runs
through ``run_code``, the one path a case takes, in a worker thread of the tool's own: at most
``num_workers`` at once per process, at most ``max_queue`` more waiting, and, if
``rate_limit`` is given, at most that many started per second. No Ray actor is involved.

With ``session: trajectory`` a trajectory's Python calls run in a notebook of its own
(``_session.Notebook``): one micro-VM kept up across its calls, one call at a time, ended by
``release`` of the instance it is keyed by, by ``session_idle_timeout`` idle, or by a call that
does not end cleanly (its time limit). At most ``max_sessions`` are up per process.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ._api import run_code
from ._errors import FirstTimes
from ._guest import SCHEME
from ._session import Notebook

logger = logging.getLogger("verl_hyperlight")

# What the removed SandboxFusionTool answered when the run did not finish: published recipes
# were trained on it.
NO_STDOUT = "no stdout here"
# What the model reads when the code could not be run at all: neutral, never our traceback.
NOT_RUN = "The code could not be run: the sandbox failed (not an error in the code)."
BUSY = "The code could not be run: too many calls are waiting for the sandbox."
SESSIONS_FULL = (
    "The code could not be run: too many notebook sessions are open in the sandbox; "
    "try again later."
)
# Added to the answer of a notebook call that ended its notebook.
SESSION_ENDED = (
    "The notebook was restarted: variables, imports and files from earlier calls are gone."
)
# Of a failed run's stderr, the end is shown with detailed_errors (a traceback's last lines).
STDERR_TAIL_CHARS = 2000
DEFAULT_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "A tool for executing code.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The code to execute."},
            },
            "required": ["code"],
        },
    },
}
# The config keys the tool reads; `type` is verl's, `enable_global_rate_limit` the removed
# tool's Ray rate limiter, which is not needed here (accepted so its YAML works unchanged).
KNOWN_KEYS = frozenset(
    [
        "type", "sandbox_fusion_url", "num_workers", "max_queue", "rate_limit",
        "enable_global_rate_limit", "default_timeout", "default_language", "memory_limit_mb",
        "detailed_errors", "print_last_expression", "session", "session_idle_timeout",
        "max_sessions",
    ]
)  # fmt: skip

Response = dict[str, Any]
# verl's call_sandbox_api, for http(s) URLs: (url, code, stdin, compile_timeout, run_timeout,
# memory_limit_mb, language) -> (response, error).
ServiceCall = Callable[..., tuple[Response | None, str | None]]


def _positive(config: Mapping[str, object], key: str, default: float | None) -> float | None:
    value = config.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"code tool config: {key} must be a positive number, not {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"code tool config: {key} must be a positive number, not {value!r}")
    return float(value)


def _count(config: Mapping[str, object], key: str, default: int) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"code tool config: {key} must be a whole number of 1 or more")
    return value


def _flag(config: Mapping[str, object], key: str) -> bool:
    value = config.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"code tool config: {key} must be true or false, not {value!r}")
    return value


@dataclass(frozen=True)
class ToolSettings:
    """The tool's config, with the removed SandboxFusionTool's keys and defaults."""

    url: str
    num_workers: int = 10
    max_queue: int = 160
    rate_limit: float | None = None  # calls started per second, per process
    default_timeout: float = 30.0
    default_language: str = "python"
    memory_limit_mb: int | None = 1024
    detailed_errors: bool = False
    print_last_expression: bool = False
    session: bool = False  # `session: trajectory`: a notebook per trajectory
    session_idle_timeout: float = 300.0
    max_sessions: int = 4 * 10  # 4 x num_workers by default

    @property
    def in_micro_vms(self) -> bool:
        return self.url[: len(SCHEME)].lower() == SCHEME

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> ToolSettings:
        """Settings from a tool config; ValueError naming the key that is wrong."""
        url = config.get("sandbox_fusion_url")
        if not isinstance(url, str) or not url:
            raise ValueError(
                "code tool config: sandbox_fusion_url is not set: hyperlight:// runs each call "
                "in a local micro-VM; an http(s) URL sends it to that Sandbox Fusion service"
            )
        if url[: len(SCHEME)].lower() != SCHEME and not url.lower().startswith(
            ("http://", "https://")
        ):
            raise ValueError(
                f"code tool config: sandbox_fusion_url {url!r} is neither hyperlight://... "
                "nor an http(s) URL"
            )
        unknown = sorted(str(key) for key in config if key not in KNOWN_KEYS)
        if unknown:
            logger.warning(
                "verl-hyperlight: the code tool ignores config keys it does not know: %s",
                ", ".join(unknown),
            )
        num_workers = _count(config, "num_workers", cls.num_workers)
        memory = config.get("memory_limit_mb", cls.memory_limit_mb)
        if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int)):
            raise ValueError("code tool config: memory_limit_mb must be a whole number or null")
        language = config.get("default_language", cls.default_language)
        if not isinstance(language, str):
            raise ValueError("code tool config: default_language must be a string")
        timeout = _positive(config, "default_timeout", cls.default_timeout)
        assert timeout is not None
        session = config.get("session", "none")
        if session not in ("none", "trajectory", None):
            raise ValueError(
                f"code tool config: session must be none or trajectory, not {session!r}"
            )
        in_micro_vms = url[: len(SCHEME)].lower() == SCHEME
        if session == "trajectory" and not in_micro_vms:
            raise ValueError(
                "code tool config: session: trajectory needs sandbox_fusion_url hyperlight://; "
                "a Sandbox Fusion service keeps no state between calls"
            )
        idle = _positive(config, "session_idle_timeout", cls.session_idle_timeout)
        assert idle is not None
        return cls(
            url=url,
            num_workers=num_workers,
            max_queue=_count(config, "max_queue", 16 * num_workers),
            rate_limit=_positive(config, "rate_limit", None),
            default_timeout=timeout,
            default_language=language,
            memory_limit_mb=memory,
            detailed_errors=_flag(config, "detailed_errors"),
            print_last_expression=_flag(config, "print_last_expression"),
            session=session == "trajectory",
            session_idle_timeout=idle,
            max_sessions=_count(config, "max_sessions", 4 * num_workers),
        )


@dataclass(frozen=True)
class Call:
    """One tool call's parameters, as the removed tool read them."""

    code: str
    timeout: float
    language: str


def call_from(parameters: Mapping[str, object], settings: ToolSettings) -> Call:
    code = parameters.get("code", "")
    timeout = parameters.get("timeout", settings.default_timeout)
    if isinstance(timeout, str):
        try:
            timeout = float(timeout)
        except ValueError:
            timeout = settings.default_timeout
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not (math.isfinite(timeout) and timeout > 0)
    ):
        timeout = settings.default_timeout
    language = parameters.get("language", settings.default_language)
    code = code if isinstance(code, str) else str(code)
    if settings.print_last_expression:
        code = display_last_expression(code)
    return Call(
        code=code,
        timeout=float(timeout),
        language=language if isinstance(language, str) else settings.default_language,
    )


_NEWLINE = re.compile(r"\r\n|\r|\n")


def display_last_expression(code: str) -> str:
    """`code` with its final expression statement shown as a notebook cell shows it: its repr
    printed unless it is None (through sys.displayhook), nothing when the cell ends in `;`.
    Code that does not parse is left as it is, for the run to report its error."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    if code.rstrip().endswith(";"):
        return code
    last = tree.body[-1].value
    assert last.end_lineno is not None and last.end_col_offset is not None
    # ast's positions are lines and UTF-8 byte offsets; lines end as the tokenizer ends them.
    data = code.encode("utf-8")
    starts = [0] + [match.end() for match in _NEWLINE.finditer(code)]
    byte_starts = [len(code[:start].encode("utf-8")) for start in starts]
    begin = byte_starts[last.lineno - 1] + last.col_offset
    end = byte_starts[last.end_lineno - 1] + last.end_col_offset
    shown = b"__import__('sys').displayhook((" + data[begin:end] + b"\n))"
    return (data[:begin] + shown + data[end:]).decode("utf-8")


def answer(
    response: Response | None, settings: ToolSettings, call: Call, restarted: bool = False
) -> str:
    """The text the model reads back; with SESSION_ENDED after it when the call ended its
    notebook (`restarted`)."""
    text = _answer(response, settings, call)
    if restarted:
        return f"{text}{'' if not text or text.endswith(chr(10)) else chr(10)}{SESSION_ENDED}"
    return text


def _answer(response: Response | None, settings: ToolSettings, call: Call) -> str:
    run = (response or {}).get("run_result") or {}
    stdout, stderr = run.get("stdout") or "", run.get("stderr") or ""
    finished = run.get("status") == "Finished"
    if not settings.detailed_errors:
        return stdout + stderr if finished else NO_STDOUT
    if response is None or response.get("status") == "SandboxError" or not run:
        return NOT_RUN
    if run.get("status") == "TimeLimitExceeded":
        return f"{stdout}Time limit exceeded: the code ran past {call.timeout:g} s and was stopped."
    return_code = run.get("return_code")
    if finished and return_code == 0:
        return stdout + stderr
    tail = stderr[-STDERR_TAIL_CHARS:]
    if len(stderr) > STDERR_TAIL_CHARS and "\n" in tail:
        tail = tail[tail.index("\n") + 1 :]
    separator = "" if not stdout or stdout.endswith("\n") else "\n"
    heading = f"Exited with return code {return_code}."
    return stdout + separator + (f"{heading} The end of stderr:\n{tail}" if tail else heading)


def metrics(response: Response | None) -> dict[str, Any]:
    """What verl records of a call: the answer's status, the run's status and time."""
    run = (response or {}).get("run_result") or {}
    return {
        "status": response.get("status") if response is not None else "error",
        "run_status": run.get("status"),
        "return_code": run.get("return_code"),
        "execution_time": run.get("execution_time"),
    }


class _StartRate:
    """At most `rate` calls started per second: a token bucket of `rate` tokens (one at least),
    each start taking one, waiting for it when there is none."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate)
        self.tokens = self.capacity
        self.updated = time.monotonic()
        self.lock = threading.Lock()

    def wait(self, cancel: threading.Event) -> None:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
            self.tokens -= 1  # taken now; below zero, a start reserved in the future
            delay = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if delay > 0:
            cancel.wait(delay)


class _Once(FirstTimes):
    """Messages logged once per process (a backend failure is logged by run_code itself)."""

    def warn(self, key: str, message: str) -> None:
        if self.first(key):
            logger.warning("verl-hyperlight: %s", message)


_once = _Once()


class _Session:
    """A trajectory's notebook, and what its calls share: one call at a time (`turn`), how
    many are using it (`users`, under the manager's lock), when it was last used."""

    def __init__(self, notebook: Notebook) -> None:
        self.notebook = notebook
        self._turn: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self.users = 0
        self.last_used = time.monotonic()
        self.released = False

    def turn(self) -> asyncio.Lock:
        """The lock its calls take in turn, on the running event loop (a lock belongs to one)."""
        loop = asyncio.get_running_loop()
        if self._turn is None or self._turn[0] is not loop:
            self._turn = (loop, asyncio.Lock())
        return self._turn[1]


class _Sessions:
    """The process's notebooks, by key (a trajectory's): at most `max_sessions` up; one idle
    past `session_idle_timeout` is closed by a sweeping thread (and before a new one is
    refused). Called from the event loop, so a notebook is closed (its micro-VM killed and
    reaped) in a thread, never there."""

    def __init__(self, settings: ToolSettings) -> None:
        self.settings = settings
        self.lock = threading.Lock()
        self.sessions: dict[str, _Session] = {}
        self.stopping = threading.Event()
        self.sweeper: threading.Thread | None = None

    def take(self, key: str) -> _Session | None:
        """The notebook of `key`, made if it has none (its micro-VM starts with its first
        call); None when `max_sessions` are up and none is idle long enough to be closed."""
        with self.lock:
            session = self.sessions.get(key)
            if session is None:
                if len(self.sessions) >= self.settings.max_sessions:
                    self._close_in_background(self._idle(time.monotonic()))
                if len(self.sessions) >= self.settings.max_sessions:
                    return None
                settings = self.settings
                session = self.sessions[key] = _Session(
                    Notebook(settings.url, settings.memory_limit_mb)
                )
                if self.sweeper is None:
                    self.sweeper = threading.Thread(
                        target=self._sweep, name="verl-hyperlight-sessions", daemon=True
                    )
                    self.sweeper.start()
            session.users += 1
            return session

    def put_back(self, key: str, session: _Session) -> None:
        with self.lock:
            session.users -= 1
            session.last_used = time.monotonic()
            # Released, or ended by a call (its micro-VM is gone): no longer up, so no longer
            # counted against the limit; the key's next call makes a new one.
            ended = session.released or not session.notebook.alive
            if ended and not session.users and self.sessions.get(key) is session:
                del self.sessions[key]
                self._close_in_background([session])

    def release(self, key: str) -> None:
        """End `key`'s notebook, now or once the calls using it are done."""
        with self.lock:
            session = self.sessions.get(key)
            if session is None:
                return
            session.released = True
            if session.users:
                return
            del self.sessions[key]
        session.notebook.close()  # (called in a thread of its own: tool.release)

    def _idle(self, now: float) -> list[_Session]:
        """Take out the notebooks idle past the timeout (under the lock)."""
        expired = [
            key
            for key, session in self.sessions.items()
            if not session.users and now - session.last_used >= self.settings.session_idle_timeout
        ]
        return [self.sessions.pop(key) for key in expired]

    @staticmethod
    def _close(sessions: list[_Session]) -> None:
        for session in sessions:
            session.notebook.close()

    def _close_in_background(self, sessions: list[_Session]) -> None:
        if sessions:
            threading.Thread(
                target=self._close, args=(sessions,), name="verl-hyperlight-close", daemon=True
            ).start()

    def _sweep(self) -> None:
        period = min(30.0, max(0.05, self.settings.session_idle_timeout / 4))
        while not self.stopping.wait(period):
            with self.lock:
                expired = self._idle(time.monotonic())
            self._close(expired)

    def close(self) -> None:
        self.stopping.set()
        with self.lock:
            sessions = list(self.sessions.values())
            self.sessions.clear()
        self._close(sessions)


class CodeRunner:
    """Runs tool calls, bounded: `num_workers` at once, `max_queue` waiting, `rate_limit`
    started per second."""

    def __init__(self, settings: ToolSettings, service: ServiceCall | None = None) -> None:
        if not settings.in_micro_vms and service is None:
            raise ValueError(f"code tool config: {settings.url!r} needs verl's HTTP client")
        self.settings = settings
        self.service = service
        self.executor = ThreadPoolExecutor(settings.num_workers, "verl-hyperlight-tool")
        self.rate = _StartRate(settings.rate_limit) if settings.rate_limit else None
        self.lock = threading.Lock()
        self.admitted = 0  # calls running or waiting
        self.sessions = _Sessions(settings) if settings.session else None

    async def call(
        self, parameters: Mapping[str, object], session: str | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Run one call (in the notebook of `session`, with `session: trajectory`); the text
        for the model and the call's metrics. Never raises for a failure to run: the model
        reads a neutral text instead."""
        call = call_from(parameters, self.settings)
        if self.sessions is None or session is None or call.language != "python":
            return await self._admit(call, None)
        notebook = self.sessions.take(session)
        if notebook is None:
            _once.warn(
                "sessions",
                f"the code tool had {self.settings.max_sessions} notebook sessions up (none "
                "idle) and answered a call at once without running it: raise max_sessions, or "
                "lower session_idle_timeout",
            )
            return SESSIONS_FULL, {**metrics(None), "status": "sessions-full"}
        try:
            async with notebook.turn():  # a trajectory's calls, one after another
                return await self._admit(call, notebook)
        finally:
            self.sessions.put_back(session, notebook)

    def release(self, session: str) -> None:
        """End the notebook of `session`, if it has one."""
        if self.sessions is not None:
            self.sessions.release(session)

    async def _admit(self, call: Call, session: _Session | None) -> tuple[str, dict[str, Any]]:
        with self.lock:
            if self.admitted >= self.settings.num_workers + self.settings.max_queue:
                busy = True
            else:
                busy = False
                self.admitted += 1
        if busy:
            _once.warn(
                "busy",
                f"the code tool had {self.settings.num_workers} calls running and "
                f"{self.settings.max_queue} waiting, and answered a call at once without "
                "running it: raise num_workers or max_queue, or give the node more CPUs",
            )
            return BUSY, {**metrics(None), "status": "busy"}
        cancel = threading.Event()
        loop = asyncio.get_running_loop()
        try:
            response, restarted = await loop.run_in_executor(
                self.executor, self._run, call, cancel, session
            )
        except asyncio.CancelledError:
            cancel.set()  # the trajectory is gone: so is its micro-VM
            raise
        found = metrics(response)
        if session is not None:
            found["session_restarted"] = restarted
        return answer(response, self.settings, call, restarted), found

    def _run(
        self, call: Call, cancel: threading.Event, session: _Session | None
    ) -> tuple[Response | None, bool]:
        """The call's response (None when it could not be run), and whether it ended the
        notebook it ran in."""
        try:
            if cancel.is_set():
                return None, False
            if self.rate is not None:
                self.rate.wait(cancel)
            restarted = False
            if session is not None:
                notebook = session.notebook
                before = notebook.generation if notebook.alive else None
                response, error = notebook.run(call.code, call.timeout, cancel)
                ran = response is not None and response.get("run_result") is not None
                # Its state is gone: lost by this call, or found lost when it came.
                restarted = (ran and not notebook.alive) or (
                    before is not None and notebook.generation != before
                )
            elif self.settings.in_micro_vms:
                response, error = run_code(
                    self.settings.url,
                    call.code,
                    None,
                    call.timeout,
                    call.timeout,
                    self.settings.memory_limit_mb,
                    call.language,
                    cancel=cancel,
                )
            else:
                assert self.service is not None
                response, error = self.service(
                    sandbox_fusion_url=self.settings.url,
                    code=call.code,
                    stdin=None,
                    compile_timeout=call.timeout,
                    run_timeout=call.timeout,
                    memory_limit_mb=self.settings.memory_limit_mb,
                    language=call.language,
                )
            if response is None:
                # A request the backend refused (a bad config value) or a service that failed:
                # the same for every call, so said once.
                _once.warn(str(error)[:80], f"the code tool's call was not run: {error}")
            return response, restarted
        except Exception as exc:  # never into verl's agent loop
            _once.warn(type(exc).__name__, f"the code tool failed to run a call: {exc!r}")
            return None, False
        finally:
            with self.lock:
                self.admitted -= 1

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self.sessions is not None:
            self.sessions.close()
