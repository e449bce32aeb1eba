"""Measurements: verify(m) cost and speculative-vs-plain generation, as plain functions.

Both return JSON-ready dicts. Timings are repeated and reported as median and
range; arms that are compared (m values; baseline and speculative runs) are
interleaved so that drift on a shared machine does not masquerade as an effect.
Warm-up goes through the same code path as the measured runs and is reported
separately as the cold run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from labkit.analysis.stats import spread

Progress = Callable[[str], None] | None


def context_ids(engine, n: int, *, seed: int = 0) -> list[int]:
    """``n`` seeded random token ids (no specials at the low end): cost does not depend on
    text, and models without a tokenizer (synthetic ones) need ids anyway."""
    rng = np.random.default_rng(seed)
    lo = min(1000, engine.n_vocab // 4)
    return rng.integers(lo, engine.n_vocab, size=n).tolist()


def _time_decode(engine, rows: Sequence[int], depth: int, *, all_logits: bool = True, before=None) -> float:
    """ms of one decode of ``rows`` at KV depth ``depth`` (rolled back after); ``all_logits``:
    a logit row per row (a speculative verify), else for the last row only; ``before``, when
    given, runs first, untimed (``machine.cache_flusher``)."""
    if before is not None:
        before()
    t0 = time.perf_counter()
    engine.decode(list(rows), all_logits=all_logits)  # returns after llama_synchronize / mx.eval
    dt = time.perf_counter() - t0
    engine.rollback(depth)
    return dt * 1e3


def bench_verify(
    engine,
    *,
    m_values: Sequence[int] = tuple(range(1, 9)),
    rounds: int = 48,
    kv_depth: int = 200,
    seed: int = 0,
    body: bool = False,
    before=None,
    progress: Progress = None,
) -> dict:
    """verify(m): the time of one m-row decode with logits for every row, at KV depth ``kv_depth``.

    Each round visits every m once in a fresh random order. H, the plain decode step,
    is the m = 1 arm (one row, one logit row: exactly what plain decoding does).
    ``body``: also time every m >= 2 with the last row's logits only (what a prompt batch
    pays), in the same rounds, in random order against the every-row decode: the result's
    ``body`` table; ``head_extra`` holds each round's every-row minus one-row time, the
    output head's cost of its rows 2..m (the planner prices it as its own term).
    ``before``: a callable run before every timed decode, outside its time (a cache flush:
    ``machine.cache_flusher``).
    """
    m_values = sorted(set(m_values))
    ctx = context_ids(engine, kv_depth, seed=seed)
    rows = context_ids(engine, max(m_values), seed=seed + 1)
    engine.rollback(0)
    engine.check_fits(kv_depth + max(m_values), what=f"kv_depth {kv_depth} + m {max(m_values)}")
    engine.decode(ctx, all_logits=False)
    for m in m_values:  # warm-up: graph allocation for each shape, same code path
        _time_decode(engine, rows[:m], kv_depth)
    multi = [m for m in m_values if m >= 2] if body else []
    for m in multi:  # warm-up of the one-logit-row graphs
        _time_decode(engine, rows[:m], kv_depth, all_logits=False)
    rng = np.random.default_rng(seed)
    samples: dict[int, list[float]] = {m: [] for m in m_values}
    one: dict[int, list[float]] = {m: [] for m in multi}
    for r in range(rounds):
        for m in rng.permutation(m_values):
            m = int(m)
            if m not in one:
                samples[m].append(_time_decode(engine, rows[:m], kv_depth, before=before))
                continue
            for every in rng.permutation([True, False]):  # the pair in random order
                (samples if every else one)[m].append(_time_decode(engine, rows[:m], kv_depth, all_logits=bool(every),
                                                                  before=before))
        if progress and (r + 1) % max(1, rounds // 8) == 0:
            progress(f"verify round {r + 1}/{rounds}")
    table = [{"m": m, **{k: v for k, v in spread(samples[m]).items()}} for m in m_values]
    out = {
        "kind": "verify",
        "kv_depth": kv_depth,
        "rounds": rounds,
        "order": "interleaved: every round visits all m in a fresh random order",
        "verify": table,
        "H_ms": spread(samples[1]) if 1 in samples else None,
        "kernel_noise": kernel_noise(engine, ctx, m=max(m_values)),
    }
    if multi:
        out["body"] = [{"m": m, **spread(one[m])} for m in multi]
        out["head_extra"] = [{"m": m, "values": [a - b for a, b in zip(samples[m], one[m], strict=True)]}
                             for m in multi]
    engine.rollback(0)
    return out


def kernel_noise(engine, ctx: Sequence[int], *, m: int = 8, top: int = 5) -> dict:
    """How far batched-row logits drift from single-row logits for the same positions.

    The basis of the lossless check's near-tie threshold: a divergence whose logit gap
    is within this noise is rounding, not a bug.
    """
    depth = len(ctx)
    engine.rollback(depth)
    rows = context_ids(engine, m, seed=7)
    single = []
    for t in rows:
        engine.decode([t])
        single.append(np.array(engine.logits(-1), copy=True))
    engine.rollback(depth)
    engine.decode(rows, all_logits=True)
    worst_top, worst_all = 0.0, 0.0
    for j in range(m):
        b = np.asarray(engine.logits(j))
        idx = np.argsort(single[j])[-top:]
        worst_top = max(worst_top, float(np.abs(b[idx] - single[j][idx]).max()))
        worst_all = max(worst_all, float(np.abs(b - single[j]).max()))
    engine.rollback(depth)
    return {"m": m, "max_abs_diff_top": worst_top, "top": top, "max_abs_diff_vocab": worst_all}




