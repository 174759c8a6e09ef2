"""A worker forked while another of its threads holds a lock of the case path (the gates'
registry's, a guest's gate's, the pytest copy's): the child, in which that thread does not
exist, still runs its cases, as it does after a fork while a spawner's lock is held."""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Callable

import pytest
from hostside import URL, Host, result, run

from verl_hyperlight.case import gate as _gate
from verl_hyperlight.case import pytest_library as _guest_pytest
from verl_hyperlight.case.guests import guest_for
from verl_hyperlight.hluk import binary as _binary

# Far longer than a first case takes (a warm-up and the case): only a deadlocked child waits
# it out.
CHILD_DEADLINE_SECONDS = 60
CODE = {"python": "print('ok')", "pytest": "def test_ok():\n    assert True\n"}
MEMORY_LIMIT_MB = 1024


def registry_lock() -> threading.Lock:
    return _gate._registry_lock


def gate_lock() -> threading.Lock:
    return _gate.gate(_binary.hluk_path(), guest_for(URL, MEMORY_LIMIT_MB))._lock


def pytest_copy_lock() -> threading.Lock:
    return _guest_pytest._lock


def in_a_forked_child(case: Callable[[], str]) -> str:
    """What `case` returns in a child forked now, or "deadlocked" if it never returns."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            try:
                answer = case()
            except BaseException as exc:
                answer = repr(exc)
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        poller = select.poll()
        poller.register(read, select.POLLIN)
        if not poller.poll(CHILD_DEADLINE_SECONDS * 1000):
            return "deadlocked"
        return os.read(read, 65536).decode()
    finally:
        os.close(read)
        os.kill(pid, signal.SIGKILL)  # a child that answered is a zombie by now, or soon
        os.waitpid(pid, 0)


@pytest.mark.parametrize(
    ("held", "language"),
    [(registry_lock, "python"), (gate_lock, "python"), (pytest_copy_lock, "pytest")],
    ids=["the gates' registry", "a gate", "the pytest copy"],
)
def test_a_fork_while_another_thread_holds_a_lock_leaves_the_child_running_cases(
    host: Host, held: Callable[[], threading.Lock], language: str
) -> None:
    lock = held()
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            done.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait()
    try:
        answer = in_a_forked_child(
            lambda: result(run(CODE[language], memory=MEMORY_LIMIT_MB, language=language))[0]
        )
    finally:
        done.set()
        holder.join()
    assert answer == "Success"
