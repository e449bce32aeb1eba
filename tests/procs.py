"""Watching the processes a test starts, through /proc (Linux): descendants, command lines,
liveness. Any of them may exit between two looks (a reproduction's short-lived git or lscpu),
so a read that finds a process gone answers as if it were not there, never raises."""

from __future__ import annotations

import time
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int) -> str | None:
    try:
        return (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...), at this moment."""
    kids: dict[int, list[int]] = {}
    for d in PROC.iterdir():
        if d.name.isdigit() and (text := _stat(int(d.name))) is not None:
            kids.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(d.name))
    out, todo = [], list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def cmdline(pid: int) -> str:
    """The process's command line, space-separated; "" once it has exited."""
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def kernels(pid: int) -> list[int]:
    """The Jupyter kernels (ipykernel) below ``pid``."""
    return [p for p in descendants(pid) if "ipykernel" in cmdline(p)]


def alive(pid: int) -> bool:
    """Running: it exists and is not a zombie waiting to be reaped."""
    text = _stat(pid)
    return text is not None and text[text.rindex(")") + 2] != "Z"


def wait_gone(pids, seconds: float) -> list[int]:
    """Wait up to ``seconds`` for ``pids`` to end; returns those still alive."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


def waiting_on_lock(pid: int) -> bool:
    """``pid`` is blocked on a file lock (flock or fcntl): /proc/locks lists each waiter as
    ``N: -> FLOCK  ADVISORY  WRITE <pid> ...``, beside the lock it waits for."""
    try:
        lines = (PROC / "locks").read_text().splitlines()
    except OSError:
        return False
    return any(len(f := line.split()) > 5 and f[1] == "->" and f[5] == str(pid) for line in lines)
