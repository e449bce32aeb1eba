"""Where labkit keeps things: the project root, the model cache, the tracking store."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def project_root() -> Path:
    """The checkout labkit runs from (the folder holding pyproject.toml), else the cwd."""
    env = os.environ.get("LABKIT_ROOT")
    if env:
        return Path(env).resolve()
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for d in (start, *start.parents):
            if (d / "pyproject.toml").is_file() and (d / "src" / "labkit").is_dir():
                return d
    return Path.cwd()


def cache_dir() -> Path:
    """Models and built wheels: ``$LABKIT_CACHE`` or ``~/.cache/labkit``."""
    d = Path(os.environ.get("LABKIT_CACHE", Path.home() / ".cache" / "labkit"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def data_dir() -> Path:
    return project_root() / "data"


def experiments_dir() -> Path:
    return project_root() / "experiments"


@contextlib.contextmanager
def exclusive(lock_file: Path):
    """Hold an exclusive advisory lock on ``lock_file`` (created if missing) for the ``with``
    block: one process at a time builds a cached artifact or creates a store; the others wait,
    then find it made. The kernel drops the lock when its holder exits, however it exits.
    A no-op where fcntl does not exist."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as f:  # closing it releases the lock
        try:
            import fcntl
        except ImportError:
            yield
            return
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
