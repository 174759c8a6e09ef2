"""What is said once per cause: the count per cause that decides it, and when a count is worth
saying again (the first, then every power of ten)."""

from __future__ import annotations

import threading

from verl_hyperlight.errors import CauseCounts, worth_logging


def test_a_cause_is_first_only_the_first_time_and_each_cause_on_its_own() -> None:
    counts = CauseCounts()
    assert counts.first("kvm")
    assert not counts.first("kvm")
    assert counts.first("image-pull")
    assert counts.count("kvm") == 3
    assert counts.counts() == {"kvm": 3, "image-pull": 1}


def test_a_count_is_worth_logging_the_first_time_then_at_every_power_of_ten() -> None:
    counts = CauseCounts()
    said = [count for count in (counts.count("kvm") for _ in range(10_000)) if worth_logging(count)]
    assert said == [1, 10, 100, 1000, 10_000]


def test_counts_from_many_threads_at_once_are_all_counted_and_one_is_first() -> None:
    counts = CauseCounts()
    threads, per_thread = 16, 2000
    firsts: list[bool] = []
    start = threading.Barrier(threads)

    def count() -> None:
        start.wait()
        found = [counts.first("stall") for _ in range(per_thread)]
        firsts.extend(found)  # list.extend is atomic under the GIL

    workers = [threading.Thread(target=count) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert counts.counts() == {"stall": threads * per_thread}
    assert firsts.count(True) == 1


def test_the_counts_read_are_a_copy_that_later_counts_leave_alone() -> None:
    counts = CauseCounts()
    counts.count("kvm")
    read = counts.counts()
    counts.count("kvm")
    assert read == {"kvm": 1} and counts.counts() == {"kvm": 2}
