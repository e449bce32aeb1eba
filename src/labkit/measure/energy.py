"""Power runs: energy and CPU time per token of the decode window, k = 0 vs a speculative k.

Speculation is "faster, not more efficient": batched verification raises power while
it shortens the run. The window opens after prefill (the first token) and closes after
the last token, so both arms are charged for decoding only. Energy is a hardware
counter delta (``labkit.measure.power``) or reported unavailable with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from labkit.analysis.stats import summarize
from labkit.decoding.loop import generate
from labkit.measure import order, power


def decode_window(engine, ids, *, drafter=None, k: int = 0, max_tokens: int = 128, seed: int = 0,
                  **measure_kw) -> dict:
    """One generation with the power window around its decode steps only."""
    gen = generate(engine, ids, drafter=drafter, k=k, max_tokens=max_tokens, seed=seed)
    recs = [next(gen)]  # prefill + first token: outside the window
    with power.measure(**measure_kw) as w:
        recs.extend(gen)
    s = summarize(recs)
    tokens = s.decode_tokens
    costs = power.per_token(w.result, tokens) if tokens else {}
    return {"k": k, "tokens": tokens, "wall_s": w.result["wall_s"], "decode_tok_s": s.decode_tok_s,
            "cpu_s_per_token": costs.get("cpu_s_per_token"), "cpu_system_s_per_token": costs.get("cpu_system_s_per_token"),
            "j_per_token": costs.get("j_per_token"), "mean_power_w": costs.get("mean_power_w"),
            "energy_available": w.result["energy_available"], "energy_reason": w.result.get("energy_reason"),
            "short_window": w.result.get("short_window"), "acceptance": s.acceptance}


def power_runs(engine, prompts, *, drafter, k: int, runs: int = 3, max_tokens: int = 128, seed: int = 0,
               interleave: str = order.DEFAULT_POLICY, progress: Callable | None = None,
               **measure_kw) -> pd.DataFrame:
    """k = 0 and k = ``k`` on the same prompts, interleaved, ``runs`` warm runs each after a warm-up."""
    rows = []
    for p in prompts:
        ids = engine.tokenize(p.text)
        for r in range(runs + 1):
            for kk in order.arm_order((0, k), r, policy=interleave, seed=seed):
                res = decode_window(engine, ids, drafter=drafter if kk else None, k=kk, max_tokens=max_tokens,
                                    seed=seed, **measure_kw)
                rows.append({"prompt": p.id, "workload": p.workload, "run": r, "warmup": r == 0,
                             "interleave": interleave, **res})
            if progress:
                progress(f"power: {p.id} run {r}/{runs}")
    return pd.DataFrame(rows)


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per k: median and range of J/token (where measured), CPU-s/token, tok/s, mean power."""
    warm = rows[~rows["warmup"]]
    out = []
    for k, g in warm.groupby("k"):
        row = {"k": int(k), "runs": len(g)}
        for col in ("j_per_token", "cpu_s_per_token", "decode_tok_s", "mean_power_w"):
            v = g[col].dropna()
            row[col] = float(v.median()) if len(v) else None
            row[f"{col}_min"] = float(v.min()) if len(v) else None
            row[f"{col}_max"] = float(v.max()) if len(v) else None
        row["energy"] = "measured" if g["energy_available"].all() else f"unavailable: {g['energy_reason'].iloc[0]}"
        out.append(row)
    return pd.DataFrame(out)


def summary_metrics(summ: pd.DataFrame) -> list[dict]:
    """CPU-s/token per k (and J/token where a counter measured it), with their ranges, as metrics."""
    out = []
    for r in summ.itertuples():
        out.append({"name": "cpu_s_per_token", "value": r.cpu_s_per_token, "lo": r.cpu_s_per_token_min,
                    "hi": r.cpu_s_per_token_max, "step": r.k})
        if r.j_per_token is not None:
            out.append({"name": "j_per_token", "value": r.j_per_token, "lo": r.j_per_token_min,
                        "hi": r.j_per_token_max, "step": r.k})
    return out


def two_modes(summ: pd.DataFrame) -> dict:
    """The k for performance (max tok/s) and for efficiency (min J/token, else min CPU-s/token)."""
    perf = summ.loc[summ["decode_tok_s"].idxmax()]
    metric = "j_per_token" if summ["j_per_token"].notna().all() else "cpu_s_per_token"
    eff = summ.loc[summ[metric].idxmin()]
    base = summ[summ["k"] == 0].iloc[0]
    spec = summ[summ["k"] != 0].iloc[0] if (summ["k"] != 0).any() else base
    delta = (spec[metric] - base[metric]) / base[metric] if base[metric] else np.nan
    return {"performance_k": int(perf["k"]), "efficiency_k": int(eff["k"]), "efficiency_metric": metric,
            "delta_per_token": float(delta), "basis": "energy counters" if metric == "j_per_token" else
            "CPU time (no energy counter here)",
            "text": f"performance: k={int(perf['k'])}; efficiency ({metric}): k={int(eff['k'])}; "
                    f"speculation changes {metric} by {delta:+.1%}"}
