"""What to run: a sandbox URL and a memory limit turned into the guest hluk boots."""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .. import node, settings
from ..errors import InvalidRequest
from ..guest import protocol, runner
from .url import parse_url

# Imported in the warm snapshot, so a solution's imports of them cost nothing. Modules an image
# lacks (numpy and sympy outside the agent image) are skipped.
PREPARED_MODULES = (
    "abc", "array", "bisect", "builtins", "calendar", "cmath", "collections", "collections.abc",
    "contextlib", "copy", "dataclasses", "datetime", "decimal", "enum", "fractions", "functools",
    "gc", "hashlib", "heapq", "io", "itertools", "json", "math", "numbers", "operator", "os",
    "pprint", "queue", "random", "re", "statistics", "string", "struct", "sys", "textwrap",
    "threading", "time", "traceback", "types", "typing", "unicodedata", "atexit", "base64",
    "numpy", "sympy",
)  # fmt: skip
# Where a case's directory is mounted in its guest, read-only.
CASE_MOUNT = "/case"
# The guest package's modules, in the order they are loaded: the runner imports the protocol.
GUEST_MODULES = ("protocol", "runner")


@dataclass(frozen=True)
class Image:
    """A guest root filesystem: its hluk arguments, and the memory it needs to boot."""

    args: tuple[str, ...]
    min_memory_mb: int
    label: str
    local_rootfs: str | None = None  # a root filesystem file of the user's (HLUK_INITRD)
    default_memory_mb: int = 256  # hluk's --scratch-mb when none is given
    # The guest's driver, and so the runner a case runs under: "python" (guest/runner.py),
    # "node" (guest/runner.js), "java" (guest/runner.jsh) or "bash" (guest/runner.sh).
    driver: str = "python"


PYTHON = Image(("--runtime", "python"), 128, "the python image")
AGENT = Image(("--runtime", "agent"), 720, "the agent image", default_memory_mb=1536)
# hluk's node image: node:22-alpine's binary alone (no npm, no node_modules), 512 MiB by
# default; the binary is about 110 MiB of its root filesystem.
NODE = Image(("--runtime", "node"), 384, "the node image", default_memory_mb=512, driver="node")
# hluk's java image: a jlinked Temurin 25 whose one JVM runs code as JShell snippets
# (drivers/java), 512 MiB by default.
JAVA = Image(("--runtime", "java"), 384, "the java image", default_memory_mb=512, driver="java")
# hluk's bash image: BusyBox's hush, built NOMMU (drivers/bash), 256 MiB by default.
BASH = Image(("--runtime", "bash"), 128, "the bash image", default_memory_mb=256, driver="bash")
# The image a language other than Python's runs in, whatever image the URL names.
LANGUAGE_IMAGES = {"nodejs": NODE, "typescript": NODE, "java": JAVA, "bash": BASH}


@dataclass(frozen=True)
class Guest:
    """One micro-VM configuration: an image and its memory. Cases of one Guest share a warm
    snapshot."""

    image: Image
    scratch_mb: int | None
    # A host directory holding pytest (see _guest_pytest), for `language: "pytest"` cases: it
    # is mounted read-only and imported before the warm snapshot, and the guest's cases run
    # under pytest. None: cases run as `python solution.py`.
    pytest_library: str | None = None

    @property
    def memory_mb(self) -> int:
        """The micro-VM's memory."""
        return self.scratch_mb if self.scratch_mb is not None else self.image.default_memory_mb

    def args(self) -> list[str]:
        """hluk run's guest arguments: image, memory, pytest's mount and the warm-up code."""
        memory = [] if self.scratch_mb is None else ["--scratch-mb", str(self.scratch_mb)]
        other = _RUNNERS.get(self.image.driver)
        if other is not None:
            return [*self.image.args, *memory, "--warm-exec", other.warm_exec()]
        if self.pytest_library is None:
            return [*self.image.args, *memory, "--warm-exec", warm_exec_code()]
        mount = ["--mount", f"{self.pytest_library}:{runner.PYTEST_MOUNT}:ro"]
        warm_exec = warm_exec_code(pytest_copy=os.path.basename(self.pytest_library))
        return [*self.image.args, *memory, *mount, "--warm-exec", warm_exec]


def _image_named(image: str) -> Image:
    """The image of a URL's image name ("python", "agent", or a full reference)."""
    if image == "python":
        initrd = settings.HLUK_INITRD.value()
        if initrd is not None:
            initrd = os.path.abspath(initrd)  # hluk runs in another directory
            return Image(
                ("--initrd", initrd, "--warm"), PYTHON.min_memory_mb, f"initrd {initrd}", initrd
            )
        return PYTHON
    if image == "agent":
        return AGENT
    repository = image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
    like = AGENT if repository == "agent" else PYTHON
    return Image(
        ("--runtime", image),
        like.min_memory_mb,
        f"image {image}",
        default_memory_mb=like.default_memory_mb,
    )


def memory_for(memory_limit_mb: float) -> int:
    """The micro-VM memory (MiB) for a limit: a third more than the solution may use, for the
    guest kernel and interpreter, rounded up to the ladder of sizes (powers of two and 1.5
    times them: 192, 256, 384, 512, 768, 1024, 1536, 2048, ...).

    Each size is a guest of its own (a cold boot and a warm snapshot of tens of MiB, under
    the node-wide lock), so nearby limits share one: 769 to 1152 (verl's default 1024
    among them) all run in 1536 MiB."""
    needed = math.ceil(memory_limit_mb * 4 / 3)
    power = 1 << (needed - 1).bit_length()  # the smallest power of two >= needed
    return power * 3 // 4 if power * 3 // 4 >= needed else power


def guest_for(url: str, memory_limit_mb: object, language: str = "python") -> Guest:
    """The guest for a case: the URL's image (or the language's, LANGUAGE_IMAGES) with the
    memory `memory_for` gives the limit. A limit past the most a case may ask for on this node
    is refused, unless the URL sends the case to the Ray cluster's nodes (``?ray``), whose own
    run_code judges it by their memory."""
    parsed = parse_url(url)
    image = LANGUAGE_IMAGES.get(language) or _image_named(parsed.image)
    if memory_limit_mb is None or (
        not isinstance(memory_limit_mb, bool) and memory_limit_mb in (-1, 0)
    ):
        return Guest(image, None)
    if (
        isinstance(memory_limit_mb, bool)
        or not isinstance(memory_limit_mb, int | float)
        or not math.isfinite(memory_limit_mb)  # NaN is not "below" anything: say what it is
    ):
        raise InvalidRequest(f"memory_limit_mb must be a number or None, not {memory_limit_mb!r}")
    if memory_limit_mb < 0:
        raise InvalidRequest(
            f"memory_limit_mb={memory_limit_mb} is not a memory size: give at least "
            f"{image.min_memory_mb} (MiB, what {image.label} boots in), or None (or 0, or -1) "
            "for the image's default"
        )
    if memory_limit_mb < image.min_memory_mb:
        raise InvalidRequest(
            f"memory_limit_mb={memory_limit_mb} is below what {image.label} boots in: the guest "
            "kernel enforces no per-process limit, so the limit is the micro-VM's memory; "
            f"use at least {image.min_memory_mb} (or None/-1/0 for the image's default)"
        )
    most = node.most_case_memory_mb()
    if memory_limit_mb > most and parsed.ray is None:
        raise InvalidRequest(
            f"memory_limit_mb={memory_limit_mb} is more than half this node's memory "
            f"({most} MiB), the most a case may ask for: the limit is the micro-VM's memory, in "
            "MiB (verl's default is 1024)"
        )
    return Guest(image, memory_for(memory_limit_mb))


@lru_cache(maxsize=4)
def warm_exec_code(pytest_copy: str | None = None) -> str:
    """hluk's --warm-exec: load the guest package (the frame protocol and the runner) and
    prepare the common imports (and, for a pytest guest, pytest from its mount: the copy named
    `pytest_copy`), once, before the snapshot is taken."""
    package = runner.PACKAGE_NAME
    lines = [
        "import sys, types",
        f"_p = sys.modules[{package!r}] = types.ModuleType({package!r})",
        "_p.__path__ = []",
    ]
    for name in GUEST_MODULES:
        source = resources.files(runner.__package__).joinpath(f"{name}.py").read_text()
        module = f"{package}.{name}"
        lines += [
            f"_m = sys.modules[{module!r}] = types.ModuleType({module!r})",
            f"_m.__package__ = {package!r}",
            f"exec(compile({source!r}, {runner.RUNNER_FILENAME!r}, 'exec'), _m.__dict__)",
            f"_p.{name} = _m",
        ]
    lines.append(f"_p.runner.prepare({list(PREPARED_MODULES)!r})")
    if pytest_copy is not None:
        # Named, so that the snapshot's key (which holds the warm-exec, not the mounts) is
        # another once pytest is upgraded: a snapshot holds the pytest it imported.
        lines.append(f"_p.runner.prepare_pytest()  # {pytest_copy}")
    lines.append("del _p, _m, sys, types")
    return "\n".join(lines) + "\n"


# What guest/runner.js reads of guest/protocol.py (its PROTOCOL), and the global it installs
# its functions as.
NODE_RUNNER_GLOBAL = "__verl_hyperlight_runner"
_NODE_PROTOCOL_NAMES = (
    "OUTPUT_LIMIT", "OUTPUT_LIMIT_STATUS", "CHUNK", "FILES_OUT_LIMIT", "FILE_MISSING",
    "FILE_LEFT_OUT", "SOLUTION", "STDIN", "FILES", "FILE_PREFIX",
)  # fmt: skip
_PROTOCOL_FRAMES = ("GO", "REFUSED", "START", "END", "FILE", "DONE", "LAST")


def _protocol_constants(names: tuple[str, ...]) -> dict[str, object]:
    """What a runner in another language is given of guest/protocol.py: the constants `names`,
    the frames' kinds as text, and the status of a report it could not write."""
    constants: dict[str, object] = {name: getattr(protocol, name) for name in names}
    constants.update({name: getattr(protocol, name).decode() for name in _PROTOCOL_FRAMES})
    constants["REPORT_FAILED_STATUS"] = runner.REPORT_FAILED_STATUS
    return constants


@lru_cache(maxsize=1)
def node_warm_exec_code() -> str:
    """hluk's --warm-exec for the node image: guest/runner.js, given the protocol's constants,
    installed once before the snapshot is taken. The node driver evaluates it as a script."""
    constants = _protocol_constants(_NODE_PROTOCOL_NAMES)
    constants["RUNNER_GLOBAL"] = NODE_RUNNER_GLOBAL
    source = resources.files(runner.__package__).joinpath("runner.js").read_text()
    return f"{{\nconst PROTOCOL = {json.dumps(constants)};\n{source}}}\n"


# What guest/runner.jsh reads of guest/protocol.py, as the fields of the class written before
# it (JAVA_PROTOCOL_CLASS), and the class it declares.
JAVA_PROTOCOL_CLASS = "VerlHyperlightProtocol"
JAVA_RUNNER_CLASS = "VerlHyperlightRunner"
_JAVA_PROTOCOL_NAMES = (
    "OUTPUT_LIMIT", "OUTPUT_LIMIT_STATUS", "CHUNK", "CONSOLE_WRITE", "FILES_OUT_LIMIT",
    "FILE_MISSING", "FILE_LEFT_OUT", "PROGRAM", "STDIN", "FILES", "FILE_PREFIX",
)  # fmt: skip


@lru_cache(maxsize=1)
def java_warm_exec_code() -> str:
    """hluk's --warm-exec for the java image: protocol.py's constants as a class, then
    guest/runner.jsh, declared once before the snapshot is taken, and the runner's warm-up (a
    statement: a call of declarations alone would have the driver look for a main)."""
    fields = [
        f"    static final {'String' if isinstance(value, str) else 'int'} {name} = "
        f"{json.dumps(value)};"
        for name, value in _protocol_constants(_JAVA_PROTOCOL_NAMES).items()
    ]
    source = resources.files(runner.__package__).joinpath("runner.jsh").read_text()
    protocol_class = "\n".join([f"final class {JAVA_PROTOCOL_CLASS} {{", *fields, "}"])
    return f"{protocol_class}\n{source}\n{JAVA_RUNNER_CLASS}.prepare();\n"


_BASH_PROTOCOL_NAMES = (*_JAVA_PROTOCOL_NAMES, "SOLUTION")


@lru_cache(maxsize=1)
def bash_warm_exec_code() -> str:
    """hluk's --warm-exec for the bash image: protocol.py's constants as VH_ variables, then
    guest/runner.sh's functions, sourced once into the image's shell before the snapshot."""
    constants = _protocol_constants(_BASH_PROTOCOL_NAMES)
    lines = [f"VH_{name}={shlex.quote(str(value))}" for name, value in constants.items()]
    source = resources.files(runner.__package__).joinpath("runner.sh").read_text()
    return "\n".join([*lines, source])


@dataclass(frozen=True)
class _Runner:
    """The runner of an image whose driver is not Python's: its warm-exec, and how a call of
    one of the Python runner's functions (main, await_case, probe) is spelled to it."""

    warm_exec: Callable[[], str]
    call: Callable[[str, tuple[str, ...]], str]


def _node_call(function: str, args: tuple[str, ...]) -> str:
    names = {"main": "main", "await_case": "awaitCase", "probe": "probe"}
    arguments = ", ".join(json.dumps(arg) for arg in args)
    return f"globalThis.{NODE_RUNNER_GLOBAL}.{names[function]}({arguments});"


def _java_call(function: str, args: tuple[str, ...]) -> str:
    names = {"main": "runCase", "await_case": "awaitCase", "probe": "probe"}
    arguments = ", ".join(json.dumps(arg) for arg in args)
    return f"{JAVA_RUNNER_CLASS}.{names[function]}({arguments});"


def _bash_call(function: str, args: tuple[str, ...]) -> str:
    names = {"main": "vh_case", "await_case": "vh_await_case", "probe": "vh_probe"}
    return " ".join([names[function], *(shlex.quote(arg) for arg in args)])


# Each image driver's runner, but Python's (guest/runner.py, warmed by warm_exec_code).
_RUNNERS = {
    "node": _Runner(node_warm_exec_code, _node_call),
    "java": _Runner(java_warm_exec_code, _java_call),
    "bash": _Runner(bash_warm_exec_code, _bash_call),
}


def _call(guest: Guest | None, function: str, *args: str) -> str:
    other = _RUNNERS.get(guest.image.driver) if guest is not None else None
    if other is not None:
        return other.call(function, args)
    module = runner.MODULE_NAME
    arguments = ", ".join(repr(arg) for arg in args)
    return f"__import__({module!r}, fromlist=['_']).{function}({arguments})"


def workload_code(guest: Guest, case_dir: str, nonce: str) -> str:
    """hluk's --exec for one case: run the case mounted at `case_dir`."""
    return _call(guest, "main", case_dir, nonce)


def ahead_code(guest: Guest, case_dir: str, nonce: str) -> str:
    """hluk's --exec for a ready guest: wait for the host's line, then run the case mounted at
    `case_dir`."""
    return _call(guest, "await_case", case_dir, nonce)


def notebook_code(nonce: str) -> str:
    """hluk's --exec for a notebook (Python's alone): run the calls the console's input
    brings."""
    return _call(None, "notebook", nonce)


def probe_code(guest: Guest, nonce: str) -> str:
    """hluk's --exec for a warm-up: report an empty case through the runner."""
    return _call(guest, "probe", nonce)


def hluk_argv(
    path: str,
    guest: Guest,
    exec_code: str,
    *,
    mount: str | None = None,
    log_level: str | None = None,
) -> list[str]:
    """The argv that runs `exec_code` in `guest` with the hluk at `path`: the one place a case's
    and a probe's runs are spelled, so they cannot drift apart. `mount` is a --mount value
    (HOST:GUEST[:ro]); `log_level` hluk's --log-level (a probe reads its `restored=` line)."""
    argv = [path]
    if log_level is not None:
        argv += ["--log-level", log_level]
    argv += ["run", *guest.args()]
    if mount is not None:
        argv += ["--mount", mount]
    argv += ["--exec", exec_code]
    return argv
