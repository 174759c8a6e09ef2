"""Compiles kept per process: the cases of one solution share its compile.

verl sends each test case of a solution as a request of its own, with the same code, and
Sandbox Fusion compiles it again for each, so a C++ solution of ten cases is compiled ten
times: about 1.5 s of a host CPU each for one that includes <bits/stdc++.h>, against a
millisecond or two for its run. Here the first case of a source compiles it
(``compiled.build``); the cases of the same source that come meanwhile wait for that compile
and take what it gave, and those after it take the program it built while the process keeps
it. A case gets the bytes the compiler wrote, written into its own case directory as any
program is: the program a compile of its own would have given it.

What is kept: a compile that built a program. One that failed with the compiler's words is
given to the cases that waited for it (they met the same host), not kept: a compile error may
be the host's moment (its disk full) rather than the source's. Nor is one that ran past its
deadline (load may have slowed it), one its case's cancel killed, or a node's failure
(BackendError): a lasting one (a full disk, no sandbox) is given to the cases that waited for
it, as the compiles they would run would meet it too. The key is the language, the toolchain
that compiles it in this process (found again, a new key, when a setting points elsewhere) and
the source's SHA-256. A kept compile that took longer than a later case's compile_timeout is
not that case's: it compiles itself and runs out of time, as the service's would. A compile
that ran out of its time is given to the cases that waited for it with no more time than it
had; when it failed otherwise, they go on as cases that come then: one of them compiles, the
others wait for it. Each answer's compile_result is its compile's, the time it took too. At
most KEPT_BYTES of compiles are kept, the least recently used going first.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace

from .. import cancel as cancels
from ..errors import BackendError, Refused
from . import compiled
from .response import CASE_CANCELLED

# What a process keeps of compiles at most: a static C++ program is about 2 MiB.
KEPT_BYTES = 64 * 1024 * 1024


@dataclass
class _Flight:
    """A compile under way, and the cases of its source waiting for it."""

    timeout: float
    waiting: list[threading.Event] = field(default_factory=list)
    done: compiled.Build | None = None  # its outcome, once it has one to give
    failed: BackendError | None = None  # the node's lasting failure it ended in, to give


class _Kept:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[object, ...], tuple[compiled.Build, int]] = OrderedDict()
        self._bytes = 0
        self._flights: dict[tuple[object, ...], _Flight] = {}

    def build(
        self, language: str, code: bytes, timeout: float, cancel: threading.Event | None
    ) -> compiled.Build:
        key = (language, compiled.toolchain(language), hashlib.sha256(code).digest())
        leads = None  # the flight this case's compile is, if it is one
        waits: tuple[_Flight, threading.Event] | None = None  # the flight it waits for
        with self._lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
                if found[0].result["execution_time"] <= timeout:
                    return found[0]
                # kept, but slower than this case may take: a compile of its own
            elif (flight := self._flights.get(key)) is None:
                leads = self._flights[key] = _Flight(timeout)
            else:
                waits = flight, threading.Event()
                flight.waiting.append(waits[1])
        if waits is not None:
            return self._wait(*waits, language, code, timeout, cancel)
        done = failed = None
        try:
            done = compiled.build(language, code, timeout, cancel)
            return done
        except BackendError as exc:
            failed = exc
            raise
        finally:
            if leads is not None:
                self._land(key, leads, done, failed)

    def _wait(
        self,
        flight: _Flight,
        woken: threading.Event,
        language: str,
        code: bytes,
        timeout: float,
        cancel: threading.Event | None,
    ) -> compiled.Build:
        """The outcome of `flight`, another case's compile of this source, once it has one:
        this case's own compile when it gives none this case may take."""
        with cancels.on_set(cancel, woken.set) as wakes:
            while not woken.wait(cancels.longest_sleep(cancel, wakes, None)):
                if cancel is not None and cancel.is_set():
                    break
        with self._lock:
            if woken in flight.waiting:
                flight.waiting.remove(woken)
            done, failed = flight.done, flight.failed
        if done is None and cancel is not None and cancel.is_set():
            raise Refused(CASE_CANCELLED)
        if failed is not None:
            # The node's, lasting: the compile this case would run meets it too (a full disk
            # one after another for each of a solution's cases).
            raise BackendError(failed.diagnosis)
        if done is not None:
            if done.repeatable and done.result["execution_time"] <= timeout:
                return done
            if done.result["status"] == "TimeLimitExceeded" and timeout <= flight.timeout:
                return done  # it ran past more time than this case has
        # Compiled as if it came now: the next compile of the source, or a wait for it.
        return self.build(language, code, timeout, cancel)

    def _land(
        self,
        key: tuple[object, ...],
        flight: _Flight,
        done: compiled.Build | None,
        failed: BackendError | None,
    ) -> None:
        """`flight`'s compile has ended with `done` (None: it raised, `failed` when with the
        node's failure): kept if it built a program, and given to the cases waiting for it."""
        with self._lock:
            del self._flights[key]
            flight.done = done
            if failed is not None and failed.persistent:
                flight.failed = failed
            if done is not None and done.repeatable and done.program is not None:
                self._keep(key, done)
            for woken in flight.waiting:
                woken.set()

    def _keep(self, key: tuple[object, ...], done: compiled.Build) -> None:
        result = done.result
        size = len(done.program or b"") + len(result["stdout"]) + len(result["stderr"]) + 512
        if size > KEPT_BYTES:
            return
        self._kept[key] = (done, size)
        self._bytes += size
        while self._bytes > KEPT_BYTES:
            _, (_, dropped) = self._kept.popitem(last=False)
            self._bytes -= dropped


_kept = _Kept()


def build(
    language: str, code: bytes, timeout: float, cancel: threading.Event | None = None
) -> compiled.Build:
    """`compiled.build` of `code`, or the outcome of a compile of the same source this process
    ran or runs now (see the module's docstring). Its compile_result is the case's own copy:
    what a caller does to its response reaches no other case's."""
    done = _kept.build(language, code, timeout, cancel)
    return replace(done, result=dict(done.result))


def forget() -> None:
    """Keep nothing compiled so far (a new process's state)."""
    global _kept
    _kept = _Kept()


os.register_at_fork(after_in_child=forget)
