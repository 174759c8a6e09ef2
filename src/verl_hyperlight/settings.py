"""The package's settings: every environment variable it reads or passes on, declared once
and read here only.

Each setting is a ``Setting`` (its name, its value when it is not set, how its text is read,
and a line saying what it does); ``ALL`` lists them, for a reference table. A setting is read
per use, so a change to the environment counts from the next case on. A value that cannot be
used is said once per process (per name and value) at WARNING, and the default used. The
variables passed on as they are, to hluk or to the spawner's Python, are each a ``Passed``
(``PASSED`` lists them); nothing else of the worker's environment reaches either. hluk's
cache directory is found here too, as hluk finds it.

Settings are read from os.environ itself, at every use: a process-wide audit hook could keep
a cheaper copy, but it would cost every audit event of the worker (torch's and verl's
included) a Python call, for some ten microseconds a case.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from . import node
from .errors import CauseCounts

logger = logging.getLogger("verl_hyperlight")

T = TypeVar("T")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: `read` turns its text into its value, raising ValueError
    (saying what a usable text is) when it stands for none; `unset` says what applies when it
    is not set (or not usable), as the reference table and the warning say it."""

    name: str
    default: T
    unset: str
    read: Callable[[str], T]
    description: str

    def value(self) -> T:
        """Its value now: `default` when it is not set, or not usable (said once per value).
        Every case reads a dozen: a value read from a text before is that value again (each
        `read` is a function of the text alone), found by os.environ's own bytes (see
        `variables`) with no decoding, in one dictionary lookup."""
        try:
            return _settings_seen[self.name, os.environ._data.get(_encoded(self.name))]  # type: ignore[attr-defined,no-any-return]
        except KeyError:
            return self._read()

    def _read(self) -> T:
        raw = os.environ._data.get(_encoded(self.name))  # type: ignore[attr-defined]
        if len(_settings_seen) > _SEEN_LIMIT:
            _settings_seen.clear()  # an environment rewritten over and over: kept bounded
        if raw is None:
            _settings_seen[self.name, raw] = self.default
            return self.default
        text = os.fsdecode(raw)
        try:
            found = self.read(text)
        except ValueError as expected:
            if _unusable.first(f"{self.name}={text!r}"):
                logger.warning(
                    "verl-hyperlight: %s=%r is not %s; using %s",
                    self.name,
                    text,
                    expected,
                    self.unset,
                )
            return self.default
        _settings_seen[self.name, raw] = found
        return found


# The value read from each setting's texts (os.environ's bytes; None: unset) so far, usable ones
# alone (an unusable one is read and said each time), at most _SEEN_LIMIT of them.
_settings_seen: dict[tuple[str, bytes | None], Any] = {}
_SEEN_LIMIT = 4096


@functools.cache
def _encoded(name: str) -> bytes:
    return os.fsencode(name)


@dataclass(frozen=True)
class Additions:
    """Variables an operator adds to hluk's environment: by name, and by prefix."""

    names: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if math.isfinite(seconds) and seconds > 0:
        return seconds
    raise ValueError("a positive number of seconds")


def _seconds(name: str, default: float, description: str) -> Setting[float]:
    return Setting(name, default, f"{default:g}", _positive_seconds, description)


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def read(text: str) -> str:
        if not text:
            return choices[0]
        if text in choices:
            return text
        raise ValueError(f"one of {', '.join(choices)}")

    return read


def _count(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = -1
    if number >= 0:
        return number
    raise ValueError("a whole number, 0 or more")


def _text(text: str) -> str | None:
    return text or None  # set but empty: as if not set


def _verbatim(text: str) -> str | None:
    return text


@functools.lru_cache(maxsize=8)  # every case reads it: parsed once per value
def _additions(text: str) -> Additions:
    entries = [entry.strip() for entry in text.split(",")]
    return Additions(
        names=tuple(entry for entry in entries if entry and not entry.endswith("*")),
        prefixes=tuple(entry[:-1] for entry in entries if entry.endswith("*")),
    )


# How hluk may be started (see hluk/spawn.py), the default first.
SPAWN_WAYS = ("direct", "spawner", "setpriv", "fork")
# The variable hluk's environment carries the worker's token in, by which the worker's
# cleaner finds its hluks once the worker has died (hluk/cleaner.py).
WORKER_TOKEN = "VERL_HYPERLIGHT_WORKER"

STARTUP_TIMEOUT = _seconds(
    "VERL_HYPERLIGHT_STARTUP_TIMEOUT",
    60.0,
    "Seconds a case's micro-VM may take to start (not part of run_timeout); a warm-up that "
    "hluk leaves silent this long outside an image pull is hung.",
)
WARM_UP_TIMEOUT = _seconds(
    "VERL_HYPERLIGHT_WARM_UP_TIMEOUT",
    900.0,
    "Seconds a warm-up (an image pull and the warm snapshot) may take in all.",
)
BODY_READ_TIMEOUT = _seconds(
    "VERL_HYPERLIGHT_BODY_READ_TIMEOUT",
    60.0,
    "Seconds `serve` gives a request's body to arrive whole, from the request's start (a body "
    "of 64 MiB needs 1.1 MiB/s); past it the request is answered HTTP 408 and its connection "
    "closed.",
)
# The default most ready guests a worker keeps for one guest (see case/ready.py).
READY_GUESTS_DEFAULT = 8
READY_GUESTS = Setting(
    "VERL_HYPERLIGHT_READY_GUESTS",
    READY_GUESTS_DEFAULT,
    f"{READY_GUESTS_DEFAULT}",
    _count,
    "The most micro-VMs a worker keeps started and waiting for their case, per guest (image "
    "and memory size): as many as the guest's cases it ran at once lately, up to this; 0 "
    "starts each case's micro-VM when the case arrives.",
)
READY_IDLE = _seconds(
    "VERL_HYPERLIGHT_READY_IDLE",
    60.0,
    "Seconds a micro-VM started for a case that has not come yet waits before it is ended.",
)
HLUK_ENV = Setting(
    "VERL_HYPERLIGHT_HLUK_ENV",
    Additions(),
    "nothing added",
    _additions,
    "More of the worker's variables hluk is given: comma-separated names, or prefixes ending "
    "in `*`.",
)
SPAWN = Setting(
    "VERL_HYPERLIGHT_SPAWN",
    SPAWN_WAYS[0],
    SPAWN_WAYS[0],
    _one_of(SPAWN_WAYS),
    "How hluk is started: direct (posix_spawn from the worker; the cleaner ends hluk if "
    "the worker dies), spawner (posix_spawn, from a helper process), setpriv (an extra exec "
    "per case) or fork (a fork of the worker).",
)
CASE_DIR = Setting(
    "VERL_HYPERLIGHT_CASE_DIR",
    None,
    "/dev/shm, else TMPDIR",
    _text,
    "The directory case directories are made in, with no fallback.",
)
COMPILE_CACHE_DIR = Setting(
    "VERL_HYPERLIGHT_COMPILE_CACHE_DIR",
    None,
    "verl-hyperlight/ in hluk's cache directory",
    _text,
    "Where a node keeps Go's warm build cache, which every go case reads and none writes.",
)
BWRAP = Setting(
    "VERL_HYPERLIGHT_BWRAP",
    None,
    "bwrap on PATH, else the `compile` extra's",
    _text,
    "The bubblewrap that C++, Go and Rust compile in (0.10 or later for Go).",
)

TYPESCRIPT = Setting(
    "VERL_HYPERLIGHT_TYPESCRIPT",
    None,
    "typescript in `npm root -g`",
    _text,
    "The directory of the npm package `typescript` that transpiles `typescript` cases.",
)


def _mebibytes(text: str) -> int:
    number = _count(text)
    if number >= 64:
        return number
    raise ValueError("a whole number of MiB, 64 or more")


COMPILE_MEMORY_MB = Setting(
    "VERL_HYPERLIGHT_COMPILE_MEMORY_MB",
    4096,
    "4096",
    _mebibytes,
    "The address space (MiB) a compiler of C++, Go or Rust may map (its RLIMIT_AS).",
)
TOKEN = Setting(
    "VERL_HYPERLIGHT_TOKEN",
    None,
    "no token",
    _text,
    "The token `serve` requires of POST /run_code, as `Authorization: Bearer <token>`.",
)
POD_NAME = Setting(
    "MY_POD_NAME",
    None,
    "null",
    _verbatim,
    "What `serve` answers as executor_pod_name, as Sandbox Fusion does.",
)
HLUK_PATH = Setting(
    "HLUK_PATH",
    None,
    "the hluk on PATH",
    _text,
    "The hluk to run; a wrapper script must exec hluk.",
)
HLUK_INSTALL_DIR = Setting(
    "HLUK_INSTALL_DIR",
    None,
    "~/.local/bin",
    _text,
    "Where hluk's installer put hluk (the installer's own setting): when hluk is not on PATH, "
    "`doctor` and a case's error look there, and say to add that folder to PATH.",
)
HLUK_INITRD = Setting(
    "HLUK_INITRD",
    None,
    "the python image",
    _text,
    "A local Python root filesystem that hyperlight:// boots (warm) instead of the python image.",
)
HLUK_CACHE_DIR = Setting(
    "HLUK_CACHE_DIR",
    None,
    "$XDG_CACHE_HOME/hluk, else ~/.cache/hluk",
    _text,
    "hluk's cache (hluk's own setting, passed to it); the warm-up's lock and pytest's copy for "
    "the guest are kept in it.",
)
HLUK_REGISTRY = Setting(
    "HLUK_REGISTRY",
    None,
    "hluk's default",
    _text,
    "The registry hluk pulls images from (hluk's own setting, passed to it); part of what a "
    "warm snapshot serves.",
)
HLUK_IMAGE_VERSION = Setting(
    "HLUK_IMAGE_VERSION",
    None,
    "hluk's default",
    _text,
    "The version of the published images hluk pulls (hluk's own setting, passed to it); part "
    "of what a warm snapshot serves.",
)
RAY_ADDRESS = Setting(
    "RAY_ADDRESS",
    None,
    "the cluster `ray start` runs on this node",
    _text,
    "The Ray cluster a `?ray` URL joins when Ray is not initialised in the process (Ray's own "
    "setting); never a new cluster of our own.",
)
RAY_WAIT = _seconds(
    "VERL_HYPERLIGHT_RAY_WAIT",
    300.0,
    "Seconds a `?ray` case (or notebook) waits, while no alive node offers its resource, for one "
    "to join: pending meanwhile, so that Ray's autoscaler sees the demand and can start a node "
    "(from zero); past it the case is answered SandboxError.",
)
XDG_CACHE_HOME = Setting(
    "XDG_CACHE_HOME",
    None,
    "~/.cache",
    _text,
    "Where hluk's cache is when HLUK_CACHE_DIR is not set (hluk's rule, passed to it).",
)
VERL_PLUGINS = Setting(
    "VERL_USE_EXTERNAL_PLUGINS",
    None,
    "verl loads every plugin",
    _verbatim,
    "verl's own (0.9 and later): which verl.plugins it loads; `doctor` checks that it keeps "
    "this package's plugin (hyperlight) in.",
)
VERL_MODULES = Setting(
    "VERL_USE_EXTERNAL_MODULES",
    None,
    "nothing",
    _verbatim,
    "verl's own (0.6 to 0.8): the modules it imports at `import verl`; `doctor` checks that it "
    "names verl_hyperlight.plugin on those versions.",
)

ALL: tuple[Setting[Any], ...] = (
    STARTUP_TIMEOUT,
    WARM_UP_TIMEOUT,
    READY_GUESTS,
    READY_IDLE,
    BODY_READ_TIMEOUT,
    HLUK_ENV,
    SPAWN,
    CASE_DIR,
    COMPILE_CACHE_DIR,
    BWRAP,
    TYPESCRIPT,
    COMPILE_MEMORY_MB,
    TOKEN,
    POD_NAME,
    HLUK_PATH,
    HLUK_INSTALL_DIR,
    HLUK_INITRD,
    HLUK_CACHE_DIR,
    HLUK_REGISTRY,
    HLUK_IMAGE_VERSION,
    RAY_ADDRESS,
    RAY_WAIT,
    XDG_CACHE_HOME,
    VERL_PLUGINS,
    VERL_MODULES,
)


@dataclass(frozen=True)
class Passed:
    """A variable of the worker's environment passed on as it is, to hluk (`to_hluk`) or to
    the spawner's Python; `path`: a path, made absolute (hluk runs in another directory)."""

    name: str
    to_hluk: bool
    description: str
    path: bool = False


_PROXY = "A proxy hluk's image pulls go through (its HTTP client reads it)."
_PROXIES = (
    "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy",
)  # fmt: skip
# What hluk reads of its environment (hyperlight-unikraft's source): its cache directory
# (HLUK_CACHE_DIR, else XDG_CACHE_HOME, else HOME), its documented settings, RUST_LOG with
# --log-level, and, through its HTTP client and log formatter, the proxy settings and
# NO_COLOR. Nothing else of the worker's environment (tokens, keys) reaches it.
PASSED: tuple[Passed, ...] = (
    Passed("PATH", True, "Where hluk finds what it runs."),
    Passed("HOME", True, "hluk's cache is under it when no other setting says.", path=True),
    Passed("XDG_CACHE_HOME", True, "hluk's cache is under it when set.", path=True),
    Passed("HLUK_CACHE_DIR", True, "hluk's cache directory.", path=True),
    Passed("HLUK_REGISTRY", True, "The registry hluk pulls images from."),
    Passed("HLUK_IMAGE_VERSION", True, "The version of the images hluk pulls."),
    Passed("HLUK_PROFILE", True, "hluk's own profiling switch."),
    Passed("RUST_LOG", True, "hluk's log filter, with --log-level."),
    Passed("NO_COLOR", True, "Keeps colour out of hluk's messages."),
    *(Passed(name, True, _PROXY) for name in _PROXIES),
    *(
        Passed(name, True, "Hosts hluk reaches without a proxy.")
        for name in ("NO_PROXY", "no_proxy")
    ),
    Passed(
        "LD_LIBRARY_PATH",
        False,
        "What a Python built with a shared libpython may need to start (the spawner's only "
        "variable).",
    ),
)


MIB = 1024 * 1024


def memory_limit_refusal(memory_limit_mb: int) -> str | None:
    """Why a command's --memory-limit-mb (verl's memory_limit_mb) cannot be run on this node,
    if it cannot: past the most a case may ask for (node.most_case_memory_mb)."""
    most = node.most_case_memory_mb()
    if memory_limit_mb > most:
        return (
            f"{memory_limit_mb} MiB is more than half this node's memory ({most} MiB), the most "
            "a case may ask for (run_code and serve refuse such a case)"
        )
    return None


@dataclass(frozen=True)
class ServeSettings:
    """How `verl-hyperlight serve` runs (see its --help), validated here, once, whoever makes
    them (the command line, or a caller of ``server.app.serve``): a value the server cannot
    honour is a ValueError naming the command's option."""

    url: str = "hyperlight://"
    max_concurrent: int = field(default_factory=node.cpus)
    max_queue: int | None = None  # None: 8 x max_concurrent
    max_wait: float = 5.0
    max_body_bytes: int = 64 * MIB
    max_bodies_bytes: int | None = None  # None: node.bodies_memory_bytes, at least one body
    grace: float = 30.0
    warm_up_memory_mb: int = 1024
    max_memory_mb: int | None = None  # None: half the node's memory, at least warm_up_memory_mb
    max_run_timeout: float = 300.0
    token: str | None = None
    # The URL sends cases to a Ray cluster's nodes (?ray): their run_code judges a memory
    # limit by their own memory, and this node's is no cap.
    cluster: bool = False

    def __post_init__(self) -> None:
        for option, value in (
            ("--max-concurrent", self.max_concurrent),
            ("--max-queue", self.max_queue),
            ("--max-body-mb", self.max_body_bytes),
            ("--max-bodies-mb", self.max_bodies_bytes),
            ("--max-memory-mb", self.max_memory_mb),
        ):
            if value is not None and value < 1:
                raise ValueError(
                    f"argument {option}: {_said(value, option)} is not a positive number"
                )
        for option, seconds in (("--max-wait", self.max_wait), ("--grace", self.grace)):
            if not seconds >= 0:  # NaN included
                raise ValueError(
                    f"argument {option}: {seconds:g} is not a number of seconds, 0 or more"
                )
        if not self.max_run_timeout > 0:
            raise ValueError(
                f"argument --max-run-timeout: {self.max_run_timeout:g} is not a positive number "
                "of seconds"
            )
        for option, memory in (
            ("--memory-limit-mb", self.warm_up_memory_mb),
            ("--max-memory-mb", self.max_memory_mb),
        ):
            refusal = None if memory is None or self.cluster else memory_limit_refusal(memory)
            if refusal is not None:
                raise ValueError(f"argument {option}: {refusal}")
        if self.memory_cap < self.warm_up_memory_mb:
            raise ValueError(
                f"--max-memory-mb is below --memory-limit-mb ({self.warm_up_memory_mb})"
            )
        if self.bodies_budget < self.max_body_bytes:
            raise ValueError(
                f"--max-bodies-mb is below --max-body-mb ({self.max_body_bytes // MIB})"
            )

    @property
    def queue_limit(self) -> int:
        return self.max_queue if self.max_queue is not None else 8 * self.max_concurrent

    @property
    def bodies_budget(self) -> int:
        """The bytes of request bodies the server holds at most, in all."""
        if self.max_bodies_bytes is not None:
            return self.max_bodies_bytes
        # A body is held once, as the request it holds (its code, stdin and files), from its
        # read until its case has ended.
        return max(node.bodies_memory_bytes(), self.max_body_bytes)

    @property
    def memory_cap(self) -> int:
        """The largest memory_limit_MB a request may ask for."""
        if self.max_memory_mb is not None:
            return self.max_memory_mb
        if self.cluster:
            return sys.maxsize  # each node refuses what it cannot run, as a SandboxError
        return max(node.most_case_memory_mb(), self.warm_up_memory_mb)


def _said(value: int, option: str) -> str:
    """An option's value as it was given on the command line (MiB for the body sizes)."""
    return str(value // MIB) if option in ("--max-body-mb", "--max-bodies-mb") else str(value)


def reference() -> str:
    """The reference page of every setting (docs/reference/settings.md is this text, which a
    test checks): `python -m verl_hyperlight.settings` prints it."""
    rows = [
        "# Settings",
        "",
        "Every environment variable verl-hyperlight reads, from its one settings module",
        "(`src/verl_hyperlight/settings.py`; this page is generated from it: `python -m",
        "verl_hyperlight.settings > docs/reference/settings.md`). A setting is read at each use,",
        "so a change counts from the next case on; a value that cannot be used is said once at",
        "WARNING, and the default used.",
        "",
        "| variable | when unset | what it does |",
        "| --- | --- | --- |",
    ]
    for setting in ALL:
        rows.append(f"| `{setting.name}` | {setting.unset} | {setting.description} |")
    rows += [
        "",
        "## Passed on",
        "",
        "Nothing else of the worker's environment reaches hluk or the spawner (the helper that",
        "starts hluk): these variables are passed on as they are, with the names",
        f"`{HLUK_ENV.name}` adds.",
        "",
        "| variable | passed to | why |",
        "| --- | --- | --- |",
    ]
    for passed in PASSED:
        to = "hluk" if passed.to_hluk else "the spawner"
        rows.append(f"| `{passed.name}` | {to} | {passed.description} |")
    rows += [
        "",
        f"hluk's environment also carries `{WORKER_TOKEN}`, the worker's token (a random",
        "name), by which the worker's cleaner finds and ends its hluks if the worker dies.",
    ]
    return "\n".join(rows) + "\n"


def hluk_cache_directory() -> str:
    """hluk's cache directory, as hluk finds it, made absolute."""
    # A string, not a Path: every case looks at the cache (case.snapshots), and path
    # objects cost more than the stat calls do.
    chosen = HLUK_CACHE_DIR.value()
    if chosen is None:
        parent = XDG_CACHE_HOME.value() or os.path.join(os.path.expanduser("~"), ".cache")
        chosen = os.path.join(parent, "hluk")
    return chosen if chosen.startswith("/") else os.path.join(os.getcwd(), chosen)


def compile_cache_dir() -> str:
    """Where a node keeps what compiles share (Go's warm build cache): beside hluk's cache,
    unless VERL_HYPERLIGHT_COMPILE_CACHE_DIR says where."""
    chosen = COMPILE_CACHE_DIR.value()
    if chosen is None:
        return os.path.join(hluk_cache_directory(), "verl-hyperlight")
    return chosen if os.path.isabs(chosen) else os.path.join(os.getcwd(), chosen)


def hluk_install_directory() -> str:
    """Where hluk's installer puts hluk (HLUK_INSTALL_DIR, else ~/.local/bin), made absolute."""
    chosen = HLUK_INSTALL_DIR.value() or os.path.join(os.path.expanduser("~"), ".local", "bin")
    return os.path.abspath(chosen)


# The prefix of this package's own variables: a name with it that no setting has is a typo.
OURS = "VERL_HYPERLIGHT_"


def unknown_settings() -> dict[str, str | None]:
    """The variables of the environment named as ours (VERL_HYPERLIGHT_...) that no setting
    reads, each with the setting its name is nearest to (None when none is near): ignored,
    so a misspelling would pass unseen."""
    import difflib

    known = [setting.name for setting in ALL if setting.name.startswith(OURS)]
    # Matched by what follows the prefix, which every name shares.
    rests = {name.removeprefix(OURS): name for name in known}
    found: dict[str, str | None] = {}
    for name in sorted(os.environ):
        if name.startswith(OURS) and name not in known:
            near = difflib.get_close_matches(name.removeprefix(OURS), list(rests), n=1)
            found[name] = rests[near[0]] if near else None
    return found


def variables(names: tuple[str, ...], prefixes: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment's variables that `names` names or whose names start with one of
    `prefixes`. Every case asks (hluk's environment), and a walk of os.environ decodes each
    of its variables: what was found is kept with a copy of the environment it was found in
    (the bytes os.environ keeps, in the standard library's os.py on every implementation),
    and found again only once that has changed."""
    raw: dict[bytes, bytes] = os.environ._data  # type: ignore[attr-defined]
    key = (names, prefixes)
    seen = _variables_seen.get(key)
    if seen is not None and seen[0] == raw:  # compared whole, in C
        return dict(seen[1])
    environment = dict(raw)
    wanted = {os.fsencode(name) for name in names}
    starts = tuple(map(os.fsencode, prefixes))
    found = {
        os.fsdecode(name): os.fsdecode(value)
        for name, value in environment.items()
        if name in wanted or (starts and name.startswith(starts))
    }
    _variables_seen[key] = (environment, found)
    return dict(found)


# What `variables` found, by its arguments, with the environment it found it in.
_variables_seen: dict[
    tuple[tuple[str, ...], tuple[str, ...]], tuple[dict[bytes, bytes], dict[str, str]]
] = {}


_TO_HLUK = tuple(passed.name for passed in PASSED if passed.to_hluk)
_PATHS = tuple(passed.name for passed in PASSED if passed.path)
_TO_SPAWNER = tuple(passed.name for passed in PASSED if not passed.to_hluk)


def absolute(path: str) -> str:
    """`path` made absolute, as os.path.abspath makes it. Every case asks this of the same
    absolute paths (hluk's, its cache's, those passed to it), whose normal form is lexical and
    so found again, in a cache."""
    return _normal(path) if path.startswith("/") else os.path.abspath(path)


_normal = functools.lru_cache(maxsize=256)(os.path.normpath)


def hluk_environment() -> dict[str, str]:
    """The environment hluk runs with: the variables PASSED to it, and what the operator adds
    (HLUK_ENV). Every case asks: found again while os.environ is the same (compared whole, in
    C) and the paths passed on were absolute already (a relative one depends on the working
    directory of now)."""
    global _hluk_seen
    seen = _hluk_seen  # one tuple, replaced whole: read once
    if seen is not None and seen[0] == os.environ._data:  # type: ignore[attr-defined]
        return dict(seen[1])
    # The environment as it was before anything was read of it: one changed meanwhile does
    # not match it at the next case, which then reads again.
    environment = dict(os.environ._data)  # type: ignore[attr-defined]
    added = HLUK_ENV.value()
    passed = variables(_TO_HLUK + added.names, added.prefixes)
    fixed = True
    for name in _PATHS:
        if passed.get(name):
            fixed = fixed and passed[name].startswith("/")
            passed[name] = absolute(passed[name])
    _hluk_seen = (environment, passed) if fixed else None
    return dict(passed)


# hluk's environment as last found, with the environment (os.environ's bytes) it was found in.
_hluk_seen: tuple[dict[bytes, bytes], dict[str, str]] | None = None


def spawner_environment() -> dict[str, str]:
    """The environment the spawner's Python starts with: only what it may need to start."""
    return variables(_TO_SPAWNER)


# The settings' values said to be unusable so far.
_unusable = CauseCounts()


if __name__ == "__main__":
    print(reference(), end="")
