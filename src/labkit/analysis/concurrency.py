"""Tables of the concurrency re-bench, from its rows only: the logged table, dips, the verdict.

A row is one (engine, c, k) arm: labkit's multi-slot loop (``measure.concurrency``) or
llama-server (``measure.serve``). The chapter's matrix records a c=2/c=3 dip: aggregate
tok/s that falls when c grows. ``dips`` flags every such step, and says whether it is
beyond the run-to-run range (the ranges of the two arms do not overlap) or within it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

COLUMNS = ["c", "k", "drafter", "engine", "agg_tok_s", "per_stream_tok_s", "ttft_p50_ms", "ttft_p95_ms",
           "ttlt_p50_ms", "ttlt_p95_ms", "acceptance", "rows_per_step", "speedup", "lossless"]
EXTRA = ["agg_tok_s_min", "agg_tok_s_max", "runs"]


def table(*results: dict | None) -> pd.DataFrame:
    """The "concurrency" table: every row of the given results (labkit's, llama-server's)."""
    rows = [r for res in results if res for r in res["rows"]]
    df = pd.DataFrame(rows)
    for col in COLUMNS + EXTRA:
        if col not in df:
            df[col] = None
    return df[COLUMNS + EXTRA].sort_values(["engine", "k", "c"], ignore_index=True)


def dips(df: pd.DataFrame) -> pd.DataFrame:
    """Each place where aggregate tok/s falls as c grows, per (engine, k)."""
    out = []
    for (eng, k), g in df.groupby(["engine", "k"]):
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


def verdict(df: pd.DataFrame, c: int, *, engine: str = "labkit") -> pd.DataFrame:
    """The "concurrency-verdict" table: one row at the production concurrency ``c``.

    The speculative arm is the best k > 0 measured at that c by ``engine``; it pays when
    its aggregate beats plain decoding at the same c.
    """
    at = df[(df["engine"] == engine) & (df["c"] == c) & (df["k"] > 0) & df["speedup"].notna()]
    cols = ["c", "k", "drafter", "engine", "speedup", "verdict", "other_engine_speedup"]
    if at.empty:
        return pd.DataFrame([{"c": c, "k": None, "drafter": None, "engine": engine, "speedup": None,
                              "verdict": f"not measured at c={c}", "other_engine_speedup": None}], columns=cols)
    best = at.loc[at["speedup"].astype(float).idxmax()]
    other = df[(df["engine"] != engine) & (df["c"] == c) & (df["k"] > 0) & df["speedup"].notna()]
    pays = float(best["speedup"]) > 1.0
    return pd.DataFrame([{
        "c": int(c), "k": int(best["k"]), "drafter": best["drafter"], "engine": engine,
        "speedup": float(best["speedup"]),
        "verdict": f"speculation pays at c={c}" if pays else f"loses at c={c}",
        "other_engine_speedup": float(other["speedup"].max()) if not other.empty else None,
    }], columns=cols)


def production_cs(concurrency: Sequence[int], production: int) -> list[int]:
    """The c values to measure: the recipe's, plus the production concurrency."""
    return sorted(set(concurrency) | {production})
