"""llama.cpp, built once per machine for everything labkit runs.

One CMake build of the llama-cpp-python sdist's ``vendor/llama.cpp`` (the pinned version,
hence one commit), with the portable flags of scripts/setup.sh, gives the shared
libraries *and* the tools labkit drives. llama-cpp-python is installed without a native
build of its own (``CMAKE_ARGS=-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF``: its CMakeLists then
compiles nothing) and its ``llama_cpp/lib`` holds links to this build's libraries, so the
``libllama.so`` Python loads is the very file ``llama-server`` and ``llama-bench`` load
(every target is linked with RPATH ``$ORIGIN`` and lives in one ``bin/``)::

    ~/.cache/labkit/llama.cpp-<version>-<key>/
        src/         the sdist's llama.cpp sources (kept: a missing tool is rebuilt alone)
        build/bin/   libllama.so, libggml*.so, libmtmd.so, llama-server, llama-bench, ...
        build.log    every command and its output
        build.json   written last: version, commit, flags, sha256 of every library and tool

    key = sha256(version | flags | the build's own CMake options | machine | patches
                 | the unity build's CMake file)[:12]

Patches (``engines/patches/*.patch``, listed in PATCHES) are applied to the extracted
sources before the first configure, each recorded in build.json with its sha256 and the
upstream issues and pull requests its header names; their checksums are part of the key,
so a cached build made with other patches is never picked up. A patch that no longer
applies (a new pin) stops the build with the fix, never builds an unpatched tree.

llama-common and mtmd are compiled as CMake unity builds (UNITY_TARGETS, UNITY_OWN): from
the same source folder the libraries and tools labkit times come out byte-identical, and the
build takes about four fifths of the time (benchmarks/bench_build.py).

A build without build.json is unfinished (interrupted, failed): it is never used, and
the next ``build`` resumes it (CMake rebuilds only what is missing). A library whose
checksum no longer matches build.json is a damaged cache: the build is started over.

stdlib only, so scripts/setup.sh runs it before labkit is installed::

    PYTHONPATH=src python3 src/labkit/engines/native.py build [--jobs N]   (numpy-free: a file, not -m)
    PYTHONPATH=src python3 src/labkit/engines/native.py sdist   # the sdist, downloaded once; prints its path
    python -m labkit.engines.native link      # llama_cpp/lib -> this build (after pip install)
    python -m labkit.engines.native status
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from labkit.errors import LabkitError
from labkit.paths import cache_dir

VERSION = "0.3.36"  # llama-cpp-python; its sdist pins llama.cpp's commit
# the -march=native build segfaults in ggml's AMX matmul on CPUs that report AMX (shared/FACTS.md)
PORTABLE_FLAGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
# The CPU variant: each ggml x86 flag and the /proc/cpuinfo features its instructions need
# (ggml's cmake: GGML_AVX512 compiles -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw).
# setup.sh builds, by default, every flag of VARIANT the CPU has: the build is keyed by its
# flags, so a box with other features builds its own. AMX is never turned on (the crash
# above); its flags are listed so that a build made with them is checked like any other.
VARIANT = (("GGML_AVX", ("avx",)), ("GGML_AVX2", ("avx2",)), ("GGML_FMA", ("fma",)), ("GGML_F16C", ("f16c",)),
           ("GGML_BMI2", ("bmi2",)), ("GGML_AVX_VNNI", ("avx_vnni",)),
           ("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
           ("GGML_AVX512_VBMI", ("avx512vbmi",)), ("GGML_AVX512_VNNI", ("avx512_vnni",)),
           ("GGML_AVX512_BF16", ("avx512_bf16",)))
NEEDS = {**dict(VARIANT), "GGML_AMX_TILE": ("amx_tile",), "GGML_AMX_INT8": ("amx_int8",),
         "GGML_AMX_BF16": ("amx_bf16",)}


def cpu_features(text: str | None = None) -> set[str] | None:
    """The CPU's feature flags (the ``flags`` line of /proc/cpuinfo, or ``text`` in its form);
    None where there is no such file (macOS, another OS)."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    line = next((ln for ln in text.splitlines() if ln.split(":")[0].strip() == "flags"), None)
    return set(line.split(":", 1)[1].split()) if line else None


def variant_flags(features: set[str]) -> str:
    """The ggml flags of the best variant for a CPU with ``features``: every flag of VARIANT
    whose features it has (the AVX-512 extensions only with AVX-512 itself), never AMX."""
    on = [flag for flag, need in VARIANT if set(need) <= features]
    if "GGML_AVX512" not in on:
        on = [f for f in on if not f.startswith("GGML_AVX512_")]
    return " ".join(["-DGGML_NATIVE=OFF", *(f"-D{f}=ON" for f in on)])


def flags_on(cmake_args: str | None) -> list[str]:
    """The options a CMake command line turns on: ``-DGGML_AVX2=ON`` gives ``GGML_AVX2``."""
    return [w.removeprefix("-D").split("=", 1)[0] for w in (cmake_args or "").split() if w.upper().endswith("=ON")]


def missing_features(cmake_args: str, features: set[str] | None) -> list[tuple[str, str]]:
    """(flag, feature) for each feature a build made with ``cmake_args`` needs and this CPU
    lacks; [] when the CPU's features are unknown or every one is there."""
    if features is None:
        return []
    return [(f, need) for f in flags_on(cmake_args) for need in NEEDS.get(f, ()) if need not in features]


def check_cpu(cmake_args: str, *, features: set[str] | None = None, where: str = "the installed build") -> None:
    """Refuse a build this CPU cannot run (it would die on an illegal instruction, mid-run)."""
    gone = missing_features(cmake_args, cpu_features() if features is None else features)
    if gone:
        lacks = ", ".join(sorted({need for _, need in gone}))
        flags = " ".join(sorted({f"-D{f}=ON" for f, _ in gone}))
        raise LabkitError(f"{where} of llama.cpp was made with {flags}, and this CPU lacks {lacks}: it would stop on "
                          "an illegal instruction",
                          "run `make setup` on this machine (it builds for this CPU's own features), or unset "
                          "LLAMA_CPP_LIB_PATH / LLAMA_CMAKE_ARGS if they name a build for another CPU")
# what llama-cpp-python's own CMakeLists sets for its build (shared libs, common, no curl), and
# what the tools need: no web UI download, no TLS (nothing is fetched at build or run time),
# every target in one bin/ that finds its libraries beside itself
BUILD_FLAGS = ("-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_CURL=OFF "
               "-DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TESTS=OFF "
               "-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF "
               "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH=$ORIGIN")
LIBS = ("llama", "ggml", "ggml-base", "ggml-cpu", "mtmd")  # the targets llama-cpp-python ships
TOOLS = ("llama-server", "llama-bench", "llama-batched-bench", "llama-lookup")
# carried on top of the pinned llama.cpp (module doc), in this order
PATCHES_DIR = Path(__file__).resolve().parent / "patches"
PATCHES = ("tinyblas-q0-small-n.patch",)
PYTHON_ARGS = "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"  # llama-cpp-python, installed over this build
# CMake's unity build (up to 8 .cpp files per compile, CMake's default; the pinned CMakeLists
# already builds libllama that way, by 16) for the two targets that are most of the compile and
# off every timed path: llama-common (argument, chat-template, JSON-schema and download code)
# and mtmd (images and audio). The files a decode step or a server's token passes through keep
# a compile of their own (UNITY_OWN: their objects are the very bytes of a build without it);
# ggml, libllama and the server's libraries are not touched. So libllama.so, libggml*.so and
# every tool labkit times come out byte-identical with and without it, in less time on 2 cores
# (docs/reproduce.md). Made by configure through CMAKE_PROJECT_llama.cpp_INCLUDE (CMake 3.19+).
UNITY_TARGETS = ("llama-common", "mtmd")
UNITY_OWN = {
    # sampling, drafts, batches and logging each token goes through; json.cpp and mtmd's
    # helpers specialize or guard in ways a shared compile refuses
    "llama-common": ("common/common.cpp", "common/sampling.cpp", "common/speculative.cpp", "common/ngram-cache.cpp",
                     "common/ngram-map.cpp", "common/ngram-mod.cpp", "common/log.cpp",
                     "common/reasoning-budget.cpp", "common/json.cpp"),
    "mtmd": ("tools/mtmd/mtmd-helper.cpp", "tools/mtmd/mtmd-helper-gen.cpp"),
}
UNITY_BATCH = 8
UNITY_CMAKE = (3, 19)  # cmake_language(DEFER)
# CMake's "Building"/"Linking" lines in a full build of these targets at this version: 215 in
# the first build's log (197 objects, 18 links); the unity build compiles 119 objects (ninja's
# log of its first build), the links are the same. Only the progress estimate uses it
STEPS = 119 + 18

Progress = Callable[[str], None] | None


def flags() -> tuple[str, str]:
    """(the ggml CMake flags, where they came from): the installed build's, else
    $LLAMA_CMAKE_ARGS, else setup.sh's default (portable x86-64; Apple's own default)."""
    forced = os.environ.get("LABKIT_LLAMA_FLAGS")  # `native --flags` (scripts/setup.sh)
    if forced is not None:
        return forced, "scripts/setup.sh"
    path = Path(sys.prefix) / "share" / "labkit" / "llama-build.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())["cmake_args"], str(path)
        except (ValueError, KeyError):
            pass
    env = os.environ.get("LLAMA_CMAKE_ARGS")
    if env is not None:
        return env, "env LLAMA_CMAKE_ARGS"
    return default_flags(), "scripts/setup.sh default"


# LABKIT_CPU_VARIANT: which x86 build setup.sh makes. "portable" (the default): AVX2, FMA, F16C,
# BMI2. "cpu": every flag of VARIANT this CPU has (AVX-512, VNNI, ...). The default is portable
# because the AVX-512 variant was measured buying nothing on the plain step (H 0.94x, 95% CI
# 0.88-1.01, AMD EPYC family 26) while its batched kernels round differently enough that greedy
# speculation left plain's tokens on prompts where the AVX2 build's did not (docs/engines.md).
CPU_VARIANTS = ("portable", "cpu")


def cpu_variant() -> str:
    v = os.environ.get("LABKIT_CPU_VARIANT", "portable").strip() or "portable"
    if v not in CPU_VARIANTS:
        raise LabkitError(f"LABKIT_CPU_VARIANT={v!r} is not a CPU variant labkit builds",
                          "set it to portable (AVX2, the default) or cpu (every x86 flag this CPU has: AVX-512, "
                          "VNNI, ...), or unset it")
    return v


def default_flags() -> str:
    """setup.sh's default: Apple's own (Metal, native); on x86-64 Linux the portable AVX2 flags,
    or this CPU's variant (``variant_flags``) with LABKIT_CPU_VARIANT=cpu; elsewhere portable."""
    if platform.system() == "Darwin":
        return ""
    if cpu_variant() == "portable":
        return PORTABLE_FLAGS
    feats = cpu_features() if platform.machine() in ("x86_64", "AMD64") else None
    return variant_flags(feats) if feats else PORTABLE_FLAGS


def patches() -> list[dict]:
    """The patches this build carries: name, path, sha256 and the upstream references its
    header lists (``Upstream: ggml-org/llama.cpp#10714 ...``)."""
    out = []
    for name in PATCHES:
        path = PATCHES_DIR / name
        if not path.is_file():
            raise LabkitError(f"the llama.cpp patch {path} is missing", "restore it from git (git checkout -- "
                              f"src/labkit/engines/patches/{name}) or drop it from native.PATCHES")
        text = path.read_text()
        refs = [r for ln in text.splitlines() if ln.startswith("Upstream:") for r in ln.split(":", 1)[1].split()]
        out.append({"name": name, "path": str(path), "sha256": sha256(path), "upstream": refs})
    return out


def unity_cmake() -> str:
    """The CMake file configure includes after ``project(llama.cpp)``: once every target is
    defined, UNITY_TARGETS get CMake's unity build and UNITY_OWN their own compiles. A target
    or file the pinned sources lack stops the configure with the fix (a new pin moved them)."""
    own = "\n".join(f"  labkit_own({t} {f})" for t, files in UNITY_OWN.items() for f in files)
    return f"""# written by labkit (src/labkit/engines/native.py, UNITY_TARGETS and UNITY_OWN): do not edit
function(labkit_own target file)
  if(NOT EXISTS "${{CMAKE_SOURCE_DIR}}/${{file}}")
    message(FATAL_ERROR "labkit's unity build: ${{file}} is not in these llama.cpp sources (a new pin moved it); "
                        "fix: update native.UNITY_OWN in src/labkit/engines/native.py")
  endif()
  set_source_files_properties("${{CMAKE_SOURCE_DIR}}/${{file}}" TARGET_DIRECTORY ${{target}}
                              PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
endfunction()
function(labkit_unity)
  foreach(t {" ".join(UNITY_TARGETS)})
    if(NOT TARGET ${{t}})
      message(FATAL_ERROR "labkit's unity build: no target ${{t}} in these llama.cpp sources; "
                          "fix: update native.UNITY_TARGETS in src/labkit/engines/native.py")
    endif()
    set_target_properties(${{t}} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE {UNITY_BATCH})
  endforeach()
{own}
endfunction()
cmake_language(DEFER CALL labkit_unity)
"""


def unity() -> dict:
    """What build.json records of the unity build: the targets, the files kept apart, and the
    sha256 of the CMake file (part of the key)."""
    return {"targets": list(UNITY_TARGETS), "batch": UNITY_BATCH, "own": {t: list(f) for t, f in UNITY_OWN.items()},
            "sha256": hashlib.sha256(unity_cmake().encode()).hexdigest()}


def cmake_version() -> tuple[int, ...] | None:
    try:
        out = subprocess.run(["cmake", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"version (\d+)\.(\d+)", out)
    return (int(m[1]), int(m[2])) if m else None


def unity_unsupported() -> str | None:
    """Why this machine's cmake cannot make the unity build, or None when it can."""
    version = cmake_version()
    if version is not None and version >= UNITY_CMAKE:
        return None
    return (f"cmake {'.'.join(map(str, version or ())) or '(unknown version)'} lacks "
            f"cmake_language(DEFER) ({'.'.join(map(str, UNITY_CMAKE))}+)")


def unity_args(folder: Path) -> list[str]:
    """Write the unity build's CMake file into ``folder``; the configure arguments that include it."""
    path = folder / "labkit-unity.cmake"
    path.write_text(unity_cmake())
    return [f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={path}"]


def configure_command(src: Path, build: Path, ggml_flags: str, *, gen: str, extra: Sequence[str] = ()) -> list[str]:
    """CMake's configure of ``src`` into ``build`` with the ggml flags and the build's own options."""
    return ["cmake", "-S", str(src), "-B", str(build), "-G", gen, *ggml_flags.split(), *BUILD_FLAGS.split(), *extra]


def key(ggml_flags: str, *, version: str = VERSION) -> str:
    sums = ",".join([p["sha256"] for p in patches()] + [unity()["sha256"]])
    return hashlib.sha256(f"{version}|{ggml_flags}|{BUILD_FLAGS}|{platform.machine()}|{sums}".encode()
                          ).hexdigest()[:12]


def apply_patches(src: Path, log: Path) -> list[dict]:
    """Apply PATCHES to a freshly extracted tree (``git apply``: all or nothing per patch).
    The sdist's own ``.git`` sits above the tree: inside a repository ``git apply`` reads
    paths from its top and silently skips the rest, so the search stops at the tree."""
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(src.resolve().parent)}
    applied = []
    for p in patches():
        cmd = ["git", "apply", "--check", p["path"]]
        for check in (True, False):
            try:
                _run(cmd if check else [c for c in cmd if c != "--check"], log, cwd=src, env=env)
            except LabkitError as e:
                raise LabkitError(
                    f"the llama.cpp patch {p['name']} does not apply to the pinned sources ({src}): {e.problem}",
                    f"if the pin moved, check whether the upstream fix landed ({', '.join(p['upstream'])}): then drop "
                    f"the patch from native.PATCHES, else regenerate it against the new sources (git diff in an "
                    f"extracted tree); the build was not made (log: {log})") from None
        applied.append({k: v for k, v in p.items() if k != "path"})
    return applied


def build_dir(ggml_flags: str | None = None) -> Path:
    ggml_flags = flags()[0] if ggml_flags is None else ggml_flags
    return cache_dir() / f"llama.cpp-{VERSION}-{key(ggml_flags)}"


def lib_name(base: str) -> str:
    return f"lib{base}.dylib" if sys.platform == "darwin" else f"lib{base}.so"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _artifacts(bindir: Path) -> dict[str, Path]:
    """name -> file for every library and tool this build is expected to hold."""
    return {**{lib_name(b): bindir / lib_name(b) for b in LIBS}, **{t: bindir / t for t in TOOLS}}


def find(d: Path | None = None, *, verify: bool = False) -> dict | None:
    """The finished build (its build.json plus ``dir``, ``bin``), or None. ``verify``
    re-checksums the libraries and tools against build.json (a damaged cache raises)."""
    d = build_dir() if d is None else d
    meta = d / "build.json"
    if not meta.is_file():
        return None
    info = json.loads(meta.read_text())
    bindir = d / "build" / "bin"
    missing = [n for n, p in _artifacts(bindir).items() if not p.is_file()]
    if missing:
        return {**info, "dir": str(d), "bin": str(bindir), "missing": missing}
    if verify:
        bad = [n for n, want in info.get("sha256", {}).items()
               if (bindir / n).is_file() and sha256((bindir / n).resolve()) != want]
        if bad:
            raise DamagedBuild(d, bad)
    return {**info, "dir": str(d), "bin": str(bindir), "missing": []}


class DamagedBuild(LabkitError):
    def __init__(self, d: Path, files: list[str]):
        super().__init__(f"the cached llama.cpp build in {d} is damaged: {', '.join(files)} no longer match "
                         "the checksums its build.json recorded",
                         "labkit rebuilds it from its sources (`make setup` or `labkit server build --force`)")
        self.dir, self.files = d, files


def tool(name: str) -> Path:
    """The path of one tool of this machine's build, or a LabkitError saying how to make it."""
    info = find()
    if info is None or name in info.get("missing", []):
        raise LabkitError(f"{name} is not built for this machine (looked in {build_dir()})",
                          "run `make setup` (or `labkit server build`): one build of llama.cpp gives the "
                          "libraries and every tool")
    return Path(info["bin"]) / name


def say(progress: Progress, msg: str) -> None:
    if progress:
        progress(msg)


def _run(cmd: list[str], log: Path, *, cwd: Path | None = None, watch: Callable[[str], None] | None = None,
         env: dict | None = None) -> None:
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace", env=env)
        try:
            for line in p.stdout:
                f.write(line)
                f.flush()  # `tail -f build.log` follows the compile
                if watch:
                    watch(line)
            rc = p.wait()
        except BaseException:  # Ctrl-C: stop the compiler too; the unfinished build is resumed later
            p.kill()
            p.wait()
            raise
    if rc != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:])
        raise LabkitError(f"`{' '.join(cmd[:4])} ...` failed (exit {rc}); log tail:\n{tail}",
                          f"read the full log {log}; cmake and a C++ compiler are needed "
                          "(Debian: apt-get install -y cmake g++)")


def extract_source(tar: Path, dest: Path, log: Path, *, patched: bool = True,
                   edit: Callable[[Path], None] | None = None) -> tuple[str, list[dict]]:
    """The sdist's vendored llama.cpp unpacked into ``dest`` (which must not exist), with
    labkit's patches unless ``patched`` is False and then ``edit`` (a caller's own change to
    the tree, e.g. benchmarks/check_backend_ops.py's BLAS reference) applied before it is moved
    into place, so a half-made tree is never left at ``dest``. Returns (commit, patches applied)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp, tarfile.open(tar) as tf:
        tf.extractall(tmp, filter="data")
        top = next(Path(tmp).glob("llama_cpp_python-*/"))
        head = top / ".git" / "modules" / "vendor" / "llama.cpp" / "HEAD"
        commit = head.read_text().strip() if head.is_file() else "unknown"
        vendored = top / "vendor" / "llama.cpp"
        (vendored / ".git").unlink(missing_ok=True)  # a submodule link to nowhere
        applied = apply_patches(vendored, log) if patched else []
        if edit:
            edit(vendored)
        os.replace(vendored, dest)
    return commit, applied


def _sdist(cache: Path, log: Path, progress: Progress) -> Path:
    """The llama-cpp-python sdist (downloaded once into ``cache/sdist``)."""
    d = cache / "sdist"
    hit = sorted(d.glob(f"llama_cpp_python-{VERSION}.tar.gz"))
    if hit:
        return hit[0]
    say(progress, f"downloading the llama-cpp-python {VERSION} sdist")
    d.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        # --no-binary for this package only: ":all:" also builds its build backend from source (minutes)
        try:
            _run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", "llama-cpp-python", "--no-deps",
                  f"llama-cpp-python=={VERSION}", "-d", tmp], log)
        except LabkitError as e:
            raise LabkitError(f"could not download the llama-cpp-python {VERSION} sdist: {e.problem}",
                              f"check that pip can reach the package index (pip config list), or put the sdist "
                              f"at {d / f'llama_cpp_python-{VERSION}.tar.gz'} by hand; log: {log}") from None
        got = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        os.replace(got, d / got.name)
    return d / got.name


class _Meter:
    """A progress line every ``every_s`` while compiling: the build steps done (CMake's
    "Building ..." and "Linking ..." lines), the elapsed time and an estimate of the time
    left from the steps this build takes. Ninja numbers its steps (``[12/222]``): its own
    total is used. Under Make, ``expected`` (a finished build's count on this machine, else
    this version's own): Make's ``[ 42%]`` restarts for each target when several are built."""

    def __init__(self, progress: Progress, log: Path, *, expected: int | None, every_s: float = 30.0):
        self.progress, self.log, self.every_s, self.expected = progress, log, every_s, expected
        self.t0 = self.last = time.perf_counter()
        self.steps = 0

    def __call__(self, line: str) -> None:
        m = re.match(r"\[\s*(\d+)(?:%|/(\d+))\] (Building|Linking)", line)
        if m and m.group(2):  # Ninja: [done/total], exact
            self.steps, self.expected = int(m.group(1)), int(m.group(2))
        elif m:  # Make: the lines are counted
            self.steps += 1
        now = time.perf_counter()
        if self.progress and now - self.last >= self.every_s and self.steps:
            self.last = now
            el = now - self.t0
            if self.expected and self.steps < self.expected:
                left = el / self.steps * (self.expected - self.steps)
                self.progress(f"compiling: step {self.steps} of ~{self.expected} after {_mmss(el)}, "
                              f"about {_mmss(left)} left (log: {self.log})")
            else:
                self.progress(f"compiling: step {self.steps} after {_mmss(el)} (log: {self.log})")


def _expected_steps() -> int:
    """Build steps of a full build: the newest finished build's count on this machine made
    the same way (its unity build too: it has fewer, longer steps), else the count of this
    version's build (STEPS)."""
    same = unity()["sha256"]
    for meta in sorted(cache_dir().glob(f"llama.cpp-{VERSION}-*/build.json"), key=lambda p: p.stat().st_mtime,
                       reverse=True):
        try:
            info = json.loads(meta.read_text())
        except ValueError:
            continue
        u = info.get("unity") or {}
        if info.get("steps") and u.get("sha256") == same and not u.get("skipped"):
            return int(info["steps"])
    return STEPS


def generator(build: Path | None = None) -> str:
    """CMake's generator: the one an existing (unfinished) build was configured with, so that
    it resumes; else Ninja when it is installed, else Make. Ninja compiles a target's objects
    while the libraries it links are still being linked (Make waits for each dependency
    target, leaving a core idle at every such step): on a 2-core EPYC the same build took
    276, 245, 235 and 267 s, Make and Ninja alternating (11% less with Ninja). The files
    are the same bytes either way (the nine checksums of a Make and a Ninja build of this
    version agree), so the generator is not part of the cache key."""
    cache = build / "CMakeCache.txt" if build else None
    if cache and cache.is_file():
        for line in cache.read_text(errors="replace").splitlines():
            if line.startswith("CMAKE_GENERATOR:"):
                return line.split("=", 1)[1].strip()
    return "Ninja" if shutil.which("ninja") else "Unix Makefiles"


def _mmss(s: float) -> str:
    return f"{int(s // 60)}m{int(s % 60):02d}s"


def build(*, force: bool = False, jobs: int | None = None, progress: Progress = None,
          sdist: Path | None = None) -> dict:
    """Build (or find) this machine's llama.cpp; returns build.json plus ``dir``, ``bin``
    and ``cached`` (True when nothing was compiled)."""
    ggml_flags, flags_from = flags()
    check_cpu(ggml_flags, where=f"the requested build (flags from {flags_from})")  # before minutes of compiling
    d = build_dir(ggml_flags)
    if not force:
        try:
            info = find(d, verify=True)
        except DamagedBuild as e:
            say(progress, f"{e.problem}; rebuilding from scratch")
            shutil.rmtree(d, ignore_errors=True)
            info = None
        if info is not None and not info["missing"]:
            return {**info, "cached": True}
        if info is not None:
            say(progress, f"the cached build in {d} lacks {', '.join(info['missing'])}: building just those")
            (d / "build.json").unlink()  # unfinished again until the missing targets exist
    elif d.exists():
        shutil.rmtree(d)
    jobs = jobs or os.cpu_count() or 2
    d.mkdir(parents=True, exist_ok=True)
    log = d / "build.log"
    resumed = (d / "build" / "CMakeCache.txt").is_file()
    if resumed:
        say(progress, f"resuming the unfinished build in {d} (it has no build.json; CMake rebuilds what is missing)")
    for exe in ("cmake", "c++"):
        if shutil.which(exe) is None:
            raise LabkitError(f"{exe} is not installed", "apt-get install -y cmake g++ (or your OS's equivalent)")
    stages: dict[str, float] = {}
    t0 = t = time.perf_counter()
    src = d / "src"
    if not (src / "CMakeLists.txt").is_file():
        shutil.rmtree(src, ignore_errors=True)
        commit, applied = extract_source(sdist or _sdist(cache_dir(), log, progress), src, log)
        (d / "commit").write_text(commit)
        (d / "patches.json").write_text(json.dumps(applied, indent=2))
    commit = (d / "commit").read_text().strip() if (d / "commit").is_file() else "unknown"
    applied = json.loads((d / "patches.json").read_text()) if (d / "patches.json").is_file() else []
    stages["source_s"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    say(progress, f"configuring llama.cpp {commit[:7]} with {ggml_flags or '(default flags)'} (log: {log})")
    gen = generator(d / "build")
    unity_info, include = unity(), []
    why = unity_unsupported()
    if why is None:
        include = unity_args(d)
    else:  # the same libraries and tools, compiled file by file: only the build takes longer
        unity_info["skipped"] = why
        say(progress, f"compiling file by file: {why}; a newer cmake (pip install cmake) "
                      "shortens the build by about a fifth")
    _run(configure_command(src, d / "build", ggml_flags, gen=gen, extra=include), log)
    stages["configure_s"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    targets = [*LIBS, *TOOLS]
    say(progress, f"compiling {', '.join(targets)} with {jobs} jobs ({gen}): one build for the Python engine and the tools "
                  f"(about 4 to 12 minutes on 2 cores; log: {log})")
    meter = _Meter(progress, log, expected=None if resumed else _expected_steps())
    _run(["cmake", "--build", str(d / "build"), "--target", *targets, f"-j{jobs}"], log, watch=meter)
    stages["compile_s"] = round(time.perf_counter() - t, 1)
    bindir = d / "build" / "bin"
    files = _artifacts(bindir)
    missing = [n for n, p in files.items() if not p.is_file()]
    if missing:
        raise LabkitError(f"the build finished but {', '.join(missing)} are not in {bindir}", f"read {log}")
    info = {
        "llama_cpp_python": VERSION,
        "llama_cpp_commit": commit,
        "cmake_args": ggml_flags,
        "cmake_args_from": flags_from,
        "build_cmake_args": BUILD_FLAGS,
        "patches": applied,
        "unity": unity_info,
        "generator": gen,
        "machine": platform.machine(),
        "host": platform.node(),
        "jobs": jobs,
        "resumed": resumed,
        "stages": stages,
        "steps": meter.steps if not resumed else None,
        "build_s": round(time.perf_counter() - t0, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sha256": {n: sha256(p.resolve()) for n, p in files.items()},
    }
    (d / "build.json").write_text(json.dumps(info, indent=2))  # last: the build is finished
    say(progress, f"built llama.cpp {commit[:7]} in {_mmss(info['build_s'])} ({d})")
    return {**info, "dir": str(d), "bin": str(bindir), "missing": [], "cached": False}


def python_lib_dir() -> Path:
    """The installed llama_cpp package's ``lib`` directory (found without importing it:
    the import needs the libraries this module links)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise LabkitError("llama-cpp-python is not installed in this environment", "run `make setup`")
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def link(*, progress: Progress = None) -> dict:
    """Point the installed llama-cpp-python at this machine's build: ``llama_cpp/lib``'s
    libraries become links to ``build/bin`` (the same files the tools load), and the build's
    record is copied to ``share/labkit/llama-build.json``."""
    info = find(verify=True)
    if info is None or info["missing"]:
        raise LabkitError(f"no finished llama.cpp build in {build_dir()}", "run `make setup`")
    bindir = Path(info["bin"])
    lib = python_lib_dir()
    lib.mkdir(parents=True, exist_ok=True)
    for old in lib.iterdir():
        if old.is_symlink() or old.name.startswith("lib"):
            old.unlink()
    linked = []
    for so in sorted(bindir.iterdir()):
        if so.name.startswith("lib") and (".so" in so.name or so.suffix == ".dylib"):
            (lib / so.name).symlink_to(so)
            linked.append(so.name)
    share = Path(sys.prefix) / "share" / "labkit"
    share.mkdir(parents=True, exist_ok=True)
    (share / "llama-build.json").write_text(json.dumps({**{k: v for k, v in info.items() if k != "missing"},
                                                        "python_lib_dir": str(lib)}, indent=2))
    say(progress, f"llama-cpp-python loads {bindir / lib_name('llama')} ({len(linked)} libraries linked into {lib})")
    return {"lib_dir": str(lib), "linked": linked, "bin": str(bindir)}


def loaded(lib_path: str | Path) -> dict:
    """Which build a loaded ``libllama`` is: its path and checksum, and whether it is this
    machine's labkit build (the one the tools link) or another (``LLAMA_CPP_LIB_PATH``)."""
    real = Path(lib_path).resolve()
    out = {"lib_path": str(real), "lib_sha256": sha256(real) if real.is_file() else None,
           "lib_path_env": os.environ.get("LLAMA_CPP_LIB_PATH")}
    info = find()
    ours = (Path(info["bin"]) / lib_name("llama")).resolve() if info else None
    out["one_build"] = ours is not None and real == ours and out["lib_sha256"] == info["sha256"].get(lib_name("llama"))
    out["tools_dir"] = info["bin"] if info else None
    if not out["one_build"]:
        out["one_build_why"] = (
            f"libllama loaded from {real}" + (f" (LLAMA_CPP_LIB_PATH={out['lib_path_env']})"
                                              if out["lib_path_env"] else "")
            + (f", not labkit's build {ours}: llama-server and llama-bench come from another build"
               if ours else ": no labkit llama.cpp build on this machine (run `make setup`)"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.engines.native", description=__doc__.split("\n")[0])
    ap.add_argument("--flags", default=None, help="the ggml CMake flags (scripts/setup.sh passes its own); "
                                                  "default: the installed build's")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--jobs", type=int, default=None)
    b.add_argument("--force", action="store_true")
    sub.add_parser("sdist", help="download the llama-cpp-python sdist into the cache (once); print its path")
    sub.add_parser("link")
    sub.add_parser("status")
    sub.add_parser("dir")
    sub.add_parser("cpu-flags", help="the ggml flags setup.sh builds with by default (LABKIT_CPU_VARIANT: portable, "
                                     "the default, or cpu)")
    a = ap.parse_args(argv)
    if a.flags is not None:
        os.environ["LABKIT_LLAMA_FLAGS"] = a.flags

    def progress(m: str) -> None:
        print(f"[native] {m}", file=sys.stderr, flush=True)

    try:
        if a.cmd == "build":
            info = build(force=a.force, jobs=a.jobs, progress=progress)
            progress("cached build, nothing compiled" if info["cached"] else "done")
        elif a.cmd == "sdist":  # _sdist makes the folder before it writes the log
            print(_sdist(cache_dir(), cache_dir() / "sdist" / "download.log", progress))
        elif a.cmd == "link":
            link(progress=progress)
        elif a.cmd == "status":
            info = find()
            print(json.dumps(info or {"built": False, "dir": str(build_dir())}, indent=2))
            return 0 if info and not info["missing"] else 1
        elif a.cmd == "dir":
            print(build_dir())
        elif a.cmd == "cpu-flags":
            print(default_flags())
    except LabkitError as e:
        print(f"error: {e.problem}\nfix: {e.fix}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"[native] interrupted: the unfinished build in {build_dir()} is resumed by the next `make setup`",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

