"""The cost model, extended to batches: a shared decode's cost vs the rows it holds.

At c streams a step of k drafts per stream puts about c·(1 + drafted) rows in one
decode. 01 fits verify(m) for one sequence; here the same fit (``costmodel``: the
one-row step H on its own, a + b·rows + [rows odd] on rows >= 2) runs on every shared
decode of the concurrency re-bench, whatever mix of streams and drafts made its rows.

The prediction for an arm (c, k) takes what the arm measured about the text and the
loop (streams per step, drafted and emitted tokens per stream step, per-stream draft +
accept overhead) and prices only the decode with the fit:

    step_ms   = V(streams · (1 + drafted)) + streams · overhead
    agg tok/s = streams · tokens_per_stream_step / step_ms

and compares it with the arm's measured decode aggregate (the same tokens over the same
steps' time, prefills excluded). A miss above 10% says the batch cost is not a function
of the row count alone (attention over different depths, odd row counts, contention).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from labkit.analysis.costmodel import VerifyModel, fit_verify_model

MISS = 0.10  # relative miss that is reported


def samples(batch_steps: Sequence[dict]) -> pd.DataFrame:
    """Every shared decode as (m = total rows, ms, c, k) for the fit."""
    df = pd.DataFrame(list(batch_steps))
    if df.empty:
        return pd.DataFrame(columns=["m", "ms", "c", "k", "streams"])
    return pd.DataFrame({"m": df["rows"].astype(int), "ms": df["verify_ms"].astype(float),
                         "c": df["c"].astype(int), "k": df["k"].astype(int), "streams": df["streams"].astype(int)})


def fit(batch_steps: Sequence[dict]) -> VerifyModel:
    """verify(rows) over every shared decode (needs one-row decodes and >= 2 row counts above one)."""
    s = samples(batch_steps)
    if (s["m"] == 1).sum() == 0 or s.loc[s["m"] >= 2, "m"].nunique() < 2:
        raise ValueError("the batch cost fit needs one-row decodes (c=1, k=0) and at least two larger row counts")
    return fit_verify_model(s)


def predict(rows: Sequence[dict], vm: VerifyModel, *, miss: float = MISS) -> pd.DataFrame:
    """Predicted vs measured decode aggregate per (c, k) arm of labkit's loop."""
    out = []
    for r in rows:
        if r.get("engine", "labkit") != "labkit" or not r.get("streams_per_step"):
            continue
        streams = r["streams_per_step"]
        m = streams * (1.0 + (r["drafted_per_stream_step"] or 0.0))
        # V at a fractional row count: interpolate between the neighbouring integers
        lo, hi = int(np.floor(m)), int(np.ceil(m))
        v = float(vm.V(lo)) if lo == hi else float(vm.V(lo) + (m - lo) * (vm.V(hi) - vm.V(lo)))
        step = v + streams * (r["overhead_ms_per_stream_step"] or 0.0)
        pred = 1e3 * streams * r["tokens_per_stream_step"] / step
        meas = r["agg_decode_tok_s"]
        err = (pred - meas) / meas if meas else None
        out.append({"c": r["c"], "k": r["k"], "rows_per_step": m, "verify_ms_pred": v, "step_ms_pred": step,
                    "agg_decode_tok_s_pred": pred, "agg_decode_tok_s": meas, "rel_error": err,
                    "miss": err is not None and abs(err) > miss})
    return pd.DataFrame(out)


def fit_summary(vm: VerifyModel) -> dict:
    """The fit's terms as plain numbers (for JSON and the notebook's table)."""
    f = vm.fit
    return {"H_ms": vm.H, "a_ms": f.a, "b_ms_per_row": f.b, "odd_rows_ms": f.parity, "r2": f.r2, "n": f.n}
