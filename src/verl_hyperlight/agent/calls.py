"""The code tool of verl's agent loop, apart from verl: its settings, how calls are bounded,
and the text the model reads back.

``tool.py`` is the verl class around this (the only module that imports verl). Each call runs
through ``run_code``, the one path a case takes, in a worker thread of the tool's own: at most
``num_workers`` at once per process, at most ``max_queue`` more waiting, and, if
``rate_limit`` is given, at most that many started per second. No Ray actor is involved.

With ``session: trajectory`` a trajectory's Python calls run in a notebook of its own
(``notebook.Notebook``, kept in the tool's ``pool``): one micro-VM kept up across its calls,
one call at a time. A trajectory whose state was lost, whatever the reason, is told so by its
next call's answer.
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

from .. import cancel as cancels
from .. import diagnosis, node
from ..case import cluster
from ..case.api import run_code
from ..case.guests import guest_for
from ..case.url import is_http, is_ours, parse_url
from ..errors import BackendError, CauseCounts, InvalidRequest
from .pool import NotebookPool, PooledNotebook

logger = logging.getLogger("verl_hyperlight")

# What the removed SandboxFusionTool answered when the run did not finish: published recipes
# were trained on it.
NO_STDOUT = "no stdout here"
# What the model reads when the code could not be run at all: neutral, never our traceback.
NOT_RUN = "The code could not be run: the sandbox failed (not an error in the code)."
BUSY = "The code could not be run: too many calls are waiting for the sandbox."
NOTEBOOKS_FULL = (
    "The code could not be run: too many notebook sessions are open in the sandbox; "
    "try again later."
)
# Added to the answer of a notebook call that ended its notebook.
NOTEBOOK_RESTARTED = (
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


def _sandbox_url(config: Mapping[str, object]) -> str:
    """The config's sandbox_fusion_url: a well-formed one of ours, or an http(s) URL."""
    url = config.get("sandbox_fusion_url")
    if not isinstance(url, str) or not url:
        raise ValueError(
            "code tool config: sandbox_fusion_url is not set: hyperlight:// runs each call "
            "in a local micro-VM; an http(s) URL sends it to that Sandbox Fusion service"
        )
    if is_ours(url):
        try:
            parse_url(url)
        except InvalidRequest as exc:
            raise ValueError(f"code tool config: sandbox_fusion_url: {exc}") from None
    elif not is_http(url):
        raise ValueError(
            f"code tool config: sandbox_fusion_url {url!r} is neither hyperlight://... "
            "nor an http(s) URL"
        )
    return url


# verl's default count of agent-loop worker processes (actor_rollout_ref.rollout.agent.
# num_workers), each of which holds the tool.
AGENT_LOOP_WORKERS = 8


def default_max_sessions(num_workers: int, micro_vm_mb: int) -> int:
    """Notebooks up at once per process by default: the notebooks of verl's 8 agent-loop
    workers, each holding its micro-VM's whole memory (what a call may fill), within the
    node's share for notebooks (node.notebooks_memory_mb); never fewer than `num_workers`, the
    calls that run at once anyway."""
    share = node.notebooks_memory_mb()
    return max(num_workers, share // (AGENT_LOOP_WORKERS * micro_vm_mb))


def sessions_on_the_cluster(resource: str, num_workers: int) -> int:
    """Notebooks up at once per process by default with ``?ray``: each holds one unit of
    `resource` on the cluster's nodes, so verl's 8 agent-loop workers share the units the
    cluster offers now; never fewer than `num_workers`, the calls that run at once anyway (a
    notebook that finds no unit free within its start-up deadline is answered so: no call
    waits for one without end). Where the units cannot be known (no node offers them yet, no
    cluster reached), `num_workers`, said once."""
    try:
        units = int(cluster.units(resource))
    except BackendError as exc:
        why = f"the cluster cannot be reached ({exc.diagnosis.what})"
    else:
        if units > 0:
            return max(num_workers, units // AGENT_LOOP_WORKERS)
        why = f"no node offers {resource!r} yet"
    _once.warn(
        f"sessions-{resource}",
        f"the code tool's max_sessions defaults to num_workers ({num_workers}): {why}; set "
        f"max_sessions to the units of {resource!r} the cluster offers, divided among the "
        "agent-loop workers",
    )
    return num_workers


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
    notebook_per_trajectory: bool = False  # `session: trajectory`
    session_idle_timeout: float = 300.0
    max_sessions: int = 10  # from_config sizes it by default_max_sessions

    @property
    def in_micro_vms(self) -> bool:
        return is_ours(self.url)

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> ToolSettings:
        """Settings from a tool config; ValueError naming the key that is wrong."""
        url = _sandbox_url(config)
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
        if session == "trajectory" and not is_ours(url):
            raise ValueError(
                "code tool config: session: trajectory needs sandbox_fusion_url hyperlight://; "
                "a Sandbox Fusion service keeps no state between calls"
            )
        idle = _positive(config, "session_idle_timeout", cls.session_idle_timeout)
        assert idle is not None
        max_sessions = num_workers  # without notebooks, a value never used
        if session == "trajectory":
            try:
                micro_vm_mb = guest_for(url, memory).memory_mb
            except InvalidRequest as exc:
                raise ValueError(f"code tool config: memory_limit_mb: {exc}") from None
            resource = parse_url(url).ray
            if resource is None:
                max_sessions = default_max_sessions(num_workers, micro_vm_mb)
            elif "max_sessions" not in config:
                max_sessions = sessions_on_the_cluster(resource, num_workers)
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
            notebook_per_trajectory=session == "trajectory",
            session_idle_timeout=idle,
            max_sessions=_count(config, "max_sessions", max_sessions),
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
    """The text the model reads back; with NOTEBOOK_RESTARTED after it when the call ended its
    notebook (`restarted`)."""
    text = _answer(response, settings, call)
    if restarted:
        return f"{text}{'' if not text or text.endswith(chr(10)) else chr(10)}{NOTEBOOK_RESTARTED}"
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


class _Once(CauseCounts):
    """Messages logged once per process (a backend failure is logged by run_code itself)."""

    def warn(self, key: str, message: str) -> None:
        if self.first(key):
            logger.warning("verl-hyperlight: %s", message)


_once = _Once()


class CodeRunner:
    """Runs tool calls, bounded: `num_workers` at once, `max_queue` waiting, `rate_limit`
    started per second.

    Who gives back what: a call's place among those bounds is given back by the done-callback
    of its job in the executor (when its thread ends, or at once when it is cancelled while
    still queued); a notebook call's notebook and turn likewise. A cancelled coroutine gives
    back only what no thread of it holds."""

    def __init__(self, settings: ToolSettings, service: ServiceCall | None = None) -> None:
        if not settings.in_micro_vms and service is None:
            raise ValueError(f"code tool config: {settings.url!r} needs verl's HTTP client")
        self.settings = settings
        self.service = service
        self.executor = ThreadPoolExecutor(settings.num_workers, "verl-hyperlight-tool")
        self.rate = _StartRate(settings.rate_limit) if settings.rate_limit else None
        self.lock = threading.Lock()
        self.admitted = 0  # calls running or waiting
        self.notebooks = (
            NotebookPool(
                settings.url,
                settings.memory_limit_mb,
                settings.max_sessions,
                settings.session_idle_timeout,
            )
            if settings.notebook_per_trajectory
            else None
        )
        # Where a call outside a notebook runs, as its URL says.
        self.run_stateless = (
            self._run_in_micro_vm if settings.in_micro_vms else self._run_on_service
        )

    async def call(
        self,
        parameters: Mapping[str, object],
        notebook_key: str | None = None,
        trajectory: object | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """Run one call (in the notebook of `notebook_key`, with `session: trajectory`; given
        `trajectory`, an object alive exactly as long as the trajectory, such as verl's
        AgentData, in one of its own, ended when it is collected); the text for the model and
        the call's metrics. Never raises for a failure to run: the model reads a neutral text
        instead."""
        call = call_from(parameters, self.settings)
        if self.notebooks is None or notebook_key is None or call.language != "python":
            return await self._bounded(call, None, None)
        key = self.notebooks.key_of(notebook_key, trajectory)
        pooled = self.notebooks.take(key)
        if pooled is None:
            _once.warn("notebooks", diagnosis.notebooks_full(self.settings.max_sessions))
            return NOTEBOOKS_FULL, {**metrics(None), "status": "sessions-full"}
        turn = pooled.turn.wait()
        try:
            if not turn.done():  # a trajectory's calls, one after another
                await asyncio.wrap_future(turn)
        except asyncio.CancelledError:
            pooled.turn.give_up(turn)
            self.notebooks.put_back(key, pooled)  # nothing of this call ran in it
            raise
        notebooks = self.notebooks

        def done() -> None:  # the call's thread has ended, or it was never given one
            notebooks.put_back(key, pooled)
            pooled.turn.pass_on()

        return await self._bounded(call, (key, pooled), done)

    def release(self, notebook_key: str) -> None:
        """End the notebook of `notebook_key`, if it has one."""
        if self.notebooks is not None:
            self.notebooks.release(notebook_key)

    async def _bounded(
        self,
        call: Call,
        notebook: tuple[str, PooledNotebook] | None,
        done: Callable[[], None] | None,
    ) -> tuple[str, dict[str, Any]]:
        """The call run in a worker thread within the bounds; `done` is called once nothing of
        it runs any more."""
        with self.lock:
            busy = self.admitted >= self.settings.num_workers + self.settings.max_queue
            if not busy:
                self.admitted += 1
        if busy:
            if done is not None:
                done()
            _once.warn(
                "busy", diagnosis.tool_busy(self.settings.num_workers, self.settings.max_queue)
            )
            return BUSY, {**metrics(None), "status": "busy"}

        def ended(_: object) -> None:
            with self.lock:
                self.admitted -= 1
            if done is not None:
                done()

        cancel = cancels.Cancel()
        try:
            job = self.executor.submit(self._run, call, cancel, notebook)
        except RuntimeError:  # the runner is closed
            ended(None)
            raise
        job.add_done_callback(ended)
        try:
            response, restarted = await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            cancel.set()  # the trajectory is gone: so is its micro-VM
            raise
        found = metrics(response)
        if notebook is not None:
            found["session_restarted"] = restarted
        return answer(response, self.settings, call, restarted), found

    def _run(
        self, call: Call, cancel: threading.Event, notebook: tuple[str, PooledNotebook] | None
    ) -> tuple[Response | None, bool]:
        """The call's response (None when it could not be run), and whether its answer says
        the notebook's state is gone."""
        try:
            if cancel.is_set():
                return None, False
            if self.rate is not None:
                self.rate.wait(cancel)
            if notebook is not None:
                assert self.notebooks is not None
                response, error, restarted = self.notebooks.run(
                    *notebook, call.code, call.timeout, cancel
                )
            else:
                response, error = self.run_stateless(call, cancel)
                restarted = False
            if response is None:
                # A request the backend refused (a bad config value) or a service that failed:
                # the same for every call, so said once.
                _once.warn(str(error)[:80], f"the code tool's call was not run: {error}")
            return response, restarted
        except Exception as exc:  # never into verl's agent loop
            _once.warn(type(exc).__name__, f"the code tool failed to run a call: {exc!r}")
            return None, False

    def _run_in_micro_vm(
        self, call: Call, cancel: threading.Event
    ) -> tuple[Response | None, str | None]:
        """The call run as a case, in a micro-VM of its own."""
        return run_code(
            self.settings.url,
            call.code,
            None,
            call.timeout,
            call.timeout,
            self.settings.memory_limit_mb,
            call.language,
            cancel=cancel,
        )

    def _run_on_service(
        self, call: Call, cancel: threading.Event
    ) -> tuple[Response | None, str | None]:
        """The call sent to the Sandbox Fusion service of the URL, through verl's client (which
        cannot be cancelled)."""
        assert self.service is not None
        return self.service(
            sandbox_fusion_url=self.settings.url,
            code=call.code,
            stdin=None,
            compile_timeout=call.timeout,
            run_timeout=call.timeout,
            memory_limit_mb=self.settings.memory_limit_mb,
            language=call.language,
        )

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self.notebooks is not None:
            self.notebooks.close()
