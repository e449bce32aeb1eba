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

from labkit.analysis import decide
from labkit.analysis.stats import summarize
from labkit.decoding.loop import generate
from labkit.measure import arms, order, power


def decode_window(engine, ids, *, drafter=None, k: int = 0, max_tokens: int = 128, seed: int = 0,
                  **measure_kw) -> dict:
    """One generation with the power window around its decode steps only (its step records
    under ``_records``)."""
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
            "short_window": w.result.get("short_window"), "acceptance": s.acceptance, "_records": recs}


def power_runs(engine, prompts, *, drafter, k: int, runs: int = 3, max_tokens: int = 128, seed: int = 0,
               interleave: str = order.DEFAULT_POLICY, progress: Callable | None = None,
               on_arm: Callable | None = None, skip: dict | None = None, control: bool = False,
               **measure_kw) -> pd.DataFrame:
    """k = 0 and k = ``k`` on the same prompts, interleaved, ``runs`` warm runs each after a warm-up
    (one plain window per prompt, kept as ``warmup`` rows).

    One arm is one (prompt, run, k) window, keyed ``prompt~round~drafter~k``; ``on_arm``
    and ``skip`` journal and resume them (see ``measure.arms``); a resumed call warms up
    with one unmeasured window first. ``control`` adds the A/A arm (a second plain window,
    drafter "aa"), so plain vs plain is judged like the comparison (``compare``)."""
    name = getattr(drafter, "name", "drafter")
    arm_set = [("none", 0)] + ([(decide.AA, 0)] if control else []) + [(name, k)]
    # the warm-up (run 0): one plain window per prompt, measured and kept apart (``warmup``)
    schedule = [(p, r, a) for p in prompts for r in range(runs + 1)
                for a in (order.arm_order(arm_set, r, policy=interleave, seed=seed) if r else [("none", 0)])]

    def arm_key(p, r, a):
        return arms.key(p.id, f"r{r}", a[0] if (a[1] or a[0] == decide.AA) else "none", f"k{a[1]}")

    arms.plan(on_arm, [arm_key(p, r, a) for p, r, a in schedule])
    rows, ids_of, restored_any, warmed = [], {}, False, False
    for i, (p, r, a) in enumerate(schedule):
        kk = a[1]
        got = arms.restored(skip, arm_key(p, r, a))
        if got is not None:
            rows.append(got[0])
            restored_any = True
        else:
            ids = ids_of.setdefault(p.id, list(p.ids) if getattr(p, "ids", None) else engine.tokenize(p.text))  # SYNTHETIC prompts carry ids
            if restored_any and not warmed:  # resuming: one unmeasured window warms the engine again
                decode_window(engine, ids, max_tokens=max_tokens, seed=seed, **measure_kw)
                warmed = True
            res = decode_window(engine, ids, drafter=drafter if kk else None, k=kk, max_tokens=max_tokens,
                                seed=seed, **measure_kw)
            recs = res.pop("_records")
            row = {"prompt": p.id, "workload": p.workload, "run": r, "warmup": r == 0, "interleave": interleave,
                   "drafter": a[0] if (kk or a[0] == decide.AA) else "none", **res}
            rows.append(arms.finished(on_arm, arm_key(p, r, a), row, recs))
        if progress and (i + 1 == len(schedule) or schedule[i + 1][:2] != (p, r)):
            progress(f"power: {p.id} run {r}/{runs}")
    return pd.DataFrame(rows)


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per k: median and range of J/token (where measured), CPU-s/token, tok/s, mean power."""
    warm = decide.without_control(rows[~rows["warmup"]])
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


def compare(rows: pd.DataFrame, *, k: int, margin: float = decide.DEFAULT_MARGIN,
            confidence: float = decide.DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """The power comparison judged like every other: per-token cost (J where a counter
    measured it, else CPU-s) and decode tok/s of k over plain, paired by (prompt, run), with
    CI and verdict; and the same for the A/A arm (plain vs plain) when it was measured. For a
    cost, "loses" (ratio below 1) means speculation costs less per token."""
    warm = rows[~rows["warmup"]].assign(cold=False, temperature=0.0)
    metric = "j_per_token" if warm["j_per_token"].notna().all() else "cpu_s_per_token"
    base = {"drafter": "none", "k": 0}
    arms_ = [(decide.AA, 0)] if (warm.get("drafter") == decide.AA).any() else []
    spec = warm[warm["k"] > 0]
    arms_ += [(spec["drafter"].iloc[0], k)] if len(spec) else []
    out = []
    for d, kk in arms_:
        for col in (metric, "decode_tok_s"):
            est = decide.estimate(decide.paired(warm, arm={"drafter": d, "k": kk}, base=base, value=col),
                                  margin=margin, confidence=confidence)
            name = "A/A (plain vs plain)" if d == decide.AA else f"{d} k={kk}"
            out.append({"arm": name, "drafter": d, "k": kk, "metric": col, "ratio": est.ratio, "lo": est.lo,
                        "hi": est.hi, "verdict": est.verdict, "line": est.line(f"{name} {col} vs plain")})
    return pd.DataFrame(out)


def summary_metrics(summ: pd.DataFrame) -> list[dict]:
    """CPU-s/token per k (and J/token where a counter measured it), with their ranges, as metrics."""
    out = []
    for r in summ.itertuples():
        out.append({"name": "power/cpu_s_per_token", "value": r.cpu_s_per_token, "lo": r.cpu_s_per_token_min,
                    "hi": r.cpu_s_per_token_max, "step": r.k})
        if r.j_per_token is not None:
            out.append({"name": "power/j_per_token", "value": r.j_per_token, "lo": r.j_per_token_min,
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
