#!/usr/bin/env bash
# Create or refresh the project's virtual environment and install labkit into it.
#
# Idempotent and cheap when nothing changed: a stamp in the venv records the hash of
# everything that decides its contents, and llama-cpp-python's wheel is cached per
# (version, CMake flags, Python, platform) so the ~7 minute native build happens once
# per machine. pip's own wheel cache is bypassed for it on purpose: pip keys that cache
# by version only and would silently reuse a wheel built with other flags.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${LABKIT_VENV:-.venv}
CACHE=${LABKIT_CACHE:-$HOME/.cache/labkit}
LLAMA_VERSION=0.3.36
if [ "$(uname -s)" = "Darwin" ]; then
    # On Apple silicon the default build (Metal, native) is the right one.
    DEFAULT_FLAGS=""
else
    # The default -march=native build segfaults in ggml's AMX matmul on CPUs that
    # report AMX; these portable x86-64 flags work (shared/FACTS.md).
    DEFAULT_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
fi
LLAMA_CMAKE_ARGS=${LLAMA_CMAKE_ARGS-$DEFAULT_FLAGS}

log() { printf '[setup] %s\n' "$*" >&2; }

[ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PY" -m venv "$VENV"; }
VPY="$VENV/bin/python"
PYTAG=$("$VPY" -c 'import sys, platform; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}")')

# Debian packages the tests need (Chromium, OpenBLAS for MLX, PostgreSQL): installed when
# root, else the exact command is printed. Runs beside the Python work below.
sysdeps_pid=""
if [ "${LABKIT_SYSTEM_DEPS:-1}" = 1 ] && [ -x scripts/system-deps.sh ]; then
    scripts/system-deps.sh & sysdeps_pid=$!
fi

key=$(printf '%s|%s|%s' "$LLAMA_VERSION" "$LLAMA_CMAKE_ARGS" "$PYTAG" | sha256sum | cut -c1-12)
WHEEL_DIR="$CACHE/wheels/llama-cpp-python-$LLAMA_VERSION-$key"
wheel=$(ls "$WHEEL_DIR"/llama_cpp_python-*.whl 2>/dev/null | head -n1 || true)

build_wheel() {
    log "building llama-cpp-python $LLAMA_VERSION with CMAKE_ARGS='$LLAMA_CMAKE_ARGS' (about 7 minutes on 2 cores)"
    local tmp
    tmp=$(mktemp -d)
    "$VPY" -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$LLAMA_VERSION" -d "$tmp/sdist"
    tar -xzf "$tmp"/sdist/llama_cpp_python-*.tar.gz -C "$tmp"
    local commit
    commit=$(cat "$tmp"/llama_cpp_python-*/.git/modules/vendor/llama.cpp/HEAD 2>/dev/null || echo unknown)
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)} \
    CMAKE_ARGS="$LLAMA_CMAKE_ARGS" "$VPY" -m pip wheel -q --no-cache-dir --no-deps \
        "$tmp"/sdist/llama_cpp_python-*.tar.gz -w "$tmp/wheel"
    mkdir -p "$WHEEL_DIR"
    "$VPY" - "$WHEEL_DIR/build.json" "$LLAMA_VERSION" "$LLAMA_CMAKE_ARGS" "$commit" "$PYTAG" <<'PYEOF'
import json, sys, time, platform
path, version, flags, commit, pytag = sys.argv[1:]
json.dump({"package": "llama-cpp-python", "version": version, "cmake_args": flags,
           "llama_cpp_commit": commit.strip(), "python": pytag, "host": platform.node(),
           "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
          open(path, "w"), indent=2)
PYEOF
    mv "$tmp"/wheel/llama_cpp_python-*.whl "$WHEEL_DIR/"
    rm -rf "$tmp"
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

stamp_src=$(printf '%s' "$key" | cat - pyproject.toml requirements/constraints.txt scripts/setup.sh | sha256sum | cut -c1-16)
if [ -n "$wheel" ] && [ "$(cat "$VENV/.labkit-stamp" 2>/dev/null)" = "$stamp_src" ]; then
    log "$VENV is up to date"
else
    # The native build (minutes, CPU-bound) and the pinned dependencies (mostly download
    # and unpack) go side by side; labkit itself is installed once both are done.
    build_pid=""
    if [ -z "$wheel" ]; then
        build_wheel > "$VENV/llama-build.log" 2>&1 & build_pid=$!
    fi
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
    if [ -n "$build_pid" ]; then
        wait "$build_pid" || { cat "$VENV/llama-build.log" >&2; log "llama-cpp-python build failed"; exit 1; }
        wheel=$(ls "$WHEEL_DIR"/llama_cpp_python-*.whl | head -n1)
    fi
    log "installing labkit into $VENV"
    pip_install -c requirements/constraints.txt "$wheel" -e ".[dev,mlx,postgres]"
    # labkit itself is an editable install (src/ is imported in place): compile it too
    "$VPY" -m compileall -q -j 0 src/labkit >/dev/null \
        || log "could not byte-compile src/labkit (run: $VPY -m compileall src/labkit); it still imports, only slower"
    mkdir -p "$VENV/share/labkit"
    cp "$WHEEL_DIR/build.json" "$VENV/share/labkit/llama-build.json"
    echo "$stamp_src" > "$VENV/.labkit-stamp"
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
