"""CPU time, which every machine has: this process's, and (on Linux) the whole system's.

CPU seconds are not energy, but they are an honest, always-available cost measure and
the fallback when no energy counter exists.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuSnapshot:
    process_s: float  # user + sys of every thread of this process
    children_s: float  # user + sys of children already waited for
    system_busy_ticks: int | None  # all CPUs, /proc/stat; None where there is none


def parse_proc_stat(text: str) -> int:
    """Busy clock ticks of all CPUs from ``/proc/stat``'s first ``cpu`` line.

    Busy = user + nice + system + irq + softirq. Idle and iowait are not work; steal
    is time a hypervisor gave to someone else; guest time is already inside user/nice.
    """
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
            return user + nice + system + irq + softirq
    raise ValueError("no aggregate 'cpu' line in /proc/stat text")


def read_system_busy_ticks(*, path: Path = PROC_STAT) -> int | None:
    try:
        return parse_proc_stat(path.read_text())
    except OSError:
        return None  # not Linux: system-wide CPU time is reported as unavailable


def clock_ticks_per_s() -> int:
    return os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def snapshot(*, proc_stat: Path = PROC_STAT) -> CpuSnapshot:
    t = os.times()
    return CpuSnapshot(
        process_s=time.process_time(),
        children_s=t.children_user + t.children_system,
        system_busy_ticks=read_system_busy_ticks(path=proc_stat),
    )


def cpu_delta(start: CpuSnapshot, end: CpuSnapshot, *, ticks_per_s: int | None = None) -> dict:
    """CPU seconds spent between two snapshots (``cpu_system_s`` None where unmeasurable)."""
    system = None
    if start.system_busy_ticks is not None and end.system_busy_ticks is not None:
        hz = ticks_per_s or clock_ticks_per_s()
        system = (end.system_busy_ticks - start.system_busy_ticks) / hz
    return {
        "cpu_process_s": end.process_s - start.process_s,
        "cpu_children_s": end.children_s - start.children_s,
        "cpu_system_s": system,
    }
