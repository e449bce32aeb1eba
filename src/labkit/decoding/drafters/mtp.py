"""MTP drafting: the target's own nextn (multi-token prediction) layer drafts.

This mirrors llama.cpp's ``common_speculative_impl_draft_mtp`` in its single-head,
growing-KV mode (common/speculative.cpp), through the C API:

* a second context on the target's model with ``ctx_type = LLAMA_CONTEXT_TYPE_MTP``
  runs only the nextn block (its own KV cache, holding the nextn layer only);
* the target exports ``h_p``, its final-norm hidden state at every position
  (``llama_set_embeddings_nextn(target, true, masked=false)``);
* the MTP cache holds, at position p, the token ``x_p`` paired with ``h_{p-1}``
  (``h_{-1}`` is zero): the "process" catch-up after target decodes;
* a draft starts from the last history token at position N = target n_past paired
  with ``h_{N-1}`` (``pending_h``), then feeds each drafted token back with the MTP
  context's own nextn output, one row per step; afterwards the draft rows are erased.

One deliberate difference: llama.cpp runs the catch-up right after every target
decode, over all k+1 verify rows, so its time lands in verification. Here, by
default (``catchup="deferred"``), the decode hook only copies the target's hidden
rows and the catch-up runs at the start of ``propose`` over the rows the target
kept (rejected rows would be erased unread), so ``draft_ms`` holds all MTP work and
``verify_ms`` only the target's. ``catchup="eager"`` does it llama.cpp's way. Both
leave the MTP cache in the same state.

The staging functions (``llama_set_embeddings_nextn``, ``llama_get_embeddings_nextn``,
``llama_get_embeddings_nextn_ith``) are declared in src/llama-ext.h without
``extern "C"``, so libllama exports them under C++ mangled names and the Python
bindings lack them: they are bound here with ctypes.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence

import numpy as np

from labkit.decoding.drafters.base import Draft, Drafter
from labkit.decoding.sampling import sample, softmax
from labkit.engines.base import EngineError
from labkit.errors import LabkitError

CATCHUP_MODES = ("deferred", "eager")
_SYNTHETIC_NOTE = "SYNTHETIC random weights: acceptance is meaningless, only the draft cost D is real"

_f32p = ctypes.POINTER(ctypes.c_float)
# name -> (Itanium-mangled name, argtypes, restype). Mangling: _Z <len><name> then the
# parameter types: P13llama_context (llama_context *), b (bool), i (int32_t).
_EXT = {
    "llama_set_embeddings_nextn": (
        "_Z26llama_set_embeddings_nextnP13llama_contextbb", [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None,
    ),
    "llama_get_embeddings_nextn": ("_Z26llama_get_embeddings_nextnP13llama_context", [ctypes.c_void_p], _f32p),
    "llama_get_embeddings_nextn_ith": (
        "_Z30llama_get_embeddings_nextn_ithP13llama_contexti", [ctypes.c_void_p, ctypes.c_int32], _f32p,
    ),
}
_ext_fns: dict = {}


def ext(name: str):
    """A llama-ext.h function from libllama: the bindings' one, else the C name, else the mangled one."""
    if name in _ext_fns:
        return _ext_fns[name]
    import llama_cpp.llama_cpp as lcc

    fn = getattr(lcc, name, None)
    if fn is None:
        mangled, argtypes, restype = _EXT[name]
        for symbol in (name, mangled):
            try:
                fn = getattr(lcc._lib, symbol)
                break
            except AttributeError:
                continue
        if fn is None:
            raise EngineError(
                f"libllama does not export {name} (looked for {name} and {mangled})",
                "MTP needs a llama-cpp-python build whose llama.cpp has the nextn staging API "
                "(0.3.36 vendors one); use drafter ngram or model",
            )
        fn.argtypes, fn.restype = argtypes, restype
    _ext_fns[name] = fn
    return fn


def _file_has_block(path: str, block: int) -> bool:
    """Whether the GGUF at ``path`` holds any tensor of block ``block`` (reads the header only)."""
    from gguf import GGUFReader

    prefix = f"blk.{block}."
    return any(t.name.startswith(prefix) for t in GGUFReader(path, "r").tensors)


class _MTPContext:
    """The MTP context: one sequence, rows of (token, hidden state) in, logits and h out."""

    def __init__(self, target):
        lc = self._lc = target._lc
        cp = lc.llama_context_default_params()
        cp.n_ctx = target.n_ctx
        cp.n_batch = cp.n_ubatch = target.n_batch
        cp.n_seq_max = 1
        cp.n_rs_seq = 0
        cp.n_threads = cp.n_threads_batch = target.n_threads
        cp.no_perf = True
        cp.ctx_type = lc.LLAMA_CONTEXT_TYPE_MTP
        cp.ctx_other = target.ctx
        self.ctx = lc.llama_init_from_model(target.model, cp)
        if not self.ctx:
            from labkit.engines.llamacpp_lib import recent_log

            raise EngineError(f"llama.cpp could not create the MTP context: {recent_log(4)}", "lower n_ctx")
        self.mem = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_ext_init(self.ctx)
        self.n_batch = target.n_batch
        self.n_vocab = target.n_vocab
        self.n_embd = lc.llama_model_n_embd_out(target.model)
        self._pos = (ctypes.c_int32 * 1)()
        ext("llama_set_embeddings_nextn")(self.ctx, True, True)  # h only for output rows

    def decode(self, tokens: Sequence[int], pos0: int, h: np.ndarray, *, output_last: bool) -> None:
        """Append ``tokens`` at ``pos0``.. with hidden rows ``h`` (len(tokens) x n_embd, float32)."""
        lc, b = self._lc, self.batch
        h = np.ascontiguousarray(h, dtype=np.float32)
        base = h.ctypes.data
        row = self.n_embd * 4
        n = len(tokens)
        for off in range(0, n, self.n_batch):
            lc.llama_batch_ext_clear(b)
            m = min(self.n_batch, n - off)
            for j in range(m):
                i = off + j
                idx = lc.llama_batch_ext_add_token(b, 0, int(tokens[i]))
                self._pos[0] = pos0 + i
                embd = lc.llama_embd(ctypes.cast(base + i * row, _f32p), 1, self.n_embd)
                if (
                    idx < 0
                    or not lc.llama_batch_ext_set_pos(b, idx, self._pos)
                    or not lc.llama_batch_ext_set_embd_token(b, idx, embd)  # copies the row
                ):
                    raise EngineError(f"could not add token {tokens[i]} to the MTP batch ({idx})", "a bug: report it")
                if output_last and i == n - 1:
                    lc.llama_batch_ext_set_output_logits(b, idx, True)
            rc = lc.llama_process(self.ctx, lc.LLAMA_PROCESS_TYPE_DECODE, b)
            if rc != 0:
                from labkit.engines.llamacpp_lib import recent_log

                lc.llama_memory_seq_rm(self.mem, 0, pos0 + off, -1)
                raise EngineError(f"MTP decode returned {rc} at position {pos0 + off}: {recent_log(4)}",
                                  "raise n_ctx, or use drafter ngram or model")
        lc.llama_synchronize(self.ctx)

    def logits(self) -> np.ndarray:
        return np.ctypeslib.as_array(self._lc.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,))

    def h_last(self) -> np.ndarray:
        ptr = ext("llama_get_embeddings_nextn_ith")(self.ctx, 0)
        if not ptr:
            raise EngineError("the MTP context returned no nextn embedding", "a bug: report it")
        return np.ctypeslib.as_array(ptr, shape=(1, self.n_embd))

    def rollback(self, n: int) -> None:
        self._lc.llama_memory_seq_rm(self.mem, 0, n, -1)

    def close(self) -> None:
        if self.batch is not None:
            self._lc.llama_batch_ext_free(self.batch)
            self.batch = None
        if self.ctx:
            self._lc.llama_free(self.ctx)
            self.ctx = None


class MTPDrafter(Drafter):
    """Drafts with the target's nextn layer(s) through a llama.cpp MTP context.

    ``target``: a LlamaCppEngine created with ``load_mtp=True``. Close this drafter
    before the engine (its context lives on the engine's model).
    """

    name = "mtp"

    def __init__(self, target, *, catchup: str = "deferred"):
        from labkit.engines.llamacpp import LlamaCppEngine

        if not isinstance(target, LlamaCppEngine):
            raise LabkitError(
                f"MTP drafting runs through llama.cpp's MTP context; the target engine is {target.name}",
                "use the llama.cpp engine, or drafter ngram or model",
            )
        if catchup not in CATCHUP_MODES:
            raise LabkitError(f"unknown MTP catch-up mode {catchup!r}", f"use one of {', '.join(CATCHUP_MODES)}")
        lc = target._lc
        self.n_nextn = int(lc.llama_model_n_layer_nextn(target.model))
        if self.n_nextn == 0:
            raise LabkitError(
                f"model has no MTP/nextn layers ({target.model_path})",
                "use drafter ngram or model, or a model with MTP layers (e.g. synthetic-mtp)",
            )
        # Either gap makes llama.cpp abort the process (GGML_ASSERT) while building
        # the MTP graph, so both are refused here.
        if getattr(target, "load_mtp", True) is False:
            raise LabkitError(
                "the target engine was created without its MTP layers (load_mtp=False)",
                "create the llama.cpp engine with load_mtp=True",
            )
        first = int(lc.llama_model_n_layer(target.model))
        if not _file_has_block(target.model_path, first):
            raise LabkitError(
                f"model has no MTP/nextn layers: its metadata declares {self.n_nextn} but the file has no "
                f"blk.{first}.* tensors (converted without them?)",
                "use drafter ngram or model, or a GGUF converted with its MTP layers",
            )
        self.target = target
        self.catchup = catchup
        self._mtp = _MTPContext(target)
        self.n_embd = self._mtp.n_embd
        ext("llama_set_embeddings_nextn")(target.ctx, True, False)  # h for every target row
        self._get_h = ext("llama_get_embeddings_nextn")
        self.stats = {"catchup_rows": 0, "catchup_ms": 0.0, "draft_rows": 0, "draft_ms": 0.0}
        self._reset()
        target.decode_hooks.append(self._on_target_decode)

    # -- state ------------------------------------------------------------------------
    # The store holds x_p and h_p of target positions p in [s, s + len): rows the
    # target decoded that the MTP cache may still need; h_prev is h_{s-1}. The MTP
    # cache holds positions < mtp_n, with s <= mtp_n <= s + len.
    def _reset(self) -> None:
        self._s = 0
        self._h_prev = np.zeros((1, self.n_embd), np.float32)
        self._tok: list[int] = []
        self._h = np.zeros((0, self.n_embd), np.float32)
        self._mtp_n = 0
        self._mtp.rollback(0)

    def _truncate(self, n: int) -> None:
        """Forget target positions >= n (the target rolled back)."""
        if n < self._s:
            raise LabkitError(
                f"the target went back to position {n}, before the MTP drafter's state ({self._s})",
                "start a new generation (labkit.decoding.loop does: it rolls the target back to 0 first)",
            )
        keep = n - self._s
        if keep > len(self._tok):
            raise LabkitError(
                f"the MTP drafter missed target positions {self._s + len(self._tok)}..{n - 1}",
                "attach the drafter before the target decodes the prompt",
            )
        del self._tok[keep:]
        self._h = self._h[:keep]
        if self._mtp_n > n:
            self._mtp.rollback(n)
            self._mtp_n = n

    def _on_target_decode(self, tokens: Sequence[int], first: int) -> None:
        """Decode hook: keep the target's hidden rows of this decode (a copy: the next decode overwrites them)."""
        n = len(tokens)
        if n > self.target.n_batch:
            raise LabkitError(
                f"MTP drafting needs the target's hidden rows of every position, but this decode of {n} rows "
                f"ran in chunks of {self.target.n_batch} and only the last chunk's rows survive",
                f"keep prompts to {self.target.n_batch} tokens, or raise the engine's n_batch",
            )
        if first == 0:
            self._reset()
        self._truncate(first)
        ptr = self._get_h(self.target.ctx)
        if not ptr:
            raise EngineError("the target exported no nextn embeddings", "a bug: report it")
        h = np.ctypeslib.as_array(ptr, shape=(n, self.n_embd))
        self._tok.extend(int(t) for t in tokens)
        self._h = np.concatenate([self._h, h])
        if self.catchup == "eager":
            self._process(first + n)

    def _process(self, n: int) -> None:
        """The catch-up: put positions mtp_n .. n-1 into the MTP cache, x_p paired with h_{p-1}."""
        a = self._mtp_n
        if n <= a:
            return
        t0 = time.perf_counter()
        i, j = a - self._s, n - self._s
        h_shift = np.concatenate([self._h_prev, self._h[: j - 1]])[i:]  # rows h_{a-1} .. h_{n-2}
        self._mtp.decode(self._tok[i:j], a, h_shift, output_last=False)
        self._mtp_n = n
        self.stats["catchup_rows"] += n - a
        self.stats["catchup_ms"] += (time.perf_counter() - t0) * 1e3

    def _commit(self, n: int) -> np.ndarray:
        """The target holds positions < n: sync the MTP cache to them; returns pending_h = h_{n-1}."""
        self._truncate(n)
        self._process(n)
        pending = self._h[n - 1 - self._s : n - self._s] if n > self._s else self._h_prev
        self._s, self._h_prev = n, pending.copy()
        self._tok.clear()
        self._h = self._h[:0]
        return self._h_prev

    # -- Drafter ----------------------------------------------------------------------
    supports_prompt_reuse = False  # its catch-up needs the target's hidden rows of the whole prompt

    def begin(self, prompt: Sequence[int], *, keep: int = 0) -> None:
        """After the target's prefill: the prompt's catch-up (timed as the drafter's prefill)."""
        if self.target.n_past != len(prompt):
            raise LabkitError(
                f"begin() expects the target to hold the prompt ({len(prompt)} tokens), it holds {self.target.n_past}",
                "call begin() right after the target's prefill",
            )
        self._commit(len(prompt))

    def propose(self, history, k, *, temperature=0.0, rng=None) -> Draft:
        n = self.target.n_past
        if len(history) != n + 1:
            raise LabkitError(
                f"the history ({len(history)} tokens) does not end one past the target's cache ({n} positions)",
                "propose() expects labkit.decoding.loop's protocol: the last history token is not yet in the target's cache",
            )
        pending = self._commit(n)
        if k <= 0:
            return Draft([])
        t0 = time.perf_counter()
        out: list[int] = []
        qs: list[np.ndarray] | None = [] if temperature > 0 else None
        ps: list[float] = []
        tok, h = int(history[-1]), pending
        for i in range(k):
            self._mtp.decode([tok], n + i, h, output_last=True)
            row = self._mtp.logits()
            if temperature > 0:
                q = softmax(row, temperature)
                tok = sample(q, rng)
                qs.append(q)
            else:
                tok = int(np.argmax(row))
            if self.collect_evidence:  # the head's probability for its token (policy evidence)
                ps.append(float(qs[-1][tok]) if temperature > 0 else float(softmax(row, 1.0)[tok]))
            out.append(tok)
            if i + 1 < k:
                h = self._mtp.h_last()  # the MTP's own nextn output drives its next step
        self._mtp.rollback(n)  # drop the draft rows: the MTP cache again mirrors the target's
        self.stats["draft_rows"] += k
        self.stats["draft_ms"] += (time.perf_counter() - t0) * 1e3
        info = {"mtp_rows": k, **({"p": ps} if self.collect_evidence else {})}
        return Draft(out, q=qs, info=info)

    def describe(self) -> dict:
        d = {
            "drafter": self.name,
            "method": "llama.cpp MTP context (LLAMA_CONTEXT_TYPE_MTP) on the target's nextn layer: "
            "one head, growing KV (common_speculative_impl_draft_mtp), greedy or sampled with q",
            "nextn_layers": self.n_nextn,
            "catchup": self.catchup,
            "stats": dict(self.stats),
        }
        if self._synthetic():
            d["synthetic"] = True
            d["note"] = _SYNTHETIC_NOTE
        return d

    def _synthetic(self) -> bool:
        art = self.target.artifact or {}
        if art.get("synthetic") or (art.get("made") or {}).get("synthetic"):
            return True
        buf = ctypes.create_string_buffer(256)
        n = self.target._lc.llama_model_meta_val_str(self.target.model, b"general.description", buf, 256)
        return n > 0 and buf.value.decode("utf-8", "replace").startswith("SYNTHETIC")

    def close(self) -> None:
        """Detach from the target (idempotent: a second close must not undo a newer drafter's setup)."""
        t = getattr(self, "target", None)
        if t is None or self._mtp.ctx is None:
            return
        if self._on_target_decode in t.decode_hooks:
            t.decode_hooks.remove(self._on_target_decode)
        if getattr(t, "model", None) is None:
            return  # the model is gone: freeing a context on it would touch freed memory
        still_mtp = any(isinstance(getattr(h, "__self__", None), MTPDrafter) for h in t.decode_hooks)
        if t.ctx and not still_mtp:
            ext("llama_set_embeddings_nextn")(t.ctx, False, False)
        self._mtp.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


