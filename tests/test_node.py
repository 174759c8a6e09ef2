"""This node's CPUs and memory: a container's limits count, as a pod's do on a 64-core node."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

from verl_hyperlight import node

GIB = 1024**3


@pytest.fixture
def cgroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A container's cgroup directory, empty: no limit until a test writes one; the memory
    read again at each ask (but in the test of how long a reading is kept)."""
    monkeypatch.setattr(node, "CGROUP", str(tmp_path))
    monkeypatch.setattr(node, "MEMORY_SECONDS", 0.0)
    monkeypatch.setattr(node, "_memory_seen", (-math.inf, 0))
    return tmp_path


def physical_mb() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // node.MIB


def test_without_a_container_limit_the_node_is_the_machine(cgroup: Path) -> None:
    assert node.memory_mb() == physical_mb()
    assert node.cpus() == len(os.sched_getaffinity(0))
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "cpu.max").write_text("max 100000\n")
    assert node.memory_mb() == physical_mb()
    assert node.cpus() == len(os.sched_getaffinity(0))


def test_a_pods_memory_limit_is_its_memory_and_its_shares_follow(cgroup: Path) -> None:
    (cgroup / "memory.max").write_text(f"{2 * GIB}\n")
    (cgroup / "memory.current").write_text(f"{GIB // 2}\n")
    assert node.memory_mb() == 2048
    assert node.most_case_memory_mb() == 1024  # verl's default limit still fits
    assert node.notebooks_memory_mb() == 1024
    assert node.bodies_memory_bytes() == 128 * node.MIB
    available = node.available_mb()
    assert available is not None and available <= 1536  # what the limit leaves


def test_a_cgroup_v1_limit_counts_and_its_unlimited_value_does_not(cgroup: Path) -> None:
    (cgroup / "memory").mkdir()
    (cgroup / "memory" / "memory.limit_in_bytes").write_text(f"{4 * GIB}\n")
    assert node.memory_mb() == 4096
    (cgroup / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert node.memory_mb() == physical_mb()


@pytest.mark.parametrize(
    ("v2", "v1", "cpus"),
    [
        ("150000 100000", None, 2),  # 1.5 CPUs of quota: 2 at once is what it may run
        ("50000 100000", None, 1),
        (None, ("100000", "100000"), 1),
        (None, ("-1", "100000"), None),  # no quota
    ],
)
def test_a_cpu_quota_caps_the_cpus(
    cgroup: Path, v2: str | None, v1: tuple[str, str] | None, cpus: int | None
) -> None:
    if v2 is not None:
        (cgroup / "cpu.max").write_text(v2 + "\n")
    if v1 is not None:
        (cgroup / "cpu").mkdir()
        (cgroup / "cpu" / "cpu.cfs_quota_us").write_text(v1[0] + "\n")
        (cgroup / "cpu" / "cpu.cfs_period_us").write_text(v1[1] + "\n")
    affinity = len(os.sched_getaffinity(0))
    assert node.cpus() == (affinity if cpus is None else min(cpus, affinity))


def test_available_memory_is_the_kernels_word(
    cgroup: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1000000 kB\nMemAvailable: 524288 kB\n")
    monkeypatch.setattr(node, "MEMINFO", str(meminfo))
    assert node.available_mb() == 512
    meminfo.write_text("MemTotal: 1000000 kB\n")  # an old kernel: it does not say
    assert node.available_mb() is None


def test_the_memory_read_is_kept_a_few_seconds_then_read_again(
    cgroup: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every case asks for the node's memory: a reading is kept MEMORY_SECONDS, and a limit
    changed meanwhile (`docker update`) is seen once that has passed."""
    monkeypatch.setattr(node, "MEMORY_SECONDS", 0.5)
    (cgroup / "memory.max").write_text(f"{2 * GIB}\n")
    assert node.memory_mb() == 2048
    (cgroup / "memory.max").write_text(f"{4 * GIB}\n")
    assert node.memory_mb() == 2048
    time.sleep(0.6)
    assert node.memory_mb() == 4096
