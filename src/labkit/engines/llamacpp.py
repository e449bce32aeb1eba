"""llama.cpp through llama-cpp-python's C API (not the high-level ``Llama`` class).

Why the C API: ``Llama`` copies every row's logits into numpy and hides the verify
step inside ``generate``. Here a verify of m rows is one explicit ``llama_decode`` of
an m-row ``llama_batch``, logits are read as zero-copy numpy views of llama.cpp's own
buffer (a 262k-entry row is never copied to argmax it), and the KV cache is rolled
back with ``llama_memory_seq_rm``.

Several sequences (``n_seq_max`` > 1) serve the multi-slot loop: ``decode_seqs`` puts
rows of several sequence ids in one batch, ``seq_rollback`` rolls one sequence back and
leaves the others alone. The single-sequence API works on sequence 0. Use a unified KV
buffer (``kv_unified=True``) for them: with one KV stream per sequence llama.cpp splits
a batch into "equal" micro-batches (the same number of rows from each sequence, and only
consecutive sequence ids together), so a step whose streams verify 4, 1 and 3 rows runs
as 4 forward passes instead of one. Unified, the batch is one pass and each row attends
over the shared buffer under its sequence's mask.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from labkit.engines import residency as rs
from labkit.engines.base import EngineError, VocabEngine
from labkit.engines.llamacpp_lib import (
    build_info,
    capture_log,
    ggml_cpu,
    init_backend,
    lib,
    recent_log,
)
from labkit.errors import LabkitError


class LlamaVocab:
    """llama.cpp's tokenizer over a loaded vocabulary (shared by the llama.cpp and MLX engines).

    ``LlamaVocab.load(path)`` reads only the vocabulary of a GGUF (``vocab_only``).
    """

    def __init__(self, lc, vocab, *, owner=None):
        self._lc, self.vocab, self._owner = lc, vocab, owner  # owner: a vocab-only model to free
        self.n_vocab = lc.llama_vocab_n_tokens(vocab)
        # Synthetic cost models carry no tokenizer (type "none"): llama.cpp asserts
        # (kills the process) if asked to tokenize or name their tokens.
        self.has_tokenizer = lc.llama_vocab_type(vocab) != lc.LLAMA_VOCAB_TYPE_NONE
        self.path = None

    @classmethod
    def load(cls, path) -> LlamaVocab:
        init_backend()
        lc = lib()
        mp = lc.llama_model_default_params()
        mp.vocab_only = True
        model = lc.llama_model_load_from_file(str(path).encode(), mp)
        if not model:
            raise EngineError(f"llama.cpp could not load the vocabulary of {path}: {recent_log(4)}",
                              "check that the file is a complete GGUF (reconvert or rebuild it)")
        v = cls(lc, lc.llama_model_get_vocab(model), owner=model)
        v.path = str(path)
        return v

    def _need_tokenizer(self) -> None:
        if not self.has_tokenizer:
            raise EngineError(
                "this model has no tokenizer (a synthetic cost model): it takes token ids only",
                "use it for cost measurements (bench verify), not for text workloads or as a draft model",
            )

    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        self._need_tokenizer()
        lc = self._lc
        raw = text.encode("utf-8")
        cap = len(raw) + 16
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_bos, True)
        if n < 0:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_bos, True)
        return list(buf[: max(n, 0)])

    def detokenize(self, tokens: Sequence[int]) -> str:
        self._need_tokenizer()
        lc = self._lc
        arr = (lc.llama_token * max(1, len(tokens)))(*tokens)
        cap = 16 * len(tokens) + 64
        out = ctypes.create_string_buffer(cap)
        n = lc.llama_detokenize(self.vocab, arr, len(tokens), out, cap, False, False)
        if n < 0:
            out = ctypes.create_string_buffer(-n)
            n = lc.llama_detokenize(self.vocab, arr, len(tokens), out, -n, False, False)
        return out.raw[: max(n, 0)].decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(self._lc.llama_vocab_is_eog(self.vocab, token))

    def token_text(self, token: int) -> str:
        self._need_tokenizer()
        t = self._lc.llama_vocab_get_text(self.vocab, token)
        return t.decode("utf-8", "replace") if t else ""

    def close(self) -> None:
        if self._owner:
            self._lc.llama_model_free(self._owner)
            self._owner = None


class LlamaCppEngine(VocabEngine):
    """A llama.cpp model and context on one sequence.

    ``load_mtp`` loads a model's nextn (MTP) layers, so that an MTP drafter can make a
    second context on the same model (see ``labkit.decoding.drafters.mtp``).
    """

    name = "llama.cpp"

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        n_batch: int = 512,
        load_mtp: bool = False,
        n_cpu_moe: int = 0,
        artifact: dict | None = None,
        n_seq_max: int = 1,
        kv_unified: bool = False,
        eval_callback=None,
    ):
        """``eval_callback``: a ``llama_cpp.ggml_backend_sched_eval_callback`` called for every
        graph node (llama.cpp's ``cb_eval``; measure.op_profile times ops with it). It makes
        ggml compute the graph node by node: never set it for a timing that is not a profile."""
        with capture_log() as printed:
            try:
                self._load(model_path, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, n_batch=n_batch,
                           load_mtp=load_mtp, n_cpu_moe=n_cpu_moe, artifact=artifact, n_seq_max=n_seq_max,
                           kv_unified=kv_unified, eval_callback=eval_callback)
            finally:
                self.load_log = "".join(printed)
        self.residency = self._residency()

    def _load(self, model_path, *, n_ctx, n_threads, n_gpu_layers, n_batch, load_mtp, n_cpu_moe, artifact,
              n_seq_max, kv_unified, eval_callback):
        lc = self._lc = lib()
        self.model_path = str(model_path)
        if not Path(self.model_path).is_file():
            raise LabkitError(f"model file not found: {self.model_path}", "run `labkit models` to build the zoo")
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.n_gpu_layers = n_gpu_layers
        self.load_mtp = load_mtp
        self.artifact = artifact or {}
        self.n_cpu_moe = n_cpu_moe
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = n_gpu_layers
        mp.load_mtp = load_mtp
        if n_cpu_moe:
            self._overrides = _expert_overrides(n_cpu_moe)  # kept alive: llama.cpp reads the patterns at load
            mp.tensor_buft_overrides = ctypes.cast(self._overrides, ctypes.c_void_p)
        self.model = lc.llama_model_load_from_file(self.model_path.encode(), mp)
        if not self.model:
            raise EngineError(
                f"llama.cpp could not load {self.model_path}: {recent_log(4) or 'no log'}",
                "check that the file is a complete GGUF for an architecture this llama.cpp supports "
                "(rebuild zoo models with `labkit models --rebuild NAME`)",
            )
        self.n_expert = int(self.meta("{arch}.expert_count") or 0)
        problem = None
        if n_cpu_moe and not self.n_expert:
            problem = LabkitError(f"n_cpu_moe = {n_cpu_moe} asks to keep experts on the host, but "
                                  f"{Path(self.model_path).name} is a dense model (no {self.meta('general.architecture')}"
                                  ".expert_count)", "drop n_cpu_moe from the recipe (use n_gpu_layers for dense models)")
        elif load_mtp and not int(lc.llama_model_n_layer_nextn(self.model)):
            problem = LabkitError(f"the recipe's drafters include 'mtp', but {Path(self.model_path).name} has no "
                                  "MTP (nextn) layers", "drop 'mtp' from drafters, or use a model with nextn layers "
                                  "(e.g. the zoo's synthetic-mtp, or a GLM-4.5 / DeepSeek-V3 / Qwen3.5 GGUF with them)")
        if problem:
            lc.llama_model_free(self.model)
            self.model = None
            raise problem
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.tok = LlamaVocab(lc, self.vocab)
        self.n_vocab = self.tok.n_vocab
        self.has_tokenizer = self.tok.has_tokenizer
        self.n_batch = max(n_batch, 64)
        cp = lc.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = self.n_batch
        cp.n_ubatch = self.n_batch
        # n_seq_max > 1: kv_unified=False gives one KV stream per sequence (llama-server's
        # default for -np N), each of n_ctx / n_seq_max positions (rounded to 256);
        # kv_unified=True one buffer of n_ctx positions shared by all (see the module doc)
        if not 1 <= n_seq_max <= 64:
            raise LabkitError(f"n_seq_max = {n_seq_max}", "use 1..64 sequences")
        self.n_seq_max = n_seq_max
        self.kv_unified = kv_unified
        cp.n_seq_max = n_seq_max
        cp.kv_unified = kv_unified
        cp.n_threads = self.n_threads
        cp.n_threads_batch = self.n_threads
        cp.no_perf = True
        # Rolling back a verify must never need KV cells that a sliding-window cache
        # already evicted (gemma-3 has SWA layers): keep the full-size SWA cache.
        cp.swa_full = True
        self.eval_callback = eval_callback  # kept alive: llama.cpp calls it for as long as the context lives
        if eval_callback is not None:
            cp.cb_eval = eval_callback
        self._cparams = cp
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            lc.llama_model_free(self.model)
            raise EngineError(f"llama.cpp could not create a context: {recent_log(4)}", "lower n_ctx")
        # the positions one sequence can hold (== the whole context when n_seq_max is 1)
        self.n_ctx_total = lc.llama_n_ctx(self.ctx)
        self.n_ctx = lc.llama_n_ctx_seq(self.ctx)
        self.mem = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_init(self.n_batch, 0, 1)
        # Fixed per-row fields are written once; token/pos/logits flags via numpy views.
        for i in range(self.n_batch):
            self.batch.n_seq_id[i] = 1
            self.batch.seq_id[i][0] = 0
        self._tok = np.ctypeslib.as_array(self.batch.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(self.batch.pos, shape=(self.n_batch,))
        self._out = np.ctypeslib.as_array(self.batch.logits, shape=(self.n_batch,))
        self._rows = 0  # output rows of the last decode
        self._served: np.ndarray | None = None  # a reused prompt's saved last row (prompt_reuse)
        self._row_index: list[int] = []  # output row -> batch index
        self.n_past = 0
        self.kv_tokens: list[int] = []
        self.decode_hooks: list = []  # callables(tokens, first_pos) run after each decode (MTP)
        self._mbatch = None  # the multi-sequence batch, made on first use (see decode_seqs)
        self.seq_n_past = [0] * n_seq_max  # per-sequence positions of the multi-sequence API

    # -- core ---------------------------------------------------------------------
    def decode(self, tokens: Sequence[int], *, all_logits: bool = True) -> None:
        n = len(tokens)
        if n == 0:
            raise EngineError("decode called with no tokens", "this is a bug in the caller")
        self.check_fits(n, what="this decode")
        self._served = None
        lc = self._lc
        for off in range(0, n, self.n_batch):
            chunk = tokens[off : off + self.n_batch]
            m = len(chunk)
            last_chunk = off + m == n
            self._tok[:m] = chunk
            self._pos[:m] = np.arange(self.n_past, self.n_past + m)
            self._out[:m] = 1 if all_logits else 0
            if not all_logits and last_chunk:
                self._out[m - 1] = 1
            self.batch.n_tokens = m
            rc = lc.llama_decode(self.ctx, self.batch)
            if rc != 0:
                # Whatever this chunk wrote is not trusted: drop it so the cache stays consistent.
                lc.llama_memory_seq_rm(self.mem, 0, self.n_past, -1)
                del self.kv_tokens[self.n_past :]
                raise EngineError(
                    f"llama_decode returned {rc} at position {self.n_past} (chunk of {m} rows): "
                    f"{recent_log(4) or 'no log'}",
                    "if the context is full raise n_ctx; otherwise the engine failed: rerun, and report "
                    "the log above if it persists",
                )
            self.n_past += m
            self.kv_tokens.extend(chunk)
            for hook in self.decode_hooks:  # per chunk: only this chunk's outputs are readable now
                hook(chunk, self.n_past - m)
        lc.llama_synchronize(self.ctx)
        self._rows = (n - (n - 1) // self.n_batch * self.n_batch) if all_logits else 1

    def logits(self, i: int = -1) -> np.ndarray:
        if i < 0:
            i += self._rows
        if not 0 <= i < self._rows:
            raise IndexError(f"logits row {i} of {self._rows}")
        if self._served is not None:
            return self._served
        ptr = self._lc.llama_get_logits_ith(self.ctx, i if self._rows > 1 else -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def rollback(self, n_past: int) -> None:
        if n_past < self.n_past:
            ok = self._lc.llama_memory_seq_rm(self.mem, 0, n_past, -1)
            if not ok:
                raise EngineError(
                    f"llama.cpp could not roll the KV cache back to position {n_past}",
                    "this model's cache type cannot be partially erased; speculation needs one that can",
                )
        self.n_past = min(self.n_past, n_past)
        del self.kv_tokens[self.n_past :]

    # -- several sequences (the multi-slot loop) ------------------------------------------
    # Sequence s holds positions 0..seq_n_past[s]-1. These calls and the single-sequence
    # API above share sequence 0: call seq_clear() when switching between the two.
    def _multi_batch(self):
        if self._mbatch is None:
            b = self._mbatch = self._lc.llama_batch_init(self.n_batch, 0, 1)
            for i in range(self.n_batch):
                b.n_seq_id[i] = 1
            self._mtok = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
            self._mpos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
            self._mout = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        return self._mbatch

    def decode_seqs(self, parts: Sequence[tuple[int, Sequence[int]]]) -> list[int]:
        """One ``llama_decode`` of rows from several sequences, every row with its logits.

        ``parts``: (sequence id, tokens) pairs, each appended at that sequence's next
        positions. Returns, per part, the index of its first output row (rows are read with
        :meth:`logits` / :meth:`argmax_rows`, in the order of ``parts``). Synchronised on return.
        """
        n = sum(len(t) for _, t in parts)
        if n == 0 or n > self.n_batch:
            raise EngineError(f"decode_seqs with {n} rows (the batch holds 1..{self.n_batch})",
                              "this is a bug in the caller")
        lc = self._lc
        b = self._multi_batch()
        offsets, i = [], 0
        for s, toks in parts:
            if not 0 <= s < self.n_seq_max:
                raise EngineError(f"sequence id {s} is outside 0..{self.n_seq_max - 1}",
                                  "open the engine with n_seq_max >= the number of streams")
            m = len(toks)
            if self.seq_n_past[s] + m > self.n_ctx:
                raise EngineError(f"sequence {s} needs {self.seq_n_past[s] + m} positions but holds {self.n_ctx}",
                                  "shorten the prompt or max_tokens, or raise n_ctx")
            offsets.append(i)
            self._mtok[i : i + m] = toks
            self._mpos[i : i + m] = np.arange(self.seq_n_past[s], self.seq_n_past[s] + m)
            for j in range(i, i + m):
                b.seq_id[j][0] = s
            i += m
        self._mout[:n] = 1
        b.n_tokens = n
        self._served = None
        rc = lc.llama_decode(self.ctx, b)
        if rc != 0:
            for s, _ in parts:  # whatever this batch wrote is not trusted
                lc.llama_memory_seq_rm(self.mem, s, self.seq_n_past[s], -1)
            raise EngineError(f"llama_decode returned {rc} for a batch of {n} rows over {len(parts)} sequences: "
                              f"{recent_log(4) or 'no log'}",
                              "if a sequence's context is full raise n_ctx; otherwise rerun, and report the log")
        for s, toks in parts:
            self.seq_n_past[s] += len(toks)
        lc.llama_synchronize(self.ctx)
        self._rows = n
        return offsets

    def seq_prefill(self, seq: int, prompt: Sequence[int]) -> int:
        """Put ``prompt`` in sequence ``seq`` (empty before), chunked as :meth:`prefill` chunks
        it, with the last row's logits; returns the rows decoded."""
        self.seq_rollback(seq, 0)
        self._served = None
        lc = self._lc
        b = self._multi_batch()
        n = len(prompt)
        for off in range(0, n, self.n_batch):
            chunk = prompt[off : off + self.n_batch]
            m = len(chunk)
            base = self.seq_n_past[seq]
            self._mtok[:m] = chunk
            self._mpos[:m] = np.arange(base, base + m)
            for j in range(m):
                b.seq_id[j][0] = seq
            self._mout[:m] = 0
            if off + m == n:
                self._mout[m - 1] = 1
            b.n_tokens = m
            rc = lc.llama_decode(self.ctx, b)
            if rc != 0:
                self.seq_rollback(seq, 0)
                raise EngineError(f"llama_decode returned {rc} prefilling sequence {seq}: {recent_log(4) or 'no log'}",
                                  "shorten the prompt or raise n_ctx")
            self.seq_n_past[seq] += m
        lc.llama_synchronize(self.ctx)
        self._rows = 1
        return n

    def seq_rollback(self, seq: int, n_past: int) -> None:
        """Drop positions >= ``n_past`` of sequence ``seq`` only."""
        if n_past < self.seq_n_past[seq]:
            if not self._lc.llama_memory_seq_rm(self.mem, seq, n_past, -1):
                raise EngineError(f"llama.cpp could not roll sequence {seq} back to position {n_past}",
                                  "this model's cache type cannot be partially erased; speculation needs one that can")
        self.seq_n_past[seq] = min(self.seq_n_past[seq], n_past)

    def _can_reuse_prompts(self) -> bool:
        return not self.decode_hooks  # the MTP drafter's hooks must see every prompt row

    def _serve_logits(self, row: np.ndarray) -> None:
        self._served, self._rows = row, 1

    def seq_clear(self) -> None:
        """Empty every sequence (and the single-sequence state of sequence 0)."""
        self._lc.llama_memory_clear(self.mem, True)
        self.seq_n_past = [0] * self.n_seq_max
        self.n_past = 0
        self.kv_tokens = []

    def argmax_rows(self, rows: int | None = None) -> np.ndarray:
        """The argmax of each of the first ``rows`` output rows of the last decode (one numpy call)."""
        rows = self._rows if rows is None else rows
        if self._served is not None:
            return self._served[None, :].argmax(axis=1)[:rows]
        ptr = self._lc.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(rows, self.n_vocab)).argmax(axis=1)

    # -- provenance -------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        """A GGUF metadata value of the loaded model; ``{arch}`` expands to its architecture."""
        lc = self._lc
        if "{arch}" in key:
            key = key.format(arch=self.meta("general.architecture"))
        buf = ctypes.create_string_buffer(512)
        n = lc.llama_model_meta_val_str(self.model, key.encode(), buf, 512)
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def _residency(self) -> dict:
        info = build_info()
        asked = {"n_gpu_layers": self.n_gpu_layers, "n_cpu_moe": self.n_cpu_moe}
        apple = sys.platform == "darwin" and any(m in info["system_info"] for m in ("Metal", "MTL"))
        res = rs.residency(asked, rs.parse_load_log(self.load_log), gpu_offload=info["gpu_offload_supported"],
                           apple=apple, moe=self.n_expert > 0)
        n_layer = self._lc.llama_model_n_layer(self.model)
        on_acc = min(res["placed"]["layers_offloaded"] or 0, n_layer)  # the output layer is counted apart
        res.update(layers_on_accelerator=on_acc, layers_on_host=n_layer - on_acc)
        return res

    def describe(self) -> dict:
        lc = self._lc
        buf = ctypes.create_string_buffer(256)
        lc.llama_model_desc(self.model, buf, 256)
        n_layer = lc.llama_model_n_layer(self.model)
        return {
            "engine": self.name,
            "build": build_info(),
            "threads": self.n_threads,
            "n_gpu_layers": self.n_gpu_layers,
            "n_cpu_moe": self.n_cpu_moe,
            "n_expert": self.n_expert,
            "n_ctx": self.n_ctx,
            "n_batch": self.n_batch,
            "n_seq_max": self.n_seq_max,
            "n_ctx_total": self.n_ctx_total,
            "kv_unified": self.kv_unified,
            "swa_full": True,
            "model_path": self.model_path,
            "model_desc": buf.value.decode(),
            "model_size_bytes": int(lc.llama_model_size(self.model)),
            "model_n_params": int(lc.llama_model_n_params(self.model)),
            "n_layer": n_layer,
            "n_vocab": self.n_vocab,
            "model": self.artifact,
            "residency": self.residency,
        }

    def close(self) -> None:
        lc = self._lc
        if getattr(self, "batch", None) is not None:
            lc.llama_batch_free(self.batch)
            self.batch = None
        if getattr(self, "_mbatch", None) is not None:
            lc.llama_batch_free(self._mbatch)
            self._mbatch = None
        if getattr(self, "ctx", None):
            lc.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            lc.llama_model_free(self.model)
            self.model = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _expert_overrides(n_cpu_moe: int):
    """A NULL-terminated ``llama_model_tensor_buft_override[]`` putting the expert tensors of
    layers 0..n-1 in the CPU buffer type: what llama.cpp's ``--n-cpu-moe N`` builds (common.h)."""

    class Override(ctypes.Structure):
        _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]

    cpu = ggml_cpu()
    cpu.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    buft = cpu.ggml_backend_cpu_buffer_type()
    patterns = rs.expert_patterns(n_cpu_moe)
    arr = (Override * (len(patterns) + 1))(*[Override(p.encode(), buft) for p in patterns], Override(None, None))
    return arr

