"""Was the box busy? The machine's state over a measurement run, read from /proc and /sys.

A timing's recorded range only says how much it varied, not why: with another job using
both cores, the plain step H moved tenfold between two identical runs and was judged
"within noise" because the range itself was that wide. So each run records what else
the machine was doing while it measured:

* ``machine.busy``: CPU time taken by *other* processes (and by the hypervisor, as steal)
  over the run, as a fraction of all CPUs' wall time. It is the busy time of
  ``/proc/stat`` minus the CPU time of our own process tree (this process, its live
  descendants, and the children they have reaped: cutime/cstime), so the Jupyter kernel
  doing the measuring is never counted against the box.
* ``machine.load1``: the 1-minute load average at the end (it lags; busy is the measure).
* ``machine.freq_mhz.min/max``: CPU frequency from ``cpufreq`` where the kernel exposes
  it (not in most VMs), else what ``/proc/cpuinfo`` reports, with its source recorded.

A run whose ``busy`` exceeds ``CONTENDED`` is tagged ``machine.contended = true``; the
drift report names such runs, and a recipe's ``max_busy`` refuses to measure at all on a
box that is busy beforehand. Linux only: elsewhere nothing is recorded (and a recipe that
sets ``max_busy`` is told so).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit.errors import LabkitError

CONTENDED = 0.25  # other processes took over a quarter of all CPU time: timings are not the box's own
_PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class Snapshot:
    """Cumulative counters at one instant (seconds of CPU time, all CPUs together)."""

    t: float
    cpus: int
    busy_s: float  # every CPU's non-idle time: user, nice, system, irq, softirq, steal
    own_s: float  # our process tree's CPU time, reaped children included
    per_pid: dict = field(default_factory=dict)  # pid -> (name, CPU seconds), for naming who was busy


def supported() -> bool:
    return (_PROC / "stat").is_file()


def _proc_stat() -> tuple[int, float]:
    lines = (_PROC / "stat").read_text().splitlines()
    total = lines[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in total[:8])
    cpus = sum(1 for x in lines if x.startswith("cpu") and x[3:4].isdigit())
    return cpus, (user + nice + system + irq + softirq + steal) / _TICK


def _pid_stat(pid: int) -> tuple[str, int, float, float] | None:
    """(name, ppid, own CPU s, reaped children's CPU s) of one process, None if it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1:text.rindex(")")]
    f = text[text.rindex(")") + 2:].split()  # f[0] is field 3 (state)
    return name, int(f[1]), (int(f[11]) + int(f[12])) / _TICK, (int(f[13]) + int(f[14])) / _TICK


def snapshot(root: int | None = None) -> Snapshot:
    """The counters now; ``root`` (default: this process) and its descendants are "own"."""
    root = os.getpid() if root is None else root
    cpus, busy = _proc_stat()
    procs = {}
    for d in _PROC.iterdir():
        if d.name.isdigit():
            s = _pid_stat(int(d.name))
            if s is not None:
                procs[int(d.name)] = s
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    own, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            own += procs[pid][2] + procs[pid][3]
            todo += children.get(pid, [])
    per_pid = {pid: (name, cpu) for pid, (name, _, cpu, _) in procs.items()}
    return Snapshot(time.monotonic(), cpus, busy, own, per_pid)


def frequencies() -> dict:
    """CPU frequency in MHz per CPU: cpufreq where exposed, else /proc/cpuinfo."""
    cur = []
    for f in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq")):
        try:
            cur.append(int(f.read_text()) / 1000)
        except (OSError, ValueError):
            pass
    if cur:
        return {"mhz": cur, "source": "cpufreq"}
    try:
        mhz = [float(line.split(":")[1]) for line in (_PROC / "cpuinfo").read_text().splitlines()
               if line.startswith("cpu MHz")]
    except OSError:
        mhz = []
    return {"mhz": mhz, "source": "/proc/cpuinfo" if mhz else "not readable"}


def between(a: Snapshot, b: Snapshot, *, top: int = 3) -> dict:
    """What the machine did between two snapshots, as run metrics/tags (``machine.*``)."""
    wall = max(b.t - a.t, 1e-9)
    others = max(0.0, (b.busy_s - a.busy_s) - (b.own_s - a.own_s))
    busy = min(1.0, others / (wall * b.cpus))
    load1 = float((_PROC / "loadavg").read_text().split()[0])
    freq = frequencies()
    # who else was busy: the biggest CPU consumers among processes alive at both ends
    hogs = sorted(((cpu - a.per_pid[pid][1], name, pid) for pid, (name, cpu) in b.per_pid.items()
                   if pid in a.per_pid and a.per_pid[pid][0] == name), reverse=True)
    out = {
        "machine.busy": round(busy, 4),
        "machine.others_cpu_s": round(others, 2),
        "machine.own_cpu_s": round(b.own_s - a.own_s, 2),
        "machine.wall_s": round(wall, 2),
        "machine.cpus": b.cpus,
        "machine.load1": load1,
        "machine.contended": busy > CONTENDED,
        "machine.freq_source": freq["source"],
        "machine.top_others": ", ".join(f"{name} (pid {pid}) {cpu / wall:.0%}" for cpu, name, pid in hogs[:top]
                                        if cpu / wall >= 0.05),
    }
    if freq["mhz"]:
        out.update({"machine.freq_mhz.min": min(freq["mhz"]), "machine.freq_mhz.max": max(freq["mhz"])})
    return out


def probe(seconds: float = 2.0) -> dict:
    """The machine's state over the next ``seconds`` (this process idle meanwhile)."""
    a = snapshot()
    time.sleep(seconds)
    return between(a, snapshot())


def refuse_if_busy(max_busy: float | None, *, seconds: float = 2.0) -> dict | None:
    """With a recipe's ``max_busy`` set, refuse to measure on a box already busier than it."""
    if max_busy is None:
        return None
    if not supported():
        raise LabkitError("max_busy is set but this system has no /proc/stat to measure how busy it is",
                          "remove max_busy from the recipe on this system")
    state = probe(seconds)
    if state["machine.busy"] > max_busy:
        who = state["machine.top_others"] or "no single process stood out"
        raise LabkitError(
            f"the machine is busy: other processes took {state['machine.busy']:.0%} of its {state['machine.cpus']} "
            f"CPUs over {seconds:.0f} s (recipe max_busy = {max_busy:.0%}; busiest: {who})",
            "wait for the other work to finish (or stop it), then rerun; raise or remove max_busy in the recipe "
            "to measure anyway (the run is then tagged machine.contended)",
        )
    return state


def tags(state: dict) -> dict:
    """A state as run tags (strings). Tags, not metrics: the drift report compares every
    metric between runs, and how busy the box was is the context of a change, not one."""
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in state.items()}
