#!/usr/bin/env bash
# Create or refresh the project's virtual environment and install labkit into it.
#
# Idempotent and cheap when nothing changed: a stamp in the venv records the hash of
# everything that decides its contents.
#
# llama.cpp is built ONCE per machine, for everything (src/labkit/engines/native.py):
# one CMake build of the llama-cpp-python sdist's vendored llama.cpp gives the shared
# libraries and the tools (llama-server, llama-bench, llama-batched-bench, llama-lookup),
# cached under $CACHE/llama.cpp-<version>-<key>. llama-cpp-python is installed WITHOUT a
# native build of its own (CMAKE_ARGS=-DLLAMA_BUILD=OFF: a wheel of Python files, cached)
# and its llama_cpp/lib links to that build, so Python and the tools load one libllama.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${LABKIT_VENV:-.venv}
CACHE=${LABKIT_CACHE:-$HOME/.cache/labkit}
export LABKIT_CACHE="$CACHE"
LLAMA_VERSION=0.3.36
if [ "$(uname -s)" = "Darwin" ]; then
    # On Apple silicon the default build (Metal, native) is the right one.
    DEFAULT_FLAGS=""
else
    # The portable AVX2 flags, or with LABKIT_CPU_VARIANT=cpu every x86 feature flag ggml has
    # that the CPU reports (AVX-512 / VNNI where present), never AMX (-march=native segfaults
    # in ggml's AMX matmul, shared/FACTS.md). The build is keyed by its flags. A bad
    # LABKIT_CPU_VARIANT stops here with the fix, never falls back to another build.
    DEFAULT_FLAGS=$(PYTHONPATH=src "$PY" -S -B src/labkit/engines/native.py cpu-flags) || exit 2
fi
export LLAMA_CMAKE_ARGS=${LLAMA_CMAKE_ARGS-$DEFAULT_FLAGS}
PY_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"  # llama-cpp-python compiles nothing of its own

T0=$(date +%s)
log() { printf '[setup %s] %s\n' "$(date -u -d "@$(( $(date +%s) - T0 ))" +%M:%S 2>/dev/null || echo "+$(( $(date +%s) - T0 ))s")" "$*" >&2; }
# run as a file, not -m: labkit.engines/__init__ imports numpy, which a fresh venv has not yet
native() { PYTHONPATH=src "$VPY" src/labkit/engines/native.py --flags "$LLAMA_CMAKE_ARGS" "$@"; }

[ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PY" -m venv "$VENV"; }
VPY="$VENV/bin/python"
PYTAG=$("$VPY" -c 'import sys, platform; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}")')

# Debian packages (cmake and g++ for the llama.cpp build; Chromium, OpenBLAS for MLX, PostgreSQL): installed when
# root, else the exact command is printed. Runs beside the Python work below, or first when
# the build toolchain itself is missing.
sysdeps_pid=""
if [ "${LABKIT_SYSTEM_DEPS:-1}" = 1 ] && [ -x scripts/system-deps.sh ]; then
    if command -v cmake >/dev/null 2>&1 && command -v c++ >/dev/null 2>&1; then
        scripts/system-deps.sh & sysdeps_pid=$!
    else  # the llama.cpp build below needs cmake and a C++ compiler: install them first
        log "cmake or a C++ compiler is missing: installing the system packages before the llama.cpp build"
        scripts/system-deps.sh || true
    fi
fi

NATIVE_DIR=$(native dir)
key=$(printf '%s|%s|%s' "$LLAMA_VERSION" "$PY_ARGS" "$PYTAG" | sha256sum | cut -c1-12)
WHEEL_DIR="$CACHE/wheels/llama-cpp-python-$LLAMA_VERSION-nolib-$key"
wheel=$(ls "$WHEEL_DIR"/llama_cpp_python-*.whl 2>/dev/null | head -n1 || true)
SDIST="$CACHE/sdist/llama_cpp_python-$LLAMA_VERSION.tar.gz"  # `native sdist` downloads it (once)

build_wheel() {
    # Python files only: LLAMA_BUILD=OFF and LLAVA_BUILD=OFF leave llama-cpp-python's CMake
    # nothing to compile (the libraries come from the one native build)
    log "packaging llama-cpp-python $LLAMA_VERSION with CMAKE_ARGS='$PY_ARGS' (no native code)"
    local tmp
    tmp=$(mktemp -d)
    CMAKE_ARGS="$PY_ARGS" "$VPY" -m pip wheel -q --no-cache-dir --no-deps "$SDIST" -w "$tmp/wheel" \
        > "$VENV/llama-wheel.log" 2>&1 || { cat "$VENV/llama-wheel.log" >&2; log "llama-cpp-python packaging failed"; exit 1; }
    mkdir -p "$WHEEL_DIR"
    mv "$tmp"/wheel/llama_cpp_python-*.whl "$WHEEL_DIR/"
    rm -rf "$tmp"
    wheel=$(ls "$WHEEL_DIR"/llama_cpp_python-*.whl | head -n1)
}

# Installs go through uv (https://github.com/astral-sh/uv) when it can be had: the same
# pinned versions as pip, but the ~210 dependencies land in seconds instead of ~2.5 minutes
# (most of pip's time is unpacking; uv links from its cache). uv byte-compiles what it
# installs (--compile-bytecode), as pip does: left to the first import, nothing is ever
# cached where PYTHONDONTWRITEBYTECODE=1 is set (it is on these build boxes), and every
# process would recompile mlflow, pandas and matplotlib from source (seconds per notebook
# kernel and per CLI call on 2 cores). uv is pip-installed into the venv at a pinned
# version. If it cannot be installed or fails (no index it can reach: uv does not read
# pip.conf), the same command runs with pip. LABKIT_PIP_ONLY=1 forces pip.
UV_VERSION=0.13.9
UV=""  # the venv's uv once installed at UV_VERSION; empty: pip
pip_install() {
    if [ -n "$UV" ]; then
        "$UV" pip install -q --compile-bytecode --python "$VPY" "$@" && return 0
        log "uv could not install ($*); falling back to pip"
        UV=""  # once uv has failed here, the later installs go straight to pip
    fi
    "$VPY" -m pip install -q --disable-pip-version-check "$@"
}

stamp_src=$(printf '%s|%s' "$key" "$NATIVE_DIR" | cat - pyproject.toml requirements/constraints.txt scripts/setup.sh src/labkit/engines/native.py | sha256sum | cut -c1-16)
native_ok() { [ -f "$NATIVE_DIR/build.json" ] && native status >/dev/null 2>&1; }
linked_ok() { [ -e "$("$VPY" -c 'import importlib.util as u; print(list(u.find_spec("llama_cpp").submodule_search_locations)[0])' 2>/dev/null)/lib/libllama.so" ]; }
if [ -n "$wheel" ] && native_ok && [ "$(cat "$VENV/.labkit-stamp" 2>/dev/null)" = "$stamp_src" ] && linked_ok; then
    log "$VENV is up to date (llama.cpp: $NATIVE_DIR)"
else
    # The native build (minutes, CPU-bound) and the pinned dependencies (mostly download
    # and unpack) go side by side; labkit itself is installed once both are done.
    # the sdist (one download, ~1 min on a slow index) and the build from it run beside the
    # dependency installs; the llama-cpp-python wheel waits only for the sdist
    log "llama.cpp, one build for Python and the tools: $NATIVE_DIR (progress below; full log: $NATIVE_DIR/build.log)"
    ( native sdist >/dev/null && native build ) & build_pid=$!
    if [ "${LABKIT_PIP_ONLY:-0}" != 1 ]; then
        # pip checks the pinned version, so a venv holding another uv gets this one
        if "$VPY" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION" >/dev/null 2>&1; then
            UV="$VENV/bin/uv"
        else
            log "uv $UV_VERSION could not be installed; installing with pip"
        fi
    fi
    log "installing pinned dependencies into $VENV"
    grep -v -i -E '^llama.cpp.python==' requirements/constraints.txt > "$VENV/.deps.txt"
    pip_install -r "$VENV/.deps.txt"
    if [ -z "$wheel" ]; then
        while [ ! -f "$SDIST" ] && kill -0 "$build_pid" 2>/dev/null; do sleep 1; done
        [ -f "$SDIST" ] || { log "could not download the llama-cpp-python sdist (see above)"; exit 1; }
        build_wheel
    fi
    if [ -f "$VENV/lib/python"*/site-packages/llama_cpp/lib/libllama.so ] \
        && [ ! -L "$VENV/lib/python"*/site-packages/llama_cpp/lib/libllama.so ] 2>/dev/null; then
        log "replacing the llama-cpp-python that carries its own native build"
        "$VPY" -m pip uninstall -y -q llama-cpp-python
    fi
    log "installing labkit into $VENV"
    pip_install -c requirements/constraints.txt "$wheel" -e ".[dev,mlx,postgres]"
    # labkit itself is an editable install (src/ is imported in place): compile it too
    "$VPY" -m compileall -q -j 0 src/labkit >/dev/null \
        || log "could not byte-compile src/labkit (run: $VPY -m compileall src/labkit); it still imports, only slower"
    if [ -n "$build_pid" ]; then
        log "waiting for the llama.cpp build"
        wait "$build_pid" || { log "the llama.cpp build failed: see $NATIVE_DIR/build.log (a rerun of make setup resumes it)"; exit 1; }
    fi
    native link
    echo "$stamp_src" > "$VENV/.labkit-stamp"
    log "done"
fi

# The notebooks' kernel: `labkit`, this venv's interpreter (make lab, and the notebooks'
# kernelspec metadata, name it, so no user-level `python3` kernelspec can stand in).
if [ ! -f "$VENV/share/jupyter/kernels/labkit/kernel.json" ]; then
    log "installing the 'labkit' Jupyter kernel into $VENV"
    "$VPY" -m ipykernel install --sys-prefix --name labkit --display-name "labkit (.venv)" >/dev/null
fi

# Notebooks keep their outputs on disk; git reads them through nbstripout (.gitattributes),
# so `git status` and `labkit reproduce` see sources only (src/labkit/lab/gitfilter.py).
"$VPY" -m labkit.lab.gitfilter . || log "could not configure the nbstripout git filter: saved notebook outputs will show as changes"

if [ -n "$sysdeps_pid" ]; then
    wait "$sysdeps_pid" || log "system packages: see the message above (tests that need them say so)"
fi
