"""This node's CPUs and memory, read here only, and the share of the memory each use may take.

The node is what this process may use: its CPUs are those it may run on (its affinity, less a
container's CPU quota), its memory the machine's, less a container's memory limit (cgroup v2's
``memory.max``, or v1's ``memory.limit_in_bytes``, as a container sees its own at
``/sys/fs/cgroup``). Each use of the memory takes a share of it, one rule each:

- a case's memory limit: at most ``CASE_SHARE`` of it (`most_case_memory_mb`): run_code refuses
  a case past it, serve a request, the commands a --memory-limit-mb;
- a tool's idle notebooks: ``NOTEBOOKS_SHARE`` of it (`notebooks_memory_mb`), shared by verl's
  agent-loop workers, sizes the code tool's default max_sessions;
- serve's request bodies held at once: ``BODIES_SHARE`` of it (`bodies_memory_bytes`) by default;
- doctor's sizing: what is available now (`available_mb`), against each micro-VM's memory and
  ``HOST_MB_PER_CASE`` more on the host for each case.
"""

from __future__ import annotations

import math
import os
import time

MIB = 1024 * 1024
CASE_SHARE = 1 / 2
NOTEBOOKS_SHARE = 1 / 2
BODIES_SHARE = 1 / 16
# What a case may hold on the host besides its micro-VM, at most (its output, its case
# directory's pages, its share of the worker's buffers).
HOST_MB_PER_CASE = 96
# Where a container's cgroup shows: v2, then v1.
CGROUP = "/sys/fs/cgroup"
MEMORY_FILES = (
    ("memory.max", "memory.current"),
    ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
)
MEMINFO = "/proc/meminfo"


def cpus() -> int:
    """The CPUs this process may run on (its affinity), fewer under a container's CPU quota
    (cgroup v2's ``cpu.max``, v1's ``cpu.cfs_quota_us``), at least 1."""
    found = len(os.sched_getaffinity(0))
    quota = _cpu_quota()
    return max(1, min(found, math.ceil(quota))) if quota is not None else found


def _cpu_quota() -> float | None:
    """A container's CPU quota, in CPUs; None when it has none."""
    text = _read(os.path.join(CGROUP, "cpu.max"))
    if text is not None:
        quota, _, period = text.partition(" ")
        if quota.isdigit() and period.strip().isdigit() and int(period):
            return int(quota) / int(period)
        return None
    quota_text = _read(os.path.join(CGROUP, "cpu", "cpu.cfs_quota_us"))
    period_text = _read(os.path.join(CGROUP, "cpu", "cpu.cfs_period_us"))
    if quota_text and period_text and quota_text.isdigit() and period_text.isdigit():
        return int(quota_text) / int(period_text) if int(period_text) else None
    return None  # -1: no quota


# How long the node's memory, as read, is taken as still true: every case asks (the largest
# limit it may ask for), and a container's limit is two files to read; a limit changed
# (`docker update`) is seen within this.
MEMORY_SECONDS = 5.0
_memory_seen = (-math.inf, 0)  # (read at, MiB)


def memory_mb() -> int:
    """This node's memory, MiB: the machine's, or a container's limit when that is less (as
    read within MEMORY_SECONDS)."""
    global _memory_seen
    now = time.monotonic()
    read_at, found = _memory_seen
    if now - read_at < MEMORY_SECONDS:
        return found
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limit = _container_memory(usage_too=False)
    found = min(physical, limit[0] if limit else physical) // MIB
    _memory_seen = (now, found)
    return found


def available_mb() -> int | None:
    """The memory available now, MiB: the kernel's MemAvailable, or what a container's limit
    leaves when that is less; None where the kernel does not say."""
    available = None
    try:
        with open(MEMINFO) as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if available is None:
        return None
    limit = _container_memory()
    if limit is not None:
        available = min(available, max(0, limit[0] - limit[1]))
    return available // MIB


def _container_memory(usage_too: bool = True) -> tuple[int, int] | None:
    """A container's memory limit and what it uses now (0 unless `usage_too`), in bytes; None
    when it has no limit ("max" in v2, v1's number near 2**63)."""
    for limit_name, usage_name in MEMORY_FILES:
        text = _read(os.path.join(CGROUP, limit_name))
        if text is None:
            continue
        if not text.isdigit() or int(text) >= 1 << 62:
            return None
        usage = (_read(os.path.join(CGROUP, usage_name)) if usage_too else None) or "0"
        return int(text), int(usage) if usage.isdigit() else 0
    return None


def most_case_memory_mb() -> int:
    """The largest memory limit a case may ask for: CASE_SHARE of the node's memory."""
    return int(memory_mb() * CASE_SHARE)


def notebooks_memory_mb() -> int:
    """The memory the code tool's notebooks of one node may hold: NOTEBOOKS_SHARE of it."""
    return int(memory_mb() * NOTEBOOKS_SHARE)


def bodies_memory_bytes() -> int:
    """The bytes of request bodies serve holds at once by default: BODIES_SHARE of the node's
    memory."""
    return int(memory_mb() * BODIES_SHARE) * MIB


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
