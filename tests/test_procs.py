"""The tests' /proc helpers (tests/procs.py) on real processes, including one that has exited:
the resume chain once errored on a reproduction's short-lived child gone between two looks."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

import procs


def test_a_process_that_has_exited_reads_as_gone_and_never_raises():
    p = subprocess.Popen(["true"])
    p.wait()  # reaped: /proc/<pid> no longer exists
    assert procs.cmdline(p.pid) == "" and not procs.alive(p.pid)
    assert procs.wait_gone([p.pid], 1) == []


def test_a_killed_child_not_yet_reaped_is_not_alive():
    p = subprocess.Popen(["sleep", "30"])
    try:
        assert procs.alive(p.pid)
        p.kill()
        assert procs.wait_gone([p.pid], 10) == []  # a zombie until reaped: gone for the tests
        assert p.poll() is not None
    finally:
        p.kill()
        p.wait()


def test_descendants_alive_and_zombies():
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                              "subprocess.Popen(['sleep', '30']).wait()"])
    try:
        for _ in range(100):
            below = procs.descendants(os.getpid())
            grand = [p for p in below if procs.cmdline(p).startswith("sleep 30")]
            if grand:
                break
            procs.wait_gone([child.pid], 0.05)
        assert child.pid in below and grand, below
        assert procs.alive(child.pid) and procs.alive(grand[0])
        assert procs.kernels(os.getpid()) == []  # no ipykernel below this test
    finally:
        child.kill()
        child.wait()
    os.kill(grand[0], 9)
    assert procs.wait_gone([child.pid, grand[0]], 10) == []


def test_a_process_blocked_on_a_file_lock_reads_as_waiting(tmp_path):
    lock = tmp_path / "x.lock"
    code = f"import fcntl; f = open({str(lock)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX)"
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        p = subprocess.Popen([sys.executable, "-c", code])
        try:
            end = time.monotonic() + 60
            while not procs.waiting_on_lock(p.pid) and time.monotonic() < end:
                time.sleep(0.02)
            assert procs.waiting_on_lock(p.pid) and p.poll() is None
            assert not procs.waiting_on_lock(os.getpid())  # the holder is not a waiter
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
    assert p.wait(timeout=60) == 0 and not procs.waiting_on_lock(p.pid)  # it took the lock and exited
