"""What every run records about where it came from: code, recipe, engine, model, host."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version

from labkit.paths import project_root

PACKAGES = (
    "labkit", "llama-cpp-python", "numpy", "scipy", "pandas", "mlflow", "papermill",
    "jupyterlab", "seaborn", "matplotlib", "gguf", "mlx", "mlx-lm",
)


def git_info() -> dict:
    root = project_root()

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit or "unknown", "dirty": bool(status) if status is not None else None}


def host_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        if platform.system() == "Darwin":
            try:
                cpu = subprocess.run(
                    ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
                ).stdout.strip() or cpu
            except (OSError, subprocess.SubprocessError):
                pass
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "hostname": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def package_versions() -> dict:
    out = {}
    for p in PACKAGES:
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            continue
    return out


def collect(*, recipe=None, engine=None) -> dict:
    """Everything at once (git, host, packages; recipe and engine when given)."""
    d = {"git": git_info(), "host": host_info(), "packages": package_versions()}
    if recipe is not None:
        d["recipe"] = {"name": recipe.name, "hash": recipe.hash, "source": recipe.source, "fields": recipe.to_dict(),
                       "origins": dict(recipe.origins),
                       "gate": {"threshold": recipe.gate, "source": recipe.origin_of("gate")}}
    if engine is not None:
        d["engine"] = engine.describe()
    return d
