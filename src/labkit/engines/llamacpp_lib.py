"""llama-cpp-python's library itself: loading it, its log, and what build it is.

Split from ``engines.llamacpp`` (the engine over the C API), because everything here is about
the *process*, not a model: which libllama was loaded and whether it is labkit's one build
(``build_info``, the provenance every run records), ggml's backend initialised once with
llama.cpp's log routed into a ring buffer (``recent_log``, quoted in errors; ``capture_log``,
what a model load printed, from which its residency is read), and llama.cpp's quantizer,
which needs no model loaded.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from labkit.engines.base import EngineError
from labkit.errors import LabkitError, missing_extra

FTYPES = {"F16": 1, "Q4_0": 2, "Q8_0": 7, "Q2_K": 10, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}

_LOG: deque[str] = deque(maxlen=200)  # llama.cpp's recent log lines, quoted in errors
_log_cb = None  # keep the ctypes callback alive for the process lifetime
_CAPTURE: list[str] | None = None  # every log line while a model loads (residency is read from it)
_backend_ready = False


def _check_cpu() -> None:
    """Refuse, before the library loads, a build made for CPU features this machine lacks (a
    cache or a venv carried to another box, LLAMA_CPP_LIB_PATH at another CPU's build): it
    would stop on an illegal instruction in the middle of a run, recording nothing."""
    from labkit.engines import native

    other = os.environ.get("LLAMA_CPP_LIB_PATH")
    rec = (_build_record(str(Path(other) / native.lib_name("llama"))) if other else
           _read_json(Path(sys.prefix) / "share" / "labkit" / "llama-build.json"))
    if rec.get("cmake_args"):
        native.check_cpu(rec["cmake_args"], where=f"the build in {rec.get('dir') or other or sys.prefix}")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}


def lib():
    """The ``llama_cpp`` module, once its build is known to fit this CPU."""
    if "llama_cpp" not in sys.modules:
        _check_cpu()
    try:
        import llama_cpp
    except ImportError as e:  # pragma: no cover - the default install has it
        raise missing_extra("llama_cpp", "llama") from e
    return llama_cpp


def init_backend() -> None:
    """Initialise ggml once and route llama.cpp's logging into a ring buffer."""
    global _backend_ready, _log_cb
    if _backend_ready:
        return
    lc = lib()

    @lc.llama_log_callback
    def _cb(level, text, user_data):  # noqa: ARG001
        line = text.decode("utf-8", "replace")
        _LOG.append(line)
        if _CAPTURE is not None:
            _CAPTURE.append(line)

    _log_cb = _cb
    if os.environ.get("LABKIT_LLAMA_LOG") != "stderr":
        lc.llama_log_set(_log_cb, ctypes.c_void_p(0))
    lc.llama_backend_init()
    _backend_ready = True


def recent_log(n: int = 15) -> str:
    return "".join(list(_LOG)[-n:]).strip()


def build_info() -> dict:
    """How the installed llama-cpp-python was built (written by scripts/setup.sh)."""
    lc = lib()
    info: dict = {"llama_cpp_python": lc.__version__}
    path = Path(sys.prefix) / "share" / "labkit" / "llama-build.json"
    if path.is_file():
        info.update(json.loads(path.read_text()))
    else:
        info["cmake_args"] = "unknown: llama-cpp-python was not built by labkit's setup"
    loaded = _loaded_lib()
    if loaded.get("one_build") is False:
        # another library than the installed build (LLAMA_CPP_LIB_PATH): its flags and
        # patches are that build's own record where it is a labkit build, else unknown;
        # never the installed build's, which would put the wrong build on every number
        other = _build_record(loaded.get("lib_path"))
        for k in ("cmake_args", "patches", "llama_cpp_commit", "dir", "bin", "sha256", "built_at"):
            info.pop(k, None)
        info.update({k: other[k] for k in ("cmake_args", "llama_cpp_commit", "dir", "built_at") if k in other})
        info["patches"] = other.get("patches", []) if other else None  # a labkit build's record without: none
        info.setdefault("cmake_args", f"unknown: {loaded.get('lib_path')} is not a labkit build (no build.json)")
    info.update(loaded)
    info["system_info"] = lc.llama_print_system_info().decode().strip()
    info["gpu_offload_supported"] = bool(lc.llama_supports_gpu_offload())
    return info


_WARNED: set = set()


def _build_record(lib_path: str | None) -> dict:
    """The record (``native.find``) of the labkit llama.cpp build a library file lies in
    (``<dir>/build/bin/``), or {} for a library built some other way."""
    from labkit.engines import native

    return (native.find(Path(lib_path).resolve().parent.parent.parent) or {}) if lib_path else {}


def _loaded_lib() -> dict:
    """The libllama this process loaded (path, sha256) and whether it is the file the tools
    of labkit's one llama.cpp build link (``artifacts.native``); a different one
    (``LLAMA_CPP_LIB_PATH`` set to another build) is recorded and warned about once."""
    from labkit.engines import native

    try:
        import llama_cpp.llama_cpp as low

        path = low._lib._name
    except (ImportError, AttributeError):
        return {"lib_path": None, "one_build": None}
    out = native.loaded(path)
    if not out["one_build"] and out["lib_path"] not in _WARNED:
        _WARNED.add(out["lib_path"])
        rec = _build_record(out["lib_path"])
        want = {p["name"] for p in native.patches()}
        have = {p["name"] for p in rec.get("patches") or []} if rec else None
        kernels = ""
        if have != want:
            carries = ("unknown patches (not a labkit build)" if have is None
                       else ", ".join(sorted(have)) or "no patches")
            kernels = (f" It carries {carries}, not labkit's {', '.join(sorted(want)) or 'none'}: its verify costs "
                       "are another build's (runs record what they used).")
        print(f"WARNING: {out['one_build_why']}; labkit's numbers and the llama.cpp tools' (llama-server, "
              f"llama-bench) are then not from one build.{kernels} Unset LLAMA_CPP_LIB_PATH (or run `make setup`) "
              "to compare one build.", file=sys.stderr)
    return out


@contextmanager
def capture_log() -> Iterator[list[str]]:
    """Every llama.cpp log line while the block runs (a model load: its residency is read
    from what it printed), as a list filled in place."""
    global _CAPTURE
    init_backend()
    _CAPTURE = lines = []
    try:
        yield lines
    finally:
        _CAPTURE = None


def ggml_cpu():
    """ggml's CPU backend library, shipped beside libllama in the llama_cpp package."""
    lib_dir = Path(lib().__file__).parent / "lib"
    for name in ("libggml-cpu.so", "libggml-cpu.dylib", "ggml-cpu.dll", "libggml.so", "libggml.dylib"):
        if (lib_dir / name).exists():
            return ctypes.CDLL(str(lib_dir / name))
    raise EngineError(f"ggml's CPU backend library is not in {lib_dir}",
                      "reinstall llama-cpp-python (make setup), or drop n_cpu_moe from the recipe")


def quantize(src: Path, dst: Path, *, ftype: str, threads: int | None = None) -> dict:
    """Make a variant of ``src`` with llama.cpp's own quantizer; returns what was done."""
    init_backend()
    lc = lib()
    if ftype not in FTYPES:
        raise LabkitError(f"unknown ftype {ftype!r}", f"use one of {', '.join(FTYPES)}")
    params = lc.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.allow_requantize = True
    params.nthread = threads or (os.cpu_count() or 1)
    rc = lc.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise EngineError(f"llama_model_quantize failed ({rc}): {recent_log(6)}", "check the source model")
    return {"llama_cpp_python": lc.__version__, "ftype_id": FTYPES[ftype]}
