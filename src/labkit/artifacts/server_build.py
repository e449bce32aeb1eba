"""llama-server from the one llama.cpp build of this machine (``artifacts.native``).

Comparing labkit's loop with llama.cpp's own server means nothing unless both run the
same kernels: the server is a target of the very build whose ``libllama.so`` the Python
engine loads (same sources, same flags, same file by checksum). ``make setup`` builds it;
``build()`` is then a no-op that returns the cached binary (``cached: True``), and builds
it (or just the missing target) only on a machine whose setup predates the tool.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from labkit.engines import native
from labkit.errors import LabkitError

BINARY = "llama-server"
LLAMA_CPP_PYTHON_VERSION = native.VERSION

Progress = Callable[[str], None] | None


def build_dir() -> Path:
    return native.build_dir()


def _info(b: dict, **extra) -> dict:
    return {**{k: v for k, v in b.items() if k not in ("missing",)}, "binary": BINARY,
            "path": str(Path(b["bin"]) / BINARY), "build_dir": b["dir"], **extra}


def find() -> dict | None:
    """The cached build's record plus ``path`` of llama-server, or None."""
    b = native.find()
    if b is None or BINARY in b["missing"]:
        return None
    return _info(b)


def require() -> dict:
    info = find()
    if info is None:
        raise LabkitError(f"llama-server is not built for this machine (looked in {build_dir()})",
                          "run `make setup` or `labkit server build` (one llama.cpp build for Python and the tools)")
    return info


def build(*, force: bool = False, jobs: int | None = None, progress: Progress = None, sdist: Path | None = None) -> dict:
    """The cached server (``cached: True``), else the one build made now."""
    b = native.build(force=force, jobs=jobs, progress=progress, sdist=sdist)
    return _info(b, cached=b["cached"])
