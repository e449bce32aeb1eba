"""One reproduction at a time per checkout and per tracking store.

Two reproductions started in the same second used to share one output folder: one
journal received both runs' records and each summary overwrote the other. Folders are
now unique (``output_folder``), and a reproduction also holds an exclusive lock on its
checkout (``runs/.labkit-reproduce.lock``) and on its store (beside a SQLite database,
else a file in the cache per server URI and host label: a team server takes one
reproduction from each host at a time), so two of them never measure at once on one box or
into one store. A second one refuses, naming the first (pid, host, start time, the LAB ID
it is running), or waits for it with ``wait``.

The locks are ``flock(2)`` locks: the kernel drops them when the holder exits, however
it exits (SIGKILL included), so a crashed run never leaves a stale lock behind. The file
only *describes* the holder; holding the lock is what counts.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from labkit.errors import LabkitError
from labkit.paths import cache_dir, project_root

LOCK_NAME = ".labkit-reproduce.lock"


def output_folder(recipe_name: str, *, root: Path | None = None, now: float | None = None) -> Path:
    """A new, unique ``runs/<timestamp>-<recipe>-<token>`` folder (created here, so two
    reproductions in the same second can never be handed the same one)."""
    base = (root or project_root() / "runs")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    while True:
        out = base / f"{stamp}-{recipe_name}-{secrets.token_hex(2)}"
        try:
            out.mkdir(parents=True)
            return out
        except FileExistsError:
            continue


def lock_paths(tracking_uri: str) -> list[Path]:
    """The checkout's lock and the store's lock, in the order they are taken."""
    paths = [project_root() / "runs" / LOCK_NAME]
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):])
        paths.append(db.with_name(db.name + LOCK_NAME))
    else:  # a team server takes runs from many hosts at once: one reproduction per host label on it
        from labkit.provenance.fingerprint import host_label

        key = hashlib.sha256(f"{tracking_uri}\n{host_label()[0]}".encode()).hexdigest()[:12]
        paths.append(cache_dir() / "locks" / f"store-{key}{LOCK_NAME}")
    return paths


class RunLock:
    """Held locks plus the description other processes read."""

    def __init__(self, files: list, info: dict):
        self._files = files
        self.info = info

    def update(self, **fields) -> None:
        """Say what the holder is doing now (e.g. the LAB ID of the notebook it runs)."""
        self.info.update(fields)
        for f in self._files:
            f.seek(0)
            f.truncate()
            f.write(json.dumps(self.info))
            f.flush()

    def release(self) -> None:
        for f in reversed(self._files):
            f.seek(0)
            f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
        self._files = []


def _holder(f) -> dict:
    for _ in range(10):  # the holder writes its description right after locking
        f.seek(0)
        text = f.read()
        if text:
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                pass
        time.sleep(0.05)
    return {}


def _describe(h: dict) -> str:
    if not h:
        return "another reproduction (it has not described itself yet)"
    what = h['lab_id'] if h.get('lab_id') else "no notebook yet"  # already 'LAB:…'
    return (f"the reproduction of recipe {h.get('recipe')!r} with pid {h.get('pid')} on {h.get('host')}, "
            f"started {h.get('started')}, running {what}, writing to {h.get('output')}")


@contextmanager
def hold(paths: list[Path], info: dict, *, wait: float | None = None,
         progress: Callable | None = None) -> Iterator[RunLock]:
    """Take every lock in ``paths`` or refuse (``wait`` None), naming who holds it; with
    ``wait`` seconds, wait that long for the holder to finish first."""
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **info}
    files: list = []
    try:
        for p in paths:
            p.parent.mkdir(parents=True, exist_ok=True)
            f = open(p, "a+")
            files.append(f)
            deadline = None if wait is None else time.monotonic() + wait
            told = False
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    other = _describe(_holder(f))
                    if deadline is None or time.monotonic() > deadline:
                        raise LabkitError(
                            f"another reproduction is running into this {'checkout' if p == paths[0] else 'store'} "
                            f"({p}): {other}",
                            "wait for it to finish (`labkit reproduce --wait SECONDS` queues behind it), or stop it; "
                            "two at once would contend for the CPU and mix their records",
                        ) from None
                    if progress and not told:
                        progress(f"waiting for {other}")
                        told = True
                    time.sleep(0.5)
        lock = RunLock(files, info)
        lock.update()
    except BaseException:
        for f in files:
            f.close()  # closing drops any lock already taken
        raise
    try:
        yield lock
    finally:
        lock.release()
