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

from .loop import AcceptanceGate, StepRecord, run
from .lossless import DEFAULT_NEAR_TIE, divergence_report
from .stats import spread, summarize, tokens_from

Progress = Callable[[str], None] | None


def context_ids(engine, n: int, *, seed: int = 0) -> list[int]:
    """``n`` seeded random token ids (no specials at the low end): cost does not depend on
    text, and models without a tokenizer (synthetic ones) need ids anyway."""
    rng = np.random.default_rng(seed)
    lo = min(1000, engine.n_vocab // 4)
    return rng.integers(lo, engine.n_vocab, size=n).tolist()


def _time_decode(engine, rows: Sequence[int], depth: int) -> float:
    t0 = time.perf_counter()
    engine.decode(list(rows), all_logits=True)  # returns after llama_synchronize / mx.eval
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
    progress: Progress = None,
) -> dict:
    """verify(m): the time of one m-row decode with logits for every row, at KV depth ``kv_depth``.

    Each round visits every m once in a fresh random order. H, the plain decode step,
    is the m = 1 arm (one row, one logit row: exactly what plain decoding does).
    """
    m_values = sorted(set(m_values))
    ctx = context_ids(engine, kv_depth, seed=seed)
    rows = context_ids(engine, max(m_values), seed=seed + 1)
    engine.rollback(0)
    engine.check_fits(kv_depth + max(m_values), what=f"kv_depth {kv_depth} + m {max(m_values)}")
    engine.decode(ctx, all_logits=False)
    for m in m_values:  # warm-up: graph allocation for each shape, same code path
        _time_decode(engine, rows[:m], kv_depth)
    rng = np.random.default_rng(seed)
    samples: dict[int, list[float]] = {m: [] for m in m_values}
    for r in range(rounds):
        for m in rng.permutation(m_values):
            samples[int(m)].append(_time_decode(engine, rows[: int(m)], kv_depth))
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


def _arm(records: list[list[StepRecord]]) -> dict:
    sums = [summarize(r) for r in records]
    keys = ("decode_tok_s", "e2e_tok_s", "ttft_ms", "ttlt_ms", "tokens")
    return {k: spread([s[k] for s in sums]) for k in keys}


def bench_spec(
    engine,
    prompt: Sequence[int],
    *,
    drafter=None,
    k: int = 3,
    runs: int = 3,
    max_tokens: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    make_gate: Callable[[], AcceptanceGate | None] = lambda: None,
    near_tie: float = DEFAULT_NEAR_TIE,
    keep_records: bool = False,
    progress: Progress = None,
) -> dict:
    """Plain (k = 0) vs speculative generation of the same prompt, ``runs`` interleaved pairs.

    The first pair is the cold run (first after load) and is reported apart; speedup is
    the ratio of median decode tok/s of the warm runs, with the range of per-pair ratios.
    """
    common = dict(max_tokens=max_tokens, temperature=temperature)
    cold_base = run(engine, prompt, seed=seed, **common)
    cold_spec = run(engine, prompt, drafter=drafter, k=k, gate=make_gate(), seed=seed, **common)
    base_runs, spec_runs = [], []
    for r in range(runs):
        # sampled runs use a different seed per run, the same for both arms
        s = seed + 1 + r if temperature > 0 else seed
        base_runs.append(run(engine, prompt, seed=s, **common))
        spec_runs.append(run(engine, prompt, drafter=drafter, k=k, gate=make_gate(), seed=s, **common))
        if progress:
            progress(f"spec k={k}: pair {r + 1}/{runs}")
    base, spec = _arm(base_runs), _arm(spec_runs)
    ratios = [
        summarize(s)["decode_tok_s"] / summarize(b)["decode_tok_s"]
        for b, s in zip(base_runs, spec_runs, strict=True)
    ]
    pooled = summarize([rec for recs in spec_runs for rec in recs], k_max=k)
    out = {
        "kind": "spec",
        "k": k,
        "runs": runs,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "prompt_tokens": len(prompt),
        "drafter": drafter.describe() if drafter is not None else None,
        "baseline": base,
        "speculative": spec,
        "speedup": (spec["decode_tok_s"]["median"] / base["decode_tok_s"]["median"]),
        "speedup_pairs": spread(ratios),
        "cold": {"baseline": summarize(cold_base), "speculative": summarize(cold_spec)},
        "acceptance": pooled["acceptance"],
        "acceptance_tested": pooled["acceptance_tested"],
        "mean_accepted": pooled["mean_accepted"],
        "tokens_per_step": pooled["tokens_per_step"],
        "accept_by_pos": pooled["accept_by_pos"],
        "accept_cond_by_pos": pooled["accept_cond_by_pos"],
        "rejected_share": pooled["rejected_share"],
        "draft_ms_per_step": pooled["draft_ms"] / max(1, pooled["steps"]),
        "verify_ms_per_step": pooled["verify_ms"] / max(1, pooled["steps"]),
        "gate_events": [ev for recs in spec_runs for ev in summarize(recs)["gate_events"]],
        "repetition": summarize(base_runs[0])["repetition"],
    }
    if temperature == 0:
        ref = tokens_from(base_runs[0])
        reports = [divergence_report(engine, prompt, base_runs[0], s, near_tie=near_tie) for s in spec_runs]
        base_same = all(tokens_from(b) == ref for b in base_runs)
        out["lossless"] = all(r["lossless"] for r in reports) and base_same
        out["identical"] = all(r["identical"] for r in reports)
        out["divergences"] = [r["divergence"] for r in reports if r["divergence"]]
    else:
        out["lossless"] = None  # sampled: checked statistically (tests), not per run
    if keep_records:
        out["records"] = {
            "baseline": [[r.to_dict() for r in recs] for recs in base_runs],
            "speculative": [[r.to_dict() for r in recs] for recs in spec_runs],
        }
    return out
