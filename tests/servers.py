"""Servers the tests (and scripts/screenshot-lab.py) start: a free 127.0.0.1 port, a wait
until the server answers over HTTP (bounded, failing with its log), and a stop that
always ends the process (terminate, then kill)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(url: str, proc: subprocess.Popen, *, timeout: float, what: str, log: Path | None = None,
                  interval: float = 0.5) -> None:
    """Poll ``url`` until it answers; AssertionError (with the log's tail) when ``proc`` exits
    or ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).read()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text()[-3000:] if log is not None and log.exists() else "(no log)"
                raise AssertionError(f"{what} did not start:\n{tail}") from None
            time.sleep(interval)


def stop(proc: subprocess.Popen, *, timeout: float = 30) -> None:
    """Terminate ``proc`` (a server shuts its children down on SIGTERM); kill it if it does not exit."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
