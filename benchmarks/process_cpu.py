"""The CPU a process has used, and the cores a benchmark may pin its tools to (Linux: /proc)."""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# /proc/<pid>/stat after the command's closing parenthesis: field 3 (state) first, so utime (field 14)
# and stime (field 15) sit at these indexes.
UTIME_INDEX, STIME_INDEX = 11, 12
CORES_TO_PIN = 2  # pinning takes a core for the tools apart from the rest; with one core there is none


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of every thread of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[UTIME_INDEX]) + int(fields[STIME_INDEX])) / CLOCK_TICKS_PER_S


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def pinning_by_default() -> bool:
    return len(usable_cores()) >= CORES_TO_PIN
