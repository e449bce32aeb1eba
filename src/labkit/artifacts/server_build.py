"""llama-server, built from the very llama.cpp sources (and flags) the wheel was built from.

Why build it ourselves: comparing labkit's loop with llama.cpp's own server means
nothing unless both run the same kernels. So the server comes from the llama-cpp-python
sdist's ``vendor/llama.cpp`` (same version as the wheel, hence the same commit), with the
wheel's CMake flags (read from the wheel's build.json, else the portable flags of
scripts/setup.sh), and is cached per machine like the wheel:

    ~/.cache/labkit/llama-server-<key>/llama-server    key = sha256(version | flags | machine)
    ~/.cache/labkit/llama-server-<key>/build.json      commit, flags, how long it took

Built on demand only (``labkit server build`` or the first server bench), never by the
default setup: it takes several minutes on 2 cores (the server also builds ``mtmd``).
The binary is linked statically (``BUILD_SHARED_LIBS=OFF``), so the cached file runs
on its own; no web UI and no HTTPS are compiled in (nothing is downloaded at build or
run time; the server only ever listens on loopback).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from labkit.errors import LabkitError
from labkit.paths import cache_dir

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# scripts/setup.sh's portable x86-64 flags (the -march=native build segfaults on AMX CPUs)
PORTABLE_FLAGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
# what the server build adds: a self-contained binary, no UI download, no TLS, nothing else built
SERVER_FLAGS = ("-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF "
                "-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF")
BINARY = "llama-server"

Progress = Callable[[str], None] | None


def wheel_flags() -> tuple[str, str]:
    """(CMake flags, where they came from): the installed wheel's, else setup.sh's default."""
    path = Path(sys.prefix) / "share" / "labkit" / "llama-build.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())["cmake_args"], str(path)
        except (ValueError, KeyError):
            pass
    env = os.environ.get("LLAMA_CMAKE_ARGS")
    if env is not None:
        return env, "env LLAMA_CMAKE_ARGS"
    return ("" if platform.system() == "Darwin" else PORTABLE_FLAGS), "scripts/setup.sh default"


def build_key(flags: str, *, version: str = LLAMA_CPP_PYTHON_VERSION) -> str:
    return hashlib.sha256(f"{version}|{flags}|{SERVER_FLAGS}|{platform.machine()}".encode()).hexdigest()[:12]


def build_dir(flags: str | None = None) -> Path:
    flags = wheel_flags()[0] if flags is None else flags
    return cache_dir() / f"llama-server-{build_key(flags)}"


def find() -> dict | None:
    """The cached build for this machine's flags: its build.json plus ``path``, or None."""
    d = build_dir()
    exe, meta = d / BINARY, d / "build.json"
    if exe.is_file() and os.access(exe, os.X_OK) and meta.is_file():
        return {**json.loads(meta.read_text()), "path": str(exe)}
    return None


def require() -> dict:
    """The cached build, or a LabkitError saying how to make it."""
    info = find()
    if info is None:
        raise LabkitError(f"llama-server is not built for this machine (looked in {build_dir()})",
                          "run `labkit server build` (several minutes on 2 cores, once per machine)")
    return info


def _run(cmd: list[str], log: Path, *, cwd: Path | None = None, env: dict | None = None) -> None:
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        rc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:])
        raise LabkitError(f"`{' '.join(cmd[:4])} ...` failed (exit {rc}); log tail:\n{tail}",
                          f"read the full log {log}; cmake and a C++ compiler are needed "
                          "(Debian: apt-get install -y cmake g++)")


def build(*, force: bool = False, jobs: int = 2, progress: Progress = None, sdist: Path | None = None) -> dict:
    """Build (or find cached) llama-server; returns its build.json plus ``path`` and ``cached``."""
    if not force and (info := find()) is not None:
        return {**info, "cached": True}
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise LabkitError(f"{tool} is not installed", "apt-get install -y cmake g++ (or your OS's equivalent)")
    flags, flags_from = wheel_flags()
    out = build_dir(flags)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "build.log"
    log.write_text("")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="llama-server-", dir=cache_dir()) as tmp:
        tmp = Path(tmp)
        if sdist is None:
            say(progress, f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist")
            _run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                  f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(tmp / "sdist")], log)
            sdist = next((tmp / "sdist").glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tf:
            tf.extractall(tmp, filter="data")
        top = next(tmp.glob("llama_cpp_python-*/"))
        src = top / "vendor" / "llama.cpp"
        head = top / ".git" / "modules" / "vendor" / "llama.cpp" / "HEAD"
        commit = head.read_text().strip() if head.is_file() else "unknown"
        cmake_args = f"{flags} {SERVER_FLAGS}".split()
        say(progress, f"configuring llama.cpp {commit[:7]} with {flags or '(default flags)'}")
        _run(["cmake", "-S", str(src), "-B", str(tmp / "build"), *cmake_args], log)
        say(progress, f"building {BINARY} with {jobs} jobs (several minutes on 2 cores; log: {log})")
        _run(["cmake", "--build", str(tmp / "build"), "--target", BINARY, f"-j{jobs}"], log)
        exe = next((tmp / "build").rglob(BINARY), None)
        if exe is None:
            raise LabkitError(f"the build finished but no {BINARY} binary was found", f"read {log}")
        shutil.copy2(exe, out / BINARY)
    info = {
        "binary": BINARY,
        "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
        "llama_cpp_commit": commit,
        "cmake_args": flags,
        "cmake_args_from": flags_from,
        "server_cmake_args": SERVER_FLAGS,
        "machine": platform.machine(),
        "host": platform.node(),
        "build_s": round(time.perf_counter() - t0, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out / "build.json").write_text(json.dumps(info, indent=2))
    say(progress, f"built {out / BINARY} in {info['build_s']:.0f} s")
    return {**info, "path": str(out / BINARY), "cached": False}


def say(progress: Progress, msg: str) -> None:
    if progress:
        progress(msg)
