"""Compiles kept per process (case/builds.py): the cases of one solution share its compile.

The compiler here is a stand-in for compiled.build (its outcome chosen by the test, its calls
counted, held until the test lets it end), so each rule is shown apart and at once; the real
compile of a C++ solution's cases through run_code is tests/test_compiled.py's
(`test_the_cases_of_one_solution_share_one_compile`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from hostside import wait_for

from verl_hyperlight import cancel as cancels
from verl_hyperlight.case import builds, compiled
from verl_hyperlight.case.response import CASE_CANCELLED
from verl_hyperlight.errors import BackendError, Diagnosis, Refused


def outcome(
    status: str = "Finished", code: int = 0, seconds: float = 0.5, program: bytes | None = b"P"
) -> compiled.Build:
    result = {
        "status": status,
        "execution_time": seconds,
        "return_code": code,
        "stdout": "",
        "stderr": "" if code == 0 else "error: nope\n",
    }
    return compiled.Build(result, program, repeatable=status == "Finished")


class Compiler:
    """compiled.build's stand-in: each call counted (with its source) and answered by
    `answer`, once `release` is set (set from the start unless `held`)."""

    def __init__(self, answer: Callable[[bytes], compiled.Build], held: bool = False) -> None:
        self.answer = answer
        self.calls: list[bytes] = []
        self.release = threading.Event()
        self.started = threading.Event()
        if not held:
            self.release.set()
        self._lock = threading.Lock()

    def __call__(
        self, language: str, code: bytes, timeout: float, cancel: threading.Event | None = None
    ) -> compiled.Build:
        with self._lock:
            self.calls.append(code)
        self.started.set()
        assert self.release.wait(30)
        return self.answer(code)


@pytest.fixture
def compiler(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Compiler]:
    """Install a Compiler (a fresh kept state, the toolchain fixed)."""
    builds.forget()
    monkeypatch.setattr(compiled, "toolchain", lambda language: ("toolchain", language))

    def install(answer: Callable[[bytes], compiled.Build] = lambda code: outcome(), **kw: Any):
        found = Compiler(answer, **kw)
        monkeypatch.setattr(compiled, "build", found)
        return found

    yield install
    builds.forget()


def compiling_and_waiting(
    pool: ThreadPoolExecutor, fake: Compiler, source: bytes, cancel: threading.Event | None = None
) -> tuple[Future[compiled.Build], Future[compiled.Build]]:
    """A case of `source` compiling it (held by `fake`), and one more waiting for that compile
    (with `cancel`)."""
    first = pool.submit(builds.build, "cpp", source, 10)
    assert fake.started.wait(10)
    waiter = pool.submit(builds.build, "cpp", source, 10, cancel)
    assert wait_for(lambda: len(builds._kept._flights[_key(source)].waiting) == 1)
    return first, waiter


def test_cases_of_one_source_at_once_share_one_compile(compiler: Callable[..., Compiler]) -> None:
    # A problem's 64 test cases, sent at once by verl (one thread each, as check_correctness's
    # pool sends them).
    fake = compiler(held=True)
    with ThreadPoolExecutor(64) as pool:
        futures = [pool.submit(builds.build, "cpp", b"int main(){}", 10) for _ in range(64)]
        assert fake.started.wait(10)
        assert not any(future.done() for future in futures)  # the others wait for that one
        flight = builds._kept._flights[_key(b"int main(){}")]
        assert wait_for(lambda: len(flight.waiting) == 63)
        fake.release.set()
        found = [future.result(30) for future in futures]
    assert fake.calls == [b"int main(){}"]
    assert all(one == found[0] for one in found)  # the compile's own outcome, its time too
    # each its own copy of compile_result: what one caller does to it reaches no other
    found[0].result["stderr"] = "changed by its caller"
    assert all(one.result["stderr"] == "" for one in found[1:])
    # and a later case of it takes what was kept; another source, another language compile
    assert builds.build("cpp", b"int main(){}", 10).result["stderr"] == ""
    builds.build("cpp", b"int main(){return 1;}", 10)
    builds.build("rust", b"int main(){}", 10)
    assert len(fake.calls) == 3


def test_a_compile_error_is_given_to_its_waiters_and_not_kept(
    compiler: Callable[..., Compiler],
) -> None:
    """Its waiters met the same host; a later case may not (the error may have been a full
    disk's, not the source's)."""
    fake = compiler(lambda code: outcome(code=1, program=None), held=True)
    with ThreadPoolExecutor(2) as pool:
        first, waiter = compiling_and_waiting(pool, fake, b"int main(")
        fake.release.set()
        failed = first.result(30)
        assert failed.program is None and failed.result["return_code"] == 1
        assert waiter.result(30) == failed
    assert len(fake.calls) == 1
    builds.build("cpp", b"int main(", 10)
    assert len(fake.calls) == 2


def test_a_compile_past_its_deadline_is_given_to_its_waiters_and_not_kept(
    compiler: Callable[..., Compiler],
) -> None:
    fake = compiler(lambda code: outcome("TimeLimitExceeded", seconds=10.0), held=True)
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(builds.build, "cpp", b"slow", 10)
        assert fake.started.wait(10)
        same = pool.submit(builds.build, "cpp", b"slow", 10)  # no more time: the same answer
        more = pool.submit(builds.build, "cpp", b"slow", 20)  # more time: its own compile
        assert wait_for(lambda: len(builds._kept._flights[_key(b"slow")].waiting) == 2)
        fake.release.set()
        answers = [first.result(30), same.result(30), more.result(30)]
    assert answers[1] == answers[0]
    assert len(fake.calls) == 2  # the one with more time compiled itself
    builds.build("cpp", b"slow", 10)  # load may have slowed it: the next case compiles
    assert len(fake.calls) == 3


def test_a_kept_compile_slower_than_a_cases_limit_is_not_that_cases(
    compiler: Callable[..., Compiler],
) -> None:
    fake = compiler(lambda code: outcome(seconds=4.0))
    builds.build("cpp", b"heavy", 10)
    builds.build("cpp", b"heavy", 5)
    assert len(fake.calls) == 1
    builds.build("cpp", b"heavy", 3)  # the service's compile would have run out of time
    assert len(fake.calls) == 2


# A failure of the node's that comes free again (a one-off: its processes ran out), or the
# leading case's own cancel.
ONE_OFF = BackendError(Diagnosis("no process could be made", "wait", "out-of-processes", False))
LASTING = BackendError(Diagnosis("a compile failed in /dev/shm with 1 MiB free", "free space", "x"))


@pytest.mark.parametrize("failure", [ONE_OFF, Refused(CASE_CANCELLED)])
def test_when_the_compile_waited_for_fails_each_waiter_compiles_itself(
    compiler: Callable[..., Compiler], failure: Exception
) -> None:
    calls = []

    def answer(code: bytes) -> compiled.Build:
        calls.append(code)
        if len(calls) == 1:
            raise failure  # the first case's: the node's, or its own cancel
        return outcome()

    fake = compiler(answer, held=True)
    with ThreadPoolExecutor(2) as pool:
        first, waiter = compiling_and_waiting(pool, fake, b"x")
        fake.release.set()
        with pytest.raises(type(failure)):
            first.result(30)
        assert waiter.result(30).program == b"P"
    assert len(fake.calls) == 2
    assert builds.build("cpp", b"x", 10).program == b"P" and len(fake.calls) == 2


def test_the_nodes_lasting_failure_is_given_to_the_cases_that_waited_not_met_again_by_each(
    compiler: Callable[..., Compiler],
) -> None:
    # A full disk: each of a solution's 64 cases compiling in turn to meet it again would hold
    # the last one for 63 compiles.
    def answer(code: bytes) -> compiled.Build:
        raise LASTING

    fake = compiler(answer, held=True)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(builds.build, "cpp", b"x", 10)
        assert fake.started.wait(10)
        waiters = [pool.submit(builds.build, "cpp", b"x", 10) for _ in range(7)]
        flight = builds._kept._flights[_key(b"x")]
        assert wait_for(lambda: len(flight.waiting) == 7)
        fake.release.set()
        for future in [first, *waiters]:
            with pytest.raises(BackendError) as raised:
                future.result(30)
            assert raised.value.diagnosis == LASTING.diagnosis
    assert len(fake.calls) == 1
    # nothing kept: a later case compiles (the disk may have room again)
    with pytest.raises(BackendError):
        builds.build("cpp", b"x", 10)
    assert len(fake.calls) == 2


@pytest.mark.parametrize("kind", ["Cancel", "plain Event"])
def test_a_waiter_cancelled_is_answered_cancelled_and_the_compile_goes_on(
    compiler: Callable[..., Compiler], kind: str
) -> None:
    fake = compiler(held=True)
    cancel = cancels.Cancel() if kind == "Cancel" else threading.Event()
    with ThreadPoolExecutor(2) as pool:
        first, waiter = compiling_and_waiting(pool, fake, b"y", cancel)
        cancel.set()
        with pytest.raises(Refused, match=CASE_CANCELLED):
            waiter.result(5)  # at once, the compile still running
        assert not first.done()
        fake.release.set()
        assert first.result(30).program == b"P"
    assert len(fake.calls) == 1
    assert not builds._kept._flights  # and nothing waits on for it


def test_at_most_kept_bytes_are_kept_the_least_recently_used_going_first(
    compiler: Callable[..., Compiler], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = compiler(lambda code: outcome(program=b"p" * 1000))
    monkeypatch.setattr(builds, "KEPT_BYTES", 3200)  # two of them (1,000 bytes and 512 each)
    for source in (b"a", b"b", b"a", b"c", b"a", b"b"):
        builds.build("cpp", source, 10)
    # a, b compiled; a kept; c compiled (b goes); a kept; b compiled again (c goes)
    assert fake.calls == [b"a", b"b", b"c", b"b"]
    monkeypatch.setattr(builds, "KEPT_BYTES", 100)  # larger than all it may keep: not kept
    builds.forget()
    builds.build("cpp", b"a", 10)
    builds.build("cpp", b"a", 10)
    assert fake.calls[-2:] == [b"a", b"a"]


def test_a_new_toolchain_or_memory_limit_compiles_again(
    compiler: Callable[..., Compiler], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = compiler()
    builds.build("cpp", b"z", 10)
    monkeypatch.setattr(compiled, "toolchain", lambda language: ("another g++", language))
    builds.build("cpp", b"z", 10)
    assert len(fake.calls) == 2


def test_a_forked_child_keeps_nothing_of_its_parents(compiler: Callable[..., Compiler]) -> None:
    fake = compiler()
    builds.build("cpp", b"f", 10)
    pid = os.fork()
    if pid == 0:  # the child: its first case of that source compiles it
        try:
            builds.build("cpp", b"f", 10)
            os._exit(0 if len(fake.calls) == 2 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _key(code: bytes) -> tuple[object, ...]:
    import hashlib

    return ("cpp", ("toolchain", "cpp"), hashlib.sha256(code).digest())
