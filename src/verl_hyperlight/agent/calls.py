"""The code tool of verl's agent loop, apart from verl: its settings, how calls are bounded,
and the text the model reads back.

``tool.py`` is the verl class around this (the only module that imports verl). Each call runs
through ``run_code``, the one path a case takes, in a worker thread of the tool's own: at most
``num_workers`` at once per process, at most ``max_queue`` more waiting, and, if
``rate_limit`` is given, at most that many started per second. No Ray actor is involved.

With ``session: trajectory`` a trajectory's Python calls run in a notebook of its own
(``notebook.Notebook``): one micro-VM kept up across its calls, one call at a time, ended when
its trajectory ends (its trajectory object collected, or ``release`` of the instance it is
keyed by), by ``session_idle_timeout`` idle, to make room for another at ``max_sessions`` (the
least recently used idle one), or by a call that does not end cleanly (its time limit). A
trajectory whose state was lost, whatever the reason, is told so by its next call's answer.
"""

from __future__ import annotations

import ast
import asyncio
import itertools
import logging
import math
import re
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import Any

from .. import diagnosis, node
from ..case.api import run_code
from ..case.guests import guest_for
from ..case.url import is_http, is_ours, parse_url
from ..errors import CauseCounts, InvalidRequest
from .notebook import Notebook, RemoteNotebook

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
            max_sessions = default_max_sessions(num_workers, micro_vm_mb)
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


class _Turn:
    """A notebook's calls one at a time, in the order they came, whatever thread or event loop
    they come from. A call's turn lasts from `wait` until `pass_on`, which the end of the
    call's thread calls (its job's done-callback), so the next call enters only once the
    thread of the one before has left, cancelled or not."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = False
        self._waiting: deque[Future[None]] = deque()

    def wait(self) -> Future[None]:
        """A future done once the turn is the caller's."""
        turn: Future[None] = Future()
        with self._lock:
            if self._held:
                self._waiting.append(turn)
                return turn
            self._held = True
        turn.set_result(None)
        return turn

    def pass_on(self) -> None:
        """The holder is done: the turn goes to the next caller still waiting."""
        with self._lock:
            while self._waiting:
                turn = self._waiting.popleft()
                if turn.set_running_or_notify_cancel():  # False: that caller gave up
                    break
            else:
                self._held = False
                return
        turn.set_result(None)

    def give_up(self, turn: Future[None]) -> None:
        """The caller of `wait` no longer waits (cancelled): its turn, if it was given, is
        passed on once it is."""
        if not turn.cancel():
            turn.add_done_callback(lambda _: self.pass_on())


# A micro-VM, named by its notebook's serial and the notebook's count of micro-VMs started.
MicroVM = tuple[int, int]


class _PooledNotebook:
    """A trajectory's notebook in the pool. A call owns it from `take` until the call's thread
    has ended (or, for a call that never got a thread, until its coroutine gave up): `users`
    counts those calls (under the pool's lock), and the notebook is closed only once it is
    zero. The calls run in it in `turn`."""

    serials = itertools.count(1)

    def __init__(self, notebook: Notebook | RemoteNotebook) -> None:
        self.notebook = notebook
        self.serial = next(self.serials)
        self.turn = _Turn()
        self.users = 0
        self.last_used = time.monotonic()
        self.released = False

    def micro_vm(self) -> MicroVM | None:
        """The micro-VM its state is in; None when none is up."""
        return (self.serial, self.notebook.generation) if self.notebook.alive else None


@dataclass(frozen=True)
class _Left:
    """What a trajectory's last call that ran left it: the micro-VM its state is in (None:
    none), whether that call's answer said its state was gone, and that call's cancel (set:
    the answer never reached the trajectory)."""

    micro_vm: MicroVM | None
    said_restarted: bool
    abandoned: threading.Event


# The trajectories whose last call is remembered, to tell one its state is gone (kept for
# every trajectory until its end is known; this bounds them where it never is).
TRAJECTORIES_REMEMBERED = 4096


class _NotebookPool:
    """The process's notebooks, by key (a trajectory's): at most `max_sessions` up. At the cap
    the least recently used idle one is ended to make room; one idle past
    `session_idle_timeout`, or whose trajectory has ended (its `trajectory` object collected),
    is ended by a sweeping thread. Called from the event loop, so a notebook is closed (its
    micro-VM killed and reaped) in a thread, never there."""

    def __init__(self, settings: ToolSettings) -> None:
        self.settings = settings
        self.lock = threading.Lock()
        self.by_key: dict[str, _PooledNotebook] = {}
        self.left: OrderedDict[str, _Left] = OrderedDict()
        # A trajectory object's key, by its id (checked against its weak reference).
        self.keys: dict[int, tuple[weakref.ref[object], str]] = {}
        self.serials = itertools.count(1)
        # Trajectories ended, (id, key), put by their finalizers (SimpleQueue.put may be called
        # from one, wherever the collector runs it), and None to stop the sweeper.
        self.ended: SimpleQueue[tuple[int, str] | None] = SimpleQueue()
        self.sweeper: threading.Thread | None = None

    def key_of(self, notebook_key: str, trajectory: object | None) -> str:
        """The key of a call's notebook: `notebook_key`, or, given the `trajectory` object (alive
        exactly as long as the trajectory), one of that object's own, whose notebook ends
        when the object is collected. An object that cannot be weakly referenced gives no
        such signal: its calls are kept by `notebook_key`."""
        if trajectory is None:
            return notebook_key
        with self.lock:
            known = self.keys.get(id(trajectory))
            if known is not None and known[0]() is trajectory:
                return known[1]
            try:
                reference = weakref.ref(trajectory)
            except TypeError:
                return notebook_key
            key = f"{notebook_key}#{next(self.serials)}"
            self.keys[id(trajectory)] = (reference, key)
            weakref.finalize(trajectory, self.ended.put, (id(trajectory), key)).atexit = False
            return key

    @staticmethod
    def _open(settings: ToolSettings) -> Notebook | RemoteNotebook:
        """A new notebook of the URL: on this node, or with ``?ray`` on the cluster's."""
        if parse_url(settings.url).ray is not None:
            return RemoteNotebook(settings.url, settings.memory_limit_mb)
        return Notebook(settings.url, settings.memory_limit_mb)

    def take(self, key: str) -> _PooledNotebook | None:
        """The notebook of `key`, owned by the caller until it puts it back; made if it has none
        (its micro-VM starts with its first call), ending the least recently used idle one
        when `max_sessions` are up; None when every one of those is in use."""
        with self.lock:
            pooled = self.by_key.get(key)
            if pooled is None:
                if len(self.by_key) >= self.settings.max_sessions:
                    idle = [p for p in self.by_key.items() if not p[1].users]
                    if not idle:
                        return None
                    lru, _ = min(idle, key=lambda item: item[1].last_used)
                    self._close_in_background([self.by_key.pop(lru)])
                settings = self.settings
                pooled = self.by_key[key] = _PooledNotebook(self._open(settings))
                if self.sweeper is None:
                    self.sweeper = threading.Thread(
                        target=self._sweep, name="verl-hyperlight-notebooks", daemon=True
                    )
                    self.sweeper.start()
            pooled.users += 1
            return pooled

    def put_back(self, key: str, pooled: _PooledNotebook) -> None:
        """A call of `take` is done with it: its thread has ended, or it never had one."""
        with self.lock:
            pooled.users -= 1
            pooled.last_used = time.monotonic()
            # Released, or ended by a call (its micro-VM is gone): it holds no place among
            # max_sessions, and the key's next call makes a new one.
            ended = pooled.released or not pooled.notebook.alive
            if ended and not pooled.users and self.by_key.get(key) is pooled:
                del self.by_key[key]
                self._close_in_background([pooled])

    def run(
        self, key: str, pooled: _PooledNotebook, call: Call, cancel: threading.Event
    ) -> tuple[Response | None, str | None, bool]:
        """The call run in `pooled` (in its thread, in its turn), answered as run_code answers,
        and whether its answer says the trajectory's state is gone: lost by this call, or
        since the trajectory's last answer, whatever ended it (its idle time, room for
        another, a call whose answer it never got)."""
        with self.lock:
            left = self.left.get(key)
        response, error = pooled.notebook.run(call.code, call.timeout, cancel)
        ran = response is not None and response.get("run_result") is not None
        now = pooled.micro_vm()
        restarted = (ran and now is None) or (
            left is not None
            and (
                (left.micro_vm is not None and left.micro_vm != now)
                or (left.said_restarted and left.abandoned.is_set())
            )
        )
        with self.lock:
            if not pooled.released:  # else its trajectory is over: nothing is owed to it
                self.left[key] = _Left(now, restarted, cancel)
                self.left.move_to_end(key)
                if len(self.left) > TRAJECTORIES_REMEMBERED:
                    self.left.popitem(last=False)
        return response, error, restarted

    def release(self, key: str) -> None:
        """End `key`'s trajectory: its notebook now, or once the calls that own it are done.
        Blocks while it closes one: called in a thread of its own (tool.release), or the
        sweeper's."""
        with self.lock:
            self.left.pop(key, None)
            pooled = self.by_key.get(key)
            if pooled is None:
                return
            pooled.released = True
            if pooled.users:
                return
            del self.by_key[key]
        pooled.notebook.close()

    def _idle(self, now: float) -> list[_PooledNotebook]:
        """Take out the notebooks idle past the timeout (under the lock)."""
        expired = [
            key
            for key, pooled in self.by_key.items()
            if not pooled.users and now - pooled.last_used >= self.settings.session_idle_timeout
        ]
        return [self.by_key.pop(key) for key in expired]

    @staticmethod
    def _close(notebooks: list[_PooledNotebook]) -> None:
        for pooled in notebooks:
            pooled.notebook.close()

    def _close_in_background(self, notebooks: list[_PooledNotebook]) -> None:
        if notebooks:
            threading.Thread(
                target=self._close, args=(notebooks,), name="verl-hyperlight-close", daemon=True
            ).start()

    def _end(self, ident: int, key: str) -> None:
        """A trajectory object was collected: its trajectory is over."""
        with self.lock:
            known = self.keys.get(ident)
            if known is not None and known[1] == key:
                del self.keys[ident]
        self.release(key)

    def _sweep(self) -> None:
        period = min(30.0, max(0.05, self.settings.session_idle_timeout / 4))
        sweep_at = time.monotonic() + period
        while True:
            try:
                ended = self.ended.get(timeout=max(0.0, sweep_at - time.monotonic()))
            except Empty:
                with self.lock:
                    expired = self._idle(time.monotonic())
                self._close(expired)
                sweep_at = time.monotonic() + period
                continue
            if ended is None:
                return
            self._end(*ended)

    def close(self) -> None:
        """End every notebook: an idle one now, one in use once the calls that own it are
        done."""
        self.ended.put(None)
        with self.lock:
            idle = [pooled for pooled in self.by_key.values() if not pooled.users]
            for pooled in self.by_key.values():
                pooled.released = True
            self.by_key = {key: pooled for key, pooled in self.by_key.items() if pooled.users}
        self._close(idle)


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
        self.notebooks = _NotebookPool(settings) if settings.notebook_per_trajectory else None
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
        notebook: tuple[str, _PooledNotebook] | None,
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

        cancel = threading.Event()
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
        self, call: Call, cancel: threading.Event, notebook: tuple[str, _PooledNotebook] | None
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
                response, error, restarted = self.notebooks.run(*notebook, call, cancel)
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
