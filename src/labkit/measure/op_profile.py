"""Where one verify spends its time: milliseconds per op class of the llama.cpp graph, per m.

llama.cpp's ``cb_eval`` (a ``ggml_backend_sched_eval_callback``) is asked, for every graph
node, whether the caller wants to see it; answering yes makes the scheduler compute the
graph up to that node and call back once it is done. Answering yes for every node turns a
decode into one small graph computation per node, timestamped on both sides of each
callback: a node's time is from the previous callback's return to its own call, so the
callback's own Python work (reading the node's name) is never charged to a node.

What this costs and how it is reported: each node now pays a graph dispatch (waking the
worker threads, a barrier) that a normal decode pays once. Nodes that compute nothing
(views, reshapes, permutes) measure exactly that, so their median is the ``dispatch``
estimate, subtracted from every node and reported as its own class. The wall time of the
decode outside every node (building the batch, copying the logits out) is ``llama_other``;
labkit's own per-row work after a verify (the argmax of every row) is ``labkit_rows``.
A profile is a breakdown, not a timing: compare whole decodes with ``verify_cost`` or
benchmarks/bench_verify_kernels.py, never with this.

Classes, from the node's name (llama.cpp's graph callbacks name them, e.g. ``ffn_up-3``,
``Qcur-0``, ``result_output``) and its op:
``head`` the output projection (the tied token embedding on gemma-3: 262,144 x 640 Q8_0);
``ffn`` the feed-forward matmuls; ``attn_proj`` the Q/K/V/output projections;
``attention`` the attention itself (scores, softmax, values, RoPE, KV writes);
``norm`` the norms and their scales; ``other`` everything else (activations, residual
adds, the embedding lookup).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

CLASSES = ("head", "ffn", "attn_proj", "attention", "norm", "other", "dispatch", "llama_other", "labkit_rows")
_NOOP = {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}
_ATTN_OPS = {"FLASH_ATTN_EXT", "SOFT_MAX", "ROPE", "SET_ROWS", "CPY", "GET_ROWS_BACK"}
_PROJ = ("Qcur", "Kcur", "Vcur", "attn_out", "kqv_out", "wo")


def classify(name: str, op: str) -> str | None:
    """The op class of one graph node (None: a node that computes nothing)."""
    if op in _NOOP:
        return None
    if name.startswith("result_output"):
        return "head"
    if "norm" in name or op in ("RMS_NORM", "NORM", "L2_NORM"):
        return "norm"
    if op == "MUL_MAT":
        if name.startswith("ffn"):
            return "ffn"
        if name.startswith(_PROJ):
            return "attn_proj"
        return "attention"  # kq, kqv: the matmuls against the KV cache
    if op in _ATTN_OPS or name.startswith(("kq", "kqv", "cache_", "k_cache", "v_cache")):
        return "attention"
    return "other"


class NodeClock:
    """A ``cb_eval`` callback that timestamps every graph node of the decodes it sees."""

    def __init__(self, lib_dir: str | Path | None = None):
        """``lib_dir``: the folder of the libllama this process loaded (default: found from it)."""
        import llama_cpp
        import llama_cpp.llama_cpp as low

        lib_dir = Path(low._lib._name).parent if lib_dir is None else Path(lib_dir)
        base = ctypes.CDLL(str(lib_dir / _soname("ggml-base")))  # already loaded: the same handle
        base.ggml_get_name.restype = ctypes.c_char_p
        base.ggml_get_name.argtypes = [ctypes.c_void_p]
        base.ggml_op_desc.restype = ctypes.c_char_p
        base.ggml_op_desc.argtypes = [ctypes.c_void_p]
        self._base = base
        self.nodes: list[tuple[str, str, int]] = []  # (name, op, ns)
        self._last = 0
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._cb)

    def start(self) -> None:
        self.nodes = []
        self._last = time.perf_counter_ns()

    def _cb(self, t, ask, user_data):  # noqa: ARG002
        if ask:
            return True
        now = time.perf_counter_ns()
        name = self._base.ggml_get_name(t).decode(errors="replace")
        op = self._base.ggml_op_desc(t).decode(errors="replace")
        self.nodes.append((name, op, now - self._last))
        self._last = time.perf_counter_ns()
        return True


def _soname(base: str) -> str:
    import sys

    return f"lib{base}.dylib" if sys.platform == "darwin" else f"lib{base}.so"


def breakdown(nodes: Sequence[tuple[str, str, int]], wall_ms: float, rows_ms: float) -> dict:
    """ms per class for one decode (module doc): per-node dispatch taken out of each node."""
    noop = [ns for name, op, ns in nodes if classify(name, op) is None]
    dispatch_ns = float(np.median(noop)) if noop else 0.0
    out = dict.fromkeys(CLASSES, 0.0)
    for name, op, ns in nodes:
        cls = classify(name, op)
        if cls is None:
            out["dispatch"] += ns / 1e6
            continue
        out[cls] += max(0.0, ns - dispatch_ns) / 1e6
        out["dispatch"] += min(ns, dispatch_ns) / 1e6
    out["llama_other"] = max(0.0, wall_ms - sum(ns for *_, ns in nodes) / 1e6)
    out["labkit_rows"] = rows_ms
    return out


def profile_verify(engine, clock: NodeClock, *, m_values: Sequence[int] = tuple(range(1, 9)), rounds: int = 5,
                   kv_depth: int = 200, seed: int = 0) -> dict:
    """Median ms per op class of a verify (every logit row) of m rows at KV depth ``kv_depth``,
    for each m; rounds visit every m in a fresh random order, after one warm-up each."""
    from labkit.measure.verify_cost import context_ids

    m_values = sorted(set(m_values))
    ctx = context_ids(engine, kv_depth, seed=seed)
    rows = context_ids(engine, max(m_values), seed=seed + 1)
    engine.rollback(0)
    engine.decode(ctx, all_logits=False)
    samples: dict[int, list[dict]] = {m: [] for m in m_values}
    rng = np.random.default_rng(seed)
    for r in range(rounds + 1):  # round 0 is the warm-up
        for m in rng.permutation(m_values):
            m = int(m)
            clock.start()
            t0 = time.perf_counter()
            engine.decode(rows[:m], all_logits=True)
            wall = (time.perf_counter() - t0) * 1e3
            t1 = time.perf_counter()
            engine.argmax_rows(m)
            rows_ms = (time.perf_counter() - t1) * 1e3
            engine.rollback(kv_depth)
            if r:
                samples[m].append({**breakdown(clock.nodes, wall, rows_ms), "wall": wall, "nodes": len(clock.nodes)})
    engine.rollback(0)
    table = {m: {k: round(float(np.median([s[k] for s in ss])), 3) for k in (*CLASSES, "wall", "nodes")}
             for m, ss in samples.items()}
    return {"kind": "op_profile", "kv_depth": kv_depth, "rounds": rounds, "unit": "ms (median over rounds)",
            "by_m": table}


def profile_recipe(recipe, *, m_values: Sequence[int], rounds: int, kv_depth: int) -> dict | None:
    """The profile of the recipe's target model on a llama.cpp engine of its own (the node
    callback slows every decode, so it never shares the measuring engine); None on another
    engine (MLX has no per-node callback)."""
    if recipe.engine != "llama.cpp":
        return None
    from labkit.artifacts.loader import open_engine

    clock = NodeClock()
    with open_engine(recipe, n_ctx=max(recipe.n_ctx, kv_depth + max(m_values) + 8), eval_callback=clock.callback) as e:
        res = profile_verify(e, clock, m_values=m_values, rounds=rounds, kv_depth=kv_depth, seed=recipe.seed)
        return {**res, "model": e.describe()["model"]["name"]}


def frame(res: dict) -> pd.DataFrame:
    """A profile as a long table: m, op_class, ms (the classes of CLASSES, in that order)."""
    return pd.DataFrame([{"m": int(m), "op_class": c, "ms": float(row[c])}
                         for m, row in sorted(res["by_m"].items(), key=lambda x: int(x[0])) for c in CLASSES])


def wide(long: pd.DataFrame) -> pd.DataFrame:
    """The long table as one row per m, a column per op class, and their sum ``total_ms`` (the
    decode's wall time plus labkit's own per-row work)."""
    t = long.pivot(index="m", columns="op_class", values="ms")[list(CLASSES)].reset_index()
    t.columns.name = None
    return t.assign(total_ms=t[list(CLASSES)].sum(axis=1))
