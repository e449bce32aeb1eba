"""MLX through mlx-lm: the same engine interface as llama.cpp, on a converted model directory.

- Weights: an mlx-lm directory (``labkit.artifacts.mlx_convert`` makes one from a GGUF), loaded
  with ``mlx_lm.utils.load_model``.
- Cache: one full ``KVCache`` per layer, not the model's own ``make_cache``. gemma3's
  default gives its sliding-window layers a ``RotatingKVCache(512)``, which stops being
  trimmable once 512 positions have been seen (``is_trimmable``: offset < max_size),
  and ``trim_prompt_cache`` then silently trims nothing. With full caches every layer
  trims, and gemma3_text still applies the window through the attention mask
  (``KVCache.make_mask(window_size=...)``): llama.cpp's ``swa_full`` in mlx-lm terms.
- Decode: one model call on the rows; ``mx.eval`` of the logits and the cache state
  before returning, so a clock read afterwards is honest. A prefill without all
  logits runs rows[:-1] for the cache only (mlx-lm's own ``_prefill``: the output
  matmul of those rows is never evaluated), then the last row. ``rollback`` trims every
  layer's cache (``KVCache.trim``, what ``trim_prompt_cache`` calls).
- Tokens: llama.cpp's vocabulary from the directory's ``vocab.gguf`` (``vocab_only``),
  so ids are exactly llama.cpp's; a directory without one uses its HF tokenizer.
- BLAS: on Linux the ``mlx-cpu`` wheel links a slow reference BLAS (a k+1-row verify
  costs about k+1 one-row passes). libmlx binds ``cblas_*`` in the global symbol scope
  first, so a system OpenBLAS loaded with ``RTLD_GLOBAL`` before ``mlx.core`` is
  imported takes over (as ``LD_PRELOAD`` does). ``$LABKIT_MLX_BLAS`` chooses: ``auto``
  (default: the system OpenBLAS if ldconfig knows one, e.g. Debian's
  libopenblas0-pthread, else the bundled one), ``bundled``, or a library path.
  ``describe()`` records which BLAS the process resolved. Linux timings are for
  correctness, never speed claims.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from labkit.engines.base import EngineError, VocabEngine
from labkit.engines.llamacpp import LlamaVocab
from labkit.errors import LabkitError, missing_extra

PREFILL_STEP = 512  # rows per model call in a long prefill (mlx-lm's prefill_step_size)
# Up to this many rows without all logits (a draft model catching up on [last draft,
# bonus]) one call with the extra output row beats a second pass through the layers.
ONE_CALL_ROWS = 2
LINUX_NOTE = "Linux mlx-cpu: timings for correctness, not speed claims"

# the vocabulary file a converted model directory carries (written by artifacts.mlx_convert)
VOCAB_FILE = "vocab.gguf"

__all__ = ["MlxEngine", "VOCAB_FILE", "full_cache", "blas_info", "import_mlx"]


_BLAS_CHOICE: dict = {}


def _load_blas() -> None:
    """Apply ``$LABKIT_MLX_BLAS`` once, before mlx.core is imported (see module doc)."""
    if _BLAS_CHOICE or sys.platform != "linux":
        return
    want = os.environ.get("LABKIT_MLX_BLAS", "auto")
    _BLAS_CHOICE["requested"] = want
    if want == "bundled":
        return
    if "mlx.core" in sys.modules:
        _BLAS_CHOICE["note"] = "not applied: mlx.core was imported before labkit's MLX engine"
        return
    import ctypes.util

    path = want if want not in ("auto", "openblas") else ctypes.util.find_library("openblas")
    if not path:
        if want != "auto":
            raise LabkitError("LABKIT_MLX_BLAS=openblas but no OpenBLAS is installed",
                              "apt-get install libopenblas0-pthread, or unset LABKIT_MLX_BLAS")
        return
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise LabkitError(f"LABKIT_MLX_BLAS: could not load {path}: {e}",
                          "give the path of a libopenblas.so, or set LABKIT_MLX_BLAS=bundled") from e
    _BLAS_CHOICE["loaded"] = path


def import_mlx():
    """``mlx.core``, imported after the BLAS choice is applied; a missing extra is named."""
    _load_blas()
    try:
        import mlx.core as mx
        import mlx_lm  # noqa: F401
    except ImportError as e:
        raise missing_extra(getattr(e, "name", None) or "mlx", "mlx") from e
    return mx


def full_cache(model) -> list:
    """A trimmable cache for any mlx-lm model: a plain ``KVCache`` per layer (see module doc)."""
    from mlx_lm.models.cache import KVCache

    return [KVCache() for _ in model.layers]


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def blas_info() -> dict:
    """Which BLAS MLX's CPU matmuls call: the library ``cblas_sgemm`` resolves to.

    libmlx binds its BLAS symbols in the global scope first (the executable and any
    LD_PRELOADed library), then its own bundled dependencies.
    """
    if sys.platform == "darwin":
        return {"blas": "Accelerate (mlx's macOS build)"}
    info: dict = {"ld_preload": os.environ.get("LD_PRELOAD") or None, "choice": dict(_BLAS_CHOICE) or None}
    try:
        glob = ctypes.CDLL(None)
        addr = ctypes.cast(glob.cblas_sgemm, ctypes.c_void_p).value
        dl = ctypes.CDLL("libdl.so.2")
        di = _DlInfo()
        lib = dl.dladdr(ctypes.c_void_p(addr), ctypes.byref(di)) and di.dli_fname.decode()
    except (AttributeError, OSError):
        lib = None
    if lib and "openblas" in lib.lower():
        ob = ctypes.CDLL(lib)
        ob.openblas_get_config.restype = ctypes.c_char_p
        info.update(blas="openblas", library=lib, config=ob.openblas_get_config().decode(),
                    threads=int(ob.openblas_get_num_threads()))
    elif lib:
        info.update(blas="other (global scope)", library=lib)
    else:
        bundled = _mapped("mlx_cpu.libs/libblas")
        info.update(blas="reference BLAS bundled with the mlx-cpu wheel", library=bundled,
                    note="slow: a k+1-row verify costs about (k+1)x one row; install an OpenBLAS "
                         "(Debian libopenblas0-pthread) and leave LABKIT_MLX_BLAS=auto")
    return info


def _mapped(fragment: str) -> str | None:
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if fragment in line:
                    return line.split()[-1]
    except OSError:
        pass
    return None


class _HfVocab:
    """An MLX directory's own HF tokenizer (directories labkit did not convert)."""

    def __init__(self, path: Path, eos: set[int]):
        from mlx_lm.tokenizer_utils import load as load_tokenizer

        if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
            raise LabkitError(f"{path} has no tokenizer ({VOCAB_FILE} or tokenizer.json)",
                              "convert the model with labkit (a zoo name) or use an mlx_lm.convert directory")
        self.tok = load_tokenizer(path)
        self.eos = eos | set(getattr(self.tok, "eos_token_ids", []) or [])

    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False)
        bos = self.tok.bos_token_id
        return ([bos] if add_bos and bos is not None else []) + list(ids)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.tok.decode(list(tokens))

    def is_eog(self, token: int) -> bool:
        return token in self.eos

    def token_text(self, token: int) -> str:
        return self.tok.convert_ids_to_tokens(int(token)) or ""

    def close(self) -> None:
        pass


class MlxEngine(VocabEngine):
    """An mlx-lm model with a full, trimmable KV cache on one sequence."""

    name = "mlx"

    def __init__(self, path: str | os.PathLike, *, n_ctx: int = 4096, n_threads: int | None = None,
                 artifact: dict | None = None):
        self._mx = import_mlx()
        from mlx_lm.utils import load_model

        self.path = Path(path)
        if not (self.path / "config.json").is_file():
            raise LabkitError(f"not an MLX model directory: {self.path}",
                              "use a zoo name in the recipe (converted on demand) or an mlx-lm directory")
        self.artifact = artifact or {}
        self.n_threads = n_threads
        self.blas = blas_info()
        if n_threads and self.blas.get("blas") == "openblas":
            ob = ctypes.CDLL(self.blas["library"])
            ob.openblas_set_num_threads(int(n_threads))
            self.blas["threads"] = int(ob.openblas_get_num_threads())
        try:
            self.model, self.config = load_model(self.path)
        except (ValueError, FileNotFoundError) as e:
            raise EngineError(f"mlx-lm could not load {self.path}: {e}",
                              "reconvert the model, or check that mlx-lm supports its model_type") from e
        self.n_vocab = int(self.config.get("vocab_size") or self.config["text_config"]["vocab_size"])
        self.n_ctx = int(n_ctx)
        vocab_file = self.path / VOCAB_FILE
        eos = self.config.get("eos_token_id")
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.tok = LlamaVocab.load(vocab_file) if vocab_file.is_file() else _HfVocab(self.path, eos_ids)
        self.has_tokenizer = True
        self.cache = full_cache(self.model)
        self.n_past = 0
        self.kv_tokens: list[int] = []
        self._out = None  # mx array (rows, n_vocab) of the last decode
        self._np: np.ndarray | None = None

    # -- core ---------------------------------------------------------------------
    def _forward(self, tokens: Sequence[int]):
        mx = self._mx
        x = mx.array(list(tokens), dtype=mx.uint32)[None]
        return self.model(x, cache=self.cache)[0]  # (rows, n_vocab), lazy

    def decode(self, tokens: Sequence[int], *, all_logits: bool = True) -> None:
        n = len(tokens)
        if n == 0:
            raise EngineError("decode called with no tokens", "this is a bug in the caller")
        self.check_fits(n, what="this decode")
        mx = self._mx
        start = self.n_past
        try:
            if all_logits or n <= ONE_CALL_ROWS:
                out = self._forward(tokens)
                out = out if all_logits else out[-1:]
            else:
                # cache-only chunks: their logits are never evaluated, so never computed
                for off in range(0, n - 1, PREFILL_STEP):
                    self._forward(tokens[off : min(off + PREFILL_STEP, n - 1)])
                    mx.eval([c.state for c in self.cache])
                out = self._forward(tokens[-1:])
            mx.eval(out, [c.state for c in self.cache])
        except Exception as e:
            self._trim_to(start)
            raise EngineError(f"MLX decode failed at position {start} ({n} rows): {e}",
                              "rerun; report it if it persists") from e
        self.n_past = start + n
        self.kv_tokens.extend(tokens)
        self._out, self._np = out, None

    def logits(self, i: int = -1) -> np.ndarray:
        if self._out is None:
            raise IndexError("no logits: nothing decoded yet")
        if self._np is None:
            self._np = np.asarray(self._out.astype(self._mx.float32) if self._out.dtype != self._mx.float32
                                  else self._out)  # zero-copy view of MLX's buffer
        rows = self._np.shape[0]
        if i < 0:
            i += rows
        if not 0 <= i < rows:
            raise IndexError(f"logits row {i} of {rows}")
        return self._np[i]

    def _trim_to(self, n_past: int) -> None:
        from mlx_lm.models.cache import can_trim_prompt_cache

        if not can_trim_prompt_cache(self.cache):
            raise EngineError(f"the MLX cache could not roll back to position {n_past}",
                              "this model's cache is not trimmable; speculation needs one that is")
        for c in self.cache:  # per layer: a failed decode may have advanced only some
            if c.offset > n_past:
                c.trim(c.offset - n_past)

    def rollback(self, n_past: int) -> None:
        if n_past < self.n_past:
            self._trim_to(n_past)
        self.n_past = min(self.n_past, n_past)
        del self.kv_tokens[self.n_past :]

    # -- provenance -------------------------------------------------------------------
    def describe(self) -> dict:
        mx = self._mx
        from importlib.metadata import version

        params = _param_summary(self.model)
        d = {
            "engine": self.name,
            "build": {"mlx": version("mlx"), "mlx_lm": version("mlx-lm"), "blas": self.blas},
            "device": str(mx.default_device()),
            "threads": self.n_threads,
            "threads_note": "MLX's CPU backend has no thread setting; n_threads sets OpenBLAS's when it is in use",
            "n_ctx": self.n_ctx,
            "cache": "full KVCache per layer (trimmable; sliding window applied by the attention mask)",
            "model_path": str(self.path),
            "model_type": self.config.get("model_type"),
            "dtype": params["dtype"],
            "quantization": self.config.get("quantization"),
            "model_n_params": params["n"],
            "n_layer": len(self.model.layers),
            "n_vocab": self.n_vocab,
            "tokenizer": "llama.cpp vocab_only (vocab.gguf)" if isinstance(self.tok, LlamaVocab) else "HF tokenizer",
            "model": self.artifact,
            "residency": {"note": "unified memory" if sys.platform == "darwin" else "all weights and KV on the host"},
        }
        if platform.system() == "Linux":
            d["label"] = LINUX_NOTE
        return d

    def close(self) -> None:
        if getattr(self, "tok", None) is not None:
            self.tok.close()
        self.cache = []
        self._out = self._np = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _param_summary(model) -> dict:
    from mlx.utils import tree_flatten

    leaves = tree_flatten(model.parameters())
    dtypes = sorted({str(v.dtype).replace("mlx.core.", "") for _, v in leaves})
    return {"n": int(sum(v.size for _, v in leaves)), "dtype": dtypes[0] if len(dtypes) == 1 else dtypes}
