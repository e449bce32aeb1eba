"""What every run records about where it came from: code, recipe, engine, model, host."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

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


CPUINFO = "/proc/cpuinfo"


def cpu_id(cpuinfo: str) -> str | None:
    """What tells two x86 CPUs apart when their model name does not, from /proc/cpuinfo's
    first processor: vendor, family, model, stepping and the widest vector ISA, e.g.
    "AuthenticAMD family 25 model 1 stepping 1, AVX2". Clouds report "AMD EPYC" for Zen 2,
    Zen 3 and Zen 4 alike, and a model steps at very different speeds on them (the ISA
    decides which ggml kernels run). None where the text has no x86 identification."""
    first = cpuinfo.split("\n\n", 1)[0]
    f = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in first.splitlines()) if _}
    if "cpu family" not in f or "model" not in f:
        return None
    flags = set(f.get("flags", "").split())
    isa = ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "AVX" if "avx" in flags
           else "SSE" if flags else None)
    ident = " ".join(x for x in (f.get("vendor_id"), f"family {f['cpu family']}", f"model {f['model']}",
                                 f"stepping {f['stepping']}" if "stepping" in f else None) if x)
    return ident + (f", {isa}" if isa else "")


def host_info() -> dict:
    cpu = platform.processor() or platform.machine()
    ident = None
    try:
        with open(CPUINFO) as f:
            text = f.read()
        cpu = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), cpu)
        ident = cpu_id(text)
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
    label, label_source = host_label()
    return {
        "hostname": platform.node(),
        "label": label,
        "label_source": label_source,
        "cpu": cpu,
        "cpu_id": ident,
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "accelerator": accelerator(),
        "power": power_source(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def host_label() -> tuple[str, str]:
    """(label, where it came from): ``$LABKIT_HOST_LABEL`` (e.g. "mac-mini", "gpu-box"),
    else the hostname. Runs are compared, and "previous"/"latest" chosen, per label."""
    env = os.environ.get("LABKIT_HOST_LABEL", "").strip()
    return (env, "LABKIT_HOST_LABEL") if env else (platform.node() or "unknown", "hostname")


def _run(cmd: list[str]) -> str | None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def accelerator() -> str:
    """The accelerator a run could use: NVIDIA GPUs (nvidia-smi), Apple silicon (Metal), or "none"."""
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    if out:
        return "; ".join(line.strip() for line in out.splitlines() if line.strip())
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        chip = _run(["sysctl", "-n", "machdep.cpu.brand_string"]) or "Apple silicon"
        return f"{chip} (Metal)"
    return "none"


POWER_SUPPLY = "/sys/class/power_supply"


def power_source(*, sysfs: str = POWER_SUPPLY) -> str | None:
    """"mains" or "battery (NN%)" where the OS says; None where it does not (most servers).

    Linux: an online ``Mains`` supply means mains; else a ``Battery`` that is discharging
    means battery. macOS: the first line of ``pmset -g batt``."""
    if platform.system() == "Darwin":
        out = _run(["pmset", "-g", "batt"])
        if not out:
            return None
        pct = next((w.rstrip("%;") for w in out.split() if w.rstrip(";").endswith("%")), None)
        if "AC Power" in out.splitlines()[0]:
            return "mains"
        return f"battery ({pct}%)" if pct else "battery"
    root = Path(sysfs)
    if not root.is_dir():
        return None

    def read(d: Path, name: str) -> str | None:
        try:
            return (d / name).read_text().strip()
        except OSError:
            return None

    supplies = sorted(root.iterdir())
    mains = [d for d in supplies if read(d, "type") in ("Mains", "USB") and read(d, "online") is not None]
    batteries = [d for d in supplies if read(d, "type") == "Battery"]
    if any(read(d, "online") == "1" for d in mains):
        return "mains"
    for b in batteries:
        if read(b, "status") == "Discharging" or mains:
            cap = read(b, "capacity")
            return f"battery ({cap}%)" if cap else "battery"
    return None


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
