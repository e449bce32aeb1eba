"""Tables of the concurrency re-bench, from its rows only: the logged table, dips, the verdict.

A row is one (engine, c, k) arm: labkit's multi-slot loop (``measure.concurrency``) or
llama-server (``measure.serve``). The chapter's matrix records a c=2/c=3 dip: aggregate
tok/s that falls when c grows. ``dips`` flags every such step, and says whether it is
beyond the run-to-run range (the ranges of the two arms do not overlap) or within it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from labkit.analysis import decide

COLUMNS = ["c", "k", "drafter", "engine", "agg_tok_s", "per_stream_tok_s", "ttft_p50_ms", "ttft_p95_ms",
           "ttlt_p50_ms", "ttlt_p95_ms", "acceptance", "rows_per_step", "speedup", "lossless"]
EXTRA = ["agg_tok_s_min", "agg_tok_s_max", "runs", "agg_runs", "agg_decode_runs", "draft_steps", "accepted_per_pos"]


def table(*results: dict | None) -> pd.DataFrame:
    """The "concurrency" table: every row of the given results (labkit's, llama-server's)."""
    rows = [r for res in results if res for r in res["rows"]]
    df = pd.DataFrame(rows)
    for col in COLUMNS + EXTRA:
        if col not in df:
            df[col] = None
    return df[COLUMNS + EXTRA].sort_values(["engine", "k", "c"], ignore_index=True)


def dips(df: pd.DataFrame) -> pd.DataFrame:
    """Each place where aggregate tok/s falls as c grows, per (engine, drafter, k)."""
    out = []
    for (eng, k, _), g in decide.without_control(df).groupby(["engine", "k", "drafter"], dropna=False):
        g = g.sort_values("c")
        prev = None
        for r in g.itertuples():
            if prev is not None and r.agg_tok_s is not None and prev.agg_tok_s is not None \
                    and r.agg_tok_s < prev.agg_tok_s:
                beyond = (r.agg_tok_s_max is not None and prev.agg_tok_s_min is not None
                          and r.agg_tok_s_max < prev.agg_tok_s_min)
                out.append({"engine": eng, "k": int(k), "c_from": int(prev.c), "c_to": int(r.c),
                            "agg_from": prev.agg_tok_s, "agg_to": r.agg_tok_s,
                            "drop": 1 - r.agg_tok_s / prev.agg_tok_s, "beyond_noise": bool(beyond)})
            prev = r
    return pd.DataFrame(out, columns=["engine", "k", "c_from", "c_to", "agg_from", "agg_to", "drop", "beyond_noise"])


def non_monotonic(df: pd.DataFrame) -> bool:
    """True when any (engine, k) series has aggregate tok/s falling with c."""
    return not dips(df).empty


def arm_name(drafter, k) -> str:
    """``ngram k=3``, or for a draft length policy's arm (drafter ``ngram+priced``) ``ngram+priced (k_max 8)``."""
    return f"{drafter} (k_max {int(k)})" if "+" in str(drafter) else f"{drafter} k={int(k)}"


def round_pairs(spec, plain) -> pd.DataFrame:
    """Per-round aggregate tok/s of an arm over the plain arm's of the same round: each round
    ran every request through both, interleaved, so a round is the pairing unit here."""
    a, b = list(spec.get("agg_runs") or []), list(plain.get("agg_runs") or [])
    n = min(len(a), len(b))
    return pd.DataFrame({"prompt": [f"round{i}" for i in range(n)], "round": range(n),
                         "ratio": [x / y if x and y else float("nan") for x, y in zip(a[:n], b[:n])]})


def verdict(df: pd.DataFrame, c: int, *, engine: str = "labkit", margin: float = decide.DEFAULT_MARGIN,
            confidence: float = decide.DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """The "concurrency-verdict" table: one row at the production concurrency ``c``.

    Each speculative arm's aggregate over plain's at the same c, paired by round, with its CI
    and verdict (``analysis.decide``). The arm reported is the best of the k measured there,
    judged at confidence 1 - alpha/S for S arms (picking the best of several arms from one
    run is a selection; uncorrected it is a winner's curse by construction). "pays" needs
    "wins"; "no measurable difference" keeps speculation off (the simpler option). The A/A
    control (a second plain arm, when measured) says whether the box's noise allows a verdict
    (``aa_reliable``, and ``aa_problem`` in words when it does not: ``decide.aa_problem``).
    """
    cols = ["c", "k", "drafter", "engine", "speedup", "lo", "hi", "verdict", "decision", "arms", "aa_verdict",
            "aa_reliable", "aa_problem", "other_engine_speedup"]
    d = df[(df["engine"] == engine) & (df["c"] == c)]
    at = d[(d["k"] > 0) & (d["drafter"] != decide.AA)]
    plain = d[(d["k"] == 0) & (d["drafter"] != decide.AA)]
    if at.empty or plain.empty:
        return pd.DataFrame([{"c": c, "k": None, "drafter": None, "engine": engine, "speedup": None, "lo": None,
                              "hi": None, "verdict": f"not measured at c={c}", "decision": None, "arms": 0,
                              "aa_verdict": None, "aa_reliable": None, "aa_problem": None,
                              "other_engine_speedup": None}], columns=cols)
    p = plain.iloc[0].to_dict()
    kw = {"margin": margin, "confidence": confidence}
    ests = {i: decide.estimate(round_pairs(r.to_dict(), p), adjust=len(at), **kw) for i, r in at.iterrows()}
    i = max(ests, key=lambda j: ests[j].ratio or 0.0)
    best, est = at.loc[i], ests[i]
    aa = d[d["drafter"] == decide.AA]
    aa_est = decide.estimate(round_pairs(aa.iloc[0].to_dict(), p), **kw) if len(aa) else None
    word = {decide.WINS: f"speculation pays at c={c}", decide.LOSES: f"loses at c={c}"}.get(
        est.verdict, f"no measurable difference at c={c}")
    other = df[(df["engine"] != engine) & (df["c"] == c) & (df["k"] > 0) & df["speedup"].notna()]
    return pd.DataFrame([{
        "c": int(c), "k": int(best["k"]), "drafter": best["drafter"], "engine": engine,
        "speedup": est.ratio, "lo": est.lo, "hi": est.hi, "verdict": word,
        "decision": est.line(f"{arm_name(best['drafter'], best['k'])} at c={c} (aggregate tok/s, best of {len(at)})"),
        "arms": len(at), "aa_verdict": aa_est.verdict if aa_est is not None else None,
        "aa_reliable": decide.aa_reliable(aa_est), "aa_problem": decide.aa_problem(aa_est),
        "other_engine_speedup": float(other["speedup"].max()) if not other.empty else None,
    }], columns=cols)


def forest(df: pd.DataFrame, *, margin: float = decide.DEFAULT_MARGIN,
           confidence: float = decide.DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """Every arm's aggregate speedup over its own engine's plain arm at the same c, with its CI
    and verdict; A/A controls first (the data of 07's forest figure)."""
    out = []
    for (eng, c), d in df.groupby(["engine", "c"], sort=True):
        plain = d[(d["k"] == 0) & (d["drafter"] != decide.AA)]
        if plain.empty:
            continue
        p = plain.iloc[0].to_dict()
        for r in d[(d["k"] > 0) | (d["drafter"] == decide.AA)].itertuples():
            est = decide.estimate(round_pairs(r._asdict(), p), margin=margin, confidence=confidence)
            aa = r.drafter == decide.AA
            out.append({"label": f"{eng} A/A (plain vs plain) · c={c}" if aa else f"{eng} {arm_name(r.drafter, r.k)} · c={c}",
                        "drafter": "A/A" if aa else r.drafter, "k": int(r.k), "workload": f"c={c}", "engine": eng,
                        "c": int(c), "ratio": est.ratio, "lo": est.lo, "hi": est.hi, "verdict": est.verdict,
                        "rounds": est.n_pairs, "basis": "aggregate tok/s", "confidence": est.confidence})
    f = pd.DataFrame(out)
    if f.empty:
        return f
    return f.sort_values(["drafter"], key=lambda s: s != "A/A", kind="stable").reset_index(drop=True)


def forest_metrics(forest: pd.DataFrame) -> list[dict]:
    """Each forest row as a metric that the MLflow runs table can chart and compare across runs
    (and drift judges by its interval): ``speedup_c/<engine>.<arm>`` at step = c, its CI as the
    recorded range; the A/A control's arm is ``aa``. A row without an estimate is left out."""
    import re

    out = []
    for r in forest.itertuples():
        if r.ratio is None or not np.isfinite(r.ratio):
            continue
        arm = "aa" if r.drafter == "A/A" else re.sub(r"[^\w.-]", "_", f"{r.drafter}.k{r.k}")
        out.append({"name": f"speedup_c/{r.engine}.{arm}", "value": float(r.ratio), "lo": float(r.lo),
                    "hi": float(r.hi), "step": int(r.c)})
    return out


def production_cs(concurrency: Sequence[int], production: int) -> list[int]:
    """The c values to measure: the recipe's, plus the production concurrency."""
    return sorted(set(concurrency) | {production})
